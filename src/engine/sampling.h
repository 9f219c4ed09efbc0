// Sampling and log-probs: pure functions of (a logits row, the parameters, the seed, the absolute
// position), so that any rollout can be replayed from its seed and a token's log-prob does not
// depend on what else ran in the batch (the kernels are batch-invariant, the combine
// deterministic: the logits row itself is the same bits in any batch).
//
//   1. Mask: over a stable order (logit descending, id ascending), keep the top_k first, then the
//      smallest prefix whose probability reaches top_p, then the ids with p >= min_p * p_max
//      (p = softmax(logits / T) over the full vocabulary).
//   2. Draw: argmax over the kept ids of logits / T + Gumbel noise, the noise of (seed, position,
//      vocabulary id) from a counter-based hash -- keyed on the id, never on the sorted rank, so
//      masking does not move any id's noise. argmax(log p + g) samples softmax exactly. It is
//      computed as the equivalent exponential race (sampling.cc), which skips most ids' logs.
//   temperature 0: greedy (the largest logit, ties to the lower id), no noise, no masks.
//
// The reported log-prob of a token is log_softmax(logits / T)[token] over the full vocabulary, in
// fp32, in one fixed order (temperature 0 reports temperature 1's): the masks change what can be
// drawn, not the number a trainer recomputes.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace epmoe {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int top_k = -1;            // -1 (or 0): off
  float top_p = 1.0f;        // 1: off
  float min_p = 0.0f;        // 0: off
};

// InputError naming the flag for a value outside its range (temperature < 0, top_p outside (0, 1],
// min_p outside [0, 1], top_k < -1).
void validate(const SamplingParams& p);

// The token drawn from a logits row [V] at absolute position `position` of a sequence sampled
// with `seed`.
int32_t sample_token(const float* logits, int64_t V, const SamplingParams& p, uint64_t seed, int64_t position);

// log_softmax(logits / T) of one row (T = 1 when temperature is 0), its normaliser computed once
// in fp32 over the full row in id order: at(id) is then one subtraction, so a step that reports a
// token's log-prob and its top-N alternatives reads the row once.
class RowLogprobs {
 public:
  RowLogprobs(const float* logits, int64_t V, float temperature);
  float at(int32_t id) const;
  // The n most likely ids with their log-probs, in the stable order (logit descending, id ascending).
  std::vector<std::pair<int32_t, float>> top(int n) const;

 private:
  const float* logits_;
  int64_t V_;
  float T_, max_, lse_;
};

// log_softmax(logits / T)[token] (RowLogprobs(...).at(token)).
float token_logprob(const float* logits, int64_t V, float temperature, int32_t token);
// Every id's log-prob (the same numbers as token_logprob, all at once).
std::vector<float> logprobs_row(const float* logits, int64_t V, float temperature);
// The n most likely ids with their log-probs, in the stable order (log-prob descending, id ascending).
std::vector<std::pair<int32_t, float>> top_logprobs(const float* logits, int64_t V, float temperature, int n);

// The uniform variate in (0, 1) behind the noise of (seed, position, id), and the noise itself:
// -log(-log(u)). Exposed for tests.
double sampling_uniform(uint64_t seed, int64_t position, int32_t id);
double gumbel_noise(uint64_t seed, int64_t position, int32_t id);

// The ids a draw may return under p's masks, ascending (for tests and top-N reports).
std::vector<int32_t> kept_ids(const float* logits, int64_t V, const SamplingParams& p);

// A seed for a request that gave none (from the OS's entropy), to be reported back.
uint64_t fresh_seed();

}  // namespace epmoe
