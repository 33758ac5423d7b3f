#include "checkpoint/moe_metadata.h"

namespace mcpp::checkpoint {

using json = nlohmann::json;

namespace {

using Moe = model::TransformerConfig::Moe;

const char* score_name(Moe::Score s) {
  return s == Moe::Score::Sigmoid        ? "sigmoid"
         : s == Moe::Score::SqrtSoftplus ? "sqrtsoftplus"
                                         : "softmax";
}

}  // namespace

// The load-balancing types and coefficients: the lists "balance_types" (the enum's numbers)
// and "aux_loss_coeffs"; the first pair also as the single "balance" / "aux_loss_coeff" of
// checkpoints written before the lists (which still load, as one-entry lists). The score
// function by name ("score_function"; "sigmoid" alone in older ones).
json moe_config_json(const model::TransformerConfig::Moe& m) {
  std::vector<int> types;
  for (Moe::Balance b : m.balance) types.push_back(int(b));
  return {{"num_experts", m.num_experts},
          {"layer_pattern", m.layer_pattern},
          {"ffn_hidden_size", m.ffn_hidden_size},
          {"topk", m.topk},
          {"sigmoid", m.score == Moe::Score::Sigmoid},
          {"score_function", score_name(m.score)},
          {"pre_softmax", m.pre_softmax},
          {"topk_scaling_factor", m.topk_scaling_factor},
          {"num_groups", m.num_groups},
          {"group_topk", m.group_topk},
          {"expert_bias", m.expert_bias},
          {"bias_update_rate", m.bias_update_rate},
          {"router_dtype", m.router_dtype_given ? std::string(dtype_name(m.router_dtype)) : ""},
          {"balance", types.empty() ? 0 : types[0]},
          {"aux_loss_coeff", m.aux_loss_coeff.empty() ? 0.0 : m.aux_loss_coeff[0]},
          {"balance_types", types},
          {"aux_loss_coeffs", m.aux_loss_coeff},
          {"z_loss_coeff", m.z_loss_coeff},
          {"capacity_factor", m.capacity_factor},
          {"pad_to_capacity", m.pad_to_capacity},
          {"drop_by_position", m.drop_by_position},
          {"shared_ffn_hidden_size", m.shared_ffn_hidden_size},
          {"shared_expert_gate", m.shared_expert_gate},
          {"apply_probs_on_input", m.apply_probs_on_input}};
}

model::TransformerConfig::Moe moe_config_from_json(const json& j) {
  model::TransformerConfig::Moe m;
  m.num_experts = j.at("num_experts");
  m.layer_pattern = j.at("layer_pattern").get<std::vector<int64_t>>();
  m.ffn_hidden_size = j.at("ffn_hidden_size"), m.topk = j.at("topk");
  if (j.contains("score_function")) {
    const std::string sf = j.at("score_function");
    MCPP_CHECK(sf == "softmax" || sf == "sigmoid" || sf == "sqrtsoftplus",
               "moe.score_function '{}' is not a score function", sf);
    m.score = sf == "sigmoid"        ? Moe::Score::Sigmoid
              : sf == "sqrtsoftplus" ? Moe::Score::SqrtSoftplus
                                     : Moe::Score::Softmax;
  } else {
    m.score = j.at("sigmoid").get<bool>() ? Moe::Score::Sigmoid : Moe::Score::Softmax;
  }
  m.pre_softmax = j.at("pre_softmax");
  m.topk_scaling_factor = j.at("topk_scaling_factor");
  m.num_groups = j.at("num_groups"), m.group_topk = j.at("group_topk");
  m.expert_bias = j.at("expert_bias"), m.bias_update_rate = j.at("bias_update_rate");
  const std::string rd = j.at("router_dtype");
  m.router_dtype_given = !rd.empty();
  if (m.router_dtype_given) m.router_dtype = dtype_from_name(rd);
  std::vector<int> types = {j.at("balance").get<int>()};
  m.aux_loss_coeff = {j.at("aux_loss_coeff").get<double>()};
  if (j.contains("balance_types")) {
    types = j.at("balance_types").get<std::vector<int>>();
    m.aux_loss_coeff = j.at("aux_loss_coeffs").get<std::vector<double>>();
  }
  MCPP_CHECK(!types.empty() && types.size() == m.aux_loss_coeff.size(),
             "moe.balance_types lists {} types, moe.aux_loss_coeffs {} coefficients",
             types.size(), m.aux_loss_coeff.size());
  m.balance.clear();
  for (int b : types) {
    MCPP_CHECK(b >= 0 && b <= int(Moe::Balance::GlobalAuxLoss),
               "moe.balance {} is not a load-balancing type", b);
    m.balance.push_back(Moe::Balance(b));
  }
  m.z_loss_coeff = j.at("z_loss_coeff");
  m.capacity_factor = j.at("capacity_factor"), m.pad_to_capacity = j.at("pad_to_capacity");
  m.drop_by_position = j.at("drop_by_position");
  m.shared_ffn_hidden_size = j.at("shared_ffn_hidden_size");
  m.shared_expert_gate = j.at("shared_expert_gate");
  m.apply_probs_on_input = j.value("apply_probs_on_input", false);  // (absent: before the flag)
  return m;
}

}  // namespace mcpp::checkpoint
