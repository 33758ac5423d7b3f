// Saving checkpoints, the pieces of a rank's tensors and the state/config JSON (checkpoint.h has
// the API, docs/checkpoint.md the format); find.cpp finds and describes them, load.cpp
// validates and loads them.
#include "checkpoint/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include "base/log.h"
#include "base/version.h"
#include "checkpoint/checks.h"
#include "checkpoint/fs.h"
#include "checkpoint/fully_parallel.h"
#include "checkpoint/moe_metadata.h"
#include "checkpoint/retention.h"
#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"
#include "ops/ops.h"

namespace mcpp::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;
using model::ParamInfo;
using model::TpSplit;

namespace {

const char* split_name(TpSplit s) {
  switch (s) {
    case TpSplit::None:
      return "none";
    case TpSplit::Rows:
      return "rows";
    case TpSplit::Cols:
      return "cols";
    case TpSplit::SwigluRows:
      return "swiglu_rows";
  }
  return "?";
}

int64_t rows_of(const Shape& s) { return s.empty() ? 1 : s[0]; }
int64_t cols_of(const Shape& s) { return s.size() > 1 ? shape_numel(s) / s[0] : 1; }

json piece_json(const Piece& p, size_t ndim) {
  if (ndim <= 1) return {{"offsets", {p.g_row}}, {"shape", {p.rows}}, {"local_offsets", {p.l_row}}};
  return {{"offsets", {p.g_row, p.g_col}},
          {"shape", {p.rows, p.cols}},
          {"local_offsets", {p.l_row, p.l_col}}};
}

std::string file_name(const char* kind, const RankCoord& c, bool with_dp) {
  // EP rank > 0 (expert parallelism) writes its experts into files of its own.
  const std::string ep = c.ep > 0 ? fmt::format("_ep{:02d}", c.ep) : std::string();
  return with_dp ? fmt::format("{}_tp{:02d}_pp{:02d}_dp{:02d}{}.safetensors", kind, c.tp, c.pp, c.dp, ep)
                 : fmt::format("{}_tp{:02d}_pp{:02d}{}.safetensors", kind, c.tp, c.pp, ep);
}

std::string join_path(const std::string& a, const std::string& b) {
  return (fs::path(a) / b).string();
}

}  // namespace

// ---- pieces and snapshots -------------------------------------------------------------------

namespace {

// The boxes of a tensor split as `split` (global and local shapes) held by TP rank tp_rank.
std::vector<Piece> pieces_of(TpSplit split, const Shape& global_shape, const Shape& local_shape,
                             int64_t tp_rank) {
  const int64_t R = rows_of(local_shape), C = cols_of(local_shape);
  switch (split) {
    case TpSplit::None:
      return {{0, 0, R, C, 0, 0}};
    case TpSplit::Rows:
      return {{tp_rank * R, 0, R, C, 0, 0}};
    case TpSplit::Cols:
      return {{0, tp_rank * C, R, C, 0, 0}};
    case TpSplit::SwigluRows: {
      // Local [gate_r; up_r]; global [gate; up] with F = global rows / 2.
      const int64_t half = R / 2, F = rows_of(global_shape) / 2;
      return {{tp_rank * half, 0, half, C, 0, 0}, {F + tp_rank * half, 0, half, C, half, 0}};
    }
  }
  return {};
}

}  // namespace

std::vector<Piece> local_pieces(const ParamInfo& p, int64_t tp_rank, int64_t tp_size) {
  (void)tp_size;  // experts under ETP != TP: their ETP rank
  return pieces_of(p.split, p.global_shape, p.local_shape, p.shard_rank(tp_rank));
}

std::vector<Piece> local_pieces(const model::BufferInfo& b, int64_t tp_rank, int64_t tp_size) {
  (void)tp_size;
  return pieces_of(b.split, b.global_shape, b.local_shape, tp_rank);
}

// The tensor itself on the host; a host copy of a device tensor.
static Tensor on_host(const Tensor& t) {
  if (t.device() == Device::CPU) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  ops::copy(t, h, ops::default_stream(t.device()));
  return h;
}

RankSnapshot RankSnapshot::view(const model::ParamStore& params, const optim::AdamW* opt,
                                RankCoord coord, bool moments) {
  RankSnapshot s;
  coord.tp = params.tp_rank();
  s.coord = coord;
  s.tp_size = params.tp_size();
  s.infos = params.infos();
  const bool main = opt && opt->main_params().defined();
  s.params = on_host(main ? opt->main_params() : const_cast<model::ParamStore&>(params).flat_params());
  if (opt && moments) {
    s.exp_avg = on_host(opt->exp_avg()), s.exp_avg_sq = on_host(opt->exp_avg_sq());
    s.optimizer_steps = opt->steps();
  }
  s.buffer_infos = params.buffer_infos();
  for (size_t i = 0; i < s.buffer_infos.size(); ++i) s.buffers.push_back(on_host(params.buffer(i)));
  return s;
}

