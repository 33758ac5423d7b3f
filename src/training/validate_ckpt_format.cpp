// --ckpt-format: torch_dist (the default) is megatron.cpp's own sharded format; torch writes
// Megatron-LM's legacy layout (checkpoint/megatron/megatron_train.h). What the legacy layout
// cannot hold here is refused at start-up, naming both flags.
#include <fmt/format.h>

#include "base/error.h"
#include "training/arguments.h"

namespace mcpp::training {

void validate_ckpt_format(const Args& a) {
  const std::string& f = a.ckpt_format;
  MCPP_CHECK_HINT(f == "torch_dist" || f == "torch",
                  "use the default --ckpt-format torch_dist (megatron.cpp's own sharded format), "
                  "or torch (Megatron-LM's legacy layout)",
                  "--ckpt-format {} is not implemented by megatron.cpp (it writes torch_dist, "
                  "its own sharded format, and torch, Megatron-LM's legacy layout)",
                  f);
  if (f != "torch") return;
  const char* fix = "; or use the default --ckpt-format torch_dist";
  auto refuse = [&](bool bad, const char* flag, const char* why, const char* drop) {
    MCPP_CHECK_HINT(!bad, fmt::format("{}{}", drop, fix), "--ckpt-format torch with {}: {}", flag,
                    why);
  };
  refuse(a.use_distributed_optimizer, "--use-distributed-optimizer",
         "Megatron keeps the distributed optimizer's state in distrib_optim.pt files, which "
         "megatron.cpp does not write",
         "drop --use-distributed-optimizer");
  refuse(a.async_save, "--async-save",
         "asynchronous saves are not implemented for legacy checkpoints (as in Megatron-LM, "
         "whose --async-save needs a distributed checkpoint format)",
         "drop --async-save");
  refuse(a.num_experts.has_value(), "--num-experts",
         "mixture-of-experts models in the legacy layout are not implemented yet",
         "train a dense model");
  refuse(a.mtp_num_layers.value_or(0) > 0, "--mtp-num-layers",
         "multi-token prediction layers in the legacy layout are not implemented yet",
         "save with the default --ckpt-format torch_dist");
  refuse(a.multi_latent_attention, "--multi-latent-attention",
         "multi-latent attention models in the legacy layout are not implemented yet",
         "save with the default --ckpt-format torch_dist");
  refuse(a.qk_layernorm, "--qk-layernorm",
         "q/k layernorm models in the legacy layout are not implemented yet",
         "drop --qk-layernorm");
  refuse(a.context_parallel_size > 1, "--context-parallel-size > 1",
         "not implemented yet for the legacy layout", "drop --context-parallel-size");
  refuse(a.virtual_pipeline_model_parallel_size > 1, "virtual pipeline stages",
         "Megatron writes one model chunk per virtual stage (model0, model1, ...), which the "
         "legacy writer does not implement yet",
         "drop the virtual-stage flag");
  refuse(a.decoder_first_pipeline_num_layers || a.decoder_last_pipeline_num_layers,
         "--decoder-first/last-pipeline-num-layers",
         "the legacy layout splits the layers evenly over the pipeline stages",
         "drop the uneven-stage flags");
  refuse(a.fp16, "--fp16",
         "the loss scaler's state is not read back from a legacy checkpoint yet (a resume would "
         "not continue bit for bit)",
         "train with --bf16");
  refuse(a.fp8.has_value(), "--fp8-format",
         "the FP8 scaling state has no place in the legacy layout here", "drop --fp8-format");
}

}  // namespace mcpp::training
