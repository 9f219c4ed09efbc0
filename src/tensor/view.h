// A non-owning view of a tensor: dtype, shape, pointer. Weights are views into the mmapped
// safetensors files (used in place, never copied); activations are plain std::vector<float>.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tensor/dtype.h"

namespace epmoe {

struct TensorView {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  std::string name;  // for error messages

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
  size_t nbytes() const { return size_t(numel()) * dtype_size(dtype); }
  int rank() const { return int(shape.size()); }
  bool empty() const { return data == nullptr; }

  // Element i (flat) as fp32, for reference paths and small tensors (norms, biases).
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