RankSnapshot RankSnapshot::clone() const {
  RankSnapshot s = *this;
  s.params = params.clone();
  if (exp_avg.defined()) s.exp_avg = exp_avg.clone(), s.exp_avg_sq = exp_avg_sq.clone();
  for (Tensor& b : s.buffers) b = b.clone();
  return s;
}

// ---- config and state JSON -----------------------------------------------------------------

// Multi-latent attention's shape and RoPE (Megatron's argument names).
static json mla_config_json(const model::TransformerConfig::Mla& m) {
  return {{"q_lora_rank", m.q_lora_rank},
          {"kv_lora_rank", m.kv_lora_rank},
          {"qk_head_dim", m.qk_head_dim},
          {"qk_pos_emb_head_dim", m.qk_pos_emb_head_dim},
          {"v_head_dim", m.v_head_dim},
          {"rope_type", m.yarn ? "yarn" : "rope"},
          {"rotary_scaling_factor", m.rotary_scaling_factor},
          {"mscale", m.mscale},
          {"mscale_all_dim", m.mscale_all_dim},
          {"original_max_position_embeddings", m.original_max_positions},
          {"beta_fast", m.beta_fast},
          {"beta_slow", m.beta_slow}};
}

static model::TransformerConfig::Mla mla_config_from_json(const json& j) {
  model::TransformerConfig::Mla m;
  m.on = true, m.q_lora_rank = j.at("q_lora_rank"), m.kv_lora_rank = j.at("kv_lora_rank");
  m.qk_head_dim = j.at("qk_head_dim"), m.qk_pos_emb_head_dim = j.at("qk_pos_emb_head_dim");
  m.v_head_dim = j.at("v_head_dim"), m.yarn = j.at("rope_type") == "yarn";
  m.rotary_scaling_factor = j.at("rotary_scaling_factor");
  m.mscale = j.at("mscale"), m.mscale_all_dim = j.at("mscale_all_dim");
  m.original_max_positions = j.at("original_max_position_embeddings");
  m.beta_fast = j.at("beta_fast"), m.beta_slow = j.at("beta_slow");
  return m;
}

json model_config_json(const model::TransformerConfig& c) {
  json j = {{"num_layers", c.num_layers},
          {"hidden_size", c.hidden_size},
          {"ffn_hidden_size", c.ffn_hidden_size},
          {"num_attention_heads", c.num_attention_heads},
          {"num_query_groups", c.num_query_groups},
          {"kv_channels", c.kv_channels},
          {"seq_length", c.seq_length},
          {"max_position_embeddings", c.max_position_embeddings},
          {"padded_vocab_size", c.padded_vocab_size},
          {"rope", c.rope},
          {"rotary_base", c.rotary_base},
          {"rotary_percent", c.rotary_percent},
          {"rmsnorm", c.rmsnorm},
          {"norm_epsilon", c.norm_epsilon},
          {"zero_centered_gamma", c.zero_centered_gamma},
          {"swiglu", c.swiglu},
          {"tie_embeddings", c.tie_embeddings},
          {"add_bias_linear", c.add_bias_linear},
          {"hidden_dropout", c.hidden_dropout},
          {"attention_dropout", c.attention_dropout},
          {"init_method_std", c.init_method_std},
          {"seed", c.seed},
          {"dtype", std::string(dtype_name(c.dtype))},
          {"tp_size", c.tp_size}};
  if (c.moe.num_experts > 0) j["moe"] = moe_config_json(c.moe);  // mixture of experts
  if (c.qk_layernorm) j["qk_layernorm"] = true;  // --qk-layernorm (absent: off)
  if (c.squared_relu) j["squared_relu"] = true;  // --squared-relu (absent: off)
  // --add-qkv-bias where it adds a tensor (without --disable-bias-linear it is implied).
  if (c.qkv_bias() && !c.add_bias_linear) j["add_qkv_bias"] = true;
  if (c.rope_scaling)  // Llama 3.x RoPE scaling (absent: off), in Hugging Face's names
    j["rope_scaling"] = {{"factor", c.rope_scaling_factor},
                         {"low_freq_factor", c.rope_low_freq_factor},
                         {"high_freq_factor", c.rope_high_freq_factor},
                         {"original_max_position_embeddings", c.rope_original_max_positions}};
  if (c.seq_len_interpolation_factor != 1.0)  // RoPE position interpolation (absent: 1, off)
    j["rotary_seq_len_interpolation_factor"] = c.seq_len_interpolation_factor;
  if (c.rotary_interleaved) j["rotary_interleaved"] = true;  // --rotary-interleaved (absent: off)
  if (c.mla.on) j["mla"] = mla_config_json(c.mla);  // multi-latent attention (absent: off)
  return j;
}

