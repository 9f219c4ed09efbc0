// Sampling and log-probs (src/engine/sampling.h): greedy ties, the masks over the stable order,
// noise keyed on the vocabulary id, determinism per (seed, position), the empirical distribution
// of 20,000 draws against softmax(logits / T) after the masks (chi-square, fixed seeds, with a
// control that the test rejects a wrong distribution), and the reported log-probs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "engine/sampling.h"
#include "util/error.h"

namespace epmoe {
namespace {

std::vector<float> random_logits(int V, uint64_t seed, float scale = 3.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> n(0.0f, scale);
  std::vector<float> l(static_cast<size_t>(V));
  for (auto& v : l) v = n(rng);
  return l;
}

// softmax(l / T) in double.
std::vector<double> probs(const std::vector<float>& l, double T) {
  const double m = *std::max_element(l.begin(), l.end()) / T;
  std::vector<double> p(l.size());
  double s = 0;
  for (size_t i = 0; i < l.size(); i++) s += (p[i] = std::exp(double(l[i]) / T - m));
  for (auto& v : p) v /= s;
  return p;
}

TEST(Sampling, GreedyTakesTheLargestLogitTiesToTheLowerId) {
  const std::vector<float> l = {0.5f, 2.0f, -1.0f, 2.0f, 1.9f};
  EXPECT_EQ(sample_token(l.data(), 5, {}, 123, 4), 1);
  SamplingParams p;
  p.temperature = 0.0f;
  p.top_k = 1;
  EXPECT_EQ(sample_token(l.data(), 5, p, 999, 0), 1);
  EXPECT_EQ(kept_ids(l.data(), 5, p), std::vector<int32_t>{1});
}

TEST(Sampling, MasksFollowTheStableOrder) {
  const int V = 40;
  auto l = random_logits(V, 5);
  l[7] = l[3];  // a tie: the lower id comes first in the order
  std::vector<int32_t> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return l[size_t(a)] > l[size_t(b)]; });
  for (float T : {0.5f, 1.0f, 2.0f}) {
    const auto pr = probs(l, T);
    for (int k : {1, 3, 7, 40}) {
      SamplingParams p;
      p.temperature = T;
      p.top_k = k;
      std::vector<int32_t> want(order.begin(), order.begin() + k);
      std::sort(want.begin(), want.end());
      EXPECT_EQ(kept_ids(l.data(), V, p), want) << "top_k " << k;
    }
    for (float top_p : {0.05f, 0.5f, 0.9f, 0.999f}) {
      SamplingParams p;
      p.temperature = T;
      p.top_p = top_p;
      size_t n = 0;
      double cum = 0;
      while (n < order.size() && cum < top_p) cum += pr[size_t(order[n++])];
      std::vector<int32_t> want(order.begin(), order.begin() + long(n));
      std::sort(want.begin(), want.end());
      EXPECT_EQ(kept_ids(l.data(), V, p), want) << "top_p " << top_p << " T " << T;
    }
    for (float min_p : {0.01f, 0.2f, 0.9f}) {
      SamplingParams p;
      p.temperature = T;
      p.min_p = min_p;
      const double pmax = pr[size_t(order[0])];
      std::vector<int32_t> want;
      for (int i = 0; i < V; i++)
        if (pr[size_t(i)] >= double(min_p) * pmax) want.push_back(i);
      EXPECT_EQ(kept_ids(l.data(), V, p), want) << "min_p " << min_p << " T " << T;
    }
  }
}

TEST(Sampling, APureFunctionOfRowParametersSeedAndPosition) {
  const int V = 64;
  const auto l = random_logits(V, 11, 1.0f);
  SamplingParams p;
  p.temperature = 1.0f;
  std::vector<int32_t> a, b, c;
  for (uint64_t seed = 0; seed < 200; seed++) {
    a.push_back(sample_token(l.data(), V, p, seed, 10));
    b.push_back(sample_token(l.data(), V, p, seed, 10));
    c.push_back(sample_token(l.data(), V, p, seed, 11));
  }
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);  // another position, other draws
  EXPECT_GT(std::set<int32_t>(a.begin(), a.end()).size(), size_t(20));
  // The noise belongs to the id: a mask that keeps the drawn id does not change the draw.
  for (uint64_t seed = 0; seed < 200; seed++) {
    SamplingParams k = p;
    k.top_k = V;
    EXPECT_EQ(sample_token(l.data(), V, k, seed, 10), a[seed]);
  }
  for (int32_t id : {0, 5, 63}) {
    const double u = sampling_uniform(42, 7, id);
    EXPECT_GT(u, 0.0);
    EXPECT_LT(u, 1.0);
    EXPECT_NEAR(gumbel_noise(42, 7, id), -std::log(-std::log(u)), 1e-12 * (1 + std::fabs(std::log(-std::log(u)))));
  }
}

