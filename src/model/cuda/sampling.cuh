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
};

// For each of n specs: tokens[d] = sample_token(row, T, seed, position) and logprobs[d] =
// RowLogprobs(row, T).at(token), the same bits as the host functions (kernels/sampling_math.h).
void draw_rows(const float* logits, int V, const DrawSpec* specs, int n, int32_t* tokens, float* logprobs,
               cudaStream_t s);

}  // namespace epmoe::cuda
