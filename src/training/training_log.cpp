#include "training/training_log.h"

#include <algorithm>
#include <cmath>

#include "base/log.h"
#include "ops/nvtx.h"
#include "ops/ops.h"
#include "parallel/host_collectives.h"
#include "training/flops.h"
#include "training/log_line.h"
#ifdef MCPP_HAVE_CUDA
#include "ops/cuda/device.h"
#include "ops/cuda/device_id.h"
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

std::vector<std::string> format_timers(const std::string& option,
                                       const std::vector<std::string>& names,
                                       const std::vector<std::vector<double>>& per_rank_ms) {
  std::vector<std::string> out;
  if (option == "all") {
    out.push_back("times across ranks (ms):");
    for (size_t i = 0; i < names.size(); ++i) {
      out.push_back(fmt::format("  {}:", names[i]));
      for (size_t r = 0; r < per_rank_ms.size(); ++r)
        if (!std::isnan(per_rank_ms[r].at(i)))
          out.push_back(fmt::format("     rank {:2d}: {:.2f}", r, per_rank_ms[r].at(i)));
    }
    return out;
  }
  std::vector<std::pair<double, double>> mm(names.size(), {1e300, -1e300});
  for (const auto& rank : per_rank_ms)
    for (size_t i = 0; i < names.size(); ++i)
      if (!std::isnan(rank.at(i)))
        mm[i] = {std::min(mm[i].first, rank.at(i)), std::max(mm[i].second, rank.at(i))};
  if (option == "max") {
    out.push_back("max time across ranks (ms):");
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string dots(size_t(std::max<int>(2, 48 - int(names[i].size()))), '.');
      out.push_back(fmt::format("    {} {}: {:.2f}", names[i], dots, mm[i].second));
    }
    return out;
  }
  out.push_back("(min, max) time across ranks (ms):");
  for (auto& l : format_timer_lines(names, mm)) out.push_back(std::move(l));
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
  MCPP_CHECK_HINT(!a.log_memory_to_tensorboard || device == Device::CUDA,
                  "drop --log-memory-to-tensorboard, or train with --device cuda",
                  "--log-memory-to-tensorboard logs the CUDA allocator's bytes; this run is on "
                  "the CPU");
  MCPP_CHECK_HINT(!a.log_energy || device == Device::CUDA,
                  "drop --log-energy, or train with --device cuda",
                  "--log-energy reads the GPU's energy counter (NVML); this run is on the CPU");
  for (auto [on, flag] : {std::pair{a.log_memory_interval.has_value(), "--log-memory-interval"},
                          std::pair{a.log_device_memory_used, "--log-device-memory-used"}})
    MCPP_CHECK_HINT(!on || device == Device::CUDA,
                    fmt::format("drop {}, or train with --device cuda", flag),
                    "{} reports the CUDA allocator's memory; this run is on the CPU", flag);
#ifdef MCPP_HAVE_CUDA
  if (a.log_device_memory_used || a.log_energy) {
    const char* flag = a.log_device_memory_used ? "--log-device-memory-used" : "--log-energy";
    std::string why;
    nvml_ = GpuTelemetry::open(ops::cuda::pci_bus_id(), &why);
    MCPP_CHECK_HINT(nvml_ != nullptr, fmt::format("drop {}", flag),
                    "{} reads the device through NVML: {}", flag, why);
    MCPP_CHECK_HINT(!a.log_energy || nvml_->total_energy_mj().has_value(),
                    "drop --log-energy (GPUs before Volta have no energy counter)",
                    "--log-energy: NVML gives no total energy consumption for device {}",
                    ops::cuda::pci_bus_id());
  }
#endif
  // Megatron's get_tensorboard_writer: the last rank writes (it holds the last pipeline
  // stage, hence the loss).
  if (a.tensorboard_dir && world.rank() == world.size() - 1)
    tb_ = std::make_unique<EventWriter>(*a.tensorboard_dir, a.tensorboard_queue_size);
  if (a.log_straggler) {
    StragglerDetector::Options o;
    o.minmax_count = a.straggler_minmax_count;
    o.enabled_on_startup = !a.disable_straggler_on_startup;
    o.port = int(a.straggler_ctrlr_port);
#ifdef MCPP_HAVE_CUDA
    if (device == Device::CUDA) o.gpu_pci_bus_id = ops::cuda::pci_bus_id();
#endif
    std::vector<comm::Communicator*> groups;
    for (int g = 0; g < parallel::kNumGroups; ++g)
      if (ps.has(parallel::Group(g))) groups.push_back(&ps.group(parallel::Group(g)));
    straggler_ = std::make_unique<StragglerDetector>(o, world, std::move(groups));
  }
  interval_.start();
  start_energy();
}

