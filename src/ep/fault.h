// Fault injection for `epmoe check` (compiled in, off by default). Each fault reproduces a real
// bug class of MoE all-to-all code, so that the checker can prove it catches them:
//   double-reduce      the combined output is all-reduced again over the group (sglang #34006,
//                      #34887): every token's routed output is multiplied by R
//   skip-reduce        contributions of other ranks never reach home (under-reduce, #32963)
//   replica-per-rank   every replica of a redundant expert serves the slot and all answers are
//                      summed (#32962: the replica was chosen per rank)
//   wrong-combine-ids  answers from other ranks are written to the wrong token (MoRI combine ids)
//   drop-overflow      bounded-capacity dispatch drops the tokens beyond its capacity instead of
//                      running further rounds
#pragma once

#include <string>
#include <vector>

namespace epmoe {

enum class Fault { None, DoubleReduce, SkipReduce, ReplicaPerRank, WrongCombineIds, DropOverflow };

std::vector<std::string> fault_names();           // the spellings of --inject
Fault parse_fault(const std::string& name);       // InputError listing the names on a typo
std::string fault_name(Fault f);

// The fault every backend in this process applies (None unless a checker sets it).
void set_injected_fault(Fault f);
Fault injected_fault();

}  // namespace epmoe
