// Megatron's args.squared_relu (--squared-relu) through the importer's config_from_args: the
// model's activation is squared ReLU (fc1 not gated), args that also set swiglu are refused,
// and no GELU-form note is written for it (it is no GELU).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/megatron/torch_pickle.h"

namespace mcpp {
namespace squared_relu_import_test {

namespace mg = checkpoint::megatron;

// A GPT-style model's args as an argparse.Namespace, with the two activation switches.
mg::ValuePtr gpt_args(bool squared_relu, bool swiglu) {
  using K = mg::Value::Kind;
  auto ns = std::make_shared<mg::Value>();
  ns->kind = K::Object, ns->s = "argparse.Namespace";
  auto put = [&](const std::string& k, K kind, int64_t i, bool b) {
    auto key = std::make_shared<mg::Value>(), v = std::make_shared<mg::Value>();
    key->kind = K::Str, key->s = k;
    v->kind = kind, v->i = i, v->b = b;
    ns->entries.emplace_back(key, v);
  };
  for (auto [k, x] : {std::pair<const char*, int64_t>{"num_layers", 2},
                      {"hidden_size", 16},
                      {"num_attention_heads", 4},
                      {"ffn_hidden_size", 64},
                      {"kv_channels", 4},
                      {"seq_length", 8},
                      {"max_position_embeddings", 8},
                      {"padded_vocab_size", 64}})
    put(k, K::Int, x, false);
  put("squared_relu", K::Bool, 0, squared_relu);
  put("swiglu", K::Bool, 0, swiglu);
  return ns;
}

bool has_gelu_note(const std::vector<std::string>& notes) {
  for (const auto& n : notes)
    if (n.find("GELU") != std::string::npos) return true;
  return false;
}


TEST(MegatronImportSquaredRelu, ArgsChooseTheActivation) {
  std::vector<std::string> notes;
  const auto c = mg::config_from_args(*gpt_args(true, false), "args", notes);
  EXPECT_TRUE(c.squared_relu);
  EXPECT_FALSE(c.swiglu);
  EXPECT_EQ(c.activation(), ops::MlpActivation::SquaredRelu);
  EXPECT_EQ(c.fc1_width_local(), 64);  // not gated
  EXPECT_FALSE(has_gelu_note(notes));
  notes.clear();
  const auto g = mg::config_from_args(*gpt_args(false, false), "args", notes);
  EXPECT_EQ(g.activation(), ops::MlpActivation::Gelu);
  try {
    mg::config_from_args(*gpt_args(true, true), "args", notes);
    ADD_FAILURE() << "args with swiglu and squared_relu accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("args.swiglu and args.squared_relu"), std::string::npos)
        << e.what();
  }
}

}  // namespace squared_relu_import_test
}  // namespace mcpp
