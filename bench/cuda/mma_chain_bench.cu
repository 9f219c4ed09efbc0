// How fast a chain of dependent tensor-core MMAs runs, and whether Hopper's warpgroup MMA gives the
// mma.sync chain's bits -- the question under split_gemv at one sequence (issue 33).
//
// Why: batch invariance fixes a decode projection's arithmetic to the tile GEMM's, one fp32
// accumulator chain per output over ascending k16 steps, x's hi then lo halves per 64-wide block
// (b_k_twice). The o projection (K = 4096) is then a chain of 512 dependent mma.sync m16n8k16,
// which run 26 estimated at ~26.5 cycles each (~7 us, longer than its 16.8 MB take to stream).
// wgmma.mma_async accumulates in the tensor core's pipeline; if its dependent instructions issue
// closer together, the same chain -- with the same bits (gemm_wgmma.cu measured one wgmma k16 step
// rounding as one mma.sync step) -- is shorter. (Run 31, one H100: the bits are the same in every
// form; mma.sync takes 24 cycles a step, wgmma 13.5-25.6 with a chain alone on an SM, about twice
// that with two -- docs/gpu.md, "Decode at full depth after run 31".)
//
// Prints, never asserts:
//   - cycles per dependent instruction: mma.sync m16n8k16; wgmma m64n8k16 / m64n16k16 with A and B
//     from shared memory, as one commit group or a group per 8 (each retired before the next, or
//     one left in flight); wgmma m64n8k16 with A from registers; one CTA, then one, two and four
//     chains an SM (the tensor cores shared);
//   - whether the outputs of the b_k_twice chain agree bit for bit: mma.sync (W as A, x as B),
//     wgmma with W as A (m64 output columns, n8 tokens), wgmma with x as A (m64 rows, 8 of them
//     tokens) and W as B (n16 output columns).
//   mma_chain_bench (no flags)
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/device.h"
#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/wgmma_ptx.cuh"
#include "tensor/dtype.h"

using namespace epmoe;
using namespace epmoe::cuda;

namespace {

constexpr int kRows = 64;  // output columns (W's rows) of one warpgroup
constexpr int kTok = 8;    // tokens (x's rows)
// The chain is unrolled whole between one wgmma fence and one commit (a runtime loop makes ptxas
// serialise the wgmmas: C7515 / C7520), so its shape is fixed: K = 512, 8 passes, 512 instructions.
constexpr int kK = 512, kBlk = kK / 64, kPasses = 8, kChain = kPasses * kBlk * 8;
constexpr int kLat = 256;  // the latency kernels' chain

using ptx::fence_acc;
using ptx::wgmma_fence;
using ptx::wgmma_commit;
using ptx::wgmma_wait;
using ptx::fence_proxy_async;
using ptx::smem_desc;  // gemm_wgmma.cu's K-major 128-byte swizzle

__device__ inline void wg_n8_ss(float (&d)[4], uint64_t da, uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, %4, %5, 1, 1, 1, 0, 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "l"(da), "l"(db));
}
__device__ inline void wg_n8_rs(float (&d)[4], const uint32_t (&a)[4], uint64_t db) {
  asm volatile("wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, 1, 1, 1, 0;\n"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db));
}
__device__ inline void wg_n16_ss(float (&d)[8], uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
      : "l"(da), "l"(db));
}

// Byte offset of (row r, k) in a K-major tile of 64-wide k blocks, 128-byte swizzle (ptx::swz),
// block j of a tile of `rows` rows at j * rows * 128.
__host__ __device__ inline uint32_t tile_off(int r, int k, int rows) {
  const int j = k >> 6, kk = k & 63;
  return uint32_t(j * rows * 128 + r * 128 + ((((kk >> 3) ^ (r & 7))) << 4) + (kk & 7) * 2);
}

struct Data {
  const bf16* w;   // [64][kK]
  const bf16* xh;  // [8][kK]
  const bf16* xl;
};

