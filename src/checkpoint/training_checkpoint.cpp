#include "checkpoint/training_checkpoint.h"

#include <chrono>
#include <memory>
#include <thread>
#include <filesystem>

#include "base/log.h"
#include "checkpoint/fs.h"
#include "base/timer.h"
#include "ops/ops.h"
#include "parallel/host_collectives.h"

namespace mcpp::checkpoint {

namespace {

Tensor on_host(const Tensor& t) {
  if (!t.defined() || t.device() == Device::CPU) return t;
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

// A deep host copy (the background writer must not see the next step's values).
Tensor host_copy(const Tensor& t) {
  if (!t.defined()) return t;
  Tensor h = Tensor::empty(t.shape(), t.dtype());
  ops::copy(t, h, ops::default_stream(t.device()));
  return h;
}

// Every rank's shard records -> rank 0 commits; the checkpoint is visible to every rank on
// return.
void commit_everywhere(comm::Communicator& world, const std::string& save_dir,
                       const std::string& tmp, const nlohmann::json& recs,
                       const TrainingState& st, const SaveOptions& o) {
  auto all = parallel::all_gather_strings(world, recs.dump());
  if (world.rank() == 0) {
    std::vector<nlohmann::json> parsed;
    for (const auto& r : all)
      for (auto& rec : nlohmann::json::parse(r)) parsed.push_back(rec);
    commit_checkpoint(save_dir, tmp, parsed, st, o);
  }
  world.barrier(ops::default_stream(Device::CPU));
}

void save_distributed(const std::string& save_dir, comm::Communicator& world,
                      const parallel::ParallelState& ps, model::ParamStore& params,
                      optim::Optimizer& opt, bool save_optim, const TrainingState& st,
                      const SaveOptions& o, AsyncSaver* async) {
  opt.wait_params_all();  // the parameters written must be current
  // Under context parallelism the distributed optimizer shards over DP x CP: its shard
  // index is the rank in the dp-cp group (the DP rank at CP 1), and the CP ranks of one
  // DP rank hold the same parameters, so only CP rank 0 writes them. With several
  // distributed-optimizer instances each holds the same shards and only instance 0 writes
  // them: its members come first in the dp-cp list, so their dp-cp rank is their rank in
  // the instance. The dp-cp rank also keeps the fully parallel save's model files of
  // different instances apart.
  const int dp_shard = ps.dp_cp().rank();
  // Expert parallelism: the EP ranks of one DP group hold different experts; each EP rank's
  // expert-DP rank 0 writes them (files named by its EP rank), DP rank 0 the dense rest.
  // ETP != TP likewise: the TP ranks of one EP rank may hold the same whole experts.
  const bool ep = ps.layout().ep() > 1 || ps.layout().etp() != ps.layout().tp();
  RankSnapshot snap =
      snapshot(params, opt, {0, ps.pp_rank(), dp_shard, ps.ep_rank()}, save_optim);
  std::string tmp = world.rank() == 0 ? begin_checkpoint(save_dir, st.iteration, o) : "";
  tmp = parallel::all_gather_strings(world, tmp)[0];
  snap.write_dense = ps.dp_rank() == 0 && ps.cp_rank() == 0;
  snap.write_experts = ep ? ps.coords().edp == 0 : snap.write_dense;
  snap.expert_tp_rank = ps.coords().etp;
  if (o.fully_parallel) {
    // Megatron's fully parallel save: the DP x CP replicas share the dense tensors (and,
    // without EP, the experts), the expert-DP replicas an EP rank's experts.
    snap.write_dense = snap.write_experts = true;
    snap.dense_share = {ps.dp_cp().rank(), ps.dp_cp().size()};
    snap.expert_share =
        ep ? RankSnapshot::Share{ps.expert_dp().rank(), ps.expert_dp().size()} : snap.dense_share;
  }
  const bool write_model = snap.write_dense || snap.write_experts;
  const bool write_shard =
      opt.state_sharded() && save_optim &&
      (ps.layout().dist_opt_instances() == 1 || ps.inter_dist_opt().rank() == 0);
  if (write_shard) snap.optimizer_steps = opt.steps();
  if (async) {
    // Everything the writer reads is copied now: training changes it from the next step.
    auto snap_copy = std::make_shared<RankSnapshot>(snap.clone());
    std::shared_ptr<Tensor> m, v;
    if (write_shard)
      m = std::make_shared<Tensor>(host_copy(opt.exp_avg())),
      v = std::make_shared<Tensor>(host_copy(opt.exp_avg_sq()));
    auto write = [tmp, snap_copy, m, v, write_model, write_shard,
                  segs = opt.segments()]() {
      nlohmann::json recs = nlohmann::json::array();
      if (write_model) recs.push_back(write_rank_files(tmp, *snap_copy));
      if (write_shard) recs.push_back(write_optimizer_shard(tmp, *snap_copy, *m, *v, segs));
      return recs;
    };
    async->start(std::move(write), {save_dir, tmp, st, o});
    return;
  }
  nlohmann::json recs = nlohmann::json::array();
  if (write_model) recs.push_back(write_rank_files(tmp, snap));
  if (write_shard)
    recs.push_back(
        write_optimizer_shard(tmp, snap, opt.exp_avg(), opt.exp_avg_sq(), opt.segments()));
  commit_everywhere(world, save_dir, tmp, recs, st, o);
}

}  // namespace

// The bytes of a checkpoint's iter_* folder (the progress lines' size).
static uint64_t iteration_bytes(const std::string& dir, int64_t iteration) {
  return tree_bytes((std::filesystem::path(dir) / iteration_dir_name(iteration)).string());
}

void save_training_checkpoint(const std::string& save_dir, comm::Communicator& world,
                              const parallel::ParallelState& ps, model::ParamStore& params,
                              optim::Optimizer& opt, bool save_optim, const TrainingState& st,
                              const SaveOptions& o_in, AsyncSaver* async) {
  Timer t;
  t.start();
  SaveOptions o = o_in;
  o.optimizer = opt.state_name();
  if (world.size() > 1 || opt.state_sharded()) {
    // At most one save in flight: the previous one is committed first (collectively).
    if (async) finalize_async_save(world, *async, /*blocking=*/true);
    save_distributed(save_dir, world, ps, params, opt, save_optim, st, o, async);
    if (async) {
      log::info("  scheduled asynchronous save of checkpoint at iteration {:8d} to {} (every "
                "rank writes its files in the background)",
                st.iteration, save_dir);
    } else {
      const double sec = t.elapsed();
      log::info("  successfully saved checkpoint from iteration {:8d} to {} [ t {:.3f} s ]",
                st.iteration, save_dir, sec);
      if (world.rank() == 0)  // ours: how much and how fast
        log::info("  checkpoint written: {}",
                  size_and_rate(iteration_bytes(save_dir, st.iteration), sec));
    }
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

bool finalize_async_save(comm::Communicator& world, AsyncSaver& async, bool blocking) {
  // Every rank has the same saves pending (saves happen at the same iterations).
  if (!async.has_pending()) return true;
  if (blocking) {
    while (async.in_flight()) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  const double done = parallel::sum_over(world, async.in_flight() ? 0.0 : 1.0);
  if (done < double(world.size())) return false;
  std::string error;
  auto [recs, c] = async.take(error);
  // A failed write anywhere fails the save everywhere, before anything is committed.
  const auto errors = parallel::all_gather_strings(world, error);
  for (size_t r = 0; r < errors.size(); ++r)
    if (!errors[r].empty())
      throw Error(fmt::format("asynchronous save of iteration {} to {} failed on rank {}: {}",
                              c.st.iteration, c.save_dir, r, errors[r]),
                  "the previous checkpoint is intact; check the disk (space, permissions) "
                  "and restart from it");
  commit_everywhere(world, c.save_dir, c.tmp_dir, recs, c.st, c.opts);
  log::info("  successfully saved checkpoint from iteration {:8d} to {} (asynchronously)",
            c.st.iteration, c.save_dir);
  return true;
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
  // (rounded into bf16/f16 model params), on any device. The moments in their own dtype
  // (bf16 under --use-precision-aware-optimizer): a checkpoint's fp32 moments are rounded
  // into bf16 ones, bf16 ones widened exactly into fp32 ones.
  const DType hd = params.flat_params().dtype() == DType::F64 ? DType::F64 : DType::F32;
  const int64_t total = params.total_numel();
  Tensor values = Tensor::zeros({total}, hd), m, v;
  // The rule's moments (SGD and Lion: exp_avg alone).
  const bool second = opt.exp_avg_sq().defined();
  if (load_optim) m = Tensor::zeros({total}, opt.exp_avg().dtype());
  if (load_optim && second) v = Tensor::zeros({total}, opt.exp_avg_sq().dtype());
  // Parameters the checkpoint may lack (--dist-ckpt-strictness) keep their initial values:
  // the live ones as the starting point (their moments stay zero).
  if (unexpected_action(o.strictness) != KeyAction::Raise) {
    const Tensor main = opt.full_main_params();  // collective over DP when sharded
    const Tensor& live = main.defined() ? main : params.flat_params();
    ops::copy(live, values, ops::default_stream(live.device()));
  }
  Timer t;
  t.start();
  LoadOptions lo = o;
  LoadOptions::Report rep;
  lo.report = &rep;
  lo.optimizer = opt.state_name();
  const Tensor* vp = load_optim && second ? &v : nullptr;
  TrainingState st =
      load_checkpoint_host(load_dir, iteration, params, values, load_optim ? &m : nullptr, vp, lo);
  log::info("  checkpoint read (iteration {}): {}",  // ours: how much and how fast
            st.iteration, size_and_rate(iteration_bytes(load_dir, st.iteration), t.elapsed()));
  // What each rank read itself (tensor data, without headers and metadata).
  if (o.replicas && o.replicas->size() > 1)
    log::info_all("  fully parallel load: read {} bytes of tensor data from storage ({} of {} "
                  "tensors), received {} bytes from the other ranks of group {} ({} ranks)",
                  rep.bytes_read, rep.tensors_read, rep.tensors, rep.bytes_received,
                  o.replicas->name(), o.replicas->size());
  else
    log::info_all("  read {} bytes of tensor data from storage ({} tensors)", rep.bytes_read,
                  rep.tensors);
  opt.load_state(values, load_optim ? &m : nullptr, vp);
  if (load_optim) opt.set_steps(st.optimizer_steps);
  return st;
}

}  // namespace mcpp::checkpoint
