// Expert placement: which physical expert slots exist, which logical expert each serves, which
// rank owns it, and which replica serves a given (token, slot).
//
// With R ranks and P = E + N physical experts (N redundant replicas), rank r owns the contiguous
// range [P*r/R, P*(r+1)/R). E need not divide by R, and R may exceed P (some ranks then own no
// expert and only send and receive). The replica serving (token, slot) is a pure function of the
// token's global id and the slot -- never of the rank -- so every token-slot is counted exactly
// once whichever rank routes it (sglang #32962 counted replicas twice because it was not).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epmoe {

struct Placement {
  int num_logical = 0;
  int ranks = 1;
  std::vector<int> logical_of;               // [P] physical -> logical
  std::vector<std::vector<int>> replicas;    // [E] logical -> physical slots, ascending
  std::vector<int> rank_begin;               // [R + 1] physical range of each rank

  int num_physical() const { return int(logical_of.size()); }
  int owner(int physical) const;
  int first_local(int rank) const { return rank_begin[size_t(rank)]; }
  int num_local(int rank) const { return rank_begin[size_t(rank) + 1] - rank_begin[size_t(rank)]; }
  // Logical experts rank `rank` needs weights for (deduplicated, ascending).
  std::vector<int> logical_owned_by(int rank) const;
  // Physical slot that serves logical expert `logical` for (token_gid, slot).
  int choose(int logical, uint64_t token_gid, int slot) const;

  // E logical experts on R ranks, experts 0..N-1 replicated once each (physical E + i).
  static Placement make_default(int num_experts, int ranks, int redundant);
  // From a JSON file {"replicas": {"0": [0, 9], "1": [1], ...}} or {"0": [...], ...}: logical
  // expert -> its physical slots. Every logical expert needs >= 1 slot, every slot 0..P-1 is used
  // exactly once. Throws InputError naming the file on anything else.
  static Placement from_file(const std::string& path, int num_experts, int ranks);
};

}  // namespace epmoe
