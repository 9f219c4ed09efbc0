// One SwiGLU expert: out = down( silu(gate(x)) * up(x) ). Weights are views into the checkpoint
// in their stored dtype. Batch-invariant because matmul is: a row's bits never depend on n.
#pragma once

#include <cstdint>

#include "kernels/matmul.h"
#include "tensor/view.h"

namespace epmoe {

struct SwigluWeights {
  TensorView gate;  // [I, H]
  TensorView up;    // [I, H]
  TensorView down;  // [H, I]
  bool empty() const { return gate.empty(); }
  int64_t hidden() const { return gate.shape[1]; }
  int64_t inter() const { return gate.shape[0]; }
};

// in: [n, H] -> out: [n, H], the products in compute mode `mode` (the model's).
void swiglu_forward(const SwigluWeights& w, const float* in, int64_t n, float* out, ComputeMode mode);

}  // namespace epmoe
