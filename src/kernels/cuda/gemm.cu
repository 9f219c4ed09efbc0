#include "kernels/cuda/gemm.cuh"

#include <algorithm>
#include <cstdlib>

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
  const bool early_b = (!p.offsets && !p.tiles) || p.plan_precedes_a;
  if (!early_b) pdl_wait();
  pdl_trigger();
  int row_begin, rows, group, m_first, m_end;
  if (p.tiles) {  // exactly one m-tile
    if (int(blockIdx.y) >= *p.num_tiles) {
      if (early_b) pdl_wait();
      return;
    }
    group = p.tiles[2 * blockIdx.y];
    m_first = p.tiles[2 * blockIdx.y + 1] / BM;
    m_end = m_first + 1;
  } else {        // m-tiles blockIdx.z, + gridDim.z, ...
    group = blockIdx.y;
    m_first = blockIdx.z;
    m_end = 0x7fffffff;
  }
  const int m_step = p.tiles ? 1 : int(gridDim.z);
  group_range(p, group, row_begin, rows);
  if (m_first * BM >= rows) {
    if (early_b) pdl_wait();
    return;
  }
  const int n0 = blockIdx.x * BN;
  const int K = p.K, KT = (K + BK - 1) / BK;
  const bf16* A = static_cast<const bf16*>(p.A);
  const bf16* B = static_cast<const bf16*>(p.B) + int64_t(group) * p.b_group_stride;
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
#pragma unroll
    for (int i = 0; i < MI; i++)
#pragma unroll
      for (int j = 0; j < NI; j++)
#pragma unroll
        for (int q = 0; q < 4; q++) acc[i][j][q] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
      if (s < KT) {
        if (b_in_flight) load_a(s, s);
        else load_stage(s, s);
      }
      cp_async_commit();
    }
    b_in_flight = false;
    for (int kt = 0; kt < KT; kt++) {
      cp_async_wait<STAGES - 2>();
      __syncthreads();
      const int nk = kt + STAGES - 1;
      if (nk < KT) load_stage(nk % STAGES, nk);
      cp_async_commit();
      const bf16* a = sA + (kt % STAGES) * BM * BK;
      const bf16* b = sB + (kt % STAGES) * BN * BK;
#pragma unroll
      for (int ks = 0; ks < BK / 16; ks++) {
        uint32_t af[MI][4];
        uint32_t bfr[NI][2];
#pragma unroll
        for (int mi = 0; mi < MI; mi++) {
          const int r = wm * TM + mi * 16 + (lane & 15), c = ks * 2 + (lane >> 4);
          ldmatrix_x4(af[mi], a + swz(r, c));
        }
#pragma unroll
        for (int nj = 0; nj < NI / 2; nj++) {
          const int r = wn * TN + nj * 16 + (lane & 7) + ((lane >> 4) << 3), c = ks * 2 + ((lane >> 3) & 1);
          uint32_t t[4];
          ldmatrix_x4(t, b + swz(r, c));
          bfr[2 * nj][0] = t[0];
          bfr[2 * nj][1] = t[1];
          bfr[2 * nj + 1][0] = t[2];
          bfr[2 * nj + 1][1] = t[3];
        }
#pragma unroll
        for (int mi = 0; mi < MI; mi++)
#pragma unroll
          for (int ni = 0; ni < NI; ni++) mma_bf16(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
      }
    }
    cp_async_wait<0>();
    __syncthreads();  // the next m-tile's copies overwrite these stages

#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int lr = wm * TM + mi * 16 + (lane >> 2) + h * 8;
        if (m0 + lr >= rows) continue;
        const int r = row_begin + m0 + lr;
        const int64_t orow = p.c_rows ? p.c_rows[r] : r;
#pragma unroll
        for (int ni = 0; ni < NI; ni++) {
          const int col = n0 + wn * TN + ni * 8 + (lane & 3) * 2;
          store_pair<TC, SWIGLU>(p, orow, col, acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
        }
      }
  }
}

