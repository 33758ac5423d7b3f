// Validation of the observability flags (TensorBoard, timers, progress log): values in
// range, and the flags that only act with --tensorboard-dir are errors without it (never
// ignored), as are the straggler detector's without --log-straggler; so is --log-progress
// without --save, whose folder holds progress.txt, and checkpoints under
// --fake-process-group.
#include <utility>

#include "base/error.h"
#include "training/arguments.h"

namespace mcpp::training {

std::optional<int> signal_number(const std::string& name) {
  static const std::pair<const char*, int> kSignals[] = {
      {"SIGHUP", 1},     {"SIGINT", 2},     {"SIGQUIT", 3},   {"SIGILL", 4},    {"SIGTRAP", 5},
      {"SIGABRT", 6},    {"SIGIOT", 6},     {"SIGBUS", 7},    {"SIGFPE", 8},    {"SIGKILL", 9},
      {"SIGUSR1", 10},   {"SIGSEGV", 11},   {"SIGUSR2", 12},  {"SIGPIPE", 13},  {"SIGALRM", 14},
      {"SIGTERM", 15},   {"SIGSTKFLT", 16}, {"SIGCHLD", 17},  {"SIGCONT", 18},  {"SIGSTOP", 19},
      {"SIGTSTP", 20},   {"SIGTTIN", 21},   {"SIGTTOU", 22},  {"SIGURG", 23},   {"SIGXCPU", 24},
      {"SIGXFSZ", 25},   {"SIGVTALRM", 26}, {"SIGPROF", 27},  {"SIGWINCH", 28}, {"SIGIO", 29},
      {"SIGPOLL", 29},   {"SIGPWR", 30},    {"SIGSYS", 31},   {"SIGRTMIN", 34}, {"SIGRTMAX", 64}};
  for (const auto& [n, v] : kSignals)
    if (name == n) return v;
  return std::nullopt;
}

void validate_observe(const Args& a) {
  // --exit-signal: Megatron's enum takes a signal's name (signal.Signals[name]).
  const std::optional<int> sig = signal_number(a.exit_signal);
  MCPP_CHECK_HINT(sig.has_value(), "give a signal's name, e.g. --exit-signal SIGUSR1",
                  "--exit-signal {} is not a signal name", a.exit_signal);
  MCPP_CHECK_HINT(*sig != 9 && *sig != 19, "use a signal a process can catch, e.g. SIGUSR1",
                  "--exit-signal {}: this signal cannot be caught", a.exit_signal);
  MCPP_CHECK_HINT(a.exit_signal_handler || a.exit_signal == "SIGTERM",
                  "add --exit-signal-handler (the handler that saves and exits on it)",
                  "--exit-signal {} without --exit-signal-handler: nothing listens for it",
                  a.exit_signal);
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
  // --fake-process-group plays one rank of the job: a checkpoint it wrote would hold that
  // rank's shards alone, and one it read would give every other rank's state to nobody.
  if (a.fake_process_group)
    for (const auto& [flag, dir] : {std::pair{"--save", &a.save}, {"--load", &a.load},
                                    {"--pretrained-checkpoint", &a.pretrained_checkpoint}})
      MCPP_CHECK_HINT(!*dir, fmt::format("drop {} for the profiling run", flag),
                      "--fake-process-group with {} {}: one process plays one rank of {} and "
                      "exchanges nothing, so it neither writes nor reads the job's checkpoints",
                      flag, **dir, a.world_size);
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