// --log-energy (Megatron's EnergyMonitor): the counter is read where the interval's clock
// starts, so an interval's energy covers exactly its elapsed time (evaluation excluded).
void TrainingLog::start_energy() {
  if (a_.log_energy && nvml_) energy_start_mj_ = nvml_->total_energy_mj().value_or(0);
}

TrainingLog::~TrainingLog() = default;

void TrainingLog::section(std::string_view name, bool start, int level) {
  if (ops::nvtx_enabled()) {  // the --profile window: the section on Nsight's timeline
    if (start)
      ops::nvtx_range_push(std::string(name));
    else
      ops::nvtx_range_pop();
  }
  if (straggler_ && name == "batch-generator") straggler_->data_section(start);
  if (a_.timing_log_level < level) return;
  synchronize_device(device_);
  if (start)
    timers_(std::string(name)).start();
  else
    timers_(std::string(name)).stop();
}

void TrainingLog::record(double loss, double grad_norm, bool skipped) {
  ++iters_;
  last_loss_ = loss;
  if (!skipped) loss_ += loss, ++advanced_, last_grad_norm_ = grad_norm;
}

// Megatron's training_log, the `writer and iteration % tensorboard_log_interval == 0` part.
void TrainingLog::tensorboard_iteration(int64_t it, const IntervalState& s) {
  if (!tb_ || it % a_.tensorboard_log_interval != 0) return;
  const int64_t samples = s.consumed_samples;
  auto both = [&](const std::string& tag, double v) {
    tb_->add_scalar(tag, v, it);
    tb_->add_scalar(tag + " vs samples", v, samples);
  };
  both("learning-rate", s.learning_rate);
  both("batch-size", double(s.global_batch_size ? s.global_batch_size : a_.global_batch_size));
  both("lm loss", last_loss_);
  if (a_.log_loss_scale_to_tensorboard) both("loss-scale", s.loss_scale);
  if (a_.log_world_size_to_tensorboard) both("world-size", double(world_.size()));
  both("grad-norm", last_grad_norm_);
#ifdef MCPP_HAVE_CUDA
  if (a_.log_memory_to_tensorboard) {
    const auto m = ops::cuda::memory_stats();
    tb_->add_scalar("mem-reserved-bytes", double(m.reserved), it);
    tb_->add_scalar("mem-allocated-bytes", double(m.in_use), it);
    tb_->add_scalar("mem-max-allocated-bytes", double(m.peak), it);
  }
#endif
}

void TrainingLog::tensorboard_validation(int64_t it, int64_t samples, double loss,
                                         const std::string& suffix) {
  if (!tb_) return;
  const std::string tag = "lm loss validation" + suffix;
  tb_->add_scalar(tag, loss, it);
  tb_->add_scalar(tag + " vs samples", loss, samples);
  if (a_.log_validation_ppl_to_tensorboard) {
    const double ppl = std::exp(std::min(20.0, loss));  // Megatron's PPL, capped at e^20
    tb_->add_scalar(tag + " ppl", ppl, it);
    tb_->add_scalar(tag + " ppl vs samples", ppl, samples);
  }
  tb_->flush();
}

void TrainingLog::record_moe(const std::vector<std::pair<std::string, double>>& values,
                             bool skipped) {
  if (skipped) return;
  if (moe_sums_.size() != values.size()) moe_sums_.assign(values.begin(), values.end());
  else
    for (size_t i = 0; i < values.size(); ++i) moe_sums_[i].second += values[i].second;
}

void TrainingLog::restart_interval() {
  interval_.elapsed(true), interval_.start();
  start_energy();
  snapshot_comm();
  if (straggler_) straggler_->restart();
}

