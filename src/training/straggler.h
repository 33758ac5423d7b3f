// Megatron's straggler detector (--log-straggler): at every log line, each rank's time per
// iteration, data-loading time, GPU power / temperature / utilisation / clock and estimated
// throughput are gathered to rank 0, which prints the minimum and maximum of each with the
// rank that has it, in Megatron's report line:
//
//   [2026-12-05 11:40:02] | MnRtt/Rnk: 35.10ms/0 | MxRtt/Rnk: 71.95ms/1 | ... |
//   MnEtpt/Rnk: 0.01TF/1 | MxEtpt/Rnk: 0.02TF/0
//
// and, with --straggler-minmax-count N (1 < N < world), the N ranks of lowest and highest
// throughput. A rank's time (Rtt) is its wall time per iteration minus the time it spent
// blocked in communication (comm::CommStats, every parallel group): what it computed, and
// so what the other ranks waited for when it is the slow one. Etpt is the model's FLOPs per
// iteration over the world size, divided by Rtt. DRtt is the batch-generator's time. The
// GPU numbers are read through NVML once per report (gpu_telemetry.h); fields no rank can
// read (a CPU run) are left out of the line. Numbers have Megatron's two decimals, four
// when below 1.
//
// Rank 0 listens on --straggler-ctrlr-port: any connection (`curl host:port`) toggles the
// detector at the next log line, which every rank learns from rank 0 there.
// --disable-straggler-on-startup starts it off.
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "base/timer.h"
#include "comm/communicator.h"
#include "training/gpu_telemetry.h"

namespace mcpp::training {

// One rank's numbers for one report; NaN where the rank cannot measure it.
struct StragglerRank {
  double rtt_ms = 0, data_ms = 0;
  double power_w = 0, temp_c = 0, util_pct = 0, clock_mhz = 0;
  double etpt_tflops = 0;
};

// Megatron's report lines from every rank's numbers (index: world rank). minmax_count N
// with 1 < N < ranks.size() adds the "^^^^ Bottom N" / "^^^^ Top    N" throughput lines.
std::vector<std::string> format_straggler_report(const std::vector<StragglerRank>& ranks,
                                                 int64_t minmax_count,
                                                 const std::string& timestamp);

class StragglerDetector {
 public:
  struct Options {
    int64_t minmax_count = 1;
    bool enabled_on_startup = true;
    int port = 65535;                 // rank 0's control port; 0: none
    std::string gpu_pci_bus_id;       // "" on the CPU: no GPU telemetry
  };
  // `groups`: every communicator whose blocked time is not this rank's compute (the
  // parallel groups); their exposed timing is switched on (NCCL: CUDA events).
  StragglerDetector(const Options& o, comm::Communicator& world,
                    std::vector<comm::Communicator*> groups);
  ~StragglerDetector();
  StragglerDetector(const StragglerDetector&) = delete;
  StragglerDetector& operator=(const StragglerDetector&) = delete;

  // The batch-generator section's start and stop (its time is DRtt).
  void data_section(bool start);
  // The interval starts again here (after evaluation or a checkpoint: not training time).
  void restart();
  // At a log line, on every rank of the world (collective): the report of the interval if
  // the detector is on, then a toggle asked for on the control port since the last line.
  void interval(double elapsed_s, int64_t iterations, double flops_per_iteration);

  bool on() const { return on_; }
  int bound_port() const { return bound_port_; }  // rank 0's listening port; 0: none

 private:
  double blocked_seconds();
  void listen(int port);
  void serve();

  Options o_;
  comm::Communicator& world_;
  std::vector<comm::Communicator*> groups_;
  std::unique_ptr<GpuTelemetry> gpu_;
  Timer data_;
  double blocked_at_start_ = 0;
  std::atomic<bool> on_{true};
  int listen_fd_ = -1, bound_port_ = 0;
  std::atomic<bool> toggle_{false}, stopping_{false};
  std::thread controller_;
};

}  // namespace mcpp::training
