#include "checkpoint/hf.h"

#include <cmath>
#include <filesystem>
#include <set>

#include "base/log.h"
#include "checkpoint/checks.h"
#include "checkpoint/fs.h"
#include "checkpoint/hf_gpt_oss.h"
#include "checkpoint/hf_moe.h"
#include "checkpoint/hf_rope.h"
#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"
#include "ops/rope_interleave.h"

namespace mcpp::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// One HF tensor: rows `rows` (in HF order) of the Megatron tensor `mname`, transposed for
// GPT-2's Conv1D. rows empty: all rows in order. Every conversion is a row gather (+ transpose).
struct Entry {
  std::string mname, hname;
  std::vector<int64_t> rows;
  bool transpose = false;
  bool norm_weight = false;  // a norm's weight: + 1 on export under --apply-layernorm-1p
};

std::vector<int64_t> range(int64_t a, int64_t b) {
  std::vector<int64_t> r;
  for (int64_t i = a; i < b; ++i) r.push_back(i);
  return r;
}

// Dim d of a query or key head in HF's order: d itself, or under --rotary-interleaved the
// dim P puts there (ops/rope_interleave.h). transformers rotates halves; rotating halves of
// P q is interleaved RoPE on q, so the P-permuted q/k rows (and q/k norm weights) make a
// rotate-half model that computes what the interleaved one does.
int64_t hf_head_dim(const model::TransformerConfig& c, int64_t d) {
  if (!(c.rope && c.rotary_interleaved) || d >= c.rot_dim()) return d;
  return ops::rope_permute_source(d, c.rot_dim(), false);
}

// Rows of Megatron's grouped linear_qkv [NG, (r + 2) * HD] (r = NH/NG) holding the query
// heads in head order, the keys and the values (HF's q / k / v row order).
struct QkvRows {
  std::vector<int64_t> q, k, v;
};
QkvRows qkv_rows(const model::TransformerConfig& c) {
  const int64_t r = c.heads_per_group(), HD = c.kv_channels;
  QkvRows o;
  for (int64_t h = 0; h < c.num_attention_heads; ++h)
    for (int64_t d = 0; d < HD; ++d)
      o.q.push_back(((h / r) * (r + 2) + h % r) * HD + hf_head_dim(c, d));
  for (int64_t g = 0; g < c.num_query_groups; ++g)
    for (int64_t d = 0; d < HD; ++d) {
      o.k.push_back((g * (r + 2) + r) * HD + hf_head_dim(c, d));
      o.v.push_back((g * (r + 2) + r + 1) * HD + d);
    }
  return o;
}

