// megatron_export.h's export_to_megatron: a megatron.cpp checkpoint -> Megatron's legacy layout.
#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "base/error.h"
#include "base/log.h"
#include "checkpoint/fs.h"
#include "checkpoint/megatron/megatron_export.h"
#include "checkpoint/megatron/megatron_import.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"

namespace mcpp::checkpoint::megatron {

namespace fs = std::filesystem;

namespace {

// TP rank r of T of a whole tensor, as Megatron's parallel layer holds it (merge_tp's
// inverse in megatron_import.cpp).
Tensor split_tp(const Tensor& full, Split how, int64_t r, int64_t T) {
  if (T == 1 || how == Split::Replicated) return full.clone();
  const Shape& sh = full.shape();
  const int64_t rows = sh[0], cols = sh.size() > 1 ? full.numel() / rows : 1;
  const float* x = full.data<float>();
  Shape out = sh;
  if (how == Split::Cols)
    out[1] /= T;
  else
    out[0] /= T;
  Tensor o = Tensor::empty(out, DType::F32);
  float* d = o.data<float>();
  if (how == Split::Rows) {
    const int64_t n = rows / T * cols;
    std::memcpy(d, x + r * n, size_t(n) * sizeof(float));
  } else if (how == Split::Cols) {
    const int64_t c = cols / T;
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(d + i * c, x + i * cols + r * c, size_t(c) * sizeof(float));
  } else {  // SwiGLU [gate; up] -> [gate_r; up_r]
    const int64_t h = rows / 2, hr = h / T;
    std::memcpy(d, x + r * hr * cols, size_t(hr * cols) * sizeof(float));
    std::memcpy(d + hr * cols, x + (h + r * hr) * cols, size_t(hr * cols) * sizeof(float));
  }
  return o;
}

double given_double(const nlohmann::json& g, const char* k, double dflt) {
  if (!g.is_object() || !g.contains(k) || !g[k].is_string()) return dflt;
  try {
    return std::stod(g[k].get<std::string>());
  } catch (const std::exception&) {
    return dflt;
  }
}

// The target folder: empty or missing, or a Megatron checkpoint root without this iteration.
void check_target(const std::string& save_dir, const std::string& iter_dir) {
  std::error_code ec;
  if (fs::exists(save_dir, ec)) {
    MCPP_CHECK_HINT(fs::is_directory(save_dir, ec), "give a folder for --save",
                    "megatron convert --to-megatron: --save {} is not a folder", save_dir);
    const bool empty = fs::directory_iterator(save_dir, ec) == fs::directory_iterator();
    MCPP_CHECK_HINT(empty || fs::exists(fs::path(save_dir) / kTrackerFile),
                    "give an empty or new folder for --save (or a Megatron checkpoint folder "
                    "to add an iteration to)",
                    "megatron convert --to-megatron: --save {} is not empty and holds no "
                    "Megatron checkpoint ({}); nothing is written into it",
                    save_dir, kTrackerFile);
    MCPP_CHECK_HINT(
        !fs::exists(iter_dir, ec), "remove that folder first, or write into another --save folder",
        "megatron convert --to-megatron: {} exists already; it is not overwritten", iter_dir);
  }
  check_save_dir_writable(save_dir);
}

}  // namespace

int64_t export_to_megatron(const std::string& load_dir, std::optional<int64_t> step,
                           const std::string& save_dir, const ExportOptions& o) {
  const nlohmann::json md = read_metadata(load_dir, step);
  model::TransformerConfig cfg = model_config_from_metadata(md);
  // The stored weights are f32 whatever the run's dtype (a bf16 GPU run saves its fp32 main
  // params): read them on the CPU as stored; the run's dtype goes out as params_dtype.
  cfg.dtype = DType::F32, cfg.device = Device::CPU;
  check_exportable(cfg, o, "--target-tensor-parallel-size", "--target-pipeline-parallel-size");
  model::GPTModel m(cfg);
  auto& ps = m.params();
  const bool saved_optim = md.value("has_optimizer", false);
  const std::string rule = md.value("optimizer", std::string("adam"));
  // Megatron's checkpoints here carry Adam's state; an SGD or Lion run's moments do not
  // convert into it.
  MCPP_CHECK_HINT(!saved_optim || !o.save_optim || rule == "adam",
                  "add --no-save-optim to convert the weights alone",
                  "{} holds the state of the {} optimizer; the Megatron export writes Adam's "
                  "moments only",
                  load_dir, rule);
  const bool has_optim = saved_optim && rule == "adam";
  const TrainingState given = state_from_json(md.value("state", nlohmann::json::object()));
  optim::OptimizerConfig acfg{given_double(given.config, "adam_beta1", 0.9),
                              given_double(given.config, "adam_beta2", 0.999),
                              given_double(given.config, "adam_eps", 1e-8)};
  optim::AdamW opt(ps, acfg);
  TrainingState st = load_checkpoint(load_dir, step, m, has_optim ? &opt : nullptr);
  const std::string iter_dir = (fs::path(save_dir) / iteration_dir_name(st.iteration)).string();
  check_target(save_dir, iter_dir);

  ExportSource src;
  src.config = cfg;
  // --apply-wd-to-qk-layernorm is an optimizer setting, recorded with the run's flags: it
  // puts the q/k norm weights (and biases) in Megatron's decayed parameter group.
  src.config.qk_layernorm_weight_decay =
      cfg.qk_layernorm && given.config.is_object() &&
      given.config.value("apply_wd_to_qk_layernorm", std::string()) == "True";
  src.state = st;
  src.params_dtype = recorded_params_dtype(st.config);
  src.has_optimizer = has_optim && st.optimizer_steps > 0;
  src.optimizer_steps = st.optimizer_steps;
  src.beta1 = acfg.beta1, src.beta2 = acfg.beta2, src.eps = acfg.eps;
  src.shard = [&](const std::string& name, const char* what, int64_t tp, int64_t T) {
    const model::ParamInfo& p = ps.info(name);
    Tensor full = std::strcmp(what, "param") == 0 ? ps.param(name)
                  : std::strcmp(what, "exp_avg") == 0
                      ? opt.exp_avg().narrow(p.offset, p.numel())
                      : opt.exp_avg_sq().narrow(p.offset, p.numel());
    return split_tp(full.view(p.global_shape), split_of(name, cfg.gated_linear_unit()), tp, T);
  };
  if (o.save_optim && !src.has_optimizer)
    log::warn(
        "{} holds no Adam state{}: the Megatron checkpoint has none (load it in Megatron "
        "with --no-load-optim, or --finetune)",
        load_dir, has_optim ? " (no optimizer step yet)" : "");

  const std::string tmp = iter_dir + ".tmp-" + std::to_string(::getpid());
  std::error_code ec;
  fs::remove_all(tmp, ec);
  try {
    for (int64_t pp = 0; pp < o.pp; ++pp)
      for (int64_t tp = 0; tp < o.tp; ++tp) {
        write_legacy_rank(tmp, src, o, tp, pp);
        fsync_dir((fs::path(tmp) / legacy_rank_dir(tp, pp, o.pp)).string());
      }
    fsync_dir(tmp);
    fs::rename(tmp, iter_dir);
  } catch (...) {
    fs::remove_all(tmp, ec);  // nothing half-written stays visible
    throw;
  }
  fsync_dir(save_dir);
  write_file_durable((fs::path(save_dir) / kTrackerFile).string(), std::to_string(st.iteration));
  log::info(
      "wrote Megatron-LM's legacy checkpoint (--ckpt-format torch) of iteration {}: {} "
      "rank file(s), TP {} x PP {}, {} spec, {} weights{}; Megatron loads it with "
      "--no-load-rng (the RNG states are not written)",
      st.iteration, o.tp * o.pp, o.tp, o.pp, transformer_impl_name(o.impl),
      src.params_dtype == DType::F32    ? "fp32"
      : src.params_dtype == DType::BF16 ? "bf16"
                                        : "fp16",
      o.save_optim && src.has_optimizer
          ? fmt::format(", Adam state of step {}", src.optimizer_steps)
          : ", no optimizer state");
  return st.iteration;
}

}  // namespace mcpp::checkpoint::megatron
