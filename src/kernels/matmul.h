// y[T, N] = x[T, K] . W[N, K]^T (+ bias[N]) with fp32 activations and W in its stored dtype, and
// the fused SwiGLU front of an expert, h = silu(x . Wg^T) * (x . Wu^T), in one pass over x.
//
// Batch invariance (ARCHITECTURE.md): every output element is one dot product computed with one
// fixed reduction order over k -- vector lanes accumulate k = L*c + l in ascending c, then the
// lanes are summed in a fixed tree, then the scalar tail -- whatever T is, whichever tile or
// thread computes it, and whether it is the small-T path (one weight row per tile, for a single
// sequential weight stream) or the blocked one (4 x 4 tiles, K cut in blocks whose lane
// accumulators wait in memory): the same micro-kernel per element, with any tile shape and any
// K blocking. So a row's bits never depend on the rows that share the call.
//
// Paths, chosen once per process from the CPU (cpu_features.h):
//   avx512       16 fp32 lanes, FMA; weights F32, BF16 or F8_E4M3 converted on the fly
//   avx512-bf16  --compute bf16: activations rounded to bf16, vdpbf16ps (32 bf16 pairs per
//                instruction) on BF16 and F8_E4M3 weights; F32 weights keep the avx512 path
//                (on Intel, BF16 weights take the instruction's arithmetic as two FMAs per pair
//                under DAZ + FTZ: the same bits, faster there -- CpuFeatures::bf16_dot_by_fma)
//   avx2         AVX2 + FMA without AVX-512: the avx512 path's 16 lanes as two 8-lane registers,
//                the same FMAs and reduction tree -- the avx512 path's bits (matmul_avx2.cc);
//                bf16 compute runs this fp32 arithmetic (no vdpbf16ps to twin)
//   generic      GCC vector extensions, any x86-64 (baseline), and every F16 weight; no FMA, so
//                its bits are its own
//
// F8_E4M3 weights (FP8 checkpoints: e4m3 codes and a 128 x 128 block scale grid, TensorView::
// scale; one without a scale is refused): the codes are read in place, one byte per weight.
//   fp32 compute (the default): EXACT -- bit for bit matmul on an F32 tensor holding the
//     dequantized weights fp8e4m3_to_f32(q) * s (TensorView::at, what transformers' dequantized
//     goldens hold). Each weight is dequantized with one rounding of q * s and then goes through
//     the F32 kernel's own arithmetic: in registers at <= 8 tokens (four weight rows per tile),
//     beyond that a tile's rows dequantized once per token block into a per-thread buffer.
//   bf16 compute: a true bf16 path -- codes widened exactly to bf16, vdpbf16ps over each 128-wide
//     block into block accumulators, each block's sum times its scale in fp32 (matmul_micro.h),
//     two weight rows per tile at <= 8 tokens, rows widened once per token block beyond.
//     Batch-invariant like the rest. Against the exact path the only inexact step is the
//     activations' rounding to bf16: |y - y_exact| <= 2^-8 sum_k |x_k w_k| (2^-9 per product
//     plus both paths' fp32 rounding; tests/kernels/fp8_matmul_test.cc holds it to that). Decode
//     runs near DRAM bandwidth; compute-bound prefill pays one FMA per four vdpbf16ps for the
//     scales (bench/moe_bench: ~0.75x the tokens/s of bf16 weights at 512+ tokens).
//   On the generic path, with blocks other than 128, or with scales outside [2^-100, 2^8) (none
//   in real checkpoints), rows are dequantized into a per-thread buffer and the fp32 kernel runs:
//   exact in either mode. The fast kernels read the NaN codes 0x7f / 0xff as 480 (checkpoints
//   never hold them); the row dequantizers give NaN, as TensorView::at.
// I8 rows (tensor/quantize.h: int8 codes, one scale per 32 columns of a row; `--lm-head int8`):
//   the block form of matmul_micro.h in either compute mode -- each 32-column block's products
//   summed, then times the block's scale (no multiply per weight, as Q8_0 kernels do). Not the
//   dequantized tensor's bits, but one arithmetic at every T on every path (avx512, avx2 and the
//   generic std::fma kernel give the same bits), so as batch-invariant as the rest.
#pragma once

#include <cstdint>
#include <string>

#include "tensor/view.h"

namespace epmoe {

// The activation precision of a product (--compute): every call says which it wants. A model owns
// its mode (model/model.h) and passes it to each of its products; there is no process-wide mode.
// F32 weights (and I8 rows) take the fp32 arithmetic in either mode, so a caller whose weights are
// always fp32 (a cache block, a transposed fp32 matrix) may pass F32 and mean it.
enum class ComputeMode { F32, BF16 };
enum class KernelPath { Auto, Generic, Avx2, Avx512 };

void set_kernel_path(KernelPath p);                // Auto: the best the CPU has; tests force the others
std::string kernel_description(ComputeMode mode);  // what runs, e.g. "avx512-bf16 for bf16 weights, ..."

void matmul(const float* x, int64_t T, const TensorView& W, float* y, ComputeMode mode, const float* bias = nullptr);
// h[T, I] = silu(x . Wg^T) * (x . Wu^T); Wg, Wu: [I, K]. Bit-identical to the two matmuls
// followed by silu_mul.
void matmul_swiglu(const float* x, int64_t T, const TensorView& Wg, const TensorView& Wu, float* h, ComputeMode mode);

// Plain scalar reference (double accumulation), for tests of the fast paths.
void matmul_ref(const float* x, int64_t T, const TensorView& W, float* y, const float* bias = nullptr);

}  // namespace epmoe
