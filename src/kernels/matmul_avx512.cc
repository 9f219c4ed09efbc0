// AVX-512 micro-kernels. Every loop over the tile's rows is unrolled (#pragma GCC unroll) so that
// the accumulators live in registers: a tile indexed at run time would sit on the stack. (Software
// prefetch inside the kernel was measured slower than the hardware prefetcher at T = 1: 12 vs
// 17 GB/s on one Zen 4 thread; the tiled driver prefetches the NEXT tile instead, see matmul.cc.)
// Dot-product form (each output element owns a vector of lane partial
// sums over k) rather than the outer-product form of most GEMMs: it keeps one fixed reduction
// order per element however the tile is shaped, which is what batch invariance needs. The cost
// is one horizontal reduction per element per K, small next to K / 16 FMAs.
// GCC 12's AVX-512 headers trip -Wuninitialized on their own "undefined" vectors (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu_features.h"
#include "kernels/matmul_micro.h"

namespace epmoe {

namespace {

#define EPMOE_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,fma")))
#define EPMOE_AVX512_LAMBDA __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,fma")))
#define EPMOE_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,fma,avx512bf16")))
#define EPMOE_AVX512BF16_LAMBDA __attribute__((always_inline, target("avx512f,avx512bw,avx512vl,fma,avx512bf16")))

template <DType D>
EPMOE_AVX512 inline __m512 load_w16(const void* w, int64_t k) {
  if constexpr (D == DType::F32) {
    return _mm512_loadu_ps(static_cast<const float*>(w) + k);
  } else {  // BF16: widen to 32 bits and shift into the high half: exact
    __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const uint16_t*>(w) + k));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
  }
}

template <DType D>
inline float load_w1(const void* w, int64_t k) {
  if constexpr (D == DType::F32) return static_cast<const float*>(w)[k];
  else return bf16_to_f32(static_cast<const uint16_t*>(w)[k]);
}

EPMOE_AVX512 inline float reduce16(__m512 v) {
  // Fixed tree: 512 -> 256 -> 128 -> 64 -> 32 bits.
  const __m256 hi = _mm256_castsi256_ps(_mm512_extracti64x4_epi64(_mm512_castps_si512(v), 1));
  __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), hi);
  __m128 b = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
  __m128 c = _mm_add_ps(b, _mm_movehl_ps(b, b));
  __m128 d = _mm_add_ss(c, _mm_movehdup_ps(c));
  return _mm_cvtss_f32(d);
}

// The reduce16 tree of all 16 accumulators of a 4 x 4 tile at once, in 15 vector adds: every
// element gets exactly the adds of reduce16 (lanes l + l+8, then + l+4, + l+2, + l+1), the
// shuffles only move lanes so that one add serves several elements. out[i * 4 + j] = acc[i][j].
EPMOE_AVX512 inline void reduce_4x4(const __m512 (&acc)[4][4], float* out) {
  __m512 a[8], b[4], c[2];
  #pragma GCC unroll 8
  for (int p = 0; p < 8; p++) {  // [v[l] + v[l+8] of acc 2p | of acc 2p+1]
    const __m512 u = acc[(2 * p) / 4][(2 * p) % 4], v = acc[(2 * p + 1) / 4][(2 * p + 1) % 4];
    a[p] = _mm512_add_ps(_mm512_shuffle_f32x4(u, v, 0x44), _mm512_shuffle_f32x4(u, v, 0xEE));
  }
  #pragma GCC unroll 4
  for (int p = 0; p < 4; p++)  // 128-bit lane e holds + l+4 of element 4p + e
    b[p] = _mm512_add_ps(_mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0x88),
                         _mm512_shuffle_f32x4(a[2 * p], a[2 * p + 1], 0xDD));
  #pragma GCC unroll 2
  for (int p = 0; p < 2; p++)  // lane e: {+ l+2 of element 8p + e (2 floats), of element 8p + 4 + e (2 floats)}
    c[p] = _mm512_add_ps(_mm512_shuffle_ps(b[2 * p], b[2 * p + 1], 0x44), _mm512_shuffle_ps(b[2 * p], b[2 * p + 1], 0xEE));
  // lane e: elements e, 4 + e, 8 + e, 12 + e, i.e. position 4e + s holds element 4s + e
  const __m512 d = _mm512_add_ps(_mm512_shuffle_ps(c[0], c[1], 0x88), _mm512_shuffle_ps(c[0], c[1], 0xDD));
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  _mm512_storeu_ps(out, _mm512_permutexvar_ps(idx, d));
}

