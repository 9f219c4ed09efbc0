// Routing strategies: router logits [T, E] -> top-k logical expert ids [T, K] and fp32 weights.
// One function per strategy, chosen from RoutingConfig (data), each written from the formula of
// the reference implementation (transformers), including its quirks:
//   - top-k ties go to the lower expert index (a stable, documented order);
//   - group-limited selection masks the experts of dropped groups to -inf, so that they can never
//     be chosen even when every biased score of the kept groups is negative (the golden of
//     glm4moe-tiny, layer 2, token 6 has exactly that case: a 0.0 mask picks the wrong expert).
#pragma once

#include <cstdint>
#include <vector>

#include "io/hf_config.h"

namespace epmoe {

struct Routing {
  int64_t T = 0;
  int K = 0;
  std::vector<int32_t> ids;    // [T, K] logical expert ids, in top-k order
  std::vector<float> weights;  // [T, K]
};

// logits: [T, E]; bias: e_score_correction_bias [E] (sigmoid routing) or nullptr.
Routing route(const RoutingConfig& cfg, const float* logits, int64_t T, const float* bias);

// Indices of the k largest values of v[0..n), descending, ties to the lower index.
void topk_desc(const float* v, int n, int k, int32_t* out);

}  // namespace epmoe
