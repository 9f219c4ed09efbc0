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
// Design: a persistent, warp-specialised kernel (one CTA per SM looping over (m-tile, N-tile)
// work items). One producer warpgroup feeds a ring of STAGES shared-memory stages: B (weights) by
// TMA, A (gathered rows) by its threads' cp.async; CWG consumer warpgroups, 64 rows each, run
// wgmma on the stages straight from shared memory (the 128-byte swizzle K-major layout, which is
// the swz() layout of the mma.sync kernel). Full/empty mbarriers per stage replace the block
// barriers, and the producer runs ahead across work items, so the next tile's loads are in
// flight during the current tile's epilogue.
#include "kernels/cuda/gemm_wgmma.cuh"

#include <algorithm>
#include <climits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "kernels/cuda/mma_ptx.cuh"
#include "kernels/cuda/wgmma_ptx.cuh"

namespace epmoe::cuda {

namespace {

using ptx::fence_acc;
using ptx::fence_proxy_async;
using ptx::group_range;
using ptx::mbar_arrive;
using ptx::mbar_arrive_tx;
using ptx::mbar_init;
using ptx::mbar_wait;
using ptx::smem_desc;
using ptx::smem_u32;
using ptx::store_pair;  // the mma.sync kernel's epilogue: the bits of C must match
using ptx::swz;
using ptx::wgmma_commit;
using ptx::wgmma_fence;
using ptx::wgmma_wait;

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


// ---------------------------------------------------------------------------------------------
// Warp-specialised persistent kernel: one producer warpgroup feeds a ring of STAGES shared-memory
// stages, CWG consumer warpgroups (64 rows each) run wgmma on them.
//
// Why: with every thread both copying and multiplying (the kernel this replaced), each k-tile
// cost two block barriers and a CTA's pipeline fill and epilogue left the tensor cores idle
// unless a second CTA per SM covered them. Here the producer waits only for a stage to be retired
// (an mbarrier the consumers arrive on) and runs ahead across work items. B (weights, a plain
// strided tensor) comes by TMA in 128-byte swizzle -- the same layout swz() writes; A rows are
// gathered (a_rows), which a tiled TMA cannot express, so the producer's threads copy them with
// cp.async and let each copy arrive on the stage's barrier when it lands
// (cp.async.mbarrier.arrive.noinc); the consumers fence the generic-proxy copies for the async
// proxy that wgmma reads through.

// Arrives on bar once every cp.async this thread issued before has landed; the arrival is part of
// the barrier's initial count (noinc).
__device__ inline void cp_async_mbar_arrive(uint32_t bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(bar) : "memory");
}
// One box of the 3D tensor map (k, n, group) into shared memory; completes bytes on bar.
__device__ inline void tma_load_3d(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];\n"
      ::"r"(dst), "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
      : "memory");
}
template <int R>
__device__ inline void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(R));
}
template <int R>
__device__ inline void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(R));
}

__device__ inline void wgmma_m64n256(float (&d)[128], uint64_t da, uint64_t db) {
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {"
      "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, "
      "%64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, %79, "
      "%80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, "
      "%96, %97, %98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, "
      "%112, %113, %114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
      "}, %128, %129, 1, 1, 1, 0, 0;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
        "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
        "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
        "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
        "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
        "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]),
        "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
        "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]),
        "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]),
        "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
        "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]),
        "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]),
        "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
        "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
      : "l"(da), "l"(db));
}

template <int BN>
__device__ inline void wgmma_tile(float (&d)[BN / 2], uint64_t da, uint64_t db) {
  if constexpr (BN == 256) wgmma_m64n256(d, da, db);
  else wgmma_m64n128(d, da, db);
}

template <int CWG_, int BN_, int STAGES_>
struct WsCfg {
  static constexpr int CWG = CWG_, BM = 64 * CWG_, BN = BN_, BK = 64, STAGES = STAGES_;
  static constexpr int NT = 128 * (CWG + 1);
  static constexpr int A_CH = BM / 16;  // the producer's 128 threads cover 16 rows per pass
  static constexpr int A_BYTES = BM * BK * 2, B_BYTES = BN * BK * 2, STAGE_BYTES = A_BYTES + B_BYTES;
  static constexpr int SMEM = STAGES * STAGE_BYTES + 1024 + 2 * STAGES * 8;  // + alignment + barriers
  static_assert(BN == 128 || BN == 256, "wgmma n");
  static_assert(SMEM <= 227 * 1024, "shared memory");
};

