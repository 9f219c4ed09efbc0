#include "kernels/ops.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "kernels/vec.h"

namespace epmoe {

void rmsnorm(const float* x, int64_t T, int64_t H, const std::vector<float>& w, float eps, float* out) {
  for (int64_t t = 0; t < T; t++) {
    const float* r = x + t * H;
    float* o = out + t * H;
    const float ss = dot(r, r, H);
    const float inv = 1.0f / std::sqrt(ss / float(H) + eps);
    for (int64_t i = 0; i < H; i++) o[i] = w[size_t(i)] * (r[i] * inv);
  }
}

Rope::Rope(int hd, int rd, float theta) : head_dim(hd), rotary_dim(rd) {
  // As transformers: inv_freq = 1 / theta^(2i / dim), computed in fp32.
  for (int i = 0; i < rd / 2; i++)
    inv_freq.push_back(1.0f / std::pow(theta, float(2 * i) / float(rd)));
}

Rope::Rope(int hd, int rd, std::vector<float> f, float af, bool il)
    : head_dim(hd), rotary_dim(rd), inv_freq(std::move(f)), attention_factor(af), interleaved(il) {}

std::vector<float> yarn_inv_freq(int dim, float theta, double factor, int orig, double beta_fast, double beta_slow,
                                 bool truncate) {
  // find_correction_dim / find_correction_range in double, as Python's math does.
  auto correction_dim = [&](double rotations) {
    return (dim * std::log(double(orig) / (rotations * 2.0 * M_PI))) / (2.0 * std::log(double(theta)));
  };
  double low = correction_dim(beta_fast), high = correction_dim(beta_slow);
  if (truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, double(dim - 1));
  if (low == high) high += 0.001;  // linear_ramp_factor avoids a division by zero
  const int half = dim / 2;
  std::vector<float> out(static_cast<size_t>(half));
  for (int i = 0; i < half; i++) {
    const float pos_freq = std::pow(theta, float(2 * i) / float(dim));
    const float extrapolation = 1.0f / pos_freq;
    const float interpolation = 1.0f / (float(factor) * pos_freq);
    const float ramp = std::clamp((float(i) - float(low)) / float(high - low), 0.0f, 1.0f);
    const float extrapolation_factor = 1.0f - ramp;
    out[size_t(i)] = interpolation * (1.0f - extrapolation_factor) + extrapolation * extrapolation_factor;
  }
  return out;
}

void Rope::apply(float* x, int heads, int64_t pos) const { apply(x, heads, nullptr, 0, pos); }

void Rope::apply(float* q, int q_heads, float* k, int k_heads, int64_t pos) const {
  const int half = rotary_dim / 2;
  thread_local std::vector<float> cs, sn;
  cs.resize(static_cast<size_t>(half));
  sn.resize(static_cast<size_t>(half));
  for (int i = 0; i < half; i++) {
    const float f = float(pos) * inv_freq[size_t(i)];
    cs[size_t(i)] = std::cos(f) * attention_factor;
    sn[size_t(i)] = std::sin(f) * attention_factor;
  }
  auto rotate = [&](float* x, int heads) {
    if (interleaved) {
      // Pairs (2i, 2i + 1), written back in place: q and k are rotated alike, so q.k is the one of
      // transformers' de-interleaved layout.
      for (int h = 0; h < heads; h++) {
        float* v = x + int64_t(h) * head_dim;
        for (int i = 0; i < half; i++) {
          const float a = v[2 * i], b = v[2 * i + 1];
          const float c = cs[size_t(i)], s = sn[size_t(i)];
          v[2 * i] = a * c - b * s;
          v[2 * i + 1] = b * c + a * s;
        }
      }
      return;
    }
    for (int h = 0; h < heads; h++) {
      float* v = x + int64_t(h) * head_dim;
      for (int i = 0; i < half; i++) {
        const float a = v[i], b = v[i + half];
        const float c = cs[size_t(i)], s = sn[size_t(i)];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  };
  rotate(q, q_heads);
  if (k) rotate(k, k_heads);
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  float m = *std::max_element(x, x + n);
  float s = 0.f;
  for (int64_t i = 0; i < n; i++) {
    x[i] = std::exp(x[i] - m);
    s += x[i];
  }
  const float inv = 1.0f / s;
  for (int64_t i = 0; i < n; i++) x[i] *= inv;
}

void silu_mul(const float* gate, const float* up, int64_t n, float* out) {
  for (int64_t i = 0; i < n; i++) out[i] = silu(gate[i]) * up[i];
}

}  // namespace epmoe
