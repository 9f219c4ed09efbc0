// Internal to the CUDA GEMMs: the pieces the tensor-core kernels share (gemm.cu's bf16 kernel,
// gemm_wgmma.cu, gemm_fp8.cu's e4m3 kernel, moe/cuda/router.cu): asynchronous copies into shared
// memory, ldmatrix, the bf16 MMA step, the swizzled tile layout, the one mma.sync main loop (the
// cp.async pipeline over k-tiles and a warp's MMAs over one tile), the epilogue pair and the row
// range of a GEMM group, the mbarrier and bulk-copy instructions (gemm_wgmma.cu's pipeline,
// split_gemv's ring). Written once so that the kernels stage tiles alike and, where they must,
// compute the same bits.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/gemm.cuh"

namespace epmoe::cuda::ptx {

__device__ inline uint32_t smem_u32(const void* p) { return uint32_t(__cvta_generic_to_shared(p)); }

// 16 (or 4) bytes global -> shared, the bytes past src_bytes zero-filled (rows past the end).
__device__ inline void cp_async16(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_bytes));
}
__device__ inline void cp_async4(void* smem, const void* gmem, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem), "r"(src_bytes));
}
__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ inline void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// Four 8x8 matrices of 16-bit elements (8 rows of 16 bytes each) from shared memory: the A and B
// fragments of m16n8k16 bf16, and byte for byte those of m16n8k32 e4m3.
__device__ inline void ldmatrix_x4(uint32_t (&r)[4], const void* smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(smem)));
}

__device__ inline float silu(float g) { return g / (1.0f + expf(-g)); }

// D += A B (m16n8k16, bf16 in, fp32 accumulate): the step every bf16 tensor-core chain is made of.
__device__ inline void mma_bf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Shared-memory tiles of 64 bf16 per row (128 bytes = 8 chunks of 16): chunk c of row r is stored
// at chunk c ^ (r & 7), so the 8 rows an ldmatrix phase reads hit 8 different bank groups; with
// 1024-byte-aligned tiles this is also TMA's and wgmma's 128-byte-swizzle K-major layout.
__device__ inline int swz(int r, int c) { return r * 64 + ((c ^ (r & 7)) << 3); }

// The epilogue pair of columns (col even) of output row orow: SwiGLU (B rows interleaved gate,
// up: C[orow, col / 2] = silu(gate) * up) or Store (+ bias; with accumulate, C += it). One
// definition for the mma.sync, decode and wgmma kernels: their C must have the same bits.
template <class TC, bool SWIGLU>
__device__ inline void store_pair(const GemmArgs& p, int64_t orow, int col, float v0, float v1) {
  TC* C = static_cast<TC*>(p.C);
  if constexpr (SWIGLU) {
    // col is even: (gate, up) of output column col / 2.
    if (col + 1 < p.N) C[orow * p.ldc + col / 2] = from_f32<TC>(ptx::silu(v0) * v1);
  } else {
    if (p.bias) {
      if (col < p.N) v0 += p.bias[col];
      if (col + 1 < p.N) v1 += p.bias[col + 1];
    }
    if constexpr (std::is_same_v<TC, float>) {
      if (p.accumulate) {  // (add_inplace's x[i] += y[i])
        if (col < p.N) v0 = C[orow * p.ldc + col] + v0;
        if (col + 1 < p.N) v1 = C[orow * p.ldc + col + 1] + v1;
      }
    }
    if (col < p.N) C[orow * p.ldc + col] = from_f32<TC>(v0);
    if (col + 1 < p.N) C[orow * p.ldc + col + 1] = from_f32<TC>(v1);
  }
}

// ---- The mma.sync main loop (gemm.cu, gemm_fp8.cu, router.cu) ----

// An MI x NI warp tile of m16n8 fp32 accumulators, zeroed.
template <int MI, int NI>
__device__ inline void zero_tile(float (&acc)[MI][NI][4]) {
#pragma unroll
  for (int i = 0; i < MI; i++)
#pragma unroll
    for (int j = 0; j < NI; j++)
#pragma unroll
      for (int q = 0; q < 4; q++) acc[i][j][q] = 0.f;
}

