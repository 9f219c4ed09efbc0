// The two halves of every GPU backend around the experts, twins of ep/combine.cc: the plan that
// groups a set of (row, slot) jobs by local expert (what the expert GEMMs read), and the
// deterministic slot-order combine (what makes every backend's output the same bits).
#pragma once

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
};
void plan(const PlanArgs& a, cudaStream_t s);
// Whether plan() runs as one block (else three launches over the chip, through a workspace shared
// by the process): up to 2048 jobs, beyond which one block's shared-memory counters serialise (at
// 8192 jobs over 128 experts it took 22 us, the three launches ~10); always for a row count known
// only on the device.
inline bool plan_in_one_block(int64_t rows, int K, bool rows_on_device) {
  return rows * K <= 2048 || rows_on_device;
}
inline int plan_max_tiles(int64_t rows, int K, int n_local, int tile_m) {
  return int(rows * K / tile_m) + n_local + 1;
}

// ep/combine.cc combine_slots: y[t] = sum_{k=0..K-1} w[t,k] * rows[t*K + k] in slot order, fp32,
// then y *= scale (scale != 1 only under an injected double-reduce fault).
// slot_pos (optional): the row of (t, k) is rows[slot_pos[t*K + k]] (answers as received).
template <class TS>
void combine_slots(const TS* rows, const int32_t* slot_pos, const float* w, int64_t T, int H, int K, float scale,
                   float* y, cudaStream_t s);

}  // namespace epmoe::cuda