model::TransformerConfig model_config_from_metadata(const json& md) {
  MCPP_CHECK_HINT(md.contains("model"),
                  "pass the model shape flags (--num-layers, --hidden-size, ...) instead",
                  "the checkpoint records no model config");
  const std::string iter_dir = md.value("__iter_dir", std::string("."));
  const json& j = md.at("model");
  model::TransformerConfig c;
  try {
  c.num_layers = j.at("num_layers"), c.hidden_size = j.at("hidden_size");
  c.ffn_hidden_size = j.at("ffn_hidden_size");
  c.num_attention_heads = j.at("num_attention_heads");
  c.num_query_groups = j.at("num_query_groups"), c.kv_channels = j.at("kv_channels");
  c.seq_length = j.at("seq_length"), c.max_position_embeddings = j.at("max_position_embeddings");
  c.padded_vocab_size = j.at("padded_vocab_size");
  c.rope = j.at("rope"), c.rotary_base = j.at("rotary_base");
  c.rotary_percent = j.at("rotary_percent"), c.rmsnorm = j.at("rmsnorm");
  c.norm_epsilon = j.at("norm_epsilon"), c.swiglu = j.at("swiglu");
  c.zero_centered_gamma = j.value("zero_centered_gamma", false);  // absent before 1p existed
  c.tie_embeddings = j.at("tie_embeddings"), c.add_bias_linear = j.at("add_bias_linear");
  c.hidden_dropout = j.at("hidden_dropout"), c.attention_dropout = j.at("attention_dropout");
  c.init_method_std = j.at("init_method_std"), c.seed = j.at("seed");
  c.dtype = dtype_from_name(j.at("dtype").get<std::string>());
  if (j.contains("moe")) c.moe = moe_config_from_json(j.at("moe"));  // mixture of experts
  c.qk_layernorm = j.value("qk_layernorm", false);                    // --qk-layernorm
  c.squared_relu = j.value("squared_relu", false);                    // --squared-relu
  c.add_qkv_bias = j.value("add_qkv_bias", false);                    // --add-qkv-bias
  if (j.contains("rope_scaling")) {  // Llama 3.x RoPE scaling (absent: off)
    const json& r = j.at("rope_scaling");
    c.rope_scaling = true, c.rope_scaling_factor = r.at("factor");
    c.rope_low_freq_factor = r.at("low_freq_factor");
    c.rope_high_freq_factor = r.at("high_freq_factor");
    c.rope_original_max_positions = r.at("original_max_position_embeddings");
  }
  c.seq_len_interpolation_factor = j.value("rotary_seq_len_interpolation_factor", 1.0);
  c.rotary_interleaved = j.value("rotary_interleaved", false);      // --rotary-interleaved
  if (j.contains("mla")) c.mla = mla_config_from_json(j.at("mla"));  // multi-latent attention
  } catch (const json::exception& e) {
    MCPP_FAIL("{}/{}: malformed 'model' field: {}", iter_dir, kMetadataFile, e.what());
  }
  c.tp_size = 1, c.tp_rank = 0;  // the loader chooses its own layout
  // Ranges, and agreement with the tensors and files, before anyone allocates this model.
  try {
    check_model_config(c, md, iter_dir);
  } catch (const json::exception& e) {
    MCPP_FAIL("{}/{}: malformed 'tensors' or 'files' field: {}", iter_dir, kMetadataFile,
              e.what());
  }
  return c;
}

