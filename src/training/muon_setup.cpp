#include "training/muon_setup.h"

#include "base/log.h"
#include "optim/muon.h"

namespace mcpp::training {

namespace {

// The Muon settings of the flags. --muon-split-qkv: Megatron's split of one query group's
// QKV rows (multi-latent attention has no linear_qkv). adaptive_muon's beta2 and eps are
// Megatron's OptimizerConfig defaults (no flag sets them).
optim::MuonConfig muon_settings(const Args& a, const model::TransformerConfig& m) {
  optim::MuonConfig c;
  c.momentum = a.muon_momentum;
  c.nesterov = a.muon_nesterov;
  c.scale = optim::parse_muon_scale(a.muon_scale_mode);
  c.extra_scale = a.muon_extra_scale_factor;
  c.coefficients = a.muon_coefficient_type;
  c.ns_steps = int(a.muon_num_ns_steps);
  c.bf16_matmul = a.muon_fp32_matmul_prec == "medium";
  c.tp_mode = optim::parse_muon_tp_mode(a.muon_tp_mode);
  if (a.muon_split_qkv && !m.mla.on)
    c.qkv_split = {m.heads_per_group() * m.kv_channels, m.kv_channels, m.kv_channels};
  c.adaptive = a.optimizer == "adaptive_muon";
  return c;
}

}  // namespace

void enable_muon_from_args(optim::Optimizer& o, const Args& a, const model::TransformerConfig& m,
                           const parallel::ParallelState& ps, const model::ParamStore& P) {
  using parallel::Group;
  const optim::MuonConfig c = muon_settings(a, m);
  o.enable_muon(c, {ps.has(Group::TP) ? &ps.tp() : nullptr,
                    ps.has(Group::ExpertTP) ? &ps.group(Group::ExpertTP) : nullptr});
  int64_t mats = 0, mat_numel = 0;
  for (const auto& p : P.infos())
    if (optim::muon_steps(p)) ++mats, mat_numel += p.numel();
  log::info("> optimizer: {} for {} matrices ({} parameters on this rank; {} Newton-Schulz "
            "steps, {}, {} GEMMs, tp mode {}{}), {} for the other {} parameters",
            c.adaptive ? fmt::format("adaptive Muon (AdaMuon: second moment beta2 {}, eps {:g})",
                                     c.adaptive_beta2, c.adaptive_eps)
                       : std::string("Muon"),
            mats, mat_numel, a.muon_num_ns_steps, a.muon_coefficient_type,
            c.bf16_matmul ? "bf16" : "fp32", a.muon_tp_mode,
            a.use_distributed_optimizer
                ? "; distributed: each matrix orthogonalised by one data-parallel rank"
                : "",
            a.muon_scalar_optimizer, P.total_numel() - mat_numel);
}

}  // namespace mcpp::training
