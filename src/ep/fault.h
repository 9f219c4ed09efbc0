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
//
// A backend receives its fault in BackendOptions (one per backend instance, never a global), and
// the transforms below are the only code that knows what a fault does: an exchange calls them
// only when its fault is not None, so the correct path carries no fault logic.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epmoe {

struct Placement;

enum class Fault { None, DoubleReduce, SkipReduce, ReplicaPerRank, WrongCombineIds, DropOverflow };

std::vector<std::string> fault_names();           // the spellings of --inject
Fault parse_fault(const std::string& name);       // InputError listing the names on a typo
std::string fault_name(Fault f);

// The weight a sender packs for a slot served by `physical` (replica-per-rank: times its replicas).
float faulty_weight(Fault f, const Placement& p, int physical, float w);
// Home side, deterministic combine: slot rows [n * K, H] of tokens whose slots are served by
// physical[n * K]; rows served by another rank than `me` are dropped (skip-reduce) or moved one
// token further on (wrong-combine-ids).
void fault_slot_rows(Fault f, const Placement& p, int me, const int32_t* physical, int64_t n, int K, int H,
                     float* slot_rows);
// Home side, fast combine: the token a partial of rank d lands on (-1: dropped), for a token of
// the range [t0, t1).
int64_t fault_partial_token(Fault f, int me, int d, int64_t token, int64_t t0, int64_t t1);
// What the combined output is multiplied by (double-reduce: the group size).
float fault_output_scale(Fault f, const Placement& p);
// Whether bounded-capacity dispatch runs one round only (drop-overflow).
bool fault_drops_overflow(Fault f);

}  // namespace epmoe
