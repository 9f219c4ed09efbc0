// The expert side of the GPU MoE layer: the weights of this rank's physical experts and the
// runner a backend calls (plan -> fused gate+up GEMM with SwiGLU -> down GEMM scattered to the
// output rows).
#pragma once

#include "cuda/common.cuh"
#include "cuda/ep.h"
#include "cuda/gemm.cuh"
#include "cuda/kernels.cuh"
#include "cuda/split_linear.cuh"

namespace epmoe::cuda {

// The process's stream (created by init_device; the legacy default stream before that).
cudaStream_t stream();

// The router of a MoE layer: logits [T, E] in fp32 from the normalised rows (fp32).
// bf16 mode: the split-bf16 tensor-core GEMM of kernels.cuh (fp32-grade logits, batch-invariant);
// f32 mode: the fp32 SIMT GEMM.
struct RouterGpu {
  int E = 0, H = 0, S = 1;
  bool split = true;
  DeviceArray<float> w32;  // [E, H] (f32 mode)
  DeviceArray<bf16> w3;    // [E, 3H] = [wh | wl | wh] (bf16 mode)
  DeviceArray<bf16> a3;    // [S][T][3H / S]
  DeviceArray<float> part; // [S][T][E]

  void init(const std::vector<float>& w, int E_, int H_, bool split_) {
    E = E_, H = H_, split = split_, S = router_chunks(H_);
    if (split) w3.upload(router_split_weights(w, E, H));
    else w32.upload(w);
  }
  // Logits for route(): either one [T, E] array (parts = 1) or S split-K partials [S][T, E] that
  // route() sums in order.
  struct Logits {
    const float* ptr;
    int parts;
    int64_t stride;
  };
  Logits run(const float* x, int64_t T, cudaStream_t s) {
    GemmArgs g;
    g.N = E;
    if (!split) {
      full.reserve(size_t(std::max<int64_t>(T, 1)) * size_t(E));
      g.A = x, g.lda = H, g.B = w32.data(), g.ldb = H, g.M = int(T), g.K = H, g.C = full.data(), g.ldc = E;
      if (T > 0) gemm<float, float>(g, Epilogue::Store, s);
      return {full.data(), 1, 0};
    }
    const int Kc = 3 * H / S;
    a3.reserve(size_t(std::max<int64_t>(T, 1)) * 3 * size_t(H));
    part.reserve(size_t(S) * size_t(std::max<int64_t>(T, 1)) * size_t(E));
    if (T > 0) {
      router_split(x, T, H, S, a3.data(), s);
      g.C = part.data();
      g.A = a3.data(), g.lda = Kc, g.B = w3.data(), g.ldb = 3 * H, g.b_group_stride = Kc;
      g.G = S, g.M = int(T), g.K = Kc, g.ldc = E;
      gemm<bf16, float>(g, Epilogue::Store, s);
    }
    return {part.data(), S, int64_t(T) * E};
  }
  DeviceArray<float> full;  // [T, E] (f32 mode)
};

// The plan of a GpuExpertJobs over this rank's experts [p0, p0 + n_local): the served jobs grouped
// by local expert (offsets, source rows a_rows, output rows c_rows) and, for the bf16 GEMM, the
// list of m-tiles. One object per runner; its arrays only grow.
struct ExpertPlanGpu {
  DeviceArray<int32_t> offsets, a_rows, c_rows, tiles, num_tiles;
  int hint = 0;       // expected rows per expert (picks the GEMM's tile shape)
  int max_tiles = 0;  // bound on the tile count (with_tiles)
  bool with_tiles = false;

