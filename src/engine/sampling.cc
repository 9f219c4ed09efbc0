#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "util/error.h"
#include "kernels/sampling_math.h"
#include "util/hash.h"

namespace epmoe {

namespace {

float effective_temperature(float t) { return t > 0.0f ? t : 1.0f; }

// The stable order: logit descending, id ascending -- a strict total order, so a partial sort
// gives the same first ids as a full one.
struct StableOrder {
  const float* logits;
  bool operator()(int32_t a, int32_t b) const {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  }
};

// The first n ids of the stable order (all of them sorted when n >= V).
std::vector<int32_t> first_in_order(const float* logits, int64_t V, int64_t n) {
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  n = std::min(n, V);
  std::partial_sort(ids.begin(), ids.begin() + long(n), ids.end(), StableOrder{logits});
  ids.resize(size_t(n));
  return ids;
}

int32_t greedy(const float* logits, int64_t V) {
  int64_t best = 0;
  for (int64_t i = 1; i < V; i++)
    if (logits[i] > logits[best]) best = i;
  return int32_t(best);
}

}  // namespace

void validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0f) || !std::isfinite(p.temperature))
    throw InputError("--temperature " + std::to_string(p.temperature) + ": must be >= 0 (0: greedy)");
  if (p.top_k < -1) throw InputError("--top-k " + std::to_string(p.top_k) + ": must be -1 (off) or >= 1");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    throw InputError("--top-p " + std::to_string(p.top_p) + ": must be in (0, 1] (1: off)");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
    throw InputError("--min-p " + std::to_string(p.min_p) + ": must be in [0, 1] (0: off)");
}

void validate(const LogitProcessing& p, int64_t V) {
  auto in = [](float v, float lo, float hi) { return std::isfinite(v) && v >= lo && v <= hi; };
  if (!in(p.frequency_penalty, -2.0f, 2.0f))
    throw InputError("frequency_penalty " + std::to_string(p.frequency_penalty) + ": must be in [-2, 2] (0: off)");
  if (!in(p.presence_penalty, -2.0f, 2.0f))
    throw InputError("presence_penalty " + std::to_string(p.presence_penalty) + ": must be in [-2, 2] (0: off)");
  if (!(in(p.repetition_penalty, 0.0f, 2.0f) && p.repetition_penalty > 0.0f))
    throw InputError("repetition_penalty " + std::to_string(p.repetition_penalty) + ": must be in (0, 2] (1: off)");
  if (p.min_new_tokens < 0) throw InputError("min_new_tokens " + std::to_string(p.min_new_tokens) + ": must be >= 0");
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= V)
      throw InputError("logit_bias: token " + std::to_string(id) + " is outside the vocabulary [0, " +
                       std::to_string(V) + ")");
    if (!in(bias, -100.0f, 100.0f))
      throw InputError("logit_bias: the bias of token " + std::to_string(id) + " is " + std::to_string(bias) +
                       ", outside [-100, 100]");
  }
}

void process_logits(float* row, int64_t V, const LogitProcessing& p, const std::vector<int32_t>& prompt,
                    int prior_output, const std::vector<int32_t>& output, const std::vector<int>& stop_ids) {
  const size_t head = prompt.size() - std::min(prompt.size(), size_t(std::max(prior_output, 0)));
  // Per id of the vocabulary, in one pass over the sample's tokens (linear: the caller's copy of
  // the row is O(V) already): how often the output holds it, and whether the prompt or output does.
  if (p.repetition_penalty != 1.0f || p.frequency_penalty != 0.0f || p.presence_penalty != 0.0f) {
    std::vector<int32_t> count(size_t(V), 0);
    std::vector<char> seen(size_t(V), 0);
    auto add = [&](int32_t t, bool out) {
      if (t < 0 || t >= V) return;
      seen[size_t(t)] = 1;
      count[size_t(t)] += out;
    };
    for (size_t i = 0; i < prompt.size(); i++) add(prompt[i], i >= head);
    for (int32_t t : output) add(t, true);
    for (int64_t id = 0; id < V; id++) {
      float& x = row[id];
      if (p.repetition_penalty != 1.0f && seen[size_t(id)])
        x = x > 0.0f ? x / p.repetition_penalty : x * p.repetition_penalty;
      if (const int32_t c = count[size_t(id)]; c > 0) x -= p.frequency_penalty * float(c) + p.presence_penalty;
    }
  }
  for (const auto& [id, bias] : p.logit_bias)
    if (id >= 0 && id < V) row[id] += bias;
  const int generated = int((prompt.size() - head) + output.size());
  if (generated < p.min_new_tokens)
    for (int id : stop_ids)
      if (id >= 0 && id < V) row[id] = -std::numeric_limits<float>::infinity();
}

double sampling_uniform(uint64_t seed, int64_t position, int32_t id) {
  return sampling_uniform_of(seed, position, id);
}

double gumbel_noise(uint64_t seed, int64_t position, int32_t id) {
  return -det_log(-det_log(sampling_uniform(seed, position, id)));
}

