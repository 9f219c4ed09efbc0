// Internal to src/kernels: the micro-kernel interface shared by the matmul drivers.
//
// A micro-kernel computes an mr x nr tile of dot products: out[i * nr + j] = x_i . w_j over K,
// for mr <= kMaxMR activation rows and nr <= kMaxNR weight rows, given as row pointers. Its
// per-element arithmetic must not depend on mr, nr or which rows come along (batch invariance).
//
// K blocks: a call covers the vector steps of [k0, k1) only (k0, k1 multiples of kKAlign, or
// k1 = K). With k0 > 0 the lane accumulators start from acc ([mr][nr][16] floats, as the previous
// block left them), else from zero; with k1 < K they are stored back to acc and out is untouched;
// with k1 = K the lanes are reduced, the scalar tail added and out written. The lanes thus see the
// same k sequence as in one call over [0, K): the bits do not depend on the blocking.
#pragma once

#include <cstdint>

#include "kernels/matmul.h"
#include "tensor/dtype.h"
#include "tensor/quantize.h"

namespace epmoe {

inline constexpr int kMaxMR = 4;  // activation rows per tile
inline constexpr int kMaxNR = 4;  // weight rows per tile: 4 x 4 fp32 accumulators + 4 weights + 1 x fit in 32 zmm
inline constexpr int64_t kKAlign = 32;  // K block boundaries are multiples of this (the bf16 step)

using MicroFn = void (*)(int mr, int nr, const void* const* x, const void* const* w, int64_t K, int64_t k0, int64_t k1,
                         float* acc, float* out);

struct Micro {
  MicroFn fn = nullptr;
  bool x_bf16 = false;  // the kernel wants activations rounded to bf16 (row pointers to uint16_t)
  bool k_blocks = false;  // honours [k0, k1) and acc; otherwise it must be called with k0 = 0, k1 = K
  const char* name = "";
  int stream_rows = 1;  // weight rows per tile at few tokens (matmul.cc kStreamT), <= kMaxNR
};

// A weight row of one-byte codes with per-block scales: F8_E4M3 weights (128 x 128 block-scaled),
// whose micro-kernels read the codes in place -- one byte per weight from memory -- through one of
// these per weight row (w[j] points to it), and the int8 rows of tensor/quantize.h (1 x 32 blocks).
//
// Exact dequantization in two fp32 steps: the code's bits placed under fp32's, (b & 0x7f) << 20
// with the sign (b & 0x80) << 24, are q * 2^-120 exactly (the e4m3 subnormals land on fp32
// subnormals: no flush-to-zero anywhere in the process); times scale * 2^120, also exact, that is
// ONE rounding of the exact product q * s: the very bits of fp8e4m3_to_f32(b) * s (TensorView::at).
// That needs scale * 2^120 finite, i.e. |s| < 2^8 (or s itself not finite): CodeRow users check
// (fp8_scales_fold) and otherwise dequantize rows with two multiplies. The fast kernels give the
// NaN codes 0x7f / 0xff no special care (they read as 480 * s; checkpoints never hold them); the
// row dequantizers do (NaN, as TensorView::at).
inline constexpr int64_t kFp8Block = 128;
struct CodeRow {
  const uint8_t* q;     // K codes
  const void* scale;    // the row's block scales, one per kFp8Block (I8: kI8Block) columns, F32 or BF16
  bool scale_bf16;
  const uint16_t* wide = nullptr;  // bf16-compute kernel on widened rows: fp8_to_bf16 of q
};
// The code's fp32 bits times 2^-120 (the first step above) and block b's folded scale.
inline float fp8_times_2m120(uint8_t b) {
  const uint32_t bits = (uint32_t(b & 0x7f) << 20) | (uint32_t(b & 0x80) << 24);
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}
// The second form, for CPUs that stall on subnormal inputs (CpuFeatures::subnormal_assists) and
// for the row dequantizers: q * 2^-112, normal for every nonzero code -- the bits with 8 added to
// the exponent field; for the e4m3 subnormals (exponent field 0) one more, then 2^-118 taken off,
// exactly (Sterbenz): 2^-118 (1 + m/8) - 2^-118 = m 2^-121 = q 2^-112. Times scale * 2^112 that is
// again ONE rounding of q * s: the same bits as the first form. The vector kernels of every width
// build both forms from these masks, on the code sign-extended to 32 bits and shifted left 20.
inline constexpr uint32_t kFp8Bits = 0x87F00000u;  // sign, exponent field, mantissa: the first form
inline constexpr uint32_t kFp8Mag = 0x07F00000u;   // exponent field and mantissa
inline constexpr uint32_t kFp8Exp = 0x07800000u;   // the exponent field: 0 on zero and subnormal codes
inline constexpr uint32_t kFp8Bias112 = 8u << 23;  // the second form's exponent offset (+1 more for e = 0)
inline constexpr float kFp8Sub112 = 0x1p-118f;     // taken off the e = 0 codes in the second form
// What a block scale is multiplied by to fold the form's power of two back in: s * 2^120 (first
// form) or s * 2^112 (second).
inline constexpr float fp8_fold(bool second_form) { return second_form ? 0x1p112f : 0x1p120f; }
inline float code_block_scale(const CodeRow& r, int64_t b) {
  return r.scale_bf16 ? bf16_to_f32(static_cast<const uint16_t*>(r.scale)[b]) : static_cast<const float*>(r.scale)[b];
}
// dst[k] = fp8e4m3_to_f32(q[k]) * s[k / 128] for k in [0, K): the dequantized fp32 row, bit for bit
// TensorView::at (NaN codes included), whatever the scales are.
using RowDequantFn = void (*)(const CodeRow& r, int64_t K, float* dst);
void fp8_dequant_generic(const CodeRow& r, int64_t K, float* dst);
void fp8_dequant_avx512(const CodeRow& r, int64_t K, float* dst);  // only call when cpu_features().avx512
// I8 rows (tensor/quantize.h: int8 codes q, one scale s_b per 32 columns), fp32 arithmetic in
// either compute mode. Not the dequantized tensor's dot product -- each block's products are
// summed before its scale, as Q8_0 kernels do, so there is no multiply per weight: per lane l
// (of 16) and whole block b (k0 = 32 b),
//   p = x[k0 + l] * q[k0 + l];  p = fma(x[k0 + 16 + l], q[k0 + 16 + l], p);  tot[l] = fma(p, s_b, tot[l])
// in ascending b; then the lanes reduced as everywhere (reduce16's tree) and the tail beyond the
// last whole block added in ascending k as x_k * (q_k * s_b). The AVX-512 and AVX2 kernels and the
// generic one (std::fma) give the same bits.

// bf16 compute (ComputeMode::BF16) on F8_E4M3 weights: activations rounded to bf16, every code
// an exact bf16 (of q * 2^8, a normal bf16 even for the e4m3 subnormals, which vdpbf16ps would
// flush as they stand), vdpbf16ps over each 128-wide block into block lane-accumulators that
// start at zero, each block's lanes then times its scale * 2^-8 added into the row's fp32 lanes
// (one FMA per block), the lanes reduced as everywhere, and the K tail beyond the last 32-wide
// step added in fp32 (x_k * the dequantized weight). A block never straddles a K block of the
// driver (K blocks are multiples of 128). The fast kernels need every scale s of the rows with
// 2^-100 <= |s| < 2^8, or s = 0, or s not finite (fp8_scales_fold in matmul.cc); else rows are
// dequantized and the exact fp32 path runs.
//
// dst[k] = bf16 bits of q[k] * 2^8 for k in [0, K / 32 * 32): the rows that the "-rows" kernel
// reads (large T: each tile's rows converted once per token block, not once per micro-tile).
void fp8_to_bf16_avx512(const uint8_t* q, int64_t K, uint16_t* dst);  // only when cpu_features().avx512_bf16
Micro avx512_bf16_fp8_rows_micro();  // CodeRow::wide set; only when cpu_features().avx512_bf16

// The micro-kernel the current kernel path runs for weights of dtype w in compute mode `mode`
// (matmul.h: the best the CPU has, or what set_kernel_path forces). For F32 it is the fp32 kernel
// in either compute mode; attention.cc computes its scores with it.
Micro select_micro(DType w, ComputeMode mode);

// Per weight dtype; nullptr when the path does not handle that dtype. For F8_E4M3 the weight row
// pointers are CodeRow*, with all scales of the rows foldable (see above).
Micro generic_micro(DType w);
Micro avx512_micro(DType w);       // only call when cpu_features().avx512
Micro avx2_micro(DType w);         // only call when cpu_features().avx2 and .fma: avx512_micro's fp32 bits
Micro avx512_bf16_micro(DType w);  // only call when cpu_features().avx512_bf16

}  // namespace epmoe
