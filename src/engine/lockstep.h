// The one lockstep loop of the code base, for every device: each rank runs the sequences it
// serves, and every rank runs every step -- with no tokens once its own sequences are done --
// until no rank has work, because the MoE layers of a step are collective over the group.
// score, generate and check (reference and backends alike) all run through here.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "comm/group.h"
#include "ep/backend.h"
#include "model/language_model.h"

namespace epmoe {

struct GenerateRequest {
  uint64_t id = 0;  // index in the user's input
  std::vector<int32_t> prompt;
};

struct GenerateParams {
  int max_new_tokens = 16;
  std::vector<int> stop_ids;  // generation of a sequence ends after one of these (it is kept)
  ForwardOptions forward;
};

// Which of n inputs this rank serves: input i on rank i mod R (data-parallel attention).
std::vector<size_t> my_share(size_t n, const Group& group);

// Greedy generation of this rank's requests. Returns the new tokens of each request, in the order
// of `mine`. on_token(i, id) is called as each token of request i is chosen (for streaming).
std::vector<std::vector<int32_t>> generate_greedy(LanguageModel& model, A2ABackend& backend, Group& group,
                                                  const std::vector<GenerateRequest>& mine, const GenerateParams& p,
                                                  const std::function<void(size_t, int32_t)>& on_token = {});

// Logits at every position of this rank's sequences, in one teacher-forced step (every rank
// takes part, with or without sequences). Result i: [len_i, V].
std::vector<std::vector<float>> score_sequences(LanguageModel& model, A2ABackend& backend,
                                                const std::vector<uint64_t>& ids,
                                                const std::vector<std::vector<int32_t>>& seqs,
                                                const ForwardOptions& fo = {});

// Every rank's token lists, indexed by request id, on every rank (collective).
std::vector<std::vector<int32_t>> gather_results(Group& group, size_t total, const std::vector<GenerateRequest>& mine,
                                                 const std::vector<std::vector<int32_t>>& outs);

}  // namespace epmoe