void TrainingLog::log_interval(int64_t iteration, const IntervalState& s) {
  synchronize_device(device_);
  const double elapsed = interval_.elapsed(true);
  const double per_iter = elapsed / double(iters_);
  const int64_t gbs = s.global_batch_size ? s.global_batch_size : a_.global_batch_size;
  IterationLog L;
  L.iteration = iteration, L.train_iters = a_.train_iters;
  L.consumed_samples = s.consumed_samples;
  L.skipped_samples = s.skipped_samples;
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
  L.decoupled_learning_rate = s.decoupled_learning_rate;
  L.num_zeros_in_grad = s.num_zeros_in_grad, L.params_norm = s.params_norm;
  // This interval's counts, as Megatron's training_log (it zeroes them after each line).
  L.skipped_iterations = s.skipped_iterations - logged_skipped_;
  L.nan_iterations = s.nan_iterations - logged_nan_;
  logged_skipped_ = s.skipped_iterations, logged_nan_ = s.nan_iterations;
  if (a_.log_throughput)
    L.tokens_per_sec_per_gpu = double(gbs * a_.seq_length) / per_iter / world_.size();
  if (a_.log_energy) {  // every rank's joules summed, then per iteration and GPU (Megatron's)
    const uint64_t now = nvml_ ? nvml_->total_energy_mj().value_or(energy_start_mj_) : 0;
    const double lap_j = parallel::sum_over(world_, double(now - energy_start_mj_) / 1000.0);
    L.energy_j_per_iteration = lap_j / double(iters_) / double(world_.size());
    L.power_w = *L.energy_j_per_iteration / per_iter;
    if (tb_) {
      tb_->add_scalar("iter-energy/gpu", *L.energy_j_per_iteration, iteration);
      tb_->add_scalar("power/gpu", *L.power_w, iteration);
    }
  }
  log::info("{}", format_iteration_line(L));
  // Megatron: after the first line, and every --log-memory-interval iterations (once).
  if (device_ == Device::CUDA &&
      (report_memory_ || (a_.log_memory_interval && iteration % *a_.log_memory_interval == 0)))
    cuda_memory(iteration);
  comm_volumes();
  if (tb_ && a_.log_timers_to_tensorboard) tb_->add_scalar("iteration-time", per_iter, iteration);
  if (tb_ && a_.log_throughput)
    tb_->add_scalar("throughput", L.throughput_tflops.value_or(0.0), iteration);
  if (a_.timing_log_level >= 1) {
    timers(iteration);
    comm_share(elapsed);
  }
  if (straggler_) straggler_->interval(elapsed, iters_, s.flops_per_iteration);
  if (tb_) tb_->flush();  // a crash loses at most this interval
  loss_ = 0, iters_ = 0, advanced_ = 0;
  moe_sums_.clear();
  interval_.start();
  start_energy();
}

// Megatron's timers.log: every rank's time per iteration, gathered from all ranks and
// shown as --timing-log-option says; with --log-timers-to-tensorboard the maximum over the
// ranks, in seconds, as "<name>-time" (Megatron's Timers.write).
void TrainingLog::timers(int64_t iteration) {
  // "name value" lines per rank; the union of the names (a pipeline stage may lack a
  // timer another has: it is left out of that name's min/max, as Megatron's zero filter).
  std::string mine;
  for (const auto& [name, t] : timers_.all())
    mine += fmt::format("{}\t{}\n", name,
                        timers_(name).elapsed(true) * 1e3 / double(std::max<int64_t>(1, iters_)));
  std::vector<std::map<std::string, double>> ranks;
  std::map<std::string, int> index;
  for (const auto& s : parallel::all_gather_strings(world_, mine)) {
    std::map<std::string, double> m;
    size_t pos = 0;
    while (pos < s.size()) {
      const size_t tab = s.find('\t', pos), nl = s.find('\n', pos);
      if (tab == std::string::npos || nl == std::string::npos) break;
      m[s.substr(pos, tab - pos)] = std::stod(s.substr(tab + 1, nl - tab - 1));
      pos = nl + 1;
    }
    for (const auto& [n, v] : m) index[n] = 0;
    ranks.push_back(std::move(m));
  }
  std::vector<std::string> names;
  for (const auto& [n, i] : index) names.push_back(n);
  std::vector<std::vector<double>> per_rank;
  for (const auto& m : ranks) {
    std::vector<double> v;
    for (const auto& n : names) v.push_back(m.count(n) ? m.at(n) : std::nan(""));
    per_rank.push_back(std::move(v));
  }
  for (const auto& line : format_timers(a_.timing_log_option, names, per_rank))
    log::info("{}", line);
  if (tb_ && a_.log_timers_to_tensorboard)
    for (size_t i = 0; i < names.size(); ++i) {
      double mx = 0;
      for (const auto& r : per_rank)
        if (!std::isnan(r[i])) mx = std::max(mx, r[i]);
      tb_->add_scalar(names[i] + "-time", mx / 1e3, iteration);
    }
}

// Our own line (Megatron prints no such number): the share of the interval's wall time
// each parallel group's communication kept this rank's host thread waiting, i.e. the
// communication not hidden behind compute, the maximum over the ranks. TP-group all-gathers
// and reduce-scatters are sequence parallelism's ("SP"), its all-reduces tensor
// parallelism's; PP is the pipeline's send/recv, DP the gradient reduction and the
// distributed optimizer's gathers. Host backends: the host time blocked; NCCL: how long the
// compute stream waited for each call, from CUDA events around the wait.
std::vector<TrainingLog::CommPart> TrainingLog::comm_parts() const {
  std::vector<CommPart> parts = {{"TP", &ps_.tp(), false, true}};
  if (a_.sequence_parallel) parts.push_back({"SP", &ps_.tp(), true, false});
  parts.push_back({"PP", &ps_.pp(), false, false});
  parts.push_back({"DP", &ps_.dp(), false, false});
  if (ps_.cp().size() > 1) parts.push_back({"CP", &ps_.cp(), false, false});
  if (ps_.ep().size() > 1) parts.push_back({"EP", &ps_.ep(), false, false});
  return parts;
}

