// AVX2 + FMA micro-kernels: the AVX-512 fp32 kernels' arithmetic (matmul_avx512.cc) on half-width
// registers, for the many CPUs without AVX-512 (Zen 2 / Zen 3, most Intel client parts).
//
// Why not a kernel of its own with 8 lanes: an element's bits are fixed by its reduction order
// (matmul.h), and the AVX-512 kernels give each element 16 lane partial sums over k = 16c + l. Here
// each of those 16 lanes lives in one of two 8-lane registers (lanes 0-7 and 8-15), sees the same
// FMAs in the same ascending c, and the 16 are reduced by the same tree (l + l+8, + l+4, + l+2,
// + l+1) -- so the AVX2 path gives the AVX-512 path's bits, and a model's logits do not depend on
// whether the CPU has AVX-512 (tests/kernels/kernel_paths_test.cc holds the two paths equal where
// both run). bf16 compute (vdpbf16ps) has no AVX2 twin: on AVX2 it runs the fp32 arithmetic.
//
// Tiles: 16 ymm registers hold 2 x 2 elements' 16 lanes (8 accumulators) with their weights and
// activations; the drivers' 4 x 4 tiles run as 2 x 2 sub-tiles (1 x 4 at one token), each element
// with the same arithmetic whichever sub-tile computes it.
#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/avx2_lanes.h"
#include "kernels/cpu_features.h"
#include "kernels/matmul_micro.h"

namespace epmoe {

namespace {

// Weights of lanes [k, k + 8) as fp32: F32 as stored, BF16 widened exactly (shifted into the high half).
template <DType D>
EPMOE_AVX2 inline __m256 load_w8(const void* w, int64_t k) {
  if constexpr (D == DType::F32) {
    return _mm256_loadu_ps(static_cast<const float*>(w) + k);
  } else {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(w) + k));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
}

template <DType D>
inline float load_w1(const void* w, int64_t k) {
  if constexpr (D == DType::F32) return static_cast<const float*>(w)[k];
  else return bf16_to_f32(static_cast<const uint16_t*>(w)[k]);
}

// 8 fp8 codes -> q * 2^-120 as fp32 (matmul_micro.h; matmul_avx512.cc's fp8_bits16 on 8 lanes).
EPMOE_AVX2 inline __m256 fp8_bits8(const uint8_t* q) {
  const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
  return _mm256_castsi256_ps(_mm256_and_si256(_mm256_slli_epi32(v, 20), _mm256_set1_epi32(int(kFp8Bits))));
}

// The same 8 codes as q * 2^-112, normal for every nonzero code (matmul_micro.h's second form, for
// CPUs that stall on subnormal operands): lanes with exponent field 0 get one more in it and 2^-118
// taken off (other lanes subtract +0: exact for the positive magnitudes), then the sign.
EPMOE_AVX2 inline __m256 fp8_bits8_normal(const uint8_t* q) {
  const __m256i v = _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(q)));
  const __m256i t = _mm256_slli_epi32(v, 20);
  const __m256i mag = _mm256_and_si256(t, _mm256_set1_epi32(int(kFp8Mag)));
  const __m256i e0 = _mm256_cmpeq_epi32(_mm256_and_si256(mag, _mm256_set1_epi32(int(kFp8Exp))), _mm256_setzero_si256());
  const __m256i r = _mm256_add_epi32(_mm256_add_epi32(mag, _mm256_set1_epi32(int(kFp8Bias112))),
                                     _mm256_and_si256(e0, _mm256_set1_epi32(1 << 23)));
  const __m256 f = _mm256_sub_ps(_mm256_castsi256_ps(r), _mm256_and_ps(_mm256_castsi256_ps(e0), _mm256_set1_ps(kFp8Sub112)));
  return _mm256_or_ps(f, _mm256_castsi256_ps(_mm256_and_si256(t, _mm256_set1_epi32(int(0x80000000u)))));
}

