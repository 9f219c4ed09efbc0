// Routing strategies (src/moe/routing.h) against a scalar reference written here from the formulas
// of transformers (Qwen3-MoE / Mixtral, DeepSeek-V3 / GLM4-MoE, DeepSeek-V2), plus hand-computed
// cases for the corners the random cases rarely reach: ties, topk_group == n_group, k == E, and
// -inf masking of dropped groups.
//
// The reference is deliberately different code: top-k is a std::stable_sort on (-value, index)
// instead of the selection loop, and groups are masked by building a fresh vector. Scores are
// computed in fp32 with the plain formula (as transformers does), so that values which are equal
// in the input are equal in both implementations and tie order is compared exactly.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "moe/routing.h"

namespace epmoe {
namespace {

// ---------------------------------------------------------------- reference

// Indices of the k largest values, descending; a stable sort keeps equal values in index order,
// so ties go to the lower index.
std::vector<int32_t> ref_topk(const std::vector<float>& v, int k) {
  std::vector<int32_t> idx(v.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int32_t a, int32_t b) { return v[size_t(a)] > v[size_t(b)]; });
  idx.resize(size_t(k));
  return idx;
}

std::vector<float> ref_softmax(const float* x, int n) {
  const float m = *std::max_element(x, x + n);
  std::vector<float> p(static_cast<size_t>(n));
  float s = 0.f;
  for (int i = 0; i < n; i++) s += (p[size_t(i)] = std::exp(x[i] - m));
  for (auto& v : p) v /= s;
  return p;
}

// Keeps the experts of the topk_group best groups, everything else -inf (never 0: a dropped
// expert must lose even against negative biased scores).
std::vector<float> ref_group_mask(const std::vector<float>& choice, int n_group, int topk_group, bool sum_of_top2) {
  if (topk_group >= n_group) return choice;  // all kept (and a group of one has no "best two")
  const int per = int(choice.size()) / n_group;
  std::vector<float> gscore;
  for (int g = 0; g < n_group; g++) {
    std::vector<float> s(choice.begin() + g * per, choice.begin() + (g + 1) * per);
    std::sort(s.begin(), s.end(), std::greater<float>());
    gscore.push_back(sum_of_top2 ? s[0] + s[1] : s[0]);
  }
  std::vector<float> masked(choice.size(), -INFINITY);
  for (int32_t g : ref_topk(gscore, topk_group))
    for (int i = g * per; i < (g + 1) * per; i++) masked[size_t(i)] = choice[size_t(i)];
  return masked;
}

struct RefRow {
  std::vector<int32_t> ids;
  std::vector<float> w;
};

RefRow ref_route_row(const RoutingConfig& c, const float* logits, const float* bias) {
  const int E = c.num_experts, K = c.top_k;
  RefRow r;
  std::vector<float> prob;  // what the weights are taken from
  switch (c.kind) {
    case RoutingKind::SoftmaxTopK: {
      prob = ref_softmax(logits, E);
      r.ids = ref_topk(prob, K);
      break;
    }
    case RoutingKind::SigmoidGroupLimited: {
      std::vector<float> choice(static_cast<size_t>(E));
      for (int e = 0; e < E; e++) {
        prob.push_back(1.0f / (1.0f + std::exp(-logits[e])));
        choice[size_t(e)] = prob.back() + (bias ? bias[e] : 0.0f);
      }
      r.ids = ref_topk(ref_group_mask(choice, c.n_group, c.topk_group, /*sum_of_top2=*/true), K);
      break;
    }
    case RoutingKind::SoftmaxGroupLimited: {
      prob = ref_softmax(logits, E);
      r.ids = ref_topk(c.group_limited ? ref_group_mask(prob, c.n_group, c.topk_group, false) : prob, K);
      break;
    }
  }
  float sum = 0.f;
  for (int32_t id : r.ids) {
    r.w.push_back(prob[size_t(id)]);
    sum += prob[size_t(id)];
  }
  switch (c.kind) {
    case RoutingKind::SoftmaxTopK:
      if (c.norm_topk_prob)
        for (auto& w : r.w) w /= sum;
      break;
    case RoutingKind::SigmoidGroupLimited:
      for (auto& w : r.w) w = (c.norm_topk_prob ? w / (sum + 1e-20f) : w) * c.routed_scaling_factor;
      break;
    case RoutingKind::SoftmaxGroupLimited:
      for (auto& w : r.w) w = (c.norm_topk_prob && K > 1 ? w / (sum + 1e-20f) : w) * c.routed_scaling_factor;
      break;
  }
  return r;
}

// ---------------------------------------------------------------- helpers

std::string describe(const RoutingConfig& c) {
  std::ostringstream s;
  s << "kind=" << int(c.kind) << " E=" << c.num_experts << " k=" << c.top_k << " norm=" << c.norm_topk_prob
    << " n_group=" << c.n_group << " topk_group=" << c.topk_group << " scale=" << c.routed_scaling_factor
    << " group_limited=" << c.group_limited;
  return s.str();
}

// Runs route() on T rows and holds every row against the reference: ids exactly, weights within
// 1e-6 (relative to the scaling factor, which multiplies the rounding error).
void expect_matches_reference(const RoutingConfig& c, const std::vector<float>& logits, int64_t T,
                              const float* bias) {
  SCOPED_TRACE(describe(c));
  const Routing r = route(c, logits.data(), T, bias);
  ASSERT_EQ(r.T, T);
  ASSERT_EQ(r.K, c.top_k);
  ASSERT_EQ(r.ids.size(), size_t(T * c.top_k));
  ASSERT_EQ(r.weights.size(), size_t(T * c.top_k));
  const float tol = 1e-6f * std::max(1.0f, c.routed_scaling_factor);
  for (int64_t t = 0; t < T; t++) {
    const RefRow ref = ref_route_row(c, logits.data() + t * c.num_experts, bias);
    for (int k = 0; k < c.top_k; k++) {
      const size_t i = size_t(t * c.top_k + k);
      ASSERT_EQ(r.ids[i], ref.ids[size_t(k)]) << "token " << t << " slot " << k;
      ASSERT_NEAR(r.weights[i], ref.w[size_t(k)], tol) << "token " << t << " slot " << k;
    }
  }
}

// Continuous logits (ties only by accident) or, for tie_heavy, a few distinct values so that equal
// scores and equal group scores happen all the time.
std::vector<float> random_values(std::mt19937& rng, size_t n, bool tie_heavy, float scale) {
  std::normal_distribution<float> normal(0.f, scale);
  std::uniform_int_distribution<int> level(-2, 2);
  std::vector<float> v(n);
  for (auto& x : v) x = tie_heavy ? 0.5f * scale * float(level(rng)) : normal(rng);
  return v;
}

RoutingConfig softmax_topk_config(int E, int k, bool norm) {
  RoutingConfig c;
  c.kind = RoutingKind::SoftmaxTopK;
  c.num_experts = E;
  c.top_k = k;
  c.norm_topk_prob = norm;
  return c;
}

RoutingConfig grouped_config(RoutingKind kind, int E, int k, int n_group, int topk_group, bool norm, float scale) {
  RoutingConfig c;
  c.kind = kind;
  c.num_experts = E;
  c.top_k = k;
  c.n_group = n_group;
  c.topk_group = topk_group;
  c.norm_topk_prob = norm;
  c.routed_scaling_factor = scale;
  c.has_correction_bias = kind == RoutingKind::SigmoidGroupLimited;
  return c;
}

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ---------------------------------------------------------------- random cases against the reference

TEST(Routing, TopkDescMatchesStableSort) {
  std::mt19937 rng(1);
  for (int it = 0; it < 2000; it++) {
    const int n = std::uniform_int_distribution<int>(1, 80)(rng);
    const int k = std::uniform_int_distribution<int>(1, n)(rng);
    const std::vector<float> v = random_values(rng, size_t(n), it % 2 == 0, 1.0f);
    std::vector<int32_t> got(static_cast<size_t>(k));
    topk_desc(v.data(), n, k, got.data());
    ASSERT_EQ(got, ref_topk(v, k)) << "n=" << n << " k=" << k;
  }
}

TEST(Routing, SoftmaxTopKMatchesReference) {
  std::mt19937 rng(2);
  for (int it = 0; it < 400; it++) {
    const int E = std::uniform_int_distribution<int>(1, 70)(rng);
    const int k = std::uniform_int_distribution<int>(1, std::min(E, 10))(rng);
    const int64_t T = std::uniform_int_distribution<int>(0, 6)(rng);
    const RoutingConfig c = softmax_topk_config(E, k, it % 2 == 0);
    expect_matches_reference(c, random_values(rng, size_t(T * E), it % 3 == 0, 2.0f), T, nullptr);
  }
}

TEST(Routing, SigmoidGroupLimitedMatchesReference) {
  std::mt19937 rng(3);
  const int groups[] = {1, 2, 3, 4, 8};
  for (int it = 0; it < 600; it++) {
    const int G = groups[std::uniform_int_distribution<int>(0, 4)(rng)];
    const int per = std::uniform_int_distribution<int>(2, 8)(rng);  // sum of the best two needs >= 2
    const int tg = std::uniform_int_distribution<int>(1, G)(rng);
    const int k = std::uniform_int_distribution<int>(1, std::min(tg * per, 12))(rng);
    const int64_t T = std::uniform_int_distribution<int>(0, 6)(rng);
    const float scale = std::uniform_real_distribution<float>(0.5f, 2.5f)(rng);
    const bool tie_heavy = it % 3 == 0;
    const RoutingConfig c =
        grouped_config(RoutingKind::SigmoidGroupLimited, G * per, k, G, tg, it % 2 == 0, scale);
    const std::vector<float> logits = random_values(rng, size_t(T * c.num_experts), tie_heavy, 2.0f);
    // Bias of either sign, large enough to reorder experts; sometimes absent.
    const std::vector<float> bias = random_values(rng, size_t(c.num_experts), tie_heavy, 0.5f);
    expect_matches_reference(c, logits, T, it % 4 == 0 ? nullptr : bias.data());
  }
}

TEST(Routing, SoftmaxGroupLimitedMatchesReference) {
  std::mt19937 rng(4);
  const int groups[] = {1, 2, 3, 4, 8};
  for (int it = 0; it < 600; it++) {
    const int G = groups[std::uniform_int_distribution<int>(0, 4)(rng)];
    const int per = std::uniform_int_distribution<int>(1, 8)(rng);  // group score = max: 1 is fine
    const int tg = std::uniform_int_distribution<int>(1, G)(rng);
    const int k = std::uniform_int_distribution<int>(1, std::min(tg * per, 12))(rng);
    const int64_t T = std::uniform_int_distribution<int>(0, 6)(rng);
    const float scale = std::uniform_real_distribution<float>(0.5f, 2.5f)(rng);
    RoutingConfig c = grouped_config(RoutingKind::SoftmaxGroupLimited, G * per, k, G, tg, it % 2 == 0, scale);
    c.group_limited = (it / 2) % 2 == 0;  // greedy and group_limited_greedy, each with and without norm
    expect_matches_reference(c, random_values(rng, size_t(T * c.num_experts), it % 3 == 0, 2.0f), T, nullptr);
  }
}

// ---------------------------------------------------------------- explicit cases

TEST(Routing, ZeroTokens) {
  const RoutingConfig c = softmax_topk_config(8, 2, true);
  const Routing r = route(c, nullptr, 0, nullptr);
  EXPECT_EQ(r.T, 0);
  EXPECT_TRUE(r.ids.empty());
  EXPECT_TRUE(r.weights.empty());
}

// Equal logits give equal probabilities; the lower expert index must come first.
TEST(Routing, EqualScoresGoToLowerExpertIndex) {
  // Experts 1, 3 and 6 share the best logit, 0 and 5 the second best.
  const std::vector<float> logits = {0.5f, 1.0f, -1.0f, 1.0f, -2.0f, 0.5f, 1.0f, 0.0f};
  const Routing r = route(softmax_topk_config(8, 4, false), logits.data(), 1, nullptr);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{1, 3, 6, 0}));
  EXPECT_EQ(r.weights[0], r.weights[1]);
  EXPECT_EQ(r.weights[1], r.weights[2]);
  expect_matches_reference(softmax_topk_config(8, 4, false), logits, 1, nullptr);
}

