// F8_E4M3 (128 x 128 block-scaled) weights in matmul and matmul_swiglu. The fp32 compute mode is
// exact: bit for bit the matmul of an F32 tensor holding the dequantized weights (q * s in fp32,
// TensorView::at), on every kernel path, for F32 and BF16 scale grids, partial blocks and tails,
// any T, any sub-batch, any thread count. The codes are the real thing: random fp32 weights
// quantized per 128 x 128 block (scale = amax / 448, round to nearest even e4m3) by an encoder
// written here, with tiny weights that give subnormal codes and exact zeros among them.
#include <gtest/gtest.h>

#include <algorithm>
#include <utility>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>
#include <string>
#include <vector>

#include "common/kernel_path_fixture.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul.h"
#include "kernels/matmul_micro.h"
#include "kernels/ops.h"
#include "tensor/dtype.h"
#include "util/error.h"
#include "util/threads.h"
#include "common/vectors.h"

namespace epmoe {
namespace {

// e4m3fn decoded from its fields, independent of tensor/dtype.h: sign, 4 exponent bits (bias 7),
// 3 mantissa bits; exponent 0 is subnormal (m * 2^-9); 0x7f / 0xff are NaN (no infinities).
double e4m3_plain(uint8_t b) {
  const int sign = b >> 7, exp = (b >> 3) & 0xf, mant = b & 7;
  if (exp == 15 && mant == 7) return NAN;
  const double mag = exp == 0 ? std::ldexp(double(mant), -9) : std::ldexp(double(8 + mant), exp - 10);
  return sign ? -mag : mag;
}

// Round to nearest e4m3 (ties to the even code), saturating at 448; v finite.
uint8_t e4m3_encode(float v) {
  static const std::vector<double> mags = [] {
    std::vector<double> m;
    for (int c = 0; c <= 0x7e; c++) m.push_back(e4m3_plain(uint8_t(c)));  // ascending
    return m;
  }();
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(double(v));
  if (a >= mags.back()) return sign | 0x7e;
  const int hi = int(std::lower_bound(mags.begin(), mags.end(), a) - mags.begin());
  if (mags[size_t(hi)] == a || hi == 0) return sign | uint8_t(hi);
  const int lo = hi - 1;
  const double dlo = a - mags[size_t(lo)], dhi = mags[size_t(hi)] - a;
  const int c = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return sign | uint8_t(c);
}

TEST(Fp8, EncoderRoundsToNearestEven) {
  EXPECT_EQ(e4m3_encode(0.f), 0x00);
  EXPECT_EQ(e4m3_encode(-0.f), 0x80);
  EXPECT_EQ(e4m3_encode(1.f), 0x38);
  EXPECT_EQ(e4m3_encode(448.f), 0x7e);
  EXPECT_EQ(e4m3_encode(1e6f), 0x7e);
  EXPECT_EQ(e4m3_encode(-1e6f), 0xfe);
  EXPECT_EQ(e4m3_encode(0x1p-9f), 0x01);    // the smallest subnormal
  EXPECT_EQ(e4m3_encode(0x1p-10f), 0x00);   // half of it: the tie goes to the even code, 0
  EXPECT_EQ(e4m3_encode(0x1.8p-9f), 0x02);  // 1.5 * 2^-9: tie between codes 1 and 2 -> 2
  EXPECT_EQ(e4m3_encode(1.0625f), 0x38);    // halfway between 1 and 1.125 -> the even 1
  EXPECT_EQ(e4m3_encode(1.1875f), 0x3a);    // halfway between 1.125 and 1.25 -> 1.25
  for (int c = 0; c < 256; c++)
    if ((c & 0x7f) != 0x7f) {
      EXPECT_EQ(e4m3_encode(float(e4m3_plain(uint8_t(c)))), c) << c;
    }
}

// The conversion: tensor/dtype.h's, and both row dequantizers of the kernels, for all 256 codes.
TEST(Fp8, ConversionOfAll256Codes) {
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; c++) codes[size_t(c)] = uint8_t(c);
  for (int c = 0; c < 256; c++) {
    const double want = e4m3_plain(uint8_t(c));
    const float got = fp8e4m3_to_f32(uint8_t(c));
    if (std::isnan(want)) {
      EXPECT_TRUE(std::isnan(got)) << c;
    } else {
      EXPECT_EQ(double(got), want) << c;
      EXPECT_EQ(std::signbit(got), bool(c & 0x80)) << c;  // -0 for 0x80
    }
  }
  // Rows of 256 codes under scales 1, 2^-20 (subnormal fp32 products), 0.0123 (rounding), -3
  // (F32 grid) and a bf16 scale; 2^10 does not fold into 2^120 and takes the two-multiply route.
  const float scales[] = {1.f, 0x1p-20f, 0.0123f, -3.f, 1024.f};
  std::vector<RowDequantFn> fns = {&fp8_dequant_generic};
  if (cpu_features().avx512) fns.push_back(&fp8_dequant_avx512);
  for (RowDequantFn fn : fns)
    for (float s : scales)
      for (bool bf16 : {false, true}) {
        const uint16_t sb = f32_to_bf16(s);
        const float sv = bf16 ? bf16_to_f32(sb) : s;
        const float grid[2] = {sv, sv};
        const uint16_t grid_b[2] = {sb, sb};
        const CodeRow r{codes.data(), bf16 ? static_cast<const void*>(grid_b) : static_cast<const void*>(grid), bf16};
        for (int64_t K : {256, 250, 7}) {  // vector steps and tails
          std::vector<float> out(size_t(K), 12345.f);
          fn(r, K, out.data());
          for (int64_t c = 0; c < K; c++) {
            const float want = fp8e4m3_to_f32(uint8_t(c)) * sv;  // TensorView::at
            if (std::isnan(want)) {
              EXPECT_TRUE(std::isnan(out[size_t(c)])) << c;
            } else {
              EXPECT_EQ(0, std::memcmp(&want, &out[size_t(c)], 4)) << "code " << c << " scale " << sv << " got " << out[size_t(c)];
            }
          }
        }
      }
}

// The bf16-compute kernels' widening: every code to the bf16 of q * 2^8 (exact, normal).
TEST(Fp8, WideningToBf16OfAll256Codes) {
  if (!cpu_features().avx512_bf16) GTEST_SKIP() << "CPU without AVX512-BF16";
  std::vector<uint8_t> codes(256 + 31);
  for (size_t c = 0; c < codes.size(); c++) codes[c] = uint8_t(c);
  std::vector<uint16_t> out(codes.size(), 0xdead);
  fp8_to_bf16_avx512(codes.data(), int64_t(codes.size()), out.data());
  for (int c = 0; c < 256; c++) {
    if ((c & 0x7f) == 0x7f) continue;  // NaN codes: no special care on this path
    EXPECT_EQ(double(bf16_to_f32(out[size_t(c)])), std::ldexp(e4m3_plain(uint8_t(c)), 8)) << c;
    EXPECT_EQ(out[size_t(c)] >> 15, c >> 7) << c;
  }
  for (size_t c = 256; c < codes.size(); c++) EXPECT_EQ(out[c], 0xdead) << "wrote past K / 32 * 32";
}

// A weight [N, K]: fp32 values quantized per 128 x 128 block to e4m3 codes and a scale grid
// (F32 or BF16), and the same weights dequantized into an F32 tensor.
struct Fp8Weight {
  int64_t N, K;
  std::vector<uint8_t> q;
  std::vector<float> s32;
  std::vector<uint16_t> s16;
  std::vector<float> deq;
  TensorView view, f32;

