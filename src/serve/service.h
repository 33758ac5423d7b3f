// The HTTP-free part of `megatron serve`: request bodies (Megatron's PUT /api, OpenAI's
// /v1/completions and /v1/chat/completions) checked and turned into engine sequences, and
// their answers (one JSON document, or a stream of server-sent events).
//
// Every bad request is an ApiError: an HTTP status (400, 404, 413, 503) and a message that
// names the field (OpenAI's {"error": {"message", "type", "param", "code"}}, plus a
// top-level "message", which Megatron's CLI client prints). Unknown fields are errors, as
// are wrong types; null is the same as an absent field.
#pragma once
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/tokenizers/tokenizer.h"
#include "serve/chat_template.h"
#include "serve/engine.h"

namespace mcpp::serve {

struct ApiError {
  int status = 400;
  std::string message;
  std::string param;  // the offending field ("" when none)
  std::string type = "invalid_request_error";
  nlohmann::json body() const;
};

// One request's output as it is produced: SSE chunks, or the final JSON, and the
// sequences to cancel when the client goes away.
struct Reply {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::string> chunks;  // stream: "data: ...\n\n" events not yet sent
  bool finished = false;
  int status = 200;
  nlohmann::json body;  // non-stream: the answer once finished
  std::vector<std::shared_ptr<Sequence>> seqs;
  void cancel() {
    for (auto& s : seqs) s->cancel();
  }
};

struct ServiceOptions {
  std::string model_name;
  int64_t max_prompts = 128;  // prompts of one /api or /v1/completions request (Megatron: 128)
  int64_t default_seed = -1;  // the seed of requests that give none (-1: a fresh one each)
};

class Service {
 public:
  Service(Engine& engine, const data::Tokenizer& tok, ChatTemplate chat, ServiceOptions opts);

  // kind: "api" (PUT /api), "completions", "chat". Throws ApiError; otherwise the request
  // is queued and the Reply fills in from the engine thread. stream: SSE chunks.
  std::shared_ptr<Reply> start(const std::string& kind, const std::string& body, bool& stream);
  nlohmann::json models() const;
  nlohmann::json health() const;

 private:
  struct Job;
  std::shared_ptr<Reply> start_api(const nlohmann::json& j);
  std::shared_ptr<Reply> start_openai(const nlohmann::json& j, bool chat, bool& stream);
  uint64_t next_seed();

  Engine& engine_;
  const data::Tokenizer& tok_;
  ChatTemplate chat_;
  ServiceOptions opts_;
  std::mutex mu_;
  uint64_t counter_ = 0;
};

}  // namespace mcpp::serve
