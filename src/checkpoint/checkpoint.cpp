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
// The vocabulary-sized tensors (and their Adam moments), whose rows carry the padding.
bool is_vocab_key(const std::string& key) {
  for (const char* n : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
    const std::string name = n;
    if (key.size() >= name.size() && key.compare(key.size() - name.size(), name.size(), name) == 0)
      return true;
  }
  return false;
}
int64_t cols_of(const Shape& s) { return s.size() > 1 ? shape_numel(s) / s[0] : 1; }

json piece_json(const Piece& p, size_t ndim) {
  if (ndim <= 1) return {{"offsets", {p.g_row}}, {"shape", {p.rows}}, {"local_offsets", {p.l_row}}};
  return {{"offsets", {p.g_row, p.g_col}},
          {"shape", {p.rows, p.cols}},
          {"local_offsets", {p.l_row, p.l_col}}};
}

Piece piece_from_json(const json& j) {
  auto o = j.at("offsets").get<std::vector<int64_t>>();
  auto s = j.at("shape").get<std::vector<int64_t>>();
  auto l = j.at("local_offsets").get<std::vector<int64_t>>();
  MCPP_CHECK(o.size() == s.size() && s.size() == l.size() && !s.empty() && s.size() <= 2,
             "malformed piece {}", j.dump());
  Piece p;
  p.g_row = o[0], p.rows = s[0], p.l_row = l[0];
  if (s.size() == 2)
    p.g_col = o[1], p.cols = s[1], p.l_col = l[1];
  else
    p.cols = 1;
  return p;
}

std::string file_name(const char* kind, const RankCoord& c, bool with_dp) {
  return with_dp ? fmt::format("{}_tp{:02d}_pp{:02d}_dp{:02d}.safetensors", kind, c.tp, c.pp, c.dp)
                 : fmt::format("{}_tp{:02d}_pp{:02d}.safetensors", kind, c.tp, c.pp);
}

// Copies a rows x cols box from src (at sr, sc) to dst (at dr, dc); both row-major 2-D views
// of width src_w / dst_w.
void copy_box(const Tensor& src, int64_t src_w, int64_t sr, int64_t sc, const Tensor& dst,
              int64_t dst_w, int64_t dr, int64_t dc, int64_t rows, int64_t cols) {
  if (src.dtype() == dst.dtype()) {
    const size_t es = dtype_size(src.dtype());
    const char* s = static_cast<const char*>(src.raw());
    char* d = static_cast<char*>(dst.raw());
    for (int64_t r = 0; r < rows; ++r)
      std::memcpy(d + ((dr + r) * dst_w + dc) * es, s + ((sr + r) * src_w + sc) * es,
                  size_t(cols) * es);
    return;
  }
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      set_float(dst, (dr + r) * dst_w + dc + c, get_float(src, (sr + r) * src_w + sc + c));
}

std::string iterations_str(const std::vector<int64_t>& its) {
  if (its.empty()) return "none";
  std::string s;
  for (auto i : its) s += (s.empty() ? "" : ", ") + std::to_string(i);
  return s;
}

// The hint of every load error: which iterations exist and which one to try instead.
std::string load_hint(const std::string& load_dir, int64_t bad_iteration) {
  auto its = list_iterations(load_dir);
  std::optional<int64_t> prev;
  for (auto i : its)
    if (i < bad_iteration) prev = i;
  std::string h = fmt::format("complete checkpoints in {}: {}", load_dir, iterations_str(its));
  if (prev)
    h += fmt::format(". Load the previous one with --ckpt-step {} (or point {} at it)", *prev,
                     kTrackerFile);
  else
    h += ". No earlier checkpoint exists; start without --load or restore the files";
  return h;
}

std::string join_path(const std::string& a, const std::string& b) {
  return (fs::path(a) / b).string();
}

}  // namespace

// ---- pieces and snapshots -------------------------------------------------------------------

