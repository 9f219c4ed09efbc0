// The bf16 grouped GEMM on Hopper's warpgroup MMAs (wgmma.mma_async, sm_90a), for groups of many
// rows: the same contract as gemm.cu's mma.sync kernel (gather, scatter, tile lists, Store + bias,
// SwiGLU, b_k_twice) and the same bits.
//
// Why the bits match: an output element is a single fp32 accumulator chain over k16 steps in
// ascending k, exactly as in the mma.sync kernel, and one wgmma m64nNk16 step rounds like one
// mma.sync m16n8k16 step (measured on the H200: 0 of 81,920 elements differ over K = 2048). So
// neither the tile shape nor the instruction changes a result, which is what lets gemm() pick the
// kernel from the row count (batch invariance). No split-K, no reordering of k.
//
// Design: a CTA is WGS warpgroups (BM = 64 * WGS rows) and one N-tile of 128 columns, each
// warpgroup one m64n128k16 accumulator in registers, two CTAs per SM. Every thread copies A
// (gathered rows) and B into a ring of STAGES shared-memory stages with cp.async; a stage is
// stored in the 128-byte swizzle K-major layout that wgmma reads directly (the swz() layout of
// the mma.sync kernel, every tile 1024-byte aligned). The MMAs of k-tile kt are left running
// (wgmma.wait_group 1) while the stage of kt - 1, retired by both warpgroups (a barrier), is
// refilled with k-tile kt + STAGES - 1.
#include "kernels/cuda/gemm_wgmma.cuh"

#include <algorithm>
#include <climits>
#include <string>

#include "kernels/cuda/mma_ptx.cuh"

