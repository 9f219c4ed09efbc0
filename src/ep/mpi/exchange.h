// What every distributed backend exchanges, independent of how the bytes travel.
//
//   home rank                          serving rank d (owns some physical experts)
//   plan: records for d  --request-->  serve: expert outputs for the record's slots on d
//   unpack + combine     <--answer---
//
// A record carries one token row for one destination with the slots that destination serves:
// all of them (dedup: the token travels once per rank, as DeepEP normal mode) or one slot
// (per-(token, expert) messages, as DeepEP low-latency). Answers, per CombineMode:
//   Deterministic: one row per served slot, expert_k(x) unweighted; home sums w_k * y_k in slot
//                  order k = 0..K-1 (combine_slots) -> bits independent of the layout.
//   Fast:          one row per record, sum over its slots of w_k * y_k; home adds the partials
//                  in rank order (fewer bytes, rounding depends on the layout).
// The record's layout is the one of every backend (ep/dispatch_record.h), which sizes every buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ep/backend.h"
#include "ep/dispatch_record.h"
#include "ep/fault.h"

namespace epmoe {

// The CPU backends carry fp32 rows in host memory.
inline const float* host_rows(const MoeTokens& in) { return static_cast<const float*>(in.x); }

// The CPU backends' records: fp32 rows, the origin (MPI's exchanges deliver records packed by
// source, the one-sided windows in a racy order) and the weights (read by the fast combine), no
// padding.
inline DispatchRecordLayout host_record_layout(const MoeTokens& in) {
  DispatchRecordLayout L;
  L.H = in.H, L.K = in.K, L.elt = 4, L.origin = true, L.weights = true, L.align = 4;
  return L;
}

struct Record {
  int32_t token;  // index in the home rank's tokens
  int32_t slot;   // -1: every slot of the token served by the destination
};

// records[d]: what this rank sends to rank d, tokens ascending (and slots ascending).
struct DispatchPlan {
  std::vector<std::vector<Record>> to;
  // Dedup: one record per (token, destination rank owning >= 1 of its slots).
  static DispatchPlan dedup(const MoeTokens& in, const Placement& p, int64_t t0, int64_t t1);
  // One record per (token, slot), sent to the slot's owner.
  static DispatchPlan per_slot(const MoeTokens& in, const Placement& p, int64_t t0, int64_t t1);
  // Answers rank d returns for our records to it.
  size_t answers_from(int d, const MoeTokens& in, const Placement& p, CombineMode mode) const;
};

// Writes the records for rank d (plan.to[d]) into out (plan.to[d].size() * L.bytes()).
void pack_records(const MoeTokens& in, const Placement& p, const std::vector<Record>& records, int d, int src,
                  const DispatchRecordLayout& L, Fault fault, char* out);

// Field access of a packed record.
struct RecordView {
  const unsigned char* rec;
  const DispatchRecordLayout& L;
  int32_t token() const { return L.token(rec); }
  int32_t src() const { return L.source(rec); }
  int32_t physical(int k) const { return L.physical(rec)[k]; }
  float weight(int k) const { return L.weight(rec)[k]; }
  const float* row() const { return reinterpret_cast<const float*>(rec); }
};
inline RecordView record_at(const char* records, size_t i, const DispatchRecordLayout& L) {
  return {reinterpret_cast<const unsigned char*>(records) + i * L.bytes(), L};
}

// Serving side: the number of answers n received records need.
size_t count_answers(const char* records, size_t n, const DispatchRecordLayout& L, CombineMode mode);
// Runs the local experts for n received records, read where they lie (ExpertJobs over the
// records); writes the answers in record order (and slot order within a record) to answers
// (count_answers(...) rows of H floats).
void serve_records(const char* records, size_t n, const DispatchRecordLayout& L, ExpertRunner& experts, CombineMode mode,
                   float* answers);

// Home side: y[t] for t in [t0, t1) from the answers of every rank (answers[d] points at the
// answers of rank d to plan.to[d], in order). `me` is this rank.
void combine_answers(const MoeTokens& in, const Placement& p, const DispatchPlan& plan,
                     const std::vector<const float*>& answers, CombineMode mode, Fault fault, int me, int64_t t0,
                     int64_t t1, float* y);

// The last step of the deterministic combine, shared by every backend: slot_rows holds
// expert_k(x_t) for t in [t0, t1) (row (t - t0) * K + k); y[t] = sum_k w_k * row in slot order.
// (An injected fault, when a checker sets one, acts here.)
void finish_slots(const MoeTokens& in, const Placement& p, Fault fault, int me, int64_t t0, int64_t t1, float* slot_rows,
                  float* y);
// The last step of the fast combine: y[token] += partial of rank d (call in rank order after
// zeroing y), then finish_partials once.
void add_partial(const MoeTokens& in, Fault fault, int me, int d, int32_t token, int64_t t0, int64_t t1,
                 const float* partial, float* y);
void finish_partials(const MoeTokens& in, const Placement& p, Fault fault, int64_t t0, int64_t t1, float* y);

}  // namespace epmoe
