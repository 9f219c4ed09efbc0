#include "tensor/device_buffer.h"

#include <cstdlib>
#include <cstring>

#include "util/error.h"

namespace epmoe {

namespace {
void need_cuda() {
  if (!device_compiled(Device::Cuda))
    throw InputError("--device cuda: this epmoe was built without CUDA (configure with -DEPMOE_CUDA=ON)");
}
}  // namespace

DeviceBuffer::DeviceBuffer(Device device, size_t bytes) : device_(device), bytes_(bytes) {
  const size_t n = bytes ? bytes : 1;  // a valid pointer even for nothing
  switch (device_) {
    case Device::Cpu:
      ptr_ = std::calloc(n, 1);
      if (!ptr_) throw Error("out of memory allocating " + std::to_string(bytes) + " bytes");
      break;
    case Device::Cuda:
      need_cuda();
#ifdef EPMOE_HAVE_CUDA
      ptr_ = cuda_memory::alloc(n);
#endif
      break;
  }
}

DeviceBuffer::~DeviceBuffer() {
  if (!ptr_) return;
  switch (device_) {
    case Device::Cpu: std::free(ptr_); break;
    case Device::Cuda:
#ifdef EPMOE_HAVE_CUDA
      cuda_memory::free(ptr_);
#endif
      break;
  }
}

void DeviceBuffer::upload(const void* host, size_t bytes) {
  EPMOE_ASSERT(bytes <= bytes_, "DeviceBuffer::upload: " + std::to_string(bytes) + " bytes into " + std::to_string(bytes_));
  if (bytes == 0) return;
  switch (device_) {
    case Device::Cpu: std::memcpy(ptr_, host, bytes); break;
    case Device::Cuda:
#ifdef EPMOE_HAVE_CUDA
      cuda_memory::upload(ptr_, host, bytes);
#endif
      break;
  }
}

void DeviceBuffer::download(void* host, size_t bytes) const {
  EPMOE_ASSERT(bytes <= bytes_, "DeviceBuffer::download: " + std::to_string(bytes) + " bytes from " + std::to_string(bytes_));
  if (bytes == 0) return;
  switch (device_) {
    case Device::Cpu: std::memcpy(host, ptr_, bytes); break;
    case Device::Cuda:
#ifdef EPMOE_HAVE_CUDA
      cuda_memory::download(host, ptr_, bytes);
#endif
      break;
  }
}

void DeviceBuffer::fill(uint8_t byte) {
  switch (device_) {
    case Device::Cpu: std::memset(ptr_, byte, bytes_); break;
    case Device::Cuda:
#ifdef EPMOE_HAVE_CUDA
      cuda_memory::fill(ptr_, byte, bytes_);
#endif
      break;
  }
}

}  // namespace epmoe
