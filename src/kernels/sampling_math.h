// The arithmetic of sampling and log-probs, written once for the host and the GPU so that both
// give the same bits: a token drawn on the device is the token engine/sampling.cc draws from the
// same logits row, and its log-prob is the number `score --temperature` computes on the host.
//
// Nothing here calls a math library: exp and log are our own (range reduction + polynomial,
// every multiply-add an explicit fma, the other operations plain IEEE ones that neither compiler
// may fuse -- the host file that uses them is built with -ffp-contract=off, the device code goes
// through the _rn intrinsics), because libm and CUDA's exp/log round differently. They are
// accurate to a few 1e-16 (relative), which is all sampling needs; what matters is that they are
// the same function on both sides.
//
// The log-sum-exp of a row sums in one fixed order on both: lane j of kLogprobLanes adds the ids
// j, j + lanes, j + 2 lanes, ... in ascending order, then the lanes are added pairwise in a tree
// (lane j += lane j + w for w = lanes/2, lanes/4, ..., 1).
#pragma once

#include <cstdint>
#include <cstring>

#include "util/hash.h"

#if defined(__CUDA_ARCH__)
#define EPMOE_DMUL(a, b) __dmul_rn((a), (b))
#define EPMOE_DADD(a, b) __dadd_rn((a), (b))
#define EPMOE_DSUB(a, b) __dsub_rn((a), (b))
#define EPMOE_FADD(a, b) __fadd_rn((a), (b))
#define EPMOE_FSUB(a, b) __fsub_rn((a), (b))
#define EPMOE_FMA(a, b, c) fma((a), (b), (c))
#else
#include <cmath>
#define EPMOE_DMUL(a, b) ((a) * (b))
#define EPMOE_DADD(a, b) ((a) + (b))
#define EPMOE_DSUB(a, b) ((a) - (b))
#define EPMOE_FADD(a, b) ((a) + (b))
#define EPMOE_FSUB(a, b) ((a) - (b))
#define EPMOE_FMA(a, b, c) std::fma((a), (b), (c))
#endif

// The host loops that call these run as FMA clones where the CPU has FMA (std::fma is then one
// instruction; elsewhere the library's exact software fma: the same bits, slower).
#if defined(__x86_64__) && !defined(__CUDACC__) && !defined(__SANITIZE_ADDRESS__)
#define EPMOE_FMA_CLONES __attribute__((target_clones("fma", "default")))
#else
#define EPMOE_FMA_CLONES
#endif
// Inlined into those clones (a call would run the default target's code).
#if defined(__CUDACC__)
#define EPMOE_MATH_FN EPMOE_HOST_DEVICE inline
#else
#define EPMOE_MATH_FN inline __attribute__((always_inline))
#endif

