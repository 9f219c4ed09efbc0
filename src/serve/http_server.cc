#include "serve/http_server.h"

#include <httplib.h>

#include <chrono>
#include <cstdio>
#include <variant>

#include <sys/socket.h>

#include "io/safetensors.h"
#include "serve/http_util.h"
#include "tensor/ipc_import.h"
#include "util/error.h"

namespace epmoe {

using nlohmann::json;

namespace {

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
  configure();
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

void HttpServer::configure() {
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
}

void HttpServer::routes() {
  enum class Method { Get, Post };
  using Plain = void (HttpServer::*)(const Req&, Res&);
  using Reading = void (HttpServer::*)(const Req&, Res&, const httplib::ContentReader&);  // reads its own body
  struct Route {
    Method method;
    const char* path;
    std::variant<Plain, Reading> handler;
  };
  using M = Method;
  using H = HttpServer;
  // Every endpoint, in httplib's matching order (per method, first registered first); an alias
  // names the same handler.
  const Route table[] = {
      // ---- control ----
      {M::Get, "/health", &H::health},
      {M::Get, "/health_generate", &H::health_generate},
      {M::Get, "/model_info", &H::model_info},
      {M::Get, "/get_model_info", &H::model_info},
      {M::Get, "/get_weight_version", &H::weight_version},
      {M::Get, "/server_info", &H::server_info},
      {M::Get, "/get_server_info", &H::server_info},
      {M::Get, "/v1/loads", &H::loads},
      {M::Get, "/get_loads", &H::loads},
      {M::Post, "/abort_request", &H::abort_request},
      {M::Post, "/flush_cache", &H::flush_cache},
      {M::Get, "/flush_cache", &H::flush_cache},
      {M::Post, "/pause_generation", &H::pause_generation},
      {M::Post, "/continue_generation", &H::continue_generation},
      {M::Post, "/update_weights_from_safetensors", &H::update_weights_from_safetensors},
      {M::Post, "/update_weights_from_disk", &H::update_weights_from_disk},
      {M::Post, "/update_weights_from_tensor", &H::update_weights_from_tensor},
      {M::Get, "/metrics", &H::metrics},
      // ---- sglang native ----
      {M::Post, "/generate", &H::generate},
      // ---- tokenizer (sglang's /tokenize and /detokenize, also under /v1) ----
      {M::Post, "/tokenize", &H::tokenize_route},
      {M::Post, "/v1/tokenize", &H::tokenize_route},
      {M::Post, "/detokenize", &H::detokenize_route},
      {M::Post, "/v1/detokenize", &H::detokenize_route},
      // ---- OpenAI (openai_routes.cc) ----
      {M::Get, "/v1/models", &H::list_models},
      {M::Get, R"(/v1/models/(.+))", &H::get_model},
      {M::Post, "/v1/responses", &H::responses},
      {M::Post, "/v1/completions", &H::completions},
      {M::Post, "/v1/chat/completions", &H::chat_completions},
  };
  httplib::Server& s = *svr_;
  for (const Route& r : table) {
    if (const Plain* plain = std::get_if<Plain>(&r.handler)) {
      httplib::Server::Handler h = [this, f = *plain](const Req& req, Res& res) { (this->*f)(req, res); };
      if (r.method == M::Get) s.Get(r.path, std::move(h));
      else s.Post(r.path, std::move(h));
    } else {
      // httplib hands the body to a reading handler as it arrives (POST only): no copy of it first.
      EPMOE_ASSERT(r.method == M::Post, std::string("serve: a GET route cannot read its body: ") + r.path);
      httplib::Server::HandlerWithContentReader h = [this, f = std::get<Reading>(r.handler)](
                                                        const Req& req, Res& res, const httplib::ContentReader& read) {
        (this->*f)(req, res, read);
      };
      s.Post(r.path, std::move(h));
    }
  }
}

// ---- control ----

// Liveness, without the key: a load balancer or a launcher polls it.
void HttpServer::health(const Req&, Res& res) { res.set_content("", "text/plain"); }

// Readiness: one greedy token through every rank (503 when none comes within 60 s, e.g. paused).
void HttpServer::health_generate(const Req&, Res& res) {
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
}

// sglang's model info: what a client needs to build prompts (vocabulary, context, EOS ids).
void HttpServer::model_info(const Req&, Res& res) {
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
}

// The weights' version, so that a trainer can tell its update is the one serving.
void HttpServer::weight_version(const Req&, Res& res) {
  send_json(res, 200, {{"weight_version", engine_.weight_version()}});
}

// sglang's server info: the KV pool's size and what is running and waiting now.
void HttpServer::server_info(const Req&, Res& res) {
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
}

// sglang's load report, one entry per rank as sglang's data-parallel ranks (each rank serves its
// own requests): requests running and waiting, KV positions in use and their share of the pool.
void HttpServer::loads(const Req&, Res& res) {
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
}

// Ends one request by its rid, or every request (abort_all): a client that gave up on them.
void HttpServer::abort_request(const Req& req, Res& res) {
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
}

// Forgets every cached prefix (GET or POST): a benchmark's cold start.
void HttpServer::flush_cache(const Req&, Res& res) {
  const ControlReply r = engine_.flush_cache();
  send_json(res, 200, {{"success", r.ok}, {"message", r.message}});
}

// Holds generation (mode abort, in_place or retract), e.g. while a trainer updates the weights.
void HttpServer::pause_generation(const Req& req, Res& res) {
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
}

// Generation goes on after /pause_generation.
void HttpServer::continue_generation(const Req&, Res& res) {
  const ControlReply r = engine_.resume();
  send_json(res, 200, {{"success", r.ok}, {"message", r.message}});
}

// The trainer's weights without disk: the body is a safetensors file's bytes (a bucket of at
// most --max-body-mb); ?commit=false stages it, the default applies everything staged once the
// requests in flight are done; ?weight_version=V names the new weights.
void HttpServer::update_weights_from_safetensors(const Req& req, Res& res, const httplib::ContentReader& read) {
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
}

// A colocated trainer's tensors by CUDA IPC handle (protocol.h UpdateFromTensor): their bytes
// copied from its GPU memory into one safetensors bucket here, which then takes the path of
// /update_weights_from_safetensors (checked against the loaded model, staged or committed, sent to
// every rank). The trainer's memory is read before this answers and never after.
void HttpServer::update_weights_from_tensor(const Req& req, Res& res) {
  const UpdateFromTensor u = parse_update_from_tensor(parse_body(req));
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<TensorLayout> layout;
  size_t total = 0;
  for (const SharedTensor& t : u.tensors) {
    layout.push_back({t.name, t.dtype, t.shape});
    total += t.bytes();
  }
  std::string bucket = u.tensors.empty() ? std::string() : safetensors_prefix(layout);
  const size_t data_at = bucket.size();
  bucket.resize(data_at + total);
  std::vector<IpcSlice> slices;
  size_t at = data_at;
  for (size_t i = 0; i < u.tensors.size(); i++) {
    const SharedTensor& t = u.tensors[i];
    slices.push_back({t.handle, t.offset, t.bytes(), bucket.data() + at,
                      "named_tensors[" + std::to_string(i) + "] '" + t.name + "'"});
    at += t.bytes();
  }
  // HTTP runs on rank 0, whose GPU is device 0 (rank mod the visible devices, kernels/cuda/device.cu);
  // the trainer shares from the same GPU (or one with peer access).
  try {
    read_ipc_slices(0, slices);
  } catch (const InputError& e) {
    throw HttpError(400, "named_tensors", std::string("named_tensors: ") + e.what());
  }
  const double copy_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (u.abort_all_requests) engine_.abort_all();
  const ControlReply r = engine_.update_weights_from_bytes(std::move(bucket), u.commit, u.weight_version);
  if (!r.ok) throw HttpError(400, "named_tensors", "named_tensors: " + r.message);
  const double all_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  send_json(res, 200, {{"success", true}, {"message", r.message}, {"weight_version", engine_.weight_version()},
                       {"bytes", total}, {"copy_seconds", copy_s}, {"seconds", all_s}});
}

// New weights from a checkpoint folder, checked against the loaded model before they serve.
void HttpServer::update_weights_from_disk(const Req& req, Res& res) {
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
}

// Prometheus' text format, for a scraper.
void HttpServer::metrics(const Req&, Res& res) {
  res.set_content(prometheus(engine_.metrics(), model_.name), "text/plain; version=0.0.4");
}

// ---- sglang native ----

// sglang's /generate: one prompt or a batch, text or ids, whole or streamed.
void HttpServer::generate(const Req& req, Res& res) {
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
}

// ---- tokenizer ----

// Text (or chat messages) to the model's ids, with the served tokenizer.
void HttpServer::tokenize_route(const Req& req, Res& res) { send_json(res, 200, tokenize(parse_body(req), model_)); }

// Ids back to text.
void HttpServer::detokenize_route(const Req& req, Res& res) {
  send_json(res, 200, detokenize(parse_body(req), model_));
}

}  // namespace epmoe
