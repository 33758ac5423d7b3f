// The one parameter registry: every parameter's Megatron-Core name, global and
// local shape, how TP splits it, whether it is duplicated across TP, whether
// weight decay applies, and its slice of the flat parameter and gradient buffers.
// Gradient clipping, the optimizer and the checkpoint all read this registry.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "tensor/tensor.h"

namespace mcpp::model {

// How the global tensor is split across TP ranks.
enum class TpSplit {
  None,        // duplicated on every TP rank (norms, row-parallel biases)
  Rows,        // dim 0 (column-parallel weights and biases, vocab-parallel embedding)
  Cols,        // dim 1 (row-parallel weights)
  SwigluRows,  // linear_fc1 with SwiGLU: global [gate(F); up(F)], each rank [gate_r; up_r]
};

// Normal: init_std times a standard normal; XavierUniform (--init-method-xavier-uniform):
// uniform in [-b, b), b = sqrt(6 / (fan_in + fan_out)) from the global [out, in] shape (so
// every TP layout draws the TP 1 values); both by global index.
enum class Init { Normal, Zeros, Ones, XavierUniform };

// Which data-parallel group reduces a parameter's gradient: the dense parameters over
// DP (x CP); expert parameters over the expert-data-parallel group (EP).
enum class GradGroup { Dense, Expert };

struct ParamInfo {
  std::string name;   // e.g. decoder.layers.3.self_attention.linear_qkv.weight
  Shape global_shape;
  Shape local_shape;
  TpSplit split = TpSplit::None;
  Init init = Init::Normal;
  double init_std = 0;
  bool weight_decay = true;  // false for biases and norm weights, as Megatron
  int layer = -1;            // owning transformer layer, -1 for embedding/head/final norm
  int64_t offset = 0;        // element offset in the flat buffers
  // The last pipeline stage's copy of the tied word embedding: the same tensor as the
  // first stage's (same name, same initialisation, gradients summed over the embedding
  // group), written to checkpoints and counted in norms by the first stage only.
  bool pipeline_duplicate = false;
  // Under --sequence-parallel this parameter acts on the rank's sequence shard (norm
  // weights and biases, learned position embeddings), so its gradient is a partial sum
  // over TP that finalize_model_grads all-reduces over TP. Set by the registering module,
  // never inferred from the name. (Row-parallel biases are added after the reduction and
  // their gradients are complete: false.)
  bool sequence_parallel = false;
  // Its gradient is a partial sum over TP whatever --sequence-parallel (the q/k norm weights,
  // which each TP rank applies to its own heads): finalize_model_grads all-reduces it over TP.
  bool tp_partial = false;
  GradGroup grad_group = GradGroup::Dense;
  int expert = -1;  // expert index (EP), -1 for dense parameters
  // Its rank in the group it is split over when that is not the TP group (experts under
  // --expert-tensor-parallel-size != TP: the ETP rank); -1: the TP rank.
  int split_rank = -1;
  int64_t shard_rank(int64_t tp_rank) const { return split_rank >= 0 ? split_rank : tp_rank; }
  // The word embedding and the output layer (Megatron's is_embedding_or_output_parameter):
  // the parameters --decoupled-lr steps with their own learning rate. Set by the module.
  bool embedding_or_output = false;
  // Duplicated on every TP rank: its gradient and norm are counted once (TP rank 0).
  bool tp_duplicated() const { return split == TpSplit::None; }
  int64_t numel() const { return shape_numel(local_shape); }
};

// A parameter entry with its local shape derived from the TP split (what every module's
// add_params uses). sp: ParamInfo::sequence_parallel.
ParamInfo make_param(std::string name, Shape global, TpSplit split, Init init, double init_std,
                     bool weight_decay, int layer, int64_t tp_size, bool sp = false);

// A non-trainable persistent buffer: state a module keeps across steps (a router's expert
// bias, FP8 scaling history) that checkpoints save and reshard like a parameter, but that
// has no gradient, is not in the flat parameter/gradient buffers, and is never optimised.
struct BufferInfo {
  std::string name;  // Megatron-Core style, e.g. decoder.layers.3.mlp.router.expert_bias
  Shape global_shape;
  Shape local_shape;  // derived from `split` by add_buffer
  DType dtype = DType::F32;
  TpSplit split = TpSplit::None;  // the partition description, as ParamInfo's
  int layer = -1;
  int expert = -1;                // expert index (EP), -1 when not an expert's
  Init init = Init::Zeros;        // Zeros or Ones; Normal is not a buffer's
  // Given initial values of the GLOBAL tensor (row-major); empty: `init`. Each rank
  // takes its shard.
  std::vector<double> values;
  int64_t numel() const { return shape_numel(local_shape); }
};

// Views of one registered parameter and its gradient (undefined when not registered:
// an optional bias, or a shape-only module built without a ParamStore).
struct ParamView {
  Tensor w, g;
};

class ParamStore {
 public:
  // Registration, then allocate() once.
  void add(ParamInfo info);
  // CPU: params and grads in `dtype`. The general form puts both on `device`, the
  // grads in their own dtype (f32 main grads under bf16/f16 params, as Megatron).
  void allocate(DType dtype, int64_t tp_rank, int64_t tp_size);
  // align: every parameter starts at a multiple of `align` elements, and the total is one.
  void allocate(DType param_dtype, DType grad_dtype, Device device, int64_t tp_rank,
                int64_t tp_size, int64_t align = 16);
  // Weights only (inference, conversion): the same layout as allocate(), no gradient
  // buffer; grad() and ParamView::g are undefined, zero_grads() does nothing.
  void allocate_weights(DType dtype, Device device, int64_t tp_rank, int64_t tp_size,
                        int64_t align = 16);
  bool has_grads() const { return grads_.defined(); }

