// A byte buffer on a device, for the few places above the kernels that move host data to the
// device and back (the reduction audit's tokens, tests). CPU: plain memory. CUDA: device memory
// (tensor/cuda/device_buffer.cu; refused with a clear error in a build without CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensor/device.h"

namespace epmoe {

class DeviceBuffer {
 public:
  DeviceBuffer(Device device, size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  Device device() const { return device_; }
  size_t bytes() const { return bytes_; }
  void* data() { return ptr_; }
  const void* data() const { return ptr_; }
  template <class T>
  T* as() { return static_cast<T*>(ptr_); }

  void upload(const void* host, size_t bytes);
  void download(void* host, size_t bytes) const;
  void fill(uint8_t byte);  // every byte (0xff: NaN in fp32, shows rows never written)

  // A buffer holding a copy of v.
  template <class T>
  static DeviceBuffer of(Device d, const std::vector<T>& v) {
    DeviceBuffer b(d, v.size() * sizeof(T));
    b.upload(v.data(), v.size() * sizeof(T));
    return b;
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : device_(o.device_), bytes_(o.bytes_), ptr_(o.ptr_) { o.ptr_ = nullptr; }

 private:
  Device device_;
  size_t bytes_ = 0;
  void* ptr_ = nullptr;
};

// The CUDA half (tensor/cuda/device_buffer.cu), linked only with CUDA.
namespace cuda_memory {
void* alloc(size_t bytes);
void free(void* p);
void upload(void* dst, const void* host, size_t bytes);
void download(void* host, const void* src, size_t bytes);
void fill(void* dst, uint8_t byte, size_t bytes);
}  // namespace cuda_memory

}  // namespace epmoe