// Accumulators of a K block that is not the last one go to acc (lane partial sums, [MR][NR][16]),
// and the next block starts from them: the lanes see k = 16c + l in ascending c as in one pass.
template <int MR, int NR>
EPMOE_AVX512 inline void acc_start(__m512 (&acc)[MR][NR], int64_t k0, const float* mem) {
  #pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) acc[i][j] = k0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(mem + (i * NR + j) * 16);
}

template <int MR, int NR>
EPMOE_AVX512 inline void acc_save(__m512 (&acc)[MR][NR], float* mem) {
  #pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) _mm512_storeu_ps(mem + (i * NR + j) * 16, acc[i][j]);
}

// The last K block: each element's 16 lanes reduced (one 4x4 transpose-reduction for a full tile,
// reduce16 otherwise: the same adds), then the K tail beyond the last full vector added in
// ascending k; tail(i, j, k) is the product x_ik * w_jk of the kernel's element types.
template <int MR, int NR, class Tail>
EPMOE_AVX512 inline void finish_tile(__m512 (&acc)[MR][NR], int64_t kv, int64_t K, Tail tail, float* out) {
  if constexpr (MR == 4 && NR == 4) {
    reduce_4x4(acc, out);
  } else {
    #pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
      #pragma GCC unroll 4
      for (int j = 0; j < NR; j++) out[i * NR + j] = reduce16(acc[i][j]);
  }
  if (kv < K)
    for (int i = 0; i < MR; i++)
      for (int j = 0; j < NR; j++) {
        float s = out[i * NR + j];
        for (int64_t k = kv; k < K; k++) s += tail(i, j, k);
        out[i * NR + j] = s;
      }
}

template <DType D, int MR, int NR>
EPMOE_AVX512 void micro_f32(const void* const* xv, const void* const* w, int64_t K, int64_t k0, int64_t k1, float* accm,
                            float* out) {
  const float* const* x = reinterpret_cast<const float* const*>(xv);
  __m512 acc[MR][NR];
  acc_start<MR, NR>(acc, k0, accm);
  const int64_t kv = K / 16 * 16, ke = k1 < kv ? k1 : kv;
  for (int64_t k = k0; k < ke; k += 16) {
    __m512 wr[NR];
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) wr[j] = load_w16<D>(w[j], k);
    #pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
      const __m512 xr = _mm512_loadu_ps(x[i] + k);
      #pragma GCC unroll 4
      for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xr, wr[j], acc[i][j]);
    }
  }
  if (k1 < K) return acc_save<MR, NR>(acc, accm);
  finish_tile<MR, NR>(acc, kv, K, [&](int i, int j, int64_t k) { return x[i][k] * load_w1<D>(w[j], k); }, out);
}

// BF16 weights, bf16 compute: 32 bf16 pairs per vdpbf16ps into 16 fp32 lanes.
// kByFma: the same arithmetic without the instruction (CpuFeatures::bf16_dot_by_fma, for CPUs where
// it is the slower). vdpbf16ps does per lane acc += the odd pair element's product, then acc += the
// even one's, each one rounding, denormal inputs read as zero and denormal results flushed: two
// FMAs under MXCSR DAZ + FTZ (for the loop only) give its bits. As fp32, a dword's odd bf16 is the
// dword with its low half cleared, the even one the dword shifted up 16.
inline constexpr unsigned kMxcsrDazFtz = 0x8040;

template <int MR, int NR>
EPMOE_AVX512 inline void pin_accumulators(__m512 (&acc)[MR][NR]) {  // no FMA moves across an MXCSR write
  #pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) asm volatile("" : "+v"(acc[i][j]));
}

