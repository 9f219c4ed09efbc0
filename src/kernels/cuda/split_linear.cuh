// Near-fp32 products (16-bit significands) on bf16 tensor cores, for the --compute bf16
// projections whose rounding moves the log-probabilities most (attention, dense and shared MLPs,
// lm_head; measured on the CPU: rounding the activations of those alone costs 0.026 of the 0.035
// max |logit diff| of the bf16 fixture, the routed experts 0.009).
//
// A value v is split into hi = bf16(v) and lo = bf16(v - hi) (16 significant bits of v's 24);
// then x . w is, to about 2^-16 relative per product (measured: 1.4e-6..2.2e-5 of the largest
// output on random K = 64..2048, tests/cuda/gpu_test.cu),
//   P = 2 (w exactly bf16, e.g. a bf16 checkpoint):  xh.w + xl.w      A' = [xh | xl],      B' = [w | w]
//   P = 3 (fp32 weights):                           xh.wh + xh.wl + xl.wh
//                                                    A' = [xh | xh | xl], B' = [wh | wl | wh]
// one GEMM over K' = P K with fp32 accumulation in ascending k (no split-K), so the result is
// batch-invariant like every other GEMM here. The cost: P times the MMAs of a plain bf16 GEMM;
// the weight bytes of P planes, except for P = 2 with K a multiple of 64: then A' is laid out
// [xh | xl] per 64 columns and the GEMM uses each stored 64-wide weight tile for two k-tiles in a
// row (GemmArgs::b_k_twice), so the bytes from DRAM are those of the bf16 weights.
#pragma once

#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"
#include "kernels/cuda/x_fragments.cuh"

namespace epmoe::cuda {

struct SplitWeight {
  int N = 0, K = 0, P = 0;
  bool periodic = false;  // P = 2 with K a multiple of 64: w holds [N, K] once (gemm's b_k_twice)
  DeviceArray<bf16> w;    // [N, P K], or [N, K] when periodic
  bool empty() const { return N == 0; }
  // From fp32 values [N, K]: P = 2 when every value is exactly a bf16, else 3.
  void init(const std::vector<float>& wf, int N, int K);
  void init3(const std::vector<float>& wf, int N, int K);  // P = 3 whatever the values
  // The periodic form for values that are bf16 already (a BF16 checkpoint's rows, K a multiple of
  // 64): allocates [N, K] and returns it for the caller to fill (the staged upload); the bits
  // init() would store.
  bf16* alloc_periodic(int N, int K);
  // Pseudo-random bf16 weights (P = 2), uniform in [-scale, scale] (synthesized models).
  void init_random(int N, int K, uint64_t seed, float scale, cudaStream_t s);
  // A second copy of a periodic weight for decode steps (split_gemv): w's values in the order the
  // MMA fragments read them (per 8 rows and 64-wide k-block, 32 B per lane), and room for x's
  // split in the same order. ~the weight's bytes again; asynchronous on s.
  // The layout the configured version reads (split_gemv_config), or every_layout (tests and
  // benchmarks that compare versions on one weight).
  void pack_fragments(cudaStream_t s, bool every_layout = false);
  DeviceArray<uint32_t> frag;    // v3 / v4: [ceil(N / 8)][K / 64][2][32 lanes][4 words] (W as the B operand)
  DeviceArray<uint32_t> frag16;  // v5: [ceil(N / 16)][K / 64][4 k16 steps][32 lanes][4 words] (W as the A operand)
  mutable DeviceArray<uint32_t> xfrag;  // [2 row halves][K / 64][32 lanes][16 words]: x split (split_gemv)

