// AVX-512 row kernels of causal_attention (attention_rows.h): the softmax of a score row and the
// context's weighted sum of V rows, with the arithmetic attention.h defines.
// GCC 12's AVX-512 headers trip -Wuninitialized on their own "undefined" vectors (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention_rows.h"

namespace epmoe {

namespace {

#define EPMOE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))

EPMOE_AVX512 inline __mmask16 tail_mask(int64_t n) { return __mmask16((1u << n) - 1); }

// attention_rows.h's exp_poly. NaN stays NaN (max returns its second operand on NaN).
EPMOE_AVX512 inline __m512 exp_nonpositive(__m512 x) {
  using namespace exp_poly;
  x = _mm512_max_ps(_mm512_set1_ps(kFloor), x);
  const __m512 n =
      _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 y = _mm512_set1_ps(kC[0]);
  for (int i = 1; i < 6; i++) y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(kC[i]));
  y = _mm512_fmadd_ps(y, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(y, n);
}

// The fixed tree of matmul's reduce16 (lanes l + l+8, + l+4, + l+2, + l+1).
EPMOE_AVX512 inline float reduce16(__m512 v) {
  const __m256 hi = _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1));
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}

// C vectors of 16 columns (the last with `last` lanes) of R rows: acc[r][c] over keys [j0, j1).
template <int R, int C>
EPMOE_AVX512 void pv_part(const float* const* p, int64_t j0, int64_t j1, const KvRows& v, int64_t off, __mmask16 last,
                          float* const* o) {
  __m512 acc[R][C];
  #pragma GCC unroll 4
  for (int r = 0; r < R; r++)
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++)
      acc[r][c] = j0 == 0 ? _mm512_setzero_ps() : _mm512_maskz_loadu_ps(c == C - 1 ? last : 0xFFFF, o[r] + 16 * c);
  for (int64_t j = j0; j < j1;) {
    // The keys of one cache block: one table lookup, then rows at a fixed stride.
    const int64_t in_block = j % v.block_tokens, cnt = std::min(v.block_tokens - in_block, j1 - j);
    const float* row = v.row(j) + off;
    for (int64_t t = 0; t < cnt; t++, row += v.row_stride) {
      __m512 vr[C];
      #pragma GCC unroll 4
      for (int c = 0; c < C; c++) vr[c] = _mm512_maskz_loadu_ps(c == C - 1 ? last : 0xFFFF, row + 16 * c);
      #pragma GCC unroll 4
      for (int r = 0; r < R; r++) {
        const __m512 pr = _mm512_set1_ps(p[r][j + t]);
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc[r][c] = _mm512_fmadd_ps(pr, vr[c], acc[r][c]);
      }
    }
    j += cnt;
  }
  #pragma GCC unroll 4
  for (int r = 0; r < R; r++)
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) _mm512_mask_storeu_ps(o[r] + 16 * c, c == C - 1 ? last : 0xFFFF, acc[r][c]);
}

template <int R>
EPMOE_AVX512 void pv_rows(const float* const* p, int64_t j0, int64_t j1, const KvRows& v, int64_t off, int D,
                          float* const* o) {
  // Columns in passes of up to 64 (4 vectors x R rows of accumulators stay in registers).
  for (int c0 = 0; c0 < D; c0 += 64) {
    const int cols = std::min(64, D - c0), vecs = (cols + 15) / 16;
    const __mmask16 last = tail_mask(cols - 16 * (vecs - 1));
    float* oc[4];
    for (int r = 0; r < R; r++) oc[r] = o[r] + c0;
    switch (vecs) {
      case 4: pv_part<R, 4>(p, j0, j1, v, off + c0, last, oc); break;
      case 3: pv_part<R, 3>(p, j0, j1, v, off + c0, last, oc); break;
      case 2: pv_part<R, 2>(p, j0, j1, v, off + c0, last, oc); break;
      default: pv_part<R, 1>(p, j0, j1, v, off + c0, last, oc); break;
    }
  }
}

}  // namespace

EPMOE_AVX512 void softmax_row_avx512(float* s, int64_t n) {
  if (n <= 0) return;
  const int64_t nv = n / 16 * 16;
  const __mmask16 tail = tail_mask(n - nv);
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < nv; j += 16) mx = _mm512_max_ps(mx, _mm512_loadu_ps(s + j));
  if (tail) mx = _mm512_mask_max_ps(mx, tail, mx, _mm512_maskz_loadu_ps(tail, s + nv));
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));  // max is exact in any order
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < nv; j += 16) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_loadu_ps(s + j), m));
    _mm512_storeu_ps(s + j, e);
    sum = _mm512_add_ps(sum, e);
  }
  if (tail) {
    const __m512 e = exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, s + nv), m));
    _mm512_mask_storeu_ps(s + nv, tail, e);
    sum = _mm512_mask_add_ps(sum, tail, sum, e);
  }
  const __m512 inv = _mm512_set1_ps(1.0f / reduce16(sum));
  for (int64_t j = 0; j < nv; j += 16) _mm512_storeu_ps(s + j, _mm512_mul_ps(_mm512_loadu_ps(s + j), inv));
  if (tail) _mm512_mask_storeu_ps(s + nv, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, s + nv), inv));
}

void pv_rows_avx512(int R, const float* const* p, int64_t j0, int64_t j1, const KvRows& v, int64_t off, int D,
                    float* const* o) {
  if (j1 <= j0 && j0 > 0) return;  // nothing to add to rows already started
  switch (R) {
    case 4: return pv_rows<4>(p, j0, j1, v, off, D, o);
    case 3: return pv_rows<3>(p, j0, j1, v, off, D, o);
    case 2: return pv_rows<2>(p, j0, j1, v, off, D, o);
    default: return pv_rows<1>(p, j0, j1, v, off, D, o);
  }
}

}  // namespace epmoe