std::vector<Entry> entries(const model::TransformerConfig& c) {
  const HfArch arch = hf_arch_of(c);
  const QkvRows qkv = qkv_rows(c);
  std::vector<Entry> e;
  auto L = [](int l, const std::string& s) { return model::layer_param_name(l, s); };
  if (arch == HfArch::Gpt2) {
    std::vector<int64_t> all = qkv.q;
    all.insert(all.end(), qkv.k.begin(), qkv.k.end());
    all.insert(all.end(), qkv.v.begin(), qkv.v.end());
    e.push_back({"embedding.word_embeddings.weight", "transformer.wte.weight", {}, false});
    e.push_back({"embedding.position_embeddings.weight", "transformer.wpe.weight", {}, false});
    for (int l = 0; l < c.num_layers; ++l) {
      const std::string h = "transformer.h." + std::to_string(l) + ".";
      e.push_back({L(l, "input_layernorm.weight"), h + "ln_1.weight", {}, false, true});
      e.push_back({L(l, "input_layernorm.bias"), h + "ln_1.bias", {}, false});
      e.push_back({L(l, "self_attention.linear_qkv.weight"), h + "attn.c_attn.weight", all, true});
      e.push_back({L(l, "self_attention.linear_qkv.bias"), h + "attn.c_attn.bias", all, false});
      e.push_back({L(l, "self_attention.linear_proj.weight"), h + "attn.c_proj.weight", {}, true});
      e.push_back({L(l, "self_attention.linear_proj.bias"), h + "attn.c_proj.bias", {}, false});
      e.push_back({L(l, "pre_mlp_layernorm.weight"), h + "ln_2.weight", {}, false, true});
      e.push_back({L(l, "pre_mlp_layernorm.bias"), h + "ln_2.bias", {}, false});
      e.push_back({L(l, "mlp.linear_fc1.weight"), h + "mlp.c_fc.weight", {}, true});
      e.push_back({L(l, "mlp.linear_fc1.bias"), h + "mlp.c_fc.bias", {}, false});
      e.push_back({L(l, "mlp.linear_fc2.weight"), h + "mlp.c_proj.weight", {}, true});
      e.push_back({L(l, "mlp.linear_fc2.bias"), h + "mlp.c_proj.bias", {}, false});
    }
    e.push_back({"decoder.final_layernorm.weight", "transformer.ln_f.weight", {}, false, true});
    e.push_back({"decoder.final_layernorm.bias", "transformer.ln_f.bias", {}, false});
    return e;  // lm_head is tied to wte and not stored, as HF saves GPT-2
  }
  const int64_t F = c.ffn_hidden_size;
  const bool bias = c.add_bias_linear;
  e.push_back({"embedding.word_embeddings.weight", "model.embed_tokens.weight", {}, false});
  for (int l = 0; l < c.num_layers; ++l) {
    const std::string h = "model.layers." + std::to_string(l) + ".";
    e.push_back({L(l, "input_layernorm.weight"), h + "input_layernorm.weight", {}, false, true});
    for (const std::string s : {"weight", "bias"}) {
      if (s == "bias" && !c.qkv_bias()) continue;
      e.push_back(
          {L(l, "self_attention.linear_qkv." + s), h + "self_attn.q_proj." + s, qkv.q, false});
      e.push_back(
          {L(l, "self_attention.linear_qkv." + s), h + "self_attn.k_proj." + s, qkv.k, false});
      e.push_back(
          {L(l, "self_attention.linear_qkv." + s), h + "self_attn.v_proj." + s, qkv.v, false});
      if (s == "bias" && !bias) continue;  // --add-qkv-bias (Qwen2): q/k/v_proj's biases alone
      e.push_back(
          {L(l, "self_attention.linear_proj." + s), h + "self_attn.o_proj." + s, {}, false});
      if (c.is_moe_layer(l)) continue;  // below
      e.push_back({L(l, "mlp.linear_fc1." + s), h + "mlp.gate_proj." + s, range(0, F), false});
      e.push_back({L(l, "mlp.linear_fc1." + s), h + "mlp.up_proj." + s, range(F, 2 * F), false});
      e.push_back({L(l, "mlp.linear_fc2." + s), h + "mlp.down_proj." + s, {}, false});
    }
    if (c.qk_layernorm) {  // Qwen3's per-head q/k RMSNorm weights [HD] (permuted as q, k)
      std::vector<int64_t> dims;
      for (int64_t d = 0; d < c.kv_channels; ++d) dims.push_back(hf_head_dim(c, d));
      for (const char* n : {"q", "k"})
        e.push_back({L(l, std::string("self_attention.") + n + "_layernorm.weight"),
                     h + "self_attn." + n + "_norm.weight", dims, false, true});
    }
    if (arch == HfArch::GptOss)  // sinks, biased router and experts (hf_gpt_oss.h)
      for (auto& m : hf_gpt_oss::layer_entries(c, l))
        e.push_back({m.mname, m.hname, std::move(m.rows), m.transpose});
    else if (c.is_moe_layer(l))  // Mixtral / Qwen3-MoE (hf_moe.h): router and experts
      for (const auto& m : hf_moe::moe_layer_entries(c, l))
        e.push_back(
            {m.mname, m.hname, m.row1 < 0 ? std::vector<int64_t>{} : range(m.row0, m.row1), false});
    e.push_back(
        {L(l, "pre_mlp_layernorm.weight"), h + "post_attention_layernorm.weight", {}, false, true});
  }
  e.push_back({"decoder.final_layernorm.weight", "model.norm.weight", {}, false, true});
  if (!c.tie_embeddings) e.push_back({"output_layer.weight", "lm_head.weight", {}, false});
  return e;
}

