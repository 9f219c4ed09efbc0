// AVX2 + FMA row kernels of causal_attention (attention_rows.h): attention_avx512.cc's arithmetic
// on 8-lane registers, so that a CPU without AVX-512 gives the same attention bits (as the AVX2
// matmul gives the AVX-512 matmul's: matmul_avx2.cc).
//
// Why the bits match: the softmax's 16 sum lanes live in two 8-lane registers and are reduced by
// the same tree; exp is the same polynomial with the same FMAs, and 2^n is applied by one multiply
// (scalef rounds y * 2^n once too; n is in [-126, 0], so 2^n is a normal float); the context is one
// FMA per (column, key) in ascending keys whatever the vector width.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "kernels/attention_rows.h"
#include "kernels/avx2_lanes.h"

namespace epmoe {

namespace {

// Lanes [0, n) of 8 set (n clamped to 0..8), as maskload / maskstore want them.
EPMOE_AVX2 inline __m256i lanes_below(int64_t n) {
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(int(std::clamp<int64_t>(n, 0, 8))), idx);
}

// attention_rows.h's exp_poly, step for step as attention_avx512.cc.
EPMOE_AVX2 inline __m256 exp_nonpositive(__m256 x) {
  using namespace exp_poly;
  x = _mm256_max_ps(_mm256_set1_ps(kFloor), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 y = _mm256_set1_ps(kC[0]);
  for (int i = 1; i < 6; i++) y = _mm256_fmadd_ps(y, r, _mm256_set1_ps(kC[i]));
  y = _mm256_fmadd_ps(y, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n from its exponent bits (n + 127 in [1, 127]: normal), one rounding of y * 2^n as scalef.
  const __m256 p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(y, p2);
}

EPMOE_AVX2 inline float reduce_max8(__m256 v) {
  __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  m = _mm_max_ps(m, _mm_movehl_ps(m, m));
  m = _mm_max_ss(m, _mm_movehdup_ps(m));
  return _mm_cvtss_f32(m);
}

// C vectors of 8 columns (the last with lanes `last`) of R rows: o_r += p_r[j] * v_j over [j0, j1).
template <int R, int C>
EPMOE_AVX2 void pv_part(const float* const* p, int64_t j0, int64_t j1, const KvRows& v, int64_t off, __m256i last,
                        float* const* o) {
  const __m256i all = _mm256_set1_epi32(-1);
  __m256 acc[R][C];
  #pragma GCC unroll 4
  for (int r = 0; r < R; r++)
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++)
      acc[r][c] = j0 == 0 ? _mm256_setzero_ps() : _mm256_maskload_ps(o[r] + 8 * c, c == C - 1 ? last : all);
  for (int64_t j = j0; j < j1;) {
    const int64_t in_block = j % v.block_tokens, cnt = std::min(v.block_tokens - in_block, j1 - j);
    const float* row = v.row(j) + off;
    for (int64_t t = 0; t < cnt; t++, row += v.row_stride) {
      __m256 vr[C];
      #pragma GCC unroll 4
      for (int c = 0; c < C; c++) vr[c] = _mm256_maskload_ps(row + 8 * c, c == C - 1 ? last : all);
      #pragma GCC unroll 4
      for (int r = 0; r < R; r++) {
        const __m256 pr = _mm256_set1_ps(p[r][j + t]);
        #pragma GCC unroll 4
        for (int c = 0; c < C; c++) acc[r][c] = _mm256_fmadd_ps(pr, vr[c], acc[r][c]);
      }
    }
    j += cnt;
  }
  #pragma GCC unroll 4
  for (int r = 0; r < R; r++)
    #pragma GCC unroll 4
    for (int c = 0; c < C; c++) _mm256_maskstore_ps(o[r] + 8 * c, c == C - 1 ? last : all, acc[r][c]);
}

template <int R>
EPMOE_AVX2 void pv_rows(const float* const* p, int64_t j0, int64_t j1, const KvRows& v, int64_t off, int D,
                        float* const* o) {
  // Columns in passes of up to 16 (2 vectors x R rows of accumulators stay in registers).
  for (int c0 = 0; c0 < D; c0 += 16) {
    const int cols = std::min(16, D - c0), vecs = (cols + 7) / 8;
    const __m256i last = lanes_below(cols - 8 * (vecs - 1));
    float* oc[4];
    for (int r = 0; r < R; r++) oc[r] = o[r] + c0;
    if (vecs == 2) pv_part<R, 2>(p, j0, j1, v, off + c0, last, oc);
    else pv_part<R, 1>(p, j0, j1, v, off + c0, last, oc);
  }
}

}  // namespace

EPMOE_AVX2 void softmax_row_avx2(float* s, int64_t n) {
  if (n <= 0) return;
  const int64_t nv = n / 16 * 16, tail = n - nv;
  const __m256i t_lo = lanes_below(tail), t_hi = lanes_below(tail - 8);
  const __m256 ninf = _mm256_set1_ps(-INFINITY);
  __m256 mx = ninf;
  for (int64_t j = 0; j < nv; j += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + j));
  if (tail) {
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + nv, t_lo), _mm256_castsi256_ps(t_lo)));
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_maskload_ps(s + nv + 8, t_hi), _mm256_castsi256_ps(t_hi)));
  }
  const __m256 m = _mm256_set1_ps(reduce_max8(mx));  // max is exact in any order
  __m256 lo = _mm256_setzero_ps(), hi = _mm256_setzero_ps();
  for (int64_t j = 0; j < nv; j += 16) {
    const __m256 a = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j), m));
    const __m256 b = exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + j + 8), m));
    _mm256_storeu_ps(s + j, a);
    _mm256_storeu_ps(s + j + 8, b);
    lo = _mm256_add_ps(lo, a);
    hi = _mm256_add_ps(hi, b);
  }
  if (tail) {  // lanes past the row keep their sums, as the AVX-512 kernel's masked add
    const __m256 a = exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(s + nv, t_lo), m));
    const __m256 b = exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(s + nv + 8, t_hi), m));
    _mm256_maskstore_ps(s + nv, t_lo, a);
    _mm256_maskstore_ps(s + nv + 8, t_hi, b);
    lo = _mm256_blendv_ps(lo, _mm256_add_ps(lo, a), _mm256_castsi256_ps(t_lo));
    hi = _mm256_blendv_ps(hi, _mm256_add_ps(hi, b), _mm256_castsi256_ps(t_hi));
  }
  const __m256 inv = _mm256_set1_ps(1.0f / reduce16_avx2(lo, hi));
  for (int64_t j = 0; j + 8 <= n; j += 8) _mm256_storeu_ps(s + j, _mm256_mul_ps(_mm256_loadu_ps(s + j), inv));
  const int64_t n8 = n / 8 * 8;
  if (n8 < n) {
    const __m256i t = lanes_below(n - n8);
    _mm256_maskstore_ps(s + n8, t, _mm256_mul_ps(_mm256_maskload_ps(s + n8, t), inv));
  }
}

void pv_rows_avx2(int R, const float* const* p, int64_t j0, int64_t j1, const KvRows& v, int64_t off, int D,
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
