// Int8 rows (tensor/quantize.h): the scale of each 32-column block is the smallest bf16 at or
// above max|w| / 127, every code is w / s rounded to nearest even within [-127, 127], so the error
// is at most s / 2 per weight; the view dequantizes to q * s; bad input is refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/quantize.h"
#include "util/error.h"
#include "util/threads.h"

namespace epmoe {
namespace {

struct Bf16Matrix {
  std::vector<uint16_t> bits;
  TensorView view;
};

// N x K bf16 weights: normal draws whose magnitude changes by row (2^-20 .. 2^6), a zero block,
// a block holding one nonzero value, and exact ties (w / s = k + 1/2) in the last row.
Bf16Matrix make_weights(int64_t N, int64_t K, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, 1.0f);
  Bf16Matrix m;
  m.bits.resize(size_t(N * K));
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < K; k++) m.bits[size_t(n * K + k)] = f32_to_bf16(std::ldexp(d(rng), int(n % 27) - 20));
  for (int64_t k = 0; k < std::min<int64_t>(K, kI8Block); k++) m.bits[size_t(1 * K + k)] = 0;  // row 1, block 0: zeros
  for (int64_t k = 0; k < std::min<int64_t>(K, kI8Block); k++) m.bits[size_t(2 * K + k)] = k == 7 ? f32_to_bf16(-3.0f) : 0;
  m.view.dtype = DType::BF16;
  m.view.shape = {N, K};
  m.view.data = m.bits.data();
  m.view.name = "test.weight";
  return m;
}

TEST(Int8Rows, ScaleIsTheSmallestBf16AtOrAboveAmaxOver127) {
  const int64_t N = 40, K = 100;  // 100 = 3 full blocks + a partial one of 4
  const Bf16Matrix w = make_weights(N, K, 1);
  const QuantizedMatrix q = quantize_rows_int8(w.view);
  const int64_t blocks = 4;
  ASSERT_EQ(q.scales.size(), size_t(N * blocks));
  for (int64_t n = 0; n < N; n++)
    for (int64_t b = 0; b < blocks; b++) {
      double amax = 0;
      for (int64_t k = b * kI8Block; k < std::min(K, (b + 1) * kI8Block); k++)
        amax = std::max(amax, std::fabs(double(bf16_to_f32(w.bits[size_t(n * K + k)]))));
      const uint16_t sb = q.scales[size_t(n * blocks + b)];
      const double s = bf16_to_f32(sb);
      if (amax == 0) {
        EXPECT_EQ(sb, 0) << n << " " << b;
        continue;
      }
      // At or above, up to the rounding of the fp32 division; and the bf16 below is under it.
      EXPECT_GE(s * 127, amax * (1 - 0x1p-23)) << n << " " << b;
      EXPECT_LT(double(bf16_to_f32(uint16_t(sb - 1))) * 127, amax) << n << " " << b;
    }
  EXPECT_EQ(q.scales[size_t(1 * blocks)], 0);                              // the zero block
  // The block holding one -3: its code is the end of the range.
  EXPECT_LE(q.codes[size_t(2 * K + 7)], -126);
  EXPECT_EQ(q.codes[size_t(2 * K + 6)], 0);
}

TEST(Int8Rows, EveryCodeIsTheNearestWithinHalfAScale) {
  const int64_t N = 30, K = 70;
  const Bf16Matrix w = make_weights(N, K, 2);
  const QuantizedMatrix q = quantize_rows_int8(w.view);
  const int64_t blocks = 3;
  for (int64_t n = 0; n < N; n++)
    for (int64_t k = 0; k < K; k++) {
      const double x = bf16_to_f32(w.bits[size_t(n * K + k)]);
      const double s = bf16_to_f32(q.scales[size_t(n * blocks + k / kI8Block)]);
      const int c = q.codes[size_t(n * K + k)];
      ASSERT_LE(std::abs(c), 127);
      if (s == 0) {
        EXPECT_EQ(c, 0);
        continue;
      }
      EXPECT_LE(std::fabs(x - c * s), s / 2 * (1 + 0x1p-20)) << n << " " << k;
      // The view's element is the dequantized weight q * s, one fp32 multiply.
      EXPECT_EQ(q.view.at(n * K + k), float(c) * float(s));
    }
  // The block's largest magnitude lands on the end of the code range (s is at most 2^-8 above
  // max / 127, so its code is 126 or 127).
  const int64_t n = 5;
  int best = 0;
  for (int64_t k = 0; k < kI8Block; k++) best = std::max(best, std::abs(int(q.codes[size_t(n * K + k)])));
  EXPECT_GE(best, 126);
  EXPECT_EQ(q.view.dtype, DType::I8);
  EXPECT_EQ(q.view.scale.block, kI8Block);
  EXPECT_EQ(q.view.scale.rows_per_scale(), 1);
}

TEST(Int8Rows, TiesRoundToEven) {
  // One block: max 127 (s = 1 exactly), and values at k + 1/2.
  std::vector<float> v(kI8Block, 0.0f);
  v[0] = 127.0f;
  v[1] = 2.5f;
  v[2] = 3.5f;
  v[3] = -2.5f;
  v[4] = 0.5f;
  TensorView t;
  t.dtype = DType::F32;
  t.shape = {1, kI8Block};
  t.data = v.data();
  t.name = "ties";
  const QuantizedMatrix q = quantize_rows_int8(t);
  EXPECT_EQ(bf16_to_f32(q.scales[0]), 1.0f);
  EXPECT_EQ(q.codes[0], 127);
  EXPECT_EQ(q.codes[1], 2);
  EXPECT_EQ(q.codes[2], 4);
  EXPECT_EQ(q.codes[3], -2);
  EXPECT_EQ(q.codes[4], 0);
}

TEST(Int8Rows, SameBytesForEveryThreadCount) {
  const Bf16Matrix w = make_weights(300, 96, 3);
  set_num_threads(1);
  const QuantizedMatrix a = quantize_rows_int8(w.view);
  set_num_threads(2);
  const QuantizedMatrix b = quantize_rows_int8(w.view);
  set_num_threads(0);
  EXPECT_EQ(a.codes, b.codes);
  EXPECT_EQ(a.scales, b.scales);
}

TEST(Int8Rows, RefusesNonFiniteWeightsAndOtherDtypesByName) {
  std::vector<float> v(4 * 40, 0.5f);
  v[3 * 40 + 5] = NAN;
  TensorView t;
  t.dtype = DType::F32;
  t.shape = {4, 40};
  t.data = v.data();
  t.name = "lm_head.weight";
  try {
    quantize_rows_int8(t);
    FAIL() << "a NaN weight was quantized";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("'lm_head.weight': NaN at row 3, column 5"), std::string::npos) << e.what();
  }
  v[3 * 40 + 5] = INFINITY;
  EXPECT_THROW(quantize_rows_int8(t), InputError);
  std::vector<int32_t> ints(8);
  TensorView i{DType::I32, {2, 4}, ints.data(), "ids", {}};
  try {
    quantize_rows_int8(i);
    FAIL() << "an I32 tensor was quantized";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("dtype I32"), std::string::npos) << e.what();
  }
  TensorView flat{DType::F32, {160}, v.data(), "flat", {}};
  EXPECT_THROW(quantize_rows_int8(flat), InputError);
}

}  // namespace
}  // namespace epmoe
