#include "kernels/cuda/gemm_fp8.cuh"

#include <cuda_fp8.h>

#include <cmath>

#include "kernels/cuda/mma_ptx.cuh"
#include "tensor/dtype.h"

namespace epmoe::cuda {

namespace {

using ptx::cp_async16;
using ptx::cp_async4;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::group_range;
using ptx::ldmatrix_x4;

__device__ inline void mma_e4m3(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared-memory rows of one k block: 128 bytes = 8 chunks of 16, chunk c of row r at c ^ (r & 7)
// (the 8 rows an ldmatrix phase reads hit 8 different bank groups), as the bf16 kernel.
__device__ inline int swz8(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

template <int BM_, int BN_, int WM_, int WN_, int STAGES_, int MIN_CTAS_>
struct Fp8Cfg {
  static constexpr int BM = BM_, BN = BN_, WM = WM_, WN = WN_, STAGES = STAGES_, BK = kFp8Block;
  static constexpr int MIN_CTAS = MIN_CTAS_;
  static constexpr int NT = WM * WN * 32;
  static constexpr int TM = BM / WM, TN = BN / WN;
  static constexpr int MI = TM / 16, NI = TN / 8;
  static constexpr int A_CH = BM * 8 / NT, B_CH = BN * 8 / NT;  // 16-byte chunks per thread per stage
  static constexpr int STAGE_BYTES = (BM + BN) * BK + (BM + BN) * 4;  // codes + one scale per row
  static constexpr int SMEM = STAGES * STAGE_BYTES;
  static_assert(TM % 16 == 0 && TN % 16 == 0, "warp tile");
  static_assert((BM * 8) % NT == 0 && (BN * 8) % NT == 0, "chunks per thread");
  static_assert(NT >= BM && NT >= BN, "one scale per thread and stage");
};

template <class Cfg, bool SWIGLU>
__global__ void __launch_bounds__(Cfg::NT, Cfg::MIN_CTAS) fp8_gemm_kernel(const Fp8GemmArgs q) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, NT = Cfg::NT, STAGES = Cfg::STAGES;
  constexpr int TM = Cfg::TM, TN = Cfg::TN, MI = Cfg::MI, NI = Cfg::NI, A_CH = Cfg::A_CH, B_CH = Cfg::B_CH;
  const GemmArgs& p = q.g;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  uint8_t* sA = smem_raw;                          // [STAGES][BM][128]
  uint8_t* sB = sA + STAGES * BM * BK;             // [STAGES][BN][128]
  float* sSa = reinterpret_cast<float*>(sB + STAGES * BN * BK);  // [STAGES][BM]
  float* sSb = sSa + STAGES * BM;                                  // [STAGES][BN]

  ptx::CtaTiles ct;
  if (!ptx::cta_tiles(p, BM, ct)) return;
  const int row_begin = ct.row_begin, rows = ct.rows, group = ct.group;
  const int m_first = ct.m_first, m_end = ct.m_end, m_step = ct.m_step;
  const int n0 = blockIdx.x * BN;
  const int K = p.K, KT = K / BK;
  const uint8_t* A = static_cast<const uint8_t*>(p.A);
  const uint8_t* B = static_cast<const uint8_t*>(p.B) + int64_t(group) * p.b_group_stride;
  const float* SB = q.b_scale + int64_t(group) * q.b_scale_group_stride;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / Cfg::WN, wn = warp % Cfg::WN;

  const uint8_t* b_src[B_CH];
  int b_off[B_CH];
  bool b_ok[B_CH];
#pragma unroll
  for (int i = 0; i < B_CH; i++) {
    const int idx = tid + i * NT, r = idx >> 3, c = idx & 7;
    b_ok[i] = n0 + r < p.N;
    b_src[i] = B + int64_t(b_ok[i] ? n0 + r : 0) * p.ldb + c * 16;
    b_off[i] = swz8(r, c);
  }
  // Thread tid < BN copies the scale of weight row n0 + tid.
  const bool sb_ok = tid < BN && n0 + tid < p.N;
  const float* sb_src = SB + (sb_ok ? n0 + tid : 0);

  for (int mt = m_first; mt < m_end && mt * BM < rows; mt += m_step) {
    const int m0 = mt * BM;
    const uint8_t* a_src[A_CH];
    int a_off[A_CH];
    bool a_ok[A_CH];
#pragma unroll
    for (int i = 0; i < A_CH; i++) {
      const int idx = tid + i * NT, r = idx >> 3, c = idx & 7;
      a_ok[i] = m0 + r < rows;
      int src = row_begin + m0 + r;
      if (a_ok[i] && p.a_rows) src = p.a_rows[src];
      a_src[i] = A + int64_t(a_ok[i] ? src : 0) * p.lda + c * 16;
      a_off[i] = swz8(r, c);
    }
    // Thread tid < BM copies the scale of A row m0 + tid.
    bool sa_ok = tid < BM && m0 + tid < rows;
    const float* sa_src = q.a_scale;
    if (sa_ok) {
      int src = row_begin + m0 + tid;
      if (p.a_rows) src = p.a_rows[src];
      sa_src = q.a_scale + int64_t(src) * q.a_scale_ld;
    }
    auto load_stage = [&](int stage, int kt) {
      const int k0 = kt * BK;
      uint8_t* da = sA + stage * BM * BK;
      uint8_t* db = sB + stage * BN * BK;
#pragma unroll
      for (int i = 0; i < A_CH; i++) cp_async16(da + a_off[i], a_ok[i] ? a_src[i] + k0 : A, a_ok[i] ? 16 : 0);
#pragma unroll
      for (int i = 0; i < B_CH; i++) cp_async16(db + b_off[i], b_ok[i] ? b_src[i] + k0 : B, b_ok[i] ? 16 : 0);
      if (tid < BM) cp_async4(sSa + stage * BM + tid, sa_ok ? sa_src + kt : q.a_scale, sa_ok ? 4 : 0);
      if (tid < BN) cp_async4(sSb + stage * BN + tid, sb_ok ? sb_src + int64_t(kt) * p.N : SB, sb_ok ? 4 : 0);
    };

    float acc[MI][NI][4];
    ptx::zero_tile(acc);
    ptx::cp_async_mainloop<STAGES>(KT, [&](int s) { load_stage(s, s); }, load_stage, [&](int st, int) {
      // The block's products, accumulated from zero on the tensor cores.
      float blk[MI][NI][4];
      ptx::zero_tile(blk);
      ptx::warp_tile_mmas<MI, NI, BK / 32>(blk, sA + st * BM * BK, sB + st * BN * BK, wm * TM, wn * TN, lane, swz8,
                                           mma_e4m3);
      // acc += blk * (sa * sw), in fp32, block after block.
      const float* sa = sSa + st * BM;
      const float* sb = sSb + st * BN;
      float ra[MI][2], rb[NI][2];
#pragma unroll
      for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int h = 0; h < 2; h++) ra[mi][h] = sa[wm * TM + mi * 16 + (lane >> 2) + h * 8];
#pragma unroll
      for (int ni = 0; ni < NI; ni++)
#pragma unroll
        for (int e = 0; e < 2; e++) rb[ni][e] = sb[wn * TN + ni * 8 + (lane & 3) * 2 + e];
#pragma unroll
      for (int mi = 0; mi < MI; mi++)
#pragma unroll
        for (int ni = 0; ni < NI; ni++)
#pragma unroll
          for (int e = 0; e < 4; e++)
            acc[mi][ni][e] = fmaf(blk[mi][ni][e], __fmul_rn(ra[mi][e >> 1], rb[ni][e & 1]), acc[mi][ni][e]);
    });
    cp_async_wait<0>();
    __syncthreads();  // the next m-tile's copies overwrite these stages

    // (store_pair: Store or SwiGLU; gemm_fp8 refuses a bias and accumulate.)
    ptx::store_warp_tile<float, SWIGLU>(p, acc, row_begin, rows, m0, wm * TM, n0 + wn * TN, lane);
  }
}

// The m-tile heights are gemm()'s (gemm_tile_m), so one plan serves both kernels. k blocks of 128
// bytes: a stage holds as many k values as two of the bf16 kernel's.
// Two accumulator sets per output (the running sum and the block's products): 128 fp32 registers
// per thread at 32 x 64 or 64 x 32 outputs per warp, so one CTA per SM of 4 (Medium) or 8 (Large)
// warps, up to 255 registers (ptxas: 255, 40-72 bytes of stack). Measured slower on an H200
// (gpu_moe_bench, M = 1024 / 4096: 698 / 2062 us against 644 / 2032): warps of 32 x 32 with two
// CTAs per SM (Medium) or 16 warps (Large) under 128 registers, which spilled more; the same with
// the block products of one 16-row slice live at a time (866 / 2420 us).
using Small8 = Fp8Cfg<16, 64, 1, 4, 6, 1>;
using Medium8 = Fp8Cfg<64, 128, 2, 2, 4, 1>;
using Large8 = Fp8Cfg<128, 128, 2, 4, 4, 1>;

template <class Cfg>
void launch_fp8(const Fp8GemmArgs& q, Epilogue ep, cudaStream_t stream) {
  const GemmArgs& a = q.g;
  const int per_group = a.offsets ? std::max(a.rows_hint, 1) : a.M;
  dim3 grid(ceil_div(a.N, Cfg::BN), a.G, std::max(1, std::min(ceil_div(per_group, Cfg::BM), 65535)));
  if (a.tiles) {
    EPMOE_ASSERT(a.max_tiles <= 65535, "gemm_fp8: too many tiles");
    grid = dim3(ceil_div(a.N, Cfg::BN), std::max(1, a.max_tiles), 1);
  }
  static const bool ready = [] {
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(fp8_gemm_kernel<Cfg, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          Cfg::SMEM));
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(fp8_gemm_kernel<Cfg, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          Cfg::SMEM));
    return true;
  }();
  (void)ready;
  if (ep == Epilogue::SwiGLU) fp8_gemm_kernel<Cfg, true><<<grid, Cfg::NT, Cfg::SMEM, stream>>>(q);
  else fp8_gemm_kernel<Cfg, false><<<grid, Cfg::NT, Cfg::SMEM, stream>>>(q);
  EPMOE_CUDA_LAUNCHED();
}

