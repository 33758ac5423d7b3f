// Multi-token prediction's flags (model/mtp.h): --mtp-num-layers and
// --mtp-loss-scaling-factor, Megatron's constraints and what megatron.cpp does not do yet.
#include "base/error.h"
#include "training/arguments.h"

namespace mcpp::training {

void validate_mtp(const Args& a) {
  const int64_t D = a.mtp_num_layers.value_or(0);
  MCPP_CHECK_HINT(D >= 0, "give --mtp-num-layers 1 (DeepSeek-V3's) or more",
                  "--mtp-num-layers {} must not be negative", D);
  if (D == 0) {  // Megatron reads 0 as no MTP; the factor then scales nothing
    MCPP_CHECK_HINT(a.mtp_loss_scaling_factor == 0.1 || !a.was_given("mtp_loss_scaling_factor"),
                    "add --mtp-num-layers N, or drop --mtp-loss-scaling-factor",
                    "--mtp-loss-scaling-factor {} without --mtp-num-layers scales no loss",
                    a.mtp_loss_scaling_factor);
    return;
  }
  MCPP_CHECK_HINT(a.position_embedding_type == "rope" || a.position_embedding_type == "yarn",
                  "add --position-embedding-type rope",
                  "--mtp-num-layers with --position-embedding-type {}: multi-token prediction "
                  "needs rotary positions (Megatron asserts the same)",
                  a.position_embedding_type);
}

}  // namespace mcpp::training