// The blocked time so far, so the next line counts from here (setup, evaluation and
// checkpoint collectives are not the interval's).
void TrainingLog::snapshot_comm() {
  if (a_.timing_log_level < 1) return;
  synchronize_device(device_);
  for (const auto& p : comm_parts()) {
    p.c->set_exposed_timing(true);  // NCCL: time the caller's stalls with CUDA events
    p.c->collect_timing();
    share_seen_[p.name] = p.c->stats();
  }
}

void TrainingLog::comm_share(double elapsed) {
  const std::vector<CommPart> parts = comm_parts();
  std::vector<double> share;
  for (auto& p : parts) {
    p.c->collect_timing();  // NCCL: the stalls measured by CUDA events (device synchronised)
    const comm::CommStats& now = p.c->stats();
    comm::CommStats& before = share_seen_[p.name];
    double sec = 0;
    for (int k = 0; k < comm::kNumOpKinds; ++k) {
      const bool sp_kind = k == int(comm::OpKind::AllGather) || k == int(comm::OpKind::ReduceScatter);
      if ((p.sp_only && !sp_kind) || (p.tp_only && a_.sequence_parallel && sp_kind)) continue;
      sec += now.blocked_seconds[size_t(k)] - before.blocked_seconds[size_t(k)];
    }
    before = now;
    share.push_back(elapsed > 0 ? 100.0 * sec / elapsed : 0.0);
  }
  const auto mm = parallel::min_max_over(world_, share);
  std::string line = "exposed communication (share of the step's wall time, max over ranks):";
  for (size_t i = 0; i < parts.size(); ++i) {
    if (parts[i].c->size() <= 1) continue;
    line += fmt::format(" {} {:.1f}% |", parts[i].name, mm[i].second);
  }
  if (line.back() != '|') line += " none (one rank per group) |";
  log::info("{}", line);
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

std::string format_memory_line(int64_t iteration, uint64_t allocated, uint64_t max_allocated,
                               uint64_t reserved, uint64_t max_reserved,
                               std::optional<uint64_t> device_used) {
  auto mb = [](uint64_t b) {  // Python's str() of a float
    const double v = double(b) / 1048576.0;
    std::string t = fmt::format("{}", v);
    return t.find_first_of(".e") == std::string::npos ? t + ".0" : t;
  };
  std::string line = fmt::format(
      "(after {} iterations) memory (MB) | allocated: {} | max allocated: {} | reserved: {} | "
      "max reserved: {}",
      iteration, mb(allocated), mb(max_allocated), mb(reserved), mb(max_reserved));
  if (device_used) line += fmt::format(" | total device memory used: {}", mb(*device_used));
  return line;
}

// Megatron's report_memory line, after the first log line (and every --log-memory-interval
// iterations), on the ranks of DP rank 0: bytes of live tensors (allocated) and of the
// caching pool (reserved), and their peaks; with --log-device-memory-used the device's
// memory used by every process (NVML).
void TrainingLog::cuda_memory(int64_t iteration) {
  report_memory_ = false;
#ifdef MCPP_HAVE_CUDA
  const bool fake = world_.backend() == "fake";  // the only process: it reports its rank
  if (ps_.dp_rank() != 0 && !fake) return;
  const auto m = ops::cuda::memory_stats();
  std::optional<uint64_t> used;
  if (nvml_) {
    used = nvml_->memory_used();
    if (!used) log::warn("--log-device-memory-used: NVML gave no memory reading this time");
  }
  const std::string line =
      format_memory_line(iteration, m.in_use, m.peak, m.reserved, m.reserved_peak, used);
  if (world_.size() > 1 && !fake)
    log::info_all("{}", line);  // the logger prefixes "[rank r]"
  else
    log::info("[Rank {}] {}", world_.rank(), line);
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
  if ((ps_.dp_rank() == 0 && ps_.tp_rank() == 0) || world_.backend() == "fake")
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
  if ((ps_.dp_rank() != 0 || ps_.tp_rank() != 0) && world_.backend() != "fake") return;
  log::write(log::Level::Info,
             fmt::format("(after {} iterations) activations | peak saved: {:.2f} MB | "
                         "micro-batches in flight at the peak: {} | largest per "
                         "micro-batch: {} B | shared scratch: {} B",
                         iteration, m.peak / 1048576.0, m.max_in_flight, m.per_slot_max, m.scratch),
             /*all_ranks=*/true);
}

}  // namespace mcpp::training
