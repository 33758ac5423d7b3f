// Saving checkpoints, the pieces of a rank's tensors and the state JSON (checkpoint.h has the
// API, docs/checkpoint.md the format); model_metadata.cpp writes, reads and compares the model
// config; find.cpp finds and describes checkpoints, load.cpp validates and loads them.
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
  if (!t.defined() || t.device() == Device::CPU) return t;
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
  const bool main = opt && opt->has_main_params();
  s.params = on_host(main ? const_cast<optim::AdamW*>(opt)->full_main_params()
                          : const_cast<model::ParamStore&>(params).flat_params());
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
  if (exp_avg.defined()) s.exp_avg = exp_avg.clone();
  if (exp_avg_sq.defined()) s.exp_avg_sq = exp_avg_sq.clone();
  for (Tensor& b : s.buffers) b = b.clone();
  return s;
}

// ---- state JSON (the model config's: model_metadata.cpp) ------------------------------------

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
          {"skipped_train_samples", st.skipped_train_samples},
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
  st.skipped_train_samples = j.value("skipped_train_samples", int64_t(0));
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
      // A TP-duplicated tensor is written once, by TP rank 0 (an expert's: ETP rank 0 of its
      // holders); the tied embedding's copy on the last pipeline stage not at all (the first
      // stage writes it).
      if ((p.split == TpSplit::None && dup_rank(rank, p.expert) != 0) || p.pipeline_duplicate)
        continue;
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
      if (b.split == TpSplit::None && dup_rank(rank, b.expert) != 0) continue;
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
    // The moments in one file: optimizer.exp_avg.<name>, optimizer.exp_avg_sq.<name> (SGD's
    // and Lion's one state buffer as exp_avg).
    const std::string f = file_name("optim", rank.coord, true);
    std::map<std::string, Tensor> tensors;
    add(tensors, f, "optimizer.exp_avg.", rank.exp_avg);
    if (rank.exp_avg_sq.defined()) add(tensors, f, "optimizer.exp_avg_sq.", rank.exp_avg_sq);
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
    if ((p.split == TpSplit::None && dup_rank(rank, p.expert) != 0) || p.pipeline_duplicate)
      continue;
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
          if (!src->defined()) continue;  // SGD and Lion: no second moment
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
      md["optimizer"] = opts.optimizer;
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
  if (opts.keep_only_latest) retire_older_checkpoints(save_dir, st.iteration);
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
  SaveOptions o = opts;
  if (opt) o.optimizer = opt->state_name();
  save_checkpoint(save_dir, std::span<const RankSnapshot>(&r, 1), st, o);
}

void save_checkpoint(const std::string& save_dir, const model::GPTModel& m, const optim::AdamW* opt,
                     const TrainingState& st, SaveOptions opts) {
  if (!opts.model) opts.model = m.config();
  save_checkpoint(save_dir, m.params(), opt, st, opts);
}

}  // namespace mcpp::checkpoint
