#include "comm/mpi_group.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <thread>

#include <sched.h>

#include "util/error.h"

namespace epmoe {

namespace {

bool launched_by_mpirun() {
  // OpenMPI (and PMIx-based launchers) export these to every rank they start.
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"})
    if (std::getenv(v)) return true;
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

// The test-only fault hook (communicator.h): EPMOE_TEST_FAULT=throw|kill|hang:RANK:OP.
struct TestFault {
  enum Kind { None, Throw, Kill, Hang } kind = None;
  int rank = -1;
  uint64_t op = 0;
};
TestFault g_fault;

// False when the variable is set but unreadable: a test that meant to inject a fault must not
// pass because nothing was injected.
bool parse_test_fault(TestFault& f) {
  const char* v = std::getenv("EPMOE_TEST_FAULT");
  if (!v || !*v) return true;
  const std::string s = v;
  const size_t a = s.find(':'), b = a == std::string::npos ? a : s.find(':', a + 1);
  if (b == std::string::npos) return false;
  const std::string kind = s.substr(0, a);
  if (kind == "throw") f.kind = TestFault::Throw;
  else if (kind == "kill") f.kind = TestFault::Kill;
  else if (kind == "hang") f.kind = TestFault::Hang;
  else return false;
  try {
    f.rank = std::stoi(s.substr(a + 1, b - a - 1));
    f.op = std::stoull(s.substr(b + 1));
  } catch (const std::exception&) {
    return false;
  }
  return true;
}

// Tags of the status channel (a communicator of its own, so they never meet collective traffic).
constexpr int kQueryTag = 1, kReplyTag = 2;

MPI_Comm& side_comm(unsigned char* p) { return *reinterpret_cast<MPI_Comm*>(p); }

}  // namespace

// A message on the status channel: a query (query id only) or the reply to one.
struct MpiGroup::Status {
  int64_t query = 0;   // id of the query answered: the asker's operation count
  int64_t op = 0;      // the answering rank's operation count
  char name[48] = {};  // and the operation it waits in
};

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
  side_.reset(new unsigned char[sizeof(MPI_Comm)]);
  MPI_Comm_dup(MPI_COMM_WORLD, &side_comm(side_.get()));
  if (!parse_test_fault(g_fault))
    abort_group(std::string("error: EPMOE_TEST_FAULT='") + std::getenv("EPMOE_TEST_FAULT") +
                    "': expected ACTION:RANK:OP with ACTION throw, kill or hang",
                2);
}

MpiGroup::~MpiGroup() = default;  // here, where Status is complete

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
  if (g_fault.kind == TestFault::None || g_fault.rank != rank_ || g_fault.op != ops_) return;
  const std::string where = std::string(op) + " (operation " + std::to_string(ops_) + ")";
  switch (g_fault.kind) {
    case TestFault::None: break;
    case TestFault::Throw: throw Error("EPMOE_TEST_FAULT: injected failure on entering " + where);
    case TestFault::Kill:
      std::fprintf(stderr, "EPMOE_TEST_FAULT: rank %d kills itself (SIGKILL) on entering %s\n", rank_, where.c_str());
      std::fflush(stderr);
      std::raise(SIGKILL);
      break;
    case TestFault::Hang:
      std::fprintf(stderr, "EPMOE_TEST_FAULT: rank %d hangs on entering %s\n", rank_, where.c_str());
      std::fflush(stderr);
      for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
  }
}

void MpiGroup::answer_status_queries() {
  MPI_Comm side = side_comm(side_.get());
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, side, &flag, &st) != MPI_SUCCESS || !flag) return;
    Status q;
    MPI_Recv(&q, int(sizeof q), MPI_BYTE, st.MPI_SOURCE, kQueryTag, side, MPI_STATUS_IGNORE);
    auto r = std::make_unique<Status>();
    r->query = q.query;
    r->op = int64_t(ops_);
    std::snprintf(r->name, sizeof r->name, "%s", current_op_);
    // Fire and forget: the asker may already be gone. The buffer lives in replies_ until exit.
    MPI_Request req;
    MPI_Isend(r.get(), int(sizeof *r), MPI_BYTE, st.MPI_SOURCE, kReplyTag, side, &req);
    MPI_Request_free(&req);
    replies_.push_back(std::move(r));
  }
}

