// Row-wise ops (src/kernels/ops.h) against the formulas evaluated in double here.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/ops.h"
#include "common/vectors.h"

namespace epmoe {
namespace {

// out = x / sqrt(mean(x^2) + eps) * w. The fp32 sum of squares drifts like sqrt(H) * eps.
TEST(Ops, RmsnormMatchesDoubleReference) {
  std::mt19937 rng(11);
  for (int64_t H : {1, 7, 16, 64, 100, 2048})
    for (int64_t T : {0, 1, 3})
      for (float eps : {1e-6f, 1e-2f}) {
        SCOPED_TRACE("H=" + std::to_string(H) + " T=" + std::to_string(T) + " eps=" + std::to_string(eps));
        // A small scale makes eps matter (mean(x^2) ~ 1e-2 next to eps = 1e-2).
        const std::vector<float> x = test::randn(rng, T * H, T == 3 ? 0.1f : 1.0f);
        const std::vector<float> w = test::randn(rng, H);
        std::vector<float> out(static_cast<size_t>(T * H), NAN);
        rmsnorm(x.data(), T, H, w, eps, out.data());
        for (int64_t t = 0; t < T; t++) {
          double ss = 0;
          for (int64_t i = 0; i < H; i++) ss += double(x[size_t(t * H + i)]) * x[size_t(t * H + i)];
          const double inv = 1.0 / std::sqrt(ss / double(H) + double(eps));
          for (int64_t i = 0; i < H; i++) {
            const double ref = double(x[size_t(t * H + i)]) * inv * w[size_t(i)];
            ASSERT_NEAR(out[size_t(t * H + i)], ref, 8 * std::sqrt(double(H)) * FLT_EPSILON * std::fabs(ref) + 1e-30)
                << "t=" << t << " i=" << i;
          }
        }
      }
}

TEST(Ops, RmsnormOfZeroIsZero) {
  // 0 / sqrt(0 + eps) = 0: eps keeps the all-zero row finite.
  const std::vector<float> x(8, 0.f), w(8, 1.f);
  std::vector<float> out(8, NAN);
  rmsnorm(x.data(), 1, 8, w, 1e-6f, out.data());
  for (float v : out) EXPECT_EQ(v, 0.f);
}

// Direct rotate_half formula in double: for i < rotary_dim / 2, with angle = pos * theta^(-2i / rotary_dim),
//   out[i]        = x[i] cos - x[i + half] sin
//   out[i + half] = x[i + half] cos + x[i] sin
// and out[j] = x[j] for j >= rotary_dim (partial rotary). The kernel computes the angle in fp32 as
// transformers does, so its error grows with the angle (about 3 ulp of it); the tolerance says so.
TEST(Ops, RopeMatchesDirectFormula) {
  std::mt19937 rng(12);
  struct Case { int head_dim, rotary_dim; float theta; };
  const Case cases[] = {{8, 8, 10000.f}, {64, 64, 10000.f}, {128, 128, 1e6f}, {64, 32, 10000.f},
                        {128, 64, 1e6f}, {10, 6, 10000.f}, {16, 2, 500.f}};
  for (const Case& c : cases)
    for (int64_t pos : {0, 1, 2, 7, 100, 4095, 32767})
      for (int heads : {1, 3}) {
        SCOPED_TRACE("head_dim=" + std::to_string(c.head_dim) + " rotary_dim=" + std::to_string(c.rotary_dim) +
                     " pos=" + std::to_string(pos) + " heads=" + std::to_string(heads));
        const Rope rope(c.head_dim, c.rotary_dim, c.theta);
        const std::vector<float> x = test::randn(rng, int64_t(heads) * c.head_dim);
        std::vector<float> y = x;
        rope.apply(y.data(), heads, pos);
        const int half = c.rotary_dim / 2;
        for (int h = 0; h < heads; h++) {
          const float* a = x.data() + h * c.head_dim;
          const float* o = y.data() + h * c.head_dim;
          for (int i = 0; i < half; i++) {
            const double e = 2.0 * i / c.rotary_dim;
            const double ang = double(pos) * std::pow(double(c.theta), -e);
            const double cs = std::cos(ang), sn = std::sin(ang);
            const double r0 = a[i] * cs - a[i + half] * sn, r1 = a[i + half] * cs + a[i] * sn;
            // fp32 angle: rounding the exponent e costs e * ln(theta) ulp of theta^-e, pow, the
            // division and the product about 3 ulp more; then a few ulp for the rotation itself.
            const double ang_err = ang * FLT_EPSILON * (3 + e * std::log(double(c.theta)));
            const double tol = (std::fabs(a[i]) + std::fabs(a[i + half])) * (ang_err + 4 * FLT_EPSILON);
            ASSERT_NEAR(o[i], r0, tol) << "head " << h << " dim " << i;
            ASSERT_NEAR(o[i + half], r1, tol) << "head " << h << " dim " << i + half;
          }
          // The pass-through part is untouched, bit for bit.
          for (int j = c.rotary_dim; j < c.head_dim; j++) ASSERT_EQ(o[j], a[j]) << "head " << h << " dim " << j;
        }
        // Position 0 is the identity (cos 0 = 1, sin 0 = 0 exactly).
        if (pos == 0) {
          EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * sizeof(float)), 0);
        }
      }
}

TEST(Ops, SoftmaxMatchesDoubleReference) {
  std::mt19937 rng(13);
  for (int64_t n : {1, 2, 5, 64, 129})
    for (float scale : {1.f, 30.f}) {
      std::vector<float> x = test::randn(rng, n, scale);
      if (n > 2) x[1] = x[0] + 1000.f;  // exp would overflow without subtracting the max
      const std::vector<float> in = x;
      softmax(x.data(), n);
      double m = in[0];
      for (float v : in) m = std::max(m, double(v));
      double z = 0;
      for (float v : in) z += std::exp(double(v) - m);
      for (int64_t i = 0; i < n; i++) {
        const double ref = std::exp(double(in[size_t(i)]) - m) / z;
        // exp is within an ulp or two; the fp32 sum of n positive terms drifts like sqrt(n) * eps.
        ASSERT_NEAR(x[size_t(i)], ref, (4 + 2 * std::sqrt(double(n))) * FLT_EPSILON * ref + 1e-38) << "n=" << n << " i=" << i;
      }
    }
}

TEST(Ops, SoftmaxOfNothingIsANoOp) {
  float sentinel = 42.f;
  softmax(&sentinel, 0);
  EXPECT_EQ(sentinel, 42.f);
}

// out = silu(gate) * up = gate / (1 + exp(-gate)) * up, including large |gate| where exp overflows.
TEST(Ops, SiluMulMatchesDoubleReference) {
  std::mt19937 rng(14);
  std::vector<float> gate = test::randn(rng, 1000, 4.f), up = test::randn(rng, 1000);
  gate[0] = 100.f;
  gate[1] = -100.f;
  gate[2] = 0.f;
  gate[3] = 1000.f;
  gate[4] = -1000.f;
  std::vector<float> out(gate.size(), NAN);
  silu_mul(gate.data(), up.data(), int64_t(gate.size()), out.data());
  for (size_t i = 0; i < gate.size(); i++) {
    const double g = gate[i];
    const double ref = g / (1.0 + std::exp(-g)) * up[i];
    ASSERT_TRUE(std::isfinite(out[i])) << "i=" << i << " gate=" << g;
    ASSERT_NEAR(out[i], ref, 4 * FLT_EPSILON * std::fabs(ref) + 1e-37) << "i=" << i << " gate=" << g;
  }
}

}  // namespace
}  // namespace epmoe
