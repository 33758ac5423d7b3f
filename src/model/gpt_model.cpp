// GPTModel: a pipeline stage's modules (stage.h) run per model chunk and micro-batch, the
// slot pool holding what each micro-batch in flight saved, and the hooks. The math lives
// in the modules: embedding, transformer_block -> transformer_layer -> attention /
// core_attention / mlp -> linear / norm, lm_head (docs/model.md).
#include "model/gpt_model.h"

#include <omp.h>

#include <algorithm>
#include <chrono>

#include "base/log.h"
#include "model/fp8/fp8_linear.h"
#include "ops/ops.h"
#include "parallel/tensor_parallel/mappings.h"

namespace mcpp::model {

// One micro-batch's saved activations for one model chunk.
struct GPTModel::Slot {
  int microbatch = -1;  // -1: free
  int64_t S = 0, B = 0;
  MicroBatch mb;
  StepKeys keys;
  StageSaved saved;
  int64_t bytes = 0;  // measured, once the forward is done
  bool mtp = false;   // the MTP depths ran (a training forward of the last chunk)
  double tokens = 0;  // the micro-batch's loss-mask sum (the MTP gradients' scale)
};

GPTModel::GPTModel(const TransformerConfig& cfg, comm::Communicator* tp, PipelinePart part)
    : cfg_(cfg), tp_(tp), part_(std::move(part)), ws_(std::make_unique<Workspace>()) {
  cfg_.validate();
  if (cfg_.tp_size > 1) {
    // Without a communicator the model holds one TP rank's parameters (checkpoint
    // conversion, tests) but cannot run: forward() says so.
    MCPP_CHECK(!tp_ || (tp_->size() == cfg_.tp_size && tp_->rank() == cfg_.tp_rank),
               "GPTModel with tp_size {} (rank {}) got the TP communicator {} of rank {}",
               cfg_.tp_size, cfg_.tp_rank, tp_ ? tp_->describe() : "", tp_ ? tp_->rank() : -1);
  } else {
    tp_ = nullptr;  // a group of one: every region transition is the identity
  }
  part_ = normalized_part(cfg_, part_);
  // A chunk may hold no layers (--pipeline-model-parallel-layout "E|tt|tL"): its block is
  // the identity, forward passes hidden[0] on and backward passes dx back.
  for (const auto& ch : part_.chunks) {
    for (int l : ch)
      MCPP_CHECK(l >= 0 && l < cfg_.num_layers, "GPTModel: layer {} outside [0, {})", l,
                 cfg_.num_layers);
  }
  for (auto& p : Stage::parameters(cfg_, part_)) params_.add(std::move(p));
  for (const auto& ch : part_.chunks) add_fp8_buffers(cfg_, ch, params_);  // FP8 scaling state
  if (part_.last_stage) {  // the MTP depths' (model/mtp.h), which run on the last stage
    std::vector<int> mtp;
    for (int k = 0; k < int(cfg_.mtp_num_layers); ++k)
      mtp.push_back(TransformerConfig::kMtpLayerBase + k);
    add_fp8_buffers(cfg_, mtp, params_);
  }
  for (auto& b : Stage::buffers(cfg_, part_)) params_.add_buffer(std::move(b));
  params_.allocate(cfg_.dtype, cfg_.grad_dtype(), cfg_.device, cfg_.tp_rank, cfg_.tp_size,
                   cfg_.param_align);
  const auto t0 = std::chrono::steady_clock::now();
  if (cfg_.perform_initialization)
    params_.initialize(cfg_.seed);
  else  // --no-initialization: zeros (a checkpoint's values replace them)
    ops::fill(params_.flat_params(), 0.0, ops::default_stream(cfg_.device));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (secs > 1.0)
    log::info("> parameters initialized in {:.1f} s on the host ({} OpenMP threads; under "
              "mpirun, --bind-to none gives each rank more cores)",
              secs, omp_get_max_threads());
  stage_ = std::make_unique<Stage>(cfg_, part_, &params_);
  pool_.resize(part_.chunks.size());
  mtp_stats_.losses.resize(stage_->mtp().size());
  mtp_stats_.tokens.resize(stage_->mtp().size());
}

GPTModel::~GPTModel() = default;

namespace {
// Sliding-window attention: the window layers' key starts, [B, S] i64 on the model's device,
// max(document start, q - L) for the row at global position q (this CP rank's two chunks:
// Dims::cp_chunk_start). Built on the host once per pass of a chunk, for all its window
// layers; the kernels' document-mask path (ops::AttentionDims::key_start) applies it.
void attach_window(StepContext& cx, const MicroBatch& mb) {
  if (!cx.cfg->has_window_layers()) return;
  const int64_t L = cx.cfg->window_left, B = cx.B, S = cx.S;
  MCPP_CHECK(!mb.key_start.defined() ||
                 (mb.key_start.dtype() == DType::I64 && mb.key_start.device() == Device::CPU &&
                  mb.key_start.numel() == B * S),
             "document masking: {} is not i64 [B={}, S={}] on the host", mb.key_start.str(), B, S);
  Tensor ks = Tensor::empty({B, S}, DType::I64);
  int64_t* out = ks.data<int64_t>();
  const int64_t* doc = mb.key_start.defined() ? mb.key_start.data<int64_t>() : nullptr;
  for_each_global_run(cx, 0, S, [&](int64_t row, int64_t n, int64_t q0) {
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = row; i < row + n; ++i) {
        const int64_t q = q0 + i - row, from_doc = doc ? doc[b * S + i] : 0;
        out[b * S + i] = std::max(from_doc, q - L);
      }
  });
  if (cx.dev == Device::CPU) {
    cx.window_key_start = ks;
  } else {  // (the pageable copy returns once ks is staged: ks may go)
    cx.window_key_start = Tensor::empty({B, S}, DType::I64, cx.dev);
    ops::copy(ks, cx.window_key_start, cx.stream());
  }
}

// Document masking: the micro-batch's per-token positions and document starts, on the
// model's device, copied once per forward and once per backward of a chunk. Positions go
// sequence-first ([S, B], the rows of the activations: RoPE's table and the learned
// position lookup read them per row, an SP shard is a narrow); key_start stays [B, S] (the
// attention kernels read it per sequence).
void attach_documents(StepContext& cx, const MicroBatch& mb) {
  attach_window(cx, mb);
  if (!mb.position_ids.defined() && !mb.key_start.defined()) return;
  for (const Tensor* t : {&mb.position_ids, &mb.key_start})
    MCPP_CHECK(!t->defined() || (t->dtype() == DType::I64 && t->device() == Device::CPU &&
                                 t->numel() == cx.B * cx.S),
               "document masking: {} is not i64 [B={}, S={}] on the host", t->str(), cx.B, cx.S);
  if (mb.position_ids.defined()) {
    Tensor sb = Tensor::empty({cx.S, cx.B}, DType::I64);
    const int64_t* ids = mb.position_ids.data<int64_t>();
    for (int64_t s = 0; s < cx.S; ++s)
      for (int64_t b = 0; b < cx.B; ++b) sb.data<int64_t>()[s * cx.B + b] = ids[b * cx.S + s];
    if (cx.dev == Device::CPU) {
      cx.position_ids = sb;
    } else {  // (the pageable copy returns once sb is staged: sb may go)
      cx.position_ids = Tensor::empty({cx.S, cx.B}, DType::I64, cx.dev);
      ops::copy(sb, cx.position_ids, cx.stream());
    }
  }
  if (!mb.key_start.defined()) return;
  if (cx.dev == Device::CPU) {
    cx.ad.key_start = mb.key_start;
  } else {
    cx.ad.key_start = Tensor::empty({cx.B, cx.S}, DType::I64, cx.dev);
    ops::copy(mb.key_start, cx.ad.key_start, cx.stream());
  }
}
}  // namespace

