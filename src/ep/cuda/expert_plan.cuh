// The plan of an ExpertJobs (ep/backend.h) over one rank's experts, on the GPU: what every GPU
// expert runner does first (the model's experts in moe/cuda/experts.cuh, the audit's probe experts
// in check/cuda/probe.cu, the EP benchmark's plan-only runner).
#pragma once

#include <algorithm>

#include "ep/backend.h"
#include "ep/cuda/plan_combine.cuh"
#include "kernels/cuda/gemm.cuh"

namespace epmoe::cuda {

// The plan of an ExpertJobs over this rank's experts [p0, p0 + n_local): the served jobs grouped
// by local expert (offsets, source rows a_rows, output rows c_rows) and, for the bf16 GEMM, the
// list of m-tiles. One object per runner; its arrays only grow.
struct ExpertPlanGpu {
  DeviceArray<int32_t> offsets, a_rows, c_rows, tiles, num_tiles;
  DeviceArray<int32_t> workspace;  // the multi-block plan's scratch, this plan's own
  int hint = 0;       // expected rows per expert (picks the GEMM's tile shape)
  int max_tiles = 0;  // bound on the tile count (with_tiles)
  bool with_tiles = false;

  // Plans j on the process's stream. False when no GEMM is to run: no rows (row_base, when asked
  // for, is then zeroed) or no local expert.
  bool make(const ExpertJobs& j, int p0, int n_local, bool tiled) {
    if (j.rows == 0) {
      if (j.row_base) EPMOE_CUDA_CHECK(cudaMemsetAsync(j.row_base, 0, sizeof(int32_t), stream()));
      return false;
    }
    const int64_t cap = j.rows * j.K;
    with_tiles = tiled;
    hint = std::max<int>(1, ceil_div(cap, std::max(n_local, 1)));
    const int tile_m = tiled ? gemm_tile_m(hint) : 0;
    max_tiles = tiled ? plan_max_tiles(j.rows, j.K, n_local, tile_m) : 0;
    if (tiled) {
      tiles.reserve(2 * size_t(max_tiles));
      num_tiles.reserve(1);
    }
    offsets.reserve(size_t(n_local) + 1);
    a_rows.reserve(size_t(cap));
    c_rows.reserve(size_t(cap));
    PlanArgs pa;
    pa.phys = j.phys;
    pa.phys_stride = j.phys_stride;
    pa.rows = j.rows;
    pa.rows_dev = j.rows_dev;
    pa.K = j.K;
    pa.p0 = p0;
    pa.n_local = n_local;
    pa.compact = j.compact;
    pa.one_per_row = j.one_per_row;
    pa.offsets = offsets.data();
    pa.a_rows = a_rows.data();
    pa.c_rows = c_rows.data();
    pa.row_base = j.row_base;
    pa.workspace = &workspace;
    if (tiled) {
      pa.tile_m = tile_m;
      pa.tiles = tiles.data();
      pa.num_tiles = num_tiles.data();
    }
    plan(pa, stream());
    return n_local > 0;
  }
  // The grouped-GEMM fields that come from the plan: groups, row hint, tile list.
  void apply(GemmArgs& g, int n_local) const {
    g.offsets = offsets.data();
    g.G = n_local;
    g.rows_hint = hint;
    if (with_tiles) g.tiles = tiles.data(), g.num_tiles = num_tiles.data(), g.max_tiles = max_tiles;
  }
};

}  // namespace epmoe::cuda