template <int MR, int NR, bool kByFma>
EPMOE_AVX512BF16 void micro_bf16(const void* const* xv, const void* const* wv, int64_t K, int64_t k0, int64_t k1,
                                 float* accm, float* out) {
  const uint16_t* const* x = reinterpret_cast<const uint16_t* const*>(xv);
  const uint16_t* const* w = reinterpret_cast<const uint16_t* const*>(wv);
  __m512 acc[MR][NR];
  acc_start<MR, NR>(acc, k0, accm);
  const int64_t kv = K / 32 * 32, ke = k1 < kv ? k1 : kv;
  unsigned csr = 0;
  if constexpr (kByFma) {
    csr = _mm_getcsr();
    _mm_setcsr(csr | kMxcsrDazFtz);
    pin_accumulators<MR, NR>(acc);
  }
  for (int64_t k = k0; k < ke; k += 32) {
    if constexpr (kByFma) {
      const __m512i high = _mm512_set1_epi32(int(0xffff0000u));
      __m512 wo[NR], we[NR];
      #pragma GCC unroll 4
      for (int j = 0; j < NR; j++) {
        const __m512i v = _mm512_loadu_si512(w[j] + k);
        wo[j] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
        we[j] = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
      }
      #pragma GCC unroll 4
      for (int i = 0; i < MR; i++) {
        const __m512i v = _mm512_loadu_si512(x[i] + k);
        const __m512 xo = _mm512_castsi512_ps(_mm512_and_si512(v, high));
        const __m512 xe = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
        #pragma GCC unroll 4
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xe, we[j], _mm512_fmadd_ps(xo, wo[j], acc[i][j]));
      }
    } else {
      __m512bh wr[NR];
      #pragma GCC unroll 4
      for (int j = 0; j < NR; j++) wr[j] = (__m512bh)_mm512_loadu_si512(w[j] + k);
      #pragma GCC unroll 4
      for (int i = 0; i < MR; i++) {
        const __m512bh xr = (__m512bh)_mm512_loadu_si512(x[i] + k);
        #pragma GCC unroll 4
        for (int j = 0; j < NR; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], xr, wr[j]);
      }
    }
  }
  if constexpr (kByFma) {
    pin_accumulators<MR, NR>(acc);
    _mm_setcsr(csr);
  }
  if (k1 < K) return acc_save<MR, NR>(acc, accm);
  finish_tile<MR, NR>(
      acc, kv, K, [&](int i, int j, int64_t k) { return bf16_to_f32(x[i][k]) * bf16_to_f32(w[j][k]); }, out);
}

// ---- F8_E4M3 weights, fp32 compute: dequantized in registers, then micro_f32's arithmetic ----

// 16 codes -> q * 2^-120 as fp32 (matmul_micro.h): sign-extend the bytes to 32 bits, shift left
// 20, keep the sign and the 7 magnitude bits (the sign extension filled bits 27..31).
EPMOE_AVX512 inline __m512 fp8_bits16(const uint8_t* q) {
  const __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  return _mm512_castsi512_ps(_mm512_and_si512(_mm512_slli_epi32(v, 20), _mm512_set1_epi32(int(kFp8Bits))));
}

// 16 codes -> q * 2^-112 as fp32, normal for every nonzero code (matmul_micro.h's second form).
EPMOE_AVX512 inline __m512 fp8_bits16_normal(const uint8_t* q) {
  const __m512i v = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q)));
  const __m512i t = _mm512_slli_epi32(v, 20);
  const __m512i mag = _mm512_and_si512(t, _mm512_set1_epi32(int(kFp8Mag)));
  const __mmask16 e0 = _mm512_testn_epi32_mask(mag, _mm512_set1_epi32(int(kFp8Exp)));  // zero or subnormal
  __m512i r = _mm512_add_epi32(mag, _mm512_set1_epi32(int(kFp8Bias112)));
  r = _mm512_mask_add_epi32(r, e0, r, _mm512_set1_epi32(1 << 23));
  const __m512 f = _mm512_mask_sub_ps(_mm512_castsi512_ps(r), e0, _mm512_castsi512_ps(r), _mm512_set1_ps(kFp8Sub112));
  return _mm512_castsi512_ps(
      _mm512_or_si512(_mm512_castps_si512(f), _mm512_and_si512(t, _mm512_set1_epi32(int(0x80000000u)))));
}

