// The batch flags (Megatron's validate_args, its batch part): the global batch from
// micro-batch x DP, --step-batch-size-schedule's last batch, --decrease-batch-size-if-needed's
// running batch, and the evaluation batch; errors name the flag and end in a HINT.
#include <fmt/format.h>

#include "base/error.h"
#include "base/log.h"
#include "training/arguments.h"
#include "training/validate_compat.h"

namespace mcpp::training {

void validate_batch(Args& a) {
  // Batch: global = micro * DP * num_microbatches.
  const int64_t per_step = a.micro_batch_size * a.data_parallel_size;
  if (!a.was_given("global_batch_size")) a.global_batch_size = per_step;
  if (a.step_batch_size_schedule) {  // Megatron's checks, then the schedule's last batch
    const char* hint = "the schedule sets the global batch: drop the other flag";
    MCPP_CHECK_HINT(!a.was_given("global_batch_size"), hint,
                    "Cannot specify both --step-batch-size-schedule and --global-batch-size");
    MCPP_CHECK_HINT(!a.rampup_batch_size, hint,
                    "Cannot specify both --step-batch-size-schedule and --rampup-batch-size");
    MCPP_CHECK_HINT(!a.decrease_batch_size_if_needed, "drop --decrease-batch-size-if-needed",
                    "Cannot specify both --step-batch-size-schedule and "
                    "--decrease-batch-size-if-needed");
    // Megatron leaves args.global_batch_size at MBS x DP here (so --train-iters runs' decay
    // samples would count those); the steady-state batch is what the ramp-up uses too.
    a.global_batch_size =
        data::parse_step_batch_schedule(*a.step_batch_size_schedule, a.seq_length).final_batch();
    MCPP_CHECK_HINT(a.global_batch_size % per_step == 0,
                    fmt::format("make the schedule's batch sizes multiples of {}", per_step),
                    "--step-batch-size-schedule: the last batch size {} is not a multiple of "
                    "--micro-batch-size {} x data-parallel size {} = {}",
                    a.global_batch_size, a.micro_batch_size, a.data_parallel_size, per_step);
  }
  if (a.global_batch_size % per_step != 0 && a.decrease_batch_size_if_needed &&
      a.global_batch_size > per_step) {
    MCPP_CHECK_HINT(!a.rampup_batch_size,
                    "give a --global-batch-size that --micro-batch-size x DP divides, or drop "
                    "--rampup-batch-size",
                    "--decrease-batch-size-if-needed with --rampup-batch-size is not "
                    "implemented yet");
    const int64_t running = a.global_batch_size / per_step * per_step;
    log::info("decreasing batch size from {} to {} to keep divisibility by micro_batch_size={} "
              "* data_parallel_size={} (--decrease-batch-size-if-needed: {} samples a step "
              "counted as skipped)",
              a.global_batch_size, running, a.micro_batch_size, a.data_parallel_size,
              a.global_batch_size - running);
    a.batch_size_deficit = a.global_batch_size - running;
    a.global_batch_size = running;
  }
  if (a.global_batch_size % per_step != 0) {
    const int64_t lo = a.global_batch_size / per_step * per_step;
    throw Error(
        fmt::format("--global-batch-size {} is not a multiple of --micro-batch-size {} x "
                    "data-parallel size {} = {}",
                    a.global_batch_size, a.micro_batch_size, a.data_parallel_size, per_step),
        fmt::format(
            "use a multiple of {}, e.g. {}{}", per_step,
            lo > 0 ? fmt::format("{} or {}", lo, lo + per_step) : std::to_string(per_step),
            lo > 0 ? " (or add --decrease-batch-size-if-needed to round it down)" : ""));
  }
  a.num_microbatches = a.global_batch_size / per_step;
  // Evaluation's batch (Megatron: --eval-global-batch-size defaults to the global batch,
  // --eval-micro-batch-size to the micro-batch; evaluation's micro-batches are then of that
  // size, and the global batch must be a multiple of it times DP).
  if (a.eval_micro_batch_size)
    MCPP_CHECK_HINT(*a.eval_micro_batch_size > 0, "give --eval-micro-batch-size a value >= 1",
                    "--eval-micro-batch-size {} must be positive", *a.eval_micro_batch_size);
  a.eval_micro_batch_size = a.eval_micro_batch_size.value_or(a.micro_batch_size);
  const int64_t eval_step = *a.eval_micro_batch_size * a.data_parallel_size;
  const int64_t egbs = a.eval_global_batch_size.value_or(a.global_batch_size);
  MCPP_CHECK_HINT(egbs > 0, "give --eval-global-batch-size a value >= 1",
                  "--eval-global-batch-size {} must be positive", egbs);
  MCPP_CHECK_HINT(egbs % eval_step == 0,
                  fmt::format("use a multiple of {} for --eval-global-batch-size (it defaults to "
                              "--global-batch-size)",
                              eval_step),
                  "--eval-global-batch-size {} must be divisible by the eval micro-batch size "
                  "{} x data-parallel size {} (as in Megatron-LM)",
                  egbs, *a.eval_micro_batch_size, a.data_parallel_size);
  a.eval_global_batch_size = egbs;
  a.eval_num_microbatches = egbs / eval_step;
  if (a.start_eval_at_iter)
    MCPP_CHECK_HINT(*a.start_eval_at_iter >= 0, "give --start-eval-at-iter a value >= 0",
                    "--start-eval-at-iter {} must not be negative", *a.start_eval_at_iter);
}

}  // namespace mcpp::training
