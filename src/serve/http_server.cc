#include "serve/http_server.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>

#include <sys/socket.h>

#include "util/error.h"

namespace epmoe {

using nlohmann::json;

namespace {

constexpr auto kPoll = std::chrono::milliseconds(200);  // how often a waiting handler looks up
constexpr double kKeepAliveSeconds = 5.0;               // an SSE comment while nothing comes out

void send_json(httplib::Response& res, int status, const json& body) {
  res.status = status;
  res.set_content(dump_json(body), "application/json");
}

void send_error(httplib::Response& res, int status, const std::string& message, const std::string& field = "") {
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

// Submits every request of a call; when one is refused (the KV pool could never hold it), the
// others are aborted and the refusal is the answer.
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

// The state of one SSE response across the calls of its content provider: what each sample has
// been sent so far.
struct StreamState {
  std::vector<JobPtr> jobs;
  std::vector<std::vector<size_t>> sent_tokens, sent_text;
  std::vector<std::vector<bool>> sent_role, sent_final, sent_ids;  // sent_ids: prompt_token_ids went out
  std::chrono::steady_clock::time_point last_write = std::chrono::steady_clock::now();
  bool finished = false;

  explicit StreamState(std::vector<JobPtr> j) : jobs(std::move(j)) {
    for (auto& job : jobs) {
      const size_t n = size_t(job->req.n);
      sent_tokens.emplace_back(n, 0);
      sent_text.emplace_back(n, 0);
      sent_role.emplace_back(n, false);
      sent_final.emplace_back(n, false);
      sent_ids.emplace_back(n, false);
    }
  }
  bool all_done() const {
    for (size_t p = 0; p < jobs.size(); p++)
      for (size_t j = 0; j < sent_final[p].size(); j++)
        if (!sent_final[p][j]) return false;
    return true;
  }
  // Waits (up to kPoll) for any job to change.
  void wait_change(std::vector<uint64_t>& seen) {
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
};

bool write_event(httplib::DataSink& sink, StreamState& st, const std::string& data) {
  const std::string ev = "data: " + data + "\n\n";
  st.last_write = std::chrono::steady_clock::now();
  return sink.write(ev.data(), ev.size());
}

// A provider that runs `emit` (new events of every job, under their locks) until every sample is
// final, then writes [DONE]. A failed write means the client went away: its jobs are aborted (the
// releaser does it, as for any response that did not complete).
using Emit = std::function<bool(StreamState&, httplib::DataSink&, bool& wrote)>;

void stream_response(httplib::Response& res, ServeEngine& engine, std::shared_ptr<StreamState> st, Emit emit,
                     std::function<bool(StreamState&, httplib::DataSink&)> tail = {}, bool done_marker = true) {
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

std::string prometheus(const ServeMetrics& m, const std::string& model) {
  std::string out;
  auto metric = [&](const char* name, const char* type, const char* help, const std::string& labels, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + "{model=\"" +
           model + "\"" + labels + "} " + buf + "\n";
  };
  auto more = [&](const char* name, const std::string& labels, double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g", v);
    out += std::string(name) + "{model=\"" + model + "\"" + labels + "} " + buf + "\n";
  };
  metric("epmoe_requests_total", "counter", "Requests by outcome", ",outcome=\"finished\"", double(m.requests_finished));
  more("epmoe_requests_total", ",outcome=\"aborted\"", double(m.requests_aborted));
  more("epmoe_requests_total", ",outcome=\"rejected\"", double(m.requests_rejected));
  metric("epmoe_requests_received_total", "counter", "Requests received", "", double(m.requests_received));
  metric("epmoe_prompt_tokens_total", "counter", "Prompt tokens of admitted requests", "", double(m.prompt_tokens));
  metric("epmoe_generation_tokens_total", "counter", "Tokens generated", "", double(m.generation_tokens));
  metric("epmoe_cached_tokens_total", "counter", "Prompt tokens found in the prefix cache", "", double(m.cached_tokens));
  metric("epmoe_queue_requests", "gauge", "Requests waiting for admission", "", double(m.waiting));
  metric("epmoe_running_sequences", "gauge", "Sequences being generated", "", double(m.running));
  metric("epmoe_kv_blocks", "gauge", "KV cache blocks by state", ",state=\"used\"", double(m.kv_blocks_used));
  more("epmoe_kv_blocks", ",state=\"cached\"", double(m.kv_blocks_cached));
  more("epmoe_kv_blocks", ",state=\"total\"", double(m.kv_blocks_total));
  metric("epmoe_kv_block_tokens", "gauge", "Positions per KV block", "", double(m.kv_block_tokens));
  metric("epmoe_steps_total", "counter", "Engine steps run", "", double(m.steps));
  metric("epmoe_step_seconds_total", "counter", "Seconds in engine steps", "", m.step_seconds);
  metric("epmoe_forward_seconds_total", "counter", "Seconds in the model's forward", "", m.forward_seconds);
  metric("epmoe_paused", "gauge", "1 while generation is paused", "", m.paused ? 1.0 : 0.0);
  // Per rank (data-parallel attention: each rank serves its own requests).
  const struct {
    const char *name, *type, *help;
    int64_t RankLoad::*field;
  } per_rank[] = {
      {"epmoe_rank_requests_total", "counter", "Requests given to each rank", &RankLoad::requests},
      {"epmoe_rank_queue_requests", "gauge", "Requests queued in each rank's scheduler", &RankLoad::waiting},
      {"epmoe_rank_running_sequences", "gauge", "Sequences each rank is generating", &RankLoad::running},
      {"epmoe_rank_kv_blocks_used", "gauge", "KV cache blocks in use on each rank", &RankLoad::kv_blocks_used},
  };
  for (const auto& f : per_rank)
    for (size_t r = 0; r < m.ranks.size(); r++) {
      const std::string labels = ",rank=\"" + std::to_string(r) + "\"";
      if (r == 0) metric(f.name, f.type, f.help, labels, double(m.ranks[r].*f.field));
      else more(f.name, labels, double(m.ranks[r].*f.field));
    }
  return out;
}

}  // namespace

HttpServer::HttpServer(ServeEngine& engine, ServedModel model, HttpOptions opt)
    : engine_(engine), model_(std::move(model)), opt_(std::move(opt)), svr_(std::make_unique<httplib::Server>()) {
  routes();
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::start() {
  // cpp-httplib (Debian's 0.11) listens with a backlog of 5: a burst of clients connecting at once
  // (an RL rollout opens hundreds) would see resets. The socket is taken as it is created, and
  // listen() again after the bind raises the backlog (Linux allows it on a listening socket).
  int listen_fd = -1;
  svr_->set_socket_options([&listen_fd](int sock) {
    // Not httplib's default (SO_REUSEPORT only): that lets a second server bind a port a live one
    // listens on (the two then share its connections), and without SO_REUSEADDR a port whose
    // earlier connections are in TIME_WAIT (a server just restarted on it) cannot be bound.
    const int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listen_fd = int(sock);
  });
  port_ = opt_.port;
  bool ok;
  if (opt_.port == 0) {
    port_ = svr_->bind_to_any_port(opt_.host);
    ok = port_ > 0;
  } else {
    ok = svr_->bind_to_port(opt_.host, opt_.port);
  }
  if (!ok)
    throw InputError("serve: cannot listen on " + opt_.host + ":" + std::to_string(opt_.port) +
                     " (address in use, or not an address of this machine)");
  if (listen_fd >= 0) ::listen(listen_fd, SOMAXCONN);
  thread_ = std::thread([this] { svr_->listen_after_bind(); });
}

void HttpServer::stop() {
  if (svr_) svr_->stop();
  if (thread_.joinable()) thread_.join();
}

void HttpServer::routes() {
  httplib::Server& s = *svr_;
  const int threads = opt_.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  s.set_payload_max_length(opt_.max_body_bytes);
  const auto io = std::chrono::duration<double>(opt_.io_timeout);
  s.set_read_timeout(std::chrono::duration_cast<std::chrono::microseconds>(io));
  s.set_write_timeout(std::chrono::duration_cast<std::chrono::microseconds>(io));
  s.set_keep_alive_timeout(5);

  // CORS, so that a web page of another origin (a browser playground, the AI SDK in a browser) can
  // call the server: every response allows any origin, and a preflight (OPTIONS with the method
  // and headers the real request will use) is answered 204 before the key check -- browsers send
  // preflights without credentials, so asking the key there would make the key unusable from a page.
  // The key still guards every real request.
  s.set_default_headers({{"Access-Control-Allow-Origin", "*"}});
  // The key, when one is set: every endpoint but /health.
  s.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.method == "OPTIONS") {
      res.status = 204;
      res.set_header("Access-Control-Allow-Methods", "GET, POST, OPTIONS");
      const std::string asked = req.get_header_value("Access-Control-Request-Headers");
      res.set_header("Access-Control-Allow-Headers", asked.empty() ? "Authorization, Content-Type, X-API-Key" : asked);
      res.set_header("Access-Control-Max-Age", "86400");
      return httplib::Server::HandlerResponse::Handled;
    }
    if (opt_.api_key.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    const std::string key = req.get_header_value("X-API-Key");
    if (auth == "Bearer " + opt_.api_key || key == opt_.api_key) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, 401, auth.empty() && key.empty() ? "missing API key (Authorization: Bearer KEY)" : "wrong API key");
    return httplib::Server::HandlerResponse::Handled;
  });
  // Errors httplib finds itself (no such route, body over the limit) as JSON.
  s.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    if (res.status == 413) {
      send_error(res, 400, "body: larger than the limit of " + std::to_string(opt_.max_body_bytes) + " bytes", "body");
    } else if (res.status == 404) {
      send_error(res, 404, "no endpoint " + req.method + " " + req.path);
    } else {
      send_error(res, res.status, "HTTP error " + std::to_string(res.status));
    }
    return httplib::Server::HandlerResponse::Handled;
  }));
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    try {
      std::rethrow_exception(ep);
    } catch (const HttpError& e) {
      send_error(res, e.status, e.what(), e.field);
    } catch (const InputError& e) {
      send_error(res, 400, e.what());
    } catch (const std::exception& e) {
      send_error(res, 500, std::string("internal error: ") + e.what());
    } catch (...) {
      send_error(res, 500, "internal error");
    }
  });

  // ---- control ----
  s.Get("/health", [](const httplib::Request&, httplib::Response& res) { res.set_content("", "text/plain"); });
  s.Get("/health_generate", [this](const httplib::Request&, httplib::Response& res) {
    ServeRequest r;
    r.rid = "health_generate";
    r.prompt = {0};
    r.params.max_new_tokens = 1;
    r.params.sampling.temperature = 0;
    r.internal = true;
    auto job = std::make_shared<Job>(r);
    engine_.submit(job);
    if (!job->wait_done(std::chrono::seconds(60))) {
      engine_.abort_job(job);
      send_error(res, 503, "no token within 60 s (paused, or the engine is stuck)");
      return;
    }
    std::lock_guard<std::mutex> lock(job->mu);
    if (job->state != Job::State::Done || job->samples.empty() || job->samples[0].tokens.empty()) {
      send_error(res, 503, job->error.empty() ? "generation is paused or was aborted" : job->error);
      return;
    }
    res.set_content("", "text/plain");
  });
  auto model_info = [this](const httplib::Request&, httplib::Response& res) {
    const ModelConfig& c = engine_.config();
    send_json(res, 200,
              {{"model_path", engine_.model_path()},
               {"tokenizer_path", model_.tokenizer ? json(model_.path) : json(nullptr)},
               {"served_model_name", model_.name},
               {"is_generation", true},
               {"weight_version", engine_.weight_version()},
               {"model_type", c.model_type},
               {"vocab_size", c.vocab_size},
               {"max_position_embeddings", c.max_position_embeddings},
               {"eos_token_ids", c.eos_token_ids}});
  };
  s.Get("/model_info", model_info);
  s.Get("/get_model_info", model_info);
  auto server_info = [this](const httplib::Request&, httplib::Response& res) {
    const ServeMetrics m = engine_.metrics();
    send_json(res, 200,
              {{"version", "epmoe"},
               {"model_path", engine_.model_path()},
               {"served_model_name", model_.name},
               {"weight_version", m.weight_version},
               {"paused", m.paused},
               {"kv_cache_blocks", m.kv_blocks_total},
               {"kv_block_tokens", m.kv_block_tokens},
               {"max_total_num_tokens", m.kv_blocks_total * m.kv_block_tokens},
               {"running_sequences", m.running},
               {"waiting_requests", m.waiting}});
  };
  s.Get("/get_weight_version", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"weight_version", engine_.weight_version()}});
  });
  s.Get("/server_info", server_info);
  s.Get("/get_server_info", server_info);
  // sglang's load report, one entry per data-parallel rank (one: rank 0 holds every sequence):
  // requests running and waiting, KV positions in use and their share of the pool.
  // One entry per rank, as sglang's data-parallel ranks (each rank serves its own requests).
  auto loads = [this](const httplib::Request&, httplib::Response& res) {
    const ServeMetrics m = engine_.metrics();
    json all = json::array();
    for (size_t r = 0; r < m.ranks.size(); r++) {
      const RankLoad& l = m.ranks[r];
      const int64_t used = l.kv_blocks_used * m.kv_block_tokens, total = l.kv_blocks_total * m.kv_block_tokens;
      all.push_back({{"dp_rank", r},
                     {"num_reqs", l.running + l.waiting},
                     {"num_running_reqs", l.running},
                     {"num_waiting_reqs", l.waiting},
                     {"num_tokens", used},
                     {"max_total_num_tokens", total},
                     {"token_usage", total > 0 ? double(used) / double(total) : 0.0},
                     {"num_requests_total", l.requests}});
    }
    send_json(res, 200, {{"loads", std::move(all)}});
  };
  s.Get("/v1/loads", loads);
  s.Get("/get_loads", loads);
  s.Post("/abort_request", [this](const httplib::Request& req, httplib::Response& res) {
    const json b = parse_body(req);
    if (!b.is_object()) throw HttpError(400, "body", "body: must be a JSON object");
    if (b.value("abort_all", false)) {
      engine_.abort_all();
    } else if (b.contains("rid") && b["rid"].is_string()) {
      engine_.abort(b["rid"].get<std::string>());
    } else {
      throw HttpError(400, "rid", "rid: give a request id (string) or abort_all: true");
    }
    send_json(res, 200, {{"success", true}});
  });
  auto flush = [this](const httplib::Request&, httplib::Response& res) {
    const ControlReply r = engine_.flush_cache();
    send_json(res, 200, {{"success", r.ok}, {"message", r.message}});
  };
  s.Post("/flush_cache", flush);
  s.Get("/flush_cache", flush);
  s.Post("/pause_generation", [this](const httplib::Request& req, httplib::Response& res) {
    std::string mode = "abort";
    if (!req.body.empty()) {
      const json b = parse_body(req);
      if (b.is_object() && b.contains("mode")) {
        if (!b["mode"].is_string()) throw HttpError(400, "mode", "mode: must be abort, in_place or retract");
        mode = b["mode"].get<std::string>();
      }
    }
    const ControlReply r = engine_.pause(mode);
    if (!r.ok) throw HttpError(400, "mode", r.message);
    send_json(res, 200, {{"success", true}, {"message", r.message}});
  });
  s.Post("/continue_generation", [this](const httplib::Request&, httplib::Response& res) {
    const ControlReply r = engine_.resume();
    send_json(res, 200, {{"success", r.ok}, {"message", r.message}});
  });
  // The trainer's weights without disk: the body is a safetensors file's bytes (a bucket of at
  // most --max-body-mb); ?commit=false stages it, the default applies everything staged once the
  // requests in flight are done; ?weight_version=V names the new weights.
  s.Post("/update_weights_from_safetensors", [this](const httplib::Request& req, httplib::Response& res,
                                                     const httplib::ContentReader& read) {
    const std::string commit = req.has_param("commit") ? req.get_param_value("commit") : "true";
    if (commit != "true" && commit != "false") throw HttpError(400, "commit", "commit: must be true or false");
    const std::string version = req.has_param("weight_version") ? req.get_param_value("weight_version") : "";
    // The body read into one buffer of its announced size (GBs of weights: no regrowth).
    std::string body;
    if (req.has_header("Content-Length"))
      body.reserve(std::min<size_t>(size_t(std::stoull(req.get_header_value("Content-Length"))), opt_.max_body_bytes));
    read([&](const char* data, size_t n) {
      body.append(data, n);
      return true;
    });
    const ControlReply r = engine_.update_weights_from_bytes(std::move(body), commit == "true", version);
    if (!r.ok) throw HttpError(400, "body", r.message);
    send_json(res, 200, {{"success", true}, {"message", r.message}, {"weight_version", engine_.weight_version()}});
  });
  s.Post("/update_weights_from_disk", [this](const httplib::Request& req, httplib::Response& res) {
    const UpdateFromDisk u = parse_update_from_disk(parse_body(req));
    // abort_all_requests: the requests in flight end now (finish reason abort) instead of
    // finishing on the old weights first.
    if (u.abort_all_requests) engine_.abort_all();
    const ControlReply r = engine_.update_weights(u.model_path, u.weight_version);
    if (!r.ok) {
      json body = error_body(400, "model_path: " + r.message, "model_path");
      body["success"] = false;
      body["message"] = r.message;
      send_json(res, 400, body);
      return;
    }
    send_json(res, 200, {{"success", true}, {"message", r.message}, {"weight_version", engine_.weight_version()},
                         {"num_paused_requests", 0}});
  });
  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus(engine_.metrics(), model_.name), "text/plain; version=0.0.4");
  });

  // ---- sglang native ----
  s.Post("/generate", [this](const httplib::Request& req, httplib::Response& res) {
    const json body = parse_body(req);
    auto call = std::make_shared<NativeCall>(parse_generate(body, model_));
    std::vector<JobPtr> jobs = submit_all(engine_, call->requests);
    if (!call->stream) {
      wait_all(jobs);
      json out = json::array();
      for (size_t p = 0; p < jobs.size(); p++) {
        std::lock_guard<std::mutex> lock(jobs[p]->mu);
        for (size_t k = 0; k < jobs[p]->samples.size(); k++)
          out.push_back(native_result(*jobs[p], k, *call, model_, out.size()));
      }
      send_json(res, 200, out.size() == 1 && !call->batch ? out[0] : out);
      return;
    }
    // Streamed: an event whenever a sample has new tokens (text and ids so far, as sglang sends).
    auto st = std::make_shared<StreamState>(jobs);
    const ServedModel& m = model_;
    stream_response(res, engine_, st, [call, &m](StreamState& st, httplib::DataSink& sink, bool& wrote) {
      for (size_t p = 0; p < st.jobs.size(); p++) {
        Job& job = *st.jobs[p];
        std::string ev;
        for (size_t k = 0; k < st.sent_final[p].size(); k++) {
          {
            std::lock_guard<std::mutex> lock(job.mu);
            if (job.samples.size() <= k) continue;
            const SampleProgress& s = job.samples[k];
            const bool final_now = s.done && job.state == Job::State::Done;
            if (st.sent_final[p][k] || (!final_now && s.tokens.size() == st.sent_tokens[p][k])) continue;
            ev = dump_json(native_result(job, k, *call, m, p * size_t(job.req.n) + k));
            st.sent_tokens[p][k] = s.tokens.size();
            st.sent_final[p][k] = final_now;
          }
          wrote = true;
          if (!write_event(sink, st, ev)) return false;
        }
      }
      return true;
    });
  });

  // ---- tokenizer (sglang's /tokenize and /detokenize, also under /v1) ----
  auto tokenize_route = [this](const httplib::Request& req, httplib::Response& res) {
    send_json(res, 200, tokenize(parse_body(req), model_));
  };
  auto detokenize_route = [this](const httplib::Request& req, httplib::Response& res) {
    send_json(res, 200, detokenize(parse_body(req), model_));
  };
  s.Post("/tokenize", tokenize_route);
  s.Post("/v1/tokenize", tokenize_route);
  s.Post("/detokenize", detokenize_route);
  s.Post("/v1/detokenize", detokenize_route);

  // ---- OpenAI ----
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, {{"object", "list"}, {"data", json::array({model_card(model_)})}});
  });
  // One model by id (the served name, or its path as /v1/models' `root`); OpenAI's 404 otherwise.
  s.Get(R"(/v1/models/(.+))", [this](const httplib::Request& req, httplib::Response& res) {
    const std::string id = req.matches[1];
    if (id == model_.name || id == model_.path) {
      send_json(res, 200, model_card(model_));
      return;
    }
    json e = error_body(404, "The model '" + id + "' does not exist (this server serves '" + model_.name + "')", "model");
    e["error"]["type"] = "invalid_request_error";
    e["error"]["code"] = "model_not_found";
    send_json(res, 404, e);
  });
  auto openai = [this](const httplib::Request& req, httplib::Response& res, bool chat) {
    const json body = parse_body(req);
    auto call = std::make_shared<OpenAICall>(chat ? parse_chat(body, model_) : parse_completion(body, model_));
    std::vector<JobPtr> jobs = submit_all(engine_, call->requests);
    if (!call->stream) {
      wait_all(jobs);
      json out;
      {
        std::vector<std::unique_lock<std::mutex>> locks;
        for (auto& j : jobs) locks.emplace_back(j->mu);
        out = openai_response(*call, jobs, model_);
      }
      send_json(res, 200, out);
      return;
    }
    auto st = std::make_shared<StreamState>(jobs);
    const ServedModel& m = model_;
    auto chunk = [call](json choices) {
      return json{{"id", call->id},
                  {"object", call->chat ? "chat.completion.chunk" : "text_completion"},
                  {"created", call->created},
                  {"model", call->model},
                  {"choices", std::move(choices)}};
    };
    stream_response(
        res, engine_, st,
        [call, &m, chunk](StreamState& st, httplib::DataSink& sink, bool& wrote) {
          for (size_t p = 0; p < st.jobs.size(); p++) {
            Job& job = *st.jobs[p];
            for (size_t k = 0; k < st.sent_final[p].size(); k++) {
              std::vector<std::string> events;
              {
                std::lock_guard<std::mutex> lock(job.mu);
                if (job.samples.size() <= k || st.sent_final[p][k]) continue;
                const SampleProgress& s = job.samples[k];
                const size_t index = p * size_t(job.req.n) + k;
                if (call->chat && !st.sent_role[p][k]) {
                  json c = {{"index", index}, {"delta", {{"role", "assistant"}, {"content", ""}}},
                            {"logprobs", nullptr}, {"finish_reason", nullptr}};
                  json ev = chunk(json::array({c}));
                  if (call->return_token_ids) ev["prompt_token_ids"] = job.req.prompt;
                  events.push_back(dump_json(ev));
                  st.sent_role[p][k] = true;
                }
                const bool final_now = s.done && job.state == Job::State::Done;
                // A token that ends its sample waits for the end (within the engine's step), so that
                // it goes out with the finish reason and the final text (what the decoder or a
                // possible stop string held back): the last chunk then carries tokens, never a
                // chunk of empty log-prob arrays after them.
                const bool hold = !final_now && sample_ends_at_last_token(job.req, s);
                const size_t nt = s.tokens.size(), tt = s.text.size();
                if (!hold && (nt > st.sent_tokens[p][k] || tt > st.sent_text[p][k] || final_now)) {
                  const std::string delta = s.text.substr(std::min(st.sent_text[p][k], tt));
                  json c;
                  c["index"] = index;
                  if (call->chat) {
                    c["delta"] = final_now && delta.empty() ? json::object() : json{{"content", delta}};
                  } else {
                    c["text"] = delta;
                  }
                  // No new token (an abort, or max_tokens 0): logprobs null, not empty arrays.
                  c["logprobs"] = call->logprobs >= 0 && nt > st.sent_tokens[p][k]
                                      ? openai_logprobs(s, st.sent_tokens[p][k], nt - st.sent_tokens[p][k], call->chat,
                                                        call->logprobs, m)
                                      : json(nullptr);
                  c["finish_reason"] = final_now ? openai_finish(s) : json(nullptr);
                  c["matched_stop"] = final_now ? openai_matched_stop(s) : json(nullptr);
                  if (final_now) add_routing(c, *call, s, m);
                  if (call->return_token_ids) {
                    c["token_ids"] = std::vector<int32_t>(s.tokens.begin() + long(std::min(st.sent_tokens[p][k], nt)),
                                                          s.tokens.end());
                    if (!call->chat && !st.sent_ids[p][k]) c["prompt_token_ids"] = job.req.prompt;
                    st.sent_ids[p][k] = true;
                  }
                  events.push_back(dump_json(chunk(json::array({c}))));
                  st.sent_tokens[p][k] = nt;
                  st.sent_text[p][k] = tt;
                  st.sent_final[p][k] = final_now;
                }
              }
              for (auto& ev : events) {
                wrote = true;
                if (!write_event(sink, st, ev)) return false;
              }
            }
          }
          return true;
        },
        [call, chunk](StreamState& st, httplib::DataSink& sink) {
          if (!call->include_usage) return true;
          json u = chunk(json::array());
          {
            std::vector<std::unique_lock<std::mutex>> locks;
            for (auto& j : st.jobs) locks.emplace_back(j->mu);
            u["usage"] = openai_usage(st.jobs);
          }
          return write_event(sink, st, dump_json(u));
        });
  };
  // OpenAI's Responses API: one assistant message; streamed as its named events (response.created,
  // ...output_text.delta..., response.completed), with no [DONE] line (OpenAI sends none there).
  s.Post("/v1/responses", [this](const httplib::Request& req, httplib::Response& res) {
    const json body = parse_body(req);
    auto call = std::make_shared<ResponsesCall>(parse_responses(body, model_));
    std::vector<JobPtr> jobs = submit_all(engine_, {call->request});
    if (!call->stream) {
      wait_all(jobs);
      json out;
      {
        std::lock_guard<std::mutex> lock(jobs[0]->mu);
        out = responses_object(*call, *jobs[0], true);
      }
      send_json(res, 200, out);
      return;
    }
    auto st = std::make_shared<StreamState>(jobs);
    auto seq = std::make_shared<int64_t>(0);
    stream_response(
        res, engine_, st,
        [call, seq](StreamState& st, httplib::DataSink& sink, bool& wrote) {
          std::vector<std::string> events;
          auto event = [&](const char* type, json data) {
            data["type"] = type;
            data["sequence_number"] = (*seq)++;
            events.push_back(std::string("event: ") + type + "\ndata: " + dump_json(data) + "\n\n");
          };
          const json part0 = {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}};
          {
            Job& job = *st.jobs[0];
            std::lock_guard<std::mutex> lock(job.mu);
            if (!st.sent_role[0][0]) {
              const json r = responses_object(*call, job, false);
              event("response.created", {{"response", r}});
              event("response.in_progress", {{"response", r}});
              event("response.output_item.added",
                    {{"output_index", 0},
                     {"item", {{"type", "message"}, {"id", call->message_id}, {"status", "in_progress"},
                               {"role", "assistant"}, {"content", json::array()}}}});
              event("response.content_part.added",
                    {{"item_id", call->message_id}, {"output_index", 0}, {"content_index", 0}, {"part", part0}});
              st.sent_role[0][0] = true;
            }
            if (!job.samples.empty() && !st.sent_final[0][0]) {
              const SampleProgress& s = job.samples[0];
              const bool final_now = s.done && job.state == Job::State::Done;
              const bool hold = !final_now && sample_ends_at_last_token(job.req, s);
              if (!hold && s.text.size() > st.sent_text[0][0]) {
                event("response.output_text.delta", {{"item_id", call->message_id}, {"output_index", 0},
                                                     {"content_index", 0}, {"delta", s.text.substr(st.sent_text[0][0])},
                                                     {"logprobs", json::array()}});
                st.sent_text[0][0] = s.text.size();
              }
              if (final_now) {
                const json r = responses_object(*call, job, true);
                const json part = r["output"][0]["content"][0];
                event("response.output_text.done", {{"item_id", call->message_id}, {"output_index", 0},
                                                    {"content_index", 0}, {"text", s.text}, {"logprobs", json::array()}});
                event("response.content_part.done",
                      {{"item_id", call->message_id}, {"output_index", 0}, {"content_index", 0}, {"part", part}});
                event("response.output_item.done", {{"output_index", 0}, {"item", r["output"][0]}});
                const std::string status = r["status"];
                event(status == "completed" ? "response.completed"
                                            : status == "incomplete" ? "response.incomplete" : "response.failed",
                      {{"response", r}});
                st.sent_final[0][0] = true;
              }
            }
          }
          for (auto& ev : events) {
            wrote = true;
            st.last_write = std::chrono::steady_clock::now();
            if (!sink.write(ev.data(), ev.size())) return false;
          }
          return true;
        },
        {}, /*done_marker=*/false);
  });
  s.Post("/v1/completions", [openai](const httplib::Request& req, httplib::Response& res) { openai(req, res, false); });
  s.Post("/v1/chat/completions",
         [openai](const httplib::Request& req, httplib::Response& res) { openai(req, res, true); });
}

}  // namespace epmoe