  // Parallel-invariant initialisation: element e of the global tensor is
  // N(0, std) drawn from Philox(seed, hash(name), e), so each rank generates
  // exactly its shard and any TP layout assembles the same model.
  void initialize(uint64_t seed);

  // Global flat index of local element (r, c) of parameter i (used by init and
  // checkpoint resharding).
  int64_t global_index(const ParamInfo& p, int64_t local_row, int64_t local_col) const;

  const std::vector<ParamInfo>& infos() const { return infos_; }
  const ParamInfo& info(const std::string& name) const;
  bool has(const std::string& name) const { return index_.count(name) > 0; }
  Tensor param(const std::string& name) const;
  Tensor grad(const std::string& name) const;
  Tensor param(size_t i) const;
  Tensor grad(size_t i) const;
  Tensor& flat_params() { return params_; }
  Tensor& flat_grads() { return grads_; }
  int64_t total_numel() const { return total_; }
  Device device() const { return params_.device(); }
  int64_t tp_rank() const { return tp_rank_; }
  int64_t tp_size() const { return tp_size_; }
  void zero_grads();
  // Non-trainable persistent buffers (see BufferInfo). Registered before allocate(),
  // which gives each its own tensor on the parameters' device, initialised.
  void add_buffer(BufferInfo info);
  const std::vector<BufferInfo>& buffer_infos() const { return buffer_infos_; }
  bool has_buffer(const std::string& name) const { return buffer_index_.count(name) > 0; }
  // The rank's shard (local_shape, the buffer's dtype); writable in place.
  Tensor buffer(const std::string& name) const;
  Tensor buffer(size_t i) const { return buffers_.at(i); }
  // Global flat index of local element (r, c) of a tensor split as `split`.
  static int64_t global_flat_index(TpSplit split, const Shape& global, const Shape& local,
                                   int64_t tp_rank, int64_t local_row, int64_t local_col);

  // Views of parameter `name` and its gradient; undefined when `store` is null (a
  // shape-only module) or holds no such parameter (an optional bias).
  static ParamView view(const ParamStore* store, const std::string& name);

 private:
  std::vector<ParamInfo> infos_;
  std::unordered_map<std::string, size_t> index_;
  std::vector<BufferInfo> buffer_infos_;
  std::unordered_map<std::string, size_t> buffer_index_;
  std::vector<Tensor> buffers_;
  void allocate_impl(DType param_dtype, DType grad_dtype, Device device, int64_t tp_rank,
                     int64_t tp_size, int64_t align, bool grads);
  Tensor params_, grads_;
  int64_t total_ = 0, tp_rank_ = 0, tp_size_ = 1;
};

}  // namespace mcpp::model
