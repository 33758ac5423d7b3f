#include "training/validate_compat.h"
#include "training/validate_fp8.h"

#include <cmath>

#include <fmt/format.h>

#include "base/error.h"
#include "base/log.h"
#include "data/num_microbatches.h"
#include "optim/lr_scheduler.h"

namespace mcpp::training {

std::optional<data::BatchRampup> batch_rampup(const Args& a) {
  if (!a.rampup_batch_size) return std::nullopt;
  const auto& r = *a.rampup_batch_size;  // the parser took exactly 3 integers
  return data::BatchRampup{r.at(0), r.at(1), r.at(2)};
}

void validate_compat(Args& a, bool training) {
  // Batch-size ramp-up: Megatron's calculator checks, before any process group exists.
  if (const auto r = batch_rampup(a)) {
    data::NumMicroBatchesCalculator check(a.global_batch_size, a.micro_batch_size,
                                          a.data_parallel_size, r);
    (void)check;
    // update_train_iters: a sample-based run's steps follow the ramp.
    if (training && a.train_samples)
      a.train_iters = data::rampup_train_iters(*a.train_samples, a.global_batch_size,
                                               a.micro_batch_size, a.data_parallel_size, *r);
  }
  // Decoupled learning rate of the embedding and output layer.
  if (a.decoupled_min_lr)
    MCPP_CHECK_HINT(a.decoupled_lr.has_value(), "add --decoupled-lr, or drop --decoupled-min-lr",
                    "--decoupled-min-lr {} is the minimum of the decoupled learning rate, but "
                    "--decoupled-lr was not given (the flag would act on nothing)",
                    *a.decoupled_min_lr);
  if (a.decoupled_lr && training) {
    const double lo = a.decoupled_min_lr.value_or(a.min_lr);
    MCPP_CHECK_HINT(*a.decoupled_lr >= 0 && *a.decoupled_lr <= 1e4,
                    "give --decoupled-lr a learning rate such as 3e-4",
                    "--decoupled-lr {} is outside [0, 1e4]", *a.decoupled_lr);
    MCPP_CHECK_HINT(lo >= 0 && lo <= *a.decoupled_lr,
                    "give --decoupled-min-lr between 0 and --decoupled-lr",
                    "the decoupled minimum learning rate {} ({}) is outside [0, --decoupled-lr "
                    "{}]",
                    lo, a.decoupled_min_lr ? "--decoupled-min-lr" : "--min-lr, the default",
                    *a.decoupled_lr);
    MCPP_CHECK_HINT(a.lr_warmup_init <= *a.decoupled_lr,
                    "lower --lr-warmup-init to at most --decoupled-lr",
                    "--lr-warmup-init {} is larger than --decoupled-lr {} (the decoupled group "
                    "warms up from it too)",
                    a.lr_warmup_init, *a.decoupled_lr);
  }
  if (!a.mmap_bin_files && a.data_path.empty())
    log::info("--no-mmap-bin-files: no .bin file is read (--mock-data); nothing to change");
  if (a.use_checkpoint_args)
    MCPP_CHECK_HINT(a.load.has_value(), "add --load DIR (the checkpoint whose arguments to use)",
                    "--use-checkpoint-args reads the model's arguments from --load's checkpoint, "
                    "but --load was not given");
  // The schedule again, now with the ramp-up's train_iters (weight-decay length).
  if (training) {
    optim::OptimizerParamScheduler check(lr_scheduler_config(a));
    (void)check;
  }
}

void check_trainer_support(const Args& a, Device dev, bool query_gpu) {
  // Precision: say exactly which flag to drop.
  if ((a.bf16 || a.fp16) && dev == Device::CPU) {
    const char* flag = a.bf16 ? "--bf16" : "--fp16";
    throw Error(fmt::format("{} on the CPU backend: the CPU backend trains in fp32 only, and {}",
                            flag,
                            a.device == "cpu" ? "--device cpu was given"
                                              : "no GPU is visible (or this build has no CUDA)"),
                fmt::format("drop {} to train in fp32 on the CPU, or train on a GPU "
                            "(--device cuda)",
                            flag));
  }
  MCPP_CHECK_HINT(!a.save_interval || a.save, "add --save DIR",
                  "--save-interval {} given without --save", *a.save_interval);
  MCPP_CHECK_HINT(!a.save_interval || *a.save_interval > 0, "use a positive interval",
                  "--save-interval must be positive, got {}", *a.save_interval);
  MCPP_CHECK_HINT(!a.async_save || a.save, "add --save DIR", "--async-save needs --save");
  check_fp8_device(a, dev, query_gpu);  // FP8 needs --bf16 and a GPU with FP8 (validate_fp8.cpp)
}

}  // namespace mcpp::training