void check_model_compat(const json& saved, const model::TransformerConfig& cur,
                        const std::string& where, bool vocab_repad, bool key_set_may_differ) {
  const json now = model_config_json(cur);
  std::string diffs, keyset;  // shape / meaning differences; key-set-only differences
  const bool rope = cur.rope;
  auto differ = [&](const std::string& k, const json& a, const json& b) {
    const bool keys_only = k == "num_layers" || k == "tie_embeddings" || k == "add_bias_linear" ||
                           k == "add_qkv_bias" || k == "qk_layernorm" || k == "moe.expert_bias" ||
                           k == "moe.shared_expert_gate";
    (keys_only ? keyset : diffs) +=
        fmt::format("\n  {}: checkpoint {} vs this run {}", k, a.dump(), b.dump());
  };
  for (const char* k : {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                        "num_query_groups", "kv_channels", "padded_vocab_size", "rope", "rmsnorm",
                        "swiglu", "tie_embeddings", "add_bias_linear", "max_position_embeddings"}) {
    if (std::string(k) == "max_position_embeddings" && rope) continue;
    if (std::string(k) == "padded_vocab_size" && vocab_repad) continue;
    if (!saved.contains(k) || saved[k] != now[k])
      differ(k, saved.contains(k) ? saved[k] : json("(absent)"), now[k]);
  }
  // --squared-relu: the same tensors as GELU's MLP, another function of them.
  if (saved.value("squared_relu", false) != cur.squared_relu)
    differ("squared_relu (--squared-relu)", saved.value("squared_relu", false), cur.squared_relu);
  {  // multi-latent attention: its shape and RoPE (absent: off)
    const json off = json(nullptr), &a = saved.contains("mla") ? saved["mla"] : off;
    const json b = now.contains("mla") ? now["mla"] : off;
    if (a != b) differ("mla (--multi-latent-attention and its flags)", a, b);
  }
  // --rotary-interleaved: the same tensors, RoPE on other pairs of their dims.
  if (saved.value("rotary_interleaved", false) != cur.rotary_interleaved)
    differ("rotary_interleaved (--rotary-interleaved)", saved.value("rotary_interleaved", false),
           cur.rotary_interleaved);
  if (saved.value("qk_layernorm", false) != cur.qk_layernorm)  // --qk-layernorm
    differ("qk_layernorm", saved.value("qk_layernorm", false), cur.qk_layernorm);
  if (saved.value("add_qkv_bias", false) != now.value("add_qkv_bias", false))  // --add-qkv-bias
    differ("add_qkv_bias", saved.value("add_qkv_bias", false), now.value("add_qkv_bias", false));
  // --apply-layernorm-1p changes what the stored norm weights mean (absent: false).
  if (saved.value("zero_centered_gamma", false) != cur.zero_centered_gamma)
    differ("zero_centered_gamma (--apply-layernorm-1p)", saved.value("zero_centered_gamma", false),
           cur.zero_centered_gamma);
  {  // mixture of experts: the parameter shapes (routing settings may change on resume)
    const json none = json::object(), &a = saved.contains("moe") ? saved["moe"] : none,
               &b = now.contains("moe") ? now["moe"] : none;
    for (const char* k : {"num_experts", "layer_pattern", "ffn_hidden_size",
                          "shared_ffn_hidden_size", "shared_expert_gate", "expert_bias"})
      if (a.value(k, json()) != b.value(k, json()))
        differ(std::string("moe.") + k, a.value(k, json()), b.value(k, json()));
  }
  if (key_set_may_differ && !keyset.empty())
    log::warn("{} was written for a model with other keys (loaded key by key, "
              "--dist-ckpt-strictness):{}",
              where, keyset);
  else
    diffs += keyset;
  MCPP_CHECK_HINT(diffs.empty(),
                  "pass the model flags the checkpoint was trained with (megatron inspect shows "
                  "them); padded_vocab_size follows --make-vocab-size-divisible-by and TP" +
                      std::string(keyset.empty() || key_set_may_differ
                                      ? ""
                                      : "; or, to load around parameters on one side only, "
                                        "--dist-ckpt-strictness log_all"),
                  "{} was written for a different model:{}", where, diffs);
  for (const char* k : {"rotary_base", "rotary_percent", "norm_epsilon"})
    if (saved.contains(k) && saved[k] != now[k])
      log::warn("{}: {} differs (checkpoint {}, this run {})", where, k, saved[k].dump(),
                now[k].dump());
  // RoPE scaling as the base: a warning (extending a model's context is a reason to change
  // it between runs).
  auto scaling = [](const json& m) {
    return m.contains("rope_scaling") ? m["rope_scaling"].dump() : std::string("off");
  };
  if (scaling(saved) != scaling(now))
    log::warn("{}: rope_scaling differs (checkpoint {}, this run {})", where, scaling(saved),
              scaling(now));
  // Position interpolation likewise: stretching a checkpoint's context is what it is for.
  const json ia = saved.value("rotary_seq_len_interpolation_factor", json(1.0));
  const json ib = now.value("rotary_seq_len_interpolation_factor", json(1.0));
  if (ia != ib)
    log::warn("{}: rotary_seq_len_interpolation_factor differs (checkpoint {}, this run {})", where,
              ia.dump(), ib.dump());
}

