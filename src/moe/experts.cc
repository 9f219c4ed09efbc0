#include "moe/experts.h"

#include <vector>

#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace epmoe {

void swiglu_forward(const SwigluWeights& w, const float* in, int64_t n, float* out, ComputeMode mode) {
  if (n == 0) return;
  const int64_t I = w.inter();
  thread_local std::vector<float> h;  // grow-only scratch: experts run many times per layer
  h.resize(size_t(n * I));
  matmul_swiglu(in, n, w.gate, w.up, h.data(), mode);  // gate and up in one pass, SiLU fused
  matmul(h.data(), n, w.down, out, mode);
}

}  // namespace epmoe
