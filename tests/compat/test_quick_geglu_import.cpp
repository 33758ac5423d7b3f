// Megatron's args.quick_geglu, args.glu_linear_offset and args.activation_func_clamp_value
// through the importer's config_from_args: the model's activation is quick-GEGLU (fc1 gated)
// with the offset and clamp (None: no clamp); args that also set swiglu are refused (Megatron
// asserts), squared_relu wins over quick_geglu (core_transformer_config_from_args' order), and
// no GELU-form note is written (it is no GELU).
#include <gtest/gtest.h>

#include <optional>
#include <string>
#include <vector>

#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/megatron/torch_pickle.h"

namespace mcpp {
namespace quick_geglu_import_test {

namespace mg = checkpoint::megatron;
using K = mg::Value::Kind;

// A GPT-style model's args as an argparse.Namespace, with the activation's arguments.
mg::ValuePtr gpt_args(bool quick, bool swiglu, bool squared_relu, double offset,
                      std::optional<double> clamp) {
  auto ns = std::make_shared<mg::Value>();
  ns->kind = K::Object, ns->s = "argparse.Namespace";
  auto put = [&](const std::string& k, K kind, int64_t i, bool b, double f) {
    auto key = std::make_shared<mg::Value>(), v = std::make_shared<mg::Value>();
    key->kind = K::Str, key->s = k;
    v->kind = kind, v->i = i, v->b = b, v->f = f;
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
    put(k, K::Int, x, false, 0);
  put("quick_geglu", K::Bool, 0, quick, 0);
  put("swiglu", K::Bool, 0, swiglu, 0);
  put("squared_relu", K::Bool, 0, squared_relu, 0);
  put("glu_linear_offset", K::Float, 0, false, offset);
  if (clamp)
    put("activation_func_clamp_value", K::Float, 0, false, *clamp);
  else
    put("activation_func_clamp_value", K::None, 0, false, 0);
  return ns;
}

TEST(MegatronImportQuickGeglu, ArgsChooseTheActivation) {
  std::vector<std::string> notes;
  const auto c = mg::config_from_args(*gpt_args(true, false, false, 1.0, 7.0), "args", notes);
  EXPECT_TRUE(c.quick_geglu);
  EXPECT_EQ(c.activation().kind, ops::MlpActivation::QuickGeglu);
  EXPECT_EQ(c.activation().glu.offset, 1.0);
  EXPECT_EQ(c.activation().glu.clamp, 7.0);
  EXPECT_EQ(c.fc1_width_local(), 128);  // gated
  for (const auto& n : notes) EXPECT_EQ(n.find("GELU"), std::string::npos) << n;
  const auto p = mg::config_from_args(*gpt_args(true, false, false, 0, std::nullopt), "args",
                                      notes);
  EXPECT_TRUE(p.activation().glu.plain());
  // squared_relu is Megatron's choice when both are set.
  const auto r = mg::config_from_args(*gpt_args(true, false, true, 0, std::nullopt), "args",
                                      notes);
  EXPECT_EQ(r.activation().kind, ops::MlpActivation::SquaredRelu);
  try {
    mg::config_from_args(*gpt_args(true, true, false, 0, std::nullopt), "args", notes);
    ADD_FAILURE() << "args with quick_geglu and swiglu accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("args.quick_geglu and args.swiglu"), std::string::npos)
        << e.what();
  }
}

}  // namespace quick_geglu_import_test
}  // namespace mcpp