// Where a sub-tile's lane accumulators and results sit in the whole tile's layout (acc:
// [mr][nr_all][16] floats, lanes 0-7 then 8-15; out: [mr][nr_all]).
struct SubTile {
  int nr_all;
  float* acc;  // at the sub-tile's first element, or nullptr (no K blocks)
  float* out;  // likewise
};

// The element (i, j) of a sub-tile: its 16 lanes start from zero (k0 = 0) or from acc.
template <int MR, int NR>
EPMOE_AVX2 inline void lanes_start(__m256 (&lo)[MR][NR], __m256 (&hi)[MR][NR], int64_t k0, const SubTile& t) {
  #pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
      const float* m = t.acc + (i * t.nr_all + j) * 16;
      lo[i][j] = k0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(m);
      hi[i][j] = k0 == 0 ? _mm256_setzero_ps() : _mm256_loadu_ps(m + 8);
    }
}

template <int MR, int NR>
EPMOE_AVX2 inline void lanes_save(__m256 (&lo)[MR][NR], __m256 (&hi)[MR][NR], const SubTile& t) {
  #pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
      float* m = t.acc + (i * t.nr_all + j) * 16;
      _mm256_storeu_ps(m, lo[i][j]);
      _mm256_storeu_ps(m + 8, hi[i][j]);
    }
}

// The last K block: reduce16, then the scalar tail beyond the last full 16 in ascending k (as
// matmul_avx512.cc's finish_tile; -ffp-contract=off keeps the tail's multiply and add apart in both).
template <int MR, int NR, class Tail>
EPMOE_AVX2 inline void lanes_finish(__m256 (&lo)[MR][NR], __m256 (&hi)[MR][NR], int64_t kv, int64_t K, Tail tail,
                                    const SubTile& t) {
  #pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
      float s = reduce16_avx2(lo[i][j], hi[i][j]);
      for (int64_t k = kv; k < K; k++) s += tail(i, j, k);
      t.out[i * t.nr_all + j] = s;
    }
}

// One half of a 16-lane step: acc[i][j] += x_i[k .. k + 8) * wr[j] (the lanes of lo at k, of hi at
// k + 8), every row of the sub-tile against every weight row's 8 lanes.
template <int MR, int NR>
EPMOE_AVX2 inline void fma_half(__m256 (&acc)[MR][NR], const float* const* x, int64_t k, const __m256 (&wr)[NR]) {
  #pragma GCC unroll 4
  for (int i = 0; i < MR; i++) {
    const __m256 xr = _mm256_loadu_ps(x[i] + k);
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) acc[i][j] = _mm256_fmadd_ps(xr, wr[j], acc[i][j]);
  }
}

// F32 / BF16 weights: micro_f32's FMAs, half a 16-lane step at a time.
template <DType D, int MR, int NR>
EPMOE_AVX2 void f32_part(const float* const* x, const void* const* w, int64_t K, int64_t k0, int64_t k1, SubTile t) {
  __m256 lo[MR][NR], hi[MR][NR];
  lanes_start<MR, NR>(lo, hi, k0, t);
  const int64_t kv = K / 16 * 16, ke = k1 < kv ? k1 : kv;
  for (int64_t k = k0; k < ke; k += 16) {
    __m256 wr[NR];
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) wr[j] = load_w8<D>(w[j], k);
    fma_half<MR, NR>(lo, x, k, wr);
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) wr[j] = load_w8<D>(w[j], k + 8);
    fma_half<MR, NR>(hi, x, k + 8, wr);
  }
  if (k1 < K) return lanes_save<MR, NR>(lo, hi, t);
  lanes_finish<MR, NR>(lo, hi, kv, K, [&](int i, int j, int64_t k) { return x[i][k] * load_w1<D>(w[j], k); }, t);
}

