#include "moe/routing.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kernels/ops.h"
#include "util/error.h"

namespace epmoe {

void topk_desc(const float* v, int n, int k, int32_t* out) {
  EPMOE_ASSERT(k >= 0 && k <= n, "topk_desc: k = " + std::to_string(k) + " of n = " + std::to_string(n));
  // Partial selection sort: k is small (<= 16 in practice) and n is at most a few hundred.
  thread_local std::vector<char> taken;
  taken.assign(size_t(n), 0);
  for (int j = 0; j < k; j++) {
    int best = -1;
    for (int i = 0; i < n; i++)
      if (!taken[size_t(i)] && (best < 0 || v[i] > v[best])) best = i;
    taken[size_t(best)] = 1;
    out[j] = best;
  }
}

namespace {

void softmax_topk(const RoutingConfig& c, const float* logits, int64_t T, Routing& r) {
  const int E = c.num_experts, K = c.top_k;
  std::vector<float> p(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; t++) {
    std::copy(logits + t * E, logits + (t + 1) * E, p.begin());
    softmax(p.data(), E);
    int32_t* ids = &r.ids[size_t(t * K)];
    float* w = &r.weights[size_t(t * K)];
    topk_desc(p.data(), E, K, ids);
    float sum = 0.f;
    for (int k = 0; k < K; k++) {
      w[k] = p[size_t(ids[k])];
      sum += w[k];
    }
    if (c.norm_topk_prob)
      for (int k = 0; k < K; k++) w[k] /= sum;
  }
}

// Group-limited choice shared by DeepSeek-V3 (sigmoid, group score = sum of the best two biased
// scores) and DeepSeek-V2 (softmax, group score = max): keep the topk_group best groups, mask the
// rest to -inf, take the top-k of what remains.
void group_limited_select(const RoutingConfig& c, const float* choice, bool sum_of_top2, int32_t* ids) {
  const int E = c.num_experts, G = c.n_group, per = E / G;
  // Every group kept: nothing is masked. Returning early also keeps a group of one expert (E = 1,
  // n_group = 1, which the config parser accepts) away from the top-2 below, which needs two.
  if (c.topk_group >= G) return topk_desc(choice, E, c.top_k, ids);
  thread_local std::vector<float> gscore, masked;
  thread_local std::vector<int32_t> gsel;
  gscore.resize(static_cast<size_t>(G));
  gsel.resize(static_cast<size_t>(c.topk_group));
  for (int g = 0; g < G; g++) {
    const float* s = choice + g * per;
    if (sum_of_top2) {
      int32_t top2[2];
      topk_desc(s, per, 2, top2);
      gscore[size_t(g)] = s[top2[0]] + s[top2[1]];
    } else {
      gscore[size_t(g)] = *std::max_element(s, s + per);
    }
  }
  topk_desc(gscore.data(), G, c.topk_group, gsel.data());
  masked.assign(size_t(E), -INFINITY);
  for (int32_t g : gsel)
    std::copy(choice + g * per, choice + (g + 1) * per, masked.begin() + g * per);
  topk_desc(masked.data(), E, c.top_k, ids);
}

void sigmoid_group_limited(const RoutingConfig& c, const float* logits, int64_t T, const float* bias, Routing& r) {
  const int E = c.num_experts, K = c.top_k;
  std::vector<float> score(static_cast<size_t>(E)), choice(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; t++) {
    for (int e = 0; e < E; e++) {
      score[size_t(e)] = 1.0f / (1.0f + std::exp(-logits[t * E + e]));
      choice[size_t(e)] = score[size_t(e)] + (bias ? bias[e] : 0.0f);
    }
    int32_t* ids = &r.ids[size_t(t * K)];
    float* w = &r.weights[size_t(t * K)];
    group_limited_select(c, choice.data(), /*sum_of_top2=*/true, ids);
    float sum = 0.f;
    for (int k = 0; k < K; k++) {
      w[k] = score[size_t(ids[k])];  // weights from the unbiased score
      sum += w[k];
    }
    if (c.norm_topk_prob)
      for (int k = 0; k < K; k++) w[k] /= (sum + 1e-20f);
    for (int k = 0; k < K; k++) w[k] *= c.routed_scaling_factor;
  }
}

void softmax_group_limited(const RoutingConfig& c, const float* logits, int64_t T, Routing& r) {
  const int E = c.num_experts, K = c.top_k;
  std::vector<float> p(static_cast<size_t>(E));
  for (int64_t t = 0; t < T; t++) {
    std::copy(logits + t * E, logits + (t + 1) * E, p.begin());
    softmax(p.data(), E);
    int32_t* ids = &r.ids[size_t(t * K)];
    float* w = &r.weights[size_t(t * K)];
    if (c.group_limited) group_limited_select(c, p.data(), /*sum_of_top2=*/false, ids);
    else topk_desc(p.data(), E, K, ids);
    float sum = 0.f;
    for (int k = 0; k < K; k++) {
      w[k] = p[size_t(ids[k])];
      sum += w[k];
    }
    if (c.norm_topk_prob && K > 1)
      for (int k = 0; k < K; k++) w[k] /= (sum + 1e-20f);
    for (int k = 0; k < K; k++) w[k] *= c.routed_scaling_factor;
  }
}

}  // namespace

Routing route(const RoutingConfig& c, const float* logits, int64_t T, const float* bias) {
  EPMOE_ASSERT(c.top_k >= 1 && c.top_k <= c.num_experts, "top_k out of range");
  Routing r;
  r.T = T;
  r.K = c.top_k;
  r.ids.resize(static_cast<size_t>(T * c.top_k));
  r.weights.resize(static_cast<size_t>(T * c.top_k));
  switch (c.kind) {
    case RoutingKind::SoftmaxTopK: softmax_topk(c, logits, T, r); break;
    case RoutingKind::SigmoidGroupLimited: sigmoid_group_limited(c, logits, T, bias, r); break;
    case RoutingKind::SoftmaxGroupLimited: softmax_group_limited(c, logits, T, r); break;
  }
  return r;
}

}  // namespace epmoe
