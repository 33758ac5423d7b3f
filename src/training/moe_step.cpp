#include "training/moe_step.h"

#include "model/moe/moe_layer.h"
#include "ops/ops.h"
#include "parallel/host_collectives.h"
#include "training/forward_backward.h"

namespace mcpp::training {

std::vector<std::pair<std::string, double>> moe_finish_global_batch(
    model::GPTModel& m, const parallel::ParallelState& ps, bool per_layer_logging) {
  const auto& c = m.config();
  if (c.moe.num_experts == 0) return {};
  // The decoder's MoE layers and the MTP depths' (built like the last decoder layer).
  const std::vector<model::moe::MoeLayer*> layers = m.stage().moe_layers();
  const int64_t E = c.moe.num_experts;
  for (auto* l : layers) l->sync_stats();  // the device routing's losses, once per batch
  // Expert bias: counts over DP x CP (a TP group routes the same tokens on every member),
  // then the sign update (Megatron's get_updated_expert_bias).
  if (c.moe.expert_bias) {
    std::vector<double> counts;
    for (auto* l : layers)
      counts.insert(counts.end(), l->stats().tokens_per_expert.begin(),
                    l->stats().tokens_per_expert.end());
    parallel::sum_over(data_cp_group(ps), counts);
    for (size_t i = 0; i < layers.size(); ++i) {
      std::vector<double> b = layers[i]->router().expert_bias();
      double mean = 0;
      for (int64_t e = 0; e < E; ++e) mean += counts[i * size_t(E) + size_t(e)];
      mean /= double(E);
      for (int64_t e = 0; e < E; ++e) {
        const double off = mean - counts[i * size_t(E) + size_t(e)];
        b[size_t(e)] += c.moe.bias_update_rate * double((off > 0) - (off < 0));
      }
      layers[i]->router().set_expert_bias(b);
    }
  }
  // Log values, per global layer: [aux_loss, seq_aux_loss, global_aux_loss, z-loss] blocks of
  // layers 0..L-1, the MTP depths' layers as layers L, L+1, ... (Megatron's numbering).
  const size_t L = size_t(c.num_layers + c.mtp_num_layers);
  std::vector<double> v(4 * L, 0.0);
  auto index = [&](int layer) {
    return model::TransformerConfig::is_mtp_layer(layer)
               ? size_t(c.num_layers) + size_t(layer - model::TransformerConfig::kMtpLayerBase)
               : size_t(layer);
  };
  for (auto* l : layers) {
    const auto& s = l->stats();
    const double n = double(std::max<int64_t>(1, s.forwards));
    for (size_t i = 0; i < 3; ++i) v[i * L + index(l->layer())] = s.aux_loss[i] / n;
    v[3 * L + index(l->layer())] = s.z_loss / n;
  }
  // Summed over the pipeline (each stage its layers) and over CP (each rank its tokens'
  // share of the losses, routing.h), averaged over DP, but global_aux_loss's: each DP rank
  // holds its tokens' share of the global batch's loss (Megatron's needs_dp_avg=False).
  if (ps.layout().pp() > 1) parallel::sum_over(ps.pp(), v);
  parallel::sum_over(data_cp_group(ps), v);
  for (size_t i = 0; i < v.size(); ++i)
    if (i / L != 2) v[i] /= double(ps.layout().dp());
  for (auto* l : layers) l->stats().restart();  // the next global batch starts counting
  // The mean is over the MoE layers and every MTP depth (Megatron's count).
  int64_t moe_layers = c.mtp_num_layers;
  for (int64_t i = 0; i < c.num_layers; ++i) moe_layers += c.is_moe_layer(i);
  auto is_moe = [&](size_t i) {
    return i >= size_t(c.num_layers)
               ? c.is_moe_layer(model::TransformerConfig::kMtpLayerBase)
               : c.is_moe_layer(int64_t(i));
  };
  std::vector<std::pair<std::string, double>> out;
  auto add = [&](bool on, const std::string& name, size_t base) {
    if (!on) return;
    double sum = 0;
    for (size_t i = 0; i < L; ++i) sum += v[base + i];
    out.push_back({name, sum / double(std::max<int64_t>(1, moe_layers))});
    if (per_layer_logging)
      for (size_t i = 0; i < L; ++i)
        if (is_moe(i))
          out.push_back({name + " layer " + std::to_string(i), v[base + i]});
  };
  // Each enabled aux loss under Megatron's name, then the z-loss.
  using Balance = model::TransformerConfig::Moe::Balance;
  add(c.moe.coeff(Balance::AuxLoss) > 0, "load_balancing_loss", 0);
  add(c.moe.coeff(Balance::SeqAuxLoss) > 0, "seq_load_balancing_loss", L);
  add(c.moe.coeff(Balance::GlobalAuxLoss) > 0, "global_load_balancing_loss", 2 * L);
  add(c.moe.z_loss_coeff > 0, "z_loss", 3 * L);
  return out;
}

}  // namespace mcpp::training