void GPTModel::set_cp_comm(comm::Communicator* cp, comm::Communicator* a2a,
                           comm::Communicator* p2p) {
  MCPP_CHECK(cfg_.cp_size == 1 || (cp && cp->size() == cfg_.cp_size && cp->rank() == cfg_.cp_rank),
             "GPTModel: the context-parallel group must have cp_size {} members with this rank "
             "at {}",
             cfg_.cp_size, cfg_.cp_rank);
  cp_ = cfg_.cp_size > 1 ? cp : nullptr;
  cp_a2a_ = cp_ ? a2a : nullptr, cp_p2p_ = cp_ ? p2p : nullptr;
}

int GPTModel::num_chunks() const { return stage_->num_chunks(); }

// ---- slots -------------------------------------------------------------------------------

GPTModel::Slot& GPTModel::acquire(int chunk, int microbatch) {
  for (auto& [c, sl] : live_)
    MCPP_CHECK(!(c == chunk && sl->microbatch == microbatch),
               "GPTModel: micro-batch {} of chunk {} is already in flight (forward twice "
               "without its backward)",
               microbatch, chunk);
  Slot* slot = nullptr;
  for (auto& p : pool_[size_t(chunk)])
    if (p->microbatch < 0) {
      slot = p.get();
      break;
    }
  if (!slot) {
    pool_[size_t(chunk)].push_back(std::make_unique<Slot>());
    slot = pool_[size_t(chunk)].back().get();
  }
  slot->microbatch = microbatch;
  live_.push_back({chunk, slot});
  return *slot;
}