namespace {

std::string rank_list(const std::vector<int>& ranks) {
  std::string s = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); i++) s += (i ? ", " : "") + std::to_string(ranks[i]);
  return s;
}

}  // namespace

std::string MpiGroup::diagnose_peers(void* request) {
  MPI_Comm side = side_comm(side_.get());
  auto query = std::make_unique<Status>();
  query->query = int64_t(ops_);
  for (int p = 0; p < size_; p++) {
    if (p == rank_) continue;
    MPI_Request req;
    MPI_Isend(query.get(), int(sizeof *query), MPI_BYTE, p, kQueryTag, side, &req);
    MPI_Request_free(&req);
  }
  replies_.push_back(std::move(query));

  // A live peer answers within milliseconds (it polls while it waits); the grace period only
  // has to outlast a peer that is busy computing for a moment.
  const double grace_s = std::clamp(timeout_s_ * 0.2, 0.5, 5.0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  std::vector<Status> answer(static_cast<size_t>(size_));
  std::vector<bool> answered(static_cast<size_t>(size_), false);
  answered[size_t(rank_)] = true;
  int missing = size_ - 1;
  while (missing > 0 && std::chrono::steady_clock::now() < until) {
    int done = 0;
    MPI_Test(static_cast<MPI_Request*>(request), &done, MPI_STATUS_IGNORE);
    if (done) return "";  // the operation completed after all: a slow peer, not a dead one
    answer_status_queries();  // peers that time out too ask us
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, side, &flag, &st) == MPI_SUCCESS && flag) {
      Status r;
      MPI_Recv(&r, int(sizeof r), MPI_BYTE, st.MPI_SOURCE, kReplyTag, side, MPI_STATUS_IGNORE);
      const size_t p = size_t(st.MPI_SOURCE);
      if (r.query == int64_t(ops_) && !answered[p]) {  // replies to an older query are stale
        answered[p] = true;
        answer[p] = r;
        missing--;
      }
      continue;
    }
    sched_yield();
  }
  std::vector<int> silent, with_us;
  std::string elsewhere;
  for (int p = 0; p < size_; p++) {
    if (p == rank_) continue;
    const Status& a = answer[size_t(p)];
    if (!answered[size_t(p)]) silent.push_back(p);
    else if (a.op == int64_t(ops_)) with_us.push_back(p);
    else
      elsewhere += "; rank " + std::to_string(p) + " waits in " + std::string(a.name, strnlen(a.name, sizeof a.name)) +
                   " (operation " + std::to_string(a.op) + ")";
  }
  std::string v;
  if (!silent.empty())
    v = rank_list(silent) + (silent.size() == 1 ? " does" : " do") +
        " not answer (dead, hung, or stuck outside communication)";
  else
    v = "every peer answers";
  if (!with_us.empty()) v += "; " + rank_list(with_us) + " wait" + (with_us.size() == 1 ? "s" : "") + " in the same operation";
  return v + elsewhere;
}

void MpiGroup::wait(void* request, const char* op) {
  MPI_Request* req = static_cast<MPI_Request*>(request);
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s_);
  // Peers only ask after a timeout, so a collective that completes quickly never probes.
  const auto answer_from = start + std::chrono::milliseconds(50);
  int done = 0;
  unsigned spins = 0;
  for (;;) {
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      char msg[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, msg, &len);
      abort_group(std::string(op) + " failed: " + std::string(msg, size_t(len)), 1);
    }
    if (done) return;
    const auto now = std::chrono::steady_clock::now();
    if (now > answer_from && spins % 64 == 0) answer_status_queries();
    if (now > deadline) {
      const std::string verdict = diagnose_peers(req);
      if (verdict.empty()) return;
      abort_group(std::string(op) + " (operation " + std::to_string(ops_) + "): no answer from the group for " +
                      std::to_string(int(timeout_s_)) + " s (--comm-timeout): " + verdict + ". Aborting the group.",
                  1);
    }
    // Keep calling MPI_Test (it drives the progress of large messages), but yield the core after
    // a short spin: ranks are often oversubscribed on few cores. Sleeping here instead would
    // starve the progress engine and slow big transfers by an order of magnitude.
    if (++spins > 64) sched_yield();
  }
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