// The cp.async pipeline over KT k-tiles in STAGES shared-memory stages: `first(stage)` requests
// k-tile `stage` of the first STAGES - 1 (the caller's prologue: some kernels have part of it in
// flight already), one commit group each; then for every k-tile its stage is waited for, the tile
// STAGES - 1 ahead is requested by `load(stage, kt)` (every thread's copies of it, one group), and
// `compute(stage, kt)` runs on the waited one. The caller waits for the last (empty) groups.
template <int STAGES, class First, class Load, class Compute>
__device__ inline void cp_async_mainloop(int KT, First&& first, Load&& load, Compute&& compute) {
#pragma unroll
  for (int s = 0; s < STAGES - 1; s++) {
    if (s < KT) first(s);
    cp_async_commit();
  }
  for (int kt = 0; kt < KT; kt++) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();
    const int nk = kt + STAGES - 1;
    if (nk < KT) load(nk % STAGES, nk);
    cp_async_commit();
    compute(kt % STAGES, kt);
  }
}

// One warp's MMAs over one k-tile in shared memory: KSTEPS steps of 32 bytes of k (16 bf16 or 32
// e4m3); per step the A fragments of rows a_row0 + [0, 16 MI) and the B fragments of rows
// b_row0 + [0, 8 NI) by ldmatrix from tiles whose 16-byte chunk c of row r is at byte `at(r, c)`,
// then mma(acc[mi][ni], a, b0, b1) for mi, then ni, in order: each accumulator's chain runs in
// ascending k, which is what makes two kernels built on this loop agree bit for bit.
template <int MI, int NI, int KSTEPS, class At, class Mma>
__device__ inline void warp_tile_mmas(float (&acc)[MI][NI][4], const unsigned char* a, const unsigned char* b,
                                      int a_row0, int b_row0, int lane, At&& at, Mma&& mma) {
#pragma unroll
  for (int ks = 0; ks < KSTEPS; ks++) {
    uint32_t af[MI][4];
    uint32_t bfr[NI][2];
#pragma unroll
    for (int mi = 0; mi < MI; mi++) ldmatrix_x4(af[mi], a + at(a_row0 + mi * 16 + (lane & 15), ks * 2 + (lane >> 4)));
#pragma unroll
    for (int nj = 0; nj < NI / 2; nj++) {
      uint32_t t[4];
      ldmatrix_x4(t, b + at(b_row0 + nj * 16 + (lane & 7) + ((lane >> 4) << 3), ks * 2 + ((lane >> 3) & 1)));
      bfr[2 * nj][0] = t[0];
      bfr[2 * nj][1] = t[1];
      bfr[2 * nj + 1][0] = t[2];
      bfr[2 * nj + 1][1] = t[3];
    }
#pragma unroll
    for (int mi = 0; mi < MI; mi++)
#pragma unroll
      for (int ni = 0; ni < NI; ni++) mma(acc[mi][ni], af[mi], bfr[ni][0], bfr[ni][1]);
  }
}

// The epilogue of an MI x NI warp tile (warp_tile_mmas' accumulators) of the m-tile at rows
// m0 .. of a group whose rows start at row_begin (rows of them): every row that exists, scattered
// by c_rows, through store_pair; the warp's first row and column in the tile are row0, col0.
template <class TC, bool SWIGLU, int MI, int NI>
__device__ inline void store_warp_tile(const GemmArgs& p, const float (&acc)[MI][NI][4], int row_begin, int rows, int m0,
                                       int row0, int col0, int lane) {
#pragma unroll
  for (int mi = 0; mi < MI; mi++)
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int lr = row0 + mi * 16 + (lane >> 2) + h * 8;
      if (m0 + lr >= rows) continue;
      const int r = row_begin + m0 + lr;
      const int64_t orow = p.c_rows ? p.c_rows[r] : r;
#pragma unroll
      for (int ni = 0; ni < NI; ni++)
        store_pair<TC, SWIGLU>(p, orow, col0 + ni * 8 + (lane & 3) * 2, acc[mi][ni][2 * h], acc[mi][ni][2 * h + 1]);
    }
}

