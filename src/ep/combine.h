// The deterministic combine on the CPU, shared by every CPU backend so that all of them produce
// the same bits: y[t] = sum_{k=0..K-1} w[t,k] * rows[t*K + k], in slot order,
// in fp32, starting from zero.
#pragma once

#include <cstdint>

#include "ep/backend.h"

namespace epmoe {

// rows: [T*K, H] expert outputs per (token, slot); y: [T, H].
void combine_slots(int64_t T, int H, int K, const float* weights, const float* rows, float* y);

}  // namespace epmoe