void GPTModel::release(int chunk, int microbatch) {
  for (size_t i = 0; i < live_.size(); ++i)
    if (live_[i].first == chunk && live_[i].second->microbatch == microbatch) {
      Slot* s = live_[i].second;
      live_bytes_ -= s->bytes, --in_flight_;
      s->microbatch = -1;
      live_.erase(live_.begin() + std::ptrdiff_t(i));
      return;
    }
  MCPP_CHECK(false, "GPTModel: backward of micro-batch {} of chunk {} without its forward",
             microbatch, chunk);
}

ActivationMemory GPTModel::activation_memory() const {
  ActivationMemory m;
  m.live = live_bytes_, m.peak = peak_bytes_, m.per_slot_max = slot_max_;
  const Dims d = make_dims(cfg_, cfg_.seq_length, 1);  // measured: the shapes are not read
  m.scratch = measured_bytes([&](const TensorVisitor& v) { stage_->scratch_specs(d, *ws_, v); });
  m.max_in_flight = max_in_flight_;
  return m;
}

void GPTModel::reset_activation_peak() {
  peak_bytes_ = live_bytes_, max_in_flight_ = in_flight_, slot_max_ = 0;
}

int64_t GPTModel::saved_bytes_per_microbatch(int chunk, int64_t B, int64_t S) const {
  return saved_activation_bytes(cfg_, part_, chunk, B, S);
}
int64_t GPTModel::scratch_bytes(int64_t B, int64_t S) const {
  return scratch_activation_bytes(cfg_, part_, B, S);
}

// ---- a model chunk ----------------------------------------------------------------------