json state_to_json(const TrainingState& st) {
  const auto& s = st.scheduler;
  return {{"iteration", st.iteration},
          {"consumed_train_samples", st.consumed_train_samples},
          {"consumed_valid_samples", st.consumed_valid_samples},
          {"opt_param_scheduler",
           {{"max_lr", s.max_lr},
            {"min_lr", s.min_lr},
            {"lr_warmup_steps", s.lr_warmup_steps},
            {"lr_decay_steps", s.lr_decay_steps},
            {"lr_decay_style", optim::to_string(s.lr_decay_style)},
            {"start_wd", s.start_wd},
            {"end_wd", s.end_wd},
            {"wd_incr_steps", s.wd_incr_steps},
            {"wd_incr_style", optim::to_string(s.wd_incr_style)},
            {"num_steps", s.num_steps}}},
          {"optimizer_steps", st.optimizer_steps},
          {"rng", {{"seed", st.rng_seed}, {"iteration", st.rng_iteration}}},
          {"num_floating_point_operations_so_far", st.num_floating_point_operations_so_far},
          {"data_loader", st.data_loader},
          {"grad_scaler", st.grad_scaler},
          {"config", st.config},
          {"mcpp_version", st.mcpp_version}};
}

TrainingState state_from_json(const json& j) {
  TrainingState st;
  st.iteration = j.at("iteration");
  st.consumed_train_samples = j.at("consumed_train_samples");
  st.consumed_valid_samples = j.at("consumed_valid_samples");
  const json& s = j.at("opt_param_scheduler");
  st.scheduler.max_lr = s.at("max_lr"), st.scheduler.min_lr = s.at("min_lr");
  st.scheduler.lr_warmup_steps = s.at("lr_warmup_steps");
  st.scheduler.lr_decay_steps = s.at("lr_decay_steps");
  st.scheduler.lr_decay_style = optim::parse_lr_decay_style(s.at("lr_decay_style"));
  st.scheduler.start_wd = s.at("start_wd"), st.scheduler.end_wd = s.at("end_wd");
  st.scheduler.wd_incr_steps = s.at("wd_incr_steps");
  st.scheduler.wd_incr_style = optim::parse_wd_incr_style(s.at("wd_incr_style"));
  st.scheduler.num_steps = s.at("num_steps");
  st.optimizer_steps = j.at("optimizer_steps");
  st.rng_seed = j.at("rng").at("seed"), st.rng_iteration = j.at("rng").at("iteration");
  st.num_floating_point_operations_so_far = j.value("num_floating_point_operations_so_far", 0.0);
  st.data_loader = j.value("data_loader", json::object());
  st.grad_scaler = j.value("grad_scaler", json::object());
  st.config = j.value("config", json::object());
  st.mcpp_version = j.value("mcpp_version", "");
  return st;
}

// ---- saving ------------------------------------------------------------------------------------

std::string iteration_dir_name(int64_t iteration) { return fmt::format("iter_{:07d}", iteration); }

std::string begin_checkpoint(const std::string& save_dir, int64_t iteration,
                             const SaveOptions& opts) {
  MCPP_CHECK_HINT(iteration >= 0, "", "checkpoint iteration {} is negative", iteration);
  std::error_code ec;
  fs::create_directories(save_dir, ec);
  MCPP_CHECK_HINT(!ec, "check --save", "cannot create the checkpoint directory {}: {}", save_dir,
                  ec.message());
  if (opts.cleanup_stale) {
    // Left over by a save (or a retention deletion) that was killed: never visible to
    // loaders, so safe to remove.
    static const std::regex stale(R"(.*\.(tmp|old|del)-\d+$)");
    for (const auto& e : fs::directory_iterator(save_dir)) {
      const std::string n = e.path().filename().string();
      if (std::regex_match(n, stale)) {
        log::warn("removing {} left behind by an interrupted checkpoint save", e.path().string());
        fs::remove_all(e.path(), ec);
      }
    }
  }
  const std::string tmp =
      join_path(save_dir, iteration_dir_name(iteration) + ".tmp-" + std::to_string(::getpid()));
  fs::remove_all(tmp, ec);
  fs::create_directory(tmp, ec);
  MCPP_CHECK_HINT(!ec, "check --save and free disk space", "cannot create {}: {}", tmp,
                  ec.message());
  return tmp;
}