// Two groups with exactly equal scores: the lower group index is kept.
TEST(Routing, GroupScoreTieKeepsLowerGroup) {
  // 8 experts in 4 groups of 2, one group kept, top-2, no bias. Groups 1 and 2 hold the logits
  // {2, 1} in opposite order, so their scores sigmoid(2) + sigmoid(1) are the same float (addition
  // is commutative) and beat group 0 (0.5 + 0.5) and group 3. Keeping group 1 gives experts 2
  // (logit 2) then 3; keeping group 2 by mistake would give 5 then 4.
  RoutingConfig c = grouped_config(RoutingKind::SigmoidGroupLimited, 8, 2, 4, 1, true, 1.0f);
  const std::vector<float> logits = {0.f, 0.f, 2.f, 1.f, 1.f, 2.f, -1.f, 0.f};
  const Routing r = route(c, logits.data(), 1, nullptr);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{2, 3}));
  // Renormalised unbiased sigmoid scores.
  const double s2 = sigmoid(2), s1 = sigmoid(1);
  EXPECT_NEAR(r.weights[0], s2 / (s2 + s1), 1e-6);
  EXPECT_NEAR(r.weights[1], s1 / (s2 + s1), 1e-6);

  // DeepSeek-V2 (group score = max) with the same layout: groups 1 and 2 both have max logit 2.
  RoutingConfig v2 = grouped_config(RoutingKind::SoftmaxGroupLimited, 8, 2, 4, 1, false, 1.0f);
  EXPECT_EQ(route(v2, logits.data(), 1, nullptr).ids, (std::vector<int32_t>{2, 3}));
  expect_matches_reference(c, logits, 1, nullptr);
  expect_matches_reference(v2, logits, 1, nullptr);
}