// Pearson's chi-square of counts against expected probabilities, bins with an expected count
// below 5 merged; returns {statistic, degrees of freedom}.
std::pair<double, int> chi_square(const std::vector<int>& count, const std::vector<double>& expect, int draws) {
  double stat = 0, small_o = 0, small_e = 0;
  int bins = 0;
  for (size_t i = 0; i < count.size(); i++) {
    const double e = expect[i] * draws;
    if (e < 5) {
      small_o += count[i];
      small_e += e;
      continue;
    }
    stat += (count[i] - e) * (count[i] - e) / e;
    bins++;
  }
  if (small_e > 0) {
    stat += (small_o - small_e) * (small_o - small_e) / std::max(small_e, 1e-9);
    bins++;
  }
  return {stat, bins - 1};
}

// The chi-square quantile at 1 - 0.001 (Wilson-Hilferty; z = 3.0902).
double chi_square_critical(int df) {
  const double a = 2.0 / (9.0 * df);
  return df * std::pow(1 - a + 3.0902 * std::sqrt(a), 3);
}

TEST(Sampling, DrawsFollowTheMaskedSoftmax) {
  const int V = 50, draws = 20000;
  const auto l = random_logits(V, 3, 1.5f);
  struct Setting {
    float T;
    int top_k;
    float top_p, min_p;
  };
  for (const Setting s : {Setting{0.7f, -1, 1.0f, 0.0f}, Setting{1.0f, 5, 1.0f, 0.0f}, Setting{1.3f, -1, 0.8f, 0.0f},
                          Setting{1.0f, -1, 1.0f, 0.1f}, Setting{2.0f, 20, 0.95f, 0.05f}}) {
    SamplingParams p;
    p.temperature = s.T, p.top_k = s.top_k, p.top_p = s.top_p, p.min_p = s.min_p;
    const auto kept = kept_ids(l.data(), V, p);
    // Expected: softmax(l / T) over the kept ids, renormalised.
    const auto full = probs(l, s.T);
    std::vector<double> expect(size_t(V), 0.0);
    double z = 0;
    for (int32_t id : kept) z += full[size_t(id)];
    for (int32_t id : kept) expect[size_t(id)] = full[size_t(id)] / z;
    std::vector<int> count(size_t(V), 0);
    for (int i = 0; i < draws; i++) count[size_t(sample_token(l.data(), V, p, 1000 + uint64_t(i), 17))]++;
    for (int i = 0; i < V; i++)
      if (expect[size_t(i)] == 0) {
        EXPECT_EQ(count[size_t(i)], 0) << "masked id " << i << " drawn";
      }
    const auto [stat, df] = chi_square(count, expect, draws);
    std::printf("T %.1f top_k %d top_p %.2f min_p %.2f: %zu ids kept, chi-square %.1f (df %d, critical %.1f)\n", s.T,
                s.top_k, s.top_p, s.min_p, kept.size(), stat, df, chi_square_critical(std::max(df, 1)));
    if (df >= 1) {
      EXPECT_LT(stat, chi_square_critical(df));
    }
    // Control: the same draws against the distribution of another temperature are rejected, so
    // the test has the power to fail.
    if (kept.size() >= 5) {
      const auto other = probs(l, s.T * 1.5);
      std::vector<double> wrong(size_t(V), 0.0);
      double zw = 0;
      for (int32_t id : kept) zw += other[size_t(id)];
      for (int32_t id : kept) wrong[size_t(id)] = other[size_t(id)] / zw;
      const auto [bad, dfw] = chi_square(count, wrong, draws);
      EXPECT_GT(bad, chi_square_critical(std::max(dfw, 1))) << "the control distribution was not rejected";
    }
  }
}