namespace {

// max and log-sum-exp of logits / T, in the fixed order of kernels/sampling_math.h (the GPU's
// draw kernel sums the same way).
EPMOE_FMA_CLONES void row_normaliser(const float* logits, int64_t V, float T, float* max_out, float* lse_out) {
  float m = -INFINITY;
  for (int64_t i = 0; i < V; i++) m = std::max(m, logits[i] / T);
  float lane[kLogprobLanes] = {};
  for (int64_t i = 0; i < V; i++) lane[i % kLogprobLanes] += det_expf(logits[i] / T - m);
  for (int w = kLogprobLanes / 2; w > 0; w /= 2)
    for (int j = 0; j < w; j++) lane[j] += lane[j + w];
  *max_out = m;
  *lse_out = det_logf(lane[0]);
}

// The exponential race over ids (all V when ids is null): argmin of race_key, ties to the lower id.
EPMOE_FMA_CLONES int32_t race(const float* logits, int64_t V, const int32_t* ids, int64_t n, double T,
                              uint64_t seed, int64_t position) {
  const double m = double(logits[greedy(logits, V)]) / T;
  int32_t best = -1;
  double best_key = INFINITY;
  for (int64_t k = 0; k < n; k++) {
    const int32_t id = ids ? ids[k] : int32_t(k);
    const double u = sampling_uniform_of(seed, position, id);
    // -ln u >= 1 - u; the margin covers det_log's rounding, so a skipped id could not have won.
    if ((1.0 - u) * det_exp(m - double(logits[id]) / T) * (1.0 - 1e-12) >= best_key) continue;
    const double key = race_key(u, logits[id], T, m);
    if (key < best_key) {  // ids ascending: a tie (of measure zero) goes to the lower id
      best = id;
      best_key = key;
    }
  }
  return best;
}

}  // namespace

RowLogprobs::RowLogprobs(const float* logits, int64_t V, float temperature)
    : logits_(logits), V_(V), T_(effective_temperature(temperature)) {
  row_normaliser(logits, V, T_, &max_, &lse_);
}

float RowLogprobs::at(int32_t id) const { return (logits_[id] / T_ - max_) - lse_; }

std::vector<std::pair<int32_t, float>> RowLogprobs::top(int n) const {
  std::vector<std::pair<int32_t, float>> out;
  for (int32_t id : first_in_order(logits_, V_, std::max(n, 0))) out.push_back({id, at(id)});
  return out;
}

std::vector<float> logprobs_row(const float* logits, int64_t V, float temperature) {
  const RowLogprobs row(logits, V, temperature);
  std::vector<float> out(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; i++) out[size_t(i)] = row.at(int32_t(i));
  return out;
}

float token_logprob(const float* logits, int64_t V, float temperature, int32_t token) {
  EPMOE_ASSERT(token >= 0 && token < V, "token_logprob: id " + std::to_string(token) + " outside the vocabulary");
  return RowLogprobs(logits, V, temperature).at(token);
}

std::vector<std::pair<int32_t, float>> top_logprobs(const float* logits, int64_t V, float temperature, int n) {
  return RowLogprobs(logits, V, temperature).top(n);
}

std::vector<int32_t> kept_ids(const float* logits, int64_t V, const SamplingParams& p) {
  if (p.temperature <= 0.0f) return {greedy(logits, V)};
  const bool top_k = p.top_k > 0 && p.top_k < V, top_p = p.top_p < 1.0f, min_p = p.min_p > 0.0f;
  // Relative probabilities e = p / p_max of the full row, in double: the masks are decisions, not
  // reported numbers.
  const double T = p.temperature, top = double(logits[greedy(logits, V)]) / T;
  auto e = [&](int32_t id) { return std::exp(double(logits[id]) / T - top); };
  if (!top_k && !top_p) {  // no order needed: every id, or those with p >= min_p * p_max
    std::vector<int32_t> ids;
    for (int32_t i = 0; i < int32_t(V); i++)
      if (!min_p || e(i) >= double(p.min_p)) ids.push_back(i);
    return ids;
  }
  // A prefix of the stable order: the top_k first (a partial sort), or all of them for top-p.
  std::vector<int32_t> ids = first_in_order(logits, V, top_k ? int64_t(p.top_k) : V);
  size_t keep = ids.size();
  if (top_p) {
    double sum = 0;
    for (int32_t i = 0; i < int32_t(V); i++) sum += e(i);
    double cum = 0;
    size_t i = 0;
    while (i < keep) {
      cum += e(ids[i]) / sum;
      i++;
      if (cum >= double(p.top_p)) break;
    }
    keep = i;
  }
  if (min_p) {
    size_t i = 0;
    while (i < keep && e(ids[i]) >= double(p.min_p)) i++;  // the first id is p_max: e = 1
    keep = std::max<size_t>(i, 1);
  }
  ids.resize(keep);
  std::sort(ids.begin(), ids.end());
  return ids;
}

int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, uint64_t seed, int64_t position,
                     std::vector<int32_t>* support) {
  if (p.temperature <= 0.0f) {
    const int32_t t = greedy(logits, V);
    if (support) *support = {t};
    return t;
  }
  // argmax(l/T + g) with g = -log(E), E = -log(u), is argmin(E * exp(m - l/T)) (m: the largest
  // l/T): an exponential race, one log fewer per id. And since E = -log(u) >= 1 - u, an id whose
  // (1 - u) * w already reaches the best key cannot win: most ids are decided by a hash and an
  // exp, without a log.
  const bool masked = (p.top_k > 0 && p.top_k < V) || p.top_p < 1.0f || p.min_p > 0.0f;
  if (!masked) {
    if (support) *support = kept_ids(logits, V, p);
    return race(logits, V, nullptr, V, p.temperature, seed, position);
  }
  std::vector<int32_t> ids = kept_ids(logits, V, p);
  const int32_t t = race(logits, V, ids.data(), int64_t(ids.size()), p.temperature, seed, position);
  if (support) *support = std::move(ids);
  return t;
}

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ uint64_t(rd());
}

}  // namespace epmoe
