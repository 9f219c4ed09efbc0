// The home side's plan over its tokens, shared by every GPU backend that sends records (the
// NCCL ones of backends.cu and the NVLink one of onesided.cu): how many records go to each
// destination, which token (and slot) each record carries, and where each slot's answer will be.
#pragma once

#include "ep/cuda/plan_combine.cuh"

namespace epmoe::cuda {

// The plan over tokens [t0, t1). One block; per-destination counters per thread.
struct HomePlanArgs {
  OwnerTable rk;
  const int32_t* phys = nullptr;  // [T, K]
  int64_t t0 = 0, t1 = 0;
  int K = 0;
  bool per_slot = false;  // a record per (token, slot) (else per (token, destination): dedup)
  int fixed = 0;          // > 0: the block of destination d starts at d * fixed (bounded capacity)
  int32_t* counts = nullptr;     // [2R]: records to d, answers from d
  int32_t* rec_token = nullptr;  // [records] (nullptr: no records needed)
  int32_t* rec_slot = nullptr;
  int32_t* rec_dest = nullptr;
  int64_t rec_bound = 0;         // fixed mode: rec_* entries to clear to -1 first
  int32_t* slot_pos = nullptr;   // [(t1 - t0) * K]
  int32_t* rec_pos = nullptr;    // optional, dedup: [(t1 - t0) * R] the record of (t, d), or -1
  // Optional (the NVLink backends): reserve this plan's records at each destination d by an atomic
  // add of its record count on *reserve_at[d] (its counter, mapped here); the old values, where
  // this rank's records start there, go to reserved[d].
  int32_t* reserve_at[kMaxOwnerRanks] = {};
  int32_t* reserved = nullptr;
};
void home_plan(const HomePlanArgs& a, cudaStream_t s);

}  // namespace epmoe::cuda
