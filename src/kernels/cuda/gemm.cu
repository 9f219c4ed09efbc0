#include "kernels/cuda/gemm.cuh"
#include "util/env.h"

#include <algorithm>
#include <cstdlib>
#include <string>

#include "kernels/cuda/gemm_wgmma.cuh"
#include "kernels/cuda/mma_ptx.cuh"

namespace epmoe::cuda {

namespace {

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::group_range;
using ptx::ldmatrix_x4;
using ptx::mma_bf16;
using ptx::smem_u32;
using ptx::store_pair;
using ptx::swz;


// ---------------------------------------------------------------------------------------------
// bf16 tensor-core kernel (sm_80+ mma.sync; runs on sm_90a).
//
// Tile BM x BN x 64, WM x WN warps, each warp a (BM/WM) x (BN/WN) tile of m16n8k16 MMAs. Shared
// memory rows are 64 bf16 = 128 bytes = 8 chunks of 16 bytes; chunk c of row r is stored at
// chunk c ^ (r & 7), so the 8 rows an ldmatrix phase reads hit 8 different bank groups.



template <int BM_, int BN_, int WM_, int WN_, int STAGES_, int MIN_CTAS_ = 1>
struct TcCfg {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, STAGES = STAGES_, BK = 64;
  static constexpr int MIN_CTAS = MIN_CTAS_;  // CTAs per SM the register budget must allow
  static constexpr int NT = WM * WN * 32;
  static constexpr int TM = BM / WM, TN = BN / WN;
  static constexpr int MI = TM / 16, NI = TN / 8;
  static constexpr int A_CH = BM * 8 / NT, B_CH = BN * 8 / NT;  // 16-byte chunks per thread per stage
  static constexpr int SMEM = STAGES * (BM + BN) * BK * 2;
  static_assert(TM % 16 == 0 && TN % 16 == 0, "warp tile");
  static_assert((BM * 8) % NT == 0 && (BN * 8) % NT == 0, "chunks per thread");
};

// GemmArgs::row_sum_out: this CTA's C tile (columns n0 .. n0 + BN of job `job`) is stored; the
// last CTA of the (s, N-tile) to arrive adds the R rows of s in ascending order. The classic
// last-block pattern: every thread's stores, a fence, then one counter; the last reader fences
// again and reads the others' rows from L2 (ld.global.cg: never a stale L1 line).
template <class TC>
__device__ void row_sum_tile(const GemmArgs& p, int job, int n0, int BN) {
  __shared__ int last;
  const int R = p.row_sum_rows, s = job / R;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) {
    int32_t* count = p.row_sum_counters + int64_t(s) * gridDim.x + blockIdx.x;
    last = atomicAdd(count, 1) == R - 1;
    if (last) *count = 0;  // every CTA of this (s, N-tile) has arrived: the next launch starts at zero
  }
  __syncthreads();
  if (!last) return;
  __threadfence();
  const TC* C = static_cast<const TC*>(p.C) + int64_t(s) * R * p.ldc;
  const float* w = p.row_sum_w + int64_t(s) * R;
  for (int c = threadIdx.x; c < BN && n0 + c < p.N; c += blockDim.x) {
    const int n = n0 + c;
    float acc = 0.f;
    // Eight rows' loads go out before their adds: an add waits for its load, and a load issued
    // after it would wait with it.
    for (int r0 = 0; r0 < R; r0 += 8) {
      float wv[8], cv[8];
#pragma unroll
      for (int q = 0; q < 8; q++)
        if (r0 + q < R) wv[q] = w[r0 + q], cv[q] = to_f32(__ldcg(C + int64_t(r0 + q) * p.ldc + n));
#pragma unroll
      for (int q = 0; q < 8; q++)
        if (r0 + q < R) acc = slot_sum_step(acc, wv[q], cv[q]);
    }
    p.row_sum_out[int64_t(s) * p.row_sum_ld + n] = acc;
  }
}

template <class Cfg, class TC, bool SWIGLU>
__global__ void __launch_bounds__(Cfg::NT, Cfg::MIN_CTAS) tc_gemm_kernel(const GemmArgs p) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, NT = Cfg::NT, STAGES = Cfg::STAGES;
  constexpr int TM = Cfg::TM, TN = Cfg::TN, MI = Cfg::MI, NI = Cfg::NI, A_CH = Cfg::A_CH, B_CH = Cfg::B_CH;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  bf16* sA = reinterpret_cast<bf16*>(smem_raw);
  bf16* sB = sA + STAGES * BM * BK;