json write_rank_files(const std::string& tmp_dir, const RankSnapshot& rank) {
  json rec = {{"files", json::object()}, {"tensors", json::object()}};
  if (!rank.write_model) return rec;
  const std::set<std::string> others = written_by_others(rank);
  // Fully parallel: this rank's share goes into files named by its DP (x CP) rank.
  const bool shared = rank.dense_share.count > 1 || rank.expert_share.count > 1;
  // Adds every parameter's local tensor of `flat` (prefixed key) to one file's tensor map.
  auto add = [&](std::map<std::string, Tensor>& out, const std::string& fname,
                 const std::string& prefix, const Tensor& flat) {
    for (const ParamInfo& p : rank.infos) {
      // A TP-duplicated tensor is written once, by TP rank 0; the tied embedding's copy on
      // the last pipeline stage not at all (the first stage writes it).
      if ((p.split == TpSplit::None && rank.coord.tp != 0) || p.pipeline_duplicate) continue;
      if (!(p.expert >= 0 ? rank.write_experts : rank.write_dense)) continue;  // EP writers
      const std::string key = prefix + p.name;
      if (others.count(key)) continue;  // another replica's share
      Tensor t = flat.narrow(p.offset, p.numel()).view(p.local_shape);
      json pieces = json::array();
      for (const Piece& pc : local_pieces(p, rank.coord.tp, rank.tp_size))
        pieces.push_back(piece_json(pc, p.global_shape.size()));
      rec["tensors"][key] = {{"global_shape", p.global_shape},
                             {"dtype", safetensors_dtype(t.dtype())},
                             {"split", split_name(p.split)},
                             {"shard",
                              {{"file", fname},
                               {"name", key},
                               {"shape", p.local_shape},
                               {"tp_rank", rank.coord.tp},
                               {"tp_size", rank.tp_size},
                               {"checksum", checksum_hex(t.raw(), t.nbytes())},
                               {"pieces", pieces}}}};
      out[key] = t;
    }
  };
  auto write = [&](const std::string& fname, const std::map<std::string, Tensor>& tensors) {
    if (shared && tensors.empty()) return;  // the other replicas write all of it
    const std::string path = join_path(tmp_dir, fname);
    save_safetensors(path, tensors, {{"format", "megatron.cpp checkpoint shard"}});
    rec["files"][fname] = {{"bytes", fs::file_size(path)}};
  };
  {
    const std::string f = file_name("model", rank.coord, shared);
    std::map<std::string, Tensor> tensors;
    add(tensors, f, "", rank.params);
    // The persistent buffers, under their own names, by the parameters' rule: a duplicated
    // one by TP rank 0 (an expert's: ETP rank 0 of its holders), a split one by every TP rank (its box of the global tensor). Marked
    // "buffer" so that a loader that does not register one skips it instead of failing.
    MCPP_CHECK(rank.buffers.size() == rank.buffer_infos.size(),
               "RankSnapshot holds {} buffers for {} buffer entries", rank.buffers.size(),
               rank.buffer_infos.size());
    for (size_t i = 0; i < rank.buffer_infos.size(); ++i) {
      const model::BufferInfo& b = rank.buffer_infos[i];
      const int dup_rank = b.expert >= 0 ? rank.expert_tp_rank : int(rank.coord.tp);
      if (b.split == TpSplit::None && dup_rank != 0) continue;
      if (!(b.expert >= 0 ? rank.write_experts : rank.write_dense)) continue;  // EP writers
      if (others.count(b.name)) continue;  // another replica's share
      // The format stores 1-D and 2-D tensors (a scalar is a [1] buffer).
      MCPP_CHECK(!b.global_shape.empty(), "buffer {} is 0-dimensional; register it as shape [1]",
                 b.name);
      const Tensor& t = rank.buffers[i];
      MCPP_CHECK(t.device() == Device::CPU && t.shape() == b.local_shape && t.dtype() == b.dtype,
                 "buffer {}: the snapshot holds {}, expected a host tensor {} {}", b.name,
                 t.str(), shape_str(b.local_shape), dtype_name(b.dtype));
      MCPP_CHECK(!tensors.count(b.name), "buffer {} has the name of a parameter", b.name);
      json pieces = json::array();
      for (const Piece& pc : local_pieces(b, rank.coord.tp, rank.tp_size))
        pieces.push_back(piece_json(pc, b.global_shape.size()));
      rec["tensors"][b.name] = {{"global_shape", b.global_shape},
                                {"dtype", safetensors_dtype(t.dtype())},
                                {"split", split_name(b.split)},
                                {"buffer", true},
                                {"shard",
                                 {{"file", f},
                                  {"name", b.name},
                                  {"shape", b.local_shape},
                                  {"tp_rank", rank.coord.tp},
                                  {"tp_size", rank.tp_size},
                                  {"checksum", checksum_hex(t.raw(), t.nbytes())},
                                  {"pieces", pieces}}}};
      tensors[b.name] = t;
    }
    write(f, tensors);
  }
  if (rank.exp_avg.defined()) {
    // Both Adam moments in one file: optimizer.exp_avg.<name>, optimizer.exp_avg_sq.<name>.
    const std::string f = file_name("optim", rank.coord, true);
    std::map<std::string, Tensor> tensors;
    add(tensors, f, "optimizer.exp_avg.", rank.exp_avg);
    add(tensors, f, "optimizer.exp_avg_sq.", rank.exp_avg_sq);
    write(f, tensors);
    rec["optimizer_steps"] = rank.optimizer_steps;
  }
  return rec;
}

