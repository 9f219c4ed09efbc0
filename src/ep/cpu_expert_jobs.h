// ExpertJobs on the CPU: the served (row, slot) jobs grouped by physical expert, each group's rows
// gathered in (row, slot) order, run by one callable per expert, and scattered to their output
// rows (ep/backend.h says where). Shared by every CPU expert runner (moe/: the model's experts;
// check/: the audit's probe experts), so that all of them serve exactly the same jobs.
#pragma once

#include <cstdint>
#include <functional>

#include "ep/backend.h"

namespace epmoe {

// Rows in, rows out, for one physical expert: in [n, H] -> out [n, H]. Must be batch-invariant.
using ExpertRowsFn = std::function<void(int physical, const float* in, int64_t n, float* out)>;

// Serves the jobs whose physical id lies in [p0, p0 + n_local); out as ExpertJobs says (fp32).
void run_jobs_grouped(const ExpertJobs& jobs, int H, int p0, int n_local, const ExpertRowsFn& fn, float* out);

}  // namespace epmoe
