// A non-owning view of a tensor: dtype, shape, pointer. Weights are views into the mmapped
// safetensors files (used in place, never copied); activations are plain std::vector<float>.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace epmoe {

// The scale grid of a block-quantized weight: weight [n, k] = q[n, k] * s[(row0 + n) / row_block,
// k / block], the last blocks of a row or column partial when the dims are not multiples of
// them. row0 lets a row slice keep the grid of the whole. Two grids exist: FP8 checkpoints'
// `X.weight_scale_inv` (F8_E4M3 codes, 128 x 128 blocks: row_block 0 means "as block"), and the
// int8 rows epmoe quantizes itself (I8 codes, tensor/quantize.h: 1 x 32 blocks).
struct BlockScale {
  const void* data = nullptr;  // [rows, cols] F32 or BF16
  DType dtype = DType::F32;
  int64_t rows = 0, cols = 0;
  int64_t row0 = 0;
  int64_t block = 128;    // columns per scale
  int64_t row_block = 0;  // rows per scale; 0: block (square blocks)
  bool empty() const { return data == nullptr; }
  int64_t rows_per_scale() const { return row_block > 0 ? row_block : block; }
  // The scale of row n (of the view) and column k, as fp32 (a bf16 scale widens exactly).
  float at(int64_t n, int64_t k) const {
    const int64_t i = ((row0 + n) / rows_per_scale()) * cols + k / block;
    return dtype == DType::BF16 ? bf16_to_f32(static_cast<const uint16_t*>(data)[i]) : static_cast<const float*>(data)[i];
  }
  // Row n's scales, one per block of columns (cols of them).
  const void* row(int64_t n) const {
    return static_cast<const char*>(data) + size_t(((row0 + n) / rows_per_scale()) * cols) * dtype_size(dtype);
  }
};

struct TensorView {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  std::string name;  // for error messages
  BlockScale scale;  // set for F8_E4M3 weights and quantized I8 rows (2-D), empty otherwise

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int rank() const { return int(shape.size()); }
  bool empty() const { return data == nullptr; }

  // Element i (flat) as fp32, for reference paths and small tensors (norms, biases); a
  // block-quantized element times its block's scale (the dequantized weight, one fp32 multiply).
  float at(int64_t i) const;
  // Rows [row, row + n) of a 2-D (or leading-dim sliced) tensor, as a view.
  TensorView slice_rows(int64_t row, int64_t n) const;
  // A sub-tensor of a 3-D tensor along dim 0 (expert e of a fused expert tensor).
  TensorView index0(int64_t i) const;
  std::string shape_str() const;
};

// Copies a float-weight view into fp32 (used for small tensors and for tests).
std::vector<float> to_f32(const TensorView& v);

}  // namespace epmoe
