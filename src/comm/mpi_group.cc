#include "comm/mpi_group.h"
#include "util/env.h"

#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "comm/peer_watchdog.h"
#include "comm/test_fault.h"
#include "util/error.h"

namespace epmoe {

namespace {

bool launched_by_mpirun() {
  // OpenMPI (and PMIx-based launchers) export these to every rank they start.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (env_get(v)) return true;
  return false;
}

std::vector<int> to_int_counts(const std::vector<size_t>& bytes, const char* op) {
  std::vector<int> c(bytes.size());
  for (size_t i = 0; i < bytes.size(); i++) {
    EPMOE_ASSERT(bytes[i] <= size_t(INT32_MAX), std::string(op) + ": message above 2 GiB");
    c[i] = int(bytes[i]);
  }
  return c;
}

std::vector<int> displs_of(const std::vector<int>& c) {
  std::vector<int> d(c.size(), 0);
  for (size_t i = 1; i < c.size(); i++) d[i] = d[i - 1] + c[i - 1];
  return d;
}

std::vector<int> to_int_displs(const std::vector<size_t>& bytes, const char* op) { return to_int_counts(bytes, op); }

MpiGroup* g_world = nullptr;

}  // namespace

PendingOp::PendingOp() : request_(new unsigned char[sizeof(MPI_Request)]) {
  *reinterpret_cast<MPI_Request*>(request_.get()) = MPI_REQUEST_NULL;
}
PendingOp::~PendingOp() = default;

MpiGroup::MpiGroup() {
  if (!launched_by_mpirun()) return;
  int provided = 0;
  MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
  // Errors come back as codes so that we can report them with context instead of MPI's abort.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
  mpi_ = true;
  watchdog_ = std::make_unique<PeerWatchdog>(*this, mpi_comm());
  if (const std::string error = arm_test_fault(); !error.empty()) abort_group(error, 2);
}

MpiGroup::~MpiGroup() = default;  // here, where PeerWatchdog is complete

MpiGroup& MpiGroup::world() {
  if (!g_world) g_world = new MpiGroup();
  return *g_world;
}

void MpiGroup::finalize() {
  if (g_world && g_world->mpi_) {
    // MPI_Finalize waits for every rank without a deadline; a rank that hangs after its last
    // collective would hang the others there. This barrier has one, and names that rank.
    g_world->barrier();
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
  }
}

void* MpiGroup::mpi_comm() const {
  static MPI_Comm world = MPI_COMM_WORLD;
  return &world;
}

void MpiGroup::abort_group(const std::string& message, int exit_code) {
  std::fprintf(stderr, "epmoe: rank %d: %s\n", rank_, message.c_str());
  std::fflush(stderr);
  if (mpi_) MPI_Abort(MPI_COMM_WORLD, exit_code);
  std::_Exit(exit_code);
}

void MpiGroup::begin_op(const char* op) {
  ops_++;
  current_op_ = op;
  test_fault_point(rank_, ops_, op);
}

void MpiGroup::wait(void* request, const char* op) {
  EPMOE_ASSERT(watchdog_, std::string(op) + ": a request to wait for in a group of one without MPI");
  watchdog_->wait(request, op, {ops_, current_op_}, idle_waits_);
}

uint64_t MpiGroup::others(const std::vector<size_t>& per_peer) const {
  uint64_t n = 0;
  for (size_t r = 0; r < per_peer.size(); r++)
    if (int(r) != rank_) n += per_peer[r];
  return n;
}

void MpiGroup::barrier() {
  if (!mpi_) return;
  begin_op("barrier");
  MPI_Request r;
  MPI_Ibarrier(MPI_COMM_WORLD, &r);
  wait(&r, "barrier");
}

void MpiGroup::allgather(const void* send, size_t bytes, void* recv) {
  if (!mpi_) {
    std::memcpy(recv, send, bytes);
    return;
  }
  begin_op("allgather");
  EPMOE_ASSERT(bytes <= size_t(INT32_MAX), "allgather: message above 2 GiB");
  bytes_sent_ += uint64_t(bytes) * uint64_t(size_ - 1);
  MPI_Request r;
  MPI_Iallgather(send, int(bytes), MPI_BYTE, recv, int(bytes), MPI_BYTE, MPI_COMM_WORLD, &r);
  wait(&r, "allgather");
}

void MpiGroup::allgatherv(const void* send, size_t bytes, void* recv, const std::vector<size_t>& recv_bytes) {
  if (!mpi_) {
    std::memcpy(recv, send, bytes);
    return;
  }
  begin_op("allgatherv");
  bytes_sent_ += uint64_t(bytes) * uint64_t(size_ - 1);
  auto counts = to_int_counts(recv_bytes, "allgatherv");
  auto displs = displs_of(counts);
  MPI_Request r;
  MPI_Iallgatherv(send, int(bytes), MPI_BYTE, recv, counts.data(), displs.data(), MPI_BYTE, MPI_COMM_WORLD, &r);
  wait(&r, "allgatherv");
}

void MpiGroup::all_to_all_v(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                             const std::vector<size_t>& recv_bytes) {
  if (!mpi_) {
    std::memcpy(recv, send, send_bytes[0]);
    return;
  }
  begin_op("all-to-all-v");
  bytes_sent_ += others(send_bytes);
  auto sc = to_int_counts(send_bytes, "all-to-all-v"), rc = to_int_counts(recv_bytes, "all-to-all-v");
  auto sd = displs_of(sc), rd = displs_of(rc);
  MPI_Request r;
  MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, MPI_COMM_WORLD, &r);
  wait(&r, "all-to-all-v");
}