// topk_group == n_group keeps every group: the result is the plain top-k of the biased scores,
// and n_group == 1 is the same thing.
TEST(Routing, AllGroupsKeptOrOneGroupEqualsPlainTopK) {
  std::mt19937 rng(5);
  for (int it = 0; it < 200; it++) {
    const int G = it % 2 == 0 ? 1 : std::uniform_int_distribution<int>(2, 8)(rng);
    const int per = std::uniform_int_distribution<int>(2, 6)(rng);
    const int E = G * per;
    const int k = std::uniform_int_distribution<int>(1, E)(rng);
    const RoutingConfig c = grouped_config(RoutingKind::SigmoidGroupLimited, E, k, G, G, false, 1.0f);
    const std::vector<float> logits = random_values(rng, size_t(E), it % 3 == 0, 2.0f);
    const std::vector<float> bias = random_values(rng, size_t(E), false, 0.3f);
    std::vector<float> choice(static_cast<size_t>(E));
    for (int e = 0; e < E; e++) choice[size_t(e)] = 1.0f / (1.0f + std::exp(-logits[size_t(e)])) + bias[size_t(e)];
    SCOPED_TRACE(describe(c));
    EXPECT_EQ(route(c, logits.data(), 1, bias.data()).ids, ref_topk(choice, k));
  }
}

