// Internal to src/kernels: the AVX-512 row kernels of causal_attention (attention_avx512.cc), with
// the arithmetic attention.h defines, and their AVX2 twins (attention_avx2.cc: the same bits).
// Only call the _avx512 ones when cpu_features().avx512, the _avx2 ones with .avx2 and .fma.
#pragma once

#include <cstdint>

#include "kernels/attention.h"

namespace epmoe {

// e^x for x <= 0 (a score minus its row's max), ~1 ulp: Cephes' expf -- x = n ln2 + r with
// |r| <= ln2 / 2 (ln2 in two parts, so r is exact), a degree-6 polynomial for e^r, times 2^n.
// Below -87.33 (e^x < FLT_MIN) the result is that of -87.33, ~1.2e-38: such a term adds nothing a
// row's sum of at least 1 can hold. One set of constants for both vector widths, so that the
// AVX-512 and AVX2 kernels evaluate the very same polynomial.
namespace exp_poly {
inline constexpr float kFloor = -87.33654f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f, kLn2Lo = -2.12194440e-4f;
inline constexpr float kC[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace exp_poly

// s[0 .. n) -> the softmax of the row, in place (vector exp, 16-lane sum, the fixed tree).
void softmax_row_avx512(float* s, int64_t n);

// For r < R (1..4): o_r[0 .. D) = sum over j in [j0, j1) of p_r[j] * v.row(j)[off .. off + D), one
// FMA per term in ascending j, starting from zero when j0 == 0, else from o_r as it stands (so a
// row's sum may be continued alone past the keys its tile shares).
void pv_rows_avx512(int R, const float* const* p, int64_t j0, int64_t j1, const KvRows& v, int64_t off, int D,
                    float* const* o);

void softmax_row_avx2(float* s, int64_t n);
void pv_rows_avx2(int R, const float* const* p, int64_t j0, int64_t j1, const KvRows& v, int64_t off, int D,
                  float* const* o);

}  // namespace epmoe
