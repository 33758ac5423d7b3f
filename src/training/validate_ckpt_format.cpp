// --ckpt-format: torch_dist (the default) is megatron.cpp's own sharded format; torch writes
// Megatron-LM's legacy layout (checkpoint/megatron/megatron_train.h). What the legacy layout
// cannot hold here is refused at start-up, naming both flags. Also the non-persistent
// checkpoint flags (--non-persistent-*): what a run would silently never do, or could
// delete, is an error before the first step.
#include <fmt/format.h>

#include <filesystem>

#include "base/error.h"
#include "base/log.h"
#include "training/arguments.h"

namespace mcpp::training {

std::string Args::non_persistent_dir(const std::string& root) const {
  if (!non_persistent_ckpt_type) return "";
  if (non_persistent_global_ckpt_dir) return *non_persistent_global_ckpt_dir;
  return (std::filesystem::path(root) / "non_persistent").string();
}

namespace {

// Lexically the same folder ("a/b/" and "./a/b" are), or one is a link to the other.
bool same_folder(const std::string& x, const std::string& y) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path px = fs::weakly_canonical(fs::absolute(x), ec);
  const fs::path py = fs::weakly_canonical(fs::absolute(y), ec);
  auto trim = [](fs::path p) {
    std::string s = p.lexically_normal().string();
    while (s.size() > 1 && s.back() == '/') s.pop_back();
    return s;
  };
  return trim(px) == trim(py);
}

void validate_non_persistent(const Args& a) {
  const auto& type = a.non_persistent_ckpt_type;
  if (type) {
    MCPP_CHECK_HINT(*type != "local",
                    "use --non-persistent-ckpt-type global; --non-persistent-global-ckpt-dir "
                    "may name a fast file system (its folder must be visible to every rank)",
                    "--non-persistent-ckpt-type local (node-local checkpoints, which Megatron-LM "
                    "takes from NVIDIA's resiliency extension) is not implemented by "
                    "megatron.cpp yet");
    MCPP_CHECK_HINT(*type == "global", "use --non-persistent-ckpt-type global",
                    "--non-persistent-ckpt-type {} is not implemented (Megatron-LM accepts only "
                    "global and local)",
                    *type);
  }
  if (const auto n = a.non_persistent_save_interval) {
    MCPP_CHECK_HINT(*n > 0, "use a positive interval",
                    "--non-persistent-save-interval must be positive, got {}", *n);
    MCPP_CHECK_HINT(type.has_value(), "add --non-persistent-ckpt-type global",
                    "--non-persistent-save-interval {} given without --non-persistent-ckpt-type "
                    "(Megatron-LM fails at the first such save)",
                    *n);
    MCPP_CHECK_HINT(a.save.has_value(), "add --save DIR",
                    "--non-persistent-save-interval {} given without --save: no non-persistent "
                    "checkpoint would ever be written",
                    *n);
  }
  MCPP_CHECK_HINT(!a.non_persistent_global_ckpt_dir || type,
                  "add --non-persistent-ckpt-type global",
                  "--non-persistent-global-ckpt-dir {} given without --non-persistent-ckpt-type",
                  a.non_persistent_global_ckpt_dir.value_or(""));
  if (!type) return;
  MCPP_CHECK_HINT(a.non_persistent_save_interval || a.load,
                  "add --non-persistent-save-interval N to write them, or --load DIR to resume "
                  "from them",
                  "--non-persistent-ckpt-type {} given, but no non-persistent checkpoint would "
                  "be written or read",
                  *type);
  // Each non-persistent save deletes the older iter_* folders of its folder: never --save's
  // or --load's own.
  for (const auto* root : {&a.save, &a.load}) {
    if (!*root) continue;
    const std::string dir = a.non_persistent_dir(**root);
    MCPP_CHECK_HINT(!same_folder(dir, **root),
                    "give --non-persistent-global-ckpt-dir a folder of its own (by default "
                    "<save>/non_persistent)",
                    "--non-persistent-global-ckpt-dir {} is the {} folder: each non-persistent "
                    "save deletes the older checkpoints of its folder",
                    dir, root == &a.save ? "--save" : "--load");
  }
}

}  // namespace

// --ckpt-convert-format F --ckpt-convert-save DIR: the run's save becomes DIR/F in format F
// (Megatron's setup_model_and_optimizer), so the checks below are the target format's.
void apply_ckpt_convert(Args& a) {
  MCPP_CHECK_HINT(!a.ckpt_convert_save || a.ckpt_convert_format,
                  "add --ckpt-convert-format torch or torch_dist",
                  "--ckpt-convert-save {} given without --ckpt-convert-format",
                  a.ckpt_convert_save.value_or(""));
  if (!a.ckpt_convert_format) return;
  const std::string& f = *a.ckpt_convert_format;
  MCPP_CHECK_HINT(f == "torch" || f == "torch_dist",
                  "use --ckpt-convert-format torch (Megatron-LM's legacy layout) or torch_dist",
                  "--ckpt-convert-format {} is not a checkpoint format megatron.cpp writes", f);
  MCPP_CHECK_HINT(a.ckpt_convert_save.has_value(), "add --ckpt-convert-save DIR",
                  "--ckpt-convert-format {} needs --ckpt-convert-save (the converted checkpoint "
                  "goes to DIR/{})",
                  f, f);
  MCPP_CHECK_HINT(a.load.has_value(), "add --load DIR (the checkpoint to convert)",
                  "--ckpt-convert-format {} converts the checkpoint of --load, which was not given",
                  f);
  MCPP_CHECK_HINT(!a.non_persistent_save_interval, "drop --non-persistent-save-interval",
                  "--ckpt-convert-format converts and exits without training: "
                  "--non-persistent-save-interval would never save");
  if (a.save && a.was_given("save"))
    log::warn("--ckpt-convert-format {}: --save {} is replaced by {}/{} (as in Megatron-LM)", f,
              *a.save, *a.ckpt_convert_save, f);
  a.ckpt_format = f;
  a.save = (std::filesystem::path(*a.ckpt_convert_save) / f).string();
  a.exit_on_missing_checkpoint = true;
}

void validate_ckpt_format(Args& a) {
  apply_ckpt_convert(a);
  if (const auto n = a.override_ckpt_iteration) {
    MCPP_CHECK_HINT(*n >= 0, "give --override-ckpt-iteration a non-negative iteration",
                    "--override-ckpt-iteration {} is negative", *n);
    MCPP_CHECK_HINT(!a.finetune, "drop --override-ckpt-iteration (--finetune starts at 0)",
                    "--override-ckpt-iteration with --finetune (Megatron-LM refuses the pair)");
    MCPP_CHECK_HINT(a.load || a.pretrained_checkpoint, "add --load DIR",
                    "--override-ckpt-iteration {} needs a checkpoint to load (--load)", *n);
  }
  validate_non_persistent(a);
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
  refuse(a.fp8.has_value(), "--fp8-format",
         "the FP8 scaling state has no place in the legacy layout here", "drop --fp8-format");
}

}  // namespace mcpp::training
