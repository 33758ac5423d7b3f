// --save-retain-interval (Megatron's iter_finalize_fn): once a save's tracker is durable,
// the checkpoint the tracker named before is deleted unless it is kept
// (checkpoint::SaveOptions::retain_interval; commit_checkpoint calls these).
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

}  // namespace mcpp::checkpoint