// One warp per (row, group of 128 channels): 4 channels per lane.
template <class TX>
__global__ void quantize_fp8_kernel(const TX* x, int64_t ldx, int64_t rows, const int32_t* rows_dev, int K, int KB,
                                    uint8_t* q, int64_t ldq, float* s, int64_t lds) {
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int64_t n = rows_dev ? lmin(rows, int64_t(*rows_dev)) : rows;
  if (w >= n * KB) return;
  const int64_t r = w / KB;
  const int b = int(w % KB);
  const int k0 = b * kFp8Block + lane * 4;
  float v[4];
  float amax = 0.f;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    v[i] = k0 + i < K ? to_f32(x[r * ldx + k0 + i]) : 0.f;
    amax = fmaxf(amax, fabsf(v[i]));
  }
  amax = warp_max(amax);
  const float scale = __fdiv_rn(fmaxf(amax, 1e-10f), kFp8Max);
  uint32_t packed = 0;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    const uint32_t c = __nv_cvt_float_to_fp8(__fdiv_rn(v[i], scale), __NV_SATFINITE, __NV_E4M3);
    packed |= (c & 0xffu) << (8 * i);
  }
  *reinterpret_cast<uint32_t*>(q + r * ldq + k0) = packed;
  if (lane == 0) s[r * lds + b] = scale;
}

}  // namespace

