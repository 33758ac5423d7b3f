#include "training/validate_compat.h"

#include <fmt/format.h>

#include <cmath>
#include <cstdint>

#include "base/error.h"
#include "base/log.h"
#include "data/num_microbatches.h"
#include "optim/lr_scheduler.h"
#include "training/validate_fp8.h"

namespace mcpp::training {

std::optional<data::BatchRampup> batch_rampup(const Args& a) {
  if (!a.rampup_batch_size) return std::nullopt;
  const auto& r = *a.rampup_batch_size;  // the parser took exactly 3 integers
  return data::BatchRampup{r.at(0), r.at(1), r.at(2)};
}

std::optional<data::StepBatchSchedule> step_batch_schedule(const Args& a) {
  if (!a.step_batch_size_schedule) return std::nullopt;
  return data::parse_step_batch_schedule(*a.step_batch_size_schedule, a.seq_length);
}

void check_checkpoint_args_source(const Args& a) {
  MCPP_CHECK_HINT(a.load || a.pretrained_checkpoint,
                  "add --load DIR (the checkpoint whose arguments to use)",
                  "--use-checkpoint-args reads the model's arguments from --load's (or "
                  "--pretrained-checkpoint's) checkpoint, but --load was not given (nor "
                  "--pretrained-checkpoint)");
}

namespace {

// --padded-vocab-size and the checkpoint flags of Megatron's example scripts (the
// tokenizer-dependent check of the vocabulary is resolve_padded_vocab_size's).
void validate_checkpoint_flags(const Args& a) {
  if (a.padded_vocab_size) {
    const int64_t n = *a.padded_vocab_size, tp = a.tensor_model_parallel_size;
    MCPP_CHECK_HINT(n > 0 && n < INT32_MAX, "give --padded-vocab-size in [1, 2^31 - 1)",
                    "--padded-vocab-size {} is outside [1, 2^31 - 1) (int32 token ids)", n);
    // The word embedding and the output layer split their rows evenly over TP (Megatron's
    // VocabParallelEmbedding asserts the same divisibility).
    MCPP_CHECK_HINT(n % tp == 0,
                    fmt::format("give --padded-vocab-size a multiple of {} (e.g. {})", tp,
                                (n + tp - 1) / tp * tp),
                    "--padded-vocab-size {} is not divisible by --tensor-model-parallel-size {}: "
                    "the embedding and output layer split their rows evenly over TP ranks",
                    n, tp);
  }
  if (a.save_retain_interval) {
    const int64_t n = *a.save_retain_interval;
    MCPP_CHECK_HINT(a.save && a.save_interval, "add --save DIR --save-interval M",
                    "--save-retain-interval {} keeps every checkpoint whose iteration is a "
                    "multiple of {} and deletes the others, but {} was not given",
                    n, n, a.save ? "--save-interval" : "--save");
    MCPP_CHECK_HINT(n > 0, "give a positive multiple of --save-interval",
                    "--save-retain-interval must be positive, got {}", n);
    const int64_t every = *a.save_interval;  // positive: validate_sizes
    MCPP_CHECK_HINT(every <= 0 || n % every == 0,
                    fmt::format("give --save-retain-interval a multiple of --save-interval {} "
                                "(e.g. {}): only saved iterations can be kept",
                                every, (n + every - 1) / every * every),
                    "--save-retain-interval {} is not a multiple of --save-interval {}", n, every);
  }
}

}  // namespace

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
  if (const auto s = step_batch_schedule(a); s && training && a.train_samples)
    a.train_iters = data::schedule_train_iters(*a.train_samples, *s);
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
  for (int64_t it : a.iterations_to_skip)
    MCPP_CHECK_HINT(it >= 1, "give iteration numbers from 1 (the first step)",
                    "--iterations-to-skip {}: iterations count from 1", it);
  if (a.init_method_xavier_uniform && a.was_given("init_method_std"))
    log::warn("--init-method-xavier-uniform: every weight is Xavier-uniform; --init-method-std "
              "{} is not used (as in Megatron-LM)",
              a.init_method_std);
  if (!a.mmap_bin_files && a.mock_data)
    log::info("--no-mmap-bin-files: no .bin file is read (--mock-data); nothing to change");
  if (a.use_checkpoint_args) check_checkpoint_args_source(a);
  validate_checkpoint_flags(a);
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