std::vector<Piece> local_pieces(const ParamInfo& p, int64_t tp_rank, int64_t tp_size) {
  const int64_t R = rows_of(p.local_shape), C = cols_of(p.local_shape);
  switch (p.split) {
    case TpSplit::None:
      return {{0, 0, R, C, 0, 0}};
    case TpSplit::Rows:
      return {{tp_rank * R, 0, R, C, 0, 0}};
    case TpSplit::Cols:
      return {{0, tp_rank * C, R, C, 0, 0}};
    case TpSplit::SwigluRows: {
      // Local [gate_r; up_r]; global [gate; up] with F = global rows / 2.
      const int64_t half = R / 2, F = rows_of(p.global_shape) / 2;
      return {{tp_rank * half, 0, half, C, 0, 0}, {F + tp_rank * half, 0, half, C, half, 0}};
    }
  }
  (void)tp_size;
  return {};
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
  return s;
}

RankSnapshot RankSnapshot::clone() const {
  RankSnapshot s = *this;
  s.params = params.clone();
  if (exp_avg.defined()) s.exp_avg = exp_avg.clone(), s.exp_avg_sq = exp_avg_sq.clone();
  return s;
}

// ---- config and state JSON -----------------------------------------------------------------

json model_config_json(const model::TransformerConfig& c) {
  return {{"num_layers", c.num_layers},
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
          {"swiglu", c.swiglu},
          {"tie_embeddings", c.tie_embeddings},
          {"add_bias_linear", c.add_bias_linear},
          {"hidden_dropout", c.hidden_dropout},
          {"attention_dropout", c.attention_dropout},
          {"init_method_std", c.init_method_std},
          {"seed", c.seed},
          {"dtype", std::string(dtype_name(c.dtype))},
          {"tp_size", c.tp_size}};
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
  c.tie_embeddings = j.at("tie_embeddings"), c.add_bias_linear = j.at("add_bias_linear");
  c.hidden_dropout = j.at("hidden_dropout"), c.attention_dropout = j.at("attention_dropout");
  c.init_method_std = j.at("init_method_std"), c.seed = j.at("seed");
  c.dtype = dtype_from_name(j.at("dtype").get<std::string>());
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
    // Left over by a save that was killed: never visible to loaders, so safe to remove.
    static const std::regex stale(R"(.*\.(tmp|old)-\d+$)");
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
  // Adds every parameter's local tensor of `flat` (prefixed key) to one file's tensor map.
  auto add = [&](std::map<std::string, Tensor>& out, const std::string& fname,
                 const std::string& prefix, const Tensor& flat) {
    for (const ParamInfo& p : rank.infos) {
      // A TP-duplicated tensor is written once, by TP rank 0; the tied embedding's copy on
      // the last pipeline stage not at all (the first stage writes it).
      if ((p.split == TpSplit::None && rank.coord.tp != 0) || p.pipeline_duplicate) continue;
      Tensor t = flat.narrow(p.offset, p.numel()).view(p.local_shape);
      const std::string key = prefix + p.name;
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
    const std::string path = join_path(tmp_dir, fname);
    save_safetensors(path, tensors, {{"format", "megatron.cpp checkpoint shard"}});
    rec["files"][fname] = {{"bytes", fs::file_size(path)}};
  };
  {
    const std::string f = file_name("model", rank.coord, false);
    std::map<std::string, Tensor> tensors;
    add(tensors, f, "", rank.params);
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
  // The tracker last: until here loaders use the previous checkpoint.
  write_file_durable(join_path(save_dir, kTrackerFile), std::to_string(st.iteration));
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

// ---- finding -----------------------------------------------------------------------------------

std::vector<int64_t> list_iterations(const std::string& load_dir) {
  std::vector<int64_t> its;
  std::error_code ec;
  if (!fs::is_directory(load_dir, ec)) return its;
  static const std::regex name(R"(iter_(\d{7,}))");
  for (const auto& e : fs::directory_iterator(load_dir, ec)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (!e.is_directory() || !std::regex_match(n, m, name) ||
        !fs::exists(e.path() / kMetadataFile))
      continue;
    if (auto it = parse_iteration_digits(m[1]))
      its.push_back(*it);
    else
      log::warn("ignoring {}: its iteration number does not fit 64 bits", e.path().string());
  }
  std::sort(its.begin(), its.end());
  return its;
}

std::optional<int64_t> latest_iteration(const std::string& load_dir) {
  const std::string tracker = join_path(load_dir, kTrackerFile);
  std::error_code ec;
  if (fs::exists(tracker, ec)) {
    std::string s = read_text_file(tracker, 4096);
    s.erase(std::remove_if(s.begin(), s.end(), ::isspace), s.end());
    if (!s.empty() && s.size() < 19 && std::all_of(s.begin(), s.end(), ::isdigit)) {
      const int64_t it = std::stoll(s);
      // A folder that exists is trusted (if it is broken, loading says so). A missing one
      // means a re-save of this iteration was interrupted while the old copy was moved aside.
      if (fs::exists(fs::path(load_dir) / iteration_dir_name(it), ec)) return it;
      auto its = list_iterations(load_dir);
      if (its.empty()) {
        // Megatron stops here too: starting from random weights would silently throw the
        // run away (and the next save would replace the tracker).
        std::string aside;
        for (const auto& e : fs::directory_iterator(load_dir, ec))
          if (e.path().filename().string().rfind(iteration_dir_name(it) + ".old-", 0) == 0)
            aside = e.path().string();
        throw Error(
            fmt::format("{} names iteration {}, but {} does not exist and {} holds no other "
                        "complete checkpoint",
                        tracker, it, join_path(load_dir, iteration_dir_name(it)), load_dir),
            aside.empty()
                ? "restore the checkpoint folder, or start fresh without --load (or with "
                  "another --load folder)"
                : fmt::format("a re-save of that iteration was interrupted; its previous copy "
                              "is {}: rename it to {}",
                              aside, iteration_dir_name(it)));
      }
      log::warn(
          "{} names iteration {}, whose folder is missing; using the newest complete "
          "checkpoint, iteration {}",
          tracker, it, its.back());
      return its.back();
    }
    log::warn("{} holds '{}', not an iteration number; using the newest complete checkpoint",
              tracker, s.substr(0, 40));
  }
  auto its = list_iterations(load_dir);
  if (its.empty()) return std::nullopt;
  if (!fs::exists(tracker, ec))
    log::warn("{} has no {}; using the newest complete checkpoint, iteration {}", load_dir,
              kTrackerFile, its.back());
  return its.back();
}

namespace {

std::string resolve_iter_dir(const std::string& dir, std::optional<int64_t> iteration) {
  if (!iteration && fs::exists(fs::path(dir) / kMetadataFile)) return dir;  // an iter_* dir
  std::optional<int64_t> it = iteration ? iteration : latest_iteration(dir);
  MCPP_CHECK_HINT(it.has_value(),
                  "check --load; a checkpoint directory holds iter_XXXXXXX/ folders and " +
                      std::string(kTrackerFile),
                  "no checkpoint found in {}", dir);
  return join_path(dir, iteration_dir_name(*it));
}

json parse_metadata(const std::string& iter_dir) {
  const std::string path = join_path(iter_dir, kMetadataFile);
  MCPP_CHECK(fs::is_directory(iter_dir), "{} does not exist", iter_dir);
  MCPP_CHECK(fs::exists(path),
             "{} is missing: the checkpoint is incomplete (a save was interrupted or files were "
             "deleted)",
             path);
  json md;
  try {
    md = json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    MCPP_FAIL("{} is not valid JSON ({}): the file is corrupt", path, e.what());
  }
  MCPP_CHECK(md.is_object() && md.contains("format") && md["format"] == "megatron.cpp checkpoint",
             "{} is not a megatron.cpp checkpoint metadata file", path);
  MCPP_CHECK(md.contains("format_version") && md["format_version"].is_number_integer(),
             "{}: format_version is {}, expected an integer", path,
             md.contains("format_version") ? md["format_version"].dump() : "absent");
  const int64_t v = md["format_version"].get<int64_t>();
  MCPP_CHECK_HINT(v >= 1 && v <= kFormatVersion, "use a newer megatron.cpp to read it",
                  "{} has format version {}, this build reads 1..{}", path, v, kFormatVersion);
  for (const char* k : {"tensors", "files", "state", "iteration"})
    MCPP_CHECK(md.contains(k), "{} lacks the field '{}'", path, k);
  for (const char* k : {"tensors", "files", "state"})
    MCPP_CHECK(md[k].is_object(), "{}: '{}' is not a JSON object", path, k);
  MCPP_CHECK(md["iteration"].is_number_integer() && md["iteration"].get<int64_t>() >= 0,
             "{}: iteration is {}, expected a non-negative integer", path,
             md["iteration"].dump());
  // The folder's name is what the tracker and --ckpt-step select: the metadata inside must
  // describe that iteration, or a converter would export another one than asked.
  static const std::regex name(R"(iter_(\d+))");
  std::smatch m;
  const std::string base = fs::path(iter_dir).filename().string();
  if (std::regex_match(base, m, name)) {
    const auto folder_it = parse_iteration_digits(m[1]);
    MCPP_CHECK_HINT(folder_it == md["iteration"].get<int64_t>(),
                    "the folder was renamed or its metadata.json replaced; restore it",
                    "{} says iteration {}, but its folder is {}", path, md["iteration"].dump(),
                    base);
  }
  md["__iter_dir"] = iter_dir;  // for messages and the file-size checks; never saved
  return md;
}

// Model-shape fields that must agree between a checkpoint and the loading model.
void check_model_compat(const json& saved, const model::TransformerConfig& cur,
                        const std::string& where, bool vocab_repad) {
  const json now = model_config_json(cur);
  std::string diffs;
  const bool rope = cur.rope;
  for (const char* k : {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                        "num_query_groups", "kv_channels", "padded_vocab_size", "rope", "rmsnorm",
                        "swiglu", "tie_embeddings", "add_bias_linear", "max_position_embeddings"}) {
    if (std::string(k) == "max_position_embeddings" && rope) continue;
    if (std::string(k) == "padded_vocab_size" && vocab_repad) continue;
    if (!saved.contains(k) || saved[k] != now[k])
      diffs += fmt::format("\n  {}: checkpoint {} vs this run {}", k,
                           saved.contains(k) ? saved[k].dump() : "(absent)", now[k].dump());
  }
  MCPP_CHECK_HINT(diffs.empty(),
                  "pass the model flags the checkpoint was trained with (megatron inspect shows "
                  "them); padded_vocab_size follows --make-vocab-size-divisible-by and TP",
                  "{} was written for a different model:{}", where, diffs);
  for (const char* k : {"rotary_base", "rotary_percent", "norm_epsilon"})
    if (saved.contains(k) && saved[k] != now[k])
      log::warn("{}: {} differs (checkpoint {}, this run {})", where, k, saved[k].dump(),
                now[k].dump());
}

// Lazily opened shard files; each shard's checksum verified once.
class ShardReader {
 public:
  ShardReader(std::string dir, const json& md, bool verify)
      : dir_(std::move(dir)), md_(md), verify_(verify) {}

  const Tensor& shard(const std::string& key, const json& sh) {
    const std::string file = sh.at("file"), name = sh.at("name");
    const std::string path = join_path(dir_, file);
    auto it = files_.find(file);
    if (it == files_.end()) {
      MCPP_CHECK(fs::exists(path), "shard file {} (tensor {}) is missing", path, key);
      if (md_.at("files").contains(file)) {
        const uint64_t want = md_["files"][file].at("bytes"), got = fs::file_size(path);
        MCPP_CHECK(want == got,
                   "shard file {} has {} bytes, the metadata says {} (truncated or "
                   "overwritten); tensor {}",
                   path, got, want, key);
      }
      it = files_.emplace(file, load_safetensors(path)).first;
    }
    auto t = it->second.tensors.find(name);
    MCPP_CHECK(t != it->second.tensors.end(), "shard file {} lacks tensor {}", path, name);
    const Tensor& x = t->second;
    MCPP_CHECK(x.shape() == sh.at("shape").get<Shape>(),
               "tensor {} in {} has shape {}, the metadata says {}", name, path,
               shape_str(x.shape()), sh.at("shape").dump());
    if (verify_ && verified_.insert(file + "\n" + name).second) {
      const std::string want = sh.at("checksum"), got = checksum_hex(x.raw(), x.nbytes());
      MCPP_CHECK(want == got,
                 "checksum mismatch for tensor {} in {}: stored {}, computed {} "
                 "({}); the file is corrupt",
                 name, path, want, got, checksum_algorithm());
    }
    return x;
  }

 private:
  std::string dir_;
  const json& md_;
  bool verify_;
  std::map<std::string, SafetensorsFile> files_;
  std::set<std::string> verified_;
};

// Fills the local tensor `dst` (parameter p on TP rank tp_rank) from the checkpoint's key.
void load_tensor(ShardReader& rd, const json& md, const std::string& key, const ParamInfo& p,
                 int64_t tp_rank, int64_t tp_size, const Tensor& dst, bool vocab_repad = false) {
  const json& tensors = md.at("tensors");
  MCPP_CHECK_HINT(tensors.contains(key),
                  "the model flags differ from the checkpoint's, or it was saved without this "
                  "state (--no-save-optim: load with --no-load-optim)",
                  "the checkpoint has no tensor {}", key);
  const json& t = tensors[key];
  const Shape gshape = t.at("global_shape").get<Shape>();
  // The vocabulary's padding rows follow the layout (make_vocab_size_divisible_by x TP): a
  // checkpoint padded for another TP keeps its first min(Vc, Vm) rows; rows this model has
  // beyond the checkpoint's repeat its last row (Adam moments: zero), as Megatron's
  // converters do with true_vocab_size.
  const bool repad = vocab_repad && is_vocab_key(key) && gshape.size() == 2 &&
                     p.global_shape.size() == 2 && gshape[1] == p.global_shape[1] &&
                     gshape[0] != p.global_shape[0];
  MCPP_CHECK(repad || gshape == p.global_shape, "tensor {}: checkpoint global shape {}, model {}",
             key, shape_str(gshape), shape_str(p.global_shape));
  const int64_t keep_rows = repad ? std::min(gshape[0], p.global_shape[0]) : rows_of(gshape);
  const int64_t gnumel = shape_numel(gshape);
  const int64_t dst_w = cols_of(p.local_shape);
  int64_t stored = 0, covered = 0;
  const auto mine = local_pieces(p, tp_rank, tp_size);
  // Every piece inside the tensor and inside its shard (whose checksum then covers all that
  // is copied), no two overlapping: checked for all shards before any is read.
  std::vector<Piece> all;
  for (const json& sh : t.at("shards")) {
    const Shape sshape = sh.at("shape").get<Shape>();
    check_shape(sshape, "tensor " + key + ": shard shape");
    MCPP_CHECK(sshape.size() == gshape.size(), "tensor {}: shard shape {} for global shape {}",
               key, shape_str(sshape), shape_str(gshape));
    for (const json& pj : sh.at("pieces")) {
      all.push_back(piece_from_json(pj));
      check_piece(all.back(), gshape, sshape, key);
    }
  }
  check_pieces_disjoint(all, key);
  for (const json& sh : t.at("shards")) {
    const Shape sshape = sh.at("shape").get<Shape>();
    const int64_t src_w = cols_of(sshape);
    const Tensor* src = nullptr;
    for (const json& pj : sh.at("pieces")) {
      const Piece s = piece_from_json(pj);
      stored += s.rows * s.cols;
      for (const Piece& d : mine) {
        const int64_t c0 = std::max(s.g_col, d.g_col),
                      c1 = std::min(s.g_col + s.cols, d.g_col + d.cols);
        if (c0 >= c1) continue;
        const int64_t r0 = std::max(s.g_row, d.g_row),
                      r1 = std::min({s.g_row + s.rows, d.g_row + d.rows, keep_rows});
        if (r0 < r1) {
          if (!src) src = &rd.shard(key, sh);
          copy_box(*src, src_w, s.l_row + r0 - s.g_row, s.l_col + c0 - s.g_col, dst, dst_w,
                   d.l_row + r0 - d.g_row, d.l_col + c0 - d.g_col, r1 - r0, c1 - c0);
          covered += (r1 - r0) * (c1 - c0);
        }
        // Rows of this model beyond the checkpoint's: copies of its last row (weights).
        if (repad && key.rfind("optimizer.", 0) != 0 && s.g_row + s.rows == gshape[0])
          for (int64_t g = std::max(d.g_row, gshape[0]); g < d.g_row + d.rows; ++g) {
            if (!src) src = &rd.shard(key, sh);
            copy_box(*src, src_w, s.l_row + s.rows - 1, s.l_col + c0 - s.g_col, dst, dst_w,
                     d.l_row + g - d.g_row, d.l_col + c0 - d.g_col, 1, c1 - c0);
            covered += c1 - c0;
          }
      }
    }
  }
  // Moments of rows beyond the checkpoint's start at zero.
  if (repad && key.rfind("optimizer.", 0) == 0)
    for (const Piece& d : mine)
      for (int64_t g = std::max(d.g_row, gshape[0]); g < d.g_row + d.rows; ++g) {
        for (int64_t c = 0; c < d.cols; ++c) set_float(dst, (d.l_row + g - d.g_row) * dst_w + d.l_col + c, 0.0);
        covered += d.cols;
      }
  MCPP_CHECK(stored == gnumel, "tensor {}: its shards hold {} elements, the tensor has {}", key,
             stored, gnumel);
  MCPP_CHECK(covered == dst.numel(), "tensor {}: the shards cover {} of this rank's {} elements",
             key, covered, dst.numel());
}

// Whether the vocabulary tensors may be re-padded (see load_tensor): given the loading
// tokenizer's size (true_vocab_size, as Megatron's converters take it), when both padded sizes
// hold it; otherwise when the TP size differs and the two sizes are paddings of one vocabulary
// (closer than one padding multiple of the larger layout). Anything else is another vocabulary.
bool vocab_repad_allowed(const json& md, const model::ParamStore& params,
                         const LoadOptions& opts, const std::string& where) {
  if (!md.contains("model") || !md.contains("tensors")) return false;
  const json& mj = md["model"];
  const int64_t vc = mj.value("padded_vocab_size", int64_t(0)), tc = mj.value("tp_size", int64_t(1));
  int64_t vm = 0;
  for (const ParamInfo& p : params.infos())
    if (p.name == "embedding.word_embeddings.weight") vm = p.global_shape[0];
  if (vc <= 0 || vm <= 0 || vc == vm) return false;
  const int64_t tl = params.tp_size();
  int64_t div = 128;  // --make-vocab-size-divisible-by of the saving run when it was given
  const json& cfg = md.at("state").value("config", json::object());
  if (cfg.is_object() && cfg.contains("make_vocab_size_divisible_by") &&
      cfg["make_vocab_size_divisible_by"].is_string())
    div = std::max<int64_t>(1, std::atoll(cfg["make_vocab_size_divisible_by"].get<std::string>().c_str()));
  // Paddings of one vocabulary V differ by less than the larger multiple: Vc - V < div * tc
  // and Vm - V < div * tl.
  const bool close = std::abs(vc - vm) < div * std::max(tc, tl);
  const bool ok = opts.true_vocab_size > 0 ? std::min(vc, vm) >= opts.true_vocab_size
                                           : close && tc != tl;
  if (ok)
    log::info("{}: re-padding the vocabulary from {} rows (TP {}) to {} (TP {}): rows beyond "
              "{} are padding",
              where, vc, tc, vm, tl, std::min(vc, vm));
  return ok;
}

}  // namespace

json read_metadata(const std::string& dir, std::optional<int64_t> iteration) {
  return parse_metadata(resolve_iter_dir(dir, iteration));
}

TrainingState load_checkpoint_host(const std::string& load_dir, std::optional<int64_t> iteration,
                                   const model::ParamStore& params, const Tensor& values,
                                   const Tensor* exp_avg, const Tensor* exp_avg_sq,
                                   const LoadOptions& opts) {
  MCPP_CHECK(values.device() == Device::CPU && values.numel() == params.total_numel() &&
                 (!exp_avg || (exp_avg_sq && exp_avg->device() == Device::CPU &&
                               exp_avg->numel() == params.total_numel() &&
                               exp_avg_sq->numel() == params.total_numel())),
             "load_checkpoint_host: host buffers of {} elements expected", params.total_numel());
  const std::string iter_dir = resolve_iter_dir(load_dir, iteration);
  const std::string top = fs::exists(fs::path(load_dir) / kMetadataFile)
                              ? fs::path(load_dir).parent_path().string()
                              : load_dir;
  int64_t it_num = iteration.value_or(-1);
  {
    std::smatch m;
    const std::string base = fs::path(iter_dir).filename().string();
    static const std::regex name(R"(iter_(\d+))");
    if (std::regex_match(base, m, name)) it_num = parse_iteration_digits(m[1]).value_or(-1);
  }
  try {
    const json md = parse_metadata(iter_dir);
    const bool repad = vocab_repad_allowed(md, params, opts, iter_dir);
    if (opts.model && md.contains("model"))
      check_model_compat(md["model"], *opts.model, iter_dir, repad);
    ShardReader rd(iter_dir, md, opts.verify_checksums);
    const int64_t tpr = params.tp_rank(), tps = params.tp_size();
    std::set<std::string> expected;
    for (const ParamInfo& p : params.infos()) {
      load_tensor(rd, md, p.name, p, tpr, tps, values.narrow(p.offset, p.numel()).view(p.local_shape),
                  repad);
      expected.insert(p.name);
    }
    for (auto& [key, v] : md.at("tensors").items())
      MCPP_CHECK_HINT(opts.partial_model || key.rfind("optimizer.", 0) == 0 || expected.count(key),
                      "the model flags differ from the checkpoint's (megatron inspect lists its "
                      "config)",
                      "the checkpoint holds {} {}, which this model does not have", key,
                      shape_str(v.at("global_shape").get<Shape>()));
    TrainingState st = state_from_json(md.at("state"));
    check_state(st, join_path(iter_dir, kMetadataFile));
    MCPP_CHECK(st.iteration == md["iteration"].get<int64_t>(),
               "{}: state.iteration {} differs from its iteration {}",
               join_path(iter_dir, kMetadataFile), st.iteration, md["iteration"].dump());
    if (opts.finetune) {
      // Megatron's --finetune: weights only; training starts at iteration 0.
      TrainingState fresh;
      fresh.config = st.config, fresh.mcpp_version = st.mcpp_version;
      return fresh;
    }
    if (exp_avg) {
      MCPP_CHECK_HINT(md.value("has_optimizer", false),
                      "load with --no-load-optim (the optimizer state starts from zero)",
                      "{} was saved without optimizer state (--no-save-optim)", iter_dir);
      for (const ParamInfo& p : params.infos())
        for (auto [prefix, flat] :
             {std::pair<const char*, const Tensor*>{"optimizer.exp_avg.", exp_avg},
              std::pair<const char*, const Tensor*>{"optimizer.exp_avg_sq.", exp_avg_sq}})
          load_tensor(rd, md, prefix + p.name, p, tpr, tps,
                      flat->narrow(p.offset, p.numel()).view(p.local_shape), repad);
    }
    if (!opts.load_rng || !md.value("has_rng", true)) st.rng_seed = 0, st.rng_iteration = 0;
    return st;
  } catch (const Error& e) {
    std::string hint = e.hint().empty() ? "" : e.hint() + ". ";
    throw Error(fmt::format("cannot load checkpoint {}: {}", iter_dir, e.summary()),
                hint + load_hint(top, it_num < 0 ? INT64_MAX : it_num));
  } catch (const json::exception& e) {
    throw Error(
        fmt::format("cannot load checkpoint {}: malformed metadata: {}", iter_dir, e.what()),
        load_hint(top, it_num < 0 ? INT64_MAX : it_num));
  }
}

TrainingState load_checkpoint(const std::string& load_dir, std::optional<int64_t> iteration,
                              model::ParamStore& params, optim::AdamW* opt,
                              const LoadOptions& opts) {
  MCPP_CHECK_HINT(params.device() == Device::CPU && !(opt && opt->main_params().defined()),
                  "load GPU and bf16/f16 models with load_checkpoint_host (the trainer does)",
                  "load_checkpoint reads into host f32/f64 parameters only, not {}",
                  params.flat_params().str());
  TrainingState st =
      load_checkpoint_host(load_dir, iteration, params, params.flat_params(),
                           opt ? &opt->exp_avg() : nullptr, opt ? &opt->exp_avg_sq() : nullptr, opts);
  if (opt && !opts.finetune) opt->set_steps(st.optimizer_steps);
  return st;
}

TrainingState load_checkpoint(const std::string& load_dir, std::optional<int64_t> iteration,
                              model::GPTModel& m, optim::AdamW* opt, LoadOptions opts) {
  if (!opts.model) opts.model = m.config();
  return load_checkpoint(load_dir, iteration, m.params(), opt, opts);
}

// ---- inspection --------------------------------------------------------------------------------

std::string describe_checkpoint(const std::string& dir, int* bad_shards) {
  const std::string iter_dir = resolve_iter_dir(dir, std::nullopt);
  const json md = parse_metadata(iter_dir);
  try {
  std::ostringstream o;
  o << "checkpoint " << iter_dir << "\n";
  o << "  format version " << md["format_version"] << ", written by megatron.cpp "
    << md.value("mcpp_version", "?") << ", checksums " << md.value("checksum_algorithm", "?")
    << "\n";
  if (fs::exists(fs::path(dir) / kTrackerFile)) {
    auto its = list_iterations(dir);
    o << "  iterations present: " << iterations_str(its)
      << " (tracker: " << read_text_file(join_path(dir, kTrackerFile), 4096) << ")\n";
  }
  const json& s = md["state"];
  o << "  iteration " << s["iteration"] << ", consumed samples train "
    << s["consumed_train_samples"] << " valid " << s["consumed_valid_samples"]
    << ", optimizer steps " << s["optimizer_steps"] << ", optimizer state "
    << (md.value("has_optimizer", false) ? "yes" : "no") << "\n";
  o << "  scheduler " << s["opt_param_scheduler"].dump() << "\n";
  o << "  rng " << s["rng"].dump() << ", data loader " << s["data_loader"].dump() << "\n";
  if (md.contains("model")) o << "  model " << md["model"].dump() << "\n";
  if (!s["config"].empty()) o << "  config " << s["config"].dump() << "\n";
  o << "  files:\n";
  for (auto& [f, v] : md["files"].items()) o << "    " << f << "  " << v["bytes"] << " bytes\n";
  o << "  tensors (key, global shape, dtype, split: shards file[rows,cols @ offsets] status):\n";
  ShardReader rd(iter_dir, md, true);
  int bad = 0;
  for (auto& [key, t] : md["tensors"].items()) {
    o << "    " << key << "  " << shape_str(t["global_shape"].get<Shape>()) << " "
      << t["dtype"].get<std::string>() << " " << t["split"].get<std::string>() << ":";
    for (const json& sh : t["shards"]) {
      o << " " << sh["file"].get<std::string>();
      for (const json& p : sh["pieces"]) o << p["shape"].dump() << "@" << p["offsets"].dump();
      try {
        const Shape g = t.at("global_shape").get<Shape>(), ss = sh.at("shape").get<Shape>();
        check_shape(g, "tensor " + key);
        check_shape(ss, "tensor " + key + ": shard shape");
        for (const json& p : sh.at("pieces")) check_piece(piece_from_json(p), g, ss, key);
        rd.shard(key, sh);
        o << " ok";
      } catch (const Error& e) {
        ++bad;
        o << " BAD (" << e.summary() << ")";
      } catch (const json::exception& e) {
        ++bad;
        o << " BAD (malformed shard entry: " << e.what() << ")";
      }
    }
    o << "\n";
  }
  o << "  "
    << (bad ? std::to_string(bad) + " shard(s) failed verification" : "all checksums verified")
    << "\n";
  if (bad_shards) *bad_shards = bad;
  return o.str();
  } catch (const json::exception& e) {
    throw Error(fmt::format("{}/{}: malformed metadata: {}", iter_dir, kMetadataFile, e.what()));
  }
}

}  // namespace mcpp::checkpoint
