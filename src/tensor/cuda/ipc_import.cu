// tensor/ipc_import.h on CUDA: every distinct allocation opened once, its slices copied to host on
// a stream of their own (not the runtime's: the copies need not wait for the step in flight, which
// reads none of this memory), then closed.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstring>
#include <map>

#include "tensor/ipc_import.h"
#include "util/error.h"

namespace epmoe {

namespace {

std::string cuda_text(cudaError_t e) { return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")"; }

void check(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) throw Error("CUDA IPC import: " + what + ": " + cuda_text(e));
}

// The size of the allocation `p` starts (the driver's cuMemGetAddressRange, through the runtime's
// entry point: the project links no libcuda), so that an offset or shape past a shared allocation is
// refused instead of read.
size_t allocation_size(const void* p, const std::string& what) {
  using GetRange = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);
  static GetRange get_range = [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &f, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      f = nullptr;
    return reinterpret_cast<GetRange>(f);
  }();
  if (!get_range) throw Error("CUDA IPC import: the driver has no cuMemGetAddressRange");
  CUdeviceptr base = 0;
  size_t size = 0;
  if (get_range(&base, &size, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS)
    throw Error("CUDA IPC import: " + what + ": the shared allocation's range is unknown");
  return size - size_t(reinterpret_cast<CUdeviceptr>(p) - base);
}

// The allocation a handle names, mapped for the duration of the copies.
class OpenedAllocation {
 public:
  OpenedAllocation(const std::string& handle, const std::string& what) {
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof h);
    const cudaError_t e = cudaIpcOpenMemHandle(&base_, h, cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess) {
      cudaGetLastError();  // (not sticky: cleared for the runtime's next check)
      base_ = nullptr;
      throw InputError(what + ": its CUDA IPC handle does not open on this GPU: " + cuda_text(e) +
                       " (a tensor already freed, or shared from another machine or a GPU without peer access)");
    }
    try {
      size_ = allocation_size(base_, what);
    } catch (...) {
      cudaIpcCloseMemHandle(base_);
      throw;
    }
  }
  ~OpenedAllocation() { cudaIpcCloseMemHandle(base_); }
  OpenedAllocation(const OpenedAllocation&) = delete;
  OpenedAllocation& operator=(const OpenedAllocation&) = delete;
  const char* base() const { return static_cast<const char*>(base_); }
  size_t size() const { return size_; }

 private:
  void* base_ = nullptr;
  size_t size_ = 0;
};

}  // namespace

void read_ipc_slices(int device, std::vector<IpcSlice>& slices) {
  if (slices.empty()) return;
  int before = 0;
  check(cudaGetDevice(&before), "cudaGetDevice");
  check(cudaSetDevice(device), "cudaSetDevice(" + std::to_string(device) + ")");
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  try {
    std::map<std::string, std::vector<size_t>> by_handle;  // allocation -> its slices
    for (size_t i = 0; i < slices.size(); i++) {
      if (slices[i].handle.size() != kIpcHandleBytes)
        throw InputError(slices[i].what + ": a CUDA IPC handle is " + std::to_string(kIpcHandleBytes) + " bytes, got " +
                         std::to_string(slices[i].handle.size()));
      by_handle[slices[i].handle].push_back(i);
    }
    for (auto& [handle, idx] : by_handle) {
      const OpenedAllocation a(handle, slices[idx.front()].what);
      for (size_t i : idx) {
        IpcSlice& sl = slices[i];
        if (sl.offset > a.size() || sl.bytes > a.size() - sl.offset)
          throw InputError(sl.what + ": bytes " + std::to_string(sl.offset) + " .. " + std::to_string(sl.offset + sl.bytes) +
                           " lie past the shared allocation of " + std::to_string(a.size()) + " bytes");
        check(cudaMemcpyAsync(sl.host, a.base() + sl.offset, sl.bytes, cudaMemcpyDeviceToHost, s), sl.what + ": copy");
      }
      check(cudaStreamSynchronize(s), slices[idx.front()].what + ": copy");
    }
  } catch (...) {
    cudaStreamDestroy(s);
    cudaSetDevice(before);
    throw;
  }
  cudaStreamDestroy(s);
  cudaSetDevice(before);
}

}  // namespace epmoe
