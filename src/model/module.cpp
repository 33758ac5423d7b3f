#include "model/module.h"

#include <cctype>
#include <cmath>
#include <set>

#include "model/transformer_layer.h"
#include "ops/ops.h"

namespace mcpp::model {

Dims make_dims(const TransformerConfig& c, int64_t S, int64_t B) {
  Dims x;
  x.sp = c.sp();
  x.tp = c.tp_size > 1;
  // This rank's sequence shard: rows [s0, s0 + Sl) of the sequence.
  x.S = S, x.B = B, x.T = S * B, x.H = c.hidden_size;
  x.Sl = x.sp ? S / c.tp_size : S, x.s0 = x.sp ? c.tp_rank * x.Sl : 0, x.Tl = x.Sl * B;
  x.dt = c.dtype, x.sdt = c.stat_dtype(), x.dev = c.device;
  x.cp = c.cp_size, x.cp_rank = c.cp_rank, x.Sg = S * c.cp_size;
  return x;
}

StepContext make_step_context(const TransformerConfig& c, int64_t S, int64_t B,
                              const StepKeys& keys, comm::Communicator* tp,
                              comm::Communicator* cp) {
  MCPP_CHECK(S * c.cp_size <= c.seq_length || !c.learned_positions(),
             "sequence {} longer than --seq-length {}",
             S * c.cp_size, c.seq_length);
  MCPP_CHECK(c.cp_size == 1 || (cp && S % 2 == 0),
             "GPTModel::forward at cp_size {} needs the CP communicator and an even number of "
             "rows per rank (got {})",
             c.cp_size, S);
  MCPP_CHECK(c.tp_size == 1 || tp, "GPTModel::forward at tp_size {} without the TP communicator",
             c.tp_size);
  MCPP_CHECK(!c.sp() || S % c.tp_size == 0,
             "sequence parallelism needs the sequence ({}) divisible by TP ({})", S, c.tp_size);
  StepContext x;
  static_cast<Dims&>(x) = make_dims(c, S, B);
  x.cfg = &c;
  x.keys = keys;
  x.tp_comm = c.tp_size > 1 ? tp : nullptr;
  x.st = &ops::default_stream(c.device);
  const int64_t Bg = keys.global_batch ? keys.global_batch : B;
  x.p_hidden = keys.training ? c.hidden_dropout : 0.0;
  x.p_attn = keys.training ? c.attention_dropout : 0.0;
  // Dropout masks on global (s, b, h) indices: the same for any TP/SP/DP/PP split.
  x.g = ops::GlobalIndex3{{x.s0, keys.sample_offset, 0}, {S, Bg, x.H}};
  if (c.cp_size > 1) {
    // Local row j < S/2 is global row chunk0 + j; the rest sit in the second chunk.
    x.cp_comm = cp;
    const int64_t C = S / 2;
    x.g.offset[0] = x.s0 + x.cp_chunk_start(0), x.g.global[0] = x.Sg;
    x.g.split0 = C - x.s0, x.g.jump0 = x.cp_chunk_start(1) - x.cp_chunk_start(0) - C;
  }
  x.ad.S = S, x.ad.B = B, x.ad.NH = c.local_heads(), x.ad.NG = c.local_groups();
  x.ad.HD = c.kv_channels;
  x.ad.b_offset = keys.sample_offset, x.ad.h_offset = c.tp_rank * c.local_heads();
  x.ad.NH_global = c.num_attention_heads, x.ad.S_global = x.Sg;
  x.scale = c.softmax_scale();
  return x;
}

StepContext make_inference_context(const TransformerConfig& c, int64_t Sq, int64_t B,
                                   const int64_t* pos, comm::Communicator* tp) {
  MCPP_CHECK(c.tp_size == 1 || tp, "generation at tp_size {} without the TP communicator",
             c.tp_size);
  bool uniform = true;
  for (int64_t b = 1; b < B; ++b) uniform = uniform && pos[b] == pos[0];
  MCPP_CHECK(uniform || Sq == 1,
             "generation: sequences at different positions advance one row at a time (Sq={})",
             Sq);
  const int64_t p0 = pos[0];
  StepContext x;
  x.S = Sq, x.B = B, x.T = Sq * B, x.H = c.hidden_size;
  x.Sl = Sq, x.s0 = p0, x.Tl = x.T;
  x.sp = false, x.tp = c.tp_size > 1;
  x.dt = c.dtype, x.sdt = c.stat_dtype(), x.dev = c.device;
  x.cfg = &c;
  x.keys.training = false;
  x.tp_comm = c.tp_size > 1 ? tp : nullptr;
  x.st = &ops::default_stream(c.device);
  x.g = ops::GlobalIndex3{{p0, 0, 0}, {p0 + Sq, B, x.H}};
  x.ad.S = Sq, x.ad.B = B, x.ad.NH = c.local_heads(), x.ad.NG = c.local_groups();
  x.ad.HD = c.kv_channels, x.ad.h_offset = c.tp_rank * c.local_heads();
  x.ad.NH_global = c.num_attention_heads, x.ad.S_global = Sq;
  x.scale = c.softmax_scale();
  x.pos = pos, x.uniform_pos = uniform;
  return x;
}

ops::DropoutKey dropout_key(const TransformerConfig& c, const StepKeys& k, int64_t layer,
                            DropoutSite site) {
  // Seed separated from initialisation's streams; (iteration, layer, site) -> stream.
  return {c.seed ^ 0x9e3779b97f4a7c15ull,
          (uint64_t(k.iteration + 1) << 24) ^ (uint64_t(layer) << 4) ^ uint64_t(site)};
}

std::string layer_param_prefix(int layer) {
  if (TransformerConfig::is_mtp_layer(layer))  // Megatron's name of an MTP depth's layer
    return "mtp.layers." + std::to_string(layer - TransformerConfig::kMtpLayerBase) +
           ".mtp_model_layer.";
  return "decoder.layers." + std::to_string(layer) + ".";
}
std::string layer_param_name(int layer, const std::string& suffix) {
  return layer_param_prefix(layer) + suffix;
}
std::string mtp_eh_proj_name(int depth) {
  return "mtp.layers." + std::to_string(depth) + ".eh_proj";
}
int mtp_layer_of(const std::string& param_name) {
  static const std::string head = "mtp.layers.";
  if (param_name.compare(0, head.size(), head) != 0) return -1;
  size_t i = head.size();
  int k = 0;
  if (i >= param_name.size() || !std::isdigit(static_cast<unsigned char>(param_name[i])))
    return -1;
  for (; i < param_name.size() && std::isdigit(static_cast<unsigned char>(param_name[i])); ++i)
    k = 10 * k + (param_name[i] - '0');
  if (i >= param_name.size() || param_name[i] != '.') return -1;
  return TransformerConfig::kMtpLayerBase + k;
}

double output_init_std(const TransformerConfig& c) {
  return c.init_method_std / std::sqrt(2.0 * double(c.num_layers));
}

void ensure(Tensor& t, const Shape& shape, DType dt, Device dev) {
  if (!t.defined() || t.shape() != shape || t.dtype() != dt || t.device() != dev)
    t = Tensor::empty(shape, dt, dev);
}

const Tensor& on_device(const Tensor& src, Tensor& buf, Device dev, Stream& st) {
  if (src.device() == dev) return src;
  ensure(buf, src.shape(), src.dtype(), dev);
  ops::copy(src, buf, st);
  return buf;
}

void allocate(const TensorList& list, Device dev, bool reset_unneeded) {
  list([&](Tensor& t, const Shape& shape, DType dt, bool needed) {
    if (needed)
      ensure(t, shape, dt, dev);
    else if (reset_unneeded)
      t = Tensor();
  });
}

int64_t predicted_bytes(const TensorList& list) {
  std::set<const Tensor*> seen;
  int64_t n = 0;
  list([&](Tensor& t, const Shape& shape, DType dt, bool needed) {
    if (needed && seen.insert(&t).second) n += shape_numel(shape) * int64_t(dtype_size(dt));
  });
  return n;
}

int64_t measured_bytes(const TensorList& list) {
  std::set<const void*> seen;
  int64_t n = 0;
  list([&](Tensor& t, const Shape&, DType, bool) {
    if (t.defined() && seen.insert(t.raw()).second) n += int64_t(t.nbytes());
  });
  return n;
}

Workspace::Workspace() = default;
Workspace::~Workspace() = default;

}  // namespace mcpp::model
