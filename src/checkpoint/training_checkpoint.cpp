#include "checkpoint/training_checkpoint.h"

#include <filesystem>

#include "base/log.h"
#include "checkpoint/fs.h"
#include "base/timer.h"
#include "ops/ops.h"
#include "parallel/host_collectives.h"

namespace mcpp::checkpoint {

namespace {

Tensor on_host(const Tensor& t) {
  if (t.device() == Device::CPU) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  ops::copy(t, h, ops::default_stream(t.device()));
  return h;
}

// This rank's snapshot: the values to save (the optimizer's main parameters when it has
// them, else the model's), and the moments when they are laid out like the parameters.
// Collective over DP for an optimizer with sharded state (its main parameters are
// gathered).
RankSnapshot snapshot(model::ParamStore& params, optim::Optimizer& opt, RankCoord coord,
                      bool moments) {
  RankSnapshot s = RankSnapshot::view(params, nullptr, coord, false);
  const Tensor main = opt.full_main_params();
  if (main.defined()) {
    s.params = Tensor::empty(main.shape(), main.dtype());
    ops::copy(main, s.params, ops::default_stream(main.device()));
  }
  if (moments && !opt.state_sharded()) {
    s.exp_avg = on_host(opt.exp_avg()), s.exp_avg_sq = on_host(opt.exp_avg_sq());
    s.optimizer_steps = opt.steps();
  }
  return s;
}

void save_distributed(const std::string& save_dir, comm::Communicator& world,
                      const parallel::ParallelState& ps, model::ParamStore& params,
                      optim::Optimizer& opt, bool save_optim, const TrainingState& st,
                      const SaveOptions& o) {
  Stream& cpu = ops::default_stream(Device::CPU);
  opt.wait_params_all();  // the parameters written must be current
  RankSnapshot snap = snapshot(params, opt, {0, ps.pp_rank(), ps.dp_rank(), 0}, save_optim);
  std::string tmp = world.rank() == 0 ? begin_checkpoint(save_dir, st.iteration, o) : "";
  tmp = parallel::all_gather_strings(world, tmp)[0];
  nlohmann::json recs = nlohmann::json::array();
  if (ps.dp_rank() == 0) recs.push_back(write_rank_files(tmp, snap));
  if (opt.state_sharded() && save_optim) {
    snap.optimizer_steps = opt.steps();
    recs.push_back(
        write_optimizer_shard(tmp, snap, opt.exp_avg(), opt.exp_avg_sq(), opt.segments()));
  }
  auto all = parallel::all_gather_strings(world, recs.dump());
  if (world.rank() == 0) {
    std::vector<nlohmann::json> parsed;
    for (const auto& r : all)
      for (auto& rec : nlohmann::json::parse(r)) parsed.push_back(rec);
    commit_checkpoint(save_dir, tmp, parsed, st, o);
  }
  world.barrier(cpu);  // the checkpoint is visible to every rank when save returns
}

}  // namespace

// The bytes of a checkpoint's iter_* folder (the progress lines' size).
static uint64_t iteration_bytes(const std::string& dir, int64_t iteration) {
  return tree_bytes((std::filesystem::path(dir) / iteration_dir_name(iteration)).string());
}

void save_training_checkpoint(const std::string& save_dir, comm::Communicator& world,
                              const parallel::ParallelState& ps, model::ParamStore& params,
                              optim::Optimizer& opt, bool save_optim, const TrainingState& st,
                              const SaveOptions& o, AsyncSaver* async) {
  Timer t;
  t.start();
  if (world.size() > 1 || opt.state_sharded()) {
    save_distributed(save_dir, world, ps, params, opt, save_optim, st, o);
    const double sec = t.elapsed();
    log::info("  successfully saved checkpoint from iteration {:8d} to {} [ t {:.3f} s ]",
              st.iteration, save_dir, sec);
    if (world.rank() == 0)  // ours: how much and how fast
      log::info("  checkpoint written: {}", size_and_rate(iteration_bytes(save_dir, st.iteration), sec));
    return;
  }
  // fp32 main params (bf16/f16 models) and, unless --no-save-optim, the moments; a GPU's
  // buffers are copied to the host here.
  const RankSnapshot snap = snapshot(params, opt, {}, save_optim);
  const std::span<const RankSnapshot> one(&snap, 1);
  if (async) {
    async->save(save_dir, one, st, o);
    log::info("  scheduled asynchronous save of checkpoint at iteration {:8d} to {}", st.iteration,
              save_dir);
  } else {
    save_checkpoint(save_dir, one, st, o);
    const double sec = t.elapsed();
    log::info("  successfully saved checkpoint from iteration {:8d} to {} [ t {:.3f} s ]",
              st.iteration, save_dir, sec);
    log::info("  checkpoint written: {}", size_and_rate(iteration_bytes(save_dir, st.iteration), sec));
  }
}

std::optional<TrainingState> load_training_checkpoint(const std::string& load_dir,
                                                      std::optional<int64_t> iteration,
                                                      model::ParamStore& params,
                                                      optim::Optimizer& opt, bool load_optim,
                                                      const LoadOptions& o) {
  if (!latest_iteration(load_dir) && !iteration) {
    log::warn("could not find a checkpoint in --load {}; starting from random initialisation",
              load_dir);
    return std::nullopt;
  }
  // Through host buffers in the optimizer's dtype (fp32; f64 for f64 models), laid out
  // like the parameters: the checkpoint's values go exactly into the fp32 main params
  // (rounded into bf16/f16 model params), on any device.
  const DType hd = params.flat_params().dtype() == DType::F64 ? DType::F64 : DType::F32;
  const int64_t total = params.total_numel();
  Tensor values = Tensor::zeros({total}, hd), m, v;
  if (load_optim) m = Tensor::zeros({total}, hd), v = Tensor::zeros({total}, hd);
  Timer t;
  t.start();
  TrainingState st = load_checkpoint_host(load_dir, iteration, params, values,
                                          load_optim ? &m : nullptr, load_optim ? &v : nullptr, o);
  log::info("  checkpoint read (iteration {}): {}",  // ours: how much and how fast
            st.iteration, size_and_rate(iteration_bytes(load_dir, st.iteration), t.elapsed()));
  opt.load_state(values, load_optim ? &m : nullptr, load_optim ? &v : nullptr);
  if (load_optim) opt.set_steps(st.optimizer_steps);
  return st;
}

}  // namespace mcpp::checkpoint