// k == E: every expert once, ordered by score; softmax weights then are the whole softmax.
TEST(Routing, KEqualsNumberOfExperts) {
  std::mt19937 rng(6);
  const int E = 12;
  const std::vector<float> logits = random_values(rng, size_t(E), false, 2.0f);
  for (bool norm : {false, true}) {
    const Routing r = route(softmax_topk_config(E, E, norm), logits.data(), 1, nullptr);
    std::vector<int32_t> sorted = r.ids;
    std::sort(sorted.begin(), sorted.end());
    std::vector<int32_t> all(static_cast<size_t>(E));
    std::iota(all.begin(), all.end(), 0);
    EXPECT_EQ(sorted, all);
    double sum = 0;
    for (float w : r.weights) sum += w;
    EXPECT_NEAR(sum, 1.0, 1e-6);  // renormalising a full softmax changes nothing
    for (int k = 1; k < E; k++) EXPECT_GE(logits[size_t(r.ids[size_t(k - 1)])], logits[size_t(r.ids[size_t(k)])]);
  }
  // Group-limited with every group kept and k == E.
  const RoutingConfig c = grouped_config(RoutingKind::SigmoidGroupLimited, E, E, 3, 3, true, 2.5f);
  const std::vector<float> bias = random_values(rng, size_t(E), false, 0.3f);
  expect_matches_reference(c, logits, 1, bias.data());
  RoutingConfig v2 = grouped_config(RoutingKind::SoftmaxGroupLimited, E, E, 4, 4, true, 1.0f);
  expect_matches_reference(v2, logits, 1, nullptr);
}

