// --log-progress: Megatron's progress.txt (training/utils append_to_progress_log and
// training.py compute_throughputs_and_append_to_progress_log), in the same tab-separated
// form, so that tools reading Megatron's file read ours:
//
//   2026-01-02 03:04:05<TAB>Job ID: 1234<TAB># GPUs: 8<TAB>Starting job
//   ...<TAB>Saved checkpoint<TAB>Iteration: 200<TAB>Job throughput: 412.3 TFLOP/s/GPU<TAB>
//       Cumulative throughput: 409.8 TFLOP/s/GPU<TAB>Floating-point operations: 1.23e+18<TAB>
//       Tokens (in billions): 0.42
//
// One line when the job starts, one after every checkpoint save ("Saving async checkpoint"
// when --async-save schedules it, with the same numbers, then "Saved async checkpoint" with
// the iteration once it is committed). Job ID is $SLURM_JOB_ID (empty without Slurm);
// "# GPUs" is the world size (processes, on the CPU backend too). The numbers are the
// trainer's own: the model FLOPs of training/flops.h summed over the run
// (num_floating_point_operations_so_far, which checkpoints carry on), per second of this job
// since it started, and since the first "Starting job" of the file's latest run of jobs with
// this world size (Megatron's cumulative throughput: it restarts when the world size
// changes), per GPU; tokens are consumed samples x --seq-length. Rank 0 appends and closes
// the file at every line; the other ranks write nothing.
#pragma once
#include <chrono>
#include <cstdint>
#include <ctime>
#include <optional>
#include <string>

namespace mcpp::training {

// "<timestamp>\tJob ID: <job_id>\t# GPUs: <world_size>\t<message>\n".
std::string progress_line(const std::string& timestamp, const std::string& job_id,
                          int64_t world_size, const std::string& message);

// Megatron's get_start_time_from_progress_log over a progress.txt's text: the time of the
// first "Starting job" of the last unbroken run of lines with `world_size`, and the
// floating-point operations of the last committed checkpoint before it ("Saved checkpoint",
// or "Saving async checkpoint" once its "Saved async checkpoint" follows). Lines that do
// not parse are skipped. None when no such "Starting job" exists.
struct ProgressStart {
  std::time_t time = 0;  // local time, whole seconds
  double flops = 0;
};
std::optional<ProgressStart> progress_start(const std::string& text, int64_t world_size);

class ProgressLog {
 public:
  // Appends "Starting job" to <save_dir>/progress.txt (creating the folder) when `writer`
  // (rank 0); the job's clock starts here.
  ProgressLog(std::string save_dir, int64_t world_size, bool writer);
  // A line with `message` (rank 0 only). A file that cannot be written is a warning: the
  // progress log never stops training.
  void append(const std::string& message) const;
  // After a save of `iteration`: throughputs, operations and tokens. flops_so_far counts
  // the whole run, flops_at_job_start what the checkpoint this job loaded had.
  void checkpoint_saved(int64_t iteration, double flops_so_far, double flops_at_job_start,
                        int64_t tokens_so_far, bool async) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  int64_t world_size_;
  bool writer_;
  std::chrono::steady_clock::time_point job_start_;
  std::time_t job_start_wall_;
};

}  // namespace mcpp::training
