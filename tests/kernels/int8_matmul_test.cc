// Int8 rows (tensor/quantize.h, `--lm-head int8`) in matmul: bit for bit the block form of
// matmul_micro.h (each 32-column block's products summed per lane, then times the block's scale),
// written out here as scalar code, on every kernel path and in both compute modes, at every T (the
// few-token and the tiled drivers), for partial blocks, K tails and K blocks; so a row's bits never
// depend on the batch. And the error against the unquantized weights stays within the quantizer's
// bound, sum_k |x_k| s_k / 2, plus the fp32 rounding of the sums.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "common/kernel_path_fixture.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"
#include "util/error.h"
#include "util/threads.h"

namespace epmoe {
namespace {

using test::PathMode;
class Int8Paths : public test::KernelPathTest {};

std::vector<float> randn(size_t n, uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// matmul_micro.h's definition of one output element.
float block_form(const float* x, const QuantizedMatrix& q, int64_t n) {
  const int64_t K = q.view.shape[1], blocks = (K + kI8Block - 1) / kI8Block, kb = K / 32 * 32;
  const int8_t* c = &q.codes[size_t(n * K)];
  auto scale = [&](int64_t k) { return bf16_to_f32(q.scales[size_t(n * blocks + k / 32)]); };
  float tot[16] = {};
  for (int64_t k = 0; k < kb; k += 32)
    for (int l = 0; l < 16; l++) {
      float p = x[k + l] * float(c[k + l]);
      p = std::fma(x[k + 16 + l], float(c[k + 16 + l]), p);
      tot[l] = std::fma(p, scale(k), tot[l]);
    }
  float s8[8], s4[4];
  for (int i = 0; i < 8; i++) s8[i] = tot[i] + tot[i + 8];
  for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
  float y = (s4[0] + s4[2]) + (s4[1] + s4[3]);
  for (int64_t k = kb; k < K; k++) {
    const float w = float(c[k]) * scale(k);
    const float prod = x[k] * w;
    y = y + prod;
  }
  return y;
}

struct Int8Shape {
  int64_t N, K;
};
// K: one block, partial blocks (48, 100), tails of the 16-lane step (17, 100), a long row (2048)
// and the tiled driver's K blocks (4200 > 4096).
const Int8Shape kInt8Shapes[] = {{37, 32}, {20, 48}, {9, 17}, {33, 100}, {64, 2048}, {6, 4200}};
const int64_t kInt8Ts[] = {1, 2, 3, 8, 9, 33};

TEST_P(Int8Paths, BitEqualToTheBlockFormAndWithinTheQuantizationBound) {
  for (const Int8Shape& sh : kInt8Shapes) {
    const std::vector<float> w = randn(size_t(sh.N * sh.K), uint64_t(sh.N * 131 + sh.K), 0.05f);
    const TensorView Wf{DType::F32, {sh.N, sh.K}, w.data(), "w", {}};
    const QuantizedMatrix q = quantize_rows_int8(Wf);
    const std::vector<float> deq = to_f32(q.view);
    for (int64_t T : kInt8Ts) {
      const std::vector<float> x = randn(size_t(T * sh.K), uint64_t(T * 7 + sh.K));
      std::vector<float> y(size_t(T * sh.N)), exact(size_t(T * sh.N));
      matmul(x.data(), T, q.view, y.data(), mode());
      matmul_ref(x.data(), T, Wf, exact.data());
      const int64_t blocks = (sh.K + kI8Block - 1) / kI8Block;
      for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < sh.N; n++) {
          const float want = block_form(&x[size_t(t * sh.K)], q, n);
          const float got = y[size_t(t * sh.N + n)];
          ASSERT_EQ(std::memcmp(&got, &want, 4), 0)
              << "N " << sh.N << " K " << sh.K << " T " << T << " t " << t << " n " << n << ": " << got << " vs " << want;
          double bound = 0, mag = 0;
          for (int64_t k = 0; k < sh.K; k++) {
            const double s = bf16_to_f32(q.scales[size_t(n * blocks + k / kI8Block)]);
            bound += std::fabs(x[size_t(t * sh.K + k)]) * s / 2;
            mag += std::fabs(double(x[size_t(t * sh.K + k)]) * deq[size_t(n * sh.K + k)]);
          }
          const double err = std::fabs(double(got) - exact[size_t(t * sh.N + n)]);
          ASSERT_LE(err, bound * (1 + 1e-5) + mag * 64 * 0x1p-24) << "N " << sh.N << " K " << sh.K << " t " << t;
        }
    }
  }
}

TEST_P(Int8Paths, ARowsBitsDoNotDependOnTheBatchOrThreads) {
  const int64_t N = 150, K = 2048, T = 40;
  const std::vector<float> w = randn(size_t(N * K), 5, 0.03f);
  const QuantizedMatrix q = quantize_rows_int8(TensorView{DType::F32, {N, K}, w.data(), "w", {}});
  const std::vector<float> x = randn(size_t(T * K), 6);
  std::vector<float> all(size_t(T * N));
  set_num_threads(2);
  matmul(x.data(), T, q.view, all.data(), mode());
  set_num_threads(1);
  for (int64_t t : {int64_t(0), int64_t(17), T - 1}) {
    for (int64_t len : {int64_t(1), int64_t(2), int64_t(5)}) {
      if (t + len > T) continue;
      std::vector<float> part(size_t(len * N));
      matmul(x.data() + t * K, len, q.view, part.data(), mode());
      ASSERT_EQ(std::memcmp(part.data(), all.data() + t * N, sizeof(float) * size_t(N)), 0) << t << " " << len;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, Int8Paths,
                         ::testing::Values(PathMode{KernelPath::Generic, ComputeMode::F32, "generic"},
                                           PathMode{KernelPath::Avx2, ComputeMode::F32, "avx2"},
                                           PathMode{KernelPath::Avx512, ComputeMode::F32, "avx512"},
                                           PathMode{KernelPath::Auto, ComputeMode::BF16, "auto_bf16"}),
                         [](const auto& i) { return std::string(i.param.name); });

TEST(Int8Rows, AGridOtherThanOneScalePer32ColumnsIsRefused) {
  const std::vector<float> w = randn(64 * 64, 9);
  QuantizedMatrix q = quantize_rows_int8(TensorView{DType::F32, {64, 64}, w.data(), "w", {}});
  TensorView bad = q.view;
  bad.scale.block = 64;
  std::vector<float> x(64), y(64);
  try {
    matmul(x.data(), 1, bad, y.data(), ComputeMode::F32);
    FAIL() << "a 64-column int8 grid was accepted";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("one F32 or BF16 scale per 32 columns"), std::string::npos) << e.what();
  }
  TensorView unscaled = q.view;
  unscaled.scale = {};
  EXPECT_THROW(matmul(x.data(), 1, unscaled, y.data(), ComputeMode::F32), InputError);
}

}  // namespace
}  // namespace epmoe
