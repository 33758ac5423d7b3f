#include "checkpoint/moe_metadata.h"

namespace mcpp::checkpoint {

using json = nlohmann::json;

json moe_config_json(const model::TransformerConfig::Moe& m) {
  return {{"num_experts", m.num_experts},
          {"layer_pattern", m.layer_pattern},
          {"ffn_hidden_size", m.ffn_hidden_size},
          {"topk", m.topk},
          {"sigmoid", m.sigmoid},
          {"pre_softmax", m.pre_softmax},
          {"topk_scaling_factor", m.topk_scaling_factor},
          {"num_groups", m.num_groups},
          {"group_topk", m.group_topk},
          {"expert_bias", m.expert_bias},
          {"bias_update_rate", m.bias_update_rate},
          {"router_dtype", m.router_dtype_given ? std::string(dtype_name(m.router_dtype)) : ""},
          {"balance", int(m.balance)},
          {"aux_loss_coeff", m.aux_loss_coeff},
          {"z_loss_coeff", m.z_loss_coeff},
          {"capacity_factor", m.capacity_factor},
          {"pad_to_capacity", m.pad_to_capacity},
          {"drop_by_position", m.drop_by_position},
          {"shared_ffn_hidden_size", m.shared_ffn_hidden_size},
          {"shared_expert_gate", m.shared_expert_gate}};
}

model::TransformerConfig::Moe moe_config_from_json(const json& j) {
  model::TransformerConfig::Moe m;
  m.num_experts = j.at("num_experts");
  m.layer_pattern = j.at("layer_pattern").get<std::vector<int64_t>>();
  m.ffn_hidden_size = j.at("ffn_hidden_size"), m.topk = j.at("topk");
  m.sigmoid = j.at("sigmoid"), m.pre_softmax = j.at("pre_softmax");
  m.topk_scaling_factor = j.at("topk_scaling_factor");
  m.num_groups = j.at("num_groups"), m.group_topk = j.at("group_topk");
  m.expert_bias = j.at("expert_bias"), m.bias_update_rate = j.at("bias_update_rate");
  const std::string rd = j.at("router_dtype");
  m.router_dtype_given = !rd.empty();
  if (m.router_dtype_given) m.router_dtype = dtype_from_name(rd);
  const int b = j.at("balance");
  MCPP_CHECK(b >= 0 && b <= 3, "moe.balance {} is not a load-balancing type", b);
  m.balance = model::TransformerConfig::Moe::Balance(b);
  m.aux_loss_coeff = j.at("aux_loss_coeff"), m.z_loss_coeff = j.at("z_loss_coeff");
  m.capacity_factor = j.at("capacity_factor"), m.pad_to_capacity = j.at("pad_to_capacity");
  m.drop_by_position = j.at("drop_by_position");
  m.shared_ffn_hidden_size = j.at("shared_ffn_hidden_size");
  m.shared_expert_gate = j.at("shared_expert_gate");
  return m;
}

}  // namespace mcpp::checkpoint