void gemm_fp8(const Fp8GemmArgs& q, Epilogue ep, cudaStream_t stream) {
  const GemmArgs& a = q.g;
  EPMOE_ASSERT(a.N > 0 && a.K > 0 && a.G >= 1, "gemm_fp8: empty shape");
  EPMOE_ASSERT(!a.accumulate, "gemm_fp8: no accumulate (the experts' GEMMs)");
  EPMOE_ASSERT(a.K % kFp8Block == 0 && a.lda % 16 == 0 && a.ldb % 16 == 0 && a.b_group_stride % 16 == 0,
               "gemm_fp8: K must be a multiple of 128 (rows zero-padded) and rows 16-byte aligned, K = " +
                   std::to_string(a.K));
  EPMOE_ASSERT(!a.bias && !a.b_k_twice, "gemm_fp8: no bias, no b_k_twice");
  EPMOE_ASSERT(q.a_scale && q.b_scale, "gemm_fp8: scales missing");
  if (ep == Epilogue::SwiGLU) EPMOE_ASSERT(a.N % 2 == 0, "gemm_fp8: SwiGLU needs an even N");
  if (!a.offsets && a.M == 0) return;
  const int rows = a.offsets ? a.rows_hint : a.M;
  EPMOE_ASSERT(!a.tiles || gemm_tile_m(rows) == gemm_tile_m(a.rows_hint), "gemm_fp8: tiles of another height");
  static_assert(Small8::BM == 16 && Medium8::BM == 64 && Large8::BM == 128, "the m-tile heights of gemm_tile_m");
  const int tm = gemm_tile_m(rows);
  if (tm == Small8::BM) launch_fp8<Small8>(q, ep, stream);
  else if (tm == Medium8::BM) launch_fp8<Medium8>(q, ep, stream);
  else launch_fp8<Large8>(q, ep, stream);
}