// swz's layout in bytes (bf16 tiles of 64 per row), for warp_tile_mmas.
__device__ inline int swz_bytes(int r, int c) { return 2 * swz(r, c); }

// The rows of group g: from the offsets, or G groups of M rows each (G = 1: a dense GEMM).
__device__ inline void group_range(const GemmArgs& p, int g, int& begin, int& rows) {
  if (p.offsets) {
    begin = p.offsets[g];
    rows = p.offsets[g + 1] - begin;
  } else {
    begin = g * p.M;
    rows = p.M;
  }
}


// The m-tiles of BM rows a CTA of an mma.sync GEMM runs: with a tile list (p.tiles), exactly its
// entry blockIdx.y; otherwise m-tiles blockIdx.z, + gridDim.z, ... of group blockIdx.y. False when
// the CTA has none (an entry past the list's count, a first tile past the group's rows).
struct CtaTiles {
  int group = 0, row_begin = 0, rows = 0;
  int m_first = 0, m_end = 0, m_step = 1;  // m-tiles m_first, + m_step, ... below m_end and rows
};
__device__ inline bool cta_tiles(const GemmArgs& p, int BM, CtaTiles& t) {
  if (p.tiles) {
    if (int(blockIdx.y) >= *p.num_tiles) return false;
    t.group = p.tiles[2 * blockIdx.y];
    t.m_first = p.tiles[2 * blockIdx.y + 1] / BM;
    t.m_end = t.m_first + 1;
    t.m_step = 1;
  } else {
    t.group = blockIdx.y;
    t.m_first = blockIdx.z;
    t.m_end = 0x7fffffff;
    t.m_step = int(gridDim.z);
  }
  group_range(p, t.group, t.row_begin, t.rows);
  return t.m_first * BM < t.rows;
}

// mbarriers in shared memory (addresses from smem_u32): init with the arrivals a phase needs, wait
// for the phase of the given parity to complete, arrive, and arrive announcing the bytes that
// asynchronous copies will complete on it (expect_tx).
__device__ inline void mbar_init(uint32_t bar, int count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
__device__ inline void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}
__device__ inline void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ inline void mbar_arrive_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
// One bulk copy (the TMA unit, no tensor map) of bytes -- a multiple of 16, both addresses 16-byte
// aligned -- from global to shared memory, completing its bytes on bar.
__device__ inline void bulk_copy_g2s(uint32_t smem, const void* gmem, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(smem),
               "l"(gmem), "r"(bytes), "r"(bar)
               : "memory");
}

// Thread-block clusters (sm_90): this CTA's rank in its cluster; a shared::cta address mapped into
// CTA `rank`'s shared memory (distributed shared memory); a store of two floats there; and the
// cluster-wide barrier whose arrive releases this thread's stores and whose wait acquires the
// others' (every thread of every CTA of the cluster arrives).
__device__ inline uint32_t cluster_ctarank() {
  uint32_t r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ inline uint32_t cluster_map(uint32_t smem, uint32_t rank) {
  uint32_t out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(smem), "r"(rank));
  return out;
}
__device__ inline void cluster_store2(uint32_t addr, float a, float b) {
  asm volatile("st.shared::cluster.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(a), "f"(b) : "memory");
}
// A CTA may touch another's shared memory only once that one runs: every thread arrives (relaxed) as
// its CTA starts, and waits -- for the whole cluster's arrival -- before its first remote access.
__device__ inline void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory"); }
__device__ inline void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }
__device__ inline void cluster_sync() {
  asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}

}  // namespace epmoe::cuda::ptx
