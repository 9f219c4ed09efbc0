// Int8 rows: a weight matrix quantized by epmoe itself (not by the checkpoint), for `--lm-head
// int8`. Each row is cut in blocks of kI8Block columns; a block keeps one bf16 scale s and one
// int8 code per weight, w ~ q * s -- the layout and error of llama.cpp's Q8_0 (32 weights, 34
// bytes: 1.06 bytes per weight, half of bf16).
//
// Why only on request: the lm_head is the one matrix a decode step reads whole (151936 x 2048 in
// Qwen3-30B-A3B: 622 MB of bf16, 73 % of an FP8 checkpoint's bytes per token), so halving it is
// most of what decode can gain; but its logits are then no longer the checkpoint's (|w - q s| <=
// s / 2 per weight), and the default is always the exact model.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/view.h"

namespace epmoe {

inline constexpr int64_t kI8Block = 32;

// Owns the codes and scales; view is an I8 TensorView over them with a 1 x kI8Block BF16 scale
// grid, which the kernels read like any weight (matmul.h: the bits of matmul on the dequantized
// F32 tensor q * s).
struct QuantizedMatrix {
  std::vector<int8_t> codes;      // [N, K]
  std::vector<uint16_t> scales;   // [N, ceil(K / kI8Block)], bf16
  TensorView view;
};

// Quantizes a 2-D F32 / BF16 / F16 weight: per block, s = the smallest bf16 >= max|w| / 127
// (0 for an all-zero block) and q = w / s rounded to nearest even, in [-127, 127]; so
// |w - q s| <= s / 2. Throws InputError naming the tensor, row and column of a NaN or Inf, or for
// another dtype. Parallel over rows; the result does not depend on the thread count.
QuantizedMatrix quantize_rows_int8(const TensorView& W);

}  // namespace epmoe