// Per-launch values the host works out besides GemmArgs.
struct WsArgs {
  int zdim;       // without a tile list: m-tile slots per group (each loops with this step)
  int b_grouped;  // the tensor map's third coordinate is the group (else 0: one weight matrix)
};

// Work item i: N-tile i % ntn of m-tile i / ntn (tile list), or of slot (group, z) without one.
struct WsWork {
  int group, m_first, m_end, m_step, n0;
};
template <int BM, int BN>
__device__ inline WsWork ws_work(const GemmArgs& p, const WsArgs& w, int item, int ntn) {
  WsWork r;
  const int t = item / ntn;
  r.n0 = (item - t * ntn) * BN;
  if (p.tiles) {
    r.group = p.tiles[2 * t];
    r.m_first = p.tiles[2 * t + 1] / BM;
    r.m_end = r.m_first + 1;
    r.m_step = 1;
  } else {
    r.group = t / w.zdim;
    r.m_first = t - r.group * w.zdim;
    r.m_end = INT_MAX;
    r.m_step = w.zdim;
  }
  return r;
}

template <class Cfg, class TC, bool SWIGLU>
__global__ void __launch_bounds__(Cfg::NT, 1)
    wgmma_ws_kernel(const GemmArgs p, const __grid_constant__ CUtensorMap b_map, const WsArgs w) {
  constexpr int BM = Cfg::BM, BN = Cfg::BN, BK = Cfg::BK, STAGES = Cfg::STAGES, A_CH = Cfg::A_CH;
  // Without plan_precedes_a the plan may still be being written: wait before reading it, and only
  // then let the next kernel start (a GEMM after this one with plan_precedes_a reads the plan
  // before its own wait, gemm.cuh). With it, the producer requests the first tile's B stages
  // before waiting for A.
  if (!p.plan_precedes_a) pdl_wait();
  pdl_trigger();

  extern __shared__ unsigned char smem_raw[];
  const uint32_t raw = smem_u32(smem_raw), base = (raw + 1023) & ~1023u;
  const uint32_t bars = base + STAGES * Cfg::STAGE_BYTES;  // full[STAGES], then empty[STAGES]
  auto full = [&](int s) { return bars + 8 * s; };
  auto empty = [&](int s) { return bars + 8 * (STAGES + s); };
  const int tid = threadIdx.x, wg = tid >> 7;
  if (tid == 0) {
    for (int s = 0; s < STAGES; s++) {
      mbar_init(full(s), 128 + 1);  // the producer's cp.async arrivals + the TMA's expect_tx
      mbar_init(empty(s), Cfg::CWG);  // one arrival per consumer warpgroup
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  }
  __syncthreads();

  const int ntn = (p.N + BN - 1) / BN;
  const int K = p.K, KT = (K + BK - 1) / BK;

  if (wg == 0) {
    // Producer warpgroup: few registers, the rest go to the consumers.
    if constexpr (Cfg::CWG > 1) setmaxnreg_dec<56>();
    const bf16* A = static_cast<const bf16*>(p.A);
    const int r0 = tid >> 3, c = tid & 7, s_off = swz(r0, c) * 2;
    int prefetched = 0;  // B stages of the first tile already requested before pdl_wait
    if (p.plan_precedes_a) {
      if (tid == 0 && int(blockIdx.x) < (p.tiles ? *p.num_tiles * ntn : p.G * w.zdim * ntn)) {
        const WsWork wk = ws_work<BM, BN>(p, w, blockIdx.x, ntn);
        int rb, rows;
        group_range(p, wk.group, rb, rows);
        if (wk.m_first * BM < rows) prefetched = KT < STAGES ? KT : STAGES;
        for (int kt = 0; kt < prefetched; kt++) {
          const int kb = p.b_k_twice ? (kt >> 1) * BK : kt * BK;
          mbar_arrive_tx(full(kt), Cfg::B_BYTES);
          tma_load_3d(base + kt * Cfg::STAGE_BYTES + Cfg::A_BYTES, &b_map, kb, wk.n0, w.b_grouped ? wk.group : 0,
                      full(kt));
        }
      }
      pdl_wait();
    }
    const int n_items = p.tiles ? *p.num_tiles * ntn : p.G * w.zdim * ntn;
    int it = 0;
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
      const WsWork wk = ws_work<BM, BN>(p, w, item, ntn);
      int row_begin, rows;
      group_range(p, wk.group, row_begin, rows);
      for (int mt = wk.m_first; mt < wk.m_end && mt * BM < rows; mt += wk.m_step) {
        const int m0 = mt * BM;
        const bf16* a_src[A_CH];
        bool a_ok[A_CH];
#pragma unroll
        for (int i = 0; i < A_CH; i++) {
          a_ok[i] = m0 + r0 + 16 * i < rows;
          int src = row_begin + m0 + r0 + 16 * i;
          if (a_ok[i] && p.a_rows) src = p.a_rows[src];
          a_src[i] = A + int64_t(a_ok[i] ? src : 0) * p.lda + c * 8;
        }
        for (int kt = 0; kt < KT; kt++, it++) {
          const int s = it % STAGES;
          mbar_wait(empty(s), ((it / STAGES) & 1) ^ 1);
          const uint32_t st = base + s * Cfg::STAGE_BYTES;
          if (tid == 0 && it >= prefetched) {
            const int kb = p.b_k_twice ? (kt >> 1) * BK : kt * BK;
            mbar_arrive_tx(full(s), Cfg::B_BYTES);
            tma_load_3d(st + Cfg::A_BYTES, &b_map, kb, wk.n0, w.b_grouped ? wk.group : 0, full(s));
          }
          const int k0 = kt * BK;
          const bool k_ok = k0 + c * 8 < K;
#pragma unroll
          for (int i = 0; i < A_CH; i++) {
            const bool ok = a_ok[i] && k_ok;
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(st + s_off + i * 16 * BK * 2),
                         "l"(ok ? a_src[i] + k0 : A), "r"(ok ? 16 : 0));
          }
          cp_async_mbar_arrive(full(s));
        }
      }
    }
    // (Exiting with copies in flight is fine: the consumers wait for them before the CTA ends.)
  } else {
    if constexpr (Cfg::CWG > 1) setmaxnreg_inc<224>();
    if (p.plan_precedes_a) pdl_wait();  // the epilogue reads c_rows and writes C
    const int ct = tid - 128, cw = wg - 1, warp = ct >> 5, lane = tid & 31;
    TC* C = static_cast<TC*>(p.C);
    // Pairs of columns as one 8-byte (fp32) or 4-byte (bf16) store where C's rows allow it.
    const bool vec = !SWIGLU && (p.ldc % 2 == 0) && (reinterpret_cast<uintptr_t>(C) % (2 * sizeof(TC)) == 0);
    const uint64_t desc_a = smem_desc(base + uint32_t(cw) * 64 * BK * 2), desc_b = smem_desc(base + Cfg::A_BYTES);
    const int n_items = p.tiles ? *p.num_tiles * ntn : p.G * w.zdim * ntn;
    int it = 0;
    for (int item = blockIdx.x; item < n_items; item += gridDim.x) {
      const WsWork wk = ws_work<BM, BN>(p, w, item, ntn);
      int row_begin, rows;
      group_range(p, wk.group, row_begin, rows);
      for (int mt = wk.m_first; mt < wk.m_end && mt * BM < rows; mt += wk.m_step) {
        const int m0 = mt * BM;
        float acc[BN / 2];
#pragma unroll
        for (int i = 0; i < BN / 2; i++) acc[i] = 0.f;
        int prev = -1;
        for (int kt = 0; kt < KT; kt++, it++) {
          const int s = it % STAGES;
          mbar_wait(full(s), (it / STAGES) & 1);
          fence_proxy_async();  // the cp.async (generic proxy) copies of A, seen by wgmma
          const uint64_t st = uint64_t(s * Cfg::STAGE_BYTES) >> 4;
          fence_acc(acc);
          wgmma_fence();
#pragma unroll
          for (int ks = 0; ks < BK / 16; ks++) wgmma_tile<BN>(acc, desc_a + st + 2 * ks, desc_b + st + 2 * ks);
          wgmma_commit();
          wgmma_wait<1>();
          fence_acc(acc);
          // The MMAs of the previous k-tile have retired: its stage goes back to the producer.
          if (prev >= 0 && ct % 128 == 0) mbar_arrive(empty(prev));
          prev = s;
        }
        wgmma_wait<0>();
        fence_acc(acc);
        if (prev >= 0 && ct % 128 == 0) mbar_arrive(empty(prev));

        // Warp w of the warpgroup holds rows 16w + lane / 4 (+ 8) of its 64; per n8 block j the
        // columns 8j + 2 (lane % 4) + {0, 1}: acc[4j + {0, 1}] on the first row, acc[4j + {2, 3}] on the second.
#pragma unroll
        for (int h = 0; h < 2; h++) {
          const int lr = cw * 64 + (warp & 3) * 16 + (lane >> 2) + h * 8;
          if (m0 + lr >= rows) continue;
          const int r = row_begin + m0 + lr;
          const int64_t orow = p.c_rows ? p.c_rows[r] : r;
#pragma unroll
          for (int j = 0; j < BN / 8; j++) {
            const int col = wk.n0 + 8 * j + 2 * (lane & 3);
            float v0 = acc[4 * j + 2 * h], v1 = acc[4 * j + 2 * h + 1];
            if (vec && col + 1 < p.N) {
              if (p.bias) v0 += p.bias[col], v1 += p.bias[col + 1];
              if constexpr (std::is_same_v<TC, float>) {
                float2* c2 = reinterpret_cast<float2*>(C + orow * p.ldc + col);
                if (p.accumulate) {  // (store_pair's arithmetic: C + v)
                  const float2 o = *c2;
                  v0 = o.x + v0, v1 = o.y + v1;
                }
                *c2 = make_float2(v0, v1);
              } else {
                *reinterpret_cast<__nv_bfloat162*>(C + orow * p.ldc + col) =
                    __halves2bfloat162(from_f32<bf16>(v0), from_f32<bf16>(v1));
              }
            } else {
              store_pair<TC, SWIGLU>(p, orow, col, v0, v1);
            }
          }
        }
      }
    }
  }
}