  // PDL (common.cuh): the first B stages are requested before waiting for the kernel that writes
  // A whenever the weights are known without it: always for a dense GEMM, and for a grouped one
  // whose plan was complete before that kernel started (plan_precedes_a). Otherwise the plan may
  // still be running, so wait first -- and only then let the next kernel start, which is what
  // makes plan_precedes_a true for a GEMM that follows this one.
  const bool early_b = (!p.offsets && !p.tiles && !p.job_expert) || p.plan_precedes_a;
  if (!early_b) pdl_wait();
  pdl_trigger();
  ptx::CtaTiles ct;
  if (!ptx::cta_tiles(p, BM, ct)) {
    if (early_b) pdl_wait();
    return;
  }
  const int row_begin = ct.row_begin, rows = ct.rows, group = ct.group;
  const int m_first = ct.m_first, m_end = ct.m_end, m_step = ct.m_step;
  const int n0 = blockIdx.x * BN;
  const int K = p.K, KT = (K + BK - 1) / BK;
  const bf16* A = static_cast<const bf16*>(p.A);
  // A job's weights are its expert's (GemmArgs::job_expert); a job served elsewhere writes nothing.
  const int b_group = p.job_expert ? p.job_expert[group] - p.job_expert_base : group;
  if (p.job_expert && (b_group < 0 || b_group >= p.job_experts)) {
    if (early_b) pdl_wait();
    // (Its rows are another rank's: it stores none, but its row sum still counts on its arrival.)
    if constexpr (!SWIGLU)
      if (p.row_sum_out) row_sum_tile<TC>(p, group, blockIdx.x * BN, BN);
    return;
  }
  const bf16* B = static_cast<const bf16*>(p.B) + int64_t(b_group) * p.b_group_stride;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / Cfg::WN, wn = warp % Cfg::WN;

  // The B rows this thread copies are fixed for the whole CTA.
  const bf16* b_src[B_CH];
  int b_off[B_CH], b_col[B_CH];
  bool b_ok[B_CH];
#pragma unroll
  for (int i = 0; i < B_CH; i++) {
    const int idx = tid + i * NT, r = idx >> 3, c = idx & 7;
    b_ok[i] = n0 + r < p.N;
    b_src[i] = B + int64_t(b_ok[i] ? n0 + r : 0) * p.ldb + c * 8;
    b_off[i] = swz(r, c);
    b_col[i] = c * 8;
  }
  auto load_b = [&](int stage, int kt) {
    const int k0 = kt * BK;
    const int kb = p.b_k_twice ? (kt >> 1) * BK : k0;
    bf16* db = sB + stage * BN * BK;
#pragma unroll
    for (int i = 0; i < B_CH; i++) {
      const bool ok = b_ok[i] && k0 + b_col[i] < K;
      cp_async16(db + b_off[i], ok ? b_src[i] + kb : B, ok ? 16 : 0);
    }
  };
  // B of the first STAGES - 1 k-tiles in flight before the wait, one commit group each; the A
  // halves of those stages follow as their own groups, so at k-tile kt the pipeline's
  // wait_group<STAGES - 2> still covers both halves of stage kt (groups 0..STAGES-1+kt done).
  bool b_in_flight = false;
  if (early_b) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
      if (s < KT) load_b(s, s);
      cp_async_commit();
    }
    b_in_flight = true;
    pdl_wait();
  }

  for (int mt = m_first; mt < m_end && mt * BM < rows; mt += m_step) {
    const int m0 = mt * BM;
    const bf16* a_src[A_CH];
    int a_off[A_CH], a_col[A_CH];
    bool a_ok[A_CH];
#pragma unroll
    for (int i = 0; i < A_CH; i++) {
      const int idx = tid + i * NT, r = idx >> 3, c = idx & 7;
      a_ok[i] = m0 + r < rows;
      int src = row_begin + m0 + r;
      if (a_ok[i] && p.a_rows) src = p.a_rows[src];
      else if (p.job_expert) src /= p.job_a_div;
      a_src[i] = A + int64_t(a_ok[i] ? src : 0) * p.lda + c * 8;
      a_off[i] = swz(r, c);
      a_col[i] = c * 8;
    }
    auto load_a = [&](int stage, int kt) {
      const int k0 = kt * BK;
      bf16* da = sA + stage * BM * BK;
#pragma unroll
      for (int i = 0; i < A_CH; i++) {
        const bool ok = a_ok[i] && k0 + a_col[i] < K;
        cp_async16(da + a_off[i], ok ? a_src[i] + k0 : A, ok ? 16 : 0);
      }
    };
    auto load_stage = [&](int stage, int kt) {
      load_a(stage, kt);
      load_b(stage, kt);
    };

    float acc[MI][NI][4];
    ptx::zero_tile(acc);
    // (With the first B stages in flight already, the prologue requests their A halves only.)
    ptx::cp_async_mainloop<STAGES>(
        KT, [&](int s) { b_in_flight ? load_a(s, s) : load_stage(s, s); }, load_stage,
        [&](int stage, int) {
          ptx::warp_tile_mmas<MI, NI, BK / 16>(
              acc, reinterpret_cast<const unsigned char*>(sA + stage * BM * BK),
              reinterpret_cast<const unsigned char*>(sB + stage * BN * BK), wm * TM, wn * TN, lane, ptx::swz_bytes,
              ptx::mma_bf16);
        });
    b_in_flight = false;
    cp_async_wait<0>();
    __syncthreads();  // the next m-tile's copies overwrite these stages

    ptx::store_warp_tile<TC, SWIGLU>(p, acc, row_begin, rows, m0, wm * TM, n0 + wn * TN, lane);
  }
  if constexpr (!SWIGLU)
    if (p.row_sum_out) row_sum_tile<TC>(p, group, n0, BN);
}

