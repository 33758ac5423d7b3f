// Writes tests/golden/data/<family>_inputs.safetensors: the f64 weights (Megatron-Core
// names) and batch of each golden model, plus its config as metadata. make_golden.py
// reads these, computes the reference with PyTorch, and writes <family>_expected.
//
//   golden_export [DIR [FAMILY...]]   (default: tests/golden/data, every family)
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <vector>

#include "checkpoint/safetensors.h"
#include "golden_models.h"

using namespace mcpp;

int main(int argc, char** argv) {
  std::string dir = argc > 1 ? argv[1] : "tests/golden/data";
  std::vector<std::string> families(argv + std::min(argc, 2), argv + argc);
  if (families.empty()) families = {"gpt", "llama", "mla", "mla_rope", "llama_interleaved"};
  for (const std::string& fam : families) {
    auto cfg = golden::golden_config(fam, DType::F64);
    model::GPTModel m(cfg);
    golden::perturb(m.params());
    std::map<std::string, Tensor> t;
    for (size_t i = 0; i < m.params().infos().size(); ++i)
      t[m.params().infos()[i].name] = m.params().param(i).clone();
    auto mb = golden::golden_batch();
    t["batch.tokens"] = mb.tokens, t["batch.labels"] = mb.labels;
    t["batch.loss_mask"] = mb.loss_mask;
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
    if (cfg.rotary_interleaved) meta["rotary_interleaved"] = "1";
    if (cfg.mla.on) {  // MLATransformerConfig's fields ("{}": shortest exact decimal)
      const auto& a = cfg.mla;
      meta["multi_latent_attention"] = "1";
      meta["q_lora_rank"] = std::to_string(a.q_lora_rank);  // 0: none (linear_q_proj)
      meta["kv_lora_rank"] = std::to_string(a.kv_lora_rank);
      meta["qk_head_dim"] = std::to_string(a.qk_head_dim);
      meta["qk_pos_emb_head_dim"] = std::to_string(a.qk_pos_emb_head_dim);
      meta["v_head_dim"] = std::to_string(a.v_head_dim);
      meta["qk_layernorm"] = cfg.qk_layernorm ? "1" : "0";
      meta["rope_type"] = a.yarn ? "yarn" : "rope";
      meta["rotary_scaling_factor"] = fmt::format("{}", a.rotary_scaling_factor);
      meta["mscale"] = fmt::format("{}", a.mscale);
      meta["mscale_all_dim"] = fmt::format("{}", a.mscale_all_dim);
      meta["original_max_position_embeddings"] = std::to_string(a.original_max_positions);
      meta["beta_fast"] = fmt::format("{}", a.beta_fast);
      meta["beta_slow"] = fmt::format("{}", a.beta_slow);
    }
    checkpoint::save_safetensors(dir + "/" + fam + "_inputs.safetensors", t, meta);
    std::printf("wrote %s/%s_inputs.safetensors\n", dir.c_str(), fam.c_str());
  }
  return 0;
}
