// Validation of the observability flags (TensorBoard, timers, progress log): values in
// range, and the flags that only act with --tensorboard-dir are errors without it (never
// ignored), as are the straggler detector's without --log-straggler; so is --log-progress
// without --save, whose folder holds progress.txt.
#include "base/error.h"
#include "training/arguments.h"

namespace mcpp::training {

void validate_observe(const Args& a) {
  if (a.log_memory_interval)
    MCPP_CHECK_HINT(*a.log_memory_interval > 0 && *a.log_memory_interval % a.log_interval == 0,
                    fmt::format("give --log-memory-interval a multiple of --log-interval ({})",
                                a.log_interval),
                    "--log-memory-interval {} is not a positive multiple of --log-interval {} "
                    "(the memory line follows an iteration line)",
                    *a.log_memory_interval, a.log_interval);
  MCPP_CHECK_HINT(a.timing_log_option == "max" || a.timing_log_option == "minmax" ||
                      a.timing_log_option == "all",
                  "use --timing-log-option max, minmax or all",
                  "--timing-log-option {} is not one of max, minmax, all", a.timing_log_option);
  MCPP_CHECK_HINT(a.timing_log_level >= 0 && a.timing_log_level <= 2,
                  "use --timing-log-level 0, 1 or 2", "--timing-log-level {} is not 0, 1 or 2",
                  a.timing_log_level);
  MCPP_CHECK_HINT(a.tensorboard_log_interval >= 1, "use --tensorboard-log-interval N with N >= 1",
                  "--tensorboard-log-interval {} must be positive", a.tensorboard_log_interval);
  MCPP_CHECK_HINT(a.tensorboard_queue_size >= 1, "use --tensorboard-queue-size N with N >= 1",
                  "--tensorboard-queue-size {} must be positive", a.tensorboard_queue_size);
  // Megatron's append_to_progress_log returns silently without --save: no file, no word.
  MCPP_CHECK_HINT(!a.log_progress || a.save, "add --save DIR, or drop --log-progress",
                  "--log-progress appends to <--save>/progress.txt, but no --save was given");
  MCPP_CHECK_HINT(!a.tensorboard_dir || !a.tensorboard_dir->empty(),
                  "give --tensorboard-dir a folder", "--tensorboard-dir is empty");
  MCPP_CHECK_HINT(a.straggler_ctrlr_port >= 1 && a.straggler_ctrlr_port <= 65535,
                  "give --straggler-ctrlr-port a TCP port in 1..65535",
                  "--straggler-ctrlr-port {} is not a TCP port", a.straggler_ctrlr_port);
  MCPP_CHECK_HINT(a.straggler_minmax_count >= 1, "use --straggler-minmax-count N with N >= 1",
                  "--straggler-minmax-count {} must be positive", a.straggler_minmax_count);
  if (!a.log_straggler)
    for (const char* dest :
         {"straggler_ctrlr_port", "straggler_minmax_count", "disable_straggler_on_startup"})
      MCPP_CHECK_HINT(!a.given.count(dest), "add --log-straggler, or drop the flag",
                      "{} configures the straggler detector, but no --log-straggler was given",
                      flag_name(dest));
  if (a.tensorboard_dir) return;
  for (const char* dest :
       {"tensorboard_log_interval", "tensorboard_queue_size", "log_timers_to_tensorboard",
        "log_loss_scale_to_tensorboard", "log_validation_ppl_to_tensorboard",
        "log_memory_to_tensorboard", "log_world_size_to_tensorboard"})
    MCPP_CHECK_HINT(!a.given.count(dest),
                    "add --tensorboard-dir DIR, or drop the flag",
                    "{} acts on TensorBoard logs, but no --tensorboard-dir was given",
                    a.given.count(dest) && dest == std::string("log_loss_scale_to_tensorboard")
                        ? "--no-log-loss-scale-to-tensorboard"
                        : flag_name(dest));
}

}  // namespace mcpp::training
