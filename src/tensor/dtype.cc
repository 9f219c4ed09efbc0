#include "tensor/dtype.h"

#include <cmath>

namespace epmoe {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::F16: case DType::BF16: case DType::I16: return 2;
    case DType::I8: case DType::U8: case DType::BOOL: case DType::F8_E4M3: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::F64: return "F64";
    case DType::I64: return "I64";
    case DType::I32: return "I32";
    case DType::I16: return "I16";
    case DType::I8: return "I8";
    case DType::U8: return "U8";
    case DType::BOOL: return "BOOL";
    case DType::F8_E4M3: return "F8_E4M3";
  }
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view s) {
  for (DType t : {DType::F32, DType::F16, DType::BF16, DType::F64, DType::I64, DType::I32,
                  DType::I16, DType::I8, DType::U8, DType::BOOL, DType::F8_E4M3})
    if (dtype_name(t) == s) return t;
  return std::nullopt;
}

bool dtype_is_float_weight(DType t) {
  return t == DType::F32 || t == DType::F16 || t == DType::BF16;
}

uint8_t f32_to_fp8e4m3(float f) {
  if (std::isnan(f)) return 0x7f;
  const uint8_t sign = std::signbit(f) ? 0x80 : 0;
  const float a = std::fabs(f);
  if (a >= 464.0f) return sign | 0x7e;  // at or beyond the midpoint of 448 and the NaN code's 480
  if (a < 0x1p-6f) return sign | uint8_t(std::nearbyint(a * 0x1p9f));  // subnormals m 2^-9 (8: the smallest normal)
  int e;
  const float m = std::frexp(a, &e);  // a = m 2^e, m in [0.5, 1)
  int mant = int(std::nearbyint((m * 2.0f - 1.0f) * 8.0f));  // exact: m has few bits
  int biased = e - 1 + 7;
  if (mant == 8) {
    mant = 0;
    biased++;
  }
  if (biased > 15 || (biased == 15 && mant == 7)) return sign | 0x7e;
  return sign | uint8_t(biased << 3 | mant);
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  int exp = (h >> 10) & 0x1f;
  uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: renormalise
      float f = std::ldexp(float(mant), -24);
      std::memcpy(&bits, &f, 4);
      bits |= sign;
    }
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | (uint32_t(exp - 15 + 127) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000;
  int exp = int((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffff;
  if (((x >> 23) & 0xff) == 0xff) return uint16_t(sign | 0x7c00 | (mant ? 0x200 : 0));
  if (exp >= 31) return uint16_t(sign | 0x7c00);
  if (exp <= 0) {
    if (exp < -10) return uint16_t(sign);
    mant |= 0x800000;
    int shift = 14 - exp;
    uint32_t half = mant >> shift;
    uint32_t rem = mant & ((1u << shift) - 1);
    uint32_t mid = 1u << (shift - 1);
    if (rem > mid || (rem == mid && (half & 1))) half++;
    return uint16_t(sign | half);
  }
  uint32_t half = sign | (uint32_t(exp) << 10) | (mant >> 13);
  uint32_t rem = mant & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (half & 1))) half++;
  return uint16_t(half);
}

}  // namespace epmoe
