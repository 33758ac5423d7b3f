// OpenAI-compatible /v1/completions and /v1/chat/completions (service.h): the fields of
// OpenAI's API reference that a local model can honour, its response and streaming chunk
// shapes ("text_completion", "chat.completion", "chat.completion.chunk"), and "data: [DONE]".
// Sampling: temperature 0 is greedy (OpenAI's meaning), top_p 1 is off; top_k and
// ignore_eos are the usual extensions of local servers.
#include "serve/service.h"
#include "serve/service_detail.h"

namespace mcpp::serve {

using nlohmann::json;
using namespace detail;

namespace {

// OpenAI's "prompt": a string, a list of strings, a list of token ids, or a list of lists.
std::vector<std::vector<int32_t>> parse_prompts(const json& p, const data::Tokenizer& tok,
                                                int64_t vocab, int64_t max_prompts) {
  std::vector<std::vector<int32_t>> out;
  auto ids = [&](const json& a) {
    std::vector<int32_t> v;
    for (const auto& x : a) {
      if (!x.is_number_integer() && !x.is_number_unsigned())
        bad("prompt", fmt::format("'prompt' token lists must hold integers, found {}", type_name(x)));
      const int64_t id = x.get<int64_t>();
      if (id < 0 || id >= vocab)
        bad("prompt", fmt::format("'prompt' token {} is outside the vocabulary [0, {})", id, vocab));
      v.push_back(int32_t(id));
    }
    return v;
  };
  if (p.is_string()) {
    out.push_back(tok.encode(p.get<std::string>()));
  } else if (p.is_array() && !p.empty() && (p[0].is_number_integer() || p[0].is_number_unsigned())) {
    out.push_back(ids(p));
  } else if (p.is_array() && !p.empty()) {
    for (const auto& e : p) {
      if (e.is_string())
        out.push_back(tok.encode(e.get<std::string>()));
      else if (e.is_array())
        out.push_back(ids(e));
      else
        bad("prompt", fmt::format("'prompt' lists must hold strings or token lists, found {}",
                                  type_name(e)));
    }
  } else {
    bad("prompt", fmt::format("'prompt' must be a string, a list of strings or token ids, got {}",
                              p.is_array() ? "an empty list" : type_name(p)));
  }
  if (int64_t(out.size()) > max_prompts)
    bad("prompt", fmt::format("'prompt' holds {} prompts, more than {}", out.size(), max_prompts));
  return out;
}

std::vector<ChatMessage> parse_messages(const json& m) {
  if (!m.is_array() || m.empty())
    bad("messages", fmt::format("'messages' must be a non-empty list, got {}",
                                m.is_array() ? "an empty list" : type_name(m)));
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < m.size(); ++i) {
    const std::string where = fmt::format("messages[{}]", i);
    const json& e = m[i];
    if (!e.is_object()) bad(where, fmt::format("'{}' must be an object, got {}", where, type_name(e)));
    for (const auto& [k, v] : e.items())
      if (k != "role" && k != "content" && k != "name")
        bad(where + "." + k, fmt::format("unknown field '{}' in {}", k, where));
    if (!e.contains("role") || !e["role"].is_string())
      bad(where + ".role", fmt::format("'{}.role' must be a string", where));
    ChatMessage cm;
    cm.role = e["role"].get<std::string>();
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant" && cm.role != "developer")
      bad(where + ".role", fmt::format("'{}.role' must be system, user or assistant, got '{}'",
                                       where, cm.role));
    if (cm.role == "developer") cm.role = "system";
    const json c = e.contains("content") ? e["content"] : json();
    if (c.is_string()) {
      cm.content = c.get<std::string>();
    } else if (c.is_array()) {  // [{"type": "text", "text": "..."}, ...]
      for (const auto& part : c) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          bad(where + ".content", fmt::format("'{}.content' parts must be {{\"type\": \"text\", "
                                              "\"text\": ...}} (only text is supported)", where));
        cm.content += part["text"].get<std::string>();
      }
    } else {
      bad(where + ".content", fmt::format("'{}.content' must be a string or a list of text parts, "
                                          "got {}", where, type_name(c)));
    }
    out.push_back(std::move(cm));
  }
  return out;
}

}  // namespace

