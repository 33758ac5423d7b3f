// Chat templates: the family read from a tokenizer_config.json, each family's rendering
// written out by hand, and the errors for a template of no known family.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "base/error.h"
#include "serve/chat_template.h"

using mcpp::serve::ChatMessage;
using mcpp::serve::load_chat_template;

namespace chat_template_test {

std::string write_config(const std::string& name, const std::string& body) {
  const auto p = std::filesystem::temp_directory_path() / ("mcpp_chat_" + name + ".json");
  std::ofstream(p) << body;
  return p.string();
}

const std::vector<ChatMessage> kDialog = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello."}, {"user", "2+2?"}};


TEST(ChatTemplate, PlainWithoutConfig) {
  auto t = load_chat_template("auto", "");
  EXPECT_EQ(t.family, "plain");
  EXPECT_EQ(t.render(kDialog),
            "System: Be brief.\n\nUser: Hi\n\nAssistant: Hello.\n\nUser: 2+2?\n\nAssistant:");
}

TEST(ChatTemplate, ConfigWithoutTemplateIsPlain) {
  auto p = write_config("none", R"({"bos_token": "<s>", "eos_token": "</s>"})");
  EXPECT_EQ(load_chat_template("auto", p).family, "plain");
}

TEST(ChatTemplate, ChatMLFromConfig) {
  auto p = write_config("chatml", R"({"chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"})");
  auto t = load_chat_template("auto", p);
  EXPECT_EQ(t.family, "chatml");
  EXPECT_EQ(t.render({{"user", "Hi"}}), "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
  ASSERT_EQ(t.stops.size(), 1u);
  EXPECT_EQ(t.stops[0], "<|im_end|>");
}

TEST(ChatTemplate, Llama3FromConfigWithAddedTokenObjects) {
  auto p = write_config("llama3", R"({"bos_token": {"content": "<|begin_of_text|>"},
    "chat_template": "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>{% endfor %}"})");
  auto t = load_chat_template("auto", p);
  EXPECT_EQ(t.family, "llama3");
  EXPECT_EQ(t.render({{"user", "Hi"}}),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, Llama2SystemInsideFirstUserTurn) {
  auto p = write_config("llama2", R"({"bos_token": "<s>", "eos_token": "</s>",
    "chat_template": [{"name": "default", "template": "{{ bos_token + '[INST] ' }}"}]})");
  auto t = load_chat_template("auto", p);
  EXPECT_EQ(t.family, "llama2");
  EXPECT_EQ(t.render(kDialog),
            "<s>[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST] 2+2? [/INST]");
}

TEST(ChatTemplate, UnknownFamilyIsAnErrorWithHint) {
  auto p = write_config("odd", R"({"chat_template": "{% for m in messages %}### {{ m.content }}{% endfor %}"})");
  try {
    load_chat_template("auto", p);
    FAIL() << "expected an error";
  } catch (const mcpp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("of no family"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--chat-template"), std::string::npos) << e.what();
  }
  EXPECT_EQ(load_chat_template("chatml", p).family, "chatml");  // the flag overrides
  EXPECT_THROW(load_chat_template("jinja", ""), mcpp::Error);
}

}  // namespace chat_template_test
