// Row-wise operations of the decoder, all in fp32. Each has the obvious scalar form; they are
// small next to the matmuls, so they stay readable rather than hand-vectorised.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "tensor/view.h"

namespace epmoe {

// out[t] = x[t] / sqrt(mean(x[t]^2) + eps) * w   (HF: normalise in fp32, weight after)
void rmsnorm(const float* x, int64_t T, int64_t H, const std::vector<float>& w, float eps, float* out);

// Rotary embedding, default rope, half-split rotation ("rotate_half") on the first rotary_dim
// dims of each head; dims past rotary_dim pass through (partial rotary, GLM4-MoE).
struct Rope {
  int head_dim = 0, rotary_dim = 0;
  std::vector<float> inv_freq;  // rotary_dim / 2
  Rope() = default;
  Rope(int head_dim, int rotary_dim, float theta);
  // x: [heads, head_dim] of one token at position pos, rotated in place.
  void apply(float* x, int heads, int64_t pos) const;
};

// In-place softmax over n values (max-subtracted, fp32).
void softmax(float* x, int64_t n);

// out[i] = silu(gate[i]) * up[i]
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

inline float silu(float g) { return g / (1.0f + std::exp(-g)); }

}  // namespace epmoe
