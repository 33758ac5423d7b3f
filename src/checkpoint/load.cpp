// Loading checkpoints (checkpoint.h has the API; docs/checkpoint.md the format; finding and
// describing them is find.cpp's). A checkpoint is untrusted input: every field is validated
// (checks.h) before a value is used to index, allocate or copy, and any problem is an Error
// naming the file and tensor with the iterations that do load.
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fmt/ranges.h>
#include <map>
#include <memory>
#include <regex>
#include <set>

#include "base/log.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/checks.h"
#include "checkpoint/fs.h"
#include "checkpoint/fully_parallel.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/safetensors.h"
#include "checkpoint/shard_reader.h"
#include "model/gpt_model.h"
#include "ops/ops.h"

namespace mcpp::checkpoint {

namespace fs = std::filesystem;
using json = nlohmann::json;
using model::ParamInfo;

namespace {

// The vocabulary-sized tensors (and their Adam moments), whose rows carry the padding.
bool is_vocab_key(const std::string& key) {
  for (const char* n : {"embedding.word_embeddings.weight", "output_layer.weight"}) {
    const std::string name = n;
    if (key.size() >= name.size() && key.compare(key.size() - name.size(), name.size(), name) == 0)
      return true;
  }
  return false;
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

}  // namespace

namespace {

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

// The id of what load_tensor writes into a rank's tensor: the key, the rank's boxes of it
// and the model's global shape (the vocabulary's re-padding follows it). Ranks whose ids
// agree end with the same values (--ckpt-fully-parallel-load reads them once).
std::string read_id(const std::string& key, const ParamInfo& p, int64_t tp_rank,
                    int64_t tp_size, bool repad) {
  std::string id =
      fmt::format("{}|{}|{}", key, shape_str(p.global_shape), shape_str(p.local_shape));
  for (const Piece& d : local_pieces(p, tp_rank, tp_size))
    id += fmt::format("|{},{},{},{}@{},{}", d.g_row, d.g_col, d.rows, d.cols, d.l_row, d.l_col);
  return repad ? id + "|repad" : id;
}

// Keys on one side only, before anything is read: an error, a warning or nothing by
// --dist-ckpt-strictness (docs/checkpoint.md, "Mismatched keys"). Returns the parameters
// and buffers not to load. A pipeline stage or EP rank sees only its part: the checkpoint's
// other tensors are not checked there.
std::set<std::string> check_keys(const json& md, const model::ParamStore& params,
                                 const LoadOptions& opts, const std::string& iter_dir) {
  const json& tensors = md.at("tensors");
  std::vector<std::string> up, ub, mp, mb;  // unexpected / missing parameters and buffers
  std::set<std::string> expected, skipped;
  for (const ParamInfo& p : params.infos()) {
    if (!expected.insert(p.name).second) continue;
    if (!tensors.contains(p.name)) {
      up.push_back(p.name);
      continue;
    }
    // A key on both sides with another shape: another model, in every mode (the vocabulary
    // tensors' rows are load_tensor's to judge: re-padding).
    const Shape g = tensors[p.name].at("global_shape").get<Shape>();
    MCPP_CHECK(g == p.global_shape || (is_vocab_key(p.name) && g.size() == 2 &&
                                       p.global_shape.size() == 2 && g[1] == p.global_shape[1]),
               "tensor {}: checkpoint global shape {}, model {}", p.name, shape_str(g),
               shape_str(p.global_shape));
  }
  for (const auto& b : params.buffer_infos())
    if (expected.insert(b.name).second && !tensors.contains(b.name)) ub.push_back(b.name);
  if (!opts.partial_model)
    for (auto& [key, v] : tensors.items())
      if (key.rfind("optimizer.", 0) != 0 && !expected.count(key))
        (v.is_object() && v.value("buffer", false) ? mb : mp).push_back(key);
  const Strictness s = opts.strictness;
  report_keys(s, true, up, "parameter", iter_dir);
  report_keys(s, false, mp, "parameter", iter_dir);
  if (s != Strictness::AssumeOkUnexpected) {
    report_keys(s, true, ub, "buffer", iter_dir);
    report_keys(s, false, mb, "buffer", iter_dir);
  } else {
    // A buffer is state of a module this model may not have (another MoE or FP8 setting),
    // or one a checkpoint predates: by default a warning either way.
    if (!ub.empty())
      log::warn("{} holds no value for {} buffer(s) (saved before they existed); they keep "
                "their initial values: {}",
                iter_dir, ub.size(), fmt::join(ub, ", "));
    if (!mb.empty())
      log::warn("{}: ignoring {} buffer(s) of the checkpoint that this model does not register: "
                "{}",
                iter_dir, mb.size(), fmt::join(mb, ", "));
  }
  skipped.insert(up.begin(), up.end());
  skipped.insert(ub.begin(), ub.end());
  return skipped;
}

}  // namespace

TrainingState load_checkpoint_host(const std::string& load_dir, std::optional<int64_t> iteration,
                                   const model::ParamStore& params, const Tensor& values,
                                   const Tensor* exp_avg, const Tensor* exp_avg_sq,
                                   const LoadOptions& opts) {
  // Two moments: Adam's, Muon's with Adam for the other parameters, and adaptive Muon's
  // (its second moment where Adam's is) with either; SGD, Lion and Muon with Lion one.
  const bool adam = opts.optimizer == "adam" || opts.optimizer == "muon" ||
                    opts.optimizer.rfind("adaptive_muon", 0) == 0;
  MCPP_CHECK(values.device() == Device::CPU && values.numel() == params.total_numel() &&
                 (!exp_avg || (exp_avg->device() == Device::CPU &&
                               exp_avg->numel() == params.total_numel() &&
                               (adam ? exp_avg_sq && exp_avg_sq->device() == Device::CPU &&
                                           exp_avg_sq->numel() == params.total_numel()
                                     : !exp_avg_sq))),
             "load_checkpoint_host: host buffers of {} elements expected (the {} optimizer's "
             "moments)",
             params.total_numel(), opts.optimizer);
  comm::Communicator* group =
      opts.replicas && opts.replicas->size() > 1 ? opts.replicas : nullptr;
  bool exchanged = false;  // the replicas' collective has run (see the catch below)
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
      check_model_compat(md["model"], *opts.model, iter_dir, repad,
                         key_set_may_differ(opts.strictness));
    const std::set<std::string> skipped = check_keys(md, params, opts, iter_dir);
    TrainingState st = state_from_json(md.at("state"));
    check_state(st, join_path(iter_dir, kMetadataFile));
    MCPP_CHECK(st.iteration == md["iteration"].get<int64_t>(),
               "{}: state.iteration {} differs from its iteration {}",
               join_path(iter_dir, kMetadataFile), st.iteration, md["iteration"].dump());
    // Every tensor this rank needs, as a read into host memory: the parameters, the
    // registered buffers the checkpoint holds, and (unless --finetune) the Adam moments.
    ShardReader rd(iter_dir, md, opts.verify_checksums);
    const int64_t tpr = params.tp_rank(), tps = params.tp_size();
    std::vector<ReadItem> items;
    auto need = [&](const std::string& key, const ParamInfo& p, const Tensor& dst, bool rp) {
      items.push_back({read_id(key, p, tpr, tps, rp), dst, [&rd, &md, key, p, tpr, tps, dst, rp] {
                         load_tensor(rd, md, key, p, tpr, tps, dst, rp);
                         rd.release();
                       }});
    };
    for (const ParamInfo& p : params.infos())
      if (!skipped.count(p.name))
        need(p.name, p, values.narrow(p.offset, p.numel()).view(p.local_shape), repad);
    // Buffers go into the live tensors only once everything has loaded (a buffer the
    // checkpoint lacks keeps its initial value, reported by check_keys).
    std::vector<std::pair<size_t, Tensor>> buffers;
    const json& tensors = md.at("tensors");
    for (size_t i = 0; i < params.buffer_infos().size(); ++i) {
      const model::BufferInfo& b = params.buffer_infos()[i];
      if (!tensors.contains(b.name)) continue;
      const Shape g = tensors[b.name].at("global_shape").get<Shape>();
      MCPP_CHECK_HINT(g == b.global_shape,
                      "the model flags (experts, layers, FP8 settings) differ from the "
                      "checkpoint's",
                      "buffer {}: the checkpoint holds global shape {}, this model registers {}",
                      b.name, shape_str(g), shape_str(b.global_shape));
      // load_tensor's geometry is the parameters': the buffer as a parameter of its shape.
      const ParamInfo p{b.name, b.global_shape, b.local_shape, b.split};
      buffers.emplace_back(i, Tensor::empty(b.local_shape, b.dtype));
      need(b.name, p, buffers.back().second, false);
    }
    if (exp_avg && !opts.finetune) {
      MCPP_CHECK_HINT(md.value("has_optimizer", false),
                      "load with --no-load-optim (the optimizer state starts from zero)",
                      "{} was saved without optimizer state (--no-save-optim)", iter_dir);
      // Checkpoints from before the field are Adam's (the only optimizer then).
      const std::string saved = md.value("optimizer", std::string("adam"));
      MCPP_CHECK_HINT(saved == opts.optimizer,
                      fmt::format("train with --optimizer {}, or load with --no-load-optim "
                                  "(the {} state then starts from zero)",
                                  saved, opts.optimizer),
                      "{} holds the state of the {} optimizer; this run uses --optimizer {}",
                      iter_dir, saved, opts.optimizer);
      for (const ParamInfo& p : params.infos())
        for (auto [prefix, flat] :
             {std::pair<const char*, const Tensor*>{"optimizer.exp_avg.", exp_avg},
              std::pair<const char*, const Tensor*>{"optimizer.exp_avg_sq.", exp_avg_sq}}) {
          if (!flat) continue;  // SGD and Lion: no second moment
          const Tensor dst = flat->narrow(p.offset, p.numel());
          if (skipped.count(p.name))  // not in the checkpoint: fresh moments
            std::memset(dst.raw(), 0, dst.nbytes());
          else
            need(prefix + p.name, p, dst.view(p.local_shape), repad);
        }
    }
    ExchangeReport ex;
    if (group) {
      exchanged = true;
      ex = read_and_exchange(*group, items);
    } else {
      for (ReadItem& it : items) it.read();
      ex.items = ex.items_read = int64_t(items.size());
    }
    if (opts.report)
      *opts.report = {rd.bytes_read(), ex.bytes_received, ex.items, ex.items_read};
    // The buffers are model state (kept by --finetune, as the weights): into the live
    // tensors now that everything has loaded.
    for (auto& [i, h] : buffers) {
      Tensor dst = params.buffer(i);  // on the buffer's device: that device's stream
      ops::copy(h, dst, ops::default_stream(dst.device()));
    }
    if (opts.finetune) {
      // Megatron's --finetune: weights only; training starts at iteration 0.
      TrainingState fresh;
      fresh.config = st.config, fresh.mcpp_version = st.mcpp_version;
      return fresh;
    }
    if (!opts.load_rng || !md.value("has_rng", true)) st.rng_seed = 0, st.rng_iteration = 0;
    return st;
  } catch (const Error& e) {
    // Under --ckpt-fully-parallel-load the other replicas wait in the exchange: tell them.
    if (group && !exchanged) {
      std::vector<ReadItem> none;
      read_and_exchange(*group, none, e.summary().empty() ? "an error" : e.summary());
    }
    std::string hint = e.hint().empty() ? "" : e.hint() + ". ";
    throw Error(fmt::format("cannot load checkpoint {}: {}", iter_dir, e.summary()),
                hint + load_hint(top, it_num < 0 ? INT64_MAX : it_num));
  } catch (const json::exception& e) {
    if (group && !exchanged) {
      std::vector<ReadItem> none;
      read_and_exchange(*group, none, std::string("malformed metadata: ") + e.what());
    }
    throw Error(
        fmt::format("cannot load checkpoint {}: malformed metadata: {}", iter_dir, e.what()),
        load_hint(top, it_num < 0 ? INT64_MAX : it_num));
  }
}

TrainingState load_checkpoint(const std::string& load_dir, std::optional<int64_t> iteration,
                              model::ParamStore& params, optim::AdamW* opt,
                              const LoadOptions& opts) {
  MCPP_CHECK_HINT(params.device() == Device::CPU && !(opt && opt->has_main_params()),
                  "load GPU and bf16/f16 models with load_checkpoint_host (the trainer does)",
                  "load_checkpoint reads into host f32/f64 parameters only, not {}",
                  params.flat_params().str());
  LoadOptions o = opts;
  if (opt) o.optimizer = opt->state_name();
  const bool second = opt && opt->exp_avg_sq().defined();
  TrainingState st = load_checkpoint_host(load_dir, iteration, params, params.flat_params(),
                                          opt ? &opt->exp_avg() : nullptr,
                                          second ? &opt->exp_avg_sq() : nullptr, o);
  if (opt && !opts.finetune) opt->set_steps(st.optimizer_steps);
  return st;
}

TrainingState load_checkpoint(const std::string& load_dir, std::optional<int64_t> iteration,
                              model::GPTModel& m, optim::AdamW* opt, LoadOptions opts) {
  if (!opts.model) opts.model = m.config();
  return load_checkpoint(load_dir, iteration, m.params(), opt, opts);
}

}  // namespace mcpp::checkpoint
