// Internal to the CUDA GEMMs: the pieces the tensor-core kernels share (gemm.cu's bf16 kernel,
// gemm_wgmma.cu, gemm_fp8.cu's e4m3 kernel, moe/cuda/router.cu): asynchronous copies into shared
// memory, ldmatrix, the bf16 MMA step, the swizzled tile layout, the epilogue pair and the row
// range of a GEMM group. Written once so that the kernels stage tiles alike and, where they must,
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

}  // namespace epmoe::cuda::ptx
