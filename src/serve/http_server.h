// The HTTP side of `megatron serve` (cpp-httplib): routes, body limits, JSON errors and
// server-sent events over a Service (service.h).
//
//   PUT  /api                  Megatron's text generation server
//   POST /v1/completions       OpenAI completions (stream: true -> SSE)
//   POST /v1/chat/completions  OpenAI chat completions (stream: true -> SSE)
//   GET  /v1/models            the one model served
//   GET  /health               liveness and the engine's counters
//
// Any 4xx/5xx answer is a JSON error naming the field. A streaming client that goes away
// cancels its sequences: the engine frees their slots at the next token boundary.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "serve/service.h"

namespace httplib {
class Server;
}

namespace mcpp::serve {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 5000;
  size_t max_body_bytes = 1 << 20;  // --max-request-bytes
  int threads = 64;                 // connections served at once
};

class HttpServer {
 public:
  HttpServer(Service& service, const HttpOptions& opts);
  ~HttpServer();
  // Binds (an error naming --host/--port when it cannot); returns the bound port.
  int bind();
  void listen();  // blocks until stop()
  void stop();

 private:
  Service& service_;
  HttpOptions opts_;
  std::unique_ptr<httplib::Server> srv_;
};

}  // namespace mcpp::serve