namespace epmoe::cuda {

namespace {

using ptx::cp_async16;
using ptx::cp_async_commit;
using ptx::cp_async_wait;
using ptx::group_range;
using ptx::smem_u32;

__device__ inline int swz(int r, int c) { return r * 64 + ((c ^ (r & 7)) << 3); }

// The shared-memory matrix descriptor of a K-major tile in the 128-byte swizzle layout starting at
// addr (1024-byte aligned): 8-row groups 1024 bytes apart (SBO), LBO unused by this layout (1).
// The start address moves by 32 bytes (+2) per k16 step inside the 64-wide k-tile.
__device__ inline uint64_t smem_desc(uint32_t addr) {
  return uint64_t((addr & 0x3FFFF) >> 4) | (uint64_t(1) << 16) | (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>
__device__ inline void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// cp.async writes through the generic proxy, wgmma reads through the async proxy.
__device__ inline void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Keeps the compiler from moving accumulator accesses across an MMA still in flight.
template <int R>
__device__ inline void fence_acc(float (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}

// D += A B^T over one k16 step, D 64 x 128 fp32 (scale-d 1: accumulate), A and B from shared memory.
__device__ inline void wgmma_m64n128(float (&d)[64], uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
      "}, %64, %65, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db));
}

// The epilogue of gemm.cu's store_pair, float op for float op (the bits of C must match).
template <class TC, bool SWIGLU>
__device__ inline void store_pair(const GemmArgs& p, int64_t orow, int col, float v0, float v1) {
  TC* C = static_cast<TC*>(p.C);
  if constexpr (SWIGLU) {
    if (col + 1 < p.N) C[orow * p.ldc + col / 2] = from_f32<TC>(ptx::silu(v0) * v1);
  } else {
    if (p.bias) {
      if (col < p.N) v0 += p.bias[col];
      if (col + 1 < p.N) v1 += p.bias[col + 1];
    }
    if (col < p.N) C[orow * p.ldc + col] = from_f32<TC>(v0);
    if (col + 1 < p.N) C[orow * p.ldc + col + 1] = from_f32<TC>(v1);
  }
}

template <int WGS_, int STAGES_>
struct WgCfg {
  static constexpr int WGS = WGS_, BM = 64 * WGS_, BN = 128, BK = 64, STAGES = STAGES_;
  static constexpr int NT = 128 * WGS;
  static constexpr int PASS = NT / 8;  // rows one pass of every thread's 16-byte chunk covers
  static constexpr int A_CH = BM / PASS, B_CH = BN / PASS;
  static constexpr int A_BYTES = BM * BK * 2, STAGE_BYTES = (BM + BN) * BK * 2;
  static constexpr int SMEM = STAGES * STAGE_BYTES + 1024;  // + the alignment of the first stage
  static_assert(STAGES >= 2 && PASS % 8 == 0 && A_BYTES % 1024 == 0 && STAGE_BYTES % 1024 == 0, "config");
  static_assert(2 * SMEM <= 227 * 1024, "two CTAs per SM");
};

// Two CTAs per SM (<= 128 registers a thread at 8 warps): one CTA's prologue, barrier waits and
// epilogue run while the other's MMAs keep the tensor cores busy.
template <class Cfg, class TC, bool SWIGLU>
__global__ void __launch_bounds__(Cfg::NT, 2) wgmma_gemm_kernel(const GemmArgs p) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES, PASS = Cfg::PASS;
  constexpr int A_CH = Cfg::A_CH, B_CH = Cfg::B_CH;
  // The plan (tiles, offsets, rows) and A come from earlier kernels: wait before touching them,
  // and only then let the next kernel start -- a GEMM after this one with plan_precedes_a reads
  // the plan before its own wait (gemm.cuh).
  pdl_wait();
  pdl_trigger();

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023) & ~1023u;
  unsigned char* smem = smem_raw + (base - raw);

  int group, m_first, m_end, m_step;
  if (p.tiles) {  // exactly one m-tile
    if (int(blockIdx.y) >= *p.num_tiles) return;
    group = p.tiles[2 * blockIdx.y];
    m_first = p.tiles[2 * blockIdx.y + 1] / BM;
    m_end = m_first + 1;
    m_step = 1;
  } else {        // m-tiles blockIdx.z, + gridDim.z, ...
    group = blockIdx.y;
    m_first = blockIdx.z;
    m_end = INT_MAX;
    m_step = int(gridDim.z);
  }
  int row_begin, rows;
  group_range(p, group, row_begin, rows);
  if (m_first * BM >= rows) return;
  const int n0 = blockIdx.x * BN;
  const int K = p.K, KT = (K + BK - 1) / BK;
  const bf16* A = static_cast<const bf16*>(p.A);
  const bf16* B = static_cast<const bf16*>(p.B) + int64_t(group) * p.b_group_stride;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2;

  // Thread tid copies chunk c of rows r0, r0 + PASS, ...: one swizzled offset serves them all.
  const int r0 = tid >> 3, c = tid & 7, s_off = swz(r0, c);
  const bf16* b_row = B + int64_t(n0 + r0) * p.ldb + c * 8;
  const int64_t b_pass = int64_t(PASS) * p.ldb;
  const uint64_t desc_a = smem_desc(base + uint32_t(wg) * 64 * BK * 2), desc_b = smem_desc(base + Cfg::A_BYTES);

  for (int mt = m_first; mt < m_end && mt * BM < rows; mt += m_step) {
    const int m0 = mt * BM;
    const bf16* a_src[A_CH];
    bool a_ok[A_CH];
#pragma unroll
    for (int i = 0; i < A_CH; i++) {
      a_ok[i] = m0 + r0 + i * PASS < rows;
      int src = row_begin + m0 + r0 + i * PASS;
      if (a_ok[i] && p.a_rows) src = p.a_rows[src];
      a_src[i] = A + int64_t(a_ok[i] ? src : 0) * p.lda + c * 8;
    }
    auto load_stage = [&](int stage, int kt) {
      const int k0 = kt * BK;
      const int kb = p.b_k_twice ? (kt >> 1) * BK : k0;
      const bool k_ok = k0 + c * 8 < K;
      bf16* sa = reinterpret_cast<bf16*>(smem + stage * Cfg::STAGE_BYTES) + s_off;
      bf16* sb = reinterpret_cast<bf16*>(smem + stage * Cfg::STAGE_BYTES + Cfg::A_BYTES) + s_off;
#pragma unroll
      for (int i = 0; i < A_CH; i++) {
        const bool ok = a_ok[i] && k_ok;
        cp_async16(sa + i * PASS * BK, ok ? a_src[i] + k0 : A, ok ? 16 : 0);
      }
#pragma unroll
      for (int i = 0; i < B_CH; i++) {
        const bool ok = n0 + r0 + i * PASS < p.N && k_ok;
        cp_async16(sb + i * PASS * BK, ok ? b_row + i * b_pass + kb : B, ok ? 16 : 0);
      }
    };

    // (A warpgroup whose rows all lie past the group's end multiplies zeros: wgmma under a
    // thread-dependent branch is serialized by ptxas, and an alternative CTA-uniform path that
    // splits the columns between the warpgroups measured slower.)
    float acc[BN / 2];
#pragma unroll
    for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;

#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
      if (s < KT) load_stage(s, s);
      cp_async_commit();
    }
    for (int kt = 0; kt < KT; kt++) {
      cp_async_wait<STAGES - 2>();  // this thread's copies of k-tile kt have landed
      fence_proxy_async();
      __syncthreads();              // and everyone's
      const uint64_t st = uint64_t((kt % STAGES) * Cfg::STAGE_BYTES) >> 4;
      fence_acc(acc);
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < BK / 16; ks++) wgmma_m64n128(acc, desc_a + st + 2 * ks, desc_b + st + 2 * ks);
      wgmma_commit();
      wgmma_wait<1>();
      fence_acc(acc);
      // Every warpgroup has retired the MMAs of k-tile kt - 1: its stage is refilled while
      // those of kt run.
      __syncthreads();
      if (kt + STAGES - 1 < KT) load_stage((kt + STAGES - 1) % STAGES, kt + STAGES - 1);
      cp_async_commit();
    }
    wgmma_wait<0>();
    fence_acc(acc);
    cp_async_wait<0>();
    __syncthreads();  // the next m-tile's copies overwrite these stages

    // Warp w of the warpgroup holds rows 16w + lane / 4 (+ 8) of its 64; per n8 block j the
    // columns 8j + 2 (lane % 4) + {0, 1}: acc[4j + {0, 1}] on the first row, acc[4j + {2, 3}] on the second.
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int lr = wg * 64 + (warp & 3) * 16 + (lane >> 2) + h * 8;
      if (m0 + lr >= rows) continue;
      const int r = row_begin + m0 + lr;
      const int64_t orow = p.c_rows ? p.c_rows[r] : r;
#pragma unroll
      for (int j = 0; j < BN / 8; j++)
        store_pair<TC, SWIGLU>(p, orow, n0 + 8 * j + 2 * (lane & 3), acc[4 * j + 2 * h], acc[4 * j + 2 * h + 1]);
    }
  }
}

