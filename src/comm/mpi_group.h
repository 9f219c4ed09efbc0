// The group over MPI (comm/group.h). Started under mpirun, it spans MPI_COMM_WORLD; started
// without, it is a group of one and MPI is never initialised (a plain `epmoe score` needs no MPI
// runtime at all).
//
// Collectives are posted non-blocking and polled, so that every wait can have a deadline: a wait
// longer than the timeout aborts the whole group (MPI_Abort) with a message that names the
// operation, this rank and the peers at fault (comm/peer_watchdog.h finds them).
//
// Tests inject a rank's failure on entering its n-th collective through EPMOE_TEST_FAULT
// (comm/test_fault.h); never set it in production.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "comm/group.h"

namespace epmoe {

class PeerWatchdog;

// A posted non-blocking operation; owns what MPI needs alive until it completes.
class PendingOp {
 public:
  PendingOp();
  ~PendingOp();
  PendingOp(const PendingOp&) = delete;
  PendingOp& operator=(const PendingOp&) = delete;

 private:
  friend class MpiGroup;
  std::vector<int> sc_, sd_, rc_, rd_;
  std::unique_ptr<unsigned char[]> request_;  // an MPI_Request, kept opaque to keep mpi.h out
  bool active_ = false;
};

class MpiGroup final : public Group {
 public:
  // The process-wide group (MPI_COMM_WORLD under mpirun, else a group of one). Never destroyed:
  // finalize() ends MPI explicitly, and nothing running at exit can find the group gone.
  static MpiGroup& world();
  ~MpiGroup();
  // Finalises MPI if it was initialised (call once at exit).
  static void finalize();

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* transport() const override { return "MPI"; }
  bool mpi_initialised() const { return mpi_; }
  void set_timeout(double seconds) override { timeout_s_ = seconds; }
  double timeout() const override { return timeout_s_; }
  void set_idle_waits(bool on) override { idle_waits_ = on; }

  void barrier() override;
  // Every rank contributes `bytes` bytes; recv holds size() * bytes, in rank order.
  void allgather(const void* send, size_t bytes, void* recv) override;
  // Variable sizes: recv_bytes[r] from rank r, packed in rank order into recv.
  void allgatherv(const void* send, size_t bytes, void* recv, const std::vector<size_t>& recv_bytes) override;
  // Byte counts per peer; displacements are the packed prefix sums.
  void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                 const std::vector<size_t>& recv_bytes);
  // As above with explicit byte displacements (fixed per-peer regions of a preallocated buffer).
  void all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, const std::vector<size_t>& send_displs,
                 void* recv, const std::vector<size_t>& recv_bytes, const std::vector<size_t>& recv_displs);
  // Non-blocking alltoallv (packed); complete it with wait(). Buffers must stay alive until then.
  std::unique_ptr<PendingOp> all_to_all_v_async(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                                        const std::vector<size_t>& recv_bytes);
  void wait(PendingOp& op, const char* what);
  // Fixed block of `bytes` to each peer.
  void all_to_all(const void* send, size_t bytes, void* recv);
  int64_t allreduce_max(int64_t v) override;
  int64_t allreduce_sum(int64_t v) override;
  double allreduce_max_f64(double v) override;
  double allreduce_sum_f64(double v) override;

  // Bytes this rank has sent to other ranks so far (payload of every operation, self excluded);
  // benchmarks read it to report what a backend moves.
  uint64_t bytes_sent() const override { return bytes_sent_; }
  void add_bytes_sent(uint64_t n) override { bytes_sent_ += n; }  // for one-sided puts made outside this class

  // Reports a fatal error of this rank to the group and terminates every process of it.
  [[noreturn]] void abort_group(const std::string& message, int exit_code) override;

  // Raw MPI communicator handle for backends that need MPI directly (RMA windows, non-blocking
  // collectives). Only valid when distributed(). Returned as void* to keep mpi.h out of headers.
  void* mpi_comm() const;
  // Polls an MPI request (MPI_Request*) until done or the timeout; aborts the group on timeout,
  // naming the peers that do not answer a status query.
  void wait(void* request, const char* op);

  // Collective operations this rank has entered so far (the same sequence on every rank).
  uint64_t operations() const { return ops_; }

 private:
  MpiGroup();
  // Counts a collective and gives the test fault hook its chance (comm/test_fault.h).
  void begin_op(const char* op);

  int rank_ = 0, size_ = 1;
  double timeout_s_ = 60.0;
  bool idle_waits_ = false;  // set_idle_waits
  bool mpi_ = false;
  uint64_t bytes_sent_ = 0;
  uint64_t ops_ = 0;
  const char* current_op_ = "start-up";
  std::unique_ptr<PeerWatchdog> watchdog_;  // only when mpi_

  uint64_t others(const std::vector<size_t>& per_peer) const;
  void allreduce_one(const void* in, void* out, bool is_double, bool is_max);
};

}  // namespace epmoe
