// The CPU backends over MPI (src/ep/mpi/*.cc). Only the registry (ep/registry.cc) calls these.
#pragma once

#include <memory>

#include "comm/mpi_group.h"
#include "ep/backend.h"

namespace epmoe {

std::unique_ptr<A2ABackend> make_mpi_none_backend(MpiGroup& g, const Placement& p, const BackendOptions& o);
std::unique_ptr<A2ABackend> make_mpi_alltoall_backend(MpiGroup& g, const Placement& p, const BackendOptions& o);
std::unique_ptr<A2ABackend> make_mpi_lowlatency_backend(MpiGroup& g, const Placement& p, const BackendOptions& o);
std::unique_ptr<A2ABackend> make_mpi_onesided_backend(MpiGroup& g, const Placement& p, const BackendOptions& o);
std::unique_ptr<A2ABackend> make_mpi_fused_backend(MpiGroup& g, const Placement& p, const BackendOptions& o);
}  // namespace epmoe
