// Sharded, reshardable, atomic checkpoints (docs/checkpoint.md has the format).
//
//   <save>/latest_checkpointed_iteration.txt   "100"  (Megatron's tracker; written last)
//   <save>/iter_0000100/metadata.json          format version, every tensor's global key,
//                                              global shape, dtype, shards (file, boxes in the
//                                              global tensor, xxh3-64), training state, config
//   <save>/iter_0000100/model_tp00_pp00.safetensors          one per (tp, pp[, ep]) on dp 0
//                                                            (_ep01...: EP rank > 0's experts;
//                                                            _dp01...: a fully parallel save's
//                                                            share of each DP replica)
//   <save>/iter_0000100/optim_tp00_pp00_dp00.safetensors     Adam moments of that rank
//
// Tensors are keyed by Megatron-Core names; a shard is the tensor a rank holds, described by
// one or more boxes ("pieces") of the global tensor, so a checkpoint written under one tensor-
// parallel layout loads under any other: the loader copies the intersection of every stored
// piece with each local piece of the loading rank (ParamStore's split kinds and TP rank).
//
// Saving: files go to iter_0000100.tmp-<pid>/, each fsynced; metadata.json is written last;
// the directory is fsynced, renamed to iter_0000100/, the parent fsynced, and only then the
// tracker is replaced (tmp + fsync + rename). A crash at any moment leaves the previous
// checkpoint loadable; leftover *.tmp-* directories are ignored and removed by the next save.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/strictness.h"
#include "checkpoint/tokenizer_files.h"
#include "model/config.h"
#include "model/params.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/grad_buffer.h"

namespace mcpp::model {
class GPTModel;
}
namespace mcpp::comm {
class Communicator;
}

