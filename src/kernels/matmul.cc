#include "kernels/matmul.h"

#include <cstring>

#include "util/error.h"
#include "util/threads.h"

namespace epmoe {

namespace {

typedef float f32x16 __attribute__((vector_size(64)));
typedef uint16_t u16x16 __attribute__((vector_size(32)));
typedef uint32_t u32x16 __attribute__((vector_size(64)));

constexpr int kLanes = 16;
constexpr int kTokTile = 4;  // tokens sharing one pass over a weight row (4 accumulators + loads fit in registers)

template <DType D>
inline f32x16 load16(const void* w, int64_t k) {
  if constexpr (D == DType::F32) {
    f32x16 v;
    std::memcpy(&v, static_cast<const float*>(w) + k, 64);
    return v;
  } else if constexpr (D == DType::BF16) {
    u16x16 h;
    std::memcpy(&h, static_cast<const uint16_t*>(w) + k, 32);
    u32x16 b = __builtin_convertvector(h, u32x16) << 16;
    f32x16 v;
    std::memcpy(&v, &b, 64);
    return v;
  } else {
    f32x16 v;
    const uint16_t* p = static_cast<const uint16_t*>(w) + k;
    for (int i = 0; i < kLanes; i++) v[i] = f16_to_f32(p[i]);
    return v;
  }
}

template <DType D>
inline float load1(const void* w, int64_t k) {
  if constexpr (D == DType::F32) return static_cast<const float*>(w)[k];
  else if constexpr (D == DType::BF16) return bf16_to_f32(static_cast<const uint16_t*>(w)[k]);
  else return f16_to_f32(static_cast<const uint16_t*>(w)[k]);
}

inline float reduce16(f32x16 a) {
  // Fixed tree: 16 -> 8 -> 4 -> 2 -> 1.
  float s8[8], s4[4];
  for (int i = 0; i < 8; i++) s8[i] = a[i] + a[i + 8];
  for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

// Rows [n0, n1) of W against tokens [t0, t0 + nt), nt <= kTokTile.
template <DType D>
__attribute__((target_clones("avx512f", "avx2", "default")))
void tile(const float* x, int64_t K, const void* W, int64_t N, float* y, const float* bias,
          int64_t t0, int nt, int64_t n0, int64_t n1) {
  const size_t esz = D == DType::F32 ? 4 : 2;
  const int64_t kv = K / kLanes * kLanes;
  for (int64_t n = n0; n < n1; n++) {
    const void* w = static_cast<const char*>(W) + size_t(n * K) * esz;
    f32x16 acc[kTokTile] = {};
    for (int64_t k = 0; k < kv; k += kLanes) {
      f32x16 wv = load16<D>(w, k);
      for (int i = 0; i < nt; i++) {
        f32x16 xv;
        std::memcpy(&xv, x + (t0 + i) * K + k, 64);
        acc[i] += xv * wv;
      }
    }
    for (int i = 0; i < nt; i++) {
      float s = reduce16(acc[i]);
      for (int64_t k = kv; k < K; k++) s += x[(t0 + i) * K + k] * load1<D>(w, k);
      if (bias) s += bias[n];
      y[(t0 + i) * N + n] = s;
    }
  }
}

template <DType D>
void matmul_typed(const float* x, int64_t T, int64_t K, const void* W, int64_t N, float* y, const float* bias) {
  // Threads split the output columns (weight rows): each weight byte is read by one thread only,
  // which is what a memory-bound decode step wants.
  const int64_t min_rows = std::max<int64_t>(1, 16384 / std::max<int64_t>(1, K * T));
  parallel_for(N, min_rows, [&](int64_t n0, int64_t n1) {
    for (int64_t t0 = 0; t0 < T; t0 += kTokTile) {
      int nt = int(std::min<int64_t>(kTokTile, T - t0));
      tile<D>(x, K, W, N, y, bias, t0, nt, n0, n1);
    }
  });
}

}  // namespace

void matmul(const float* x, int64_t T, const TensorView& W, float* y, const float* bias) {
  EPMOE_ASSERT(W.rank() == 2, "matmul weight " + W.name + " must be 2-D, is " + W.shape_str());
  const int64_t N = W.shape[0], K = W.shape[1];
  if (T == 0 || N == 0) return;
  switch (W.dtype) {
    case DType::F32: return matmul_typed<DType::F32>(x, T, K, W.data, N, y, bias);
    case DType::BF16: return matmul_typed<DType::BF16>(x, T, K, W.data, N, y, bias);
    case DType::F16: return matmul_typed<DType::F16>(x, T, K, W.data, N, y, bias);
    default: throw InputError("tensor '" + W.name + "' has dtype " + std::string(dtype_name(W.dtype)) +
                              "; weights must be F32, BF16 or F16");
  }
}

void matmul_ref(const float* x, int64_t T, const TensorView& W, float* y, const float* bias) {
  const int64_t N = W.shape[0], K = W.shape[1];
  for (int64_t t = 0; t < T; t++)
    for (int64_t n = 0; n < N; n++) {
      double s = bias ? bias[n] : 0.0;
      for (int64_t k = 0; k < K; k++) s += double(x[t * K + k]) * double(W.at(n * K + k));
      y[t * N + n] = float(s);
    }
}

}  // namespace epmoe