// The TMA descriptor of B as a (k, n, group) tensor, box 64 x BN x 1 in 128-byte swizzle.
// Encoding is host-only work, but the same weights come back every layer: a few recent maps are
// kept per thread.
struct BMapKey {
  const void* B;
  int64_t ldb, stride;
  int N, Kb, G, BN;
  bool operator==(const BMapKey& o) const {
    return B == o.B && ldb == o.ldb && stride == o.stride && N == o.N && Kb == o.Kb && G == o.G && BN == o.BN;
  }
};

PFN_cuTensorMapEncodeTiled_v12000 encode_fn() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    EPMOE_CUDA_CHECK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault, &q));
    EPMOE_ASSERT(f && q == cudaDriverEntryPointSuccess, "gemm_wgmma: no cuTensorMapEncodeTiled in the driver");
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
  }();
  return fn;
}

CUtensorMap b_tensor_map(const GemmArgs& a, int BN, bool grouped) {
  const BMapKey key{a.B, a.ldb, grouped ? a.b_group_stride : 0, a.N, a.b_k_twice ? a.K / 2 : a.K, grouped ? a.G : 1, BN};
  thread_local std::vector<std::pair<BMapKey, CUtensorMap>> cache;
  for (auto& e : cache)
    if (e.first == key) return e.second;
  const cuuint64_t dims[3] = {cuuint64_t(key.Kb), cuuint64_t(key.N), cuuint64_t(key.G)};
  // Bytes between n rows and between groups (one group: any stride past the matrix).
  const cuuint64_t strides[2] = {cuuint64_t(key.ldb) * 2,
                                 cuuint64_t(grouped ? key.stride : key.ldb * int64_t(key.N)) * 2};
  const cuuint32_t box[3] = {64, cuuint32_t(BN), 1}, estride[3] = {1, 1, 1};
  CUtensorMap map;
  const CUresult r = encode_fn()(&map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<void*>(a.B), dims, strides, box,
                                 estride, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                                 CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  EPMOE_ASSERT(r == CUDA_SUCCESS, "gemm_wgmma: cuTensorMapEncodeTiled failed (" + std::to_string(int(r)) + ")");
  if (cache.size() >= 64) cache.erase(cache.begin());
  cache.emplace_back(key, map);
  return map;
}

template <class Cfg, class TC>
void launch_ws(const GemmArgs& a, Epilogue ep, cudaStream_t stream) {
  const int per_group = a.offsets ? std::max(a.rows_hint, 1) : a.M;
  const int ntn = ceil_div(a.N, Cfg::BN);
  WsArgs w;
  w.zdim = std::max(1, std::min(ceil_div(per_group, Cfg::BM), 65535));
  const bool grouped = a.G > 1 && a.b_group_stride != 0;
  w.b_grouped = grouped ? 1 : 0;
  const int64_t items = int64_t(ntn) * (a.tiles ? std::max(1, a.max_tiles) : int64_t(a.G) * w.zdim);
  EPMOE_ASSERT(items < INT_MAX, "gemm_wgmma: too many work items");
  const CUtensorMap map = b_tensor_map(a, Cfg::BN, grouped);
  const dim3 grid(unsigned(std::min<int64_t>(items, sm_count())));
  static const bool ready = [] {
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(wgmma_ws_kernel<Cfg, TC, true>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM));
    EPMOE_CUDA_CHECK(cudaFuncSetAttribute(wgmma_ws_kernel<Cfg, TC, false>,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize, Cfg::SMEM));
    return true;
  }();
  (void)ready;
  if (ep == Epilogue::SwiGLU)
    launch_pdl(wgmma_ws_kernel<Cfg, TC, true>, grid, dim3(Cfg::NT), Cfg::SMEM, stream, a, map, w);
  else launch_pdl(wgmma_ws_kernel<Cfg, TC, false>, grid, dim3(Cfg::NT), Cfg::SMEM, stream, a, map, w);
}

