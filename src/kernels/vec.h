// Small vector helpers for the row-wise parts of the decoder (attention, norms): 16-lane GCC
// vector extensions with a fixed reduction order, so results do not depend on the batch.
#pragma once

#include <cstdint>
#include <cstring>

namespace epmoe {

// sum_i a[i] * b[i]: 16 lanes over i = 16c + l, a fixed tree over the lanes, then the tail.
inline float dot(const float* a, const float* b, int64_t n) {
  typedef float v16 __attribute__((vector_size(64)));
  v16 acc = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v16 x, y;
    std::memcpy(&x, a + i, 64);
    std::memcpy(&y, b + i, 64);
    acc += x * y;
  }
  float s8[8], s4[4];
  for (int l = 0; l < 8; l++) s8[l] = acc[l] + acc[l + 8];
  for (int l = 0; l < 4; l++) s4[l] = s8[l] + s8[l + 4];
  float s = (s4[0] + s4[2]) + (s4[1] + s4[3]);
  for (; i < n; i++) s += a[i] * b[i];
  return s;
}

// y[i] += a * x[i], 16 lanes at a time: each element is the same multiply and add as the scalar
// loop (no contraction to FMA), so the bits are those of the loop -- which GCC at -O2 leaves
// scalar, since x and y might alias.
inline void axpy(float a, const float* x, float* y, int64_t n) {
  typedef float v16 __attribute__((vector_size(64)));
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    v16 xv, yv;
    std::memcpy(&xv, x + i, 64);
    std::memcpy(&yv, y + i, 64);
    yv += a * xv;
    std::memcpy(y + i, &yv, 64);
  }
  for (; i < n; i++) y[i] += a * x[i];
}

}  // namespace epmoe
