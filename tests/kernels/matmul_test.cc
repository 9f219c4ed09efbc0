// matmul (the fast path) against matmul_ref (double accumulation), and the batch invariance that
// EP-size-independent logits rest on (ARCHITECTURE.md, Numerics): a row's bits never depend on how
// many rows share the call, where the row falls in a token tile, or how many threads run it.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "tensor/dtype.h"
#include "util/error.h"
#include "util/threads.h"
#include "common/vectors.h"

namespace epmoe {
namespace {

// A weight matrix [N, K] stored in one dtype, random in [-1, 1).
struct Weight {
  DType dtype;
  int64_t N, K;
  std::vector<float> f32;
  std::vector<uint16_t> half;  // BF16 or F16 bits
  TensorView view;

  Weight(DType d, int64_t n, int64_t k, std::mt19937& rng) : dtype(d), N(n), K(k) {
    std::uniform_real_distribution<float> u(-1.f, 1.f);
    const size_t count = static_cast<size_t>(n * k);
    view.dtype = d;
    view.shape = {n, k};
    view.name = "w";
    if (d == DType::F32) {
      f32.resize(count);
      for (auto& v : f32) v = u(rng);
      view.data = f32.data();
    } else {
      half.resize(count);
      for (auto& v : half) v = d == DType::BF16 ? f32_to_bf16(u(rng)) : f32_to_f16(u(rng));
      view.data = half.data();
    }
  }
};

std::string name(DType d) { return std::string(dtype_name(d)); }

const DType kDtypes[] = {DType::F32, DType::BF16, DType::F16};

// BF16 / F16 bits decoded from the IEEE layout with ldexp (finite values only), independent of
// tensor/dtype.cc. BF16: 8 exponent bits (bias 127), 7 mantissa bits; F16: 5 (bias 15), 10.
double bf16_bits_to_double(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 7) & 0xff, mant = h & 0x7f;
  const double mag = exp == 0 ? std::ldexp(double(mant), -133) : std::ldexp(double(mant | 0x80), exp - 134);
  return sign ? -mag : mag;
}
double f16_bits_to_double(uint16_t h) {
  const int sign = h >> 15, exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  const double mag = exp == 0 ? std::ldexp(double(mant), -24) : std::ldexp(double(mant | 0x400), exp - 25);
  return sign ? -mag : mag;
}

// matmul_ref itself, checked once against a dot product written here with weights decoded
// independently: y[t, n] = sum_k x[t, k] * W[n, k] + bias[n] (W is [N, K], row n is output n).
TEST(Matmul, ReferenceIsTheFormula) {
  std::mt19937 rng(7);
  for (DType d : kDtypes) {
    const int64_t T = 3, N = 5, K = 19;
    Weight w(d, N, K, rng);
    const std::vector<float> x = test::randn(rng, T * K), bias = test::randn(rng, N);
    std::vector<float> y(static_cast<size_t>(T * N));
    matmul_ref(x.data(), T, w.view, y.data(), bias.data());
    for (int64_t t = 0; t < T; t++)
      for (int64_t n = 0; n < N; n++) {
        double s = bias[size_t(n)];
        for (int64_t k = 0; k < K; k++) {
          const size_t i = size_t(n * K + k);
          const double wv = d == DType::F32    ? double(w.f32[i])
                            : d == DType::BF16 ? bf16_bits_to_double(w.half[i])
                                               : f16_bits_to_double(w.half[i]);
          s += double(x[size_t(t * K + k)]) * wv;
        }
        EXPECT_NEAR(y[size_t(t * N + n)], s, 1e-5 * (1 + std::fabs(s))) << name(d) << " t=" << t << " n=" << n;
      }
  }
}

// Fast path vs reference on odd shapes: K around and below the 16-lane width (tails only, one
// vector plus a tail, several vectors plus a tail), T around the 4-token tile, N tiny and not a
// multiple of anything. Tolerance: fp32 accumulation error grows like sqrt(K) * eps times the size
// of the terms, so the bound is relative to sum |x_k w_k|, not to the (possibly cancelling) result.
TEST(Matmul, FastMatchesReferenceOnOddShapes) {
  std::mt19937 rng(8);
  const int64_t Ks[] = {1, 7, 15, 16, 17, 33, 100, 257};
  const int64_t Ns[] = {1, 3, 50};
  const int64_t Ts[] = {0, 1, 2, 3, 4, 5, 9};
  for (DType d : kDtypes)
    for (int64_t K : Ks)
      for (int64_t N : Ns)
        for (int64_t T : Ts)
          for (bool with_bias : {false, true}) {
            SCOPED_TRACE(name(d) + " T=" + std::to_string(T) + " N=" + std::to_string(N) + " K=" + std::to_string(K) +
                         " bias=" + std::to_string(with_bias));
            Weight w(d, N, K, rng);
            const std::vector<float> x = test::randn(rng, T * K), bias = test::randn(rng, N);
            const float* b = with_bias ? bias.data() : nullptr;
            // NaN sentinel: an output the kernel forgets to write fails the comparison.
            std::vector<float> y(static_cast<size_t>(T * N), NAN), ref(static_cast<size_t>(T * N));
            matmul(x.data(), T, w.view, y.data(), ComputeMode::F32, b);
            matmul_ref(x.data(), T, w.view, ref.data(), b);
            for (int64_t t = 0; t < T; t++)
              for (int64_t n = 0; n < N; n++) {
                double mag = b ? std::fabs(b[n]) : 0.0;
                for (int64_t k = 0; k < K; k++) mag += std::fabs(double(x[size_t(t * K + k)]) * w.view.at(n * K + k));
                const double tol = 2.0 * std::sqrt(double(K)) * FLT_EPSILON * mag + 1e-30;
                const size_t i = size_t(t * N + n);
                ASSERT_NEAR(y[i], ref[i], tol) << "t=" << t << " n=" << n;
              }
          }
}

// y rows [t0, t0 + count) computed by one call on just those rows of x.
std::vector<float> rows_alone(const std::vector<float>& x, int64_t t0, int64_t count, const Weight& w, ComputeMode mode) {
  std::vector<float> y(static_cast<size_t>(count * w.N));
  matmul(x.data() + t0 * w.K, count, w.view, y.data(), mode);
  return y;
}

bool same_bits(const float* a, const float* b, int64_t n) { return std::memcmp(a, b, size_t(n) * sizeof(float)) == 0; }

// Each row of a batch of T is bit-identical to the same row computed alone and within every
// contiguous sub-batch (which moves it to another position in the 4-token tile and changes how many
// rows share the weight pass).
TEST(Matmul, BatchInvariantBitForBit) {
  std::mt19937 rng(9);
  const int64_t Ks[] = {1, 17, 100, 300};
  const int64_t Ns[] = {3, 50, 200};
  for (DType d : kDtypes)
    for (int64_t K : Ks)
      for (int64_t N : Ns) {
        const int64_t T = 11;
        SCOPED_TRACE(name(d) + " N=" + std::to_string(N) + " K=" + std::to_string(K));
        Weight w(d, N, K, rng);
        const std::vector<float> x = test::randn(rng, T * K);
        const std::vector<float> full = rows_alone(x, 0, T, w, ComputeMode::F32);
        for (int64_t t0 = 0; t0 < T; t0++)
          for (int64_t count = 1; t0 + count <= T; count++) {
            const std::vector<float> sub = rows_alone(x, t0, count, w, ComputeMode::F32);
            ASSERT_TRUE(same_bits(sub.data(), full.data() + t0 * N, count * N))
                << "rows [" << t0 << ", " << t0 + count << ") differ from the full batch";
          }
      }
}

// The same bits with 1, 2 and 3 threads. The shapes are chosen so that parallel_for really splits
// the output columns (N / max(1, 16384 / (K * T)) >= 2 tasks), including uneven splits.
TEST(Matmul, ThreadCountInvariantBitForBit) {
  std::mt19937 rng(10);
  struct Shape { int64_t T, N, K; };
  const Shape shapes[] = {{1, 1000, 300}, {5, 333, 100}, {9, 257, 33}, {16, 97, 64}};
  for (DType d : kDtypes)
    for (const Shape& s : shapes) {
      SCOPED_TRACE(name(d) + " T=" + std::to_string(s.T) + " N=" + std::to_string(s.N) + " K=" + std::to_string(s.K));
      Weight w(d, s.N, s.K, rng);
      const std::vector<float> x = test::randn(rng, s.T * s.K);
      set_num_threads(1);
      const std::vector<float> one = rows_alone(x, 0, s.T, w, ComputeMode::F32);
      for (int threads : {2, 3}) {
        set_num_threads(threads);
        ASSERT_EQ(num_threads(), threads);
        const std::vector<float> many = rows_alone(x, 0, s.T, w, ComputeMode::F32);
        EXPECT_TRUE(same_bits(one.data(), many.data(), s.T * s.N)) << threads << " threads";
        // And a single row under several threads equals row 0 of the batch.
        EXPECT_TRUE(same_bits(rows_alone(x, 0, 1, w, ComputeMode::F32).data(), one.data(), s.N)) << threads << " threads, T=1";
      }
    }
  set_num_threads(0);  // back to the default (one per core) for the other tests
}

// Decode tiles of F32 / BF16 weights hold 1 row on AMD's AVX-512 and 4 on Intel's
// (CpuFeatures::few_token_rows): every layout gives the batch's bits, for matmul and the fused
// SwiGLU front alike, so the logits do not depend on the CPU's vendor. (On the AVX2 and generic
// paths the setting is not read; there this checks the one layout they have.)
TEST(Matmul, FewTokenRowsPerTileDoNotChangeBits) {
  std::mt19937 rng(12);
  const int saved = cpu_features().few_token_rows;
  for (DType d : {DType::F32, DType::BF16})
    for (int64_t K : {64, 300}) {
      const int64_t N = 37, T = 9;
      Weight w(d, N, K, rng), wu(d, N, K, rng);
      const std::vector<float> x = test::randn(rng, T * K);
      set_few_token_rows_for_tests(1);
      const std::vector<float> full = rows_alone(x, 0, T, w, ComputeMode::F32);
      std::vector<float> h_full(size_t(T * N));
      matmul_swiglu(x.data(), T, w.view, wu.view, h_full.data(), ComputeMode::F32);
      for (int rows : {1, 2, 3, 4}) {
        set_few_token_rows_for_tests(rows);
        SCOPED_TRACE(name(d) + " K=" + std::to_string(K) + " rows per tile " + std::to_string(rows));
        for (int64_t t0 : {int64_t(0), int64_t(4)})
          for (int64_t count : {int64_t(1), int64_t(2)}) {
            EXPECT_TRUE(same_bits(rows_alone(x, t0, count, w, ComputeMode::F32).data(), full.data() + t0 * N, count * N))
                << "matmul rows [" << t0 << ", " << t0 + count << ")";
            std::vector<float> h(size_t(count * N));
            matmul_swiglu(x.data() + t0 * K, count, w.view, wu.view, h.data(), ComputeMode::F32);
            EXPECT_TRUE(same_bits(h.data(), h_full.data() + t0 * N, count * N))
                << "swiglu rows [" << t0 << ", " << t0 + count << ")";
          }
      }
    }
  set_few_token_rows_for_tests(saved);
}

// On Intel, --compute bf16 on BF16 weights runs vdpbf16ps's arithmetic as two FMAs per pair
// (CpuFeatures::bf16_dot_by_fma). It must give the instruction's bits, denormals included: the
// instruction reads denormal inputs as zero and flushes denormal results. Compared on a CPU that
// has the instruction, both forms at every T (K tails, and K blocks at T = 9, K = 4100).
TEST(Matmul, Bf16DotByFmaGivesTheInstructionsBits) {
  if (!cpu_features().avx512_bf16) GTEST_SKIP() << "CPU without AVX512-BF16 (nothing to compare with)";
  const bool saved = cpu_features().bf16_dot_by_fma;
  std::mt19937 rng(21);
  std::normal_distribution<float> g(0.f, 1.f);
  std::uniform_int_distribution<int> wide_exp(-140, 40), tiny_exp(-75, -60);
  // plain: N(0, 1); wide: exponents over 2^-140 .. 2^40 and 1 in 16 zero (denormal bf16 inputs);
  // tiny: x and w near 2^-67, so products and sums lie among fp32's denormals (the flush matters).
  enum Kind { Plain, Wide, Tiny };
  auto draw = [&](Kind kind) {
    const float v = g(rng);
    if (kind == Plain) return v;
    if (kind == Wide) return rng() % 16 == 0 ? 0.f : std::ldexp(v, wide_exp(rng));
    return std::ldexp(v, tiny_exp(rng));
  };
  int64_t denormal_outputs = 0;
  for (Kind kind : {Plain, Wide, Tiny})
    for (int64_t K : {64, 300, 4100}) {
      const int64_t N = 37, T = 9;
      Weight w(DType::BF16, N, K, rng);
      for (auto& h : w.half) h = f32_to_bf16(draw(kind));
      std::vector<float> x(size_t(T * K));
      for (auto& v : x) v = draw(kind);
      SCOPED_TRACE("kind " + std::to_string(int(kind)) + " K=" + std::to_string(K));
      for (int64_t count : {int64_t(1), int64_t(2), T}) {
        set_bf16_dot_by_fma_for_tests(false);
        const std::vector<float> instr = rows_alone(x, 0, count, w, ComputeMode::BF16);
        set_bf16_dot_by_fma_for_tests(true);
        const std::vector<float> fma = rows_alone(x, 0, count, w, ComputeMode::BF16);
        EXPECT_TRUE(same_bits(fma.data(), instr.data(), count * N)) << "T=" << count;
        for (float v : instr) denormal_outputs += std::fpclassify(v) == FP_SUBNORMAL;
      }
    }
  set_bf16_dot_by_fma_for_tests(saved);
  // The tiny data reach the flush: the reduction of flushed lane sums still gives some denormal
  // outputs, while lanes that would hold denormals were zero in both forms.
  EXPECT_GT(denormal_outputs, 0) << "the tiny inputs never reached fp32's denormal range";
}

TEST(Matmul, RejectsNonFloatWeights) {
  const std::vector<int32_t> data(6, 1);
  TensorView v;
  v.dtype = DType::I32;
  v.shape = {2, 3};
  v.data = data.data();
  v.name = "model.layers.0.bad";
  std::vector<float> x(3, 1.f), y(2);
  try {
    matmul(x.data(), 1, v, y.data(), ComputeMode::F32);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("model.layers.0.bad"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace epmoe
