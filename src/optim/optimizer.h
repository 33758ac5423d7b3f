// The optimizer interface and AdamW.
//
// Optimizer: what the training loop and the checkpoint need of an optimizer, whether it
// holds the whole state (AdamW) or this rank's data-parallel shard of it (DistributedAdamW,
// optim/distributed_optimizer.h). An optimizer owns the gradient buffer it steps from
// (`grads()`: the model's flat gradients, or the reduce-scattered shard) and its state
// (fp32 main parameters, Adam moments), placed by `segments()`: parameter p's flat
// elements [flat, flat + len) sit at [shard, shard + len) of grads(), exp_avg() and
// exp_avg_sq(). Everything that reads gradients per parameter -- the global norm over the
// parameters that count, the sequence-parallel all-reduce (parallel/finalize_model_grads)
// -- goes through those segments, so it is written once for both.
//
// AdamW over the parameter registry's flat buffers, with Megatron's parameter groups (no
// weight decay on biases and norm weights) and global-norm clipping. Its state is kept per
// element in two flat buffers laid out like the parameters (one segment per parameter,
// shard == flat). OptimizerConfig::rule swaps the update for SGD with momentum or Lion
// (Megatron's --optimizer sgd / lion): the same parameter groups, clipping, mixed
// precision and layout, with one state buffer (exp_avg(): SGD's momentum buffer, Lion's
// moving average; exp_avg_sq() undefined). Both classes keep the name of their main rule.
//
// Mixed precision as Megatron's Float16OptimizerWithFloat16Params: when the model's
// parameters are bf16/f16, the optimizer holds fp32 main parameters (a copy made at
// construction), steps them with the fp32 main gradients, and writes them back to the
// model's parameters, rounded to nearest even, in the same pass (adamw_step's model_param
// output). f32 and f64 parameters are stepped in place. Everything lives on the
// parameters' device. For bf16 models the fp32 main parameters are held as the model
// parameters plus their lower 16 bits (ops/split_main.h: the same fp32 values bit for bit,
// 2 bytes an element instead of 4; the model parameters rounded half away from zero).
#pragma once
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "model/params.h"
#include "optim/muon.h"
#include "parallel/data_parallel/grad_buffer.h"

namespace mcpp::optim {

// The update rule (Megatron's --optimizer): AdamW, or one of the element-wise rules with
// one state buffer (ops/momentum_step.h): SGD with momentum, Lion.
enum class UpdateRule { Adam, Sgd, Lion };
// "adam", "sgd" or "lion" (Megatron's spellings; the checkpoint records it).
const char* rule_name(UpdateRule r);

struct OptimizerConfig {
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // Adam
  UpdateRule rule = UpdateRule::Adam;
  double sgd_momentum = 0.9;                      // --sgd-momentum
  double lion_beta1 = 0.95, lion_beta2 = 0.98;    // --lion-beta1 / --lion-beta2
  // Adam's moments when the optimizer's state is fp32 (--use-precision-aware-optimizer
  // with --exp-avg-dtype / --exp-avg-sq-dtype): F32 or BF16. A bf16 moment is read, updated
  // in fp32, used by the parameter update unrounded and stored rounded to nearest even.
  DType exp_avg_dtype = DType::F32, exp_avg_sq_dtype = DType::F32;
};

using ShardSegment = parallel::ShardSegment;
// Selects parameters by registry index.
using ParamFilter = std::function<bool(size_t)>;

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // ---- gradients ---------------------------------------------------------------------
  // The gradient buffer the step reads (fp32 main grads; f64 for f64 models).
  virtual Tensor& grads() = 0;
  const Tensor& grads() const { return const_cast<Optimizer*>(this)->grads(); }
  // Where every parameter's part of this rank's state sits (see the file comment).
  virtual const std::vector<ShardSegment>& segments() const = 0;
  // Whether the state is this rank's data-parallel shard (the checkpoint then writes the
  // moments per DP rank, by segments()), rather than laid out like the parameters.
  virtual bool state_sharded() const = 0;
  // Sum of squares (fp64) of grads() over the parameters `counted` accepts, one reduction
  // per run of counted segments in buffer order (the padding between them is zero, so a
  // run may span it). counted == nullptr: every parameter (AdamW then reduces its whole
  // buffer in one call). Summing over ranks is the caller's (optim/grad_norm.h).
  virtual double grad_sq_norm(const ParamFilter* counted = nullptr) const;
  // Megatron's clip_grad_by_total_norm_fp32: the next step() reads grads() scaled by
  // max_norm / (norm + 1e-6) when that is < 1 (bit for bit as if grads() had been scaled:
  // the factor is applied in the step's own pass, which saves a read and a write of every
  // gradient; grads() itself keeps the unclipped values); max_norm <= 0 turns clipping off.
  void clip(double max_norm, double total_norm);
  // The factor clip() set for the next step (1 when none).
  double pending_grad_scale() const { return grad_scale_; }
  // grads() *= factor (fp16: 1 / loss scale, Megatron's _unscale_main_grads).
  void scale_grads(double factor);
  // scale_grads(inv_scale), then whether any gradient is NaN/Inf (synchronises).
  bool unscale_and_check(double inv_scale);

