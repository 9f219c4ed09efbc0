// The audit's probe experts (check/audit.h): physical expert p multiplies its rows by
// audit_probe_scale(placement, p). They serve exactly the jobs the model's experts would (the same
// ExpertJobs, the same plan), so every backend's dispatch, answer layout and combine are
// exercised; only the arithmetic in between is replaced, and it needs no weights.
#pragma once

#include <memory>

#include "ep/backend.h"
#include "ep/placement.h"
#include "tensor/device.h"

namespace epmoe {

// Probe experts of the physical experts `rank` owns under `placement`, on `device`, rows of H.
std::unique_ptr<ExpertRunner> make_probe_runner(Device device, const Placement& placement, int rank, int H);

}  // namespace epmoe
