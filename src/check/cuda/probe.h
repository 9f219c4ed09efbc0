// The audit's probe experts on the GPU (check/probe.h, check/audit.h): physical expert p multiplies
// its rows by audit_probe_scale(placement, p). No CUDA types here: check/probe.cc includes it.
#pragma once

#include <memory>

#include "ep/backend.h"
#include "ep/placement.h"

namespace epmoe {

// Probe experts of the physical experts `rank` owns under `placement`, rows of H fp32 elements
// (the audit runs fp32 tokens, so that probe outputs are exact), on the process's GPU.
std::unique_ptr<ExpertRunner> make_cuda_probe_runner(const Placement& placement, int rank, int H);

}  // namespace epmoe