GPTModel::ChunkOutput GPTModel::forward_chunk(int chunk, int microbatch, const MicroBatch& mb,
                                              const StepKeys& keys, const Tensor& input) {
  MCPP_CHECK(chunk >= 0 && chunk < num_chunks(), "GPTModel: chunk {} outside [0, {})", chunk,
             num_chunks());
  MCPP_CHECK(mb.tokens.dim() == 2, "tokens must be [B, S], got {}", mb.tokens.str());
  StepContext cx = make_step_context(cfg_, mb.tokens.size(1), mb.tokens.size(0), keys, tp_, cp_);
  cx.cp_a2a_comm = cp_a2a_, cx.cp_p2p_comm = cp_p2p_;
  attach_documents(cx, mb);
  Stream& st = cx.stream();
  const int64_t Tl = cx.Tl, H = cx.H;
  Slot& sv = acquire(chunk, microbatch);
  sv.S = cx.S, sv.B = cx.B, sv.mb = mb, sv.keys = keys;
  const bool copy_batch = mb.tokens.device() != cx.dev;
  auto saved = [&](const TensorVisitor& v) {
    stage_->saved_specs(chunk, cx, copy_batch, sv.saved, v);
  };
  allocate(saved, cx.dev, /*reset_unneeded=*/true);
  allocate([&](const TensorVisitor& v) { stage_->scratch_specs(cx, *ws_, v); }, cx.dev, false);
  if (tp_) ops::fill(ws_->ones, 1.0, st);

  const bool has_embed = stage_->has_embedding(chunk), has_head = stage_->has_head(chunk);
  auto& hidden = sv.saved.block.hidden;
  if (params_needed_ && (has_embed || has_head)) params_needed_(-1);
  if (has_embed) {
    stage_->embedding().forward(mb.tokens, sv.saved.emb, hidden[0], cx);
  } else {
    MCPP_CHECK(input.defined() && input.numel() == Tl * H,
               "GPTModel: chunk {} needs its input activation [{} x {}], got {}", chunk, Tl, H,
               input.defined() ? input.str() : std::string("none"));
    ops::copy(input.view({Tl, H}), hidden[0], st);
  }
  stage_->block(chunk).forward(sv.saved.block, *ws_, cx, params_needed_);
  ChunkOutput out;
  sv.mtp = false;
  if (has_head) {
    out.loss = stage_->head().forward(hidden.back(), mb, sv.saved.head, *ws_, cx);
    last_head_ = &sv;
    auto& mtp = stage_->mtp();
    if (!mtp.empty() && keys.training) {  // evaluation reports the LM loss alone (Megatron)
      MCPP_CHECK(mb.loss_mask.device() == Device::CPU,
                 "multi-token prediction: the micro-batch must arrive on the host");
      sv.mtp = true, sv.tokens = 0;
      const float* mask = mb.loss_mask.data<float>();
      for (int64_t i = 0; i < mb.loss_mask.numel(); ++i) sv.tokens += mask[i];
      if (!mb.mtp_tokens.empty()) sv.tokens = mb.mtp_tokens[0];  // the whole sequence's (CP)
      const Tensor* h = &sv.saved.head.lnf.y;  // h_0: the decoder's output after its norm
      for (size_t k = 0; k < mtp.size(); ++k) {
        auto& ms = sv.saved.mtp[k];
        mtp_stats_.losses[k].push_back(
            mtp[k].forward(*h, mb, ms, *ws_, cx, stage_->embedding()));
        mtp_stats_.tokens[k].push_back(ms.n);
        h = &ms.head.lnf.y;
      }
    }
  } else {
    out.output = hidden.back();
  }
  sv.bytes = measured_bytes(saved);
  live_bytes_ += sv.bytes, ++in_flight_;
  peak_bytes_ = std::max(peak_bytes_, live_bytes_);
  slot_max_ = std::max(slot_max_, sv.bytes);
  max_in_flight_ = std::max(max_in_flight_, in_flight_);
  return out;
}