json write_optimizer_shard(const std::string& tmp_dir, const RankSnapshot& rank,
                           const Tensor& exp_avg_in, const Tensor& exp_avg_sq_in,
                           std::span<const ShardSegment> segments) {
  const Tensor exp_avg = on_host(exp_avg_in), exp_avg_sq = on_host(exp_avg_sq_in);
  json rec = {{"files", json::object()}, {"tensors", json::object()}};
  const std::string fname = file_name("optim", rank.coord, true);
  std::map<std::string, Tensor> out;
  int box_no = 0;
  for (const ShardSegment& sg : segments) {
    const ParamInfo& p = rank.infos.at(sg.param);
    if ((p.split == TpSplit::None && rank.coord.tp != 0) || p.pipeline_duplicate) continue;
    const int64_t C = cols_of(p.local_shape);
    const auto mine = local_pieces(p, rank.coord.tp, rank.tp_size);
    // The segment [a, a + len) of the local tensor, row-major, as rectangular boxes: a
    // partial first row, whole rows, a partial last row. Each is contiguous in the shard.
    int64_t a = sg.flat - p.offset, left = sg.len, at = sg.shard;
    MCPP_CHECK(a >= 0 && a + left <= p.numel(), "optimizer shard segment outside {}", p.name);
    while (left > 0) {
      const int64_t r = a / C, c = a % C;
      const int64_t rows = c == 0 && left >= C ? left / C : 1;
      const int64_t cols = rows > 1 || (c == 0 && left >= C) ? C : std::min(C - c, left);
      // Cut the box at the local pieces (SwiGLU's [gate_r; up_r] halves map apart).
      for (const Piece& d : mine) {
        const int64_t r0 = std::max(r, d.l_row), r1 = std::min(r + rows, d.l_row + d.rows);
        const int64_t c0 = std::max(c, d.l_col), c1 = std::min(c + cols, d.l_col + d.cols);
        if (r0 >= r1 || c0 >= c1) continue;
        const int64_t off = at + (r0 - r) * cols + (c0 - c), n = (r1 - r0) * (c1 - c0);
        const Piece g{d.g_row + r0 - d.l_row, d.g_col + c0 - d.l_col, r1 - r0, c1 - c0, 0, 0};
        const bool one_d = p.global_shape.size() <= 1;
        const Shape shape = one_d ? Shape{n} : Shape{r1 - r0, c1 - c0};
        for (auto [prefix, src] : {std::pair<const char*, const Tensor*>{"optimizer.exp_avg.", &exp_avg},
                                   std::pair<const char*, const Tensor*>{"optimizer.exp_avg_sq.", &exp_avg_sq}}) {
          const std::string key = prefix + p.name;
          const std::string name = fmt::format("{}@dp{}.{}", key, rank.coord.dp, box_no);
          Tensor t = src->narrow(off, n).view(shape);
          json& entry = rec["tensors"][key];
          if (entry.is_null())
            entry = {{"global_shape", p.global_shape},
                     {"dtype", safetensors_dtype(t.dtype())},
                     {"split", split_name(p.split)},
                     {"shards", json::array()}};
          entry["shards"].push_back({{"file", fname},
                                     {"name", name},
                                     {"shape", shape},
                                     {"tp_rank", rank.coord.tp},
                                     {"tp_size", rank.tp_size},
                                     {"dp_rank", rank.coord.dp},
                                     {"checksum", checksum_hex(t.raw(), t.nbytes())},
                                     {"pieces", json::array({piece_json(g, p.global_shape.size())})}});
          out[name] = t;
        }
        ++box_no;
      }
      const int64_t used = rows * cols;
      a += used, left -= used, at += used;
    }
  }
  const std::string path = join_path(tmp_dir, fname);
  save_safetensors(path, out, {{"format", "megatron.cpp distributed-optimizer shard"}});
  rec["files"][fname] = {{"bytes", fs::file_size(path)}};
  rec["optimizer_steps"] = rank.optimizer_steps;
  return rec;
}

