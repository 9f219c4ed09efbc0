#include "kernels/cuda/l2_prefetch.cuh"

#include <algorithm>
#include <cstdint>

#include "util/env.h"

namespace epmoe::cuda {

namespace {
int& prefetch_mask() {
  static int m = int(env_int("EPMOE_L2_PREFETCH", 0));
  return m;
}
}  // namespace

int l2_prefetch_mask() { return prefetch_mask(); }
void set_l2_prefetch_mask(int mask) { prefetch_mask() = mask; }

namespace {

size_t chunk_bytes() {
  static const size_t c = [] {
    const int kb = int(env_int("EPMOE_L2_PREFETCH_CHUNK", 8));
    return size_t(std::clamp(kb, 1, 1024)) * 1024;
  }();
  return c;
}

// One bulk prefetch (the TMA unit) of `chunk` bytes per thread: a warp-sized CTA per 32 chunks, so
// the requests leave from as many SMs as there are CTAs. Nothing waits for them.
__global__ void l2_prefetch_kernel(const unsigned char* p, size_t bytes, uint32_t chunk) {
  const size_t i = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) * chunk;
  if (i >= bytes) return;
  const uint32_t n = uint32_t(std::min<size_t>(chunk, bytes - i)) & ~15u;
  if (n) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p + i), "r"(n) : "memory");
}

// Job blockIdx.y's expert: its `bytes` from base, chunk by chunk (blockIdx.x: 32 chunks).
__global__ void l2_prefetch_experts_kernel(const int32_t* ids, int id_base, int n_local, const unsigned char* base,
                                           size_t bytes, uint32_t chunk) {
  const int e = ids[blockIdx.y] - id_base;
  if (e < 0 || e >= n_local) return;
  const size_t i = (size_t(blockIdx.x) * blockDim.x + threadIdx.x) * chunk;
  if (i >= bytes) return;
  const uint32_t n = uint32_t(std::min<size_t>(chunk, bytes - i)) & ~15u;
  if (n) asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(base + size_t(e) * bytes + i), "r"(n) : "memory");
}

}  // namespace

void L2Prefetcher::fork(cudaStream_t main) {
  if (!side_) {
    EPMOE_CUDA_CHECK(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
    EPMOE_CUDA_CHECK(cudaEventCreateWithFlags(&fork_, cudaEventDisableTiming));
    EPMOE_CUDA_CHECK(cudaEventCreateWithFlags(&joined_, cudaEventDisableTiming));
  }
  EPMOE_CUDA_CHECK(cudaEventRecord(fork_, main));
  EPMOE_CUDA_CHECK(cudaStreamWaitEvent(side_, fork_, 0));
  pending_ = true;
}

void L2Prefetcher::request_experts(const int32_t* ids, int n, int id_base, int n_local, const void* base, size_t bytes,
                                   cudaStream_t main) {
  if (!ids || n <= 0 || !base || bytes < 16) return;
  fork(main);
  const size_t chunk = chunk_bytes();
  const size_t chunks = (bytes + chunk - 1) / chunk;
  l2_prefetch_experts_kernel<<<dim3(unsigned((chunks + 31) / 32), unsigned(n)), 32, 0, side_>>>(
      ids, id_base, n_local, static_cast<const unsigned char*>(base), bytes, uint32_t(chunk));
  EPMOE_CUDA_CHECK(cudaGetLastError());
}

L2Prefetcher::~L2Prefetcher() {
  if (fork_) cudaEventDestroy(fork_);
  if (joined_) cudaEventDestroy(joined_);
  if (side_) cudaStreamDestroy(side_);
}

void L2Prefetcher::request(const void* p, size_t bytes, cudaStream_t main) {
  if (!p || bytes < 16) return;
  fork(main);
  // (The address is a weight buffer's start: cudaMalloc aligns it far past 16 bytes.)
  const size_t chunk = chunk_bytes();
  const size_t chunks = (bytes + chunk - 1) / chunk;
  l2_prefetch_kernel<<<unsigned((chunks + 31) / 32), 32, 0, side_>>>(static_cast<const unsigned char*>(p), bytes,
                                                                    uint32_t(chunk));
  EPMOE_CUDA_CHECK(cudaGetLastError());
}

void L2Prefetcher::join(cudaStream_t main) {
  if (!pending_) return;
  EPMOE_CUDA_CHECK(cudaEventRecord(joined_, side_));
  EPMOE_CUDA_CHECK(cudaStreamWaitEvent(main, joined_, 0));
  pending_ = false;
}

}  // namespace epmoe::cuda
