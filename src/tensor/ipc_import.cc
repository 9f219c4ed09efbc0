// The CPU-only build's side of tensor/ipc_import.h: a clear refusal (the CUDA build's is
// tensor/cuda/ipc_import.cu).
#include "tensor/ipc_import.h"

#include "util/error.h"

namespace epmoe {

#ifndef EPMOE_HAVE_CUDA
void read_ipc_slices(int, std::vector<IpcSlice>& slices) {
  throw InputError("tensors shared by CUDA IPC handles (" +
                   (slices.empty() ? std::string("none") : slices.front().what) +
                   "): this epmoe was built without CUDA (configure with -DEPMOE_CUDA=ON)");
}
#endif

}  // namespace epmoe
