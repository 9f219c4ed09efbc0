// Internal to src/kernels: the AVX-512 row kernels of causal_attention (attention_avx512.cc), with
// the arithmetic attention.h defines, and their AVX2 twins (attention_avx2.cc: the same bits).
// Only call the _avx512 ones when cpu_features().avx512, the _avx2 ones with .avx2 and .fma.
#pragma once

#include <cstdint>

#include "kernels/attention.h"

namespace epmoe {

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
