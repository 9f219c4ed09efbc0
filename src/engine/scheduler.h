// The scheduler of one rank: continuous batching over the model's paged KV pool.
//
// Requests join (submit) and leave (finish, abort) at any step. Each step feeds, in this order:
//   1. one decode token of every running sample (the token chosen at the previous step);
//   2. prefill chunks of the requests admitted earlier whose prompt is not in yet;
//   3. newly admitted requests' prompts, in arrival order,
// up to max_batch_tokens (chunked prefill) and with at most max_running_requests sequences.
//
// Admission is by promise: a request enters when the pool can promise every block it may need
// (prompt + max_new_tokens, for each of its n samples), less the blocks of its longest cached
// prefix. Admitted requests therefore never run out of blocks and are never preempted; the ones
// behind wait in arrival order (never dropped), and one that could not fit in an empty pool is
// refused at submit with an InputError. The n samples of a request share the prompt's blocks: the
// prompt is computed once, each sample draws its first token from the same logits row, and the
// samples fork the prompt's cache (copy on write at the first block they write differently).
//
// Lockstep: the MoE layers of a step are collective over the group, so step() runs the model on
// every rank while any rank has work, with no tokens on a rank that has none.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/group.h"
#include "engine/sampling.h"
#include "ep/backend.h"
#include "model/language_model.h"

namespace epmoe {

// What a request asks of generation.
struct RequestParams {
  int max_new_tokens = 16;
  std::vector<int> stop_ids;  // generation of a sample ends after one of these (it is kept)
  SamplingParams sampling;    // temperature 0: greedy
  bool logprobs = false;      // report each generated token's log-prob (engine/sampling.h)
  int top_logprobs = 0;       // and the N most likely ids at each step with theirs
  // Prompt log-probs (sglang's logprob_start_len): -1 none; k >= 0: the log-prob of every prompt
  // token at position >= max(k, 1) given the tokens before it, at the request's temperature (the
  // numbers `logprobs` reports for generated tokens, so a re-scored rollout gives its own bits).
  // The positions they need are computed even when their blocks are in the prefix cache.
  int input_logprobs_from = -1;
  // sglang's token_ids_logprob: these ids' log-probs at every generated position (and, with
  // input_logprobs_from, at every prompt position reported), whatever was drawn.
  std::vector<int32_t> logprob_ids;
  // Routing replay (R3, sglang's return_routed_experts): record the routing of every token the
  // sample's sequence feeds (its whole prompt -- never from the prefix cache -- and every
  // generated token but the last). Both devices.
  bool routed_experts = false;
  // The sampling mask (sglang's / vLLM's return_sampling_mask): with each generated token, the ids
  // its draw could have picked -- kept_ids of the row the draw saw (top_k, top_p, min_p; greedy:
  // the one id) -- so a trainer can renormalise its log-probs over the same support. A sampled
  // request must bound the support with top_k <= kMaxSamplingMaskIds (submit refuses otherwise).
  bool sampling_mask = false;
  // Penalties, logit bias, a minimum length (engine/sampling.h): what the draws see, never the
  // log-probs reported.
  LogitProcessing processing;
  // Of the prompt's last tokens, how many this sample generated before a retract (serve): they
  // count as output for the penalties and min_new_tokens, so a continued sample draws what it
  // would have drawn never paused.
  int prior_output = 0;
};
// (serve sends every field of RequestParams to the rank that runs the request: a field added here
// is added to its field list in serve_engine.cc.)

struct GenerateRequest {
  uint64_t id = 0;  // sample j's sequence id is id + j (feeds the token global ids)
  std::vector<int32_t> prompt;
  uint64_t seed = 0;  // sample j samples with seed + j (unused when greedy)
  int n = 1;          // samples of this prompt
  RequestParams params;
};

enum class FinishReason { Stop, Length, Abort };
const char* finish_reason_name(FinishReason r);

// What one sample generated.
struct Generation {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;                                 // [tokens] when asked
  std::vector<std::vector<std::pair<int32_t, float>>> top;     // [tokens][N] when asked
  FinishReason finish = FinishReason::Length;
  int64_t cached_tokens = 0;  // prompt tokens found in the prefix cache instead of computed
  // With input_logprobs_from = k >= 0: the prompt tokens' log-probs from position max(k, 1) on.
  std::vector<float> input_logprobs;
  // With top_logprobs N > 0 as well: the N most likely ids at each of those prompt positions.
  std::vector<std::vector<std::pair<int32_t, float>>> input_top;
  // With logprob_ids: their log-probs at each generated token [tokens][ids] and at each prompt
  // position of input_logprobs [positions][ids].
  std::vector<std::vector<float>> ids_logprobs, input_ids_logprobs;
  // With routed_experts: per fed token (prompt + tokens - 1, in order) and MoE layer, the top-k
  // logical experts and their fp32 weights: [fed][moe layers][top_k] (StepRouting's layout).
  std::vector<int32_t> routed_experts;
  std::vector<float> routed_weights;
  // With sampling_mask: [tokens][ids of the support, ascending].
  std::vector<std::vector<int32_t>> sampling_mask;
};

// The most ids a sampling mask may hold (the top_k a sampled request that asks for one must set).
constexpr int kMaxSamplingMaskIds = 1024;

struct SchedulerOptions {
  ForwardOptions forward;
  int64_t max_batch_tokens = 0;  // tokens fed in one step (0: unlimited)
  int max_running_requests = 0;  // sequences in flight (0: unlimited)
  bool prefix_cache = true;      // reuse cached prompt blocks across requests
};

// Counters of the steps run (for benchmarks and /metrics).
struct SchedulerStats {
  int64_t steps = 0, prefill_tokens = 0, decode_tokens = 0;
  double step_seconds = 0;     // whole steps: scheduling, paging, the forward, sampling
  double forward_seconds = 0;  // the model's forward alone
};

class Scheduler {
 public:
  Scheduler(LanguageModel& model, A2ABackend& backend, Group& group, const SchedulerOptions& opt);
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Queues a request; returns its handle. InputError if it could never fit in the KV pool.
  size_t submit(GenerateRequest r);
  // Ends a request now (queued or running): its samples finish with Abort, its blocks go back
  // (from on_token: at the end of the step). Samples already finished keep their reason.
  void abort(size_t handle);
  // Sample `sample` of `handle` ends with Stop after the token chosen last (a stop string the
  // caller matched in its text). From on_token, or between steps (the token chosen at the last
  // step is then never fed: the same tokens as a stop from on_token). No effect on a sample or
  // request that has ended.
  void stop_sample(size_t handle, int sample);
  // Drops what a finished request holds (prompt, results); its handle must not be used again.
  // A long-running caller (serve) calls it once it has read the results.
  void forget(size_t handle);

