// The deadline of every wait of the MPI group, and the diagnosis that names the peer at fault.
//
// A collective that does not complete does not say which rank is missing. So every rank that has
// waited a while also answers status queries on a side channel (a duplicate of the group's
// communicator, point-to-point only, so its messages never meet collective traffic). A rank whose
// wait times out asks every peer where it is and listens for a short grace period: peers that
// answer are alive and waiting (and say in which operation); peers that stay silent are dead,
// hung or stuck outside communication -- those are named. Nothing is exchanged while collectives
// complete in time.
//
// MPI types stay opaque here (void*), so that no header above comm/ pulls in mpi.h.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace epmoe {

class Group;

class PeerWatchdog {
 public:
  // Where this rank is in the group's sequence of collectives: what it tells a peer that asks,
  // and the key that tells a reply to this query from a stale one.
  struct Position {
    uint64_t count = 0;     // collectives entered so far
    const char* name = "";  // the last one entered
  };

  // `comm` (an MPI_Comm*) is duplicated into the side channel, which is collective over it:
  // every rank constructs its watchdog at the same point. `group` supplies rank, size and
  // timeout, and is aborted when a wait fails.
  PeerWatchdog(Group& group, void* comm);
  ~PeerWatchdog();
  PeerWatchdog(const PeerWatchdog&) = delete;
  PeerWatchdog& operator=(const PeerWatchdog&) = delete;

  // Polls an MPI request (MPI_Request*) until it completes; after the group's timeout, aborts the
  // group with a message naming `op`, this rank and the peers that do not answer. `idle`: the
  // wait may be long and carries no bulk data (Group::set_idle_waits): sleep between polls.
  void wait(void* request, const char* op, Position here, bool idle = false);

 private:
  // A message on the side channel.
  struct Status;

  // While waiting: answers the status queries of peers whose waits timed out.
  void answer_queries(Position here);
  // After a timeout: which peers answer, and where they are -- one clause for the abort message;
  // empty when the request completed during the grace period after all.
  std::string diagnose(void* request, Position here);

  Group& group_;
  std::unique_ptr<unsigned char[]> side_;           // the side channel's MPI_Comm
  std::vector<std::unique_ptr<Status>> in_flight_;  // send buffers of messages nobody waits for
};

}  // namespace epmoe
