// Asynchronous checkpoint save (--async-save): save() copies the parameters and optimizer
// state into host memory (a snapshot), then a background thread writes the checkpoint while
// training continues. At most one save is in flight: a second save() first waits for the
// first. A failed save's error is kept and rethrown by the next poll(), wait() or save().
#pragma once
#include <exception>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include "checkpoint/checkpoint.h"

namespace mcpp::checkpoint {

class AsyncSaver {
 public:
  AsyncSaver() = default;
  ~AsyncSaver();  // waits for the save in flight; logs (does not throw) its error
  AsyncSaver(const AsyncSaver&) = delete;
  AsyncSaver& operator=(const AsyncSaver&) = delete;

  // Snapshot now, write in the background. Blocks only while a previous save is in flight.
  void save(const std::string& save_dir, const model::ParamStore& params, const optim::AdamW* opt,
            const TrainingState& st, const SaveOptions& opts = {});
  // Multi-rank form (as save_checkpoint's span overload); the snapshots are cloned.
  void save(const std::string& save_dir, std::span<const RankSnapshot> ranks,
            const TrainingState& st, const SaveOptions& opts = {});

  // Multi-rank saves (training_checkpoint.cpp, --async-save under mpirun): `write` runs in
  // the background and returns this rank's shard records; the checkpoint is committed
  // only when every rank's write is done, by the collective finalize_async_save.
  struct PendingCommit {
    std::string save_dir, tmp_dir;
    TrainingState st;
    SaveOptions opts;
  };
  void start(std::function<nlohmann::json()> write, PendingCommit commit);
  bool has_pending() const { return pending_.has_value(); }
  // Joins the worker and hands over its records and the commit; the worker's error comes
  // back as the string (empty: none), so that every rank can learn about it collectively.
  std::pair<nlohmann::json, PendingCommit> take(std::string& error);

  // True when no save is in flight. Rethrows (once) the error of a finished save.
  bool poll();
  // Blocks until no save is in flight. Rethrows (once) the error of a finished save.
  void wait();
  bool in_flight();

 private:
  void join_and_rethrow();
  std::mutex mu_;
  std::thread worker_;
  bool done_ = true;
  std::exception_ptr error_;
  std::optional<PendingCommit> pending_;  // start(): a commit that waits for every rank
  nlohmann::json records_;
};

}  // namespace mcpp::checkpoint