// An m16n8 fp32 accumulator fragment (mma.sync's, and a wgmma warp's n8 chunk) of rows row0 and
// row0 + 8, columns 2t and 2t + 1, into out[64][8].
__device__ inline void store_d(float* out, int row0, int t, const float (&d)[4]) {
  out[row0 * kTok + 2 * t] = d[0];
  out[row0 * kTok + 2 * t + 1] = d[1];
  out[(row0 + 8) * kTok + 2 * t] = d[2];
  out[(row0 + 8) * kTok + 2 * t + 1] = d[3];
}

// One wgmma chain timed by the SM's clock: the accumulator d fenced in, chain() issues the steps
// (its own commit groups, if any), the last group retired and d fenced out; cycles[blockIdx].
template <int N, class Chain>
__device__ void timed_wgmma_chain(float (&d)[N], long long* cycles, Chain chain) {
  __syncthreads();
  const long long c0 = clock64();
  fence_acc(d);
  wgmma_fence();
  chain();
  wgmma_commit();
  wgmma_wait<0>();
  fence_acc(d);
  const long long c1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = c1 - c0;
}

// mma.sync: warp w of 4 owns W rows 16w..; the b_k_twice chain, fragments from global (L1/L2):
// the arithmetic reference. out[64][8].
__global__ void ref_mma_sync(Data p, float* out) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 2, t = lane & 3;
  const uint32_t* W = reinterpret_cast<const uint32_t*>(p.w);
  auto wd = [&](int row, int k) { return W[(row * kK + k) >> 1]; };
  auto xd = [&](const bf16* x, int row, int k) { return reinterpret_cast<const uint32_t*>(x)[(row * kK + k) >> 1]; };
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  const int row0 = 16 * warp + r;
  for (int pass = 0; pass < kPasses; pass++)
    for (int j = 0; j < kBlk; j++)
      for (int half = 0; half < 2; half++)
        for (int s = 0; s < 4; s++) {
          const int k = 64 * j + 16 * s + 2 * t;
          uint32_t a[4] = {wd(row0, k), wd(row0 + 8, k), wd(row0, k + 8), wd(row0 + 8, k + 8)};
          const bf16* x = half ? p.xl : p.xh;
          uint32_t b[2] = {xd(x, r, k), xd(x, r, k + 8)};
          ptx::mma_bf16(d, a, b[0], b[1]);
        }
  store_d(out, row0, t, d);
}

// Shared memory: W tile [64 rows][K] then xh, xl tiles [8 rows][K] (and, for the transposed form,
// x as A: [64 rows][K], rows past 8 zero, hi then lo).
__device__ void stage(const Data& p, unsigned char* sm, bool x_as_a) {
  constexpr int K = kK;
  for (int i = threadIdx.x; i < kRows * K; i += blockDim.x) {
    const int r = i / K, k = i % K;
    *reinterpret_cast<bf16*>(sm + tile_off(r, k, kRows)) = p.w[i];
  }
  unsigned char* xs = sm + kRows * K * 2;
  const int xr = x_as_a ? kRows : kTok;
  for (int i = threadIdx.x; i < xr * K; i += blockDim.x) {
    const int r = i / K, k = i % K;
    const bf16 z = __float2bfloat16_rn(0.f);
    *reinterpret_cast<bf16*>(xs + tile_off(r, k, xr)) = r < kTok ? p.xh[r * K + k] : z;
    *reinterpret_cast<bf16*>(xs + xr * K * 2 + tile_off(r, k, xr)) = r < kTok ? p.xl[r * K + k] : z;
  }
  fence_proxy_async();
  __syncthreads();
}