std::shared_ptr<Reply> Service::start_openai(const json& j, bool chat, bool& stream) {
  const char* what = chat ? "POST /v1/chat/completions" : "POST /v1/completions";
  Fields f = chat ? Fields(j, what,
                           {"model", "messages", "max_tokens", "max_completion_tokens",
                            "temperature", "top_p", "n", "stream", "stream_options", "stop", "seed",
                            "user", "frequency_penalty", "presence_penalty", "logprobs",
                            "top_logprobs", "logit_bias", "top_k", "ignore_eos"})
                  : Fields(j, what,
                           {"model", "prompt", "max_tokens", "temperature", "top_p", "n", "stream",
                            "stream_options", "stop", "seed", "echo", "logprobs", "user",
                            "frequency_penalty", "presence_penalty", "best_of", "logit_bias",
                            "suffix", "top_k", "ignore_eos"});
  const std::string model = f.get_string("model", opts_.model_name);
  stream = f.get_bool("stream", false);
  bool include_usage = false;
  if (f.has("stream_options")) {
    const json& so = f.at("stream_options");
    if (!so.is_object()) bad("stream_options", "'stream_options' must be an object");
    Fields sf(so, "stream_options", {"include_usage"});
    include_usage = sf.get_bool("include_usage", false);
  }
  if (f.get_int("n", 1, 1, 1) != 1) bad("n", "'n' must be 1");
  if (!chat && f.get_int("best_of", 1, 1, 1) != 1) bad("best_of", "'best_of' must be 1");
  if (f.get_num("frequency_penalty", 0, 0, 0) != 0 || f.get_num("presence_penalty", 0, 0, 0) != 0)
    bad("frequency_penalty", "penalties are not supported");
  if (f.has("logit_bias") && !(f.at("logit_bias").is_object() && f.at("logit_bias").empty()))
    bad("logit_bias", "'logit_bias' is not supported");
  if (chat) {
    if (f.get_bool("logprobs", false)) bad("logprobs", "'logprobs' is not supported in chat");
    (void)f.get_int("top_logprobs", 0, 0, 0);
  } else {
    (void)f.get_int("logprobs", 0, 0, 0);
    if (f.has("suffix")) bad("suffix", "'suffix' is not supported");
  }
  (void)f.get_string("user", "");
  std::vector<std::string> stops;
  if (f.has("stop")) {
    const json& s = f.at("stop");
    if (s.is_string()) {
      stops.push_back(s.get<std::string>());
    } else if (s.is_array() && s.size() <= 4) {
      for (const auto& e : s) {
        if (!e.is_string()) bad("stop", "'stop' must be a string or a list of up to 4 strings");
        stops.push_back(e.get<std::string>());
      }
    } else {
      bad("stop", "'stop' must be a string or a list of up to 4 strings");
    }
    for (const auto& s2 : stops)
      if (s2.empty()) bad("stop", "'stop' strings must not be empty");
  }
  inference::SamplingParams sp;
  const double temp = f.get_num("temperature", 1.0, 0.0, 2.0);
  sp.greedy = temp == 0;
  sp.temperature = temp == 0 ? 1.0 : temp;
  const double top_p = f.get_num("top_p", 1.0, 0.0, 1.0);
  if (f.has("top_p") && top_p <= 0) bad("top_p", "'top_p' must be in (0, 1]");
  sp.top_p = top_p >= 1.0 ? 0.0 : top_p;
  sp.top_k = f.get_int("top_k", 0, -1, 1000);
  if (sp.top_k < 0) sp.top_k = 0;
  if (sp.top_k > 1 && sp.top_p > 0 && !sp.greedy)
    bad("top_k", "'top_k' and 'top_p' < 1 cannot be used together");
  sp.seed = f.has("seed") ? uint64_t(f.get_int("seed", 0, INT64_MIN, INT64_MAX)) : next_seed();
  const bool ignore_eos = f.get_bool("ignore_eos", false);
  const bool echo = !chat && f.get_bool("echo", false);

  const int64_t max_seq = engine_.options().max_seq;
  std::vector<std::vector<int32_t>> prompts;
  const char* prompt_field = chat ? "messages" : "prompt";
  if (chat) {
    if (!f.has("messages")) bad("messages", "'messages' is required");
    prompts.push_back(tok_.encode(chat_.render(parse_messages(f.at("messages")))));
    for (const auto& s : chat_.stops) stops.push_back(s);
  } else {
    if (!f.has("prompt")) bad("prompt", "'prompt' is required");
    prompts = parse_prompts(f.at("prompt"), tok_, engine_.options().vocab_size, opts_.max_prompts);
  }
  const char* max_field = chat && f.has("max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
  const bool has_max = f.has(max_field);
  const int64_t max_tokens = f.get_int(max_field, chat ? 0 : 16, 0, INT64_MAX);

  auto job = std::make_shared<Job>();
  job->kind = chat ? "chat" : "completions";
  job->stream = stream, job->include_usage = include_usage, job->echo = echo;
  job->model = model;
  job->created = now_s();
  {
    std::lock_guard lk(mu_);
    job->id = fmt::format("{}-{}", chat ? "chatcmpl" : "cmpl", ++counter_);
  }
  job->reply = std::make_shared<Reply>();
  std::vector<SequenceSpec> specs;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const int64_t P = int64_t(prompts[i].size());
    if (P == 0) bad(prompt_field, fmt::format("'{}' encodes to no tokens", prompt_field));
    if (P >= max_seq)
      bad(prompt_field, fmt::format("'{}' has {} tokens; this server's context holds {} positions "
                                    "(one at least for the answer)", prompt_field, P, max_seq));
    const int64_t n_new = chat && !has_max ? max_seq - P : max_tokens;
    if (P + n_new > max_seq)
      bad(max_field, fmt::format("'{}' {} + the prompt's {} tokens exceed this server's context of "
                                 "{} positions", max_field, n_new, P, max_seq));
    Track t;
    t.prompt = prompts[i];
    t.prompt_text = tok_.decode(t.prompt);
    t.stops = stops;
    t.lazy = !stream && stops.empty();
    job->prompt_tokens += P;
    SequenceSpec s;
    s.prompt = prompts[i];
    s.max_new_tokens = n_new;
    s.sampling = sp;
    s.seq_index = i;
    s.ignore_eod = ignore_eos;
    specs.push_back(std::move(s));
    job->tracks.push_back(std::move(t));
  }
  job->remaining = specs.size();

  // Stream chunks and the final answer, built on the engine thread.
  auto chunk = [job](size_t i, const json& delta_or_text, const json& reason) {
    json c = {{"id", job->id}, {"created", job->created}, {"model", job->model}};
    if (job->kind == "chat") {
      c["object"] = "chat.completion.chunk";
      c["choices"] = json::array(
          {{{"index", i}, {"delta", delta_or_text}, {"logprobs", json()}, {"finish_reason", reason}}});
    } else {
      c["object"] = "text_completion";
      c["choices"] = json::array(
          {{{"index", i}, {"text", delta_or_text}, {"logprobs", json()}, {"finish_reason", reason}}});
    }
    return "data: " + dump(c) + "\n\n";
  };
  auto usage = [job]() {
    return json{{"prompt_tokens", job->prompt_tokens},
                {"completion_tokens", job->completion_tokens},
                {"total_tokens", job->prompt_tokens + job->completion_tokens}};
  };
  if (stream && chat) {  // the assistant's role comes first, as OpenAI sends it
    std::lock_guard lk(job->reply->mu);
    job->reply->chunks.push_back(chunk(0, {{"role", "assistant"}, {"content", ""}}, json()));
  }
  if (stream && echo) {  // the prompts' text first
    std::lock_guard lk(job->reply->mu);
    for (size_t i = 0; i < job->tracks.size(); ++i)
      job->reply->chunks.push_back(chunk(i, json(job->tracks[i].prompt_text), json()));
  }
  std::vector<SequenceEvents> ev(specs.size());
  const int64_t eod = tok_.eod();
  for (size_t i = 0; i < specs.size(); ++i) {
    ev[i].on_token = [this, job, i, eod, ignore_eos, chunk](int32_t id, float) {
      Track& t = job->tracks[i];
      const bool go = t.add(tok_, id, id == eod && !ignore_eos);
      if (job->stream) {
        const std::string d = t.take(false);
        if (!d.empty()) {
          std::lock_guard lk(job->reply->mu);
          job->reply->chunks.push_back(
              chunk(i, job->kind == "chat" ? json{{"content", d}} : json(d), json()));
          job->reply->cv.notify_all();
        }
      }
      return go;
    };
    ev[i].on_done = [this, job, i, chunk, usage](const SequenceResult& r) {
      Track& t = job->tracks[i];
      t.result = r;
      t.settle(tok_);
      Reply& rep = *job->reply;
      std::lock_guard lk(rep.mu);
      job->completion_tokens += int64_t(r.tokens.size());
      const std::string reason = finish_reason(r.stop_reason);
      if (job->stream) {
        const std::string d = t.take(true);
        rep.chunks.push_back(chunk(i, job->kind == "chat" ? (d.empty() ? json::object() : json{{"content", d}})
                                                          : json(d),
                                   reason));
      }
      if (--job->remaining > 0) {
        rep.cv.notify_all();
        return;
      }
      if (job->stream) {
        if (job->include_usage)
          rep.chunks.push_back("data: " +
                               dump({{"id", job->id},
                                     {"object", job->kind == "chat" ? "chat.completion.chunk" : "text_completion"},
                                     {"created", job->created},
                                     {"model", job->model},
                                     {"choices", json::array()},
                                     {"usage", usage()}}) +
                               "\n\n");
        rep.chunks.push_back("data: [DONE]\n\n");
      } else {
        json choices = json::array();
        for (size_t k = 0; k < job->tracks.size(); ++k) {
          const Track& tk = job->tracks[k];
          const std::string fr = finish_reason(tk.result.stop_reason);
          if (job->kind == "chat")
            choices.push_back({{"index", k},
                               {"message", {{"role", "assistant"}, {"content", tk.text}}},
                               {"logprobs", json()},
                               {"finish_reason", fr}});
          else
            choices.push_back({{"index", k},
                               {"text", job->echo ? tk.prompt_text + tk.text : tk.text},
                               {"logprobs", json()},
                               {"finish_reason", fr}});
        }
        rep.body = {{"id", job->id},
                    {"object", job->kind == "chat" ? "chat.completion" : "text_completion"},
                    {"created", job->created},
                    {"model", job->model},
                    {"choices", choices},
                    {"usage", usage()}};
      }
      for (const auto& tk : job->tracks)
        if (tk.result.stop_reason == "shutdown") {
          rep.status = 503;
          rep.body = ApiError{503, "the server is shutting down", "", "server_error"}.body();
        }
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
