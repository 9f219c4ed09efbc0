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

// Rotary embedding on the first rotary_dim dims of each head; dims past rotary_dim pass through
// (partial rotary, GLM4-MoE). Half-split rotation ("rotate_half": dim i pairs with i + half), or
// interleaved (dim 2i pairs with 2i + 1: DeepSeek's latent attention). cos and sin are scaled by
// attention_factor (YaRN), computed in fp32 as transformers does.
struct Rope {
  int head_dim = 0, rotary_dim = 0;
  std::vector<float> inv_freq;  // rotary_dim / 2
  float attention_factor = 1.0f;
  bool interleaved = false;
  Rope() = default;
  Rope(int head_dim, int rotary_dim, float theta);  // default rope: inv_freq = theta^(-2i / dim)
  Rope(int head_dim, int rotary_dim, std::vector<float> inv_freq, float attention_factor, bool interleaved);
  // x: [heads, head_dim] of one token at position pos, rotated in place.
  void apply(float* x, int heads, int64_t pos) const;
  // The same for q [q_heads, head_dim] and k [k_heads, head_dim] of one token: the angles once.
  void apply(float* q, int q_heads, float* k, int k_heads, int64_t pos) const;
};

// YaRN's inv_freq (transformers _compute_yarn_parameters), fp32 like torch: interpolated
// (1 / (factor * theta^(2i/dim))) below the correction range of beta_fast..beta_slow rotations
// over original_max_positions, extrapolated above it, a linear ramp between.
std::vector<float> yarn_inv_freq(int dim, float theta, double factor, int original_max_positions, double beta_fast,
                                 double beta_slow, bool truncate);

// In-place softmax over n values (max-subtracted, fp32).
void softmax(float* x, int64_t n);

// out[i] = silu(gate[i]) * up[i]
void silu_mul(const float* gate, const float* up, int64_t n, float* out);

inline float silu(float g) { return g / (1.0f + std::exp(-g)); }

}  // namespace epmoe
