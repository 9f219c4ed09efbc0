// The differential check: a backend's logits against the single-process reference, on the same
// sequences, as the numbers a user who trusts logprobs cares about.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "comm/group.h"
#include "ep/backend.h"
#include "model/language_model.h"

namespace epmoe {

// This rank's sequences and what the reference computed for them.
struct ReferenceRun {
  std::vector<uint64_t> ids;                     // sequence ids (index in the input)
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::vector<int32_t>> generated;   // reference greedy tokens (G each)
  std::vector<std::vector<float>> logits;        // over prompt + generated, [n, V]
  std::vector<std::vector<float>> logprobs;      // their log-softmax
};

struct BackendStats {
  double max_abs_dlogprob = 0;   // over every position of every sequence, all ranks
  double mean_abs_dlogprob = 0;
  bool identical = true;         // logits bit for bit
  int64_t greedy_agree = 0;      // generated tokens equal to the reference's, before the first miss
  int64_t greedy_total = 0;
  bool degenerate = false;       // output loops on one token where the reference does not
};

// log-softmax of each row of logits [n, V] (in double, stored as float).
std::vector<float> log_softmax_rows(const std::vector<float>& logits, int64_t V);

// Whether the tail of a generated sequence is a loop: one token repeated, or two alternating.
bool is_degenerate_tail(const std::vector<int32_t>& tokens);

// Each prompt followed by its reference greedy tokens: the sequences every backend is scored on.
std::vector<std::vector<int32_t>> full_sequences(const ReferenceRun& r);

// The reference for this rank's sequences: greedy generation with `gen_tokens` new tokens, then
// the logits of prompt + generation in one pass. Collective (the lockstep loop of engine/).
ReferenceRun run_reference(LanguageModel& model, A2ABackend& backend, Group& group, const std::vector<uint64_t>& ids,
                           const std::vector<std::vector<int32_t>>& prompts, int gen_tokens,
                           const ForwardOptions& fo = {});

// The backend on the same sequences: scored teacher-forced on the reference tokens (log-prob
// differences), and generating on its own (greedy agreement, degeneration). Collective.
BackendStats compare_backend(LanguageModel& model, A2ABackend& backend, Group& group, const ReferenceRun& ref,
                             int gen_tokens, const ForwardOptions& fo = {});

}  // namespace epmoe
