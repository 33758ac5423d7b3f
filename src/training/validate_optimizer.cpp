// --optimizer and the settings of the rule it picks (optim/optimizer.h: AdamW, SGD with
// momentum, Lion; optim/muon.h: Muon), with what megatron.cpp does not do yet.
#include <set>
#include <utility>

#include "base/error.h"
#include "base/log.h"
#include "training/arguments.h"

namespace mcpp::training {

// --use-precision-aware-optimizer and the state dtypes it enables (Megatron's
// OptimizerConfig): the Adam moments in fp32 or bf16; the main gradients and parameters
// stay fp32 (bf16 models already keep the main parameters' lower 16 bits only, as
// TransformerEngine's store_param_remainders does).
static void validate_precision_aware(const Args& a) {
  // (Not implemented whether or not the switch is given: Megatron-LM also reads
  // --main-grads-dtype without it, to accumulate bf16 gradients.)
  MCPP_CHECK_HINT(a.main_grads_dtype == "fp32",
                  "drop --main-grads-dtype; --grad-reduce-in-bf16 reduces the gradients in "
                  "bf16",
                  "--main-grads-dtype {} is not implemented yet by megatron.cpp (gradients "
                  "accumulate in fp32 buffers)",
                  a.main_grads_dtype);
  MCPP_CHECK_HINT(a.main_params_dtype == "fp32",
                  "drop --main-params-dtype; with --bf16 the fp32 main parameters already cost "
                  "2 bytes a parameter (their lower halves beside the bf16 weights)",
                  "--main-params-dtype {} is not implemented yet by megatron.cpp",
                  a.main_params_dtype);
  const std::pair<const char*, const std::string*> dtypes[] = {
      {"--exp-avg-dtype", &a.exp_avg_dtype}, {"--exp-avg-sq-dtype", &a.exp_avg_sq_dtype}};
  for (auto [flag, v] : dtypes)
    MCPP_CHECK_HINT(*v == "fp32" || a.use_precision_aware_optimizer,
                    fmt::format("add --use-precision-aware-optimizer (with "
                                "--use-distributed-optimizer), or drop {}",
                                flag),
                    "{} {} takes effect only with --use-precision-aware-optimizer (Megatron-LM "
                    "would ignore it)",
                    flag, *v);
  if (!a.use_precision_aware_optimizer) return;
  MCPP_CHECK_HINT(a.use_distributed_optimizer, "add --use-distributed-optimizer",
                  "--use-precision-aware-optimizer is supported only with the distributed "
                  "optimizer (as in Megatron-LM)");
  for (auto [flag, v] : dtypes) {
    MCPP_CHECK_HINT(*v == "fp32" || *v == "bf16", fmt::format("give {} bf16 or fp32", flag),
                    "{} {} is not implemented yet by megatron.cpp (TransformerEngine keeps fp16 "
                    "and fp8 moments with per-tensor scales)",
                    flag, *v);
    MCPP_CHECK_HINT(*v == "fp32" || a.optimizer == "adam",
                    fmt::format("use --optimizer adam, or drop {}", flag),
                    "{} {} with --optimizer {}: Megatron-LM gives the moment dtypes to Adam "
                    "only",
                    flag, *v, a.optimizer);
  }
}

// --optimizer muon and its --muon-* flags (the parser checks the choices of --muon-scale-mode,
// --muon-tp-mode and --muon-scalar-optimizer): what Megatron and its emerging_optimizers
// package reject (an unknown coefficient set, cubic5 with other than 5 steps), at start-up.
static void validate_muon(const Args& a) {
  MCPP_CHECK_HINT(!a.fp16, "use --bf16", "--optimizer muon with --fp16: Megatron-LM refuses "
                  "emerging optimizers with fp16 (ValueError)");
  MCPP_CHECK_HINT(!a.muon_use_syrk, "drop --muon-use-syrk (the same update, by GEMMs)",
                  "--muon-use-syrk (a Triton SYRK kernel for the Gram matrix) is not "
                  "implemented yet by megatron.cpp");
  MCPP_CHECK_HINT(a.muon_fp32_matmul_prec == "medium" || a.muon_fp32_matmul_prec == "high",
                  "give medium (bf16 Newton-Schulz, Megatron's default) or high (fp32)",
                  "--muon-fp32-matmul-prec {}: PyTorch's float32 matmul precision has no such "
                  "level (Megatron-LM fails at its first step)",
                  a.muon_fp32_matmul_prec);
  const std::set<std::string> coeffs = {"simple",      "quintic", "polar_express", "cans",
                                        "aol",         "deepseekv4", "cubic5"};
  MCPP_CHECK_HINT(coeffs.count(a.muon_coefficient_type),
                  "give simple, quintic, polar_express, cans, aol, deepseekv4 or cubic5 "
                  "(custom needs coefficient sets that no flag gives)",
                  "--muon-coefficient-type {} is not a Newton-Schulz coefficient set",
                  a.muon_coefficient_type);
  MCPP_CHECK_HINT(a.muon_num_ns_steps >= 1, "give --muon-num-ns-steps 1 or more (default 5)",
                  "--muon-num-ns-steps {} must be at least 1", a.muon_num_ns_steps);
  MCPP_CHECK_HINT(a.muon_coefficient_type != "cubic5" || a.muon_num_ns_steps == 5,
                  "give --muon-num-ns-steps 5 with cubic5",
                  "--muon-coefficient-type cubic5 is a fixed 5-step schedule; got "
                  "--muon-num-ns-steps {}",
                  a.muon_num_ns_steps);
  MCPP_CHECK_HINT(a.muon_momentum >= 0 && a.muon_momentum < 1, "give --muon-momentum in [0, 1)",
                  "--muon-momentum {} must lie in [0, 1)", a.muon_momentum);
}

void validate_optimizer_rule(Args& a) {
  // Megatron-LM's deprecated spelling of Muon with its layer-wise distributed optimizer.
  if (a.optimizer == "dist_muon") {
    static bool said = false;  // validate_args may run more than once (`megatron plan`)
    if (!std::exchange(said, true))
      log::warn("--optimizer dist_muon is deprecated in Megatron-LM: it means --optimizer muon "
                "--use-distributed-optimizer");
    a.optimizer = "muon";
    a.use_distributed_optimizer = true;
  }
  static const std::set<std::string> later = {"soap"};
  MCPP_CHECK_HINT(!later.count(a.optimizer),
                  "use --optimizer adam (Megatron's default), sgd, lion, muon or adaptive_muon",
                  "--optimizer {} (emerging_optimizers' matrix optimizer) is not implemented yet "
                  "by megatron.cpp",
                  a.optimizer);
  MCPP_CHECK_HINT(a.sgd_momentum >= 0, "give --sgd-momentum 0 (plain SGD) or more",
                  "--sgd-momentum {} must not be negative", a.sgd_momentum);
  for (auto [flag, beta] : {std::pair{"--lion-beta1", a.lion_beta1},
                            std::pair{"--lion-beta2", a.lion_beta2}})
    MCPP_CHECK_HINT(beta >= 0 && beta < 1, fmt::format("give {} in [0, 1)", flag),
                    "{} {} must lie in [0, 1)", flag, beta);
  validate_precision_aware(a);
  if (a.optimizer == "muon" || a.optimizer == "adaptive_muon") validate_muon(a);
  if (a.optimizer == "adam") return;
  // Megatron-LM's legacy layout carries Adam's state (exp_avg / exp_avg_sq) only.
  MCPP_CHECK_HINT(a.ckpt_format != "torch" || a.no_save_optim || !a.save,
                  "use the default --ckpt-format torch_dist, or add --no-save-optim",
                  "--ckpt-format torch with --optimizer {}: the legacy layout holds Adam's "
                  "state only",
                  a.optimizer);
}

}  // namespace mcpp::training
