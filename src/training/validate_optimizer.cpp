// --optimizer and the settings of the rule it picks (optim/optimizer.h: AdamW, SGD with
// momentum, Lion), with what megatron.cpp does not do yet.
#include <set>
#include <utility>

#include "base/error.h"
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

void validate_optimizer_rule(const Args& a) {
  static const std::set<std::string> later = {"muon", "dist_muon", "soap", "adaptive_muon"};
  MCPP_CHECK_HINT(!later.count(a.optimizer),
                  "use --optimizer adam (Megatron's default), sgd or lion",
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
  if (a.optimizer == "adam") return;
  // Megatron-LM's legacy layout carries Adam's state (exp_avg / exp_avg_sq) only.
  MCPP_CHECK_HINT(a.ckpt_format != "torch" || a.no_save_optim || !a.save,
                  "use the default --ckpt-format torch_dist, or add --no-save-optim",
                  "--ckpt-format torch with --optimizer {}: the legacy layout holds Adam's "
                  "state only",
                  a.optimizer);
}

}  // namespace mcpp::training
