// Writes tests/golden/data/<family>_inputs.safetensors: the f64 weights (Megatron-Core
// names) and batch of each golden model, plus its config as metadata. make_golden.py
// reads these, computes the reference with PyTorch, and writes <family>_expected.
#include <cstdio>
#include <map>

#include "checkpoint/safetensors.h"
#include "golden_models.h"

using namespace mcpp;

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "tests/golden/data";
  for (std::string fam : {"gpt", "llama"}) {
    auto cfg = golden::golden_config(fam, DType::F64);
    model::GPTModel m(cfg);
    golden::perturb(m.params());
    std::map<std::string, Tensor> t;
    for (size_t i = 0; i < m.params().infos().size(); ++i)
      t[m.params().infos()[i].name] = m.params().param(i).clone();
    auto mb = golden::golden_batch();
    t["batch.tokens"] = mb.tokens, t["batch.labels"] = mb.labels, t["batch.loss_mask"] = mb.loss_mask;
    std::map<std::string, std::string> meta = {
        {"family", fam},
        {"num_layers", std::to_string(cfg.num_layers)},
        {"hidden_size", std::to_string(cfg.hidden_size)},
        {"num_attention_heads", std::to_string(cfg.num_attention_heads)},
        {"num_query_groups", std::to_string(cfg.num_query_groups)},
        {"kv_channels", std::to_string(cfg.kv_channels)},
        {"ffn_hidden_size", std::to_string(cfg.ffn_hidden_size)},
        {"rotary_base", std::to_string(cfg.rotary_base)},
        {"norm_epsilon", "1e-5"}};
    checkpoint::save_safetensors(dir + "/" + fam + "_inputs.safetensors", t, meta);
    std::printf("wrote %s/%s_inputs.safetensors\n", dir.c_str(), fam.c_str());
  }
  return 0;
}
