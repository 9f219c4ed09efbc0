// Dispatch + combine cost of every backend, beside a raw MPI_Alltoallv of the same bytes in the
// same run (the ratio is the figure; absolute times depend on the machine).
//
//   mpirun -np R build/bench/ep_bench [--tokens 16,256,4096] [--iters N]
//
// Shape of Qwen3-30B-A3B's MoE: hidden 2048, top-8 of 128 experts, uniform random routing. The
// experts are a copy (out = in) so that only communication and packing are timed.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "comm/mpi_group.h"
#include "ep/backend.h"
#include "ep/cpu_expert_jobs.h"
#include "ep/placement.h"

using namespace epmoe;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median over iterations of the slowest rank's time.
template <class F>
double time_collective(MpiGroup& comm, int iters, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < iters + 1; i++) {
    comm.barrier();
    double t0 = now();
    f();
    double dt = now() - t0;
    double worst = 0;
    MPI_Allreduce(&dt, &worst, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
    if (i) t.push_back(worst);  // first run warms up buffers
  }
  return median(t);
}

}  // namespace

int main(int argc, char** argv) {
  MpiGroup& comm = MpiGroup::world();
  std::vector<int64_t> sizes = {16, 256, 4096};
  int iters = 5;
  for (int i = 1; i < argc; i++) {
    std::string a = argv[i];
    if (a == "--iters" && i + 1 < argc) iters = std::stoi(argv[++i]);
    else if (a == "--tokens" && i + 1 < argc) {
      sizes.clear();
      std::string s = argv[++i];
      for (size_t p = 0; p < s.size();) {
        size_t q = s.find(',', p);
        sizes.push_back(std::stoll(s.substr(p, q - p)));
        p = q == std::string::npos ? s.size() : q + 1;
      }
    } else {
      if (comm.rank() == 0) std::fprintf(stderr, "usage: mpirun -np R ep_bench [--tokens 16,256,4096] [--iters N]\n");
      return 2;
    }
  }
  const int R = comm.size(), me = comm.rank();
  const int H = 2048, K = 8, E = 128;
  Placement place = Placement::make_default(E, R, 0);
  // Experts that copy their rows: the benchmark measures the exchange, not the GEMMs.
  struct CopyRunner final : ExpertRunner {
    const Placement& p;
    int rank, H;
    CopyRunner(const Placement& p_, int r, int h) : p(p_), rank(r), H(h) {}
    Device device() const override { return Device::Cpu; }
    void run(const ExpertJobs& j, void* out) override {
      const int h = H;
      run_jobs_grouped(j, H, p.first_local(rank), p.num_local(rank),
                       [h](int, const float* in, int64_t n, float* o) { std::memcpy(o, in, sizeof(float) * size_t(n * h)); },
                       static_cast<float*>(out));
    }
  } copy(place, me, H);
  if (me == 0) {
    std::printf("ep_bench: R=%d ranks, hidden %d, top-%d of %d experts, uniform routing, deterministic combine\n", R, H, K, E);
    std::printf("%-10s %8s %12s %14s %12s %8s\n", "backend", "tok/rank", "time ms", "MB sent/rank", "raw a2av ms", "ratio");
  }
  for (int64_t T : sizes) {
    std::mt19937 rng(99 + unsigned(me));
    std::vector<float> x(size_t(T * H)), w(size_t(T * K)), y(size_t(T * H));
    std::vector<int32_t> phys(size_t(T * K));
    for (auto& v : x) v = float(rng() % 1000) / 1000.f;
    for (int64_t t = 0; t < T; t++) {
      std::vector<int> e(E);
      for (int i = 0; i < E; i++) e[size_t(i)] = i;
      std::shuffle(e.begin(), e.end(), rng);
      for (int k = 0; k < K; k++) {
        phys[size_t(t * K + k)] = e[size_t(k)];
        w[size_t(t * K + k)] = 1.0f / K;
      }
    }
    MoeTokens in;
    in.T = T, in.H = H, in.K = K, in.x = x.data(), in.physical = phys.data(), in.weights = w.data();
    for (const std::string& name : backend_names(Device::Cpu)) {
      BackendOptions opt;
      auto be = make_backend(name, Device::Cpu, comm, place, opt);
      uint64_t b0 = comm.bytes_sent();
      double t = time_collective(comm, iters, [&] { be->run(in, copy, y.data()); });
      const uint64_t bytes = (comm.bytes_sent() - b0) / uint64_t(iters + 1);
      uint64_t max_bytes = 0;
      MPI_Allreduce(&bytes, &max_bytes, 1, MPI_UINT64_T, MPI_MAX, MPI_COMM_WORLD);
      // The raw reference: one MPI_Alltoallv moving the same bytes (the busiest rank's), spread
      // evenly over the peers.
      std::vector<size_t> per(static_cast<size_t>(R), R > 1 ? size_t(max_bytes) / size_t(R - 1) : 0);
      per[size_t(me)] = 0;
      std::vector<char> sb(std::max<size_t>(1, size_t(max_bytes))), rb(sb.size());
      double raw = time_collective(comm, iters, [&] { comm.all_to_all_v(sb.data(), per, rb.data(), per); });
      if (me == 0)
        std::printf("%-10s %8lld %12.3f %14.2f %12.3f %8.2f\n", name.c_str(), (long long)T, t * 1e3,
                    double(max_bytes) / 1e6, raw * 1e3, raw > 0 ? t / raw : 0.0);
    }
  }
  MpiGroup::finalize();
  return 0;
}