// ---------------------------------------------------------------------------------------------
// fp32 SIMT kernel: 64 x 64 tile, 256 threads of 4 x 4 outputs, k in steps of 16. Columns of a
// thread are contiguous and start even, so (gate, up) pairs of the SwiGLU layout stay together.

template <class TA, class TC, bool SWIGLU>
__global__ void __launch_bounds__(256) simt_gemm_kernel(const GemmArgs p) {
  constexpr int BM = 64, BN = 64, BK = 16;
  __shared__ float As[BK][BM + 4];
  __shared__ float Bs[BK][BN + 4];
  int row_begin, rows;
  group_range(p, blockIdx.y, row_begin, rows);
  if (int(blockIdx.z) * BM >= rows) return;
  const int n0 = blockIdx.x * BN;
  const TA* A = static_cast<const TA*>(p.A);
  const TA* B = static_cast<const TA*>(p.B) + int64_t(blockIdx.y) * p.b_group_stride;
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const int K = p.K;

  for (int mt = blockIdx.z; mt * BM < rows; mt += gridDim.z) {
    const int m0 = mt * BM;
    const TA* a_src[4];
    const TA* b_src[4];
    bool a_ok[4], b_ok[4];
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int idx = tid + i * 256, r = idx >> 4;
      a_ok[i] = m0 + r < rows;
      int src = row_begin + m0 + r;
      if (a_ok[i] && p.a_rows) src = p.a_rows[src];
      a_src[i] = A + int64_t(a_ok[i] ? src : 0) * p.lda;
      b_ok[i] = n0 + r < p.N;
      b_src[i] = B + int64_t(b_ok[i] ? n0 + r : 0) * p.ldb;
    }
    float acc[4][4] = {};
    for (int k0 = 0; k0 < K; k0 += BK) {
#pragma unroll
      for (int i = 0; i < 4; i++) {
        const int idx = tid + i * 256, r = idx >> 4, kk = idx & 15;
        const bool kin = k0 + kk < K;
        As[kk][r] = a_ok[i] && kin ? to_f32(a_src[i][k0 + kk]) : 0.f;
        Bs[kk][r] = b_ok[i] && kin ? to_f32(b_src[i][k0 + kk]) : 0.f;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < BK; kk++) {
        float a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; i++) a[i] = As[kk][ty * 4 + i];
#pragma unroll
        for (int j = 0; j < 4; j++) b[j] = Bs[kk][tx * 4 + j];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
          for (int j = 0; j < 4; j++) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
      }
      __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int lr = ty * 4 + i;
      if (m0 + lr >= rows) continue;
      const int r = row_begin + m0 + lr;
      const int64_t orow = p.c_rows ? p.c_rows[r] : r;
#pragma unroll
      for (int j = 0; j < 4; j += 2) store_pair<TC, SWIGLU>(p, orow, n0 + tx * 4 + j, acc[i][j], acc[i][j + 1]);
    }
  }
}

