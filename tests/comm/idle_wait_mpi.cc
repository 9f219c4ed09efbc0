// Group::set_idle_waits on the MPI group, run under mpirun by ctest (2 ranks):
//
//   mpirun -np 2 idle_wait_mpi
//
// Rank 0 sleeps 1.5 s before entering an allgather, as rank 0 of an idle server does before its
// next command; rank 1 waits in it under IdleWaits and must (a) receive rank 0's value and (b) use
// under a fifth of the wall time as CPU time (the spinning wait used ~80 % of a core; the gentle
// one ~1-3 %). Then the same exchange without the hint must still deliver (the spinning path).
// Prints what it measured; exit 1 on a failure.
#include <time.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <thread>

#include "comm/mpi_group.h"

using namespace epmoe;

namespace {

double cpu_seconds() {  // this process, every thread (MPI's progress included)
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return double(ts.tv_sec) + 1e-9 * double(ts.tv_nsec);
}

double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

int main() {
  MpiGroup& g = MpiGroup::world();
  int failed = 0;
  if (g.size() != 2) {
    std::fprintf(stderr, "idle_wait_mpi: run under mpirun -np 2 (got %d ranks)\n", g.size());
    return 2;
  }
  g.set_timeout(30);
  for (bool idle : {true, false}) {
    g.barrier();
    const int64_t mine = g.rank() == 0 ? (idle ? 4242 : 4343) : -1;
    int64_t all[2] = {0, 0};
    const double c0 = cpu_seconds(), w0 = wall_seconds();
    if (g.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
    if (idle) {
      IdleWaits gentle(g);
      g.allgather(&mine, sizeof mine, all);
    } else {
      g.allgather(&mine, sizeof mine, all);
    }
    const double cpu = cpu_seconds() - c0, wall = wall_seconds() - w0;
    if (g.rank() != 1) continue;
    const bool got = all[0] == (idle ? 4242 : 4343) && all[1] == -1;
    std::printf("%s wait: %.2f s of wall time, %.3f s of CPU time (%.0f %%); values %s\n",
                idle ? "idle" : "spinning", wall, cpu, 100.0 * cpu / wall, got ? "delivered" : "WRONG");
    if (!got) failed++;
    if (idle && !(cpu < 0.2 * wall)) {
      std::printf("FAILED: the idle wait used %.0f %% of a core (bound 20 %%)\n", 100.0 * cpu / wall);
      failed++;
    }
  }
  const int64_t total = g.allreduce_sum(failed);
  if (g.rank() == 0) std::printf("%s\n", total == 0 ? "idle waits: passed" : "idle waits: FAILED");
  MpiGroup::finalize();
  return total == 0 ? 0 : 1;
}