template <class Cfg, class TC>
void launch_wgmma(const GemmArgs& a, Epilogue ep, cudaStream_t stream) {
  const int per_group = a.offsets ? std::max(a.rows_hint, 1) : a.M;
  dim3 grid(ceil_div(a.N, Cfg::BN), a.G, std::max(1, std::min(ceil_div(per_group, Cfg::BM), 65535)));
  if (a.tiles) {
    EPMOE_ASSERT(a.max_tiles <= 65535, "gemm: too many tiles");
    grid = dim3(ceil_div(a.N, Cfg::BN), std::max(1, a.max_tiles), 1);
  }
  static const bool ready = [] {
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(wgmma_gemm_kernel<Cfg, TC, true>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM));
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(wgmma_gemm_kernel<Cfg, TC, false>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM));
    return true;
  }();
  (void)ready;
  if (ep == Epilogue::SwiGLU) launch_pdl(wgmma_gemm_kernel<Cfg, TC, true>, grid, dim3(Cfg::NT), Cfg::SMEM, stream, a);
  else launch_pdl(wgmma_gemm_kernel<Cfg, TC, false>, grid, dim3(Cfg::NT), Cfg::SMEM, stream, a);
}

// Measured in the MoE layer (docs/gpu.md): 64-row tiles from 12 to 48 rows per group, 128-row
// tiles above; 128 x 256 tiles at one CTA per SM were slower at every size.
using Narrow = WgCfg<1, 4>;  // 64 x 128, 4 stages
using Wide = WgCfg<2, 3>;    // 128 x 128, 3 stages

}  // namespace

int wgmma_tile_m(int rows) { return rows < 12 ? 0 : rows <= 48 ? Narrow::BM : Wide::BM; }

template <class TC>
void gemm_wgmma(const GemmArgs& a, Epilogue ep, int rows, cudaStream_t stream) {
  EPMOE_ASSERT(wgmma_tile_m(rows) > 0, "gemm_wgmma: no wgmma tile for " + std::to_string(rows) + " rows");
  if (wgmma_tile_m(rows) == Narrow::BM) launch_wgmma<Narrow, TC>(a, ep, stream);
  else launch_wgmma<Wide, TC>(a, ep, stream);
}

template void gemm_wgmma<bf16>(const GemmArgs&, Epilogue, int, cudaStream_t);
template void gemm_wgmma<float>(const GemmArgs&, Epilogue, int, cudaStream_t);

}  // namespace epmoe::cuda