// Small tiles stream weights for groups of a few rows (6 stages: ~40 KB in flight per CTA); groups
// of 12 rows and more go to the wgmma kernel (gemm_wgmma.cu), dense GEMMs from 17 rows.
using Tiny = TcCfg<16, 32, 1, 2, 8>;  // dense decode GEMMs with few N-tiles: twice the CTAs
using Small = TcCfg<16, 64, 1, 4, 6>;
// (Tried for a decode step's expert GEMMs: 10 stages, 9 of them requested ahead. One token of
// Qwen3-30B-A3B's layer: gate+up 18.8 against 19.3 us, down 16.3 against 12.1 -- two CTAs per SM
// instead of three, and a down GEMM whose early weight requests compete with gate+up's.)

template <class Cfg, class TC>
void launch_tc(const GemmArgs& a, Epilogue ep, cudaStream_t stream) {
  const int per_group = a.offsets ? std::max(a.rows_hint, 1) : a.M;
  dim3 grid(ceil_div(a.N, Cfg::BN), a.G, std::max(1, std::min(ceil_div(per_group, Cfg::BM), 65535)));
  if (a.tiles) {
    EPMOE_ASSERT(a.max_tiles <= 65535, "gemm: too many tiles");
    grid = dim3(ceil_div(a.N, Cfg::BN), std::max(1, a.max_tiles), 1);
  }
  // More than 48 KB of dynamic shared memory must be asked for once per kernel (and device).
  static const bool ready = [] {
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(tc_gemm_kernel<Cfg, TC, true>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM));
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(tc_gemm_kernel<Cfg, TC, false>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM));
    return true;
  }();
  (void)ready;
  if (ep == Epilogue::SwiGLU) launch_pdl(tc_gemm_kernel<Cfg, TC, true>, grid, dim3(Cfg::NT), Cfg::SMEM, stream, a);
  else launch_pdl(tc_gemm_kernel<Cfg, TC, false>, grid, dim3(Cfg::NT), Cfg::SMEM, stream, a);
}

// Dense GEMMs of at most 16 rows (a decode step's projections) on the wgmma kernel instead of the
// mma.sync tile kernel: EPMOE_DENSE_WGMMA=1 (for measuring; the bits are the same).
bool dense_decode_wgmma() {
  static const bool on = [] {
    return env_int("EPMOE_DENSE_WGMMA", 0) == 1;
  }();
  return on;
}

// Grouped GEMMs from a tile list at decode sizes (the routed experts of a decode step: a few rows
// per expert) on 32-column tiles instead of 64 (EPMOE_EXPERT_TILE=64: the wider ones). At one token
// the 8 experts' gate+up is 192 CTAs of 64 columns on 132 SMs, so some SMs stream twice the weights
// of others; 384 narrower CTAs spread more evenly (the same bits: the tile width does not enter the
// sums). Run 25, H100, 48 layers: 0.98x the step at 1 sequence, 0.99x at 8 and 64.
bool narrow_expert_tiles() {
  static const bool on = env_int("EPMOE_EXPERT_TILE", 32) == 32;
  return on;
}

void check_args(const GemmArgs& a, Epilogue ep) {
  EPMOE_ASSERT(a.N > 0 && a.K > 0 && a.G >= 1, "gemm: empty shape");
  EPMOE_ASSERT(!a.accumulate || ep == Epilogue::Store, "gemm: accumulate needs the Store epilogue");
  EPMOE_ASSERT(!a.row_sum_out || a.job_expert, "gemm: row sums only in jobs mode");
  if (ep == Epilogue::SwiGLU) EPMOE_ASSERT(a.N % 2 == 0 && !a.bias, "gemm: SwiGLU needs an even N and no bias");
}

}  // namespace

int gemm_tile_m(int rows_hint) {
  if (const int wg = wgmma_tile_m(rows_hint)) return wg;
  return Small::BM;
}