// ---------------------------------------------------------------------------------------------
// The decode kernel (bf16, at most 16 rows per m-tile: a decode step's projections and experts).
// There the GEMM reads every weight once and does almost no arithmetic, so what counts is bytes
// in flight and how the weights are read. One warp per slab of kSlab weight rows x the whole K;
// a stage holds SUB consecutive k-tiles of 64, so that each weight row is read as one run of
// SUB x 128 bytes (one warp instruction covers a row's run at SUB = 4) rather than 128-byte pieces
// of many rows; A rows are copied only where the m-tile has them (row i of an mma result depends
// on row i of A alone), into an 8-row tile when the m-tile has at most 8 (ldmatrix's rows 8-15
// then read rows 0-7 again: outputs that are never stored). With b_k_twice a weight k-tile serves
// the two A k-tiles of [xh | xl]; with AF32, fp32 rows are split into them as they are staged.
// The bits are tc_gemm_kernel's: a warp tile of 16 x 16 (Small's), the same fragments and each
// output element the same chain of m16n8k16 steps over k ascending from 0.

constexpr int kSlab = 16;  // weight rows per warp

// Shared memory of the decode kernel for A tiles of ar rows: per stage SUB weight tiles and the A
// tiles they serve -- bf16, or with AF32 fp32 staging of ar x 64 SUB -- and with AF32 the [hi | lo]
// tiles of one k-tile.
template <int STAGES, int SUB, bool AF32>
constexpr int stream_smem(bool b_k_twice, int ar) {
  constexpr int wtile = kSlab * 64 * 2;  // bytes of a 16 x 64 bf16 weight tile
  const int atile = ar * 64 * 2;
  return AF32 ? STAGES * SUB * (wtile + 2 * atile) + 2 * atile
              : STAGES * SUB * (wtile + (b_k_twice ? 2 : 1) * atile);
}

