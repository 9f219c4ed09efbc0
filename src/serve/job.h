// One HTTP request as the engine runs it: what was asked (ServeRequest, parsed and validated by
// serve/protocol.h) and what has come out so far (Job), shared by the HTTP thread that waits on it
// and the engine thread that fills it. The engine writes under the job's mutex and notifies; the
// HTTP thread reads snapshots under the same mutex. Nothing here talks to other ranks.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "engine/scheduler.h"

namespace epmoe {

// A request after parsing: everything the engine needs, whichever API it came from.
struct ServeRequest {
  std::string rid;               // the client's id (sglang `rid`) or one we made
  std::vector<int32_t> prompt;   // token ids (text is encoded by the HTTP thread)
  RequestParams params;          // max_new_tokens, stop ids (eos unless ignore_eos), sampling, log-probs
  uint64_t seed = 0;             // sample j draws with seed + j
  bool seed_reported = false;    // sampled, or a seed was given: meta_info.sampling_seed is a number
  int n = 1;
  std::vector<std::string> stop_strings;  // generation ends once the text contains one
  bool skip_special_tokens = true;
  bool no_stop_trim = false;     // keep the matched stop string in the text
  bool internal = false;         // /health_generate's probe: not counted in the metrics
};

// What one sample has produced so far.
struct SampleProgress {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;                              // when asked
  std::vector<std::vector<std::pair<int32_t, float>>> top;  // when asked
  std::vector<std::vector<float>> ids_logprobs;             // token_ids_logprob: [tokens][ids]
  std::vector<std::vector<int32_t>> sampling_mask;          // return_sampling_mask: [tokens][support ids]
  std::string text;               // text safe to send: never a prefix of a stop string still growing
  std::vector<int64_t> text_offset;  // per token: characters of `text` before the token's own text
  bool done = false;
  FinishReason finish = FinishReason::Length;
  std::string matched_stop;          // the stop string matched, when one ended it
  std::optional<int32_t> matched_id; // the stop id, when one ended it
  std::vector<int32_t> routed_experts;  // when asked, once done: Generation::routed_experts
  std::vector<float> routed_weights;
};

class Job {
 public:
  explicit Job(ServeRequest r) : req(std::move(r)), start(std::chrono::steady_clock::now()) {}

  const ServeRequest req;
  const std::chrono::steady_clock::time_point start;

  // Engine side (under mu).
  enum class State { Pending, Accepted, Rejected, Done };
  std::mutex mu;
  std::condition_variable cv;
  State state = State::Pending;
  std::string error;                  // Rejected: why
  int error_status = 400;             // and the HTTP status (503 while shutting down)
  std::vector<SampleProgress> samples;
  std::vector<float> input_logprobs;  // prompt log-probs asked for (RequestParams::input_logprobs_from)
  std::vector<std::vector<std::pair<int32_t, float>>> input_top;  // and their top-N, when asked
  std::vector<std::vector<float>> input_ids_logprobs;              // and token_ids_logprob's
  int64_t cached_tokens = 0;
  std::string weight_version;         // of the weights that ran it
  double e2e_seconds = 0;
  uint64_t version = 0;               // bumped at every change, for waiters

  // Waits until the engine accepted or rejected the job; true when accepted.
  bool wait_accepted() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return state != State::Pending; });
    return state != State::Rejected;
  }
  // Waits until the job is done; false when `limit` passed first.
  bool wait_done(std::chrono::milliseconds limit) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, limit, [&] { return state == State::Done || state == State::Rejected; });
  }
};

using JobPtr = std::shared_ptr<Job>;

}  // namespace epmoe
