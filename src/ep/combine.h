// The deterministic combine and the grouping of rows by expert, shared by every backend so that
// all of them produce the same bits: y[t] = sum_{k=0..K-1} w[t,k] * rows[t*K + k], in slot order,
// in fp32, starting from zero.
#pragma once

#include <cstdint>

#include "ep/backend.h"

namespace epmoe {

// rows: [T*K, H] expert outputs per (token, slot); y: [T, H].
void combine_slots(int64_t T, int H, int K, const float* weights, const float* rows, float* y);

// Runs `expert` on rows grouped by physical expert. in: [n, H]; expert_of: [n] physical ids
// (all owned by this rank); out: [n, H] in the input order. Rows of one expert keep their input
// order, so the work is a pure function of the rows.
void run_experts_grouped(int64_t n, int H, const float* in, const int32_t* expert_of,
                         const ExpertFn& expert, float* out);

}  // namespace epmoe
