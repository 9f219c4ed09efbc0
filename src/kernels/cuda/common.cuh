// Shared helpers of the CUDA code of every layer: error checks that throw epmoe::Error with
// file:line, the process's stream, a grow-only device array, bf16 <-> fp32, warp and block
// reductions. Included by .cu/.cuh files only (the .h headers of the GPU code carry no CUDA types).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "util/error.h"
#include "util/hash.h"

namespace epmoe::cuda {

using bf16 = __nv_bfloat16;

[[noreturn]] void cuda_fail(const char* expr, cudaError_t e, const char* file, int line);

#define EPMOE_CUDA_CHECK(x)                                                             \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) ::epmoe::cuda::cuda_fail(#x, e_, __FILE__, __LINE__);        \
  } while (0)
// After every launch: a bad configuration shows up here, not at the next synchronisation.
#define EPMOE_CUDA_LAUNCHED() EPMOE_CUDA_CHECK(cudaGetLastError())

// The process's stream (created by init_device, kernels/cuda/device.h; the legacy default stream
// before that). Every kernel of the runtime runs on it.
cudaStream_t stream();

// Programmatic dependent launch (sm_90). A kernel launched by launch_pdl() may start while the
// kernel before it on the stream is still running: its CTAs become resident as soon as every CTA
// of the previous kernel has called pdl_trigger() (or exited), so its launch latency and any
// prologue that reads only constant data (weights) overlap the previous kernel's tail.
// The rule that keeps this correct: such a kernel calls pdl_wait() -- in every CTA, before any
// early return -- before it reads or writes memory that an earlier kernel reads or writes.
// pdl_wait() returns once the previous kernel has completed and its writes are visible; since
// that kernel waited for its own predecessor, everything earlier on the stream is complete too.
// In a kernel launched the ordinary way both are no-ops. EPMOE_PDL=0 launches everything the
// ordinary way (for measuring what PDL is worth).
//
// The kernel timeline (kernels/cuda/kernel_trace.h, `gpu_model_bench --trace`) in a build with
// EPMOE_KERNEL_TRACE: CTA 0 of every kernel stamps %globaltimer the moment its pdl_wait() returns.
// Kernels of a step form one dependent chain, so the gap from one kernel's stamp to the next's is
// the time that kernel held the chain -- its work after the wait plus the hand-over -- inside a
// CUDA graph, where no profiler of the lent machines can look. The sink is one per translation
// unit (no relocatable device code): each registers a setter, and kernel_trace_start() fills every
// one. A profiling build only: the runtime's kernels carry none of it.
#ifdef EPMOE_KERNEL_TRACE
struct TraceSink {
  unsigned long long* stamps = nullptr;  // nullptr: no trace
  unsigned* count = nullptr;
  unsigned capacity = 0;
};
// (static, not an unnamed namespace: nvcc's stubs cannot tell two unnamed namespaces apart when a
// source opens its own beside `using namespace epmoe::cuda`.)
static __device__ TraceSink g_trace_sink;
using TraceSinkSetter = void (*)(const TraceSink&);
bool register_trace_sink(TraceSinkSetter set);  // kernel_trace.cu
// (Host code of this translation unit: its own copy of the sink.)
static void set_trace_sink_here(const TraceSink& t) {
  EPMOE_CUDA_CHECK(cudaMemcpyToSymbol(g_trace_sink, &t, sizeof t));
}
[[maybe_unused]] static const bool g_trace_sink_registered = register_trace_sink(&set_trace_sink_here);
#endif

__device__ inline void pdl_wait() {
#ifdef EPMOE_KERNEL_TRACE
  const TraceSink t = g_trace_sink;  // (read before the wait)
#endif
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#ifdef EPMOE_KERNEL_TRACE
  if (t.stamps && threadIdx.x == 0 && threadIdx.y == 0 && blockIdx.x == 0 && blockIdx.y == 0 && blockIdx.z == 0) {
    unsigned long long now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    const unsigned i = atomicAdd(t.count, 1u);
    if (i < t.capacity) t.stamps[i] = now;
  }
#endif
}
__device__ inline void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory"); }
bool pdl_enabled();
// The host half of the timeline: while recording, launch_pdl notes each kernel launched, in order.
extern bool g_kernel_trace_recording;
void kernel_trace_note(const void* kernel);
// launch_pdl_cluster: the same for a kernel whose CTAs run as thread-block clusters of `cluster`
// (sm_90); launch_pdl is it with no cluster (1 x 1 x 1: no cluster attribute at all).
template <class... KArgs, class... Args>
void launch_pdl_cluster(void (*kernel)(KArgs...), dim3 grid, dim3 block, dim3 cluster, size_t smem, cudaStream_t s,
                        Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attr[2];
  unsigned n = 0;
  if (cluster.x * cluster.y * cluster.z > 1) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = cluster.x, attr[n].val.clusterDim.y = cluster.y, attr[n].val.clusterDim.z = cluster.z;
    n++;
  }
  if (pdl_enabled()) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    n++;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  if (g_kernel_trace_recording) kernel_trace_note(reinterpret_cast<const void*>(kernel));
  EPMOE_CUDA_CHECK(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...));
}
template <class... KArgs, class... Args>
void launch_pdl(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, Args&&... args) {
  launch_pdl_cluster(kernel, grid, block, dim3(1, 1, 1), smem, s, std::forward<Args>(args)...);
}