// Every element gets exactly micro_f32<F32>'s operations on the dequantized weight w = q * s (one
// rounding, the same bits as the F32 tensor of dequantized weights): the lanes' FMAs in ascending
// k, the same reduction, the same scalar tail. The scale is re-read once per 128 columns.
// kNormal: the codes in the second form (no subnormal operand: CpuFeatures::subnormal_assists).
template <int MR, int NR, bool kNormal>
EPMOE_AVX512 void micro_fp8(const void* const* xv, const void* const* wv, int64_t K, int64_t k0, int64_t k1, float* accm,
                            float* out) {
  const float* const* x = reinterpret_cast<const float* const*>(xv);
  const CodeRow* r[NR];
  #pragma GCC unroll 4
  for (int j = 0; j < NR; j++) r[j] = static_cast<const CodeRow*>(wv[j]);
  __m512 acc[MR][NR];
  acc_start<MR, NR>(acc, k0, accm);
  const int64_t kv = K / 16 * 16, ke = k1 < kv ? k1 : kv;
  auto step = [&](int64_t k, const __m512(&sc)[NR]) EPMOE_AVX512_LAMBDA {
    __m512 wr[NR];
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++)
      wr[j] = _mm512_mul_ps(kNormal ? fp8_bits16_normal(r[j]->q + k) : fp8_bits16(r[j]->q + k), sc[j]);
    #pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
      const __m512 xr = _mm512_loadu_ps(x[i] + k);
      #pragma GCC unroll 4
      for (int j = 0; j < NR; j++) acc[i][j] = _mm512_fmadd_ps(xr, wr[j], acc[i][j]);
    }
  };
  for (int64_t k = k0; k < ke;) {
    const int64_t blk = k / kFp8Block, be = std::min(ke, (blk + 1) * kFp8Block);
    __m512 sc[NR];
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) sc[j] = _mm512_set1_ps(code_block_scale(*r[j], blk) * fp8_fold(kNormal));
    if (be - k == kFp8Block) {  // a whole block: straight-line code, no inner loop exit to predict
      #pragma GCC unroll 8
      for (int s = 0; s < 8; s++) step(k + 16 * s, sc);
      k = be;
    } else {
      for (; k < be; k += 16) step(k, sc);
    }
  }
  if (k1 < K) return acc_save<MR, NR>(acc, accm);
  finish_tile<MR, NR>(
      acc, kv, K,
      [&](int i, int j, int64_t k) {
        return x[i][k] * (fp8_times_2m120(r[j]->q[k]) * (code_block_scale(*r[j], k / kFp8Block) * 0x1p120f));
      },
      out);
}

// ---- F8_E4M3 weights, bf16 compute (matmul_micro.h) ----

// 32 codes -> bf16 of q * 2^8, exact. Sign-extended to 16 bits and shifted left 4, the code's
// exponent e lands on bf16's exponent field (bits 7..10), its mantissa under bf16's (bits 4..6),
// its sign on bit 15 (the extension filled bits 11..15: masked); bit 14 set makes the exponent
// 128 + e, i.e. the value (1 + m/8) 2^(e+1) = q 2^8 (127 - 7 + 8 = 128: an OR, no carry). The
// subnormals (e = 0: m 2^-9, times 2^8 = m/2) come from an 8-entry table, their sign ORed back.
EPMOE_AVX512BF16 inline __m512i fp8_to_bf16x32(const uint8_t* q) {
  const __m512i w = _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
  const __m512i t = _mm512_ternarylogic_epi32(_mm512_slli_epi16(w, 4), _mm512_set1_epi16(int16_t(0x87F0)),
                                              _mm512_set1_epi16(0x4000), 0xEA);  // (a & b) | c
  const __mmask32 sub = _mm512_testn_epi16_mask(w, _mm512_set1_epi16(0x78));      // exponent 0
  // m / 2 for m = 0..7, as bf16
  alignas(64) static constexpr uint16_t kHalves[32] = {0, 0x3F00, 0x3F80, 0x3FC0, 0x4000, 0x4020, 0x4040, 0x4060};
  const __m512i halves = _mm512_load_si512(kHalves);
  const __m512i r = _mm512_mask_permutexvar_epi16(t, sub, w, halves);
  return _mm512_ternarylogic_epi32(r, w, _mm512_set1_epi16(int16_t(0x8000)), 0xF8);  // a | (b & c)
}