// DeepSeek-V2 group_limited_greedy vs greedy on a hand-made row.
TEST(Routing, DeepSeekV2GroupLimitedGreedy) {
  // 6 experts in 3 groups of 2, one group kept, top-2, routed_scaling_factor 16 (DeepSeek-V2).
  // Group maxima: g0 = 3 (expert 0), g1 = 2.9, g2 = 0. group_limited_greedy keeps g0 and must
  // take expert 1 (logit -5) as the second choice; plain greedy takes experts 0 and 2.
  const std::vector<float> logits = {3.0f, -5.0f, 2.9f, 2.8f, 0.0f, 0.0f};
  RoutingConfig c = grouped_config(RoutingKind::SoftmaxGroupLimited, 6, 2, 3, 1, false, 16.0f);
  double z = 0;
  for (float l : logits) z += std::exp(double(l));
  auto p = [&](int e) { return std::exp(double(logits[size_t(e)])) / z; };

  const Routing r = route(c, logits.data(), 1, nullptr);
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  // No renormalisation (norm_topk_prob false): softmax probability times the scaling factor.
  EXPECT_NEAR(r.weights[0], 16.0 * p(0), 16e-6);
  EXPECT_NEAR(r.weights[1], 16.0 * p(1), 16e-6);

  c.group_limited = false;
  const Routing g = route(c, logits.data(), 1, nullptr);
  EXPECT_EQ(g.ids, (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(g.weights[1], 16.0 * p(2), 16e-6);

  // With renormalisation the two weights sum to the scaling factor.
  c.norm_topk_prob = true;
  const Routing n = route(c, logits.data(), 1, nullptr);
  EXPECT_NEAR(n.weights[0] + n.weights[1], 16.0, 16e-6);
  EXPECT_NEAR(n.weights[0], 16.0 * p(0) / (p(0) + p(2)), 16e-6);
}

// Every biased score of the kept group is negative; a 0.0 mask for the dropped group would make
// its experts win. With -inf they can never be chosen.
TEST(Routing, DroppedGroupsMaskedToMinusInfinity) {
  // 8 experts in 2 groups of 4, one group kept, top-2, scaling 2.5. All logits 0, so every
  // sigmoid score is 0.5; the bias makes the biased scores
  //   group 0: -0.5 -0.7 -0.9 -1.1  (score of the group: -0.5 + -0.7 = -1.2)
  //   group 1: -1.5 -1.5 -1.5 -1.5  (score -3.0)
  // Group 0 is kept and experts 0 and 1 are chosen. Weights: 0.5 / (0.5 + 0.5) * 2.5 = 1.25 each.
  const RoutingConfig c = grouped_config(RoutingKind::SigmoidGroupLimited, 8, 2, 2, 1, true, 2.5f);
  const std::vector<float> logits(8, 0.0f);
  const std::vector<float> bias = {-1.0f, -1.2f, -1.4f, -1.6f, -2.0f, -2.0f, -2.0f, -2.0f};
  const Routing r = route(c, logits.data(), 1, bias.data());
  EXPECT_EQ(r.ids, (std::vector<int32_t>{0, 1}));
  EXPECT_NEAR(r.weights[0], 1.25, 1e-6);
  EXPECT_NEAR(r.weights[1], 1.25, 1e-6);
  expect_matches_reference(c, logits, 1, bias.data());
}

// One expert, one group: every strategy picks it. The DeepSeek-V3 group score (sum of the best
// two) does not exist for a group of one; the config parser accepts E = 1 with n_group = 1, and
// route() once read and wrote outside its buffers here.
TEST(Routing, SingleExpert) {
  const float logit = 0.3f;
  for (RoutingKind kind : {RoutingKind::SoftmaxTopK, RoutingKind::SigmoidGroupLimited, RoutingKind::SoftmaxGroupLimited}) {
    const RoutingConfig c = grouped_config(kind, 1, 1, 1, 1, false, 2.0f);
    const Routing r = route(c, &logit, 1, nullptr);
    EXPECT_EQ(r.ids, std::vector<int32_t>{0});
    expect_matches_reference(c, {logit}, 1, nullptr);
  }
}

TEST(Routing, TopkDescRejectsKAboveN) {
  const float v[2] = {1.f, 2.f};
  int32_t out[3];
  EXPECT_ANY_THROW(topk_desc(v, 2, 3, out));
}

// Weights come from the unbiased sigmoid even though the bias decides the choice.
TEST(Routing, SigmoidWeightsIgnoreTheBias) {
  // 4 experts, one group, top-1, no renormalisation. Expert 3 has the lowest logit but a bias
  // of +1 makes it the choice; its weight is sigmoid(-1) = 0.26894, not sigmoid(-1) + 1.
  const RoutingConfig c = grouped_config(RoutingKind::SigmoidGroupLimited, 4, 1, 1, 1, false, 1.0f);
  const std::vector<float> logits = {1.0f, 0.5f, 0.0f, -1.0f};
  const std::vector<float> bias = {0.0f, 0.0f, 0.0f, 1.0f};
  const Routing r = route(c, logits.data(), 1, bias.data());
  EXPECT_EQ(r.ids, (std::vector<int32_t>{3}));
  EXPECT_NEAR(r.weights[0], sigmoid(-1.0), 1e-6);
}

}  // namespace
}  // namespace epmoe
