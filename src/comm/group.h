// The group of an expert-parallel run: one interface with the typed collectives the runtime
// needs, implemented over MPI (MpiGroup, CPUs, comm/mpi_group.h) and over NCCL (NcclGroup, one
// process per GPU, comm/nccl_group.h). Everything above comm/ -- backends aside -- talks to a
// Group and never knows which transport carries it.
//
// Contract of every implementation:
//   - every collective is entered by every rank in the same order;
//   - host values in, host values out (the NCCL group moves them through its device);
//   - every wait has a deadline (set_timeout); when it passes, the group is aborted with a
//     message that names this rank, the operation and the peers that did not answer;
//   - abort_group() is the one path by which a failing rank ends the whole group.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

namespace epmoe {

class Group {
 public:
  virtual ~Group() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  bool distributed() const { return size() > 1; }
  virtual void set_timeout(double seconds) = 0;
  virtual double timeout() const = 0;
  // The transport, for messages and for the backend registry (never for model code).
  virtual const char* transport() const = 0;

  virtual void barrier() = 0;
  // Every rank contributes `bytes` bytes; recv holds size() * bytes, in rank order.
  virtual void allgather(const void* send, size_t bytes, void* recv) = 0;
  // Variable sizes: recv_bytes[r] from rank r, packed in rank order into recv.
  virtual void allgatherv(const void* send, size_t bytes, void* recv, const std::vector<size_t>& recv_bytes) = 0;
  virtual int64_t allreduce_max(int64_t v) = 0;
  virtual int64_t allreduce_sum(int64_t v) = 0;
  virtual double allreduce_max_f64(double v) = 0;
  // The same bits on every rank (implementations sum in one fixed order).
  virtual double allreduce_sum_f64(double v) = 0;
  // Any rank's flag true -> true everywhere.
  bool any(bool v) { return allreduce_max(v ? 1 : 0) != 0; }

  // Every rank's value, in rank order.
  std::vector<int64_t> allgather_i64(int64_t v) {
    std::vector<int64_t> out(static_cast<size_t>(size()));
    allgather(&v, sizeof v, out.data());
    return out;
  }

  // While on, waits poll gently: after 10 ms of spinning they sleep between polls (IdleBackoff).
  // For collectives whose wait is for a peer that may have nothing to do for seconds -- the
  // serve loop's command exchange, where the other ranks wait on rank 0's next request -- so that
  // idle ranks do not burn a core each (on a machine with few cores they starved the HTTP threads
  // and the clients). Never around bulk transfers: MPI progresses them only while polled. Hint
  // only: an implementation may ignore it. IdleWaits sets it for a scope.
  virtual void set_idle_waits(bool on) { (void)on; }

  // Waits, under the group's deadline, for the work this rank has queued on its device (NCCL: the
  // process's stream, whose collectives may wait on a peer; MPI: nothing is queued).
  virtual void wait_device(const char* what) { (void)what; }

  // Reports a fatal error of this rank to the group and terminates every process of it.
  [[noreturn]] virtual void abort_group(const std::string& message, int exit_code) = 0;

  // Bytes this rank has sent to other ranks so far (payload, self excluded); benchmarks read it.
  virtual uint64_t bytes_sent() const = 0;
  virtual void add_bytes_sent(uint64_t n) = 0;
};

// The pause between two polls of an idle wait (Group::set_idle_waits), for the groups' wait loops:
// none for the first 10 ms -- while serving, a step follows rank 0's turn at once, and a sleeping
// rank would start it late -- then sleeps of 50 us doubling to 0.8 ms, so that an idle rank costs
// ~1-3 % of a core instead of all of it. The sleeps stay far below any deadline or grace period.
class IdleBackoff {
 public:
  explicit IdleBackoff(std::chrono::steady_clock::time_point start) : start_(start) {}
  // Sleeps and returns true once the wait is past its first 10 ms; false (no sleep) before.
  bool nap(std::chrono::steady_clock::time_point now) {
    if (now - start_ <= std::chrono::milliseconds(10)) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(50 << std::min(naps_++, 4u)));
    return true;
  }

 private:
  std::chrono::steady_clock::time_point start_;
  unsigned naps_ = 0;
};

// Group::set_idle_waits(true) for one scope.
class IdleWaits {
 public:
  explicit IdleWaits(Group& g) : g_(g) { g_.set_idle_waits(true); }
  ~IdleWaits() { g_.set_idle_waits(false); }
  IdleWaits(const IdleWaits&) = delete;
  IdleWaits& operator=(const IdleWaits&) = delete;

 private:
  Group& g_;
};

// The group a command runs in, once the engine has chosen a device (nullptr before): main()
// reports a failure through it so that a failing rank never leaves its peers waiting.
Group* active_group();
void set_active_group(Group* g);
// Ends the active group's transport cleanly (MPI_Finalize after a barrier with a deadline).
void finalize_active_group();

}  // namespace epmoe