void MpiGroup::all_to_all_v(const void* send, const std::vector<size_t>& send_bytes,
                             const std::vector<size_t>& send_displs, void* recv, const std::vector<size_t>& recv_bytes,
                             const std::vector<size_t>& recv_displs) {
  if (!mpi_) {
    std::memcpy(static_cast<char*>(recv) + recv_displs[0], static_cast<const char*>(send) + send_displs[0], send_bytes[0]);
    return;
  }
  begin_op("all-to-all-v");
  bytes_sent_ += others(send_bytes);
  auto sc = to_int_counts(send_bytes, "all-to-all-v"), rc = to_int_counts(recv_bytes, "all-to-all-v");
  auto sd = to_int_displs(send_displs, "all-to-all-v"), rd = to_int_displs(recv_displs, "all-to-all-v");
  MPI_Request r;
  MPI_Ialltoallv(send, sc.data(), sd.data(), MPI_BYTE, recv, rc.data(), rd.data(), MPI_BYTE, MPI_COMM_WORLD, &r);
  wait(&r, "all-to-all-v");
}

std::unique_ptr<PendingOp> MpiGroup::all_to_all_v_async(const void* send, const std::vector<size_t>& send_bytes, void* recv,
                                                    const std::vector<size_t>& recv_bytes) {
  auto op = std::make_unique<PendingOp>();
  if (!mpi_) {
    std::memcpy(recv, send, send_bytes[0]);
    return op;
  }
  begin_op("all-to-all-v (async)");
  bytes_sent_ += others(send_bytes);
  op->sc_ = to_int_counts(send_bytes, "all-to-all-v");
  op->rc_ = to_int_counts(recv_bytes, "all-to-all-v");
  op->sd_ = displs_of(op->sc_);
  op->rd_ = displs_of(op->rc_);
  MPI_Ialltoallv(send, op->sc_.data(), op->sd_.data(), MPI_BYTE, recv, op->rc_.data(), op->rd_.data(), MPI_BYTE,
                 MPI_COMM_WORLD, reinterpret_cast<MPI_Request*>(op->request_.get()));
  op->active_ = true;
  return op;
}

void MpiGroup::wait(PendingOp& op, const char* what) {
  if (!op.active_) return;
  wait(op.request_.get(), what);
  op.active_ = false;
}

void MpiGroup::all_to_all(const void* send, size_t bytes, void* recv) {
  if (!mpi_) {
    std::memcpy(recv, send, bytes);
    return;
  }
  begin_op("all-to-all");
  bytes_sent_ += uint64_t(bytes) * uint64_t(size_ - 1);
  MPI_Request r;
  MPI_Ialltoall(send, int(bytes), MPI_BYTE, recv, int(bytes), MPI_BYTE, MPI_COMM_WORLD, &r);
  wait(&r, "all-to-all");
}

// One element, reduced over the group: the four typed all-reduces share it.
void MpiGroup::allreduce_one(const void* in, void* out, bool is_double, bool is_max) {
  begin_op("allreduce");
  MPI_Request r;
  MPI_Iallreduce(in, out, 1, is_double ? MPI_DOUBLE : MPI_INT64_T, is_max ? MPI_MAX : MPI_SUM, MPI_COMM_WORLD, &r);
  wait(&r, "allreduce");
}

int64_t MpiGroup::allreduce_max(int64_t v) {
  if (!mpi_) return v;
  int64_t out = 0;
  allreduce_one(&v, &out, false, true);
  return out;
}

int64_t MpiGroup::allreduce_sum(int64_t v) {
  if (!mpi_) return v;
  int64_t out = 0;
  allreduce_one(&v, &out, false, false);
  return out;
}

double MpiGroup::allreduce_max_f64(double v) {
  if (!mpi_) return v;
  double out = 0;
  allreduce_one(&v, &out, true, true);
  return out;
}

double MpiGroup::allreduce_sum_f64(double v) {
  if (!mpi_) return v;
  double out = 0;
  allreduce_one(&v, &out, true, false);
  return out;
}

}  // namespace epmoe
