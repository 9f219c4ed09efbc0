// Waiting on flags that other GPUs write over NVLink (the backends of ep/nccl/ipc_backends.cu),
// with a deadline on the GPU's clock. Shared by the stand-alone wait kernel (ep/cuda/ipc_window.cu)
// and the kernels that wait in their own prologue (the slot-order combine), which saves a launch.
#pragma once

#include <cstdint>

namespace epmoe::cuda {

__device__ inline uint64_t globaltimer_ns() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
__device__ inline uint64_t ld_acquire_sys(const uint64_t* p) {
  uint64_t v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}
__device__ inline void st_release_sys(uint64_t* p, uint64_t v) {
  asm volatile("st.release.sys.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// Wait until flags[0..n) all reach `epoch`. On the deadline: {1, source, stage} into the fault
// word (page-locked host memory the group's sync() polls), and give up; once the word is set,
// every later wait of the process returns at once.
struct FlagWait {
  const uint64_t* flags = nullptr;  // nullptr: nothing to wait for
  int n = 0;
  uint64_t epoch = 0;
  const uint64_t* epoch_dev = nullptr;  // when set, the epoch is read here (a graph replays the call)
  uint64_t timeout_ns = 0;
  int32_t* fault = nullptr;
  int stage = 0;  // what the fault word names: 1 dispatch, 2 combine
};

// Called by every thread of a block (threads 0..n-1 watch one flag each); returns with the block
// synchronised and every flag's writes visible (acquire, system scope).
__device__ inline void wait_flags(const FlagWait& w) {
  if (!w.flags) return;
  volatile int32_t* vf = w.fault;
  const int src = threadIdx.x;
  const uint64_t epoch = w.epoch_dev ? *reinterpret_cast<const volatile uint64_t*>(w.epoch_dev) : w.epoch;
  if (src < w.n && vf[0] == 0) {
    const uint64_t start = globaltimer_ns();
    uint32_t spins = 0;
    while (ld_acquire_sys(&w.flags[src]) < epoch) {
      if ((++spins & 1023u) == 0) {
        if (vf[0] != 0) break;  // another wait of this process gave up already
        if (globaltimer_ns() - start > w.timeout_ns) {
          // Host memory: plain stores, the source and stage before the flag the host polls (two
          // threads timing out together write the same kind of news; either one is named).
          vf[1] = src;
          vf[2] = w.stage;
          __threadfence_system();
          vf[0] = 1;
          break;
        }
      }
    }
  }
  __syncthreads();
}

}  // namespace epmoe::cuda