template <class TX>
void quantize_rows_fp8(const TX* x, int64_t ldx, int64_t rows, const int32_t* rows_dev, int K, uint8_t* q,
                       int64_t ldq, float* s, int64_t lds, cudaStream_t stream) {
  if (rows == 0) return;
  const int KB = ceil_div(K, kFp8Block);
  EPMOE_ASSERT(ldq % 4 == 0 && ldq >= int64_t(KB) * kFp8Block && lds >= KB, "quantize_rows_fp8: row strides");
  const int64_t warps = rows * KB;
  const int64_t blocks = (warps * 32 + 255) / 256;
  EPMOE_ASSERT(blocks < (int64_t(1) << 31), "quantize_rows_fp8: too many rows");
  quantize_fp8_kernel<TX><<<unsigned(blocks), 256, 0, stream>>>(x, ldx, rows, rows_dev, K, KB, q, ldq, s, lds);
  EPMOE_CUDA_LAUNCHED();
}

template void quantize_rows_fp8<float>(const float*, int64_t, int64_t, const int32_t*, int, uint8_t*, int64_t, float*,
                                       int64_t, cudaStream_t);
template void quantize_rows_fp8<bf16>(const bf16*, int64_t, int64_t, const int32_t*, int, uint8_t*, int64_t, float*,
                                      int64_t, cudaStream_t);

uint8_t f32_to_fp8e4m3_host(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0x00;
  const double a = std::fabs(double(f));
  if (a >= 448.0) return sign | 0x7e;  // saturated (satfinite)
  // The codes 0x00..0x7e are increasing in value: the last one not above a, and the next.
  int lo = 0;
  while (lo < 0x7e && double(fp8e4m3_to_f32(uint8_t(lo + 1))) <= a) lo++;
  if (lo == 0x7e) return sign | 0x7e;
  const double vl = fp8e4m3_to_f32(uint8_t(lo)), vh = fp8e4m3_to_f32(uint8_t(lo + 1));
  int c = lo;
  if (a - vl > vh - a || (a - vl == vh - a && (lo & 1))) c = lo + 1;  // nearest, ties to the even code
  return sign | uint8_t(c);
}

}  // namespace epmoe::cuda
