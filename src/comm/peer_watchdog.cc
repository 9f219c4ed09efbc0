#include "comm/peer_watchdog.h"

#include "comm/peer_verdict.h"

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>

#include <sched.h>

#include "comm/group.h"

namespace epmoe {

namespace {

// The side channel is a communicator of its own, so these tags never meet collective traffic.
constexpr int kQueryTag = 1, kReplyTag = 2;

MPI_Comm& side_comm(unsigned char* p) { return *reinterpret_cast<MPI_Comm*>(p); }

}  // namespace

// A query (query id only) or the reply to one. Sent as raw bytes: every rank runs the same binary.
struct PeerWatchdog::Status {
  int64_t query = 0;   // id of the query answered: the asker's operation count
  int64_t op = 0;      // the answering rank's operation count
  char name[48] = {};  // and the operation it waits in
};

PeerWatchdog::PeerWatchdog(Group& group, void* comm) : group_(group), side_(new unsigned char[sizeof(MPI_Comm)]) {
  MPI_Comm_dup(*static_cast<MPI_Comm*>(comm), &side_comm(side_.get()));
}

// Here, where Status is complete. The side channel is left for MPI_Finalize to release: the group
// that owns the watchdog lives until exit.
PeerWatchdog::~PeerWatchdog() = default;

void PeerWatchdog::answer_queries(Position here) {
  MPI_Comm side = side_comm(side_.get());
  for (;;) {
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kQueryTag, side, &flag, &st) != MPI_SUCCESS || !flag) return;
    Status q;
    MPI_Recv(&q, int(sizeof q), MPI_BYTE, st.MPI_SOURCE, kQueryTag, side, MPI_STATUS_IGNORE);
    auto r = std::make_unique<Status>();
    r->query = q.query;
    r->op = int64_t(here.count);
    std::snprintf(r->name, sizeof r->name, "%s", here.name);
    // Fire and forget: the asker may already be gone. The buffer lives in in_flight_ until exit.
    MPI_Request req;
    MPI_Isend(r.get(), int(sizeof *r), MPI_BYTE, st.MPI_SOURCE, kReplyTag, side, &req);
    MPI_Request_free(&req);
    in_flight_.push_back(std::move(r));
  }
}

std::string PeerWatchdog::diagnose(void* request, Position here) {
  const int rank = group_.rank(), size = group_.size();
  MPI_Comm side = side_comm(side_.get());
  auto query = std::make_unique<Status>();
  query->query = int64_t(here.count);
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    MPI_Request req;
    MPI_Isend(query.get(), int(sizeof *query), MPI_BYTE, p, kQueryTag, side, &req);
    MPI_Request_free(&req);
  }
  in_flight_.push_back(std::move(query));

  // A live peer answers within milliseconds (it polls while it waits); the grace period only
  // has to outlast a peer that is busy computing for a moment.
  const double grace_s = std::clamp(group_.timeout() * 0.2, 0.5, 5.0);
  const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
  std::vector<Status> answer(static_cast<size_t>(size));
  std::vector<bool> answered(static_cast<size_t>(size), false);
  answered[size_t(rank)] = true;
  int missing = size - 1;
  while (missing > 0 && std::chrono::steady_clock::now() < until) {
    int done = 0;
    MPI_Test(static_cast<MPI_Request*>(request), &done, MPI_STATUS_IGNORE);
    if (done) return "";  // the operation completed after all: a slow peer, not a dead one
    answer_queries(here);  // peers that time out too ask us
    int flag = 0;
    MPI_Status st;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kReplyTag, side, &flag, &st) == MPI_SUCCESS && flag) {
      Status r;
      MPI_Recv(&r, int(sizeof r), MPI_BYTE, st.MPI_SOURCE, kReplyTag, side, MPI_STATUS_IGNORE);
      const size_t p = size_t(st.MPI_SOURCE);
      if (r.query == int64_t(here.count) && !answered[p]) {  // replies to an older query are stale
        answered[p] = true;
        answer[p] = r;
        missing--;
      }
      continue;
    }
    sched_yield();
  }
  std::vector<PeerReport> peers;
  for (int p = 0; p < size; p++) {
    if (p == rank) continue;
    const Status& a = answer[size_t(p)];
    peers.push_back({p, bool(answered[size_t(p)]), uint64_t(a.op), std::string(a.name, strnlen(a.name, sizeof a.name))});
  }
  return peer_verdict(peers, here.count, "every peer answers");
}

void PeerWatchdog::wait(void* request, const char* op, Position here, bool idle) {
  MPI_Request* req = static_cast<MPI_Request*>(request);
  const double timeout_s = group_.timeout();
  const auto start = std::chrono::steady_clock::now();
  const auto deadline = start + std::chrono::duration<double>(timeout_s);
  // Peers only ask after a timeout, so a collective that completes quickly never probes.
  const auto answer_from = start + std::chrono::milliseconds(50);
  int done = 0;
  unsigned spins = 0;
  IdleBackoff backoff(start);
  for (;;) {
    int rc = MPI_Test(req, &done, MPI_STATUS_IGNORE);
    if (rc != MPI_SUCCESS) {
      char msg[MPI_MAX_ERROR_STRING];
      int len = 0;
      MPI_Error_string(rc, msg, &len);
      group_.abort_group(std::string(op) + " failed: " + std::string(msg, size_t(len)), 1);
    }
    if (done) return;
    const auto now = std::chrono::steady_clock::now();
    if (now > answer_from && spins % 64 == 0) answer_queries(here);
    if (now > deadline) {
      const std::string verdict = diagnose(req, here);
      if (verdict.empty()) return;
      group_.abort_group(std::string(op) + " (operation " + std::to_string(here.count) +
                             "): no answer from the group for " + std::to_string(int(timeout_s)) +
                             " s (--comm-timeout): " + verdict + ". Aborting the group.",
                         1);
    }
    // Keep calling MPI_Test (it drives the progress of large messages), but yield the core after
    // a short spin: ranks are often oversubscribed on few cores. Sleeping here instead would
    // starve the progress engine and slow big transfers by an order of magnitude -- except in an
    // idle wait (no bulk data, a peer with nothing to do), which naps (IdleBackoff; queries are
    // still answered between naps).
    ++spins;
    if (!(idle && backoff.nap(now)) && spins > 64) sched_yield();
  }
}

}  // namespace epmoe