Tensor GPTModel::backward_chunk(int chunk, int microbatch, const Tensor& output_grad,
                                double grad_scale, bool final) {
  Slot* svp = nullptr;
  for (auto& [ch, sl] : live_)
    if (ch == chunk && sl->microbatch == microbatch) svp = sl;
  MCPP_CHECK(svp, "GPTModel: backward of micro-batch {} of chunk {} without its forward",
             microbatch, chunk);
  Slot& sv = *svp;
  StepContext cx = make_step_context(cfg_, sv.S, sv.B, sv.keys, tp_, cp_);
  cx.cp_a2a_comm = cp_a2a_, cx.cp_p2p_comm = cp_p2p_;
  attach_documents(cx, sv.mb);
  Stream& st = cx.stream();
  const int64_t Tl = cx.Tl, H = cx.H;
  allocate([&](const TensorVisitor& v) { stage_->scratch_specs(cx, *ws_, v); }, cx.dev, false);
  auto& hidden = sv.saved.block.hidden;

  if (stage_->has_head(chunk)) {
    const Tensor* dh0 = nullptr;  // d h_0 from the MTP depths
    if (sv.mtp) {
      auto& mtp = stage_->mtp();
      const int D = int(mtp.size());
      // Depth k's loss enters as (factor / D) / n_k per micro-batch, times the loss scale
      // the LM loss's grad_scale / tokens gives it (mtp.h).
      for (int k = D - 1; k >= 0; --k) {
        auto& ms = sv.saved.mtp[size_t(k)];
        const double scale =
            ms.n > 0 ? cfg_.mtp_loss_scaling_factor / D * grad_scale * sv.tokens / ms.n : 0.0;
        const Tensor& h_prev =
            k == 0 ? sv.saved.head.lnf.y : sv.saved.mtp[size_t(k - 1)].head.lnf.y;
        const Tensor* dh_next = k == D - 1 ? nullptr : &ws_->mtp_dh[size_t(k + 1) % 2];
        mtp[size_t(k)].backward(h_prev, scale, ms, dh_next, ws_->mtp_dh[size_t(k) % 2], *ws_, cx,
                                stage_->embedding());
      }
      dh0 = &ws_->mtp_dh[0];
    }
    stage_->head().backward(hidden.back(), grad_scale, sv.saved.head, *ws_, cx, dh0);
  } else {
    MCPP_CHECK(output_grad.defined() && output_grad.numel() == Tl * H,
               "GPTModel: backward of chunk {} needs its output gradient [{} x {}], got {}",
               chunk, Tl, H, output_grad.defined() ? output_grad.str() : std::string("none"));
    ops::copy(output_grad.view({Tl, H}), ws_->dx, st);
  }
  std::function<void(int)> ready;
  if (final && grad_ready_) ready = grad_ready_;
  stage_->block(chunk).backward(sv.saved.block, *ws_, cx, ready);
  Tensor result;
  if (stage_->has_embedding(chunk)) stage_->embedding().backward(sv.mb.tokens, sv.saved.emb, *ws_, cx);
  else result = ws_->dx;
  release(chunk, microbatch);
  return result;
}

void GPTModel::drop_chunk(int chunk, int microbatch) { release(chunk, microbatch); }

// ---- the whole model ---------------------------------------------------------------------

double GPTModel::forward(const MicroBatch& mb, const StepKeys& keys) {
  return forward_pending(mb, keys).value();
}

PendingLoss GPTModel::forward_pending(const MicroBatch& mb, const StepKeys& keys) {
  MCPP_CHECK(num_chunks() == 1 && part_.first_stage && part_.last_stage,
             "GPTModel::forward runs the whole model; this one holds a pipeline stage's part "
             "(use forward_chunk)");
  for (auto& [c, sl] : live_)
    if (sl->microbatch == 0) {  // a forward without backward before (evaluation, tests)
      release(c, 0);
      break;
    }
  return forward_chunk(0, 0, mb, keys).loss;
}

void GPTModel::backward(double grad_scale) {
  MCPP_CHECK(!live_.empty(), "GPTModel::backward without a forward");
  backward_chunk(0, 0, Tensor(), grad_scale, true);
  if (grad_ready_) grad_ready_(-1);
}

const Tensor& GPTModel::logits() const {
  MCPP_CHECK(last_head_, "GPTModel::logits before any forward");
  return last_head_->saved.head.logits;
}
const Tensor& GPTModel::token_losses() const {
  MCPP_CHECK(last_head_, "GPTModel::token_losses before any forward");
  return last_head_->saved.head.losses;
}

}  // namespace mcpp::model
