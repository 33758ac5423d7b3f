// megatron_train.h: a training run's saves and loads in Megatron-LM's legacy layout.
#include "checkpoint/megatron/megatron_train.h"

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <set>

#include "base/error.h"
#include "base/log.h"
#include "base/timer.h"
#include "checkpoint/fs.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/retention.h"
#include "ops/ops.h"
#include "optim/lr_scheduler.h"
#include "parallel/host_collectives.h"

namespace mcpp::checkpoint::megatron {

namespace fs = std::filesystem;

namespace {

Tensor host_f32(const Tensor& t) {
  MCPP_CHECK_HINT(t.dtype() == DType::F32, "train in fp32, bf16 or fp16",
                  "--ckpt-format torch: the optimizer's values are {}, expected fp32",
                  dtype_name(t.dtype()));
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  ops::copy(t, h, ops::default_stream(t.device()));
  return h;
}

ExportOptions export_options(const LegacyTrainOptions& o, const parallel::ParallelState& ps) {
  ExportOptions e;
  e.tp = ps.layout().tp(), e.pp = ps.layout().pp();
  e.dp = ps.layout().dp(), e.cp = ps.layout().cp();
  e.sequence_parallel = o.config.sp();
  e.vp = o.virtual_stages;
  e.first_stage_layers = o.first_stage_layers, e.last_stage_layers = o.last_stage_layers;
  e.layout = o.layout;
  e.impl = o.impl;
  e.save_optim = o.save_optim;
  return e;
}

std::set<std::string> stage_names(const model::ParamStore& params) {
  std::set<std::string> out;
  for (const auto& p : params.infos()) out.insert(p.name);
  return out;
}

// This rank's file: its own parameters (the fp32 main params when the optimizer has them)
// and moments, by name, as the TP shard Megatron's parallel layers hold (ours are laid out
// the same way: split_of's rule).
void write_own_rank(const std::string& tmp, const parallel::ParallelState& ps,
                    model::ParamStore& params, const Tensor& values, const Tensor& m,
                    const Tensor& v, int64_t steps, const TrainingState& st,
                    const LegacyTrainOptions& o) {
  const ExportOptions eo = export_options(o, ps);
  const std::set<std::string> names = stage_names(params);
  ExportSource src;
  src.config = o.config;
  src.state = st;
  src.params_dtype = params.flat_params().dtype();
  src.has_optimizer = o.save_optim && m.defined() && steps > 0;
  src.optimizer_steps = steps;
  src.beta1 = o.beta1, src.beta2 = o.beta2, src.eps = o.eps;
  src.names = &names;
  const int64_t my_tp = ps.tp_rank();
  src.shard = [&](const std::string& name, const char* what, int64_t tp, int64_t T) {
    MCPP_CHECK(tp == my_tp && T == eo.tp, "internal: rank {} asked for TP shard {} of {}", my_tp,
               tp, T);
    const model::ParamInfo& p = params.info(name);
    const Tensor& from = std::strcmp(what, "param") == 0     ? values
                         : std::strcmp(what, "exp_avg") == 0 ? m
                                                             : v;
    return from.narrow(p.offset, p.numel()).view(p.local_shape);
  };
  write_legacy_rank(tmp, src, eo, ps.tp_rank(), ps.pp_rank());
  fsync_dir((fs::path(tmp) / legacy_rank_dir(ps.tp_rank(), ps.pp_rank(), eo.pp)).string());
}

// Rank 0, once every rank file is durable: the folder into place, then the tracker.
void commit_legacy(const std::string& save_dir, const std::string& tmp, int64_t iteration,
                   const LegacyTrainOptions& o) {
  const std::optional<int64_t>& retain_interval = o.retain_interval;
  fsync_dir(tmp);
  const std::string final_dir = (fs::path(save_dir) / iteration_dir_name(iteration)).string();
  std::error_code ec;
  std::string old;
  if (fs::exists(final_dir)) {  // re-saving an iteration: the old copy aside first
    old = final_dir + ".old-" + std::to_string(::getpid());
    fs::remove_all(old, ec);
    fs::rename(final_dir, old, ec);
    MCPP_CHECK_HINT(!ec, "check --save", "cannot move {} aside: {}", final_dir, ec.message());
  }
  fs::rename(tmp, final_dir, ec);
  MCPP_CHECK_HINT(!ec, "check --save", "cannot rename {} to {}: {}", tmp, final_dir,
                  ec.message());
  fsync_dir(save_dir);
  if (!old.empty()) fs::remove_all(old, ec);
  const std::optional<int64_t> prev =
      retain_interval ? tracked_iteration(save_dir) : std::nullopt;
  write_file_durable((fs::path(save_dir) / kTrackerFile).string(), std::to_string(iteration));
  if (prev) retire_checkpoint(save_dir, *prev, iteration, *retain_interval);
  if (o.keep_only_latest) retire_older_checkpoints(save_dir, iteration);
}

}  // namespace

void check_legacy_trainable(const LegacyTrainOptions& o, const parallel::ParallelState& ps,
                            const model::ParamStore& params) {
  check_stage_exportable(o.config, export_options(o, ps), ps.pp_rank(), stage_names(params),
                         !params.buffer_infos().empty());
}

void save_legacy_training_checkpoint(const std::string& save_dir, comm::Communicator& world,
                                     const parallel::ParallelState& ps, model::ParamStore& params,
                                     optim::Optimizer& opt, const TrainingState& st,
                                     const LegacyTrainOptions& o) {
  Timer t;
  t.start();
  opt.wait_params_all();  // the parameters written must be current
  SaveOptions so;
  std::string tmp = world.rank() == 0 ? begin_checkpoint(save_dir, st.iteration, so) : "";
  tmp = parallel::all_gather_strings(world, tmp)[0];
  std::string error;
  // The DP (and CP) replicas hold the same parameters and, without the distributed optimizer
  // (refused at start-up), the same moments: their rank 0 writes them.
  const Tensor main = opt.full_main_params();
  if (ps.dp_rank() == 0 && ps.cp_rank() == 0) {
    try {
      const Tensor values = host_f32(main.defined() ? main : params.flat_params());
      Tensor m, v;
      if (o.save_optim) m = host_f32(opt.exp_avg()), v = host_f32(opt.exp_avg_sq());
      write_own_rank(tmp, ps, params, values, m, v, opt.steps(), st, o);
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  const auto errors = parallel::all_gather_strings(world, error);
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty()) {
      std::error_code ec;
      if (world.rank() == 0) fs::remove_all(tmp, ec);  // nothing half-written stays
      throw Error(fmt::format("--ckpt-format torch: saving iteration {} to {} failed on rank {}: "
                              "{}",
                              st.iteration, save_dir, r, errors[r]),
                  "the previous checkpoint is intact; check the disk (space, permissions)");
    }
  if (world.rank() == 0) commit_legacy(save_dir, tmp, st.iteration, o);
  world.barrier(ops::default_stream(Device::CPU));
  const double sec = t.elapsed();
  log::info("  successfully saved checkpoint from iteration {:8d} to {} [ t {:.3f} s ]",
            st.iteration, save_dir, sec);
  if (world.rank() == 0)
    log::info("  checkpoint written (Megatron-LM's legacy layout, {} rank file(s)): {}",
              ps.layout().tp() * ps.layout().pp(),
              size_and_rate(tree_bytes((fs::path(save_dir) / iteration_dir_name(st.iteration))
                                           .string()),
                            sec));
}

bool holds_legacy_checkpoint(const std::string& dir, std::optional<int64_t> iteration) {
  std::optional<Detected> d;
  try {
    d = detect(dir, iteration);
  } catch (const std::exception&) {
    return false;  // a broken Megatron folder: the loader that reads it says what is wrong
  }
  return d && d->layout == Layout::Legacy;
}

LegacyLoaded load_legacy_training_checkpoint(const std::string& dir,
                                             std::optional<int64_t> iteration,
                                             model::ParamStore& params, optim::Optimizer& opt,
                                             bool load_optim, const LoadOptions& o) {
  Timer t;
  t.start();
  std::optional<Detected> d = detect(dir, iteration);
  MCPP_CHECK_HINT(d && d->layout == Layout::Legacy,
                  "check --load and --ckpt-step (a legacy checkpoint holds iter_N/mp_rank_*/)",
                  "{} holds no legacy Megatron-LM checkpoint{}", dir,
                  iteration ? fmt::format(" of iteration {}", *iteration) : std::string());
  // The optimizer state is read whenever present: a bf16 run's fp32 main params are its
  // precise weights (what our own format saves as the values), also under --no-load-optim.
  d->load_optim = true;
  Imported im = read(*d);
  for (const auto& n : im.notes) log::warn("{}", n);
  MCPP_CHECK_HINT(!load_optim || opt.state_name() == "adam",
                  "add --no-load-optim (or --finetune) to load the weights alone",
                  "{}: a legacy Megatron-LM checkpoint holds Adam's state; this run uses "
                  "--optimizer {}",
                  d->iter_dir, opt.state_name());
  MCPP_CHECK_HINT(!load_optim || im.optimizer,
                  "add --no-load-optim (or --finetune) to load the weights alone",
                  "{}: {}; the Adam state cannot be restored",
                  d->iter_dir,
                  !im.optimizer_skipped.empty() ? im.optimizer_skipped
                                                : std::string("no optimizer state was saved "
                                                              "(--no-save-optim)"));
  if (o.model)
    check_model_compat(model_config_json(im.config), *o.model, d->iter_dir, false);
  const OptimizerState* os = im.optimizer ? &*im.optimizer : nullptr;
  const auto& from = os && !os->main_params.empty() ? os->main_params : im.tensors;
  const int64_t total = params.total_numel();
  Tensor values = Tensor::zeros({total}, DType::F32), m, v;
  if (load_optim) m = Tensor::zeros({total}, DType::F32), v = Tensor::zeros({total}, DType::F32);
  // Each local parameter: its TP pieces of the merged (TP 1) tensor.
  auto place = [&](const std::map<std::string, Tensor>& src, const model::ParamInfo& p,
                   Tensor& dst, const char* what) {
    auto it = src.find(p.name);
    MCPP_CHECK_HINT(it != src.end(), "load a checkpoint of this model",
                    "{}: no {} for parameter '{}'", d->iter_dir, what, p.name);
    const Tensor& full = it->second;
    MCPP_CHECK(full.numel() == shape_numel(p.global_shape), "{}: '{}' has {} elements, expected {}",
               d->iter_dir, p.name, full.numel(), shape_numel(p.global_shape));
    const int64_t gcols = p.global_shape.size() > 1 ? full.numel() / p.global_shape[0] : 1;
    const int64_t lcols = p.local_shape.size() > 1 ? p.numel() / p.local_shape[0] : 1;
    const float* x = full.data<float>();
    float* y = dst.data<float>() + p.offset;
    for (const Piece& pc : local_pieces(p, params.tp_rank(), params.tp_size()))
      for (int64_t r = 0; r < pc.rows; ++r)
        std::memcpy(y + (pc.l_row + r) * lcols + pc.l_col, x + (pc.g_row + r) * gcols + pc.g_col,
                    size_t(pc.cols) * sizeof(float));
  };
  for (const auto& p : params.infos()) {
    place(from, p, values, "weights");
    if (load_optim) place(os->exp_avg, p, m, "exp_avg"), place(os->exp_avg_sq, p, v, "exp_avg_sq");
  }
  opt.load_state(values, load_optim ? &m : nullptr, load_optim ? &v : nullptr);
  LegacyLoaded out;
  TrainingState& st = out.state;
  st.iteration = d->iteration == "release" ? 0 : std::stoll(d->iteration);
  st.rng_seed = o.load_rng ? im.config.seed : 0;
  st.rng_iteration = o.load_rng ? st.iteration : 0;
  const OptimizerState& pr = im.progress;  // rank 0's counters and scheduler
  st.consumed_train_samples = pr.consumed_train_samples;
  st.consumed_valid_samples = pr.consumed_valid_samples;
  st.num_floating_point_operations_so_far = pr.flops_so_far;
  if (load_optim) {
    st.optimizer_steps = os->step;
    opt.set_steps(os->step);
    st.grad_scaler = os->grad_scaler;  // fp16: the loss scaler goes on where it was
  }
  out.has_scheduler = pr.has_scheduler;
  if (pr.has_scheduler) st.scheduler = scheduler_state(pr);
  if (o.finetune) {  // weights only, from iteration 0 (the trainer keeps its own counters)
    const auto sched = st.scheduler;
    st = TrainingState{};
    st.scheduler = sched;
  }
  log::info("  read Megatron-LM's legacy checkpoint {} (TP {} x PP {}, {} file(s)){}: {}",
            d->iter_dir, im.source_tp, im.source_pp, d->files.size(),
            load_optim ? fmt::format(", Adam state of step {}", os->step) : "",
            size_and_rate(tree_bytes(d->iter_dir), t.elapsed()));
  return out;
}

}  // namespace mcpp::checkpoint::megatron
