// Every kernel path the CPU has (generic, AVX-512, AVX-512 BF16 compute), each held against the
// double reference on odd shapes, and each batch-invariant bit for bit: a row computed alone, in
// any sub-batch, or with any thread count gives the same bits; the fused SwiGLU equals the two
// matmuls followed by silu_mul.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "common/kernel_path_fixture.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "util/threads.h"
#include "common/vectors.h"

namespace epmoe {
namespace {

using PathCase = test::PathMode;
// The bf16 cases here test vdpbf16ps itself: skipped where the CPU has no AVX512-BF16.
class KernelPaths : public test::KernelPathTest {
 protected:
  void SetUp() override {
    if (GetParam().mode == ComputeMode::BF16 && !cpu_features().avx512_bf16) GTEST_SKIP() << "CPU without AVX512-BF16";
    KernelPathTest::SetUp();
  }
};

struct Mat {
  std::vector<float> f32;
  std::vector<uint16_t> half;
  TensorView v;
  Mat(DType d, int64_t n, int64_t k, std::mt19937& rng) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    v.dtype = d;
    v.shape = {n, k};
    v.name = "w";
    if (d == DType::F32) {
      f32.resize(static_cast<size_t>(n * k));
      for (auto& x : f32) x = u(rng);
      v.data = f32.data();
    } else {
      half.resize(static_cast<size_t>(n * k));
      for (auto& x : half) x = d == DType::BF16 ? f32_to_bf16(u(rng)) : f32_to_f16(u(rng));
      v.data = half.data();
    }
  }
};

TEST_P(KernelPaths, MatchesReferenceOnOddShapes) {
  std::mt19937 rng(11);
  // bf16 activations carry 8 bits of mantissa: the error per product is ~2^-9 relative.
  const double eps = GetParam().mode == ComputeMode::BF16 ? std::ldexp(1.0, -8) : 1.2e-7;
  for (DType d : {DType::F32, DType::BF16, DType::F16})
    for (int64_t K : {1, 15, 16, 31, 33, 100, 513, 1100, 4200})  // 4200: two K blocks on the tiled path
      for (int64_t N : {1, 5, 9})
        for (int64_t T : {0, 1, 3, 7, 13}) {  // <= 8: one-row tiles; 13: 4 x 4 tiles
          Mat w(d, N, K, rng);
          auto x = test::randn(rng, T * K);
          std::vector<float> y(static_cast<size_t>(T * N), NAN), ref(static_cast<size_t>(T * N));
          matmul(x.data(), T, w.v, y.data(), mode());
          matmul_ref(x.data(), T, w.v, ref.data());
          for (int64_t t = 0; t < T; t++)
            for (int64_t n = 0; n < N; n++) {
              double mag = 0;
              for (int64_t k = 0; k < K; k++) mag += std::fabs(x[size_t(t * K + k)] * w.v.at(n * K + k));
              const size_t i = size_t(t * N + n);
              ASSERT_NEAR(y[i], ref[i], 4 * eps * mag + 1e-30) << dtype_name(d) << " K=" << K << " N=" << N << " T=" << T;
            }
        }
}

TEST_P(KernelPaths, BatchAndThreadInvariantBitForBit) {
  std::mt19937 rng(12);
  for (DType d : {DType::F32, DType::BF16})
    for (int64_t K : {64, 200, 1100, 4200}) {  // 4200: K blocks (4096 wide, matmul.cc kKBlock) and a tail
      const int64_t N = 37, T = 70;  // more than a token block and several tiles
      Mat w(d, N, K, rng);
      auto x = test::randn(rng, T * K);
      std::vector<float> full(static_cast<size_t>(T * N));
      set_num_threads(2);
      matmul(x.data(), T, w.v, full.data(), mode());
      for (int threads : {1, 3}) {
        set_num_threads(threads);
        for (int64_t t0 : {0, 1, 5, 63})
          for (int64_t n : {1, 2, 3, 4, 6, 66}) {
            if (t0 + n > T) continue;
            std::vector<float> part(static_cast<size_t>(n * N));
            matmul(&x[size_t(t0 * K)], n, w.v, part.data(), mode());
            ASSERT_EQ(0, std::memcmp(part.data(), &full[size_t(t0 * N)], part.size() * sizeof(float)))
                << dtype_name(d) << " K=" << K << " rows [" << t0 << ", " << t0 + n << ") threads " << threads;
          }
      }
    }
}

TEST_P(KernelPaths, FusedSwigluEqualsTwoMatmulsAndSiluMul) {
  std::mt19937 rng(13);
  for (DType d : {DType::F32, DType::BF16})
    for (int64_t I : {1, 2, 7, 24, 37})  // 37: several blocks of the few-token order, one partial
      for (int64_t K : {48, 1100})
        for (int64_t T : {1, 5, 9, 40}) {  // one-row tiles (<= 8 tokens), 4 x 4 tiles, widened rows
          Mat g(d, I, K, rng), u(d, I, K, rng);
          auto x = test::randn(rng, T * K);
          std::vector<float> h(static_cast<size_t>(T * I)), gy(h.size()), uy(h.size()), want(h.size());
          matmul_swiglu(x.data(), T, g.v, u.v, h.data(), mode());
          matmul(x.data(), T, g.v, gy.data(), mode());
          matmul(x.data(), T, u.v, uy.data(), mode());
          silu_mul(gy.data(), uy.data(), T * I, want.data());
          ASSERT_EQ(0, std::memcmp(h.data(), want.data(), h.size() * sizeof(float)))
              << dtype_name(d) << " I=" << I << " K=" << K << " T=" << T;
        }
}

INSTANTIATE_TEST_SUITE_P(Paths, KernelPaths,
                         ::testing::Values(PathCase{KernelPath::Generic, ComputeMode::F32, "generic"},
                                           PathCase{KernelPath::Avx2, ComputeMode::F32, "avx2"},
                                           PathCase{KernelPath::Avx512, ComputeMode::F32, "avx512"},
                                           PathCase{KernelPath::Avx512, ComputeMode::BF16, "avx512_bf16"}),
                         [](const auto& info) { return std::string(info.param.name); });

// The AVX2 path is the AVX-512 path's arithmetic on half-width registers (matmul_avx2.cc): the
// same bits for every weight dtype it serves, every tile shape and both tilings (few-token
// one-row tiles and 4 x 4 tiles, K blocks past 4096), and the fused SwiGLU. Needs a CPU with both.
TEST(KernelPathsAcross, Avx2GivesTheAvx512Bits) {
  const auto& cpu = cpu_features();
  if (!cpu.avx512 || !cpu.fma) GTEST_SKIP() << "CPU without AVX-512: nothing to compare the AVX2 path with";
  std::mt19937 rng(14);
  auto run = [](KernelPath p, const float* x, int64_t T, const TensorView& w, std::vector<float>& y) {
    set_kernel_path(p);
    y.assign(size_t(T * w.shape[0]), NAN);
    matmul(x, T, w, y.data(), ComputeMode::F32);  // the fp32 arithmetic both paths share
    set_kernel_path(KernelPath::Auto);
  };
  int compared = 0;
  for (DType d : {DType::F32, DType::BF16})
    for (int64_t K : {16, 33, 100, 513, 2048, 4200})
      for (int64_t N : {1, 5, 9, 130})
        for (int64_t T : {1, 2, 3, 7, 13, 70}) {
          Mat w(d, N, K, rng);
          auto x = test::randn(rng, T * K);
          std::vector<float> a, b;
          run(KernelPath::Avx2, x.data(), T, w.v, a);
          run(KernelPath::Avx512, x.data(), T, w.v, b);
          ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)))
              << dtype_name(d) << " K=" << K << " N=" << N << " T=" << T;
          compared++;
        }
  for (int64_t T : {1, 5, 40}) {
    Mat g(DType::BF16, 24, 1100, rng), u(DType::BF16, 24, 1100, rng);
    auto x = test::randn(rng, T * 1100);
    std::vector<float> a(size_t(T * 24)), b(a.size());
    set_kernel_path(KernelPath::Avx2);
    matmul_swiglu(x.data(), T, g.v, u.v, a.data(), ComputeMode::F32);
    set_kernel_path(KernelPath::Avx512);
    matmul_swiglu(x.data(), T, g.v, u.v, b.data(), ComputeMode::F32);
    set_kernel_path(KernelPath::Auto);
    ASSERT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float))) << "swiglu T=" << T;
  }
  EXPECT_EQ(compared, 2 * 6 * 4 * 6);
}

}  // namespace
}  // namespace epmoe