  Fp8Weight(int64_t n, int64_t k, DType scale_dtype, std::mt19937& rng, const char* name = "w") : N(n), K(k) {
    std::normal_distribution<float> g(0.f, 0.05f);
    std::uniform_real_distribution<float> u(0.f, 1.f);
    std::vector<float> w(size_t(n * k));
    for (auto& v : w) {
      const float p = u(rng);
      v = p < 0.03f ? 0.f : p < 0.08f ? g(rng) * 1e-4f : g(rng);  // zeros, subnormal codes, the bulk
    }
    const int64_t rb = (n + 127) / 128, cb = (k + 127) / 128;
    s32.resize(size_t(rb * cb));
    s16.resize(size_t(rb * cb));
    q.resize(size_t(n * k));
    for (int64_t bi = 0; bi < rb; bi++)
      for (int64_t bj = 0; bj < cb; bj++) {
        float amax = 0;
        for (int64_t r = bi * 128; r < std::min(n, bi * 128 + 128); r++)
          for (int64_t c = bj * 128; c < std::min(k, bj * 128 + 128); c++) amax = std::max(amax, std::fabs(w[size_t(r * k + c)]));
        float sc = amax > 0 ? amax / 448.f : 1.f;
        const size_t si = size_t(bi * cb + bj);
        s16[si] = f32_to_bf16(sc);
        if (scale_dtype == DType::BF16) sc = bf16_to_f32(s16[si]);
        s32[si] = sc;
        for (int64_t r = bi * 128; r < std::min(n, bi * 128 + 128); r++)
          for (int64_t c = bj * 128; c < std::min(k, bj * 128 + 128); c++)
            q[size_t(r * k + c)] = e4m3_encode(w[size_t(r * k + c)] / sc);
      }
    view.dtype = DType::F8_E4M3;
    view.shape = {n, k};
    view.data = q.data();
    view.name = name;
    view.scale.data = scale_dtype == DType::BF16 ? static_cast<const void*>(s16.data()) : static_cast<const void*>(s32.data());
    view.scale.dtype = scale_dtype;
    view.scale.rows = rb;
    view.scale.cols = cb;
    refresh();
  }
  // The F32 tensor of dequantized weights (again after the codes or scales were changed).
  void refresh() {
    deq.resize(size_t(N * K));
    for (int64_t i = 0; i < N * K; i++) deq[size_t(i)] = view.at(i);
    f32.dtype = DType::F32;
    f32.shape = {N, K};
    f32.data = deq.data();
    f32.name = view.name + ".deq";
  }
};

using test::PathMode;
class Fp8Paths : public test::KernelPathTest {};

struct Fp8Shape {
  int64_t N, K;
};
// Partial blocks both ways (144 = 128 + 16, 136 = 128 + 8, 192 = 128 + 64), tails of the 16- and
// 32-wide vector steps (17, 300), K blocks of the tiled path (4200: two 4096-wide blocks), a row block only.
const Fp8Shape kFp8Shapes[] = {{144, 192}, {130, 136}, {50, 256}, {7, 17}, {33, 300}, {20, 1100}, {9, 4200}};
const int64_t kFp8Ts[] = {1, 2, 3, 8, 9, 33, 64, 100};

// The fp32 (exact) compute mode on each path.
class Fp8Exact : public Fp8Paths {};

// fp32 compute: the fp8 matmul is the F32 matmul of the dequantized weights, bit for bit.
TEST_P(Fp8Exact, BitEqualToDequantizedF32) {
  const bool assists = cpu_features().subnormal_assists;
  for (bool form : {false, true}) {  // the codes' two exact forms (matmul_micro.h): the same bits
  set_subnormal_assists_for_tests(form);
  std::mt19937 rng(21);
  for (DType sd : {DType::F32, DType::BF16})
    for (const Fp8Shape& sh : kFp8Shapes) {
      Fp8Weight w(sh.N, sh.K, sd, rng);
      const std::vector<float> bias = test::randn(rng, sh.N);
      for (int64_t T : kFp8Ts) {
        SCOPED_TRACE(std::string(dtype_name(sd)) + " scales, N=" + std::to_string(sh.N) + " K=" + std::to_string(sh.K) +
                     " T=" + std::to_string(T));
        const std::vector<float> x = test::randn(rng, T * sh.K);
        for (const float* b : {static_cast<const float*>(nullptr), bias.data()}) {
          std::vector<float> y(size_t(T * sh.N), NAN), want(size_t(T * sh.N), -1.f);
          matmul(x.data(), T, w.view, y.data(), mode(), b);
          matmul(x.data(), T, w.f32, want.data(), mode(), b);
          ASSERT_TRUE(test::same_bits(y, want)) << (b ? "with bias" : "no bias") << (form ? ", no-subnormal form" : "");
        }
      }
    }
  }
  set_subnormal_assists_for_tests(assists);
}

// Any mode: close to the double reference of the dequantized weights. fp32 compute: the usual
// fp32 accumulation bound; bf16 compute: activations rounded to bf16 (2^-9 relative per product).
TEST_P(Fp8Paths, MatchesReference) {
  std::mt19937 rng(22);
  const double eps = GetParam().mode == ComputeMode::BF16 ? std::ldexp(1.0, -8) : 2 * FLT_EPSILON;
  for (const Fp8Shape& sh : kFp8Shapes)
    for (int64_t T : {1, 5, 9, 40}) {
      Fp8Weight w(sh.N, sh.K, DType::BF16, rng);
      const std::vector<float> x = test::randn(rng, T * sh.K);
      std::vector<float> y(size_t(T * sh.N), NAN), ref(y.size());
      matmul(x.data(), T, w.view, y.data(), mode());
      matmul_ref(x.data(), T, w.view, ref.data());
      for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < sh.N; n++) {
          double mag = 0;
          for (int64_t k = 0; k < sh.K; k++) mag += std::fabs(double(x[size_t(t * sh.K + k)]) * w.deq[size_t(n * sh.K + k)]);
          const size_t i = size_t(t * sh.N + n);
          ASSERT_NEAR(y[i], ref[i], 2 * std::sqrt(double(sh.K)) * eps * mag + 1e-30)
              << "N=" << sh.N << " K=" << sh.K << " T=" << T << " t=" << t << " n=" << n;
        }
    }
}

