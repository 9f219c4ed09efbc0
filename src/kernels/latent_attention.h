// Latent attention (DeepSeek-V2/V3's MLA, GLM-4.7-Flash) on the CPU, in its absorbed form: the
// queries already multiplied by W_UK, so every head reads the cache's shared [latent | k_rope]
// rows directly. A kernel like kernels/attention.h, kept here so that model/ holds the decoder and
// kernels/ the arithmetic (the model's mla_attention does the projections around it).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace epmoe {

// The core of latent attention for one token, every head (Model::mla_attention and
// bench/mla_bench): scores = q_abs[h] . row_j * scale over the len cached rows [latent | k_rope]
// (W floats each, B rows per block, block_rows(b) the first row of block b), softmax, and
// ctx[h] = sum_j p[h][j] latent_j (the first C floats of each row). p is scratch.
void latent_attention(const float* q_abs, int heads, int64_t W, int64_t C, int64_t len, int64_t B,
                      const std::function<const float*(int64_t)>& block_rows, float scale, float* ctx,
                      std::vector<float>& p);

}  // namespace epmoe
