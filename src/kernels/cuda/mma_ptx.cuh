// Internal to src/kernels/cuda: the PTX pieces the tensor-core GEMMs share (gemm.cu's bf16
// kernel, gemm_fp8.cu's e4m3 kernel): asynchronous copies into shared memory, ldmatrix, and the
// row range of a GEMM group. Written once so that both kernels stage and address tiles alike.
#pragma once

#include <cstdint>

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