// bf16 compute against the exact fp32 path: activations rounded to bf16 are the only inexact
// step before the fp32 accumulation (codes and block scales are exact), so the difference stays
// within 2^-8 sum_k |x_k w_k| (2^-9 per product plus the two paths' fp32 rounding).
TEST(Fp8, Bf16ComputeWithinBf16RoundingOfExact) {
  if (!cpu_features().avx512_bf16) GTEST_SKIP() << "CPU without AVX512-BF16";
  std::mt19937 rng(26);
  for (const Fp8Shape& sh : kFp8Shapes)
    for (int64_t T : {1, 3, 8, 9, 64}) {
      Fp8Weight w(sh.N, sh.K, DType::BF16, rng);
      const std::vector<float> x = test::randn(rng, T * sh.K);
      std::vector<float> y(size_t(T * sh.N), NAN), exact(y.size());
      matmul(x.data(), T, w.view, y.data(), ComputeMode::BF16);
      matmul(x.data(), T, w.view, exact.data(), ComputeMode::F32);
      for (int64_t t = 0; t < T; t++)
        for (int64_t n = 0; n < sh.N; n++) {
          double mag = 0;
          for (int64_t k = 0; k < sh.K; k++) mag += std::fabs(double(x[size_t(t * sh.K + k)]) * w.deq[size_t(n * sh.K + k)]);
          const size_t i = size_t(t * sh.N + n);
          ASSERT_NEAR(y[i], exact[i], std::ldexp(mag, -8) + 1e-30)
              << "N=" << sh.N << " K=" << sh.K << " T=" << T << " t=" << t << " n=" << n;
        }
    }
}

