// The GPU backends over NCCL (src/ep/nccl/*.cu) and the single-GPU path (src/ep/cuda/). Only the
// registry (ep/registry.cc) calls these, and only in a build with CUDA. No CUDA types here.
#pragma once

#include <memory>

#include "ep/backend.h"

namespace epmoe {

class NcclGroup;

std::unique_ptr<A2ABackend> make_nccl_none_backend(NcclGroup& g, const Placement& p, const BackendOptions& o);
std::unique_ptr<A2ABackend> make_nccl_alltoall_backend(NcclGroup& g, const Placement& p, const BackendOptions& o);
// Peers' buffers mapped over CUDA IPC, records and answers written straight into them
// (ep/nccl/ipc_backends.cu): onesided (a record per (token, rank), capacity for every token) and
// lowlatency (a record per (token, slot), fixed capacity per round, further rounds).
std::unique_ptr<A2ABackend> make_ipc_onesided_backend(NcclGroup& g, const Placement& p, const BackendOptions& o);
std::unique_ptr<A2ABackend> make_ipc_lowlatency_backend(NcclGroup& g, const Placement& p, const BackendOptions& o);
// fused: onesided's exchange in chunks, pipelined over two streams.
std::unique_ptr<A2ABackend> make_ipc_fused_backend(NcclGroup& g, const Placement& p, const BackendOptions& o);
// The single-GPU reference (every expert local, no communication).
std::unique_ptr<A2ABackend> make_cuda_local_backend(const Placement& p, const BackendOptions& o);

}  // namespace epmoe