namespace epmoe {

constexpr int kLogprobLanes = 1024;

// ln 2 split so that k * kLn2Hi is exact for |k| < 2^11 (Cody-Waite).
constexpr double kLn2Hi = 6.93147180369123816490e-01, kLn2Lo = 1.90821492927058770002e-10;

// 2^k for -1022 <= k <= 1023, exactly, from its bits.
EPMOE_MATH_FN double pow2_exact(int64_t k) {
  const uint64_t bits = uint64_t(k + 1023) << 52;
  double d;
  memcpy(&d, &bits, sizeof d);
  return d;
}

// e^x. Cody-Waite reduction x = k ln2 + r (|r| <= ln2 / 2), Taylor to r^13 (error < 5e-18).
EPMOE_MATH_FN double det_exp(double x) {
  if (!(x == x)) return x;  // NaN
  if (x > 709.0) return INFINITY;
  if (x < -708.0) return 0.0;  // below the normal range: 0 is close enough for sampling
  // k = round-to-nearest-even(x / ln2) by the 1.5 * 2^52 trick (no rint: one code on both sides).
  const double k = EPMOE_DSUB(EPMOE_DADD(EPMOE_DMUL(x, 1.4426950408889634), 0x1.8p52), 0x1.8p52);
  double r = EPMOE_FMA(-k, kLn2Hi, x);
  r = EPMOE_FMA(-k, kLn2Lo, r);
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = EPMOE_FMA(p, r, 1.0 / 479001600.0);
  p = EPMOE_FMA(p, r, 1.0 / 39916800.0);
  p = EPMOE_FMA(p, r, 1.0 / 3628800.0);
  p = EPMOE_FMA(p, r, 1.0 / 362880.0);
  p = EPMOE_FMA(p, r, 1.0 / 40320.0);
  p = EPMOE_FMA(p, r, 1.0 / 5040.0);
  p = EPMOE_FMA(p, r, 1.0 / 720.0);
  p = EPMOE_FMA(p, r, 1.0 / 120.0);
  p = EPMOE_FMA(p, r, 1.0 / 24.0);
  p = EPMOE_FMA(p, r, 1.0 / 6.0);
  p = EPMOE_FMA(p, r, 0.5);
  p = EPMOE_FMA(p, r, 1.0);
  p = EPMOE_FMA(p, r, 1.0);
  const int64_t ki = int64_t(k);  // |k| <= 1023 here
  return EPMOE_DMUL(p, pow2_exact(ki));
}

// ln x for a normal x > 0 (0 -> -inf, negative or NaN -> NaN). x = 2^e m with m in
// [sqrt(1/2), sqrt(2)), ln m = 2 atanh(f), f = (m - 1) / (m + 1), |f| < 0.172: the series to f^23.
EPMOE_MATH_FN double det_log(double x) {
  if (!(x > 0.0)) return x == 0.0 ? -INFINITY : NAN;
  if (x == INFINITY) return x;
  uint64_t bits;
  memcpy(&bits, &x, sizeof bits);
  int64_t e = int64_t((bits >> 52) & 0x7ff) - 1023;
  if (e == -1023) return NAN;  // subnormal: never met here (sums >= 1, uniforms >= 2^-54)
  uint64_t mbits = (bits & 0x000fffffffffffffull) | 0x3ff0000000000000ull;  // m in [1, 2)
  double m;
  memcpy(&m, &mbits, sizeof m);
  if (m > 1.4142135623730951) {
    m = EPMOE_DMUL(m, 0.5);
    e += 1;
  }
  const double f = (m - 1.0) / EPMOE_DADD(m, 1.0);
  const double s = EPMOE_DMUL(f, f);
  double p = 2.0 / 23.0;
  p = EPMOE_FMA(p, s, 2.0 / 21.0);
  p = EPMOE_FMA(p, s, 2.0 / 19.0);
  p = EPMOE_FMA(p, s, 2.0 / 17.0);
  p = EPMOE_FMA(p, s, 2.0 / 15.0);
  p = EPMOE_FMA(p, s, 2.0 / 13.0);
  p = EPMOE_FMA(p, s, 2.0 / 11.0);
  p = EPMOE_FMA(p, s, 2.0 / 9.0);
  p = EPMOE_FMA(p, s, 2.0 / 7.0);
  p = EPMOE_FMA(p, s, 2.0 / 5.0);
  p = EPMOE_FMA(p, s, 2.0 / 3.0);
  p = EPMOE_FMA(p, s, 2.0);
  const double de = double(e);
  return EPMOE_FMA(de, kLn2Hi, EPMOE_FMA(de, kLn2Lo, EPMOE_DMUL(f, p)));
}

EPMOE_MATH_FN float det_expf(float x) { return float(det_exp(double(x))); }
EPMOE_MATH_FN float det_logf(float x) { return float(det_log(double(x))); }

// The uniform variate in (0, 1) of (seed, position, vocabulary id): three chained splitmix64
// rounds, one per key, 53 bits shifted off 0 and 1.
EPMOE_MATH_FN double sampling_uniform_of(uint64_t seed, int64_t position, int32_t id) {
  const uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ uint64_t(position)) ^ uint64_t(uint32_t(id)));
  return EPMOE_DMUL(EPMOE_DADD(double(h >> 11), 0.5), 0x1.0p-53);
}

// The key of id in the exponential race of a draw: -ln(u) * e^(m - l/T), m the largest l/T of the
// row in double. argmin over the ids (ties to the lower id) is argmax(l/T + Gumbel noise).
EPMOE_MATH_FN double race_key(double u, float logit, double T, double m) {
  return EPMOE_DMUL(-det_log(u), det_exp(EPMOE_DSUB(m, double(logit) / T)));
}

}  // namespace epmoe