  // ---- the step ----------------------------------------------------------------------
  // One step of the configured rule with learning rate lr and weight decay wd (decay only
  // on parameters whose registry entry says so); the model's parameters are updated (or,
  // with an overlapped parameter gather, will be once wait_params says so).
  virtual void step(double lr, double wd) = 0;
  // The forward's hook before layer `layer`'s parameters are read (-1: embedding, final
  // norm, output layer): returns once they are current. No-op unless the update reaches
  // the model asynchronously (--overlap-param-gather).
  virtual void wait_params(int layer) {}
  // Every parameter current (before a checkpoint reads them).
  virtual void wait_params_all() {}
  int64_t steps() const { return step_; }
  void set_steps(int64_t s) { step_ = s; }
  // --decoupled-lr (Megatron's decoupled parameter group): the parameters the registry marks
  // embedding_or_output step with the rate set here, the others with step()'s lr.
  void set_decoupled_lr(double lr) { decoupled_lr_ = lr; }
  // --use-mup (Megatron's get_mup_config_overrides), set for each step: the learning rate
  // of a muP group and Adam's epsilon of the hidden one. Hidden: the matrix-like parameters
  // (two or more dimensions) but the embeddings, the output layer and the matrices Muon
  // steps; vector-like: the others. Adam and Lion (and Muon's scalar rule) take hidden_lr,
  // SGD vector_lr; --decoupled-lr's group keeps its own rate.
  struct MupRates {
    std::optional<double> hidden_lr, vector_lr;
    std::optional<double> hidden_eps;  // Adam only
  };
  void set_mup(const MupRates& r) { mup_ = r; }
  // Whether parameter p is matrix-like for muP (Muon's matrices aside).
  static bool mup_matrix_like(const model::ParamInfo& p);
  const OptimizerConfig& config() const { return cfg_; }

  // ---- state (checkpoints) -----------------------------------------------------------
  // Bytes of optimizer state this rank holds (main params + moments).
  virtual int64_t state_bytes() const = 0;
  // Whether the fp32 main parameters are held as (model parameters, lower halves):
  // ops/split_main.h; then full_main_params() is a host tensor.
  bool main_params_split() const { return lo_.defined(); }
  // Whether an optimizer of a model of this dtype keeps its main parameters split:
  // bf16 parameters and MCPP_FP32_MAIN_PARAMS not 1 (the distributed optimizer joins them
  // again under --fp8-param-gather).
  static bool wants_split_main(DType model_dtype);
  // Bytes an element of the main parameters takes apart from the model's own: none for
  // f32/f64 models, the lower halves (2) for split bf16 ones, a whole fp32 copy (4) else
  // (--fp8-param-gather joins split ones again).
  static int64_t main_param_bytes(DType model_dtype, bool fp8_param_gather);
  // Moments, laid out as grads() (segments()): Adam's two; the one state buffer of SGD and
  // Lion as exp_avg() (exp_avg_sq() then undefined).
  const Tensor& exp_avg() const { return m_; }
  const Tensor& exp_avg_sq() const { return v_; }
  UpdateRule rule() const { return cfg_.rule; }
  // What the state belongs to, as checkpoints record it: rule_name(rule()), or with Muon
  // "muon" (scalar rule Adam: two moments) or "muon_lion" (one). Muon's momentum of a
  // matrix sits where exp_avg() would hold the scalar rule's first moment (exp_avg_sq() is
  // zero there).
  std::string state_name() const;
  // --optimizer muon (optim/muon.h): whether the 2-D matrices step by Muon.
  bool muon() const { return muon_.has_value(); }
  // --optimizer muon: the parameters optim/muon.h's muon_steps accepts step by Muon with
  // config c (TP groups g), the others by the configured (scalar) rule: Adam or Lion.
  void enable_muon(const MuonConfig& c, const MuonGroups& g);
  // The fp32 main parameters of the whole model, [total] laid out like the flat buffer,
  // for a checkpoint (on the parameters' device, or on the host when they are split);
  // undefined when the model's parameters are the main parameters (f32/f64 models).
  // Collective over DP when the state is sharded.
  virtual Tensor full_main_params() = 0;
  // After loading a checkpoint: the parameters from `values` and (when given) the moments
  // from exp_avg / exp_avg_sq (null for the rules without a second moment), all flat
  // [total] tensors laid out like the parameters, on any device. The main parameters take
  // the values exactly; the model's parameters get them rounded to their dtype, as after a
  // step.
  virtual void load_state(const Tensor& values, const Tensor* exp_avg,
                          const Tensor* exp_avg_sq) = 0;

 protected:
  Optimizer(model::ParamStore& ps, OptimizerConfig cfg) : ps_(ps), cfg_(cfg) {}
  Stream& stream() const;

