// The two halves of every GPU backend around the experts, twins of ep/combine.cc: the plan that
// groups a set of (row, slot) jobs by local expert (what the expert GEMMs read), and the
// deterministic slot-order combine (what makes every backend's output the same bits).
#pragma once

#include "ep/cuda/flag_wait.cuh"
#include "ep/fault.h"
#include "ep/placement.h"
#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

// The plan of the local experts for a set of source rows, each with K physical ids (ids outside
// [p0, p0 + n_local) are served elsewhere and skipped). Produces, per local expert, the jobs it
// serves (offsets) with the source row (a_rows) and the output row (c_rows) of each:
//   compact = false: output row = row * K + k (slot rows of the home rank)
//   compact = true:  output row = index of (row, k) among the served jobs in (row, k) order
// (the order in which answers travel back). row_base[r] (optional, rows + 1 entries) is the
// compact index of row r's first served job. One block: rows * K up to a few 100k.
struct PlanArgs {
  const int32_t* phys = nullptr;
  int64_t phys_stride = 0;  // int32 elements between rows
  int64_t rows = 0;         // bound on the rows (host)
  const int32_t* rows_dev = nullptr;  // actual rows on the device, or nullptr (= rows)
  int K = 0;
  int p0 = 0, n_local = 0;
  bool compact = false;
  bool one_per_row = false;    // output row = row (each row has at most one served slot)
  int32_t* offsets = nullptr;  // [n_local + 1]
  int32_t* a_rows = nullptr;   // [rows * K]
  int32_t* c_rows = nullptr;   // [rows * K]
  int32_t* row_base = nullptr; // [rows + 1] or nullptr
  // Tiles of tile_m rows for the grouped GEMM (kernels/cuda/gemm.cuh): (expert, first row) pairs
  // in expert order, their count in *num_tiles. tile_m = 0: none.
  int tile_m = 0;
  int32_t* tiles = nullptr;      // [2 * plan_max_tiles(...)]
  int32_t* num_tiles = nullptr;  // [1]
  // The multi-block form's scratch (host side only): the caller's own, or nullptr for one shared
  // by the process (which a graph must not capture: another plan may move it).
  DeviceArray<int32_t>* workspace = nullptr;
};
void plan(const PlanArgs& a, cudaStream_t s);
// Whether plan() runs as one block (else three launches over the chip, through a workspace shared
// by the process): up to 2048 jobs, beyond which one block's shared-memory counters serialise (at
// 8192 jobs over 128 experts it took 22 us, the three launches ~10). A row count known only on the
// device is a bound here: the three launches cover the bound, and blocks past the count do nothing.
inline bool plan_in_one_block(int64_t rows, int K, bool /*rows_on_device*/) { return rows * K <= 2048; }
// Each non-empty group has at most rows_g / tile_m + 1 tiles, and at most min(n_local, rows K)
// groups are non-empty: a decode step's 8 (token, slot) pairs give 9 tiles, not 129 (the GEMM
// grids launch one CTA column per possible tile; the ones past the count return at once).
inline int plan_max_tiles(int64_t rows, int K, int n_local, int tile_m) {
  const int64_t jobs = rows * K;
  return int((jobs + tile_m - 1) / tile_m + (jobs < n_local ? jobs : int64_t(n_local))) + 1;
}

// ep/combine.cc combine_slots: y[t] = sum_{k=0..K-1} w[t,k] * rows[t*K + k] in slot order, fp32,
// then y *= scale (scale != 1 only under an injected double-reduce fault).
// slot_pos (optional): the row of (t, k) is rows[slot_pos[t*K + k]] (answers as received).
// wait (optional): flags every block waits for first (answers written by peers over NVLink).
template <class TS>
void combine_slots(const TS* rows, const int32_t* slot_pos, const float* w, int64_t T, int H, int K, float scale,
                   float* y, cudaStream_t s, const FlagWait* wait = nullptr);

// Which rank owns a physical expert (Placement::owner on the device): rank d owns
// [begin[d], begin[d + 1]); ranks with an empty range share their begin with the next one and the
// last such rank wins, as upper_bound does.
constexpr int kMaxOwnerRanks = 16;
struct OwnerTable {
  int R = 1;
  int begin[kMaxOwnerRanks + 1] = {};
};
__host__ __device__ inline int owner_of(const OwnerTable& o, int phys) {
  int d = 0;
  while (d + 1 < o.R && o.begin[d + 1] <= phys) d++;
  return d;
}

// The injected bug classes of ep/fault.h on the GPU, applied where the home rank combines (the
// correct path never reaches this code: backends call it only when a fault is set).
struct FaultCombine {
  int kind = 0;                      // int(Fault)
  int me = 0;                        // the home rank
  OwnerTable owner;
  const int32_t* phys = nullptr;     // [T, K] of the tokens being combined
  const int32_t* replicas = nullptr; // [P] replicas of each physical expert's logical expert
  float scale = 1.0f;                // the output scale (double-reduce: the group size)
};

// The owner table of a placement (at most kMaxOwnerRanks ranks).
OwnerTable owner_table(const Placement& p);
// The fault a backend injects, ready for the device: the replica counts are uploaded into
// `replicas` (kept by the backend). Fault::None gives a FaultCombine nobody reads.
FaultCombine make_fault_combine(Fault f, const Placement& p, int me, DeviceArray<int32_t>& replicas);

// combine_slots under an injected fault: skip-reduce drops the rows of slots served by another
// rank; wrong-combine-ids moves them one token on (within the T tokens); replica-per-rank weighs
// every slot by its expert's replica count; double-reduce scales the result. Same row lookup
// (slot_pos or t*K + k) as combine_slots.
template <class TS>
void combine_slots_faulty(const TS* rows, const int32_t* slot_pos, const float* w, int64_t T, int H, int K,
                          const FaultCombine& f, float* y, cudaStream_t s);

// The fast combine's two halves (CombineMode::Fast). Serving side: for each of n records (a row
// of the activation type, K physical ids at byte phys_off and K fp32 weights at byte w_off of the
// record, rec_bytes apart), sum_k w_k * out[row_base[i] + j] over its served slots in slot order,
// in fp32, into partial[i] (H floats). n_dev (optional): the actual count on the device.
template <class TS>
void reduce_partials(const unsigned char* records, int64_t rec_bytes, int64_t phys_off, int64_t w_off, int64_t n,
                     const int32_t* n_dev, const int32_t* row_base, const TS* out, int H, int K, float* partial,
                     cudaStream_t s);
// Home side: y[t] = sum over ranks d in rank order of partials[pos[t*R + d]] (pos -1: rank d
// served none of t's slots), fp32; under a fault (f != nullptr), skip-reduce and
// wrong-combine-ids act on the partials of other ranks and the scale applies.
void combine_partials(const float* partials, const int32_t* pos, int64_t T, int R, int H, const FaultCombine* f,
                      float* y, cudaStream_t s);

}  // namespace epmoe::cuda
