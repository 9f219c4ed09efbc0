#include "serve/http_util.h"

#include <mutex>

namespace epmoe {

using nlohmann::json;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(200);  // how often a waiting handler looks up
constexpr double kKeepAliveSeconds = 5.0;               // an SSE comment while nothing comes out

}  // namespace

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& field) {
  send_json(res, status, error_body(status, message, field));
}

json parse_body(const httplib::Request& req) {
  if (req.body.empty()) throw HttpError(400, "body", "body: empty; a JSON object is expected");
  try {
    return json::parse(req.body);
  } catch (const json::parse_error& e) {
    throw HttpError(400, "body", std::string("body: malformed JSON: ") + e.what());
  }
}

std::vector<JobPtr> submit_all(ServeEngine& engine, const std::vector<ServeRequest>& reqs) {
  std::vector<JobPtr> jobs;
  for (const ServeRequest& r : reqs) {
    jobs.push_back(std::make_shared<Job>(r));
    engine.submit(jobs.back());
  }
  std::string refused;
  int status = 400;
  for (auto& j : jobs)
    if (!j->wait_accepted() && refused.empty()) {
      refused = j->error;
      status = j->error_status;
    }
  if (!refused.empty()) {
    for (auto& j : jobs)
      if (j->state != Job::State::Rejected) engine.abort_job(j);
    throw HttpError(status, status == 400 ? "max_new_tokens" : "", refused);
  }
  return jobs;
}

void wait_all(const std::vector<JobPtr>& jobs) {
  for (auto& j : jobs)
    while (!j->wait_done(std::chrono::seconds(1))) {
    }
}

StreamState::StreamState(std::vector<JobPtr> j) : jobs(std::move(j)) {
  for (auto& job : jobs) {
    const size_t n = size_t(job->req.n);
    sent_tokens.emplace_back(n, 0);
    sent_text.emplace_back(n, 0);
    sent_role.emplace_back(n, false);
    sent_final.emplace_back(n, false);
    sent_ids.emplace_back(n, false);
  }
}

bool StreamState::all_done() const {
  for (size_t p = 0; p < jobs.size(); p++)
    for (size_t j = 0; j < sent_final[p].size(); j++)
      if (!sent_final[p][j]) return false;
  return true;
}

void StreamState::wait_change(std::vector<uint64_t>& seen) {
  const auto until = std::chrono::steady_clock::now() + kPoll;
  for (size_t p = 0; p < jobs.size(); p++) {
    std::unique_lock<std::mutex> lock(jobs[p]->mu);
    if (jobs[p]->version != seen[p]) return;
  }
  // Wait on the first unfinished job; the others are looked at on the next round.
  for (size_t p = 0; p < jobs.size(); p++) {
    std::unique_lock<std::mutex> lock(jobs[p]->mu);
    if (jobs[p]->state == Job::State::Done) continue;
    jobs[p]->cv.wait_until(lock, until, [&] { return jobs[p]->version != seen[p]; });
    return;
  }
}

bool write_event(httplib::DataSink& sink, StreamState& st, const std::string& data) {
  const std::string ev = "data: " + data + "\n\n";
  st.last_write = std::chrono::steady_clock::now();
  return sink.write(ev.data(), ev.size());
}

void stream_response(httplib::Response& res, ServeEngine& engine, std::shared_ptr<StreamState> st, Emit emit,
                     std::function<bool(StreamState&, httplib::DataSink&)> tail, bool done_marker) {
  auto seen = std::make_shared<std::vector<uint64_t>>(st->jobs.size(), ~uint64_t(0));
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [st, seen, emit, tail, done_marker](size_t, httplib::DataSink& sink) {
        if (st->finished) return false;
        st->wait_change(*seen);
        for (size_t p = 0; p < st->jobs.size(); p++) {
          std::lock_guard<std::mutex> lock(st->jobs[p]->mu);
          (*seen)[p] = st->jobs[p]->version;
        }
        bool wrote = false;
        if (!emit(*st, sink, wrote)) return false;
        if (st->all_done()) {
          if (tail && !tail(*st, sink)) return false;
          const std::string done = "data: [DONE]\n\n";
          if (done_marker && !sink.write(done.data(), done.size())) return false;
          st->finished = true;
          sink.done();
          return true;
        }
        // Nothing new for a while: a comment line, which also finds a client that went away.
        if (!wrote && std::chrono::duration<double>(std::chrono::steady_clock::now() - st->last_write).count() >
                          kKeepAliveSeconds) {
          const std::string ka = ": keep-alive\n\n";
          st->last_write = std::chrono::steady_clock::now();
          if (!sink.write(ka.data(), ka.size())) return false;
        }
        return true;
      },
      [st, &engine](bool success) {
        if (success && st->finished) return;
        for (auto& j : st->jobs) {
          bool done;
          {
            std::lock_guard<std::mutex> lock(j->mu);
            done = j->state == Job::State::Done;
          }
          if (!done) engine.abort_job(j);
        }
      });
}

}  // namespace epmoe
