// Hopper's warpgroup MMA (wgmma.mma_async, sm_90a) basics shared by the wgmma GEMM (gemm_wgmma.cu)
// and bench/cuda/mma_chain_bench.cu: the shared-memory descriptor of the one layout both use, the
// fence / commit / wait of the asynchronous MMAs, and the accumulator fence.
#pragma once

#include <cstdint>

namespace epmoe::cuda::ptx {

// The shared-memory matrix descriptor of a K-major tile in the 128-byte swizzle layout starting at
// addr (1024-byte aligned): 8-row groups 1024 bytes apart (SBO), LBO unused by this layout (1).
// The start address moves by 32 bytes (+2) per k16 step inside the 64-wide k-tile. (The layout is
// swz()'s: row r's 16-byte chunk c at r * 128 + ((c ^ (r % 8)) * 16).)
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

}  // namespace epmoe::cuda::ptx
