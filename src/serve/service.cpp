// Request checking and answers of `megatron serve` (service.h).
#include "serve/service.h"

#include "serve/service_detail.h"

#include <chrono>
#include <random>
#include <set>

#include "base/error.h"

namespace mcpp::serve {
using nlohmann::json;
using namespace detail;

json ApiError::body() const {
  return {{"message", message},
          {"error",
           {{"message", message}, {"type", type}, {"param", param.empty() ? json() : json(param)},
            {"code", json()}}}};
}


Service::Service(Engine& engine, const data::Tokenizer& tok, ChatTemplate chat, ServiceOptions opts)
    : engine_(engine), tok_(tok), chat_(std::move(chat)), opts_(std::move(opts)) {}

uint64_t Service::next_seed() {
  if (opts_.default_seed >= 0) return uint64_t(opts_.default_seed);
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  return rng();
}

std::shared_ptr<Reply> Service::start(const std::string& kind, const std::string& body,
                                      bool& stream) {
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded()) {
    // Say where the JSON breaks.
    try {
      const json again = json::parse(body);  // throws, saying where
      (void)again;
    } catch (const json::parse_error& e) {
      bad("", fmt::format("malformed JSON at byte {}: {}", e.byte, e.what()));
    }
    bad("", "malformed JSON");
  }
  stream = false;
  if (kind == "api") return start_api(j);
  return start_openai(j, kind == "chat", stream);
}

json Service::models() const {
  return {{"object", "list"},
          {"data", json::array({{{"id", opts_.model_name},
                                 {"object", "model"},
                                 {"created", 0},
                                 {"owned_by", "megatron.cpp"},
                                 {"max_model_len", engine_.options().max_seq}}})}};
}

json Service::health() const {
  const EngineStats s = engine_.stats();
  return {{"status", "ok"},
          {"model", opts_.model_name},
          {"slots", s.slots},
          {"max_seq", s.max_seq},
          {"active", s.active},
          {"waiting", s.waiting},
          {"peak_active", s.peak_active},
          {"decode_steps", s.decode_steps}, {"decode_rows", s.decode_rows},
          {"decode_seconds", s.decode_seconds}, {"prefills", s.prefills},
          {"prefill_rows", s.prefill_rows}, {"prefill_seconds", s.prefill_seconds},
          {"idle_seconds", s.idle_seconds}, {"callback_seconds", s.callback_seconds},
          {"host_seconds", s.host_seconds},
          {"completed", s.completed},
          {"cancelled", s.cancelled},
          {"prompt_tokens", s.prompt_tokens},
          {"generated_tokens", s.generated_tokens},
          {"kv_cache_bytes", s.kv_cache_bytes}};
}