// A device allocation that only grows (a layer runs many times with similar sizes; cudaMalloc
// synchronises the device and must stay out of the steady state). Contents are not preserved.
template <class T>
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t n) { reserve(n); }
  ~DeviceArray() { release(); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  DeviceArray(DeviceArray&& o) noexcept : p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    if (this != &o) {
      release();
      p_ = o.p_, n_ = o.n_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }
  void reserve(size_t n) {
    if (n <= n_) return;
    release();
    EPMOE_CUDA_CHECK(cudaMalloc(&p_, std::max<size_t>(n, 1) * sizeof(T)));
    n_ = n;
  }
  void upload(const T* host, size_t n) {
    reserve(n);
    if (n) EPMOE_CUDA_CHECK(cudaMemcpy(p_, host, n * sizeof(T), cudaMemcpyHostToDevice));
  }
  void upload(const std::vector<T>& v) { upload(v.data(), v.size()); }
  std::vector<T> download(size_t n) const {
    std::vector<T> out(n);
    if (n) EPMOE_CUDA_CHECK(cudaMemcpy(out.data(), p_, n * sizeof(T), cudaMemcpyDeviceToHost));
    return out;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t capacity() const { return n_; }
  bool empty() const { return p_ == nullptr; }

 private:
  void release() {
    if (p_) cudaFree(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Page-locked host memory that only grows: the destination of device-to-host copies that must
// not block the host (a copy into pageable memory returns only once it is done, i.e. after every
// collective queued before it -- a wait without a deadline). Contents are not preserved.
template <class T>
class PinnedArray {
 public:
  PinnedArray() = default;
  ~PinnedArray() { release(); }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  void reserve(size_t n) {
    if (n <= n_) return;
    release();
    EPMOE_CUDA_CHECK(cudaMallocHost(&p_, std::max<size_t>(n, 1) * sizeof(T)));
    n_ = n;
  }
  T* data() { return p_; }
  T& operator[](size_t i) { return p_[i]; }

 private:
  void release() {
    if (p_) cudaFreeHost(p_);
    p_ = nullptr;
    n_ = 0;
  }
  T* p_ = nullptr;
  size_t n_ = 0;
};

__host__ __device__ inline float to_f32(float x) { return x; }
__host__ __device__ inline float to_f32(bf16 x) { return __bfloat162float(x); }
template <class T>
__host__ __device__ inline T from_f32(float x);
template <>
__host__ __device__ inline float from_f32<float>(float x) { return x; }
template <>
__host__ __device__ inline bf16 from_f32<bf16>(float x) { return __float2bfloat16_rn(x); }

// One step of the slot-order combine, acc + w v rounded once: every GPU combine of expert rows
// (ep/cuda/plan_combine.cu's kernels, the grouped GEMM's row sums) adds with it, so that their
// outputs are the same bits.
__device__ inline float slot_sum_step(float acc, float w, float v) { return __fmaf_rn(w, v, acc); }

__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Warp argmax with ties to the lower index; idx < 0 means "no candidate" and always loses.
__device__ inline void warp_argmax(float& v, int& idx) {
  for (int o = 16; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, o);
    const int oi = __shfl_xor_sync(0xffffffffu, idx, o);
    const bool take = oi >= 0 && (idx < 0 || ov > v || (ov == v && oi < idx));
    if (take) v = ov, idx = oi;
  }
}

// Block-wide sum with a fixed tree (deterministic): every thread gets the result.
// scratch: >= 32 floats of shared memory.
__device__ inline float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nw ? scratch[lane] : 0.f;
  t = warp_sum(t);
  return t;
}
__device__ inline float block_max(float v, float* scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  float t = lane < nw ? scratch[lane] : -INFINITY;
  t = warp_max(t);
  return t;
}

// Exclusive prefix sum over the block (int), in thread order; *total gets the sum.
// scratch: >= 33 ints of shared memory.
__device__ inline int block_exclusive_scan(int v, int* scratch, int* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
  int incl = v;
  for (int o = 1; o < 32; o <<= 1) {
    const int y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane >= o) incl += y;
  }
  __syncthreads();
  if (lane == 31) scratch[warp] = incl;
  __syncthreads();
  if (warp == 0) {
    int w = lane < nw ? scratch[lane] : 0;
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xffffffffu, w, o);
      if (lane >= o) w += y;
    }
    if (lane < nw) scratch[lane] = w;  // inclusive warp totals
    if (lane == nw - 1) scratch[32] = w;
  }
  __syncthreads();
  const int before = warp > 0 ? scratch[warp - 1] : 0;
  *total = scratch[32];
  return before + incl - v;
}

__host__ __device__ inline int64_t lmin(int64_t a, int64_t b) { return a < b ? a : b; }

inline int ceil_div(int64_t a, int64_t b) { return int((a + b - 1) / b); }

// The device's multiprocessor count (cached per device).
int sm_count();

// Blocks of a grid-stride elementwise kernel over n elements: enough to fill the chip, no more.
inline int grid_for(int64_t n, int threads = 256) {
  return int(std::max<int64_t>(1, std::min<int64_t>((n + threads - 1) / threads, int64_t(sm_count()) * 16)));
}

}  // namespace epmoe::cuda
