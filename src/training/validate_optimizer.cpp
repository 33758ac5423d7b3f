// --optimizer and the settings of the rule it picks (optim/optimizer.h: AdamW, SGD with
// momentum, Lion), with what megatron.cpp does not do yet.
#include <set>

#include "base/error.h"
#include "training/arguments.h"

namespace mcpp::training {

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
  if (a.optimizer == "adam") return;
  // Megatron-LM's legacy layout carries Adam's state (exp_avg / exp_avg_sq) only.
  MCPP_CHECK_HINT(a.ckpt_format != "torch" || a.no_save_optim || !a.save,
                  "use the default --ckpt-format torch_dist, or add --no-save-optim",
                  "--ckpt-format torch with --optimizer {}: the legacy layout holds Adam's "
                  "state only",
                  a.optimizer);
}

}  // namespace mcpp::training
