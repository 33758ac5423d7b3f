// What a checkpoint reader checks before it trusts a value: a
// metadata.json or folder name from an untrusted source must give an Error naming the file
// and field, never a crash, an unbounded allocation or heap bytes in the weights.
//
//  * shapes and pieces: every dimension positive, every piece inside the global tensor and
//    inside its shard (overflow-safe), pieces of one tensor disjoint, so that what the
//    loader copies is exactly what the shard checksums cover;
//  * the model config: sizes positive and bounded, epsilons and bases positive and finite,
//    and the tensors the metadata lists agree with it (embedding [Vp, H], one set of layer
//    tensors per layer, QKV and MLP row counts) and fit in the bytes of the shard files, so
//    a model is never allocated larger than the files that hold it;
//  * the training state: counters non-negative, the iteration the one the folder names.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "checkpoint/checkpoint.h"

namespace mcpp::checkpoint {

// The iteration of a folder name's digits ("0000100" -> 100); nullopt when the digits do
// not form a number below 2^63 (a folder "iter_99999999999999999999" is not a checkpoint).
std::optional<int64_t> parse_iteration_digits(const std::string& digits);

// A stored tensor's shape as a matrix: its rows (1 for a scalar) and the elements of a row.
inline int64_t rows_of(const Shape& s) { return s.empty() ? 1 : s[0]; }
inline int64_t cols_of(const Shape& s) { return s.size() > 1 ? shape_numel(s) / s[0] : 1; }

// A shape from metadata: 1 or 2 dimensions, each in [1, 2^40]. `what` names the field.
void check_shape(const Shape& s, const std::string& what);

// Piece `s` of tensor `key` lies inside the global shape and inside the stored shard.
void check_piece(const Piece& s, const Shape& global, const Shape& shard, const std::string& key);

// No two pieces of one tensor overlap (their element counts then equal the tensor's only if
// they tile it exactly).
void check_pieces_disjoint(const std::vector<Piece>& pieces, const std::string& key);

// The config recorded in metadata.json against its ranges and against the metadata's tensors
// and the bytes of its shard files in iter_dir (see the file comment).
void check_model_config(const model::TransformerConfig& c, const nlohmann::json& md,
                        const std::string& iter_dir);

// Counters of a loaded state (iteration, samples, steps) are non-negative.
void check_state(const TrainingState& st, const std::string& where);

// check_save_dir_writable (declared in checkpoint.h for the trainer) is defined here.

}  // namespace mcpp::checkpoint
