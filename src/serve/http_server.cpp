#include "serve/http_server.h"

#include <chrono>

#include "base/error.h"
#include "serve/service_detail.h"

#ifdef MCPP_HAVE_HTTPLIB
#include <httplib.h>

namespace mcpp::serve {
namespace {

using nlohmann::json;

void send_json(httplib::Response& res, int status, const json& j) {
  res.status = status;
  res.set_content(detail::dump(j) + "\n", "application/json");
}

void send_error(httplib::Response& res, const ApiError& e) { send_json(res, e.status, e.body()); }

}  // namespace

HttpServer::HttpServer(Service& service, const HttpOptions& opts)
    : service_(service), opts_(opts), srv_(std::make_unique<httplib::Server>()) {
  auto& s = *srv_;
  const int threads = opts_.threads;
  s.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  s.set_payload_max_length(opts_.max_body_bytes);
  s.set_read_timeout(30, 0);
  s.set_write_timeout(30, 0);

  // httplib answers an oversized body (413) and unknown routes (404) itself; give them
  // the JSON error shape too. Our own errors already carry a body.
  const size_t max_body = opts_.max_body_bytes;
  httplib::Server::HandlerWithResponse on_error = [max_body](const httplib::Request& req,
                                                             httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e{res.status, "", ""};
    if (res.status == 413) {
      e.param = "body";
      e.message = fmt::format("the request body is larger than {} bytes (HINT: --max-request-bytes "
                              "raises the limit)", max_body);
    } else if (res.status == 404) {
      e.message = fmt::format("no route {} {} (routes: PUT /api, POST /v1/completions, POST "
                              "/v1/chat/completions, GET /v1/models, GET /health)",
                              req.method, req.path);
      e.type = "not_found_error";
    } else {
      e.message = fmt::format("HTTP {}", res.status);
    }
    send_error(res, e);
    return httplib::Server::HandlerResponse::Handled;
  };
  s.set_error_handler(on_error);
  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    send_error(res, ApiError{500, what, "", "server_error"});
  });

  auto generate = [this](const std::string& kind) {
    return [this, kind](const httplib::Request& req, httplib::Response& res) {
      std::shared_ptr<Reply> reply;
      bool stream = false;
      try {
        reply = service_.start(kind, req.body, stream);
      } catch (const ApiError& e) {
        send_error(res, e);
        return;
      } catch (const Error& e) {
        send_error(res, ApiError{400, e.what(), ""});
        return;
      }
      if (!stream) {
        std::unique_lock lk(reply->mu);
        reply->cv.wait(lk, [&] { return reply->finished; });
        send_json(res, reply->status, reply->body);
        return;
      }
      res.set_header("Cache-Control", "no-cache");
      res.set_chunked_content_provider(
          "text/event-stream",
          [reply](size_t, httplib::DataSink& sink) {
            std::unique_lock lk(reply->mu);
            reply->cv.wait_for(lk, std::chrono::milliseconds(200),
                               [&] { return !reply->chunks.empty() || reply->finished; });
            std::deque<std::string> out;
            out.swap(reply->chunks);
            const bool finished = reply->finished;
            lk.unlock();
            for (const auto& c : out)
              if (!sink.write(c.data(), c.size())) return false;  // the client went away
            if (finished && out.empty()) {
              sink.done();
              return true;
            }
            if (out.empty() && !sink.is_writable()) return false;
            return true;
          },
          [reply](bool success) {
            // Ended early (write failed, client closed): free the slots.
            std::lock_guard lk(reply->mu);
            if (!success || !reply->finished) reply->cancel();
          });
    };
  };
  s.Put("/api", generate("api"));
  s.Post("/v1/completions", generate("completions"));
  s.Post("/v1/chat/completions", generate("chat"));
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, service_.models());
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    send_json(res, 200, service_.health());
  });
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  int port = opts_.port;
  bool ok = false;
  if (port == 0) {
    port = srv_->bind_to_any_port(opts_.host);
    ok = port > 0;
  } else {
    ok = srv_->bind_to_port(opts_.host, port);
  }
  MCPP_CHECK_HINT(ok, "choose a free port with --port (0 picks one) or another --host",
                  "megatron serve: cannot listen on {}:{}", opts_.host, opts_.port);
  return port;
}

void HttpServer::listen() { srv_->listen_after_bind(); }

void HttpServer::stop() { srv_->stop(); }

#else  // a build without cpp-httplib

namespace httplib {
class Server {};
}  // namespace httplib

namespace mcpp::serve {

HttpServer::HttpServer(Service& service, const HttpOptions& opts) : service_(service), opts_(opts) {
  throw Error("megatron serve: this build has no HTTP server (cpp-httplib was not found)",
              "install libcpp-httplib-dev (Debian/Ubuntu) and rebuild");
}
HttpServer::~HttpServer() = default;
int HttpServer::bind() { return 0; }
void HttpServer::listen() {}
void HttpServer::stop() {}

#endif

}  // namespace mcpp::serve
