#include "kernels/ops.h"

#include <algorithm>
#include <cmath>

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

void Rope::apply(float* x, int heads, int64_t pos) const {
  const int half = rotary_dim / 2;
  thread_local std::vector<float> cs, sn;
  cs.resize(static_cast<size_t>(half));
  sn.resize(static_cast<size_t>(half));
  for (int i = 0; i < half; i++) {
    const float f = float(pos) * inv_freq[size_t(i)];
    cs[size_t(i)] = std::cos(f);
    sn[size_t(i)] = std::sin(f);
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
