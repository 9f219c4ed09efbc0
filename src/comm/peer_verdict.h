// The sentence both groups print when a wait times out: which peers are silent, which wait in the
// same operation, which wait elsewhere. Written once so that MPI and NCCL runs read alike (the
// rank-fault tests assert on it); each group gathers the facts its own way (a side channel of MPI
// messages, status files beside the NCCL id).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epmoe {

// What one peer said, or that it said nothing.
struct PeerReport {
  int rank = 0;
  bool answered = false;
  uint64_t op = 0;       // the operation it waits in (its count of operations)
  std::string waits_in;  // and that operation's name
};

// "rank 1" / "ranks 1, 3".
std::string rank_list(const std::vector<int>& ranks);

// One clause of the abort message, from every peer's report and this rank's operation count;
// `all_answer` is the clause when nobody is silent.
std::string peer_verdict(const std::vector<PeerReport>& peers, uint64_t my_op, const char* all_answer);

}  // namespace epmoe