// Measured in the MoE layer (docs/gpu.md, "The wgmma kernel").
using Narrow = WsCfg<1, 128, 8>;  // 64 x 128: groups of 12..48 rows
using Mid = WsCfg<2, 128, 6>;     // 128 x 128: up to 64 rows with few k-tiles
using Wide = WsCfg<2, 256, 4>;    // 128 x 256

}  // namespace

int wgmma_tile_m(int rows) { return rows < 12 ? 0 : rows <= 48 ? Narrow::BM : Wide::BM; }

template <class TC>
void gemm_wgmma(const GemmArgs& a, Epilogue ep, int rows, cudaStream_t stream) {
  EPMOE_ASSERT(wgmma_tile_m(rows) > 0, "gemm_wgmma: no wgmma tile for " + std::to_string(rows) + " rows");
  // About one half-filled 128-row tile per group and few k-tiles (the down projection at 64 rows
  // per expert): 128-wide N-tiles give twice the work items and half the epilogue per item, which
  // measured faster; with K = 2048 (gate+up) or more rows the 256-wide tile is.
  if (wgmma_tile_m(rows) == Narrow::BM) launch_ws<Narrow, TC>(a, ep, stream);
  else if (rows <= 64 && a.K <= 1024) launch_ws<Mid, TC>(a, ep, stream);
  else launch_ws<Wide, TC>(a, ep, stream);
}

template void gemm_wgmma<bf16>(const GemmArgs&, Epilogue, int, cudaStream_t);
template void gemm_wgmma<float>(const GemmArgs&, Epilogue, int, cudaStream_t);

}  // namespace epmoe::cuda
