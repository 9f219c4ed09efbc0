// Storage dtypes as safetensors names them, and the scalar conversions to fp32.
// Activations are always fp32; weights stay in their stored dtype and are converted on the fly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

namespace epmoe {

// F8_E4M3: the e4m3fn byte of FP8 block-quantized checkpoints (no Inf; 0x7f/0xff are NaN), always
// paired with a block scale (tensor/view.h BlockScale): its value alone is not the weight.
enum class DType { F32, F16, BF16, F64, I64, I32, I16, I8, U8, BOOL, F8_E4M3 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);                  // safetensors spelling: "F32", "BF16", ...
std::optional<DType> dtype_from_name(std::string_view s);
bool dtype_is_float_weight(DType t);                   // F32, F16, BF16: what kernels accept unscaled

inline float bf16_to_f32(uint16_t h) {
  uint32_t bits = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// Round to nearest even, as torch does when casting fp32 -> bf16 (NaN stays NaN).
inline uint16_t f32_to_bf16(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return uint16_t((bits >> 16) | 0x40);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return uint16_t(bits >> 16);
}

// e4m3fn -> fp32, exact (every e4m3 value is an fp32): the byte's exponent and mantissa bits
// placed under fp32's and the result scaled by 2^120 (the bias difference 127 - 7), which also
// turns the e4m3 subnormals (exponent 0) into the right normal fp32s. NaN codes give NaN.
inline float fp8e4m3_to_f32(uint8_t b) {
  if ((b & 0x7f) == 0x7f) return __builtin_nanf("");
  uint32_t bits = uint32_t(b & 0x7f) << 20;
  float f;
  std::memcpy(&f, &bits, 4);
  f *= 0x1p120f;
  return (b & 0x80) ? -f : f;
}

// fp32 -> e4m3fn, rounded to nearest even, saturating at +-448 (as FP8 checkpoints are made:
// weights over the block's scale; no Inf exists); NaN gives 0x7f.
uint8_t f32_to_fp8e4m3(float f);

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);

}  // namespace epmoe