// A row's bits do not depend on the rows sharing the call (T = 1 ... 100, any position in a tile,
// one-row tiles or 4 x 4 tiles), nor on the thread count, nor on whether the weight is a row slice
// of a larger one (the slice keeps the scale grid of the whole through BlockScale::row0).
TEST_P(Fp8Paths, BatchAndThreadInvariantBitForBit) {
  std::mt19937 rng(23);
  for (const Fp8Shape& sh : {Fp8Shape{144, 192}, Fp8Shape{37, 136}, Fp8Shape{20, 1100}}) {
    Fp8Weight w(sh.N, sh.K, DType::BF16, rng);
    const int64_t T = 100;
    const std::vector<float> x = test::randn(rng, T * sh.K);
    std::vector<float> full(size_t(T * sh.N));
    set_num_threads(2);
    matmul(x.data(), T, w.view, full.data(), mode());
    for (int threads : {1, 3}) {
      set_num_threads(threads);
      for (int64_t t0 : {0, 1, 5, 63, 99})
        for (int64_t n : {1, 2, 3, 8, 9, 33, 64, 100}) {
          if (t0 + n > T) continue;
          std::vector<float> part(size_t(n * sh.N));
          matmul(&x[size_t(t0 * sh.K)], n, w.view, part.data(), mode());
          ASSERT_EQ(0, std::memcmp(part.data(), &full[size_t(t0 * sh.N)], part.size() * sizeof(float)))
              << "N=" << sh.N << " K=" << sh.K << " rows [" << t0 << ", " << t0 + n << ") threads " << threads;
        }
    }
    // Output rows [r0, r0 + len) from a row slice of the weight.
    for (int64_t r0 : {int64_t(0), int64_t(5), sh.N - 10})
      for (int64_t T2 : {1, 9}) {
        const TensorView sl = w.view.slice_rows(r0, 10);
        std::vector<float> part(size_t(T2 * 10));
        matmul(x.data(), T2, sl, part.data(), mode());
        for (int64_t t = 0; t < T2; t++)
          ASSERT_EQ(0, std::memcmp(&part[size_t(t * 10)], &full[size_t(t * sh.N + r0)], 10 * sizeof(float)))
              << "slice rows from " << r0 << " T=" << T2 << " t=" << t;
      }
  }
}