  // One lockstep step (collective). False when no rank had work, and nothing ran.
  bool step();
  // Steps until no rank has work.
  void run();

  bool has_work() const;                       // this rank's: queued or running requests
  bool finished(size_t handle) const;
  const std::vector<Generation>& results(size_t handle) const;  // one per sample
  const SchedulerStats& stats() const { return stats_; }
  size_t queued() const;
  size_t running_sequences() const;

  // Called as each token is chosen: (handle, sample, token).
  std::function<void(size_t, int, int32_t)> on_token;

 private:
  enum class State { Queued, Running, Done };
  struct Sample {
    Sequence seq;
    int32_t pending = -1;  // the token chosen last, fed by the next step
    bool done = false;
    bool stop_now = false;  // stop_sample() during on_token
  };
  struct Entry {
    GenerateRequest req;
    State state = State::Queued;
    size_t fed = 0;            // prompt tokens in the cache (or in this step)
    std::vector<Sample> samples;  // sample 0 only until the prompt is in
    std::vector<Generation> out;
    int64_t fork_blocks = 0;   // blocks promised to each fork
  };
  // One step in three phases; step() is plan -> (any rank has work?) -> forward -> apply.
  struct StepPlan;
  struct StepOutput;
  // Chooses what each sample feeds this step (decode tokens, then prefill chunks, admitting queued
  // requests while blocks and the token budget allow) and the choices it will make; no model call.
  StepPlan plan();
  // The one collective model call over the planned batch (device draws land in the plan's picks).
  StepOutput forward(StepPlan& sp);
  // Records what the forward gave: routing, forks, prompt log-probs, tokens with their log-probs,
  // stops and finishes (on_token as each token is chosen), aborts asked for during the step.
  void apply(StepPlan& sp, StepOutput& out);
  // Parts of apply: the routing of the requests that record it; the prompt log-probs asked for.
  void record_routing(const StepPlan& sp, const StepRouting& routing);
  void record_prompt_logprobs(const StepPlan& sp, const std::vector<std::vector<float>>& logits);
  bool admit(size_t h);
  void choose(size_t h, int sample, int32_t token, float logprob, std::vector<std::pair<int32_t, float>> top);
  void finish_if_done(Entry& e);

  LanguageModel& model_;
  A2ABackend& backend_;
  Group& group_;
  SchedulerOptions opt_;
  std::vector<Entry> entries_;
  std::vector<size_t> running_;  // handles in admission order
  size_t next_queued_ = 0;       // entries_ before it were admitted (or aborted)
  bool in_step_ = false;         // choosing tokens: aborts wait for the end of the step
  std::vector<size_t> aborted_;
  SchedulerStats stats_;
};

}  // namespace epmoe