// NR columns of a tile nr_all wide (the caller offsets r, acc and out to the first; acc and out
// keep the whole tile's layout): 2 x MR x NR accumulators (block lanes and row lanes), so a 4 x 4
// tile runs as two 4 x 2 halves -- the same per-element arithmetic, only the registers differ.
template <int MR, int NR, bool kWide>
EPMOE_AVX512BF16 void fp8_bf16_part(const uint16_t* const* x, const CodeRow* const* r, int64_t K, int64_t k0, int64_t k1,
                                    float* accm, float* out, int nr_all) {
  __m512 tot[MR][NR];
  #pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++)
      tot[i][j] = k0 == 0 ? _mm512_setzero_ps() : _mm512_loadu_ps(accm + (i * nr_all + j) * 16);
  const int64_t kv = K / 32 * 32, ke = k1 < kv ? k1 : kv;
  auto step = [&](int64_t k, __m512 (&bacc)[MR][NR]) EPMOE_AVX512BF16_LAMBDA {
    __m512bh wv[NR];
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++)
      wv[j] = (__m512bh)(kWide ? _mm512_loadu_si512(r[j]->wide + k) : fp8_to_bf16x32(r[j]->q + k));
    #pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
      const __m512bh xv = (__m512bh)_mm512_loadu_si512(x[i] + k);
      #pragma GCC unroll 4
      for (int j = 0; j < NR; j++) bacc[i][j] = _mm512_dpbf16_ps(bacc[i][j], xv, wv[j]);
    }
  };
  for (int64_t k = k0; k < ke;) {
    const int64_t blk = k / kFp8Block, be = std::min(ke, (blk + 1) * kFp8Block);
    __m512 bacc[MR][NR];
    #pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
      #pragma GCC unroll 4
      for (int j = 0; j < NR; j++) bacc[i][j] = _mm512_setzero_ps();
    if (be - k == kFp8Block) {  // a whole block: straight-line code
      #pragma GCC unroll 4
      for (int s = 0; s < 4; s++) step(k + 32 * s, bacc);
    } else {
      for (int64_t kk = k; kk < be; kk += 32) step(kk, bacc);
    }
    k = be;
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
      const __m512 sc = _mm512_set1_ps(code_block_scale(*r[j], blk) * 0x1p-8f);
      #pragma GCC unroll 4
      for (int i = 0; i < MR; i++) tot[i][j] = _mm512_fmadd_ps(bacc[i][j], sc, tot[i][j]);
    }
  }
  if (k1 < K) {
    #pragma GCC unroll 4
    for (int i = 0; i < MR; i++)
      #pragma GCC unroll 4
      for (int j = 0; j < NR; j++) _mm512_storeu_ps(accm + (i * nr_all + j) * 16, tot[i][j]);
    return;
  }
  #pragma GCC unroll 4
  for (int i = 0; i < MR; i++)
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
      float s = reduce16(tot[i][j]);
      for (int64_t k = kv; k < K; k++)
        s += bf16_to_f32(x[i][k]) *
             (fp8_times_2m120(r[j]->q[k]) * (code_block_scale(*r[j], k / kFp8Block) * 0x1p120f));
      out[i * nr_all + j] = s;
    }
}

template <bool kWide>
struct Fp8Bf16 {
  template <int MR, int NR>
  struct K {
    static void fn(int, int, const void* const* xv, const void* const* wv, int64_t Kd, int64_t k0, int64_t k1, float* acc,
                   float* out) {
      const uint16_t* const* x = reinterpret_cast<const uint16_t* const*>(xv);
      const CodeRow* const* r = reinterpret_cast<const CodeRow* const*>(wv);
      if constexpr (NR <= 2) {
        fp8_bf16_part<MR, NR, kWide>(x, r, Kd, k0, k1, acc, out, NR);
      } else {
        fp8_bf16_part<MR, 2, kWide>(x, r, Kd, k0, k1, acc, out, NR);
        fp8_bf16_part<MR, NR - 2, kWide>(x, r + 2, Kd, k0, k1, acc ? acc + 32 : nullptr, out + 2, NR);
      }
    }
  };
};
template <int MR, int NR>
using Fp8Bf16Codes = Fp8Bf16<false>::K<MR, NR>;
template <int MR, int NR>
using Fp8Bf16Rows = Fp8Bf16<true>::K<MR, NR>;

// Runtime (mr, nr) -> the instantiation. Each instantiation does the same per-element work.
template <template <int, int> class K>
struct Table {
  static void call(int mr, int nr, const void* const* x, const void* const* w, int64_t Kd, int64_t k0, int64_t k1,
                   float* acc, float* out) {
    static constexpr MicroFn fns[kMaxMR][kMaxNR] = {
        {K<1, 1>::fn, K<1, 2>::fn, K<1, 3>::fn, K<1, 4>::fn},
        {K<2, 1>::fn, K<2, 2>::fn, K<2, 3>::fn, K<2, 4>::fn},
        {K<3, 1>::fn, K<3, 2>::fn, K<3, 3>::fn, K<3, 4>::fn},
        {K<4, 1>::fn, K<4, 2>::fn, K<4, 3>::fn, K<4, 4>::fn},
    };
    fns[mr - 1][nr - 1](mr, nr, x, w, Kd, k0, k1, acc, out);
  }
};

