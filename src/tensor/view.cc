#include "tensor/view.h"

#include "util/error.h"

namespace epmoe {

float TensorView::at(int64_t i) const {
  switch (dtype) {
    case DType::F32: return static_cast<const float*>(data)[i];
    case DType::BF16: return bf16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::F16: return f16_to_f32(static_cast<const uint16_t*>(data)[i]);
    case DType::F64: return float(static_cast<const double*>(data)[i]);
    case DType::I64: return float(static_cast<const int64_t*>(data)[i]);
    case DType::I32: return float(static_cast<const int32_t*>(data)[i]);
    case DType::I16: return float(static_cast<const int16_t*>(data)[i]);
    case DType::I8: {
      const float q = float(static_cast<const int8_t*>(data)[i]);
      if (scale.empty()) return q;
      const int64_t cols = shape.empty() ? 1 : shape.back();
      return q * scale.at(i / cols, i % cols);
    }
    case DType::U8: case DType::BOOL: return float(static_cast<const uint8_t*>(data)[i]);
    case DType::F8_E4M3: {
      const float q = fp8e4m3_to_f32(static_cast<const uint8_t*>(data)[i]);
      if (scale.empty()) return q;
      const int64_t cols = shape.empty() ? 1 : shape.back();
      return q * scale.at(i / cols, i % cols);
    }
  }
  return 0.f;
}

TensorView TensorView::slice_rows(int64_t row, int64_t n) const {
  EPMOE_ASSERT(rank() >= 1 && row >= 0 && row + n <= shape[0], "slice_rows out of range on " + name);
  TensorView v = *this;
  v.shape[0] = n;
  int64_t row_elems = shape[0] ? numel() / shape[0] : 0;
  v.data = static_cast<const char*>(data) + size_t(row * row_elems) * dtype_size(dtype);
  EPMOE_ASSERT(scale.empty() || rank() == 2, "slice_rows of a block-quantized tensor that is not 2-D: " + name);
  v.scale.row0 += row;
  return v;
}

TensorView TensorView::index0(int64_t i) const {
  EPMOE_ASSERT(rank() >= 2 && i >= 0 && i < shape[0], "index0 out of range on " + name);
  EPMOE_ASSERT(scale.empty(), "index0 of a block-quantized tensor (fused fp8 experts are not supported): " + name);
  TensorView v = slice_rows(i, 1);
  v.shape.erase(v.shape.begin());
  v.name = name + "[" + std::to_string(i) + "]";
  return v;
}

std::string TensorView::shape_str() const {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::vector<float> to_f32(const TensorView& v) {
  std::vector<float> out(static_cast<size_t>(v.numel()));
  for (int64_t i = 0; i < v.numel(); i++) out[size_t(i)] = v.at(i);
  return out;
}

}  // namespace epmoe
