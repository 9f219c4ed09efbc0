// f32_to_fp8e4m3 (tensor/dtype.h): every finite code is its own encoding, ties go to the even
// code, values beyond 448 saturate, NaN gives the NaN code; and between codes the nearest wins.
#include <gtest/gtest.h>

#include <cmath>

#include "tensor/dtype.h"

namespace epmoe {
namespace {

TEST(Fp8Encode, EveryFiniteCodeRoundTrips) {
  for (int c = 0; c < 256; c++) {
    if ((c & 0x7f) == 0x7f) continue;
    const float v = fp8e4m3_to_f32(uint8_t(c));
    EXPECT_EQ(f32_to_fp8e4m3(v), c) << c << " " << v;
  }
}

TEST(Fp8Encode, NearestWithTiesToEven) {
  EXPECT_EQ(f32_to_fp8e4m3(1.0625f), 0x38);   // halfway 1 .. 1.125 -> the even 1
  EXPECT_EQ(f32_to_fp8e4m3(1.1875f), 0x3a);   // halfway 1.125 .. 1.25 -> 1.25
  EXPECT_EQ(f32_to_fp8e4m3(1.07f), 0x39);     // past halfway
  EXPECT_EQ(f32_to_fp8e4m3(0x1p-10f), 0x00);  // half the smallest subnormal -> 0
  EXPECT_EQ(f32_to_fp8e4m3(0x1.8p-9f), 0x02); // 1.5 x 2^-9 -> 2 x 2^-9
  EXPECT_EQ(f32_to_fp8e4m3(0x1.fp-7f), 0x08); // rounds up into the smallest normal
  EXPECT_EQ(f32_to_fp8e4m3(1.96875f), 0x40);  // halfway 1.875 .. 2 -> 2 (mantissa carries)
  EXPECT_EQ(f32_to_fp8e4m3(-3.1f), 0xc4 + 0); // -3 (0xc4: sign, exponent 8, mantissa 4)
  EXPECT_EQ(fp8e4m3_to_f32(0xc4), -3.0f);
}

TEST(Fp8Encode, SaturatesAndKeepsNaN) {
  EXPECT_EQ(f32_to_fp8e4m3(448.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(463.9f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(464.0f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(1e30f), 0x7e);
  EXPECT_EQ(f32_to_fp8e4m3(-INFINITY), 0xfe);
  EXPECT_EQ(f32_to_fp8e4m3(NAN), 0x7f);
  EXPECT_EQ(f32_to_fp8e4m3(-0.0f), 0x80);
}

TEST(Fp8Encode, TheNearestCodeOfManyValues) {
  // Against a search over all codes, for values spread over the whole range.
  for (int i = 0; i < 20000; i++) {
    const float v = std::ldexp(1.0f + float(i % 997) / 997.0f, i % 19 - 11) * (i % 2 ? -1.0f : 1.0f);
    const uint8_t c = f32_to_fp8e4m3(v);
    const double got = std::fabs(double(fp8e4m3_to_f32(c)) - v);
    for (int d = 0; d < 256; d++) {
      if ((d & 0x7f) == 0x7f) continue;
      ASSERT_LE(got, std::fabs(double(fp8e4m3_to_f32(uint8_t(d))) - v)) << v << " -> " << int(c) << ", " << d << " is nearer";
    }
  }
}

}  // namespace
}  // namespace epmoe