template <DType D>
struct F32K {
  template <int MR, int NR>
  struct K {
    static void fn(int, int, const void* const* x, const void* const* w, int64_t Kd, int64_t k0, int64_t k1, float* acc,
                   float* out) {
      micro_f32<D, MR, NR>(x, w, Kd, k0, k1, acc, out);
    }
  };
};

// ---- I8 rows (tensor/quantize.h), fp32 arithmetic in either compute mode ----

// matmul_micro.h's block form on 16 lanes: per whole 32-column block, lane l's products at
// k0 + l and k0 + 16 + l (a multiply, an FMA), then times the block's scale into the lane's total
// (an FMA) -- matmul_avx2.cc's i8_part on one register instead of two: the same bits.
template <int MR, int NR>
EPMOE_AVX512 void micro_i8(const void* const* xv, const void* const* wv, int64_t K, int64_t k0, int64_t k1, float* accm,
                           float* out) {
  const float* const* x = reinterpret_cast<const float* const*>(xv);
  const CodeRow* r[NR];
  #pragma GCC unroll 4
  for (int j = 0; j < NR; j++) r[j] = static_cast<const CodeRow*>(wv[j]);
  __m512 acc[MR][NR];
  acc_start<MR, NR>(acc, k0, accm);
  static_assert(kI8Block == 32);
  const int64_t kb = K / kI8Block * kI8Block, ke = k1 < kb ? k1 : kb;
  auto codes16 = [&](int j, int64_t k) EPMOE_AVX512_LAMBDA {
    return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(r[j]->q + k))));
  };
  for (int64_t k = k0; k < ke; k += kI8Block) {
    __m512 wa[NR], wc[NR], sc[NR];
    #pragma GCC unroll 4
    for (int j = 0; j < NR; j++) {
      wa[j] = codes16(j, k);
      wc[j] = codes16(j, k + 16);
      sc[j] = _mm512_set1_ps(code_block_scale(*r[j], k / kI8Block));
    }
    #pragma GCC unroll 4
    for (int i = 0; i < MR; i++) {
      const __m512 xa = _mm512_loadu_ps(x[i] + k), xc = _mm512_loadu_ps(x[i] + k + 16);
      #pragma GCC unroll 4
      for (int j = 0; j < NR; j++)
        acc[i][j] = _mm512_fmadd_ps(_mm512_fmadd_ps(xc, wc[j], _mm512_mul_ps(xa, wa[j])), sc[j], acc[i][j]);
    }
  }
  if (k1 < K) return acc_save<MR, NR>(acc, accm);
  finish_tile<MR, NR>(
      acc, kb, K,
      [&](int i, int j, int64_t k) {
        return x[i][k] * (float(int8_t(r[j]->q[k])) * code_block_scale(*r[j], k / kI8Block));
      },
      out);
}

template <int MR, int NR>
struct I8K {
  static void fn(int, int, const void* const* x, const void* const* w, int64_t Kd, int64_t k0, int64_t k1, float* acc,
                 float* out) {
    micro_i8<MR, NR>(x, w, Kd, k0, k1, acc, out);
  }
};

template <bool kByFma>
struct Bf16Form {
  template <int MR, int NR>
  struct K {
    static void fn(int, int, const void* const* x, const void* const* w, int64_t Kd, int64_t k0, int64_t k1, float* acc,
                   float* out) {
      micro_bf16<MR, NR, kByFma>(x, w, Kd, k0, k1, acc, out);
    }
  };
};
template <int MR, int NR>
using Bf16K = Bf16Form<false>::K<MR, NR>;
template <int MR, int NR>
using Bf16FmaK = Bf16Form<true>::K<MR, NR>;

template <bool kNormal>
struct Fp8Form {
  template <int MR, int NR>
  struct K {
    static void fn(int, int, const void* const* x, const void* const* w, int64_t Kd, int64_t k0, int64_t k1, float* acc,
                   float* out) {
      micro_fp8<MR, NR, kNormal>(x, w, Kd, k0, k1, acc, out);
    }
  };
};
template <int MR, int NR>
using Fp8K = Fp8Form<false>::K<MR, NR>;
template <int MR, int NR>
using Fp8KNormal = Fp8Form<true>::K<MR, NR>;