 private:
  void fill(const std::vector<float>& wf, int N, int K, int P);
};

// out [T, P K] = the split of x [T, K] (fp32, rows lda apart) for P planes; interleave64 (P = 2,
// K a multiple of 64): hi and lo alternate in blocks of 64 columns.
void split_rows(const float* x, int64_t lda, int64_t T, int K, int P, DeviceArray<bf16>& out, cudaStream_t s,
                bool interleave64 = false);

// y [T, N] (fp32; ldc N) = x [T, K] (fp32, rows lda apart) W^T (+ bias with Store; or the SwiGLU
// epilogue on gate/up rows interleaved in W: y [T, N/2]); accumulate (Store): y += that instead.
// xs: scratch for the split rows.
void split_linear(const SplitWeight& W, const float* x, int64_t lda, int64_t T, DeviceArray<bf16>& xs, float* y,
                  const float* bias, Epilogue ep, cudaStream_t s, bool accumulate = false, bool x_split_given = false);

// Per-head products (latent attention's W_UK^T and W_UV): G groups of M rows, group g's weights
// rows [g N/G, (g+1) N/G) of W; x [G M, K] group-major (row g M + r, rows lda apart), output row
// g M + r to y row c_rows[g M + r] (ldc floats apart; c_rows nullptr: row g M + r).
void split_linear_grouped(const SplitWeight& W, int G, const float* x, int64_t lda, int64_t M, DeviceArray<bf16>& xs,
                          float* y, int64_t ldc, const int32_t* c_rows, cudaStream_t s);

// A decode step's few rows (T <= kSplitGemvMaxRows) through a periodic weight with fragments
// packed (pack_fragments): split_linear's bits from one small kernel (split_gemv.cu: one warp per
// 16 output columns streams their packed weight blocks through shared memory; x comes split into
// fragment order by its producer or a small kernel). split_linear takes it whenever
// split_gemv_fits; EPMOE_SPLIT_GEMV=0 turns it off (for measuring the tile kernel in the model).
constexpr int kSplitGemvMaxRows = 16;
struct SplitGemvConfig {
  bool enabled = true;
  int depth = 8;  // v3: 64-wide weight blocks each warp keeps in flight in registers: 4, 8 or 16
  int warps = 4;  // warps per CTA: 1, 2 or 4 (v4 / v5: with ring > 0 only)
  // v4's / v5's / v6's shared-memory ring, in 64-wide weight blocks per warp: -1 chooses per weight
  // (v4: 32, or 16 for K < 2048; v5: 8, or 16 for K >= 4096; v6: 8; one warp per CTA), 8 / 16 / 32
  // (with `warps`).
  int ring = -1;
  // 6 (default, run 29): v5's layout and MMAs, the ring filled by lane 0's bulk copies of `chunk`
  // blocks (4 or 8) at a time, one mbarrier wait per chunk; 5: W as the MMA's A operand, 16
  // columns per warp, through a ring every lane fills with cp.async; 4: x as A, 8 columns per
  // warp, through the ring; 3: as 4 with the weights prefetched into registers.
  // EPMOE_SPLIT_GEMV=v3 / v4 / v5 chooses at start-up (pack_fragments packs the chosen layout).
  int version = 6;
  int chunk = 4;
  // v6 (issue 33, run 36): the ring of a weight with K >= 4096 (the o projection) when ring is -1
  // (8, 16 or 32; -1: 16 from two rows, 8 for one), and, for measuring, how many of a warp's first
  // ring chunks are asked for before the PDL wait (-1: all of them; the rest right after it).
  int ring_wide = -1;
  int early = -1;
};
void set_split_gemv_config(SplitGemvConfig c);  // benchmarks and tests: every choice has the same bits
SplitGemvConfig split_gemv_config();
bool split_gemv_enabled();  // not turned off by EPMOE_SPLIT_GEMV=0 (then nothing need be packed)
bool split_gemv_fits(const SplitWeight& W, int64_t T);
void split_gemv(const SplitWeight& W, const float* x, int64_t lda, int64_t T, float* y, const float* bias,
                Epilogue ep, cudaStream_t s, bool accumulate = false, bool x_split_given = false);
// Where the kernel that computes split_gemv's x may write it already split (x_fragments.cuh), for
// a call of T rows through W: W's fragment buffer and its 8 or 16 rows; {} where split_gemv does
// not take the call (split_gemv_fits). A split_linear / split_gemv call with x_split_given then
// skips the x-split kernel: x is not read (pass nullptr).
XFragments split_gemv_x_fragments(const SplitWeight& W, int64_t T);

}  // namespace epmoe::cuda