void commit_checkpoint(const std::string& save_dir, const std::string& tmp_dir,
                       const std::vector<json>& rank_records, const TrainingState& st_in,
                       const SaveOptions& opts) {
  TrainingState st = st_in;
  st.mcpp_version = kVersion;
  if (!opts.save_rng) st.rng_seed = 0, st.rng_iteration = 0;
  json md = {{"format", "megatron.cpp checkpoint"},
             {"format_version", kFormatVersion},
             {"mcpp_version", kVersion},
             {"iteration", st.iteration},
             {"checksum_algorithm", checksum_algorithm()},
             {"has_optimizer", false},
             {"has_rng", opts.save_rng}};
  if (opts.model) md["model"] = model_config_json(*opts.model);
  json files = json::object(), tensors = json::object();
  for (const json& r : rank_records) {
    for (auto& [f, v] : r.at("files").items()) {
      MCPP_CHECK(!files.contains(f), "two ranks wrote the checkpoint file {}", f);
      files[f] = v;
    }
    for (auto& [key, v] : r.at("tensors").items()) {
      if (!tensors.contains(key))
        tensors[key] = {{"global_shape", v["global_shape"]},
                        {"dtype", v["dtype"]},
                        {"split", v["split"]},
                        {"shards", json::array()}};
      json& t = tensors[key];
      if (v.value("buffer", false)) t["buffer"] = true;  // only buffers carry the field
      MCPP_CHECK(t["global_shape"] == v["global_shape"] && t["dtype"] == v["dtype"],
                 "ranks disagree on the global shape or dtype of {}", key);
      if (v.contains("shards"))  // several boxes of one rank (distributed optimizer)
        for (const json& sh : v["shards"]) t["shards"].push_back(sh);
      else
        t["shards"].push_back(v["shard"]);
    }
    if (r.contains("optimizer_steps")) {
      md["has_optimizer"] = true;
      st.optimizer_steps = r["optimizer_steps"];
    }
  }
  md["files"] = files;
  md["tensors"] = tensors;
  if (opts.tokenizer) md["tokenizer"] = write_tokenizer_files(tmp_dir, *opts.tokenizer);
  md["state"] = state_to_json(st);

  // metadata.json last inside the directory: its presence marks a complete checkpoint.
  write_file_durable(join_path(tmp_dir, kMetadataFile), md.dump(1));
  fsync_dir(tmp_dir);
  const std::string final_dir = join_path(save_dir, iteration_dir_name(st.iteration));
  std::error_code ec;
  std::string old;
  if (fs::exists(final_dir)) {  // re-saving an iteration: move the old copy aside first
    old = final_dir + ".old-" + std::to_string(::getpid());
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    MCPP_CHECK(!ec, "cannot move {} aside: {}", final_dir, ec.message());
  }
  fs::rename(tmp_dir, final_dir, ec);
  MCPP_CHECK_HINT(!ec, "check --save", "cannot rename {} to {}: {}", tmp_dir, final_dir,
                  ec.message());
  fsync_dir(save_dir);
  if (!old.empty()) fs::remove_all(old, ec);
  const std::optional<int64_t> prev =
      opts.retain_interval ? tracked_iteration(save_dir) : std::nullopt;
  // The tracker last: until here loaders use the previous checkpoint.
  write_file_durable(join_path(save_dir, kTrackerFile), std::to_string(st.iteration));
  // Only now, with the new checkpoint and the tracker durable, may the previous one go.
  if (prev) retire_checkpoint(save_dir, *prev, st.iteration, *opts.retain_interval);
}

void save_checkpoint(const std::string& save_dir, std::span<const RankSnapshot> ranks,
                     const TrainingState& st, const SaveOptions& opts) {
  const std::string tmp = begin_checkpoint(save_dir, st.iteration, opts);
  try {
    std::vector<json> recs;
    for (const auto& r : ranks) recs.push_back(write_rank_files(tmp, r));
    commit_checkpoint(save_dir, tmp, recs, st, opts);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a failed save leaves nothing half-written behind
    throw;
  }
}

void save_checkpoint(const std::string& save_dir, const model::ParamStore& params,
                     const optim::AdamW* opt, const TrainingState& st, const SaveOptions& opts) {
  RankSnapshot r = RankSnapshot::view(params, opt);
  save_checkpoint(save_dir, std::span<const RankSnapshot>(&r, 1), st, opts);
}

void save_checkpoint(const std::string& save_dir, const model::GPTModel& m, const optim::AdamW* opt,
                     const TrainingState& st, SaveOptions opts) {
  if (!opts.model) opts.model = m.config();
  save_checkpoint(save_dir, m.params(), opt, st, opts);
}

}  // namespace mcpp::checkpoint
