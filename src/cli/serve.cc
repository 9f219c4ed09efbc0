// `epmoe serve`: the model behind HTTP -- sglang's native /generate and control endpoints and the
// OpenAI API (serve/). Under mpirun (CPU) or scripts/gpu-launch.sh (GPU) every rank loads its
// experts, serves the requests rank 0 gives it and steps with the others; rank 0 also runs HTTP
// and the tokenizer (serve/serve_engine.h).
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <memory>

#include "cli/commands.h"
#include "serve/http_server.h"
#include "serve/serve_engine.h"
#include "tokenizer/tokenizer.h"
#include "util/error.h"

namespace epmoe {

namespace {

ServeEngine* g_engine = nullptr;

extern "C" void on_stop_signal(int) {
  if (g_engine) g_engine->request_shutdown();
}

}  // namespace

int run_serve(const ServeCliOptions& o) {
  std::signal(SIGPIPE, SIG_IGN);  // a client that hangs up is a failed write, not a dead server
  if (o.port < 0 || o.port > 65535) throw InputError("--port " + std::to_string(o.port) + ": not a TCP port");
  if (o.heartbeat <= 0 || o.heartbeat * 4 > o.run.comm_timeout)
    throw InputError("--heartbeat must be > 0 and at most a quarter of --comm-timeout");
  // The tokenizer is optional: without its files the server takes token ids only.
  std::unique_ptr<Tokenizer> tok;
  if (Tokenizer::available(o.run.model_dir)) tok = std::make_unique<Tokenizer>(Tokenizer::load(o.run.model_dir));
  RunOptions run = o.run;
  run.max_tokens_per_call = o.max_batch_tokens;  // the scheduler never feeds more in one step
  Runtime rt = start_runtime(run);
  const bool root = rt.group->rank() == 0;

  ServeEngineOptions eo;
  eo.scheduler.forward = rt.options.forward;
  eo.scheduler.max_batch_tokens = o.max_batch_tokens;
  eo.scheduler.max_running_requests = o.max_running_requests;
  eo.scheduler.prefix_cache = !o.no_prefix_cache;
  eo.heartbeat = o.heartbeat;
  eo.weight_version = o.weight_version;
  eo.dp_attention = o.dp_attention == "on";
  ServeEngine engine(rt, tok.get(), eo);
  g_engine = &engine;
  std::signal(SIGINT, on_stop_signal);
  std::signal(SIGTERM, on_stop_signal);

  std::unique_ptr<HttpServer> http;
  if (root) {
    ServedModel m;
    std::string dir = std::filesystem::path(o.run.model_dir).lexically_normal().string();
    while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
    m.path = o.run.model_dir;
    m.name = o.served_model_name.empty() ? std::filesystem::path(dir).filename().string() : o.served_model_name;
    m.vocab_size = rt.cfg.vocab_size;
    m.max_positions = rt.cfg.max_position_embeddings;
    m.eos_ids = rt.cfg.eos_token_ids;
    m.tokenizer = tok.get();
    m.routed_experts = o.enable_routed_experts;
    m.moe_layers = rt.cfg.num_sparse_layers();
    m.top_k = rt.cfg.routing.top_k;
    HttpOptions ho;
    ho.host = o.host;
    ho.port = o.port;
    ho.api_key = o.api_key;
    ho.max_body_bytes = size_t(o.max_body_mb) << 20;
    ho.threads = o.http_threads > 0 ? o.http_threads : std::max(64, o.max_running_requests + 32);
    http = std::make_unique<HttpServer>(engine, m, ho);
    http->start();
    const KvPool& pool = rt.model->kv_pool();
    std::fprintf(stderr,
                 "epmoe serve: %s on %s, %d rank(s)%s, backend %s; KV cache %lld tokens (%lld blocks of %d)%s; %s\n"
                 "epmoe serve: listening on http://%s:%d\n",
                 m.name.c_str(), o.run.device.c_str(), rt.group->size(),
                 rt.group->size() > 1 ? (eo.dp_attention ? " serving requests each (dp attention)"
                                                        : " (requests on rank 0, experts on every rank)")
                                      : "",
                 o.run.backend.c_str(), (long long)(pool.total_blocks() * pool.block_tokens()),
                 (long long)pool.total_blocks(), pool.block_tokens(), rt.group->size() > 1 ? " per rank" : "", tok ? "text and token ids" : "token ids only (no tokenizer files)",
                 o.host.c_str(), http->port());
  }
  engine.run();
  g_engine = nullptr;
  if (http) {
    http->stop();
    std::fprintf(stderr, "epmoe serve: stopped\n");
  }
  return 0;
}

}  // namespace epmoe