// F8_E4M3 weights, fp32 compute: micro_fp8's arithmetic -- each weight q * s with one rounding
// (the dequantized F32 tensor's bits), then the FMA; the scale re-read once per 128 columns.
// kNormal: the codes' second form (CpuFeatures::subnormal_assists), the same bits.
template <int MR, int NR, bool kNormal>
EPMOE_AVX2 void fp8_part(const float* const* x, const void* const* wv, int64_t K, int64_t k0, int64_t k1, SubTile t) {
  const CodeRow* r[NR];
  #pragma GCC unroll 4
  for (int j = 0; j < NR; j++) r[j] = static_cast<const CodeRow*>(wv[j]);
  __m256 lo[MR][NR], hi[MR][NR];
  lanes_start<MR, NR>(lo, hi, k0, t);
  const int64_t kv = K / 16 * 16, ke = k1 < kv ? k1 : kv;
  for (int64_t k = k0; k < ke;) {
    const int64_t blk = k / kFp8Block, be = std::min(ke, (blk + 1) * kFp8Block);
    __m256 sc[NR];
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) sc[j] = _mm256_set1_ps(code_block_scale(*r[j], blk) * fp8_fold(kNormal));
    for (; k < be; k += 16) {
      __m256 wr[NR];
      #pragma GCC unroll 2
      for (int h = 0; h < 2; h++) {  // lanes 0-7 into lo, 8-15 into hi
        const int64_t kh = k + 8 * h;
        #pragma GCC unroll 4
        for (int j = 0; j < NR; j++)
          wr[j] = _mm256_mul_ps(kNormal ? fp8_bits8_normal(r[j]->q + kh) : fp8_bits8(r[j]->q + kh), sc[j]);
        fma_half<MR, NR>(h == 0 ? lo : hi, x, kh, wr);
      }
    }
  }
  if (k1 < K) return lanes_save<MR, NR>(lo, hi, t);
  lanes_finish<MR, NR>(
      lo, hi, kv, K,
      [&](int i, int j, int64_t k) {
        return x[i][k] * (fp8_times_2m120(r[j]->q[k]) * (code_block_scale(*r[j], k / kFp8Block) * 0x1p120f));
      },
      t);
}

// I8 rows (tensor/quantize.h), fp32 arithmetic in either compute mode: matmul_micro.h's block
// form -- per whole 32-column block, each lane's two products summed (a multiply, an FMA), then
// times the block's scale into the lane's total (an FMA): no multiply per weight.
template <int MR, int NR>
EPMOE_AVX2 void i8_part(const float* const* x, const void* const* wv, int64_t K, int64_t k0, int64_t k1, SubTile t) {
  const CodeRow* r[NR];
  #pragma GCC unroll 4
  for (int j = 0; j < NR; j++) r[j] = static_cast<const CodeRow*>(wv[j]);
  __m256 lo[MR][NR], hi[MR][NR];
  lanes_start<MR, NR>(lo, hi, k0, t);
  static_assert(kI8Block == 32);
  const int64_t kb = K / kI8Block * kI8Block, ke = k1 < kb ? k1 : kb;
  auto codes8 = [&](int j, int64_t k) EPMOE_AVX2_LAMBDA {
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(r[j]->q + k))));
  };
  for (int64_t k = k0; k < ke; k += kI8Block) {
    __m256 sc[NR];
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) sc[j] = _mm256_set1_ps(code_block_scale(*r[j], k / kI8Block));
    #pragma GCC unroll 2
    for (int h = 0; h < 2; h++) {  // lanes 0-7 (columns k .. k+7 and k+16 .. k+23) into lo, 8-15 into hi
      const int64_t ka = k + 8 * h, kc = ka + 16;
      #pragma GCC unroll 4
      for (int j = 0; j < NR; j++) {
        const __m256 wa = codes8(j, ka), wc = codes8(j, kc);
        #pragma GCC unroll 4
        for (int i = 0; i < MR; i++) {
          const __m256 p = _mm256_fmadd_ps(_mm256_loadu_ps(x[i] + kc), wc, _mm256_mul_ps(_mm256_loadu_ps(x[i] + ka), wa));
          __m256& tot = h == 0 ? lo[i][j] : hi[i][j];
          tot = _mm256_fmadd_ps(p, sc[j], tot);
        }
      }
    }
  }
  if (k1 < K) return lanes_save<MR, NR>(lo, hi, t);
  lanes_finish<MR, NR>(
      lo, hi, kb, K,
      [&](int i, int j, int64_t k) {
        return x[i][k] * (float(int8_t(r[j]->q[k])) * code_block_scale(*r[j], k / kI8Block));
      },
      t);
}