bool is_vocab_tensor(const std::string& mname) {
  return mname == "embedding.word_embeddings.weight" || mname == "output_layer.weight";
}

void check_tp1(const model::TransformerConfig& c, const model::ParamStore& ps) {
  MCPP_CHECK_HINT(ps.tp_size() == 1 && c.tp_size == 1,
                  "load the checkpoint into a TP=1 model first (loading reshards)",
                  "Hugging Face conversion needs the whole model (TP=1), got TP={}", ps.tp_size());
}

}  // namespace

std::map<std::string, Tensor> to_hf_tensors(const model::TransformerConfig& c,
                                            const model::ParamStore& ps, DType dtype) {
  check_tp1(c, ps);
  // The architectures written here (GPT-2, Llama, Mixtral, Qwen3-MoE) have no tensors for
  // multi-token prediction layers: an export never drops parameters silently.
  MCPP_CHECK_HINT(c.mtp_num_layers == 0,
                  "add --drop-mtp-layers to export the decoder without them (the MTP layers "
                  "are a training aid; generation does not read them)",
                  "this model has {} multi-token prediction layers (mtp.layers.*), which the "
                  "Hugging Face architectures megatron.cpp writes have no tensors for",
                  c.mtp_num_layers);
  std::map<std::string, Tensor> out;
  for (const Entry& e : entries(c)) {
    const Tensor src = ps.param(e.mname);
    const int64_t C = cols_of(src.shape());
    const std::vector<int64_t> rows = e.rows.empty() ? range(0, rows_of(src.shape())) : e.rows;
    const int64_t R = int64_t(rows.size());
    Shape shape = src.dim() == 1 ? Shape{R} : e.transpose ? Shape{C, R} : Shape{R, C};
    Tensor t = Tensor::empty(shape, dtype);
    // --apply-layernorm-1p stores a norm weight as w - 1; Hugging Face stores w.
    const double one = c.zero_centered_gamma && e.norm_weight ? 1.0 : 0.0;
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j)
        set_float(t, e.transpose ? j * R + i : i * C + j,
                  get_float(src, rows[size_t(i)] * C + j) + one);
    out[e.hname] = t;
  }
  if (hf_arch_of(c) == HfArch::GptOss) hf_gpt_oss::fuse_experts(c, out);
  return out;
}

