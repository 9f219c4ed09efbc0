// The process's device and stream, the CUDA error path, and the device's properties.
#include "kernels/cuda/device.h"
#include "util/env.h"

#include "kernels/cuda/common.cuh"

#include <cstdlib>

namespace epmoe::cuda {

namespace {
cudaStream_t g_stream = nullptr;
void (*g_wait)(void*, const char*) = nullptr;
void* g_wait_ctx = nullptr;
}  // namespace

[[noreturn]] void cuda_fail(const char* expr, cudaError_t e, const char* file, int line) {
  throw Error(std::string("CUDA error at ") + file + ":" + std::to_string(line) + ": " + expr + ": " +
              cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

cudaStream_t stream() { return g_stream; }

int visible_devices(std::string* why) {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // not sticky: leave no error behind for the next launch check
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
    return 0;
  }
  if (n == 0 && why) *why = "cudaGetDeviceCount found 0 devices";
  return n;
}

void init_device(int rank) {
  if (g_stream) return;
  std::string why;
  const int n = visible_devices(&why);
  if (n == 0) throw InputError("--device cuda: no CUDA device is visible (" + why + ")");
  EPMOE_CUDA_CHECK(cudaSetDevice(rank % n));
  // A blocking stream: ordered with the legacy default stream, so that plain cudaMemcpy calls
  // (uploads and downloads of small host vectors) see the work queued before them.
  EPMOE_CUDA_CHECK(cudaStreamCreate(&g_stream));
}

void wait_stream(const char* what) {
  if (g_wait) g_wait(g_wait_ctx, what);
  else EPMOE_CUDA_CHECK(cudaStreamSynchronize(g_stream));
}

void set_stream_wait(void (*fn)(void*, const char*), void* ctx) {
  g_wait = fn;
  g_wait_ctx = ctx;
}

bool pdl_enabled() {
  static const bool on = [] {
    return !env_off("EPMOE_PDL");
  }();
  return on;
}

int sm_count() {
  static int n = [] {
    int dev = 0, v = 0;
    EPMOE_CUDA_CHECK(cudaGetDevice(&dev));
    EPMOE_CUDA_CHECK(cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev));
    return v;
  }();
  return n;
}

}  // namespace epmoe::cuda
