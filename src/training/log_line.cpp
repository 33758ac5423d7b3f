#include "training/log_line.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>

namespace mcpp::training {

std::string now_timestamp() {
  using namespace std::chrono;
  const auto now = system_clock::now();
  const std::time_t t = system_clock::to_time_t(now);
  const auto us = duration_cast<microseconds>(now.time_since_epoch()).count() % 1000000;
  std::tm tm{};
  localtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", &tm);
  return fmt::format("{}.{:06d}", buf, us);
}

std::string format_iteration_line(const IterationLog& l) {
  std::string s = fmt::format(" [{}]", l.timestamp.empty() ? now_timestamp() : l.timestamp);
  s += fmt::format(" iteration {:8d}/{:8d} |", l.iteration, l.train_iters);
  s += fmt::format(" consumed samples: {:12d} |", l.consumed_samples);
  if (l.skipped_samples > 0) s += fmt::format(" skipped samples: {:12d} |", l.skipped_samples);
  s += fmt::format(" elapsed time per iteration (ms): {:.1f} |", l.elapsed_ms_per_iteration);
  if (l.throughput_tflops)
    s += fmt::format(" throughput per GPU (TFLOP/s/GPU): {:.1f} |", *l.throughput_tflops);
  if (l.energy_j_per_iteration)
    s += fmt::format(" energy per GPU (J/iter/GPU): {:.1f} | power per GPU (W/GPU): {:.1f} |",
                     *l.energy_j_per_iteration, l.power_w.value_or(0.0));
  if (l.learning_rate)
    s += fmt::format(" learning rate: {:.6E} |", *l.learning_rate);
  else
    s += " learning rate: None |";
  if (l.decoupled_learning_rate)
    s += fmt::format(" decoupled learning rate: {:.6E} |", *l.decoupled_learning_rate);
  s += fmt::format(" global batch size: {:5d} |", l.global_batch_size);
  for (const auto& [name, value] : l.losses)
    if (value > 0.0) s += fmt::format(" {}: {:.6E} |", name, value);
  s += fmt::format(" loss scale: {:.1f} |", l.loss_scale);
  if (l.grad_norm) s += fmt::format(" grad norm: {:.3f} |", *l.grad_norm);
  // Megatron's count is a Python float (a tensor's .item()): "12.0".
  if (l.num_zeros_in_grad) s += fmt::format(" num zeros: {:.1f} |", double(*l.num_zeros_in_grad));
  if (l.params_norm) s += fmt::format(" params norm: {:.3f} |", *l.params_norm);
  s += fmt::format(" number of skipped iterations: {:3d} |", l.skipped_iterations);
  s += fmt::format(" number of nan iterations: {:3d} |", l.nan_iterations);
  if (l.tokens_per_sec_per_gpu)
    s += fmt::format(" tokens per second per GPU: {:.1f} |", *l.tokens_per_sec_per_gpu);
  return s;
}

std::string format_validation_line(const std::string& where,
                                   const std::vector<std::pair<std::string, double>>& losses,
                                   const std::string& suffix) {
  std::string s = fmt::format(" validation{} loss at {} | ", suffix, where);
  for (const auto& [name, value] : losses) {
    s += fmt::format("{} value: {:.6E} | ", name, value);
    s += fmt::format("{} PPL: {:.6E} | ", name, std::exp(std::min(20.0, value)));
  }
  return s;
}

std::string validation_rule(const std::string& line) { return std::string(line.size() + 1, '-'); }

}  // namespace mcpp::training
