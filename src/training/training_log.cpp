#include "training/training_log.h"

#include <algorithm>

#include "base/log.h"
#include "ops/ops.h"
#include "parallel/host_collectives.h"
#include "training/flops.h"
#include "training/log_line.h"
#ifdef MCPP_HAVE_CUDA
#include "ops/cuda/device.h"
#endif

namespace mcpp::training {

namespace {

void synchronize_device(Device d) {
#ifdef MCPP_HAVE_CUDA
  if (d == Device::CUDA) ops::cuda::synchronize(ops::cuda::default_stream());
#endif
}

}  // namespace

std::vector<std::string> format_timer_lines(
    const std::vector<std::string>& names,
    const std::vector<std::pair<double, double>>& min_max_ms) {
  std::vector<std::string> out;
  for (size_t i = 0; i < names.size() && i < min_max_ms.size(); ++i) {
    const std::string dots(size_t(std::max<int>(2, 48 - int(names[i].size()))), '.');
    out.push_back(fmt::format("    {} {}: ({:.2f}, {:.2f})", names[i], dots, min_max_ms[i].first,
                              min_max_ms[i].second));
  }
  return out;
}

std::vector<std::pair<std::string, std::pair<double, double>>> timers_min_max(
    Timers& timers, int64_t iterations, comm::Communicator& group) {
  std::vector<std::string> names;
  std::vector<double> ms;
  for (const auto& [name, t] : timers.all()) {
    names.push_back(name);
    ms.push_back(timers(name).elapsed(true) * 1e3 / double(std::max<int64_t>(1, iterations)));
  }
  const auto mm = parallel::min_max_over(group, ms);
  std::vector<std::pair<std::string, std::pair<double, double>>> out;
  for (size_t i = 0; i < names.size(); ++i) out.push_back({names[i], mm[i]});
  return out;
}

TrainingLog::TrainingLog(const Args& a, Device device, comm::Communicator& world,
                         const parallel::ParallelState& ps)
    : a_(a), device_(device), world_(world), ps_(ps) {
  interval_.start();
}

void TrainingLog::section(std::string_view name, bool start) {
  if (a_.timing_log_level < 1) return;
  synchronize_device(device_);
  if (start)
    timers_(std::string(name)).start();
  else
    timers_(std::string(name)).stop();
}

void TrainingLog::record(double loss, double grad_norm, bool skipped) {
  ++iters_;
  if (!skipped) loss_ += loss, ++advanced_, last_grad_norm_ = grad_norm;
}

void TrainingLog::record_moe(const std::vector<std::pair<std::string, double>>& values,
                             bool skipped) {
  if (skipped) return;
  if (moe_sums_.size() != values.size()) moe_sums_.assign(values.begin(), values.end());
  else
    for (size_t i = 0; i < values.size(); ++i) moe_sums_[i].second += values[i].second;
}

void TrainingLog::restart_interval() { interval_.elapsed(true), interval_.start(); }

void TrainingLog::log_interval(int64_t iteration, const IntervalState& s) {
  synchronize_device(device_);
  const double elapsed = interval_.elapsed(true);
  const double per_iter = elapsed / double(iters_);
  const int64_t gbs = a_.global_batch_size;
  IterationLog L;
  L.iteration = iteration, L.train_iters = a_.train_iters;
  L.consumed_samples = s.consumed_samples;
  L.elapsed_ms_per_iteration = per_iter * 1e3;
  // Megatron's training_log prints the throughput field only with --log-throughput; the
  // tokens/s field (ours) follows the same flag.
  if (a_.log_throughput)
    L.throughput_tflops =
        throughput_tflops_per_gpu(s.flops_per_iteration, per_iter, world_.size());
  L.learning_rate = s.learning_rate;
  L.global_batch_size = gbs;
  // Averaged over the iterations that stepped, as Megatron's advanced iterations.
  L.losses = {{"lm loss", loss_ / double(std::max<int64_t>(1, advanced_))}};
  for (const auto& [name, sum] : moe_sums_)  // mixture of experts
    L.losses.push_back({name, sum / double(std::max<int64_t>(1, advanced_))});
  L.loss_scale = s.loss_scale;
  L.grad_norm = last_grad_norm_;
  L.skipped_iterations = s.skipped_iterations, L.nan_iterations = s.nan_iterations;
  if (a_.log_throughput)
    L.tokens_per_sec_per_gpu = double(gbs * a_.seq_length) / per_iter / world_.size();
  log::info("{}", format_iteration_line(L));
  if (report_memory_ && device_ == Device::CUDA) cuda_memory(iteration);
  comm_volumes();
  if (a_.timing_log_level >= 1) timers();
  loss_ = 0, iters_ = 0, advanced_ = 0;
  moe_sums_.clear();
  interval_.start();
}

// Megatron's timers.log: every rank's time per iteration, (min, max) over all ranks.
void TrainingLog::timers() {
  const auto t = timers_min_max(timers_, iters_, world_);
  std::vector<std::string> names;
  std::vector<std::pair<double, double>> mm;
  for (const auto& [n, v] : t) names.push_back(n), mm.push_back(v);
  log::info("(min, max) time across ranks (ms):");
  for (const auto& line : format_timer_lines(names, mm)) log::info("{}", line);
}

// Debug log (--logging-level 10): calls and bytes per iteration of every group and
// operation since the last log line -- the volumes the planner's cost model predicts.
void TrainingLog::comm_volumes() {
  std::vector<std::pair<std::string, comm::Communicator*>> groups = {
      {"tp", &ps_.tp()}, {"dp", &ps_.dp()}, {"tp-dp", &ps_.group(parallel::Group::TP_DP)}};
  for (auto& [name, c] : groups) {
    const comm::CommStats now = c->stats();
    comm::CommStats& before = comm_seen_[name];
    for (int k = 0; k < comm::kNumOpKinds; ++k) {
      const uint64_t calls = now.calls[k] - before.calls[k], bytes = now.bytes[k] - before.bytes[k];
      if (calls == 0) continue;
      log::debug("comm per iteration, group '{}' ({} ranks): {} {} calls {} bytes", name, c->size(),
                 comm::op_name(comm::OpKind(k)), calls / uint64_t(iters_),
                 bytes / uint64_t(iters_));
    }
    before = now;
  }
}

// Megatron's report_memory line, once after the first log line, on the ranks of DP rank 0:
// bytes of live tensors (allocated) and of the caching pool (reserved), and their peaks.
void TrainingLog::cuda_memory(int64_t iteration) {
  report_memory_ = false;
#ifdef MCPP_HAVE_CUDA
  if (ps_.dp_rank() != 0) return;
  const auto m = ops::cuda::memory_stats();
  auto mb = [](size_t b) {  // Python's str() of a float
    const double v = double(b) / 1048576.0;
    std::string t = fmt::format("{}", v);
    return t.find_first_of(".e") == std::string::npos ? t + ".0" : t;
  };
  const std::string line = fmt::format(
      "(after {} iterations) memory (MB) | allocated: {} | max allocated: {} | reserved: {} | "
      "max reserved: {}",
      iteration, mb(m.in_use), mb(m.peak), mb(m.reserved), mb(m.reserved_peak));
  if (world_.size() > 1)
    log::info_all("{}", line);  // the logger prefixes "[rank r]"
  else
    log::info("[Rank 0] {}", line);
#endif
}

// Megatron's "Theoretical memory footprints" line, predicted from the flags alone
// (`megatron plan` prints the same): the allocated weights, gradients and optimizer state
// must agree; the activations are measured after the first iteration.
void TrainingLog::memory_plan(const StageMemory& m, int64_t have) {
  if (have != m.weights_and_optimizer())
    log::warn(
        "memory plan: {} bytes of weights, gradients and optimizer state planned, {} "
        "allocated",
        m.weights_and_optimizer(), have);
  if (ps_.dp_rank() == 0 && ps_.tp_rank() == 0)
    log::write(log::Level::Info,
               fmt::format("Theoretical memory footprints: weight and optimizer={:.2f} MB, "
                           "activation={:.2f} MB, total={:.2f} MB | weights+grads+optimizer: "
                           "{} B | per micro-batch: {} B | micro-batches in flight at most: "
                           "{} | shared scratch: {} B",
                           double(m.weights_and_optimizer()) / 1048576.0,
                           double(m.activations()) / 1048576.0, double(m.total()) / 1048576.0,
                           m.weights_and_optimizer(), m.per_microbatch, m.in_flight, m.scratch),
               /*all_ranks=*/true);
}

// Like Megatron's memory report after the first iteration, for saved activations.
void TrainingLog::activation_memory(int64_t iteration, const model::ActivationMemory& m) {
  if (ps_.dp_rank() != 0 || ps_.tp_rank() != 0) return;
  log::write(log::Level::Info,
             fmt::format("(after {} iterations) activations | peak saved: {:.2f} MB | "
                         "micro-batches in flight at the peak: {} | largest per "
                         "micro-batch: {} B | shared scratch: {} B",
                         iteration, m.peak / 1048576.0, m.max_in_flight, m.per_slot_max, m.scratch),
             /*all_ranks=*/true);
}

}  // namespace mcpp::training
