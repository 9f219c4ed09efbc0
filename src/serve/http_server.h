// HTTP for `epmoe serve` (cpp-httplib, rank 0 only): sglang's native /generate and control
// endpoints, the OpenAI API, SSE streams, /metrics. Every handler turns a request into jobs for
// the ServeEngine and waits on them; nothing here computes or talks to other ranks. The routes are
// one table (routes() in http_server.cc) of named handlers; the OpenAI ones are in openai_routes.cc.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "serve/protocol.h"
#include "serve/serve_engine.h"

namespace httplib {
class Server;
class ContentReader;
struct Request;
struct Response;
}  // namespace httplib

namespace epmoe {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 30000;
  std::string api_key;              // "" : no key asked
  size_t max_body_bytes = 64 << 20;
  int threads = 64;                 // connections served at once (one thread each)
  double io_timeout = 30.0;         // seconds a read or a write on a connection may block
};

class HttpServer {
 public:
  HttpServer(ServeEngine& engine, ServedModel model, HttpOptions opt);
  ~HttpServer();
  // Binds (InputError when the address is taken or invalid) and serves on a thread of its own.
  void start();
  void stop();
  int port() const { return port_; }

 private:
  using Req = httplib::Request;
  using Res = httplib::Response;
  void configure();  // threads, limits, timeouts, CORS, the key, errors as JSON
  void routes();     // the table of endpoints below, registered once

  // control (http_server.cc)
  void health(const Req& req, Res& res);
  void health_generate(const Req& req, Res& res);
  void model_info(const Req& req, Res& res);
  void weight_version(const Req& req, Res& res);
  void server_info(const Req& req, Res& res);
  void loads(const Req& req, Res& res);
  void abort_request(const Req& req, Res& res);
  void flush_cache(const Req& req, Res& res);
  void pause_generation(const Req& req, Res& res);
  void continue_generation(const Req& req, Res& res);
  void update_weights_from_safetensors(const Req& req, Res& res, const httplib::ContentReader& read);
  void update_weights_from_disk(const Req& req, Res& res);
  void update_weights_from_tensor(const Req& req, Res& res);
  void metrics(const Req& req, Res& res);
  // sglang native and the tokenizer (http_server.cc)
  void generate(const Req& req, Res& res);
  void tokenize_route(const Req& req, Res& res);
  void detokenize_route(const Req& req, Res& res);
  // OpenAI (openai_routes.cc)
  void list_models(const Req& req, Res& res);
  void get_model(const Req& req, Res& res);
  void responses(const Req& req, Res& res);
  void completions(const Req& req, Res& res);
  void chat_completions(const Req& req, Res& res);

  ServeEngine& engine_;
  ServedModel model_;
  HttpOptions opt_;
  std::unique_ptr<httplib::Server> svr_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace epmoe
