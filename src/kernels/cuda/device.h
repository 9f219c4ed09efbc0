// The process's GPU: one device per process (rank r uses device r mod the visible count) and one
// stream that every kernel, copy and collective of the runtime is queued on. No CUDA types here
// (the stream itself is declared in kernels/cuda/common.cuh, for CUDA sources).
#pragma once

#include <string>

namespace epmoe::cuda {

// The CUDA devices this process sees; 0 when none (or when the driver cannot be reached), with the
// reason in *why when given. Never throws: tests ask it before anything else to skip cleanly.
int visible_devices(std::string* why = nullptr);

// Selects the GPU of this process (rank modulo the visible devices) and creates its stream. Once per
// process (later calls do nothing); InputError when no device is visible.
void init_device(int rank);

// Waits until the work queued on the process's stream is done: the host side of every download of
// results. The group whose collectives run on that stream installs its own wait (the group's
// deadline, naming the peer that does not answer, comm/nccl_group.h); without one, a plain
// synchronisation. `what` names the wait in messages.
void wait_stream(const char* what);
// Installs (fn != nullptr) or removes the wait above.
void set_stream_wait(void (*fn)(void* ctx, const char* what), void* ctx);

}  // namespace epmoe::cuda
