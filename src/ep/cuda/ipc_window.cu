#include "ep/cuda/ipc_window.cuh"

#include <cstddef>
#include <cstring>
#include <string>

#include "comm/group.h"

namespace epmoe::cuda {

namespace {

__global__ void ipc_wait_kernel(const FlagWait w, IpcSignals* sig, int counter, int32_t* count_out, int32_t cap) {
  wait_flags(w);
  if (count_out && threadIdx.x == 0) {
    __threadfence_system();
    // Read and cleared at once: every source reserved before it signalled, and none reserves in
    // this counter again (the slot's next epoch) before this rank's combine signal of this epoch,
    // which comes after this kernel.
    const int32_t n = atomicExch(&sig->counter[counter], 0);
    *count_out = n < cap ? n : cap;
  }
}

// Windows of destroyed backends, freed at the next collective point: freeing memory that a peer
// still maps is undefined (the CUDA IPC contract), and a destructor cannot wait for the peers. A
// peer closes its mapping of a window when its own backend is destroyed, which in the group's
// common program order comes before it enters the next window's handle exchange.
std::vector<void*>& retired_windows() {
  static std::vector<void*> v;
  return v;
}

}  // namespace

uint64_t IpcWindow::timeout_ns() const { return uint64_t(g_.timeout() * 1e9); }

void IpcWindow::release() {
  if (!mine_) return;
  for (int d = 0; d < kIpcMaxRanks; d++)
    if (peers_.base[d] && peers_.base[d] != mine_) cudaIpcCloseMemHandle(peers_.base[d]);
  retired_windows().push_back(mine_);
  mine_ = nullptr;
  peers_ = IpcPeers{};
}

void IpcWindow::allocate(const IpcLayout& layout) {
  const int R = g_.size(), me = g_.rank();
  EPMOE_ASSERT(R <= kIpcMaxRanks, "ipc window: at most 16 ranks (GPUs of one host)");
  EPMOE_ASSERT(fault_ != nullptr, "ipc window: a fault word for the waits");
  if (mine_) {
    // Every rank is past its last use of the window (its previous call ended); unmap the peers',
    // then free this rank's once no peer maps it any more.
    EPMOE_CUDA_CHECK(cudaStreamSynchronize(stream()));
    for (int d = 0; d < R; d++)
      if (d != me && peers_.base[d]) EPMOE_CUDA_CHECK(cudaIpcCloseMemHandle(peers_.base[d]));
    g_.barrier();
    EPMOE_CUDA_CHECK(cudaFree(mine_));
    mine_ = nullptr;
    peers_ = IpcPeers{};
  }
  layout_ = layout;
  void* p = nullptr;
  EPMOE_CUDA_CHECK(cudaMalloc(&p, layout.bytes));
  mine_ = static_cast<unsigned char*>(p);
  EPMOE_CUDA_CHECK(cudaMemset(mine_, 0, sizeof(IpcSignals)));
  EPMOE_CUDA_CHECK(cudaDeviceSynchronize());
  cudaIpcMemHandle_t h;
  EPMOE_CUDA_CHECK(cudaIpcGetMemHandle(&h, mine_));
  std::vector<cudaIpcMemHandle_t> all(static_cast<size_t>(R));
  g_.allgather(&h, sizeof h, all.data());
  for (void* old : retired_windows()) cudaFree(old);  // every peer has unmapped them (see above)
  retired_windows().clear();
  for (int d = 0; d < R; d++) {
    if (d == me) {
      peers_.base[d] = mine_;
      continue;
    }
    void* q = nullptr;
    const cudaError_t e = cudaIpcOpenMemHandle(&q, all[size_t(d)], cudaIpcMemLazyEnablePeerAccess);
    if (e != cudaSuccess)
      throw Error("rank " + std::to_string(me) + ": cannot map rank " + std::to_string(d) +
                  "'s buffer (CUDA IPC): " + cudaGetErrorString(e) +
                  " -- the GPU backends that write into peers' memory need every GPU of the group in one host, "
                  "with peer access (NVLink or PCIe)");
    peers_.base[d] = static_cast<unsigned char*>(q);
  }
  // Nobody writes into a peer before every rank has mapped and zeroed its window.
  g_.barrier();
  epoch_ = 0;
}

FlagWait ipc_flag_wait(const IpcWindow& w, int R, int stage, IpcEpoch epoch) {
  FlagWait f;
  // (Address arithmetic only: the signals live on the device.)
  f.flags = reinterpret_cast<const uint64_t*>(reinterpret_cast<const unsigned char*>(w.my_signals()) +
                                              offsetof(IpcSignals, flag) + size_t(stage) * sizeof(uint64_t) * kIpcMaxRanks);
  f.n = R;
  f.epoch = epoch.value;
  f.epoch_dev = epoch.dev;
  f.timeout_ns = w.timeout_ns();
  f.fault = w.fault_word();
  f.stage = stage + 1;
  return f;
}

void ipc_wait(const IpcWindow& w, int R, int stage, IpcEpoch epoch, int counter, int32_t* count_out, int32_t cap,
              cudaStream_t s) {
  ipc_wait_kernel<<<1, 32, 0, s>>>(ipc_flag_wait(w, R, stage, epoch), w.my_signals(), counter, count_out, cap);
  EPMOE_CUDA_LAUNCHED();
}

}  // namespace epmoe::cuda
