// Token choice on the GPU: the greedy argmax of model.cc (language_model.h argmax), on the device,
// so that a decode step downloads one id per sequence instead of its logits.
#pragma once

#include "kernels/cuda/common.cuh"

namespace epmoe::cuda {

// Greedy decoding on the device: out[r] = index of the largest of logits[r, 0..V) (ties to the
// lower index, as argmax of model/language_model.h).
void argmax_rows(const float* logits, int64_t R, int V, int32_t* out, cudaStream_t s);

// One draw of engine/sampling.h without masks, on the device: logits row `row`, temperature T
// (0: greedy), the seed and the absolute position of the drawn token.
struct DrawSpec {
  int32_t row;
  float temperature;
  uint64_t seed;
  int64_t position;
  int32_t top_n;  // top_rows: this draw's alternatives (0: none)
};

// For each of n specs: tokens[d] = sample_token(row, T, seed, position) and logprobs[d] =
// RowLogprobs(row, T).at(token), the same bits as the host functions (kernels/sampling_math.h).
// With norm: norm[2d], norm[2d + 1] = the row's max(l / T) and log-sum-exp, RowLogprobs' max_ and
// lse_ (what top_rows turns its ids' logits into log-probs with).
void draw_rows(const float* logits, int V, const DrawSpec* specs, int n, int32_t* tokens, float* logprobs,
               cudaStream_t s, float* norm = nullptr);

// The most alternatives top_rows reports per draw.
constexpr int kMaxTopRows = 20;

// For each of n specs, after draw_rows wrote `norm` for the same specs on the same stream:
// ids[d * stride + r], logprobs[d * stride + r] for r < specs[d].top_n = RowLogprobs(row,
// T).top(top_n), the same ids in the same order (logit descending, id ascending) and the same
// bits; r >= V (a vocabulary smaller than top_n): id -1. The rest of the draw's stride is left as
// it was. Every top_n <= stride <= kMaxTopRows.
void top_rows(const float* logits, int V, const DrawSpec* specs, int n, const float* norm, int stride, int32_t* ids,
              float* logprobs, cudaStream_t s);

}  // namespace epmoe::cuda
