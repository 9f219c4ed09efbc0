#include "kernels/latent_attention.h"

#include <algorithm>

#include "kernels/matmul.h"
#include "kernels/ops.h"
#include "kernels/vec.h"
#include "tensor/view.h"
#include "util/threads.h"

namespace epmoe {

void latent_attention(const float* q_abs, int heads, int64_t W, int64_t C, int64_t len, int64_t B,
                      const std::function<const float*(int64_t)>& block_rows, float scale, float* ctx,
                      std::vector<float>& p) {
  // Every head reads the same cache rows, so the loops run row-major: a row is read once for all
  // heads (scores: split over the key blocks; context: split over the heads, keys in order).
  // Each score is one matmul element and each context sums its keys in ascending order: the bits
  // depend neither on the split nor on the batch.
  p.resize(static_cast<size_t>(heads * len));  // p[h * len + j]
  parallel_for((len + B - 1) / B, std::max<int64_t>(1, 64 / heads), [&](int64_t b, int64_t e) {
    // Scores of a block of keys for every head: one matmul of the absorbed queries [heads, W]
    // with the block's rows [cnt, W] (its per-element order depends on neither count,
    // kernels/matmul.h).
    std::vector<float> sb(static_cast<size_t>(heads * B));
    for (int64_t blk = b; blk < e; blk++) {
      const int64_t j0 = blk * B, cnt = std::min(B, len - j0);
      TensorView keys;
      keys.dtype = DType::F32;
      keys.shape = {cnt, W};
      keys.data = block_rows(blk);
      keys.name = "latent cache block";
      matmul(q_abs, heads, keys, sb.data(), ComputeMode::F32);  // fp32 cache rows: fp32 in either mode
      for (int h = 0; h < heads; h++)
        for (int64_t r = 0; r < cnt; r++) p[size_t(h * len + j0 + r)] = sb[size_t(h * cnt + r)] * scale;
    }
  });
  parallel_for(heads, 1, [&](int64_t hb, int64_t he) {
    for (int64_t h = hb; h < he; h++) {
      softmax(&p[size_t(h * len)], len);
      std::fill(ctx + h * C, ctx + (h + 1) * C, 0.f);
    }
    for (int64_t j = 0; j < len; j++) {
      const float* r = block_rows(j / B) + (j % B) * W;
      for (int64_t h = hb; h < he; h++) axpy(p[size_t(h * len + j)], r, ctx + h * C, C);
    }
  });
}

}  // namespace epmoe
