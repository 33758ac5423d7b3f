// Chat prompts: the messages of /v1/chat/completions rendered into one prompt string.
//
// A model's tokenizer_config.json carries its chat template as Jinja source. We do not ship
// a Jinja interpreter: we recognise the template families that cover the common
// checkpoints by their markers and render them natively, and name the family we chose at
// start-up:
//
//   chatml   "<|im_start|>"          <|im_start|>{role}\n{content}<|im_end|>\n ...
//                                    then <|im_start|>assistant\n
//   llama3   "<|start_header_id|>"   {bos}<|start_header_id|>{role}<|end_header_id|>\n\n
//                                    {content}<|eot_id|> ... then the assistant header
//   llama2   "[INST]"                {bos}[INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]
//                                    {assistant} {eos}{bos}[INST] ...
//   plain    (no tokenizer_config.json, or one without chat_template):
//                                    "System: {content}\n\n" "User: {content}\n\n"
//                                    "Assistant: {content}\n\n" ... then "Assistant:"
//
// A template of another family is an error at start-up naming the file, with the HINT to
// choose a family with --chat-template. Each family also lists the strings that end the
// assistant's turn (stop strings added to every chat request).
#pragma once
#include <string>
#include <vector>

namespace mcpp::serve {

struct ChatMessage {
  std::string role;  // system | user | assistant
  std::string content;
};

struct ChatTemplate {
  std::string family = "plain";  // plain | chatml | llama3 | llama2
  std::string source;            // where it came from (a file, "--chat-template", "default")
  std::string bos, eos;          // the tokenizer_config.json's bos_token / eos_token
  std::vector<std::string> stops;
  std::string render(const std::vector<ChatMessage>& messages) const;
};

// choice: "auto" (tokenizer_config.json when present, else plain) or a family name.
// tokenizer_config: a tokenizer_config.json path, or empty.
ChatTemplate load_chat_template(const std::string& choice, const std::string& tokenizer_config);

}  // namespace mcpp::serve