  // Plans j on the process's stream. False when no GEMM is to run: no rows (row_base, when asked
  // for, is then zeroed) or no local expert.
  bool make(const GpuExpertJobs& j, int p0, int n_local, bool tiled) {
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

template <class T>
struct ExpertWeightsGpu {
  int H = 0, I = 0;
  int p0 = 0, n_local = 0;  // physical experts [p0, p0 + n_local) of this rank
  DeviceArray<T> w1;        // [n_local][2I][H], gate row j at 2j, up row j at 2j + 1
  DeviceArray<T> w2;        // [n_local][H][I]
};

template <class T>
class ExpertRunnerGpu : public GpuExpertRunner {
 public:
  explicit ExpertRunnerGpu(const ExpertWeightsGpu<T>& w) : w_(w) {}
  void run(const GpuExpertJobs& j, void* out) override {
    // bf16: one CTA per (m-tile, N-tile), from a tile list the plan writes.
    if (!plan_.make(j, w_.p0, w_.n_local, std::is_same_v<T, bf16>)) return;
    h_.reserve(size_t(j.rows * j.K) * size_t(w_.I));
    GemmArgs g1;
    plan_.apply(g1, w_.n_local);
    g1.A = j.x;
    g1.lda = j.x_stride;
    g1.a_rows = plan_.a_rows.data();
    g1.B = w_.w1.data();
    g1.ldb = w_.H;
    g1.b_group_stride = int64_t(2) * w_.I * w_.H;
    g1.N = 2 * w_.I;
    g1.K = w_.H;
    g1.C = h_.data();
    g1.ldc = w_.I;
    gemm<T, T>(g1, Epilogue::SwiGLU, stream());
    GemmArgs g2;
    plan_.apply(g2, w_.n_local);
    g2.A = h_.data();
    g2.lda = w_.I;
    g2.B = w_.w2.data();
    g2.ldb = w_.I;
    g2.b_group_stride = int64_t(w_.H) * w_.I;
    g2.N = w_.H;
    g2.K = w_.I;
    g2.C = out;
    g2.ldc = w_.H;
    g2.c_rows = plan_.c_rows.data();
    gemm<T, T>(g2, Epilogue::Store, stream());
  }
  // For tests and benchmarks: the per-expert offsets of the last plan.
  const int32_t* offsets() const { return plan_.offsets.data(); }

 private:
  const ExpertWeightsGpu<T>& w_;
  ExpertPlanGpu plan_;
  DeviceArray<T> h_;
};

// The routed experts of a checkpoint stored in fp32 under --compute bf16: rounding their weights
// to bf16 makes another model (measured on the CPU: expert weights alone rounded move a
// log-probability by 0.37 on mixtral-tiny, where an expert choice flips at a near-tie), so they
// keep fp32 accuracy on the tensor cores as split_linear does (P = 3): rows arrive in fp32, are
// split into [xh | xh | xl], the fused gate+up GEMM runs over K' = 3H against [wh | wl | wh], h
// stays fp32 and is split again for the down GEMM over 3I. Outputs are fp32 rows.
class SplitExpertRunner final : public GpuExpertRunner {
 public:
  int H = 0, I = 0, p0 = 0, n_local = 0;
  DeviceArray<bf16> w1;  // [n_local][2I][3H] (gate row j at 2j, up row j at 2j + 1)
  DeviceArray<bf16> w2;  // [n_local][H][3I]

  // Expert q's gate/up rows interleaved [2I, H] and down [H, I], fp32.
  void upload(int q, const std::vector<float>& gate_up, const std::vector<float>& down) {
    SplitWeight a, b;
    a.init3(gate_up, 2 * I, H);
    b.init3(down, H, I);
    const size_t n1 = size_t(2 * I) * 3 * size_t(H), n2 = size_t(H) * 3 * size_t(I);
    EPMOE_CUDA_CHECK(cudaMemcpy(w1.data() + size_t(q) * n1, a.w.data(), n1 * sizeof(bf16), cudaMemcpyDeviceToDevice));
    EPMOE_CUDA_CHECK(cudaMemcpy(w2.data() + size_t(q) * n2, b.w.data(), n2 * sizeof(bf16), cudaMemcpyDeviceToDevice));
  }
  void reserve() {
    w1.reserve(size_t(n_local) * size_t(2 * I) * 3 * size_t(H));
    w2.reserve(size_t(n_local) * size_t(H) * 3 * size_t(I));
  }

  void run(const GpuExpertJobs& j, void* out) override {
    if (!plan_.make(j, p0, n_local, /*tiled=*/true)) return;
    const int64_t cap = j.rows * j.K;
    h_.reserve(size_t(cap) * size_t(I));
    // Every source row is split (rows beyond a round's device count are never read by the GEMM).
    split_rows(static_cast<const float*>(j.x), j.x_stride, j.rows, H, 3, xs_, stream());
    GemmArgs g1;
    plan_.apply(g1, n_local);
    g1.A = xs_.data();
    g1.lda = 3 * H;
    g1.a_rows = plan_.a_rows.data();
    g1.B = w1.data();
    g1.ldb = 3 * H;
    g1.b_group_stride = int64_t(2) * I * 3 * H;
    g1.N = 2 * I;
    g1.K = 3 * H;
    g1.C = h_.data();
    g1.ldc = I;
    gemm<bf16, float>(g1, Epilogue::SwiGLU, stream());
    // h rows are in job order (row r of the plan), so they split as they are.
    split_rows(h_.data(), I, cap, I, 3, hs_, stream());
    GemmArgs g2;
    plan_.apply(g2, n_local);
    g2.A = hs_.data();
    g2.lda = 3 * I;
    g2.B = w2.data();
    g2.ldb = 3 * I;
    g2.b_group_stride = int64_t(H) * 3 * I;
    g2.N = H;
    g2.K = 3 * I;
    g2.C = out;
    g2.ldc = H;
    g2.c_rows = plan_.c_rows.data();
    gemm<bf16, float>(g2, Epilogue::Store, stream());
  }

 private:
  ExpertPlanGpu plan_;
  DeviceArray<float> h_;
  DeviceArray<bf16> xs_, hs_;
};

}  // namespace epmoe::cuda