// The fused SwiGLU on fp8 gate and up weights: the two fp8 matmuls and silu_mul, bit for bit, and
// (fp32 compute) the fused SwiGLU of the dequantized F32 weights.
TEST_P(Fp8Paths, SwigluEqualsTwoMatmulsAndDequantizedSwiglu) {
  std::mt19937 rng(24);
  for (const Fp8Shape& sh : {Fp8Shape{37, 136}, Fp8Shape{144, 192}, Fp8Shape{24, 1100}})
    for (DType sd : {DType::F32, DType::BF16})
      for (int64_t T : {1, 3, 8, 9, 40, 70}) {
        SCOPED_TRACE("I=" + std::to_string(sh.N) + " K=" + std::to_string(sh.K) + " T=" + std::to_string(T) + " " +
                     std::string(dtype_name(sd)) + " scales");
        Fp8Weight g(sh.N, sh.K, sd, rng, "gate"), u(sh.N, sh.K, sd, rng, "up");
        const std::vector<float> x = test::randn(rng, T * sh.K);
        std::vector<float> h(size_t(T * sh.N), NAN), gy(h.size()), uy(h.size()), want(h.size());
        matmul_swiglu(x.data(), T, g.view, u.view, h.data(), mode());
        matmul(x.data(), T, g.view, gy.data(), mode());
        matmul(x.data(), T, u.view, uy.data(), mode());
        silu_mul(gy.data(), uy.data(), T * sh.N, want.data());
        ASSERT_TRUE(test::same_bits(h, want)) << "fused vs two matmuls";
        if (GetParam().mode == ComputeMode::F32) {
          matmul_swiglu(x.data(), T, g.f32, u.f32, want.data(), ComputeMode::F32);
          ASSERT_TRUE(test::same_bits(h, want)) << "fp8 vs dequantized f32";
        }
      }
}

// Scales the fp8 kernels cannot fold (|s| >= 2^8 into 2^120; |s| < 2^-100 into 2^-8) send the
// weight to the row dequantizer (two multiplies where needed) and the fp32 kernel: exact, in
// either compute mode.
TEST_P(Fp8Paths, LargeScalesStayExact) {
  std::mt19937 rng(25);
  Fp8Weight w(144, 192, DType::F32, rng);
  w.s32[1] = 1000.f;  // block (0, 1)
  w.s32[3] = 0x1p-140f;  // a subnormal fp32 scale in block (1, 1)
  w.refresh();
  for (int64_t T : {1, 9, 40}) {
    const std::vector<float> x = test::randn(rng, T * 192);
    std::vector<float> y(size_t(T * 144)), want(y.size());
    matmul(x.data(), T, w.view, y.data(), mode());
    matmul(x.data(), T, w.f32, want.data(), ComputeMode::F32);
    ASSERT_TRUE(test::same_bits(y, want)) << "T=" << T;
  }
}

