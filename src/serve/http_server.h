// HTTP for `epmoe serve` (cpp-httplib, rank 0 only): sglang's native /generate and control
// endpoints, the OpenAI API, SSE streams, /metrics. Every handler turns a request into jobs for
// the ServeEngine and waits on them; nothing here computes or talks to other ranks.
#pragma once

#include <memory>
#include <string>
#include <thread>

#include "serve/protocol.h"
#include "serve/serve_engine.h"

namespace httplib {
class Server;
}

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
  void routes();
  ServeEngine& engine_;
  ServedModel model_;
  HttpOptions opt_;
  std::unique_ptr<httplib::Server> svr_;
  std::thread thread_;
  int port_ = 0;
};

}  // namespace epmoe
