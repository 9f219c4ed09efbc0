// The one lockstep loop of the code base, for every device: each rank runs the sequences it
// serves, and every rank runs every step -- with no tokens once its own sequences are done --
// until no rank has work, because the MoE layers of a step are collective over the group.
// score, generate and check (reference and backends alike) all run through here.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/group.h"
#include "engine/sampling.h"
#include "ep/backend.h"
#include "model/language_model.h"

namespace epmoe {

struct GenerateRequest {
  uint64_t id = 0;  // index of the sequence in the user's input (feeds the token global ids)
  std::vector<int32_t> prompt;
  uint64_t seed = 0;  // the sampling seed of this sequence (unused when greedy)
};

struct GenerateParams {
  int max_new_tokens = 16;
  std::vector<int> stop_ids;  // generation of a sequence ends after one of these (it is kept)
  ForwardOptions forward;
  SamplingParams sampling;    // temperature 0: greedy
  bool logprobs = false;      // report each generated token's log-prob (engine/sampling.h)
  int top_logprobs = 0;       // and the N most likely ids at each step with theirs
  // The scheduler, per rank: tokens fed in one step (decode tokens first, then prefill chunks;
  // 0: unlimited) and sequences in flight at once (0: unlimited; the others wait in the queue).
  int64_t max_batch_tokens = 0;
  int max_running_requests = 0;
};

enum class FinishReason { Stop, Length };
const char* finish_reason_name(FinishReason r);

// What one sequence generated.
struct Generation {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;                                 // [tokens] when asked
  std::vector<std::vector<std::pair<int32_t, float>>> top;     // [tokens][N] when asked
  FinishReason finish = FinishReason::Length;
};

// Which of n inputs this rank serves: input i on rank i mod R (data-parallel attention).
std::vector<size_t> my_share(size_t n, const Group& group);

// Generation of this rank's requests (greedy or sampled, engine/sampling.h), in lockstep with
// the group, through a scheduler: requests are admitted in order while fewer than
// max_running_requests run; each step feeds the running sequences' decode tokens, then prefill
// chunks, up to max_batch_tokens (chunked prefill). The kernels are batch-invariant, so a
// request's tokens and log-probs do not depend on either limit or on the other requests. Returns one Generation per request, in the order of `mine`. on_token(i, id) is
// called as each token of request i is chosen (for streaming).
std::vector<Generation> generate(LanguageModel& model, A2ABackend& backend, Group& group,
                                 const std::vector<GenerateRequest>& mine, const GenerateParams& p,
                                 const std::function<void(size_t, int32_t)>& on_token = {});

// The tokens of generate() with greedy decoding.
std::vector<std::vector<int32_t>> generate_greedy(LanguageModel& model, A2ABackend& backend, Group& group,
                                                  const std::vector<GenerateRequest>& mine, const GenerateParams& p,
                                                  const std::function<void(size_t, int32_t)>& on_token = {});

// Logits at every position of this rank's sequences, in one teacher-forced step (every rank
// takes part, with or without sequences). Result i: [len_i, V].
std::vector<std::vector<float>> score_sequences(LanguageModel& model, A2ABackend& backend,
                                                const std::vector<uint64_t>& ids,
                                                const std::vector<std::vector<int32_t>>& seqs,
                                                const ForwardOptions& fo = {});

// Every rank's generations, indexed by request id, on every rank (collective); log-probs keep
// their bits.
std::vector<Generation> gather_generations(Group& group, size_t total, const std::vector<GenerateRequest>& mine,
                                           const std::vector<Generation>& outs);

}  // namespace epmoe