TEST(Sampling, LogprobsAreTheFullRowsLogSoftmaxAtTheTemperature) {
  const int V = 320;
  const auto l = random_logits(V, 9);
  for (float T : {0.0f, 0.5f, 1.0f, 1.7f}) {
    const auto row = logprobs_row(l.data(), V, T);
    const auto ref = probs(l, T > 0 ? T : 1.0);
    double mass = 0;
    for (int i = 0; i < V; i++) {
      EXPECT_NEAR(row[size_t(i)], std::log(ref[size_t(i)]), 2e-5) << "id " << i << " T " << T;
      EXPECT_EQ(token_logprob(l.data(), V, T, i), row[size_t(i)]);  // one function, the same bits
      mass += std::exp(double(row[size_t(i)]));
    }
    EXPECT_NEAR(mass, 1.0, 1e-5);
  }
  EXPECT_EQ(logprobs_row(l.data(), V, 0.0f), logprobs_row(l.data(), V, 1.0f));  // greedy reports T = 1
  const auto top = top_logprobs(l.data(), V, 1.0f, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_GE(top[0].second, top[1].second);
  EXPECT_GE(top[1].second, top[2].second);
  EXPECT_EQ(top[0].first, int32_t(std::max_element(l.begin(), l.end()) - l.begin()));
}

TEST(Sampling, OutOfRangeParametersAreInputErrors) {
  auto bad = [](SamplingParams p) { EXPECT_THROW(validate(p), InputError); };
  SamplingParams p;
  p.temperature = -0.5f;
  bad(p);
  p = {};
  p.top_k = -2;
  bad(p);
  p = {};
  p.top_p = 0.0f;
  bad(p);
  p = {};
  p.top_p = 1.5f;
  bad(p);
  p = {};
  p.min_p = -0.1f;
  bad(p);
  EXPECT_NO_THROW(validate(SamplingParams{}));
}

// process_logits against the rules written out by hand (engine/sampling.h), on a row of 6.
TEST(Sampling, LogitProcessingFollowsItsRules) {
  const std::vector<float> row = {2.0f, -2.0f, 1.0f, 0.5f, 0.0f, 3.0f};
  const int64_t V = int64_t(row.size());
  auto run = [&](const LogitProcessing& p, const std::vector<int32_t>& prompt, int prior,
                 const std::vector<int32_t>& out, const std::vector<int>& stops = {}) {
    std::vector<float> r = row;
    process_logits(r.data(), V, p, prompt, prior, out, stops);
    return r;
  };
  LogitProcessing rep;
  rep.repetition_penalty = 2.0f;  // ids 0 (prompt) and 1 (output): 2 / 2, -2 * 2
  EXPECT_EQ(run(rep, {0}, 0, {1, 1}), (std::vector<float>{1.0f, -4.0f, 1.0f, 0.5f, 0.0f, 3.0f}));
  LogitProcessing fp;
  fp.frequency_penalty = 0.5f;
  fp.presence_penalty = 1.0f;  // output {2, 2, 3}: id 2 -= 0.5 * 2 + 1, id 3 -= 0.5 + 1; the prompt's id 0 untouched
  const std::vector<float> want = {2.0f, -2.0f, -1.0f, -1.0f, 0.0f, 3.0f};
  EXPECT_EQ(run(fp, {0}, 0, {2, 2, 3}), want);
  // The same sample continued after a retract: two of its tokens now end its prompt (prior_output).
  EXPECT_EQ(run(fp, {0, 2, 2}, 2, {3}), want);
  LogitProcessing bias;
  bias.logit_bias = {{1, 3.0f}, {5, -100.0f}};
  EXPECT_EQ(run(bias, {0}, 0, {}), (std::vector<float>{2.0f, 1.0f, 1.0f, 0.5f, 0.0f, -97.0f}));
  LogitProcessing min;
  min.min_new_tokens = 2;  // stop id 5 masked while fewer than 2 tokens were generated
  EXPECT_TRUE(std::isinf(run(min, {0}, 0, {4}, {5})[5]));
  EXPECT_TRUE(std::isinf(run(min, {0, 4}, 1, {}, {5})[5]));  // (a prior output counts)
  EXPECT_EQ(run(min, {0}, 0, {4, 4}, {5}), row);
  // Greedy on the processed row: the bias moves the argmax, the row itself is the model's.
  EXPECT_EQ(sample_token(row.data(), V, SamplingParams{}, 1, 0), 5);
  const std::vector<float> biased = run(bias, {0}, 0, {});
  EXPECT_EQ(sample_token(biased.data(), V, SamplingParams{}, 1, 0), 0);
  EXPECT_FALSE(LogitProcessing{}.active());
  EXPECT_TRUE(bias.active() && min.active() && fp.active() && rep.active());
  // Ranges.
  auto bad = [&](LogitProcessing p) { EXPECT_THROW(validate(p, V), InputError); };
  LogitProcessing p;
  p.frequency_penalty = 2.5f;
  bad(p);
  p = {};
  p.repetition_penalty = 0.0f;
  bad(p);
  p = {};
  p.logit_bias = {{6, 1.0f}};
  bad(p);
  p = {};
  p.logit_bias = {{1, 150.0f}};
  bad(p);
  p = {};
  p.min_new_tokens = -1;
  bad(p);
  EXPECT_NO_THROW(validate(fp, V));
}

}  // namespace
}  // namespace epmoe
