// Megatron's per-iteration log line and validation line (megatron.md §5.4), byte for byte,
// so scripts that parse Megatron logs read ours. One field is ours: "tokens per second per
// GPU", appended after Megatron's last field when given (docs/flags.md says so).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace mcpp::training {

struct IterationLog {
  std::string timestamp;  // "%Y-%m-%d %H:%M:%S.%f"; empty: now_timestamp()
  int64_t iteration = 0;
  int64_t train_iters = 0;
  int64_t consumed_samples = 0;
  int64_t skipped_samples = 0;  // printed only when > 0, as Megatron
  double elapsed_ms_per_iteration = 0.0;
  std::optional<double> throughput_tflops;  // with --log-throughput
  // --log-energy: joules per iteration per GPU, and their mean power, watts per GPU.
  std::optional<double> energy_j_per_iteration, power_w;
  std::optional<double> learning_rate;      // nullopt prints "None"
  std::optional<double> decoupled_learning_rate;  // --decoupled-lr (first/last stage)
  int64_t global_batch_size = 0;
  std::vector<std::pair<std::string, double>> losses;  // {"lm loss", 10.76}; <= 0 not printed
  double loss_scale = 1.0;
  std::optional<double> grad_norm;
  std::optional<int64_t> num_zeros_in_grad;
  std::optional<double> params_norm;
  int64_t skipped_iterations = 0;
  int64_t nan_iterations = 0;
  std::optional<double> tokens_per_sec_per_gpu;  // megatron.cpp's addition, printed last
};

// " [2026-11-29 15:46:11.709595] iteration        5/      30 | consumed samples: ... |"
std::string format_iteration_line(const IterationLog& log);

// " validation loss at iteration 100 | lm loss value: 5.000000E+00 | lm loss PPL: 1.484132E+02 | "
// PPL = exp(min(20, loss)), as Megatron. `where` is e.g. "iteration 100"; `suffix` names
// one of several validation sets (" validation-wiki loss at ...").
std::string format_validation_line(const std::string& where,
                                   const std::vector<std::pair<std::string, double>>& losses,
                                   const std::string& suffix = "");
// The dashed rule Megatron prints above and below the validation line.
std::string validation_rule(const std::string& validation_line);

// Local wall-clock time with microseconds, as Python's datetime.now() formats it.
std::string now_timestamp();

}  // namespace mcpp::training
