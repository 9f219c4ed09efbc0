// The single-process reference on the CPU: every expert local, no communication. Only the registry
// (ep/registry.cc, make_local_backend) calls it.
#pragma once

#include <memory>

#include "ep/backend.h"

namespace epmoe {

std::unique_ptr<A2ABackend> make_cpu_local_backend(const Placement& p, const BackendOptions& o);

}  // namespace epmoe