template <class TA, class TC>
void gemm(const GemmArgs& a, Epilogue ep, cudaStream_t stream) {
  check_args(a, ep);
  EPMOE_ASSERT(!a.accumulate || (std::is_same_v<TC, float>), "gemm: accumulate needs fp32 C");
  if (!a.offsets && a.M == 0) return;
  if constexpr (std::is_same_v<TA, bf16>) {
    EPMOE_ASSERT(!a.b_k_twice || a.K % 128 == 0, "bf16 gemm: b_k_twice needs K (of A) a multiple of 128");
    EPMOE_ASSERT(a.K % 8 == 0 && a.lda % 8 == 0 && a.ldb % 8 == 0 && a.b_group_stride % 8 == 0,
                 "bf16 gemm: K and the row strides must be multiples of 8 (16-byte rows), K = " + std::to_string(a.K));
    // Tile shape from the expected rows per group (a batch-invariant choice: the per-element
    // accumulation order is the same for every shape).
    const int rows = a.offsets ? a.rows_hint : a.M;
    EPMOE_ASSERT(!a.tiles || gemm_tile_m(rows) == gemm_tile_m(a.rows_hint), "gemm: tiles of another height");
    EPMOE_ASSERT(a.path != GemmPath::Wgmma || !a.tiles, "gemm: a tile list is laid out for the mma.sync tile height");
    static_assert(Tiny::BM == Small::BM, "gemm: a tile list serves both mma.sync tile widths");
    EPMOE_ASSERT(!a.tiles || (a.path != GemmPath::Tiled && a.path != GemmPath::TiledNarrow) ||
                     gemm_tile_m(a.rows_hint) == Small::BM,
                 "gemm: a tile list laid out for the wgmma tile height, forced onto the mma.sync kernel");
    if (a.job_expert) {
      EPMOE_ASSERT(!a.offsets && !a.tiles && !a.a_rows && a.M == 1 && a.job_a_div >= 1 && a.path != GemmPath::Wgmma,
                   "gemm: jobs are groups of one row on the mma.sync tile kernel, without offsets, tiles or a_rows");
      EPMOE_ASSERT(!a.row_sum_out || (ep == Epilogue::Store && !a.accumulate && !a.c_rows && a.row_sum_rows > 0 &&
                                      a.G % a.row_sum_rows == 0 && a.row_sum_w && a.row_sum_counters),
                   "gemm: row sums need the Store epilogue, whole sets of rows, weights and counters");
      // The tile width of the grouped path (narrow_expert_tiles), so that the two paths split N alike.
      if (a.path == GemmPath::TiledNarrow || (a.path == GemmPath::Auto && narrow_expert_tiles()))
        launch_tc<Tiny, TC>(a, ep, stream);
      else launch_tc<Small, TC>(a, ep, stream);
      return;
    }
    // Hopper's wgmma kernel where groups have enough rows (the same bits, gemm_wgmma.cu); not for
    // a dense GEMM of a few rows, where its wider tile would leave half the CTAs of Small/Tiny.
    const bool dense_decode = !a.offsets && !a.tiles && rows <= 16;
    if (a.path == GemmPath::Wgmma || (a.path == GemmPath::Auto && dense_decode && dense_decode_wgmma()))
      gemm_wgmma<TC>(a, ep, std::max(rows, 16), stream);
    else if (a.path == GemmPath::Auto && wgmma_tile_m(rows) && (a.offsets || rows > 16)) gemm_wgmma<TC>(a, ep, rows, stream);
    else if (a.path == GemmPath::TiledNarrow || (a.path == GemmPath::Auto && a.tiles && narrow_expert_tiles()) ||
             (rows <= 16 && !a.offsets && !a.tiles && ceil_div(a.N, Small::BN) * a.G < 2 * sm_count()))
      launch_tc<Tiny, TC>(a, ep, stream);
    else launch_tc<Small, TC>(a, ep, stream);
  } else {
    EPMOE_ASSERT(!a.tiles, "gemm f32: no tile lists (the fp32 path loops over m-tiles)");
    EPMOE_ASSERT(!a.job_expert, "gemm f32: no jobs (the fp32 runner plans)");
    EPMOE_ASSERT(!a.b_k_twice, "gemm f32: no b_k_twice");
    const int per_group = a.offsets ? std::max(a.rows_hint, 1) : a.M;
    dim3 grid(ceil_div(a.N, 64), a.G, std::max(1, std::min(ceil_div(per_group, 64), 65535)));
    if (ep == Epilogue::SwiGLU) simt_gemm_kernel<TA, TC, true><<<grid, 256, 0, stream>>>(a);
    else simt_gemm_kernel<TA, TC, false><<<grid, 256, 0, stream>>>(a);
    EPMOE_CUDA_LAUNCHED();
  }
}

template void gemm<bf16, bf16>(const GemmArgs&, Epilogue, cudaStream_t);
template void gemm<bf16, float>(const GemmArgs&, Epilogue, cudaStream_t);
template void gemm<float, float>(const GemmArgs&, Epilogue, cudaStream_t);
template void gemm<float, bf16>(const GemmArgs&, Epilogue, cudaStream_t);

}  // namespace epmoe::cuda
