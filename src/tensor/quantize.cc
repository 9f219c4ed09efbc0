#include "tensor/quantize.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "util/error.h"
#include "util/threads.h"

namespace epmoe {

namespace {

// The smallest bf16 >= f (f finite, >= 0): truncate, then step up once if bits were cut.
uint16_t bf16_round_up(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  const uint16_t hi = uint16_t(bits >> 16);
  return (bits & 0xffffu) ? uint16_t(hi + 1) : hi;
}

}  // namespace

QuantizedMatrix quantize_rows_int8(const TensorView& W) {
  if (W.rank() != 2) throw InputError("int8 quantization of '" + W.name + "': must be 2-D, is " + W.shape_str());
  if (!dtype_is_float_weight(W.dtype) || !W.scale.empty())
    throw InputError("int8 quantization of '" + W.name + "': dtype " + std::string(dtype_name(W.dtype)) +
                     (W.scale.empty() ? "" : " with block scales") + "; only F32, BF16 or F16 weights are quantized");
  const int64_t N = W.shape[0], K = W.shape[1], blocks = (K + kI8Block - 1) / kI8Block;
  QuantizedMatrix m;
  m.codes.resize(size_t(N * K));
  m.scales.resize(size_t(N * blocks));
  parallel_for(N, std::max<int64_t>(1, 65536 / std::max<int64_t>(1, K)), [&](int64_t n0, int64_t n1) {
    std::vector<float> w(static_cast<size_t>(K));
    for (int64_t n = n0; n < n1; n++) {
      for (int64_t k = 0; k < K; k++) {
        const int64_t i = n * K + k;
        w[size_t(k)] = W.dtype == DType::BF16 ? bf16_to_f32(static_cast<const uint16_t*>(W.data)[i]) : W.at(i);
        if (!std::isfinite(w[size_t(k)]))
          throw InputError("int8 quantization of '" + W.name + "': " + (std::isnan(w[size_t(k)]) ? "NaN" : "Inf") +
                           " at row " + std::to_string(n) + ", column " + std::to_string(k));
      }
      for (int64_t b = 0; b < blocks; b++) {
        const int64_t k0 = b * kI8Block, k1 = std::min(K, k0 + kI8Block);
        float amax = 0.0f;
        for (int64_t k = k0; k < k1; k++) amax = std::max(amax, std::fabs(w[size_t(k)]));
        const uint16_t sb = bf16_round_up(amax / 127.0f);
        m.scales[size_t(n * blocks + b)] = sb;
        const float s = bf16_to_f32(sb);
        for (int64_t k = k0; k < k1; k++) {
          // s >= max|w| / 127 up to the division's rounding, so |w / s| < 127.5: the clamp only
          // catches that last ulp.
          const float q = s == 0.0f ? 0.0f : std::nearbyint(w[size_t(k)] / s);
          m.codes[size_t(n * K + k)] = int8_t(std::clamp(q, -127.0f, 127.0f));
        }
      }
    }
  });
  m.view.dtype = DType::I8;
  m.view.shape = {N, K};
  m.view.data = m.codes.data();
  m.view.name = W.name + " (int8)";
  m.view.scale.data = m.scales.data();
  m.view.scale.dtype = DType::BF16;
  m.view.scale.rows = N;
  m.view.scale.cols = blocks;
  m.view.scale.block = kI8Block;
  m.view.scale.row_block = 1;
  return m;
}

}  // namespace epmoe