namespace mcpp::checkpoint {

inline constexpr int kFormatVersion = 1;
inline constexpr const char* kTrackerFile = "latest_checkpointed_iteration.txt";
inline constexpr const char* kMetadataFile = "metadata.json";

// Everything besides tensors that a bit-exact resume needs.
struct TrainingState {
  int64_t iteration = 0;
  int64_t consumed_train_samples = 0, consumed_valid_samples = 0;
  int64_t skipped_train_samples = 0;  // of the consumed ones, in --iterations-to-skip
  optim::SchedulerState scheduler;
  int64_t optimizer_steps = 0;  // AdamW's step count (bias correction); set from opt on save
  // Dropout is counter-based (seed, iteration, micro-batch, global index): seed and iteration
  // are the whole RNG state. rng_iteration = iteration unless the trainer says otherwise.
  uint64_t rng_seed = 0;
  int64_t rng_iteration = 0;
  double num_floating_point_operations_so_far = 0;
  nlohmann::json data_loader = nlohmann::json::object();  // the loader's position, opaque here
  nlohmann::json grad_scaler = nlohmann::json::object();  // fp16 loss scaler; empty otherwise
  nlohmann::json config = nlohmann::json::object();       // Args.given + derived values
  std::string mcpp_version;                               // filled on save; read on load
};

// Position of the writing rank in the parallel layout; names its files.
struct RankCoord {
  int64_t tp = 0, pp = 0, dp = 0, ep = 0;
};

struct SaveOptions {
  // The model's shape, recorded so that loading can name mismatched fields and converters can
  // rebuild the model. The GPTModel overload fills it.
  std::optional<model::TransformerConfig> model;
  bool save_rng = true;       // !--no-save-rng
  bool cleanup_stale = true;  // remove leftover *.tmp-* directories (with a warning)
  // Tokenizer files to carry in iter_N/tokenizer/ (checkpoint/tokenizer_files.h).
  std::optional<TokenizerFiles> tokenizer;
  // --save-retain-interval N (Megatron's iter_finalize_fn): once the tracker names the new
  // checkpoint, the iteration it named before is deleted unless that is 0, this iteration
  // or a multiple of N; a symlinked folder is never deleted. nullopt: keep everything.
  std::optional<int64_t> retain_interval;
  // A non-persistent save (--non-persistent-save-interval): once the tracker names the new
  // checkpoint, every older iter_* folder of save_dir is deleted (retire_older_checkpoints).
  bool keep_only_latest = false;
  // Multi-rank saves (save_training_checkpoint): the replicas of a shard share its writing
  // (RankSnapshot::dense_share; Megatron's --ckpt-fully-parallel-save, on by default).
  bool fully_parallel = false;
  // The optimizer whose moments the ranks write (optim::rule_name), recorded beside
  // has_optimizer.
  std::string optimizer = "adam";
};

struct LoadOptions {
  // When set, the checkpoint's model shape must match (layers, hidden, heads, groups, ffn,
  // padded vocab, positions, architecture switches); LR and other training settings may differ.
  std::optional<model::TransformerConfig> model;
  bool load_rng = true;   // !--no-load-rng: false zeroes rng_seed/rng_iteration in the result
  bool finetune = false;  // --finetune: model weights only; iteration and counters reset to 0
  bool verify_checksums = true;
  // The parameters are one pipeline stage's part of the model: the checkpoint's other
  // tensors belong to other stages (no "tensor this model does not have" error).
  bool partial_model = false;
  // The loading tokenizer's vocabulary (0: unknown). A checkpoint padded for another layout
  // loads when this is given and both padded sizes hold it, or (unknown) when the TP size
  // differs and the sizes are paddings of one vocabulary: the padding rows are trimmed, or
  // new ones copy the last row (their Adam moments start at zero).
  int64_t true_vocab_size = 0;
  // --dist-ckpt-strictness: parameters and buffers on one side only (strictness.h). A
  // parameter the checkpoint lacks keeps its value in the load's output buffer (the caller
  // fills it with the initial values) and zero Adam moments.
  Strictness strictness = Strictness::AssumeOkUnexpected;
  // --ckpt-fully-parallel-load: the ranks that hold identical copies of this rank's
  // tensors (the trainer passes the DP x CP group) split the reading between them and
  // exchange what they read (checkpoint/fully_parallel.h); collective over it. Null: this
  // rank reads everything it needs itself.
  comm::Communicator* replicas = nullptr;
  // When set, receives what this rank read (the trainer's log line).
  struct Report {
    uint64_t bytes_read = 0;      // tensor data read from storage by this rank
    uint64_t bytes_received = 0;  // tensor data received from the other replicas
    int64_t tensors = 0, tensors_read = 0;  // tensors this rank needs / read itself
  };
  Report* report = nullptr;
  // The optimizer whose moments are loaded (optim::rule_name: "adam" takes exp_avg and
  // exp_avg_sq, "sgd" and "lion" exp_avg alone); a checkpoint of another optimizer's state
  // is refused (the metadata's "optimizer"; "adam" when absent).
  std::string optimizer = "adam";
};

// ---- one rank's data -----------------------------------------------------------------------
// A rank's parameters (and optionally Adam moments) as flat buffers laid out like ParamStore,
// and its shard of every registered persistent buffer (ParamStore::buffer_infos, on the host).
// view() shares memory with the live buffers; clone() deep-copies them (the async snapshot).
struct RankSnapshot {
  RankCoord coord;
  int64_t tp_size = 1;
  std::vector<model::ParamInfo> infos;
  Tensor params;               // flat [total] like ParamStore::flat_params()
  Tensor exp_avg, exp_avg_sq;  // undefined: no optimizer state saved
  int64_t optimizer_steps = 0;
  bool write_model = true;  // false on dp > 0 (the model is a DP replica)
  // Expert parallelism: of the model, write the dense parameters and buffers (DP rank 0)
  // and/or the experts (ParamInfo::expert >= 0; expert-DP rank 0 of each EP rank, which
  // holds experts no other writer has, keyed by global expert index).
  bool write_dense = true, write_experts = true;
  // This rank's coordinate in its expert-tensor-parallel group: an expert's TP-duplicated
  // buffer (its FP8 scaling state) is written by ETP rank 0 of the ranks holding it, which
  // need not include TP rank 0 (ETP < TP with EP > 1).
  int expert_tp_rank = 0;
  // Fully parallel save (Megatron's default; --no-ckpt-fully-parallel-save: off): the
  // replicas of this rank's tensors share their writing (fully_parallel.h). This rank's
  // index among the replicas of its dense tensors and of its experts, and their count;
  // count 1: it writes all it is asked to (write_dense / write_experts) into files whose
  // names carry no dp. With count > 1 every replica computes the same assignment, by bytes,
  // and writes its share into model_tpXX_ppXX_dpXX (its moments: optim_..._dpXX).
  struct Share {
    int index = 0, count = 1;
  };
  Share dense_share, expert_share;
  // The non-trainable buffers: buffers[i] is the rank's shard of buffer_infos[i] (its
  // local shape and dtype). Saved with the model, never with the optimizer.
  std::vector<model::BufferInfo> buffer_infos;
  std::vector<Tensor> buffers;

