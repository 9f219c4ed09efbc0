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
#include "engine/scheduler.h"
#include "ep/backend.h"
#include "model/language_model.h"

namespace epmoe {

// The settings of generate(): the request-level ones (engine/scheduler.h RequestParams) apply to
// every request; the scheduler's (SchedulerOptions) to each rank's scheduler.
struct GenerateParams : RequestParams, SchedulerOptions {};

// Which of n inputs this rank serves: input i on rank i mod R (data-parallel attention).
std::vector<size_t> my_share(size_t n, const Group& group);

// Generation of this rank's requests (greedy or sampled, engine/sampling.h), in lockstep with
// the group, through the scheduler (engine/scheduler.h), with p's request-level settings for
// every request. The kernels are batch-invariant, so a request's tokens and log-probs do not
// depend on the scheduler's limits, the KV pool or the other requests. Returns one Generation per
// (request, sample), requests in the order of `mine`. on_token(i, id) is called as each token of
// result i is chosen (for streaming). A request no pool could hold is refused on every rank.
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

// Every rank's generations on every rank (collective): outs[i] lands at index ids[i] of the
// result (of `total`); log-probs keep their bits.
std::vector<Generation> gather_generations(Group& group, size_t total, const std::vector<uint64_t>& ids,
                                           const std::vector<Generation>& outs);

}  // namespace epmoe
