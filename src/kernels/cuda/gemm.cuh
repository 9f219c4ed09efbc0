// Grouped GEMM for the MoE experts and every dense projection: C = A * B^T, per group g
//
//   rows [offsets[g], offsets[g+1]) of the (sorted) row space, weights B_g [N, K] (K contiguous),
//   A row of sorted row r:  A[a_rows ? a_rows[r] : r]          (the gather of the dispatch, fused)
//   C row of sorted row r:  C[c_rows ? c_rows[r] : r]          (the scatter to slot rows, fused)
//
// Epilogues: Store (optional fp32 bias) or SwiGLU, where B holds the gate and up rows interleaved
// (row 2j = gate_j, row 2j+1 = up_j) and C[r, j] = silu(gate_j . a) * (up_j . a): the fused
// gate+up projection with the activation in registers. A dense GEMM is one group (offsets null).
//
// Two implementations with the same contract:
//   bf16: tensor cores (mma.sync m16n8k16, fp32 accumulation), cp.async multi-stage pipeline,
//         swizzled shared memory; needs K, lda, ldb multiples of 8 (16-byte rows). Two kernels:
//         wgmma (Hopper) for many rows per group, the mma.sync tile kernel otherwise.
//   f32:  SIMT fp32 FMA (the --compute f32 path and the router).
// Both are batch-invariant: an output element is the sum over k in ascending order, in a chain
// that depends on nothing but K -- never on M, the tile shape or the group sizes (no split-K).
#pragma once

#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

enum class Epilogue { Store, SwiGLU };

// Which bf16 kernel (all give the same bits): Auto picks by rows per group; the tests and the
// benchmarks force the mma.sync tile kernel (Tiled), that kernel with 32-column tiles where it
// would take 64-column ones (TiledNarrow: twice the CTAs, each streaming half the weight rows), or
// the wgmma kernel (Wgmma; no tile lists).
enum class GemmPath { Auto, Tiled, TiledNarrow, Wgmma };

struct GemmArgs {
  const void* A = nullptr;
  int64_t lda = 0;
  const int32_t* a_rows = nullptr;
  const void* B = nullptr;
  int64_t ldb = 0;
  int64_t b_group_stride = 0;  // elements from one group's weights to the next
  const int32_t* offsets = nullptr;  // [G + 1] on the device, or nullptr: G groups of M rows each
  int G = 1;
  int M = 0;           // rows of the single group (offsets == nullptr)
  int rows_hint = 0;   // expected rows per group (grouped): picks the tile shape and the grid
  int N = 0, K = 0;
  void* C = nullptr;
  int64_t ldc = 0;
  const int32_t* c_rows = nullptr;
  const float* bias = nullptr;  // [N], Store only
  // bf16 only: every 64-wide k-tile of B serves two consecutive k-tiles of A (A has 2K columns,
  // B stores K). split_linear lays its A' out as [xh | xl] per 64 columns, so both products of a
  // weight tile run back to back: the tile is read from DRAM once and from L2 the second time.
  bool b_k_twice = false;
  // The tile list and group offsets were complete before the kernel that writes A started (that
  // kernel is a GEMM which waited for the plan): the first weight tiles are then requested before
  // waiting for A (programmatic dependent launch, common.cuh). The down projection after gate+up.
  bool plan_precedes_a = false;
  // Grouped GEMMs: the m-tiles to run, (group, first row) pairs that plan() wrote for the tile
  // height gemm_tile_m(rows_hint) -- one CTA per tile and N-tile, none looping over m, so a group
  // with twice the rows gets twice the CTAs instead of twice the time. num_tiles on the device;
  // max_tiles bounds it on the host. nullptr: every group loops over its m-tiles.
  const int32_t* tiles = nullptr;
  const int32_t* num_tiles = nullptr;
  int max_tiles = 0;
  GemmPath path = GemmPath::Auto;
  // Grouped by job instead of by expert (a decode step's few (token, slot) jobs, with no plan):
  // G groups of M = 1 row (offsets, tiles and a_rows null), group g is job g, its A row g /
  // job_a_div (gate+up: K, the token; down: 1, h's row g), its C row g (or c_rows[g]), its weights
  // those of group job_expert[g] - job_expert_base; a job whose expert is outside [0,
  // job_experts) is not this rank's and writes nothing. The ids are read after the PDL wait unless
  // plan_precedes_a (the GEMM before waited for the kernel that wrote them). mma.sync tile kernel
  // only; a row's bits are the grouped path's (the same kernel, one row a tile either way).
  const int32_t* job_expert = nullptr;
  int job_expert_base = 0, job_experts = 0, job_a_div = 1;
  // Jobs mode, Store epilogue, no c_rows: after its stores, the weighted sum of every R =
  // row_sum_rows consecutive C rows into one fp32 row of row_sum_out (ld row_sum_ld):
  // out[s, n] = sum over r ascending of row_sum_w[s R + r] * C[s R + r, n], each step
  // slot_sum_step (common.cuh) -- the slot-order combine of a backend, folded into the down GEMM.
  // The last CTA of each (s, N-tile) to finish adds it, found by a counter each (row_sum_counters:
  // [G / R][N-tiles of 32 columns], zero before the launch; the last CTA sets it back to zero).
  int row_sum_rows = 0;
  const float* row_sum_w = nullptr;
  float* row_sum_out = nullptr;
  int64_t row_sum_ld = 0;
  int32_t* row_sum_counters = nullptr;
  // Store epilogue, fp32 C: C += the result (+ bias) -- the residual add after a projection, with
  // add_inplace's arithmetic (x + y rounded once).
  bool accumulate = false;
};

// The m-tile height the bf16 GEMM uses for rows_hint rows per group (plan() lays tiles out for it).
int gemm_tile_m(int rows_hint);

// TA: element type of A and B (bf16 or float); TC: of C (bf16 or float).
template <class TA, class TC>
void gemm(const GemmArgs& a, Epilogue ep, cudaStream_t stream);

}  // namespace epmoe::cuda