  // values (f32, any device) -> model (bf16) and lo (u16, or undefined), both on the
  // stream's device, through a bounded device buffer when values are elsewhere.
  static void split_from(const Tensor& values, Tensor model, Tensor lo, Stream& st);
  // (model, lo) on the stream's device -> out (f32, any device), the same way.
  static void join_to(const Tensor& model, const Tensor& lo, Tensor out, Stream& st);
  // The state buffers of the rule, shaped `shape`, zero: m_, and v_ for Adam; of `dtype`,
  // or, when that is F32, of the config's moment dtypes.
  void allocate_state(const Shape& shape, DType dtype, Device dev);
  // One span's update by the rule, at this step's count and clipping factor: the main
  // parameters w (or, split, the model parameters with their lower halves lo), gradient
  // g, state m / v (v unused but by Adam); model: the 16-bit model parameters written
  // beside whole fp32 main parameters (undefined for f32/f64 models and when split).
  void update_span(Tensor w, Tensor lo, const Tensor& g, Tensor m, Tensor v, Tensor model,
                   double lr, double wd, double eps, Stream& st);
  // Muon's element-wise halves, on one span of a matrix (flat views, fp32): the momentum
  //   m = mu m + (1 - mu) s g   (s: the clipping factor; g widened to fp32 when it is not),
  // and with Nesterov u = (1 - mu) s g + mu m written to u (undefined without Nesterov:
  // the update is m itself); then, given the orthogonalised update, decoupled weight decay
  // w -= lr wd w and w -= lr update on the fp32 weights -- main (whole fp32 main
  // parameters), or joined from the 16-bit model span and its lower halves lo (split), or
  // the model span itself (f32 models) -- and the model span written back.
  void muon_momentum_span(const Tensor& g, Tensor m, Tensor u, Stream& st) const;
  void muon_apply_span(Tensor model, Tensor main, Tensor lo, const Tensor& update, double lr,
                       double wd, Stream& st) const;
  // The most fp32 update bytes one batch of Muon matrices may hold while it is
  // orthogonalised (at least one matrix a batch): 256 MiB, or MCPP_MUON_WINDOW_BYTES.
  static int64_t muon_window_bytes();
  // After a step's spans: the clipping factor is spent, SGD's buffers hold state.
  void finish_step() { grad_scale_ = 1.0, momentum_started_ = true; }
  // Loaded state: whether the state buffers came from a checkpoint (SGD then continues
  // them; otherwise its first step sets them to the gradient, as torch's SGD does).
  void set_state_loaded(bool loaded) { momentum_started_ = loaded; }

  model::ParamStore& ps_;
  OptimizerConfig cfg_;
  // main_: fp32 main parameters; or lo_: their lower halves beside the bf16 model
  // parameters (split; main_ then undefined).
  Tensor main_, lo_, m_, v_;
  int64_t step_ = 0;
  std::optional<double> decoupled_lr_;
  std::optional<MupRates> mup_;
  std::optional<MuonConfig> muon_;
  MuonGroups muon_groups_;
  double grad_scale_ = 1.0;  // clip()'s factor, applied and reset by step()
  bool momentum_started_ = false;  // SGD: the buffers hold a step's state
  // The learning rate of parameter `param` (registry index) in a step with rate lr
  // (--decoupled-lr, then muP), and Adam's epsilon for it.
  double lr_of(size_t param, double lr) const;
  double eps_of(size_t param) const;
  bool mup_hidden(size_t param) const;
};

class AdamW final : public Optimizer {
 public:
  AdamW(model::ParamStore& params, OptimizerConfig cfg);

  Tensor& grads() override { return ps_.flat_grads(); }
  using Optimizer::grads;
  const std::vector<ShardSegment>& segments() const override { return segs_; }
  bool state_sharded() const override { return false; }
  double grad_sq_norm(const ParamFilter* counted = nullptr) const override;
  void step(double lr, double wd) override;
  int64_t state_bytes() const override;
  Tensor full_main_params() override;
  void load_state(const Tensor& values, const Tensor* exp_avg, const Tensor* exp_avg_sq) override;

  // Whether there are fp32 main parameters apart from the model's (bf16/f16 models),
  // whole or split.
  bool has_main_params() const { return main_.defined() || lo_.defined(); }
  // Sum of squares (fp64) of the main parameters [offset, offset + n) of the flat layout
  // (the model's parameters when there are none apart).
  double main_sum_squares(int64_t offset, int64_t n) const;
  // Sets the parameters from `values`, a flat [total] tensor on any device (a checkpoint's
  // host copy): the fp32 main parameters exactly when they exist, and the model's
  // parameters from them (rounded to bf16/f16), as after a step.
  void set_params(const Tensor& values);
  Tensor& exp_avg() { return m_; }
  Tensor& exp_avg_sq() { return v_; }
  using Optimizer::exp_avg;
  using Optimizer::exp_avg_sq;

 private:
  // Muon's step of parameter i (registry index) in two halves: the momentum update,
  // returning U (fp32, the parameter's shape); then, given the orthogonalised update,
  // decoupled weight decay wd and W -= lr * update (the model's copy written back).
  Tensor muon_momentum(size_t i, Stream& st);
  void muon_apply(size_t i, double lr, double wd, const Tensor& update, Stream& st);
  std::vector<ShardSegment> segs_;
};

}  // namespace mcpp::optim
