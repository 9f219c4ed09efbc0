// The GPU backends over NCCL (src/ep/nccl/*.cu) and the single-GPU path (src/ep/cuda/). Only the
// registry (ep/registry.cc) calls these, and only in a build with CUDA. No CUDA types here.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "ep/backend.h"

namespace epmoe {

class NcclGroup;
class Group;

std::unique_ptr<A2ABackend> make_nccl_none_backend(NcclGroup& g, const Placement& p, const BackendOptions& o);
std::unique_ptr<A2ABackend> make_nccl_alltoall_backend(NcclGroup& g, const Placement& p, const BackendOptions& o);
// Peers' buffers mapped over CUDA IPC, records and answers written straight into them
// (ep/nccl/ipc_backends.cu): onesided (a record per (token, rank), capacity for every token),
// lowlatency (a record per (token, slot), fixed capacity per round, further rounds) and fused
// (onesided's exchange in chunks, pipelined over two streams). Over any group of processes on one
// host's GPUs (the registry passes the NCCL group and its device_peer_fault() word).
std::unique_ptr<A2ABackend> make_ipc_backend(const std::string& name, Group& g, int32_t* fault_word, const Placement& p,
                                             const BackendOptions& o);
// The single-GPU reference (every expert local, no communication).
std::unique_ptr<A2ABackend> make_cuda_local_backend(const Placement& p, const BackendOptions& o);

}  // namespace epmoe