  //
  // The values saved are `opt`'s fp32 main parameters when it holds them (bf16/f16 models,
  // as Megatron's main params): a resumed run then continues bit for bit, and the checkpoint
  // loads on any device and in any dtype. Buffers on a GPU are copied to host memory (the
  // snapshot then owns them). The Adam moments and step count come with `moments` (false:
  // --no-save-optim). opt may be null (the model's parameters, no moments).
  static RankSnapshot view(const model::ParamStore& params, const optim::AdamW* opt,
                           RankCoord coord = {}, bool moments = true);
  RankSnapshot clone() const;
};

// The rank whose copy of a TP-duplicated tensor is written: 0 writes it. A dense tensor's
// TP rank; an expert's (expert >= 0: its fc2 bias, its FP8 scaling state) ETP rank.
inline int dup_rank(const RankSnapshot& rank, int expert) {
  return expert >= 0 ? rank.expert_tp_rank : int(rank.coord.tp);
}

// A box of the global tensor held in a local tensor: rows/cols [offset, offset+shape) of the
// global tensor sit at local_offset in the local tensor. 1-D tensors use cols = 1.
struct Piece {
  int64_t g_row = 0, g_col = 0;  // offset in the global tensor
  int64_t rows = 0, cols = 0;    // extent
  int64_t l_row = 0, l_col = 0;  // offset in the local tensor
};
// The pieces of TP rank `tp_rank` of parameter p: one box, or two for SwiGLU's [gate_r; up_r].
std::vector<Piece> local_pieces(const model::ParamInfo& p, int64_t tp_rank, int64_t tp_size);
// The same for a persistent buffer (split by the same rule as a parameter).
std::vector<Piece> local_pieces(const model::BufferInfo& b, int64_t tp_rank, int64_t tp_size);

// ---- saving --------------------------------------------------------------------------------
// One process holding all of the model (the serial layout, or TP=1 conversions).
void save_checkpoint(const std::string& save_dir, const model::ParamStore& params,
                     const optim::AdamW* opt /* null: --no-save-optim */, const TrainingState& st,
                     const SaveOptions& opts = {});
void save_checkpoint(const std::string& save_dir, const model::GPTModel& model,
                     const optim::AdamW* opt, const TrainingState& st, SaveOptions opts = {});
// Several ranks' data in one process (tests of resharding, converters).
void save_checkpoint(const std::string& save_dir, std::span<const RankSnapshot> ranks,
                     const TrainingState& st, const SaveOptions& opts = {});

// Building blocks of a multi-process save: every rank calls write_rank_files() into the same
// temporary directory (begin_checkpoint's name, broadcast from rank 0) and sends the returned
// shard records to rank 0, which calls commit_checkpoint() after a barrier.
std::string begin_checkpoint(const std::string& save_dir, int64_t iteration,
                             const SaveOptions& opts = {});
nlohmann::json write_rank_files(const std::string& tmp_dir, const RankSnapshot& rank);
// The distributed optimizer's state is sharded over DP: flat-buffer elements
// [flat, flat + len) of parameter `param` sit at [shard, shard + len) of the shard buffers
// (the optimizer's own segment type, parallel/data_parallel/grad_buffer.h).
using ShardSegment = parallel::ShardSegment;
// Writes this DP rank's blocks of the Adam moments (exp_avg / exp_avg_sq: its shard
// buffers) into optim_tpXX_ppXX_dpXX.safetensors, each block cut into boxes of the global
// tensor, so a loader under any TP and DP layout finds the pieces it needs (the usual
// intersection of boxes). `rank` gives infos, coord, tp_size and optimizer_steps; its
// params and moments are not written here (DP rank 0's write_rank_files writes the model).
// TP-duplicated tensors are written by TP rank 0 only.
nlohmann::json write_optimizer_shard(const std::string& tmp_dir, const RankSnapshot& rank,
                                     const Tensor& exp_avg, const Tensor& exp_avg_sq,
                                     std::span<const ShardSegment> segments);
// rank_records: from write_rank_files / write_optimizer_shard of every rank (in any order).
void commit_checkpoint(const std::string& save_dir, const std::string& tmp_dir,
                       const std::vector<nlohmann::json>& rank_records, const TrainingState& st,
                       const SaveOptions& opts = {});

// ---- finding and loading -------------------------------------------------------------------
std::string iteration_dir_name(int64_t iteration);  // "iter_0000100"
// Complete checkpoints (an iter_* directory holding metadata.json), ascending.
std::vector<int64_t> list_iterations(const std::string& load_dir);
// The tracker's iteration; without a usable tracker (missing, garbage, or pointing at a
// missing directory) the newest complete iteration, with a warning. nullopt: none at all.
std::optional<int64_t> latest_iteration(const std::string& load_dir);

// Reads iteration (default: latest) into params (any TP layout) and opt (null:
// --no-load-optim), verifying checksums, shapes, dtypes and model compatibility. Any problem
// is an mcpp::Error that names the file and tensor and lists the iterations that exist.
// Persistent buffers: each registered buffer gets its shard from the checkpoint (resharded
// like a parameter); one the checkpoint lacks (written before it existed) keeps its initial
// value, with a warning naming it; a buffer of the checkpoint that the model does not
// register is skipped with a warning (silently for partial_model: another stage's).
TrainingState load_checkpoint(const std::string& load_dir, std::optional<int64_t> iteration,
                              model::ParamStore& params, optim::AdamW* opt,
                              const LoadOptions& opts = {});
TrainingState load_checkpoint(const std::string& load_dir, std::optional<int64_t> iteration,
                              model::GPTModel& model, optim::AdamW* opt, LoadOptions opts = {});
// The same into host buffers laid out like `layout` (its infos, offsets and TP rank):
// values [total] (f32 keeps the checkpoint's fp32 values exactly), and the Adam moments
// when exp_avg/exp_avg_sq are given ([total] each; null: --no-load-optim). Elements between
// parameters are left as they are. The trainer moves them to the GPU, the fp32 main
// parameters and the distributed optimizer's shards from there. The registered buffers of
// `layout` are written in place (its buffer tensors, on any device), and only once
// everything else has loaded: a failed load leaves them as they were.
TrainingState load_checkpoint_host(const std::string& load_dir, std::optional<int64_t> iteration,
                                   const model::ParamStore& layout, const Tensor& values,
                                   const Tensor* exp_avg, const Tensor* exp_avg_sq,
                                   const LoadOptions& opts = {});

// The parsed metadata.json of a checkpoint (dir: the save directory or an iter_* directory).
nlohmann::json read_metadata(const std::string& dir, std::optional<int64_t> iteration = {});
// The model config recorded at save time (error when the checkpoint has none).
model::TransformerConfig model_config_from_metadata(const nlohmann::json& metadata);
nlohmann::json model_config_json(const model::TransformerConfig& c);
// The model-shape fields of a checkpoint's "model" record (saved) that must agree with the
// loading model (cur); `where` names the checkpoint in the error. vocab_repad: the padded
// vocabulary may differ (load_checkpoint's re-padding). rotary_base, rotary_percent,
// rope_scaling, rotary_seq_len_interpolation_factor and norm_epsilon differences are
// warnings. key_set_may_differ (strictness.h): the switches that only add or remove keys
// (num_layers, biases, q/k norms, tied output, expert bias, shared-expert gate) are warnings
// too, the keys then checked one by one.
void check_model_compat(const nlohmann::json& saved, const model::TransformerConfig& cur,
                        const std::string& where, bool vocab_repad,
                        bool key_set_may_differ = false);

// `megatron inspect CKPT`: iteration, state, config, tensors and shard layout; reads every
// shard and verifies its checksum (the report says which are bad, and bad_shards receives
// their count; it throws only when the metadata itself is unreadable).
std::string describe_checkpoint(const std::string& dir, int* bad_shards = nullptr);

// --save: creates the folder when missing and proves it writable by creating and removing a
// file in it, so that a bad --save stops the run at start-up, not at the first save.
void check_save_dir_writable(const std::string& save_dir);

// TrainingState <-> JSON, as stored in metadata.json's "state".
nlohmann::json state_to_json(const TrainingState& st);
TrainingState state_from_json(const nlohmann::json& j);

}  // namespace mcpp::checkpoint