INSTANTIATE_TEST_SUITE_P(Paths, Fp8Exact,
                         ::testing::Values(PathMode{KernelPath::Generic, ComputeMode::F32, "generic"},
                                           PathMode{KernelPath::Auto, ComputeMode::F32, "auto"}),
                         [](const auto& info) { return std::string(info.param.name); });
INSTANTIATE_TEST_SUITE_P(Paths, Fp8Paths,
                         ::testing::Values(PathMode{KernelPath::Generic, ComputeMode::F32, "generic"},
                                           PathMode{KernelPath::Auto, ComputeMode::F32, "auto"},
                                           PathMode{KernelPath::Auto, ComputeMode::BF16, "auto_bf16"}),
                         [](const auto& info) { return std::string(info.param.name); });

// T = 1 on the in-place fp8 kernel, one code per row: y[n] = x[0] * w[n, 0] exactly, for every
// non-NaN code (the kernel's own conversion, subnormal codes and -0 included).
// Every code through every kernel, and through both forms of the exact kernels (the second, for
// CPUs that stall on subnormal operands, keeps each code normal: matmul_micro.h).
TEST(Fp8, KernelConversionOfEveryCode) {
  const bool assists = cpu_features().subnormal_assists;
  for (const auto& [p, mode, form] :
       {std::tuple{KernelPath::Generic, ComputeMode::F32, false}, std::tuple{KernelPath::Auto, ComputeMode::F32, false},
        std::tuple{KernelPath::Auto, ComputeMode::F32, true}, std::tuple{KernelPath::Auto, ComputeMode::BF16, false}}) {
    set_subnormal_assists_for_tests(form);
    set_kernel_path(p);
    for (float s : {1.f, 0.0123f, 0x1p-20f}) {
      const int64_t N = 256, K = 40;  // two 16-wide steps and a tail of 8
      std::vector<uint8_t> q(size_t(N * K), 0);
      for (int64_t n = 0; n < N; n++) q[size_t(n * K)] = (n & 0x7f) == 0x7f ? 0 : uint8_t(n);
      const float grid[2] = {s, s};
      TensorView v;
      v.dtype = DType::F8_E4M3;
      v.shape = {N, K};
      v.data = q.data();
      v.name = "codes";
      v.scale.data = grid;
      v.scale.rows = 2;
      v.scale.cols = 1;
      std::vector<float> x(static_cast<size_t>(K), 0.f), y(static_cast<size_t>(N));
      x[0] = 1.f;
      matmul(x.data(), 1, v, y.data(), mode);
      for (int64_t n = 0; n < N; n++) {
        if ((n & 0x7f) == 0x7f) continue;
        EXPECT_EQ(double(y[size_t(n)]), double(float(e4m3_plain(uint8_t(n)) * s)))
            << "code " << n << " scale " << s << (mode == ComputeMode::BF16 ? " bf16 compute" : "")
            << (form ? " (no-subnormal form)" : "");
      }
    }
  }
  set_subnormal_assists_for_tests(assists);
  set_kernel_path(KernelPath::Auto);
}

TEST(Fp8, RefusesWeightWithoutScale) {
  const std::vector<uint8_t> data(6, 0x38);
  TensorView v;
  v.dtype = DType::F8_E4M3;
  v.shape = {2, 3};
  v.data = data.data();
  v.name = "model.layers.0.mlp.experts.3.down_proj.weight";
  std::vector<float> x(3, 1.f), y(2);
  const std::string want = "tensor 'model.layers.0.mlp.experts.3.down_proj.weight' is F8_E4M3 without a weight_scale_inv";
  try {
    matmul(x.data(), 1, v, y.data(), ComputeMode::F32);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  try {
    matmul_swiglu(x.data(), 1, v, v, y.data(), ComputeMode::F32);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
  // A grid too small for the tensor is refused too.
  const float s = 1.f;
  v.scale.data = &s;
  v.scale.rows = 1;
  v.scale.cols = 1;
  v.shape = {200, 3};
  std::vector<uint8_t> big(600, 0x38);
  v.data = big.data();
  y.resize(200);
  EXPECT_THROW(matmul(x.data(), 1, v, y.data(), ComputeMode::F32), InputError);
}

}  // namespace
}  // namespace epmoe
