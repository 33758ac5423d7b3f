// What a save deletes once its tracker is durable (commit_checkpoint and the legacy writer
// call these): --save-retain-interval (Megatron's iter_finalize_fn) deletes the checkpoint
// the tracker named before unless it is kept (SaveOptions::retain_interval); a
// non-persistent save deletes every older one of its folder (SaveOptions::keep_only_latest).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace mcpp::checkpoint {

// The iteration the tracker of save_dir names, read as it is (no fallback to the folders):
// nullopt when there is none or it is not a plain iteration number.
std::optional<int64_t> tracked_iteration(const std::string& save_dir);

// Deletes iteration `prev` of save_dir unless it is 0, `iteration` itself, a multiple of
// `every`, or a symbolic link; renamed to *.del-<pid> first (begin_checkpoint removes a
// leftover). A failure is a warning: the new checkpoint is complete either way.
void retire_checkpoint(const std::string& save_dir, int64_t prev, int64_t iteration,
                       int64_t every);

// Deletes every iter_* folder of save_dir (either checkpoint format, complete or not) whose
// iteration is below `iteration`, each renamed aside first; symbolic links are kept. A
// failure is a warning.
void retire_older_checkpoints(const std::string& save_dir, int64_t iteration);

}  // namespace mcpp::checkpoint
