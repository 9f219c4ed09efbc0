// Tensors another process shares on this machine's GPU through CUDA IPC handles: a colocated RL
// trainer's torch tensors (`storage._share_cuda_()` gives the 64-byte cudaIpcMemHandle_t of the
// allocation a storage lives in and the storage's offset in it). serve's
// /update_weights_from_tensor copies their bytes to host memory, where the weight update it shares
// with /update_weights_from_safetensors takes them: the weights are rebuilt from the checkpoint with
// the new tensors overlaid (one path for every source, checked the same way).
//
// Each allocation is opened once however many tensors it holds (a process may not open one
// allocation twice) and closed before returning: nothing of the trainer's memory stays mapped. The
// trainer keeps its tensors alive, and their writes finished (torch.cuda.synchronize()), until the
// answer comes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace epmoe {

struct IpcSlice {
  std::string handle;   // cudaIpcMemHandle_t's 64 bytes
  uint64_t offset = 0;  // bytes into the allocation
  uint64_t bytes = 0;
  void* host = nullptr; // where the bytes go
  std::string what;     // names the slice in errors (the tensor)
};

inline constexpr size_t kIpcHandleBytes = 64;

// Copies every slice's bytes from the shared allocations on GPU `device` (this process's) into
// their host destinations. InputError naming the slice for a handle that does not open (a freed
// tensor, another machine's, another GPU without peer access), a range past the allocation, or a
// build without CUDA.
void read_ipc_slices(int device, std::vector<IpcSlice>& slices);

}  // namespace epmoe