void from_hf_tensors(const model::TransformerConfig& c, const std::map<std::string, Tensor>& in,
                     model::ParamStore& ps) {
  check_tp1(c, ps);
  // HF files may name GPT-2's tensors without the "transformer." prefix (GPT2Model) and carry
  // non-parameter buffers; both are accepted.
  // MoE: transformers 5's fused experts become the Hub's per-expert tensors first.
  // gpt-oss: its [E, ...] expert tensors become per-expert ones (hf_gpt_oss.h).
  const bool gpt_oss = c.moe.num_experts > 0 && hf_gpt_oss::looks_like_gpt_oss(c);
  const std::map<std::string, Tensor> unfused =
      gpt_oss                ? hf_gpt_oss::split_experts(c, in)
      : c.moe.num_experts > 0 ? hf_moe::unfuse_experts(c, in)
                              : std::map<std::string, Tensor>{};
  const std::map<std::string, Tensor>& tensors = c.moe.num_experts > 0 ? unfused : in;
  std::map<std::string, const Tensor*> hf;
  for (const auto& [n, t] : tensors) hf[n] = &t;
  auto find = [&](const std::string& n) -> const Tensor* {
    if (hf.count(n)) return hf[n];
    const std::string p = "transformer.";
    if (n.rfind(p, 0) == 0 && hf.count(n.substr(p.size()))) return hf[n.substr(p.size())];
    return nullptr;
  };
  std::set<std::string> used;
  std::map<std::string, int64_t> rows_filled;
  for (const Entry& e : entries(c)) {
    const Tensor* src = find(e.hname);
    MCPP_CHECK_HINT(src,
                    "the config.json does not describe these weights, or the file is "
                    "incomplete",
                    "Hugging Face tensor {} is missing", e.hname);
    used.insert(hf.count(e.hname) ? e.hname : e.hname.substr(std::string("transformer.").size()));
    Tensor dst = ps.param(e.mname);
    const int64_t C = cols_of(dst.shape());
    std::vector<int64_t> rows = e.rows.empty() ? range(0, rows_of(dst.shape())) : e.rows;
    // The vocabulary may hold fewer rows than our padded one: the rest stays zero.
    if (is_vocab_tensor(e.mname) && src->dim() == 2 && src->size(0) < rows_of(dst.shape())) {
      rows = range(0, src->size(0));
      std::memset(dst.raw(), 0, dst.nbytes());
    }
    const int64_t R = int64_t(rows.size());
    const Shape want = dst.dim() == 1 ? Shape{R} : e.transpose ? Shape{C, R} : Shape{R, C};
    MCPP_CHECK_HINT(src->shape() == want, "the config.json does not match the weights",
                    "Hugging Face tensor {} has shape {}, expected {} (for {})", e.hname,
                    shape_str(src->shape()), shape_str(want), e.mname);
    for (int64_t i = 0; i < R; ++i)
      for (int64_t j = 0; j < C; ++j)
        set_float(dst, rows[size_t(i)] * C + j,
                  get_float(*src, e.transpose ? j * R + i : i * C + j));
    rows_filled[e.mname] += R;
  }
  for (const auto& p : ps.infos()) {
    const bool vocab = is_vocab_tensor(p.name);
    MCPP_CHECK(rows_filled.count(p.name) && (vocab || rows_filled[p.name] == p.global_shape[0]),
               "internal: parameter {} not fully covered by the Hugging Face mapping", p.name);
  }
  std::vector<std::string> unknown;
  for (const auto& [n, t] : tensors) {
    if (used.count(n)) continue;
    const bool buffer = n.find("attn.bias") != std::string::npos ||
                        n.find("attn.masked_bias") != std::string::npos ||
                        n.find("rotary_emb.inv_freq") != std::string::npos;
    const bool tied_head = n == "lm_head.weight" && c.tie_embeddings;
    if (!buffer && !tied_head) unknown.push_back(n);
  }
  MCPP_CHECK_HINT(unknown.empty(), "check that config.json belongs to these weights",
                  "{} Hugging Face tensor(s) have no megatron.cpp parameter, e.g. {}",
                  unknown.size(), unknown.empty() ? "" : unknown.front());
}

void export_hf(const std::string& out_dir, const model::TransformerConfig& c,
               const model::ParamStore& ps, DType dtype, const std::string& model_type) {
  (void)hf_export_arch(c, model_type);  // a model_type that does not fit: before any file
  // config.json first too: a model it cannot describe (hf_rope.h) is refused before any file.
  const json config = hf_config(c, dtype, model_type);
  std::error_code ec;
  fs::create_directories(out_dir, ec);
  MCPP_CHECK(!ec, "cannot create {}: {}", out_dir, ec.message());
  auto tensors = to_hf_tensors(c, ps, dtype);
  // "format": "pt" is what transformers expects in a safetensors file's metadata.
  save_safetensors((fs::path(out_dir) / "model.safetensors").string(), tensors, {{"format", "pt"}});
  write_file_durable((fs::path(out_dir) / "config.json").string(), config.dump(2));
}

json read_hf_config(const std::string& hf_dir) {
  const fs::path p = fs::path(hf_dir) / "config.json";
  MCPP_CHECK_HINT(fs::exists(p), "pass a Hugging Face model folder", "{} has no config.json",
                  hf_dir);
  json j;
  try {
    j = json::parse(read_text_file(p.string(), size_t(16) << 20));
  } catch (const json::exception& e) {
    MCPP_FAIL("{} is not valid JSON: {}", p.string(), e.what());
  }
  MCPP_CHECK(j.is_object(), "{} is not a JSON object", p.string());
  return j;
}

