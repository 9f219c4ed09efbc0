// The CUDA half of DeviceBuffer (tensor/device_buffer.h). Plain synchronous calls on the legacy
// default stream: the process's stream is a blocking stream (kernels/cuda/device.cu), so a copy here
// is ordered after the work queued on it, and the work queued after the copy sees it.
#include <cuda_runtime.h>

#include <string>

#include "tensor/device_buffer.h"
#include "util/error.h"

namespace epmoe::cuda_memory {

namespace {
void check(cudaError_t e, const char* what, size_t bytes) {
  if (e != cudaSuccess)
    throw Error(std::string("DeviceBuffer: ") + what + " of " + std::to_string(bytes) + " bytes: " + cudaGetErrorName(e) +
                " (" + cudaGetErrorString(e) + ")");
}
}  // namespace

void* alloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc", bytes);
  return p;
}

void free(void* p) { cudaFree(p); }

void upload(void* dst, const void* host, size_t bytes) {
  check(cudaMemcpy(dst, host, bytes, cudaMemcpyHostToDevice), "upload", bytes);
}

void download(void* host, const void* src, size_t bytes) {
  check(cudaMemcpy(host, src, bytes, cudaMemcpyDeviceToHost), "download", bytes);
}

void fill(void* dst, uint8_t byte, size_t bytes) { check(cudaMemset(dst, byte, bytes), "fill", bytes); }

}  // namespace epmoe::cuda_memory