template <int MR, int NR>
using F32KF32 = F32K<DType::F32>::K<MR, NR>;
template <int MR, int NR>
using F32KBF16 = F32K<DType::BF16>::K<MR, NR>;

}  // namespace

Micro avx512_micro(DType w) {
  switch (w) {
    // Few-token rows per tile: CpuFeatures::few_token_rows (one sequential stream on Zen 4, four on Intel).
    case DType::F32: return {&Table<F32KF32>::call, false, true, "avx512", cpu_features().few_token_rows};
    case DType::BF16: return {&Table<F32KBF16>::call, false, true, "avx512", cpu_features().few_token_rows};
    // Four rows per few-token tile: four independent FMA chains per token (one row's chain, an
    // FMA every 4 cycles, is slower than DRAM at one byte per weight). Measured on Zen 4, 8 cold
    // fp8 experts at one token: 1 row 4.7 ms, 2 rows 3.1, 4 rows 3.1; at 8 tokens 17.4 / 13.3 / 8.8.
    case DType::F8_E4M3:
      return {cpu_features().subnormal_assists ? &Table<Fp8KNormal>::call : &Table<Fp8K>::call, false, true, "avx512", 4};
    // Int8 rows: four rows per few-token tile, as fp8.
    case DType::I8: return {&Table<I8K>::call, false, true, "avx512", 4};
    default: return {};
  }
}

EPMOE_AVX512 void fp8_dequant_avx512(const CodeRow& r, int64_t K, float* dst) {
  const __m512i nan = _mm512_set1_epi32(0x7fc00000);
  for (int64_t b = 0; b * kFp8Block < K; b++) {
    // The second form of the codes (never a subnormal operand: no assist on Intel), and s * 2^112,
    // finite whenever s * 2^120 is.
    const float s = code_block_scale(r, b), s120 = s * 0x1p120f;
    const int64_t k0 = b * kFp8Block, k1 = std::min(K, k0 + kFp8Block);
    int64_t k = k0;
    if (!std::isinf(s120) || std::isinf(s)) {  // the scale folds: one multiply, one rounding
      const __m512 sc = _mm512_set1_ps(s * fp8_fold(true));
      for (; k + 16 <= k1; k += 16) {
        const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r.q + k));
        // NaN codes: (b | 0x80) == 0xff; they keep the NaN, the others get the product.
        const __mmask16 num = _mm_cmpneq_epi8_mask(_mm_or_si128(raw, _mm_set1_epi8(char(0x80))), _mm_set1_epi8(char(0xff)));
        _mm512_storeu_ps(dst + k, _mm512_mask_mul_ps(_mm512_castsi512_ps(nan), num, fp8_bits16_normal(r.q + k), sc));
      }
    }
    for (; k < k1; k++) dst[k] = fp8e4m3_to_f32(r.q[k]) * s;
  }
}

Micro avx512_bf16_micro(DType w) {
  // Two rows per few-token tile (same experiment: 1 row 2.0 ms, 2 rows 1.5, 4 rows 1.7 at one
  // token; at 8 tokens 8.5 / 6.1 / 6.0).
  if (w == DType::F8_E4M3) return {&Table<Fp8Bf16Codes>::call, true, true, "avx512-bf16", 2};
  if (w != DType::BF16) return {};
  // The instruction's arithmetic from FMAs where the instruction is the slower (CpuFeatures::bf16_dot_by_fma).
  if (cpu_features().bf16_dot_by_fma)
    return {&Table<Bf16FmaK>::call, true, true, "avx512-bf16 (fma)", cpu_features().few_token_rows};
  return {&Table<Bf16K>::call, true, true, "avx512-bf16", cpu_features().few_token_rows};
}

Micro avx512_bf16_fp8_rows_micro() { return {&Table<Fp8Bf16Rows>::call, true, true, "avx512-bf16"}; }

EPMOE_AVX512BF16 void fp8_to_bf16_avx512(const uint8_t* q, int64_t K, uint16_t* dst) {
  for (int64_t k = 0; k + 32 <= K; k += 32) _mm512_storeu_si512(dst + k, fp8_to_bf16x32(q + k));
}

}  // namespace epmoe
