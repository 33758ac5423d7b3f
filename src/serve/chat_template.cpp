#include "serve/chat_template.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "base/error.h"

namespace mcpp::serve {
namespace {

// bos_token / eos_token are a string or {"content": "..."} (AddedToken) in the wild.
std::string token_text(const nlohmann::json& j, const char* key) {
  if (!j.contains(key)) return {};
  const auto& v = j[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  return {};
}

ChatTemplate family(const std::string& name) {
  ChatTemplate t;
  t.family = name;
  if (name == "chatml") {
    t.stops = {"<|im_end|>"};
  } else if (name == "llama3") {
    t.stops = {"<|eot_id|>"};
  } else if (name == "llama2") {
    t.stops = {"[INST]"};
  } else {
    MCPP_CHECK_HINT(name == "plain", "use --chat-template auto|plain|chatml|llama3|llama2",
                    "--chat-template '{}' is not a template family", name);
    t.stops = {"\nUser:", "\nSystem:"};
  }
  return t;
}

}  // namespace

ChatTemplate load_chat_template(const std::string& choice, const std::string& tokenizer_config) {
  if (choice != "auto") {
    ChatTemplate t = family(choice);
    t.source = "--chat-template " + choice;
    if (!tokenizer_config.empty() && std::filesystem::is_regular_file(tokenizer_config)) {
      std::ifstream in(tokenizer_config);
      const auto j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_object()) t.bos = token_text(j, "bos_token"), t.eos = token_text(j, "eos_token");
    }
    return t;
  }
  if (tokenizer_config.empty() || !std::filesystem::is_regular_file(tokenizer_config)) {
    ChatTemplate t = family("plain");
    t.source = "default (no tokenizer_config.json)";
    return t;
  }
  std::ifstream in(tokenizer_config);
  const auto j = nlohmann::json::parse(in, nullptr, false);
  MCPP_CHECK_HINT(j.is_object(), "fix the file or pass --chat-template plain",
                  "{} is not a JSON object", tokenizer_config);
  std::string src;
  if (j.contains("chat_template")) {
    const auto& ct = j["chat_template"];
    if (ct.is_string()) {
      src = ct.get<std::string>();
    } else if (ct.is_array()) {  // [{"name": "default", "template": "..."}, ...]
      for (const auto& e : ct)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string())
          src = e["template"].get<std::string>();
    }
  }
  ChatTemplate t;
  if (src.empty()) {
    t = family("plain");
    t.source = tokenizer_config + " (no chat_template: the plain template)";
  } else if (src.find("<|im_start|>") != std::string::npos) {
    t = family("chatml");
  } else if (src.find("<|start_header_id|>") != std::string::npos) {
    t = family("llama3");
  } else if (src.find("[INST]") != std::string::npos) {
    t = family("llama2");
  } else {
    throw Error(fmt::format("the chat_template of {} is of no family megatron serve knows "
                            "(chatml, llama3, llama2)",
                            tokenizer_config),
                "pass --chat-template plain|chatml|llama3|llama2 to choose one");
  }
  if (t.source.empty()) t.source = tokenizer_config;
  t.bos = token_text(j, "bos_token"), t.eos = token_text(j, "eos_token");
  return t;
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages) const {
  std::string out;
  if (family == "chatml") {
    for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
    out += "<|im_start|>assistant\n";
  } else if (family == "llama3") {
    out = bos;
    for (const auto& m : messages)
      out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
    out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  } else if (family == "llama2") {
    // The system message goes inside the first user turn, as Llama 2's template does.
    std::string system;
    bool first_user = true;
    for (const auto& m : messages) {
      if (m.role == "system") {
        system = m.content;
      } else if (m.role == "user") {
        std::string u = m.content;
        if (first_user && !system.empty()) u = "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + u;
        first_user = false;
        out += bos + "[INST] " + u + " [/INST]";
      } else {
        out += " " + m.content + " " + eos;
      }
    }
  } else {
    for (const auto& m : messages) {
      std::string role = m.role;
      if (!role.empty()) role[0] = char(std::toupper(static_cast<unsigned char>(role[0])));
      out += role + ": " + m.content + "\n\n";
    }
    out += "Assistant:";
  }
  return out;
}

}  // namespace mcpp::serve