namespace {

// A weight_map entry names a file of the model folder itself: a plain relative name, no
// "..", not absolute, and (after symlinks) inside the folder. An index from the internet
// must not make the importer read /etc/shadow or another user's files.
std::string weight_file_in(const fs::path& dir, const json& entry, const std::string& index) {
  MCPP_CHECK(entry.is_string(), "{}: weight_map value {} is not a file name", index, entry.dump());
  const std::string name = entry.get<std::string>();
  const fs::path rel(name);
  bool up = false;
  for (const auto& part : rel) up |= part == "..";
  MCPP_CHECK_HINT(!name.empty() && rel.is_relative() && !up,
                  "a model folder's index names files inside the folder only",
                  "{}: weight_map names '{}', outside the model folder", index, name);
  std::error_code ec;
  const fs::path base = fs::weakly_canonical(dir, ec), full = fs::weakly_canonical(dir / rel, ec);
  const std::string b = base.string() + "/";
  MCPP_CHECK_HINT(full.string().rfind(b, 0) == 0,
                  "a model folder's index names files inside the folder only",
                  "{}: weight_map names '{}', which resolves to {} outside the model folder", index,
                  name, full.string());
  return name;
}

}  // namespace

std::vector<std::string> hf_weight_files(const std::string& hf_dir) {
  const fs::path dir(hf_dir);
  std::vector<std::string> files;
  if (fs::exists(dir / "model.safetensors.index.json")) {
    const std::string index = (dir / "model.safetensors.index.json").string();
    json idx;
    try {
      idx = json::parse(read_text_file(index, size_t(64) << 20));
    } catch (const json::exception& e) {
      MCPP_FAIL("{} is not valid JSON: {}", index, e.what());
    }
    MCPP_CHECK(idx.is_object() && idx.contains("weight_map") && idx["weight_map"].is_object(),
               "{} has no 'weight_map' object", index);
    std::set<std::string> s;
    for (auto& [k, v] : idx["weight_map"].items()) s.insert(weight_file_in(dir, v, index));
    files.assign(s.begin(), s.end());
  } else if (fs::exists(dir / "model.safetensors")) {
    files.push_back("model.safetensors");
  } else {
    MCPP_CHECK_HINT(false,
                    "megatron.cpp reads safetensors only (pickle files can execute code); "
                    "convert pytorch_model.bin with safetensors' convert script first",
                    "{} has no model.safetensors", hf_dir);
  }
  return files;
}

void check_hf_fits_files(const std::string& hf_dir, const model::TransformerConfig& c) {
  // A lower bound of the parameter count (embedding and the layers' four weight matrices) at
  // one byte each, in floating point so that no product overflows.
  const double H = double(c.hidden_size), F = double(c.ffn_hidden_size);
  const double qkv = double(c.num_attention_heads + 2 * c.num_query_groups) * double(c.kv_channels);
  // MoE layers: E experts of width I each (a config.json with 2^20 experts is refused here too).
  const double L = double(c.num_layers);
  double moe_layers = c.moe.num_experts > 0 && c.moe.layer_pattern.empty() ? L : 0;
  for (int64_t x : c.moe.layer_pattern) moe_layers += double(x);
  const double params =
      double(c.padded_vocab_size) * H + L * (qkv * H + H * H) +
      moe_layers * double(c.moe.num_experts) * 2 * double(c.moe.ffn_hidden_size) * H +
      (L - moe_layers) * 2 * F * H;
  double have = 0;
  for (const auto& f : hf_weight_files(hf_dir)) {
    std::error_code ec;
    const auto n = fs::file_size(fs::path(hf_dir) / f, ec);
    MCPP_CHECK(!ec, "{}: cannot read the size of {}: {}", hf_dir, f, ec.message());
    have += double(n);
  }
  MCPP_CHECK_HINT(params <= have, "check that config.json belongs to these weights",
                  "{}/config.json describes a model of at least {:.3g} parameters, but its "
                  "weight files hold only {:.3g} bytes",
                  hf_dir, params, have);
}

void import_hf(const std::string& hf_dir, const model::TransformerConfig& c,
               model::ParamStore& ps) {
  const fs::path dir(hf_dir);
  const std::vector<std::string> files = hf_weight_files(hf_dir);
  std::map<std::string, Tensor> tensors;
  for (const auto& f : files) {
    auto st = load_safetensors((dir / f).string());
    for (auto& [n, t] : st.tensors) tensors[n] = t;
  }
  from_hf_tensors(c, tensors, ps);
}

}  // namespace mcpp::checkpoint