// wgmma, W as A (m64 = W's rows), x as B (n8 = tokens); A from shared memory (REG_A false) or
// registers. out[64][8]; cycles[blockIdx] the chain's clock.
template <bool REG_A>
__global__ void chain_wgmma_wa(Data p, float* out, long long* cycles) {
  extern __shared__ __align__(1024) unsigned char sm[];
  stage(p, sm, false);
  constexpr int K = kK;
  const uint32_t base = ptx::smem_u32(sm);
  const uint32_t xh = base + kRows * K * 2, xl = xh + kTok * K * 2;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 2, t = lane & 3;
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  // (register A: the fragments of every step read from shared memory as the chain goes; their
  // loads depend on nothing, so they run ahead of the MMAs)
  auto afrag = [&](int k, uint32_t (&a)[4]) {
    const int row0 = 16 * warp + r;
    a[0] = *reinterpret_cast<const uint32_t*>(sm + tile_off(row0, k, kRows));
    a[1] = *reinterpret_cast<const uint32_t*>(sm + tile_off(row0 + 8, k, kRows));
    a[2] = *reinterpret_cast<const uint32_t*>(sm + tile_off(row0, k + 8, kRows));
    a[3] = *reinterpret_cast<const uint32_t*>(sm + tile_off(row0 + 8, k + 8, kRows));
  };
  timed_wgmma_chain(d, cycles, [&] {
#pragma unroll
    for (int pass = 0; pass < kPasses; pass++)
#pragma unroll
      for (int j = 0; j < kBlk; j++) {
        if constexpr (REG_A) {
          // A's registers stay the wgmma's until it retires: a block's eight are one commit group,
          // and the group before must retire before its registers are written again.
          uint32_t a[4][4];
#pragma unroll
          for (int s = 0; s < 4; s++) afrag(64 * j + 16 * s + 2 * t, a[s]);
          wgmma_fence();
#pragma unroll
          for (int s = 0; s < 4; s++) wg_n8_rs(d, a[s], smem_desc(xh + j * kTok * 128) + 2 * s);
#pragma unroll
          for (int s = 0; s < 4; s++) wg_n8_rs(d, a[s], smem_desc(xl + j * kTok * 128) + 2 * s);
          wgmma_commit();
          wgmma_wait<1>();
        } else {
          const uint64_t da = smem_desc(base + j * kRows * 128);
#pragma unroll
          for (int s = 0; s < 4; s++) wg_n8_ss(d, da + 2 * s, smem_desc(xh + j * kTok * 128) + 2 * s);
#pragma unroll
          for (int s = 0; s < 4; s++) wg_n8_ss(d, da + 2 * s, smem_desc(xl + j * kTok * 128) + 2 * s);
        }
      }
  });
  if (blockIdx.x == 0) store_d(out, 16 * warp + r, t, d);
}

// wgmma, x as A (m64: rows 0..7 the tokens), W's rows 0..15 as B (n16). out[64][8] as above
// (only W rows 0..15 written).
__global__ void chain_wgmma_xa(Data p, float* out, long long* cycles) {
  extern __shared__ __align__(1024) unsigned char sm[];
  stage(p, sm, true);
  constexpr int K = kK;
  const uint32_t base = ptx::smem_u32(sm);
  const uint32_t xh = base + kRows * K * 2, xl = xh + kRows * K * 2;
  float d[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  timed_wgmma_chain(d, cycles, [&] {
#pragma unroll
    for (int pass = 0; pass < kPasses; pass++)
#pragma unroll
      for (int j = 0; j < kBlk; j++) {
        const uint64_t db = smem_desc(base + j * kRows * 128);  // W rows 0..15 of block j
#pragma unroll
        for (int s = 0; s < 4; s++) wg_n16_ss(d, smem_desc(xh + j * kRows * 128) + 2 * s, db + 2 * s);
#pragma unroll
        for (int s = 0; s < 4; s++) wg_n16_ss(d, smem_desc(xl + j * kRows * 128) + 2 * s, db + 2 * s);
      }
  });
  // D[m][n]: warp w rows 16w + r (+8), n8 chunk i: d[4i + 0/1] cols 8i + 2t (+1), d[4i + 2/3] row + 8.
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, r = lane >> 2, t = lane & 3;
  if (blockIdx.x == 0 && warp == 0 && r < kTok) {  // token r (row r < 8 of warp 0)
#pragma unroll
    for (int i = 0; i < 2; i++) {
      out[(8 * i + 2 * t) * kTok + r] = d[4 * i];
      out[(8 * i + 2 * t + 1) * kTok + r] = d[4 * i + 1];
    }
  }
}

// Pure chain latency: kLat dependent instructions on constant operands, per form; cycles[blockIdx].
__global__ void latency_mma_sync(long long* cycles, float* sink) {
  uint32_t a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u}, b[2] = {0x3c003c00u, 0x3c003c00u};
  float d[4] = {0.f, 0.f, 0.f, 0.f};
  __syncwarp();
  const long long c0 = clock64();
#pragma unroll
  for (int i = 0; i < kLat; i++) ptx::mma_bf16(d, a, b[0], b[1]);
  const long long c1 = clock64();
  if (threadIdx.x == 0) cycles[blockIdx.x] = c1 - c0;
  if (d[0] == 12345.f) *sink = d[1] + d[2] + d[3];
}

