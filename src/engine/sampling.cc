#include "engine/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "util/error.h"
#include "util/hash.h"

namespace epmoe {

namespace {

float effective_temperature(float t) { return t > 0.0f ? t : 1.0f; }

// The ids in the stable order: logit descending, id ascending (a pure function of the row).
std::vector<int32_t> stable_order(const float* logits, int64_t V) {
  std::vector<int32_t> ids(static_cast<size_t>(V));
  std::iota(ids.begin(), ids.end(), 0);
  std::sort(ids.begin(), ids.end(), [logits](int32_t a, int32_t b) {
    return logits[a] > logits[b] || (logits[a] == logits[b] && a < b);
  });
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

double sampling_uniform(uint64_t seed, int64_t position, int32_t id) {
  // Three chained rounds of splitmix64, one per key, so that neighbouring seeds, positions and ids
  // give unrelated streams; 53 bits, shifted off 0 and 1.
  const uint64_t h = splitmix64(splitmix64(splitmix64(seed) ^ uint64_t(position)) ^ uint64_t(uint32_t(id)));
  return (double(h >> 11) + 0.5) * 0x1.0p-53;
}

double gumbel_noise(uint64_t seed, int64_t position, int32_t id) {
  return -std::log(-std::log(sampling_uniform(seed, position, id)));
}

std::vector<float> logprobs_row(const float* logits, int64_t V, float temperature) {
  const float T = effective_temperature(temperature);
  std::vector<float> out(static_cast<size_t>(V));
  float m = -INFINITY;
  for (int64_t i = 0; i < V; i++) m = std::max(m, logits[i] / T);
  float s = 0.0f;  // fp32, ids in ascending order: one fixed order
  for (int64_t i = 0; i < V; i++) s += std::exp(logits[i] / T - m);
  const float lse = std::log(s);
  for (int64_t i = 0; i < V; i++) out[size_t(i)] = (logits[i] / T - m) - lse;
  return out;
}

float token_logprob(const float* logits, int64_t V, float temperature, int32_t token) {
  EPMOE_ASSERT(token >= 0 && token < V, "token_logprob: id " + std::to_string(token) + " outside the vocabulary");
  return logprobs_row(logits, V, temperature)[size_t(token)];
}

std::vector<std::pair<int32_t, float>> top_logprobs(const float* logits, int64_t V, float temperature, int n) {
  const std::vector<float> lp = logprobs_row(logits, V, temperature);
  const std::vector<int32_t> order = stable_order(logits, V);
  std::vector<std::pair<int32_t, float>> out;
  for (int i = 0; i < n && i < int(V); i++) out.push_back({order[size_t(i)], lp[size_t(order[size_t(i)])]});
  return out;
}

std::vector<int32_t> kept_ids(const float* logits, int64_t V, const SamplingParams& p) {
  if (p.temperature <= 0.0f) return {greedy(logits, V)};
  const std::vector<int32_t> order = stable_order(logits, V);
  size_t keep = order.size();
  if (p.top_k > 0) keep = std::min(keep, size_t(p.top_k));
  if (p.top_p < 1.0f || p.min_p > 0.0f) {
    // Probabilities of the full row, in double: the masks are decisions, not reported numbers.
    const double T = p.temperature, top = double(logits[order[0]]) / T;
    std::vector<double> e(order.size());
    double sum = 0;
    for (size_t i = 0; i < order.size(); i++) sum += (e[i] = std::exp(double(logits[order[i]]) / T - top));
    if (p.top_p < 1.0f) {
      double cum = 0;
      size_t i = 0;
      while (i < keep) {
        cum += e[i] / sum;
        i++;
        if (cum >= double(p.top_p)) break;
      }
      keep = i;
    }
    if (p.min_p > 0.0f) {
      size_t i = 0;
      while (i < keep && e[i] >= double(p.min_p)) i++;  // e[0] = 1 is p_max / p_max
      keep = std::max<size_t>(i, 1);
    }
  }
  std::vector<int32_t> ids(order.begin(), order.begin() + long(keep));
  std::sort(ids.begin(), ids.end());
  return ids;
}

int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, uint64_t seed, int64_t position) {
  if (p.temperature <= 0.0f) return greedy(logits, V);
  const std::vector<int32_t> ids = kept_ids(logits, V, p);
  int32_t best = -1;
  double best_score = -INFINITY;
  for (int32_t id : ids) {  // ascending: a tie (of measure zero) goes to the lower id
    const double score = double(logits[id]) / double(p.temperature) + gumbel_noise(seed, position, id);
    if (best < 0 || score > best_score) {
      best = id;
      best_score = score;
    }
  }
  return best;
}

uint64_t fresh_seed() {
  std::random_device rd;
  return (uint64_t(rd()) << 32) ^ uint64_t(rd());
}

}  // namespace epmoe