template <class TC, bool SWIGLU, int STAGES, int SUB, bool AF32>
__global__ void __launch_bounds__(32) tc_stream_kernel(const GemmArgs p, int ar) {
  constexpr int BK = 64, TILE = kSlab * BK, CPR = SUB * 8;  // CPR: 16-byte weight chunks per row per stage
  extern __shared__ __align__(128) unsigned char smem_raw[];
  const int AT = p.b_k_twice ? 2 : 1;  // A k-tiles per weight k-tile
  const int ATILE = ar * BK;           // bf16 per A tile
  bf16* sB = reinterpret_cast<bf16*>(smem_raw);  // [STAGES][SUB][16][64]
  bf16* sA = sB + STAGES * SUB * TILE;           // [STAGES][SUB][AT][ar][64] bf16, or (AF32) [STAGES][ar][64 SUB] fp32
  bf16* sX = sA + STAGES * SUB * 2 * ATILE;      // (AF32) one k-tile split into [hi][lo] tiles
  const int lane = threadIdx.x;
  // As tc_gemm_kernel: weights before the wait where they are known without the previous kernel.
  const bool early_b = (!p.offsets && !p.tiles) || p.plan_precedes_a;
  if (!early_b) pdl_wait();
  pdl_trigger();
  int group = blockIdx.y, m0 = 0;
  if (p.tiles) {
    if (int(blockIdx.y) >= *p.num_tiles) {
      if (early_b) pdl_wait();
      return;
    }
    group = p.tiles[2 * blockIdx.y];
    m0 = p.tiles[2 * blockIdx.y + 1];
  }
  int row_begin, rows;
  group_range(p, group, row_begin, rows);
  rows = min(rows - m0, kSlab);
  if (rows <= 0) {
    if (early_b) pdl_wait();
    return;
  }
  const int n0 = blockIdx.x * kSlab;
  const int K = p.K, KB = p.b_k_twice ? K / 2 : K;
  const int KTS = (KB + BK * SUB - 1) / (BK * SUB);  // stages of the whole K
  const bf16* B = static_cast<const bf16*>(p.B) + int64_t(group) * p.b_group_stride;
  // Weights: lane -> chunk lane % CPR of rows lane / CPR + (32 / CPR) i, i < 16 CPR / 32.
  constexpr int BI = kSlab * CPR / 32;
  auto load_b = [&](int stage, int kb) {
#pragma unroll
    for (int i = 0; i < BI; i++) {
      const int idx = lane + 32 * i, r = idx / CPR, cc = idx % CPR, k = kb * BK * SUB + cc * 8;
      const bool ok = n0 + r < p.N && k < KB;
      ptx::cp_async16(sB + (stage * SUB + (cc >> 3)) * TILE + ptx::swz(r, cc & 7),
                      ok ? B + int64_t(n0 + r) * p.ldb + k : B, ok ? 16 : 0);
    }
  };
  // A: the source row of each of the m-tile's rows, from the plan where it has one.
  const char* a_row = nullptr;  // lane r < rows: its row's first byte
  auto prepare_a = [&] {  // (after the wait: a_rows may come from the plan)
    if (lane < rows) {
      int src = row_begin + m0 + lane;
      if (p.a_rows) src = p.a_rows[src];
      a_row = static_cast<const char*>(p.A) + int64_t(src) * p.lda * (AF32 ? 4 : 2);
    }
  };
  auto load_a = [&](int stage, int kb) {
    // Chunks of 16 bytes: per row 8 SUB AT (bf16) or 16 SUB (fp32) a stage, lanes over the row's
    // chunks; each row's pointer comes from its lane by a shuffle.
    constexpr int ACPR_F = 16 * SUB;
    const int acpr = AF32 ? ACPR_F : 8 * SUB * AT;
    for (int r = 0; r < rows; r++) {
      const char* src = reinterpret_cast<const char*>(__shfl_sync(0xffffffffu, reinterpret_cast<uintptr_t>(a_row), r));
      for (int cc = lane; cc < acpr; cc += 32) {
        if constexpr (AF32) {  // x columns 64 SUB kb + 4 cc (b_k_twice: K % 128 == 0, KB % 64 == 0)
          const int k = kb * BK * SUB + cc * 4;
          float* da = reinterpret_cast<float*>(sA) + stage * SUB * 2 * ATILE / 2 + r * BK * SUB + cc * 4;
          if (k < KB) ptx::cp_async16(da, src + int64_t(k) * 4, 16);
        } else {  // A' k-tile (kb SUB + j) AT + t, chunk c
          const int t_all = cc >> 3, c = cc & 7, ka = kb * SUB * AT + t_all, k = ka * BK + c * 8;
          const bool ok = k < K;
          ptx::cp_async16(sA + (stage * SUB * AT + t_all) * ATILE + ptx::swz(r, c), ok ? src + int64_t(k) * 2 : p.A,
                          ok ? 16 : 0);
        }
      }
    }
  };
  // Commit groups as tc_gemm_kernel: with early weights, the weights of the first STAGES - 1
  // stages, then their A halves; at stage kb, wait_group<STAGES - 2> covers both.
  if (early_b) {
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
      if (s < KTS) load_b(s, s);
      ptx::cp_async_commit();
    }
    pdl_wait();
    prepare_a();
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
      if (s < KTS) load_a(s, s);
      ptx::cp_async_commit();
    }
  } else {
    prepare_a();
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
      if (s < KTS) load_b(s, s), load_a(s, s);
      ptx::cp_async_commit();
    }
  }
  float acc[2][4] = {};
  const int arow = (lane & 15) & (ar - 1);  // ldmatrix's A row (rows 8-15 reread 0-7 when ar = 8)
  for (int kb = 0; kb < KTS; kb++) {
    ptx::cp_async_wait<STAGES - 2>();
    __syncwarp();
    const int nk = kb + STAGES - 1;
    if (nk < KTS) load_b(nk % STAGES, nk), load_a(nk % STAGES, nk);
    ptx::cp_async_commit();
    const int stage = kb % STAGES;
#pragma unroll
    for (int j = 0; j < SUB; j++) {
      if ((kb * SUB + j) * BK >= KB) break;  // (the zero-filled k-tiles past K add nothing: skipped)
      const bf16* b = sB + (stage * SUB + j) * TILE;
      const bf16* a0 = sA + (stage * SUB + j) * AT * ATILE;
      if constexpr (AF32) {
        // split_rows' values: hi = bf16(v), lo = bf16(v - hi), into the [hi] and [lo] tiles.
        const float* xs = reinterpret_cast<const float*>(sA) + stage * SUB * 2 * ATILE / 2 + j * BK;
        for (int idx = lane; idx < rows * 16; idx += 32) {
          const int r = idx >> 4, q = idx & 15;
          const float4 v = *reinterpret_cast<const float4*>(xs + r * BK * SUB + 4 * q);
          const float f[4] = {v.x, v.y, v.z, v.w};
          __align__(8) bf16 hi[4], lo[4];
#pragma unroll
          for (int e = 0; e < 4; e++) {
            hi[e] = __float2bfloat16_rn(f[e]);
            lo[e] = __float2bfloat16_rn(f[e] - __bfloat162float(hi[e]));
          }
          const int o = ptx::swz(r, q >> 1) + (q & 1) * 4;
          *reinterpret_cast<uint2*>(sX + o) = *reinterpret_cast<const uint2*>(hi);
          *reinterpret_cast<uint2*>(sX + ATILE + o) = *reinterpret_cast<const uint2*>(lo);
        }
        __syncwarp();
        a0 = sX;
      }
      for (int t = 0; t < AT; t++) {
        const bf16* a = a0 + t * ATILE;
#pragma unroll
        for (int ks = 0; ks < BK / 16; ks++) {
          uint32_t af[4], bt[4];
          ptx::ldmatrix_x4(af, a + ptx::swz(arow, ks * 2 + (lane >> 4)));
          ptx::ldmatrix_x4(bt, b + ptx::swz((lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
          ptx::mma_bf16(acc[0], af, bt[0], bt[1]);
          ptx::mma_bf16(acc[1], af, bt[2], bt[3]);
        }
      }
      if constexpr (AF32) __syncwarp();  // (sX is rewritten by the next k-tile)
    }
  }
  ptx::cp_async_wait<0>();
#pragma unroll
  for (int h = 0; h < 2; h++) {
    const int lr = (lane >> 2) + h * 8;
    if (lr >= rows) continue;
    const int r = row_begin + m0 + lr;
    const int64_t orow = p.c_rows ? p.c_rows[r] : r;
#pragma unroll
    for (int ni = 0; ni < 2; ni++)
      ptx::store_pair<TC, SWIGLU>(p, orow, n0 + ni * 8 + (lane & 3) * 2, acc[ni][2 * h], acc[ni][2 * h + 1]);
  }
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

// The decode kernel's shape: EPMOE_GEMM_STREAM=1 (8 stages of one k-tile), 2 (4 stages of 4
// k-tiles), 3 (3 stages of 8); 0 (the default) for Small / Tiny in its place. The bits are the same.
int stream_config() {
  static const int n = [] {
    const char* e = std::getenv("EPMOE_GEMM_STREAM");
    const int v = e && *e ? std::atoi(e) : 0;
    return v < 0 || v > 3 ? 0 : v;
  }();
  return n;
}

template <class TC, int STAGES, int SUB, bool AF32>
void launch_stream(const GemmArgs& a, Epilogue ep, int ar, cudaStream_t stream) {
  static_assert(kSlab == Small::BM, "the decode kernel serves the plan's tiles of Small's height");
  const dim3 grid(ceil_div(a.N, kSlab), a.tiles ? std::max(1, a.max_tiles) : a.G);
  static const bool ready = [] {
    for (auto k : {tc_stream_kernel<TC, true, STAGES, SUB, AF32>, tc_stream_kernel<TC, false, STAGES, SUB, AF32>})
      EPMOE_CUDA_CHECK(cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                            stream_smem<STAGES, SUB, AF32>(true, kSlab)));
    return true;
  }();
  (void)ready;
  const int smem = stream_smem<STAGES, SUB, AF32>(a.b_k_twice, ar);
  if (ep == Epilogue::SwiGLU) launch_pdl(tc_stream_kernel<TC, true, STAGES, SUB, AF32>, grid, dim3(32), smem, stream, a, ar);
  else launch_pdl(tc_stream_kernel<TC, false, STAGES, SUB, AF32>, grid, dim3(32), smem, stream, a, ar);
}

template <class TC, bool AF32>
void launch_stream(const GemmArgs& a, Epilogue ep, int ar, cudaStream_t stream) {
  switch (stream_config()) {
    case 3: return launch_stream<TC, 3, 8, AF32>(a, ep, ar, stream);
    case 2: return launch_stream<TC, 4, 4, AF32>(a, ep, ar, stream);
    default: return launch_stream<TC, 8, 1, AF32>(a, ep, ar, stream);
  }
}

// rows: at most this many rows per m-tile (8 or fewer: 8-row A tiles).
template <class TC>
void launch_stream(const GemmArgs& a, Epilogue ep, int rows, cudaStream_t stream) {
  const int ar = rows <= 8 && !a.tiles ? 8 : kSlab;  // (a tile list's tiles may hold 16 rows)
  if (a.a_f32_split) launch_stream<TC, true>(a, ep, ar, stream);
  else launch_stream<TC, false>(a, ep, ar, stream);
}

void check_args(const GemmArgs& a, Epilogue ep) {
  EPMOE_ASSERT(a.N > 0 && a.K > 0 && a.G >= 1, "gemm: empty shape");
  EPMOE_ASSERT(!a.accumulate || ep == Epilogue::Store, "gemm: accumulate needs the Store epilogue");
  if (ep == Epilogue::SwiGLU) EPMOE_ASSERT(a.N % 2 == 0 && !a.bias, "gemm: SwiGLU needs an even N and no bias");
}

}  // namespace

bool gemm_decode_kernel_on() { return stream_config() > 0; }

int gemm_tile_m(int rows_hint) {
  if (const int wg = wgmma_tile_m(rows_hint)) return wg;
  return Small::BM;
}

template <class TA, class TC>
void gemm(const GemmArgs& a, Epilogue ep, cudaStream_t stream) {
  check_args(a, ep);
  if (!a.offsets && a.M == 0) return;
  if constexpr (std::is_same_v<TA, bf16>) {
    EPMOE_ASSERT(!a.b_k_twice || a.K % 128 == 0, "bf16 gemm: b_k_twice needs K (of A) a multiple of 128");
    EPMOE_ASSERT(a.K % 8 == 0 && a.lda % 8 == 0 && a.ldb % 8 == 0 && a.b_group_stride % 8 == 0,
                 "bf16 gemm: K and the row strides must be multiples of 8 (16-byte rows), K = " + std::to_string(a.K));
    // Tile shape from the expected rows per group (a batch-invariant choice: the per-element
    // accumulation order is the same for every shape).
    const int rows = a.offsets ? a.rows_hint : a.M;
    EPMOE_ASSERT(!a.tiles || gemm_tile_m(rows) == gemm_tile_m(a.rows_hint), "gemm: tiles of another height");
    // Hopper's wgmma kernel where groups have enough rows (the same bits, gemm_wgmma.cu); not for
    // a dense GEMM of a few rows, where its wider tile would leave half the CTAs of Small/Tiny.
    const bool stream_fits = rows <= kSlab && (!a.offsets || a.tiles);
    EPMOE_ASSERT(a.path != GemmPath::Stream || stream_fits,
                 "gemm: the decode kernel takes at most 16 rows per group, from a tile list when grouped");
    EPMOE_ASSERT(!a.a_f32_split || (stream_fits && a.path != GemmPath::Tiled && a.b_k_twice && a.lda % 4 == 0 &&
                                    reinterpret_cast<uintptr_t>(a.A) % 16 == 0),
                 "gemm: fp32 A split in the kernel needs the decode kernel (<= 16 rows), b_k_twice and 16-byte rows");
    EPMOE_ASSERT(!a.accumulate || (std::is_same_v<TC, float>), "gemm: accumulate needs fp32 C");
    if (a.path == GemmPath::Stream || a.a_f32_split) launch_stream<TC>(a, ep, rows, stream);
    else if (a.path == GemmPath::Auto && wgmma_tile_m(rows) && (a.offsets || rows > 16)) gemm_wgmma<TC>(a, ep, rows, stream);
    else if (a.path == GemmPath::Auto && stream_fits && stream_config() > 0) launch_stream<TC>(a, ep, rows, stream);
    else if (rows <= 16 && !a.offsets && !a.tiles && ceil_div(a.N, Small::BN) * a.G < 2 * sm_count())
      launch_tc<Tiny, TC>(a, ep, stream);
    else launch_tc<Small, TC>(a, ep, stream);
  } else {
    EPMOE_ASSERT(!a.tiles, "gemm f32: no tile lists (the fp32 path loops over m-tiles)");
    EPMOE_ASSERT(!a.b_k_twice && !a.a_f32_split, "gemm f32: no b_k_twice, no split A");
    EPMOE_ASSERT(!a.accumulate || (std::is_same_v<TC, float>), "gemm: accumulate needs fp32 C");
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
