// What the HTTP handlers of `epmoe serve` share (http_server.cc, openai_routes.cc): JSON replies,
// the request body, submitting a call's jobs and waiting on them, and SSE streams.
#pragma once

#include <httplib.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "serve/protocol.h"
#include "serve/serve_engine.h"

namespace epmoe {

void send_json(httplib::Response& res, int status, const nlohmann::json& body);
void send_error(httplib::Response& res, int status, const std::string& message, const std::string& field = "");
// The body as JSON; an HttpError (400, field "body") when it is empty or malformed.
nlohmann::json parse_body(const httplib::Request& req);

// Submits every request of a call; when one is refused (the KV pool could never hold it), the
// others are aborted and the refusal is the answer.
std::vector<JobPtr> submit_all(ServeEngine& engine, const std::vector<ServeRequest>& reqs);
void wait_all(const std::vector<JobPtr>& jobs);

// The state of one SSE response across the calls of its content provider: what each sample has
// been sent so far.
struct StreamState {
  std::vector<JobPtr> jobs;
  std::vector<std::vector<size_t>> sent_tokens, sent_text;
  std::vector<std::vector<bool>> sent_role, sent_final, sent_ids;  // sent_ids: prompt_token_ids went out
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  bool finished = false;

  explicit StreamState(std::vector<JobPtr> j);
  bool all_done() const;
  // Waits (up to kPoll, 200 ms) for any job to change.
  void wait_change(std::vector<uint64_t>& seen);
};

bool write_event(httplib::DataSink& sink, StreamState& st, const std::string& data);

// A provider that runs `emit` (new events of every job, under their locks) until every sample is
// final, then writes [DONE]. A failed write means the client went away: its jobs are aborted (the
// releaser does it, as for any response that did not complete).
using Emit = std::function<bool(StreamState&, httplib::DataSink&, bool& wrote)>;

void stream_response(httplib::Response& res, ServeEngine& engine, std::shared_ptr<StreamState> st, Emit emit,
                     std::function<bool(StreamState&, httplib::DataSink&)> tail = {}, bool done_marker = true);

}  // namespace epmoe