using PartFn = void (*)(const float* const*, const void* const*, int64_t, int64_t, int64_t, SubTile);

template <DType D>
struct F32Parts {
  template <int MR, int NR>
  static void fn(const float* const* x, const void* const* w, int64_t K, int64_t k0, int64_t k1, SubTile t) {
    f32_part<D, MR, NR>(x, w, K, k0, k1, t);
  }
};
template <bool kNormal>
struct Fp8Parts {
  template <int MR, int NR>
  static void fn(const float* const* x, const void* const* w, int64_t K, int64_t k0, int64_t k1, SubTile t) {
    fp8_part<MR, NR, kNormal>(x, w, K, k0, k1, t);
  }
};

struct I8Parts {
  template <int MR, int NR>
  static void fn(const float* const* x, const void* const* w, int64_t K, int64_t k0, int64_t k1, SubTile t) {
    i8_part<MR, NR>(x, w, K, k0, k1, t);
  }
};

// An mr x nr tile (<= 4 x 4) as sub-tiles: one row of up to 4 columns, or up to 2 x 2.
template <class P>
void tile(int mr, int nr, const void* const* xv, const void* const* w, int64_t K, int64_t k0, int64_t k1, float* acc,
          float* out) {
  static constexpr PartFn one_row[4] = {P::template fn<1, 1>, P::template fn<1, 2>, P::template fn<1, 3>,
                                        P::template fn<1, 4>};
  static constexpr PartFn parts[2][2] = {{P::template fn<1, 1>, P::template fn<1, 2>},
                                         {P::template fn<2, 1>, P::template fn<2, 2>}};
  const float* const* x = reinterpret_cast<const float* const*>(xv);
  if (mr == 1) return one_row[nr - 1](x, w, K, k0, k1, SubTile{nr, acc, out});
  for (int i0 = 0; i0 < mr; i0 += 2)
    for (int j0 = 0; j0 < nr; j0 += 2) {
      const int m = std::min(2, mr - i0), n = std::min(2, nr - j0);
      const SubTile t{nr, acc ? acc + (i0 * nr + j0) * 16 : nullptr, out + i0 * nr + j0};
      parts[m - 1][n - 1](x + i0, w + j0, K, k0, k1, t);
    }
}

}  // namespace

Micro avx2_micro(DType w) {
  switch (w) {
    // Four weight rows per few-token tile (rows N/4 apart: four sequential streams per thread):
    // one row gives a token only two FMA chains (lanes 0-7, 8-15), latency-bound below DRAM speed
    // on Zen 3. Measured on 2 Zen 3 cores, the 4-layer synthesized Qwen3-30B-A3B (bf16), decode at
    // depth 64, three interleaved runs: 1 row 15.1-19.0 tok/s at 18.8-21.0 GB/s of read bandwidth,
    // 2 rows 18.7-23.0 at 18.9-25.0, 4 rows 21.8-23.3 at 19.0-21.8.
    case DType::F32: return {&tile<F32Parts<DType::F32>>, false, true, "avx2", 4};
    case DType::BF16: return {&tile<F32Parts<DType::BF16>>, false, true, "avx2", 4};
    // Four rows per few-token tile, as on AVX-512 (independent FMA chains per token).
    case DType::F8_E4M3:
      return {cpu_features().subnormal_assists ? &tile<Fp8Parts<true>> : &tile<Fp8Parts<false>>, false, true, "avx2", 4};
    // Int8 rows: four rows per few-token tile, as fp8; the same kernel at every T (no dequantized
    // form: its arithmetic is the block form's own).
    case DType::I8: return {&tile<I8Parts>, false, true, "avx2", 4};
    default: return {};
  }
}

}  // namespace epmoe