template <int FORM>  // 0: n8 smem A; 1: n8 register A; 2: n16 smem A (one commit group); 3: as 0, a group per 8;
                     // 4: as 3, each group retired before the next (split_gemv v7's rhythm; run 31's
                     // figure for it was taken while this form ran the n16 instruction)
__global__ void latency_wgmma(long long* cycles, float* sink) {
  extern __shared__ __align__(1024) unsigned char sm[];
  for (int i = threadIdx.x; i < 16384 / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(sm)[i] = 0x3c003c00u;
  fence_proxy_async();
  __syncthreads();
  const uint32_t base = ptx::smem_u32(sm);
  const uint64_t da = smem_desc(base), db = smem_desc(base + 8192);
  const uint32_t a[4] = {0x3f803f80u, 0x3f803f80u, 0x3f803f80u, 0x3f803f80u};
  float d4[4] = {0.f, 0.f, 0.f, 0.f}, d[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
  fence_acc(d4);
  fence_acc(d);
  const long long c0 = clock64();
  wgmma_fence();
#pragma unroll
  for (int i = 0; i < kLat; i++) {
    if constexpr (FORM == 0 || FORM == 3 || FORM == 4) wg_n8_ss(d4, da, db);
    else if constexpr (FORM == 1) wg_n8_rs(d4, a, db);
    else wg_n16_ss(d, da, db);
    if constexpr (FORM == 1 || FORM == 3 || FORM == 4) {  // a ring kernel's rhythm: a group per 64-wide block
      if (i % 8 == 7) {
        wgmma_commit();
        if constexpr (FORM == 4) wgmma_wait<0>();
        else wgmma_wait<1>();
        wgmma_fence();
      }
    }
  }
  wgmma_commit();
  wgmma_wait<0>();
  fence_acc(d4);
  fence_acc(d);
  const long long c1 = clock64();
  if (threadIdx.x % 128 == 0) cycles[blockIdx.x] = c1 - c0;
  if (d[0] + d4[0] == 12345.f) *sink = d[1] + d[2] + d[3] + d4[1];
}

double median_cycles(std::vector<long long> c) {
  std::sort(c.begin(), c.end());
  return double(c[c.size() / 2]);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) {
    std::fprintf(stderr, "%s takes no flags (the chain's shape is fixed at compile time)\n", argv[0]);
    return 2;
  }
  const int K = kK, passes = kPasses;
  init_device(0);
  cudaDeviceProp prop;
  EPMOE_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;

  // Data: W ~ N(0, 0.02) in bf16, x ~ N(0, 1) fp32 split into bf16 hi + lo (split_pair's split).
  std::mt19937 rng(7);
  std::normal_distribution<float> nw(0.f, 0.02f), nx(0.f, 1.f);
  std::vector<uint16_t> w(size_t(kRows) * K), xh(size_t(kTok) * K), xl(size_t(kTok) * K);
  for (auto& v : w) v = f32_to_bf16(nw(rng));
  for (size_t i = 0; i < xh.size(); i++) {
    const float v = nx(rng);
    xh[i] = f32_to_bf16(v);
    xl[i] = f32_to_bf16(v - bf16_to_f32(xh[i]));
  }
  bf16 *dw, *dxh, *dxl;
  float *o_ref, *o_wa_s, *o_wa_r, *o_xa, *sink;
  long long* cyc;
  EPMOE_CUDA_CHECK(cudaMalloc(&dw, w.size() * 2));
  EPMOE_CUDA_CHECK(cudaMalloc(&dxh, xh.size() * 2));
  EPMOE_CUDA_CHECK(cudaMalloc(&dxl, xl.size() * 2));
  for (float** o : {&o_ref, &o_wa_s, &o_wa_r, &o_xa}) {
    EPMOE_CUDA_CHECK(cudaMalloc(o, kRows * kTok * sizeof(float)));
    EPMOE_CUDA_CHECK(cudaMemset(*o, 0, kRows * kTok * sizeof(float)));
  }
  EPMOE_CUDA_CHECK(cudaMalloc(&sink, 4));
  EPMOE_CUDA_CHECK(cudaMalloc(&cyc, 4 * sms * sizeof(long long)));
  EPMOE_CUDA_CHECK(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
  EPMOE_CUDA_CHECK(cudaMemcpy(dxh, xh.data(), xh.size() * 2, cudaMemcpyHostToDevice));
  EPMOE_CUDA_CHECK(cudaMemcpy(dxl, xl.data(), xl.size() * 2, cudaMemcpyHostToDevice));
  const Data p{dw, dxh, dxl};
  const int chain = kChain;

  auto cycles_of = [&](int blocks) {
    std::vector<long long> c(static_cast<size_t>(blocks));
    EPMOE_CUDA_CHECK(cudaMemcpy(c.data(), cyc, c.size() * sizeof(long long), cudaMemcpyDeviceToHost));
    return c;
  };
  const int smem_wa = (kRows + 2 * kTok) * K * 2, smem_xa = 3 * kRows * K * 2;
  EPMOE_CUDA_CHECK(cudaFuncSetAttribute(chain_wgmma_wa<false>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_wa));
  EPMOE_CUDA_CHECK(cudaFuncSetAttribute(chain_wgmma_wa<true>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_wa));
  EPMOE_CUDA_CHECK(cudaFuncSetAttribute(chain_wgmma_xa, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_xa));

  int khz = 0;
  EPMOE_CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, 0));
  std::printf("device %s, %d SMs, clock %.0f MHz (max); K %d, chain of %d dependent instructions\n", prop.name, sms,
              khz / 1e3, K, chain);
  ref_mma_sync<<<1, 128, 0, stream()>>>(p, o_ref);
  chain_wgmma_wa<false><<<1, 128, smem_wa, stream()>>>(p, o_wa_s, cyc);
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  const double wa_s = median_cycles(cycles_of(1));
  chain_wgmma_wa<true><<<1, 128, smem_wa, stream()>>>(p, o_wa_r, cyc);
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  const double wa_r = median_cycles(cycles_of(1));
  chain_wgmma_xa<<<1, 128, smem_xa, stream()>>>(p, o_xa, cyc);
  EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
  const double xa = median_cycles(cycles_of(1));
  EPMOE_CUDA_CHECK(cudaGetLastError());

  std::vector<float> ref(kRows * kTok), a(kRows * kTok), b(kRows * kTok), c(kRows * kTok);
  EPMOE_CUDA_CHECK(cudaMemcpy(ref.data(), o_ref, ref.size() * 4, cudaMemcpyDeviceToHost));
  EPMOE_CUDA_CHECK(cudaMemcpy(a.data(), o_wa_s, a.size() * 4, cudaMemcpyDeviceToHost));
  EPMOE_CUDA_CHECK(cudaMemcpy(b.data(), o_wa_r, b.size() * 4, cudaMemcpyDeviceToHost));
  EPMOE_CUDA_CHECK(cudaMemcpy(c.data(), o_xa, c.size() * 4, cudaMemcpyDeviceToHost));
  // fp64 reference of the same sum (the wiring's check: a wrong layout is far off, not a rounding)
  double worst_rel = 0;
  for (int r = 0; r < kRows; r++)
    for (int t = 0; t < kTok; t++) {
      double s = 0, mag = 0;
      for (int k = 0; k < K; k++) {
        const double wv = bf16_to_f32(w[size_t(r) * K + k]);
        const double xv = double(bf16_to_f32(xh[size_t(t) * K + k])) + bf16_to_f32(xl[size_t(t) * K + k]);
        s += wv * xv;
        mag += std::fabs(wv * xv);
      }
      s *= passes;
      mag *= passes;
      worst_rel = std::max(worst_rel, std::fabs(ref[r * kTok + t] - s) / (mag + 1e-30));
    }
  auto diff = [&](const std::vector<float>& v, int rows) {
    int n = 0;
    for (int i = 0; i < rows * kTok; i++) n += std::memcmp(&v[i], &ref[i], 4) != 0;
    return n;
  };
  std::printf("mma.sync chain against fp64: worst |error| / sum|products| %.2e\n", worst_rel);
  std::printf("bits against mma.sync: wgmma W-as-A smem %d of %d differ; W-as-A registers %d of %d; x-as-A %d of %d\n",
              diff(a, kRows), kRows * kTok, diff(b, kRows), kRows * kTok, diff(c, 16), 16 * kTok);
  std::printf("data chains, one CTA (cycles per instruction): wgmma W-as-A smem %.1f, registers %.1f, x-as-A n16 %.1f\n",
              wa_s / chain, wa_r / chain, xa / chain);

  // Latency alone, constant operands.
  const int n = kLat;
  std::printf("| form | 1 chain | one chain per SM | two per SM | four per SM |\n|---|---|---|---|---|\n");
  auto row = [&](const char* name, auto launch) {
    double v[4];
    const int blocks[4] = {1, sms, 2 * sms, 4 * sms};
    for (int i = 0; i < 4; i++) {
      launch(blocks[i]);
      EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
      launch(blocks[i]);
      EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
      v[i] = median_cycles(cycles_of(blocks[i])) / n;
    }
    std::printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", name, v[0], v[1], v[2], v[3]);
  };
  row("mma.sync m16n8k16 (a warp)", [&](int bl) { latency_mma_sync<<<bl, 32, 0, stream()>>>(cyc, sink); });
  row("wgmma m64n8k16, A smem (a warpgroup), one commit group",
      [&](int bl) { latency_wgmma<0><<<bl, 128, 16384, stream()>>>(cyc, sink); });
  row("wgmma m64n8k16, A smem, a commit group per 8 (wait 1)",
      [&](int bl) { latency_wgmma<3><<<bl, 128, 16384, stream()>>>(cyc, sink); });
  row("wgmma m64n8k16, A smem, a group per 8 retired before the next (wait 0)",
      [&](int bl) { latency_wgmma<4><<<bl, 128, 16384, stream()>>>(cyc, sink); });
  row("wgmma m64n8k16, A registers, a group per 8", [&](int bl) { latency_wgmma<1><<<bl, 128, 16384, stream()>>>(cyc, sink); });
  row("wgmma m64n16k16, A smem", [&](int bl) { latency_wgmma<2><<<bl, 128, 16384, stream()>>>(cyc, sink); });
  EPMOE_CUDA_CHECK(cudaGetLastError());
  std::printf("(cycles per dependent instruction, median over CTAs; clock64 of the SM)\n");
  return 0;
}
