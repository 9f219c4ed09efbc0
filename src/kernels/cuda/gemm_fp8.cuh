// FP8 (e4m3) grouped GEMM on Hopper tensor cores with 128-wide block scales, and the per-token-group
// activation quantization that feeds it: the arithmetic of sglang's / vLLM's w8a8 block-fp8 MoE
// (DeepSeek-V3's recipe), batch-invariant like every GEMM of the runtime.
//
//   activations: each row quantized per group of 128 channels, s = max(amax, 1e-10) / 448,
//                q = e4m3(x / s) (round to nearest even, saturated to +-448): sglang's
//                per_token_group_quant_fp8
//   weights:     e4m3 codes with one fp32 scale per (output row, 128-wide k block) -- a checkpoint's
//                [ceil(N/128), ceil(K/128)] weight_scale_inv grid expanded per row, so that gate and
//                up rows can be interleaved for the SwiGLU epilogue
//   product:     C[m, n] = sum over k blocks b = 0, 1, ... in ascending order of
//                  P_b * (sa[m, b] * sw[n, b])            (fp32: one multiply, one fma per block)
//                P_b = the 128 products qa * qw of block b on the tensor cores
//                      (mma.sync m16n8k32 e4m3 x e4m3, fp32 accumulation from zero for each block)
//
// Every output element is that chain, whose order depends on K alone: never on M, the tile shape,
// the group sizes or the other rows (no split-K). The contract of GemmArgs otherwise (gather,
// scatter, groups, tile lists, SwiGLU on interleaved gate/up rows), with these differences:
//   - A and B are e4m3 bytes (uint8_t); lda, ldb and b_group_stride count bytes (= elements);
//   - K is a multiple of 128: rows are zero-padded to whole blocks (zero codes add nothing);
//   - C is fp32; no bias.
#pragma once

#include <cstdint>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/gemm.cuh"

namespace epmoe::cuda {

constexpr int kFp8Block = 128;  // channels per activation group and per weight scale block
constexpr float kFp8Max = 448.0f;

inline int fp8_padded(int k) { return ceil_div(k, kFp8Block) * kFp8Block; }

struct Fp8GemmArgs {
  GemmArgs g;
  // The scale of A's source row r (the row a_rows names when gathered) for k block b:
  // a_scale[r * a_scale_ld + b].
  const float* a_scale = nullptr;
  int64_t a_scale_ld = 0;
  // The scale of group g's weight row n for k block b: b_scale[g * b_scale_group_stride + b * N + n]
  // (k-block-major: a CTA reads its N-tile's scales of one block in one coalesced load).
  const float* b_scale = nullptr;
  int64_t b_scale_group_stride = 0;
};

// Store or SwiGLU (interleaved gate/up rows, as gemm()).
void gemm_fp8(const Fp8GemmArgs& a, Epilogue ep, cudaStream_t stream);

// Per-token-group quantization of rows [0, rows) of x (K valid columns, rows ldx apart): codes
// q[r * ldq + k] for k < fp8_padded(K) (zero past K) and scales s[r * lds + b], b < ceil(K / 128).
// rows_dev (optional): the rows to quantize are min(rows, *rows_dev) (a count known on the device).
template <class TX>
void quantize_rows_fp8(const TX* x, int64_t ldx, int64_t rows, const int32_t* rows_dev, int K, uint8_t* q,
                       int64_t ldq, float* s, int64_t lds, cudaStream_t stream);

// fp32 -> e4m3 code, round to nearest even, saturated to +-448 (the device's __nv_cvt_float_to_fp8
// with __NV_SATFINITE); for host references and tests. NaN -> 0x7f.
uint8_t f32_to_fp8e4m3_host(float f);

}  // namespace epmoe::cuda