// Megatron's PUT /api (tools/run_text_generation_server.py): one continuation per prompt;
// "text" is prompt + continuation, "segments" each token's text, "logprobs" those of
// tokens 1.. when asked.
std::shared_ptr<Reply> Service::start_api(const json& j) {
  Fields f(j, "PUT /api",
           {"prompts", "tokens_to_generate", "logprobs", "temperature", "top_k", "top_p",
            "top_p_decay", "top_p_bound", "add_BOS", "stop_on_double_eol", "stop_on_eol",
            "prevent_newline_after_colon", "random_seed", "no_log", "beam_width", "stop_token",
            "length_penalty"});
  if (!f.has("prompts")) bad("prompts", "'prompts' is required: a list of strings");
  const json& pj = f.at("prompts");
  if (!pj.is_array()) bad("prompts", fmt::format("'prompts' must be a list of strings, got {}", type_name(pj)));
  if (pj.empty() || int64_t(pj.size()) > opts_.max_prompts)
    bad("prompts", fmt::format("'prompts' must hold 1 to {} prompts, got {}", opts_.max_prompts, pj.size()));
  for (const auto& p : pj)
    if (!p.is_string()) bad("prompts", fmt::format("'prompts' must be a list of strings, found {}", type_name(p)));
  const int64_t max_seq = engine_.options().max_seq;
  const int64_t n_new = f.get_int("tokens_to_generate", 64, 0, max_seq);
  const bool logprobs = f.get_bool("logprobs", false);
  if (n_new == 0 && !logprobs)
    bad("tokens_to_generate", "'tokens_to_generate' 0 scores the prompts only: it needs 'logprobs': true");
  inference::SamplingParams sp;
  sp.temperature = f.get_num("temperature", 1.0, 0.0, 100.0);
  if (sp.temperature <= 0) bad("temperature", "'temperature' must be in (0, 100]");
  sp.top_k = f.get_int("top_k", 0, 0, 1000);
  sp.top_p = f.get_num("top_p", 0.0, 0.0, 1.0);
  if (sp.top_k > 0 && sp.top_p > 0) bad("top_p", "'top_k' and 'top_p' cannot be set together");
  if (f.get_num("top_p_decay", 0.0, 0.0, 0.0) != 0 || f.get_num("top_p_bound", 0.0, 0.0, 0.0) != 0)
    bad("top_p_decay", "top_p_decay/top_p_bound are not supported");
  if (f.get_bool("prevent_newline_after_colon", false))
    bad("prevent_newline_after_colon", "'prevent_newline_after_colon' is not supported (HINT: use false)");
  if (f.has("beam_width") || f.has("stop_token") || f.has("length_penalty"))
    bad(f.has("beam_width") ? "beam_width" : f.has("stop_token") ? "stop_token" : "length_penalty",
        "beam search (beam_width, stop_token, length_penalty) is not supported");
  sp.seed = f.has("random_seed") ? uint64_t(f.get_int("random_seed", 0, 0, INT64_MAX)) : next_seed();
  const bool add_bos = f.get_bool("add_BOS", false);
  (void)f.get_bool("no_log", false);  // nothing is logged per request anyway
  const bool eol = f.get_bool("stop_on_eol", false), eol2 = f.get_bool("stop_on_double_eol", false);

  auto job = std::make_shared<Job>();
  job->kind = "api";
  job->reply = std::make_shared<Reply>();
  std::vector<SequenceSpec> specs;
  for (size_t i = 0; i < pj.size(); ++i) {
    Track t;
    const std::string text = pj[i].get<std::string>();
    if (add_bos) t.prompt.push_back(int32_t(tok_.eod()));  // Megatron's add_BOS prepends the EOD
    tok_.encode(text, t.prompt);
    if (t.prompt.empty()) bad("prompts", fmt::format("prompt {} is empty (HINT: set 'add_BOS': true)", i));
    const int64_t P = int64_t(t.prompt.size());
    if (P >= max_seq)
      bad("prompts", fmt::format("prompt {} has {} tokens; this server holds {} positions per "
                                 "sequence", i, P, max_seq));
    if (P + n_new > max_seq)
      bad("tokens_to_generate",
          fmt::format("prompt {} ({} tokens) + tokens_to_generate {} exceed the {} positions of a "
                      "sequence", i, P, n_new, max_seq));
    t.prompt_text = tok_.decode(t.prompt);
    t.stop_eol = eol, t.stop_double_eol = eol2;
    t.lazy = !eol && !eol2;  // the answer is decoded from the ids in on_done
    SequenceSpec s;
    s.prompt = t.prompt;
    s.max_new_tokens = n_new;
    s.sampling = sp;
    s.seq_index = i;
    s.logprobs = logprobs;
    specs.push_back(std::move(s));
    job->tracks.push_back(std::move(t));
  }
  job->remaining = specs.size();
  std::vector<SequenceEvents> ev(specs.size());
  const int64_t eod = tok_.eod();
  for (size_t i = 0; i < specs.size(); ++i) {
    ev[i].on_token = [this, job, i, eod](int32_t id, float) {
      return job->tracks[i].add(tok_, id, id == eod);
    };
    ev[i].on_done = [this, job, i, logprobs](const SequenceResult& r) {
      Reply& rep = *job->reply;
      std::lock_guard lk(rep.mu);
      job->tracks[i].result = r;
      if (--job->remaining > 0) return;
      json text = json::array(), segs = json::array(), lps = json::array();
      for (auto& t : job->tracks) {
        if (t.result.stop_reason == "shutdown") {
          rep.status = 503;
          rep.body = ApiError{503, "the server is shutting down", "", "server_error"}.body();
          rep.finished = true;
          rep.cv.notify_all();
          return;
        }
        std::vector<int32_t> all = t.prompt;
        all.insert(all.end(), t.gen.begin(), t.gen.end());
        text.push_back(tok_.decode(all));
        json sg = json::array();
        for (int32_t id : all) sg.push_back(tok_.decode(std::span<const int32_t>(&id, 1)));
        segs.push_back(std::move(sg));
        if (logprobs) {
          std::vector<float> lp = t.result.prompt_logprobs;
          for (size_t k = 0; k < t.gen.size(); ++k) lp.push_back(t.result.logprobs[k]);
          lps.push_back(lp);
        }
      }
      rep.body = {{"text", text}, {"segments", segs}, {"logprobs", logprobs ? lps : json()}};
      rep.finished = true;
      rep.cv.notify_all();
    };
  }
  try {
    job->reply->seqs = engine_.submit_all(std::move(specs), std::move(ev));
  } catch (const QueueFull& e) {
    throw ApiError{503, std::string("server busy: ") + e.what() + " (HINT: retry later)", "",
                   "server_error"};
  }
  return job->reply;
}

}  // namespace mcpp::serve
