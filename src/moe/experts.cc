#include "moe/experts.h"

#include <vector>

#include "kernels/matmul.h"
#include "kernels/ops.h"

namespace epmoe {

void swiglu_forward(const SwigluWeights& w, const float* in, int64_t n, float* out) {
  if (n == 0) return;
  const int64_t I = w.inter();
  std::vector<float> g(static_cast<size_t>(n * I)), u(static_cast<size_t>(n * I));
  matmul(in, n, w.gate, g.data());
  matmul(in, n, w.up, u.data());
  silu_mul(g.data(), u.data(), n * I, g.data());
  matmul(g.data(), n, w.down, out);
}

}  // namespace epmoe
