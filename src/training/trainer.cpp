#include "training/trainer.h"

#include <omp.h>

#include <cblas.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cmath>
#include <map>
#include <numeric>

#include "base/log.h"
#include "base/timer.h"
#include "checkpoint/async_saver.h"
#include "checkpoint/checkpoint.h"
#include "comm/world.h"
#include "data/dataset_builder.h"
#include "data/tokenizers/tokenizer.h"
#include "model/gpt_model.h"
#include "ops/ops.h"
#include "optim/lr_scheduler.h"
#include "optim/distributed_optimizer.h"
#include "optim/loss_scaler.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/grad_buffer.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/schedule.h"
#include "training/flops.h"
#include "training/log_line.h"
#include "training/memory_plan.h"
#ifdef MCPP_HAVE_CUDA
#include "ops/cuda/device.h"
#endif

namespace mcpp::training {

std::unique_ptr<data::Tokenizer> build_tokenizer(const Args& a) {
  data::TokenizerArgs t;
  t.type = a.tokenizer_type, t.vocab_size = a.vocab_size;
  t.vocab_file = a.vocab_file.value_or(""), t.merge_file = a.merge_file.value_or("");
  t.tokenizer_model = a.tokenizer_model.value_or("");
  t.tiktoken_pattern = a.tiktoken_pattern.value_or("");
  t.tiktoken_num_special_tokens = a.tiktoken_num_special_tokens;
  t.special_tokens = a.special_tokens, t.vocab_extra_ids = a.vocab_extra_ids;
  return data::make_tokenizer(t);
}

namespace {

// --device: cpu, cuda, or auto (CUDA when this build has it and a GPU is visible).
Device resolve_device(const Args& a) {
  if (a.device == "cpu") return Device::CPU;
#ifdef MCPP_HAVE_CUDA
  if (a.device == "cuda") return Device::CUDA;
  return ops::cuda::device_available() ? Device::CUDA : Device::CPU;
#else
  MCPP_CHECK_HINT(a.device != "cuda",
                  "rebuild where nvcc is found (CMake prints 'megatron.cpp: CUDA: yes'), or "
                  "train with --device cpu",
                  "--device cuda: this build has no CUDA backend");
  return Device::CPU;
#endif
}

// The model's dtype: --bf16 / --fp16 (GPU only), else fp32.
DType model_dtype(const Args& a) { return a.bf16 ? DType::BF16 : a.fp16 ? DType::F16 : DType::F32; }

// Flags the trainer cannot honour yet are errors here, never silently ignored.
void reject_unsupported(const Args& a, Device dev) {
  auto no = [](bool cond, const char* flag, const char* hint) {
    MCPP_CHECK_HINT(!cond, hint, "{} is not supported by megatron.cpp's trainer yet", flag);
  };
  no((a.bf16 || a.fp16) && dev == Device::CPU, "--bf16/--fp16 on the CPU backend",
     "the CPU backend trains in fp32: drop the flag, or train on a GPU (--device cuda)");
  no(a.reset_position_ids, "--reset-position-ids", "drop the flag");
  no(a.reset_attention_mask, "--reset-attention-mask", "drop the flag");
  MCPP_CHECK_HINT(!a.save_interval || a.save, "add --save DIR",
                  "--save-interval {} given without --save", *a.save_interval);
  MCPP_CHECK_HINT(!a.save_interval || *a.save_interval > 0, "use a positive interval",
                  "--save-interval must be positive, got {}", *a.save_interval);
  no(a.async_save && a.world_size > 1, "--async-save with more than one process",
     "drop --async-save under mpirun/srun for now (synchronous saves work)");
}

std::atomic<bool> g_exit_signal{false};
extern "C" void on_exit_signal(int) { g_exit_signal.store(true); }

}  // namespace

struct Trainer::State {
  // Declared first, destroyed last: every communicator outlives its users.
  std::unique_ptr<comm::World> world;
  std::unique_ptr<parallel::ParallelState> ps;
  // Pipeline parallelism: a second communicator over each pipeline group, for gradients
  // (activations use ps->pp()), and this stage's action lists.
  std::unique_ptr<comm::Communicator> pp_grads;
  parallel::pipeline::ScheduleKind schedule_kind = parallel::pipeline::ScheduleKind::OneFOneB;
  StageMemory plan;  // predicted at start-up
  parallel::pipeline::Schedule schedule;            // [stage][action], training step
  std::vector<parallel::pipeline::Action> forward_only;  // this stage, evaluation
  Args args;
  std::unique_ptr<data::Tokenizer> tok;
  std::unique_ptr<model::GPTModel> model;
  std::unique_ptr<optim::AdamW> opt;                    // without --use-distributed-optimizer
  std::unique_ptr<parallel::DataParallelGrads> dp_grads;
  std::unique_ptr<optim::DistributedAdamW> dist_opt;    // with it
  std::unique_ptr<optim::OptimizerParamScheduler> sched;
  std::unique_ptr<optim::LossScaler> scaler;            // --fp16
  Device device = Device::CPU;                          // --device, resolved
  bool report_memory = true;                            // Megatron's memory line, once
  std::array<std::shared_ptr<data::GPTSampleSource>, 3> datasets;
  int64_t consumed_train = 0, consumed_valid = 0;
  int64_t skipped_iters = 0, nan_iters = 0;
  Timers timers;
  data::GPTSample sample;
  int64_t iteration = 0;
  double flops_so_far = 0;
  std::unique_ptr<checkpoint::AsyncSaver> async_saver;
  model::TransformerConfig model_cfg;

  checkpoint::TrainingState training_state() const {
    checkpoint::TrainingState st;
    st.iteration = iteration;
    st.consumed_train_samples = consumed_train, st.consumed_valid_samples = consumed_valid;
    st.scheduler = sched->state();
    st.optimizer_steps = dist_opt ? dist_opt->steps() : opt->steps();
    st.rng_seed = uint64_t(args.seed), st.rng_iteration = iteration;
    st.num_floating_point_operations_so_far = flops_so_far;
    st.data_loader = {{"consumed_train_samples", consumed_train},
                      {"consumed_valid_samples", consumed_valid}};
    if (scaler) {
      const auto ls = scaler->state();
      st.grad_scaler = {{"scale", ls.scale},
                        {"growth_tracker", ls.growth_tracker},
                        {"hysteresis_tracker", ls.hysteresis_tracker}};
    }
    nlohmann::json cfg = nlohmann::json::object();
    for (const auto& [k, v] : args.given) cfg[k] = v;
    st.config = cfg;
    return st;
  }

  // Sum of one number over the data-parallel group.
  double dp_sum(double v) {
    if (ps->dp().size() == 1) return v;
    Tensor t = Tensor::empty({1}, DType::F64);
    t.data<double>()[0] = v;
    ps->dp().all_reduce(t, comm::ReduceOp::Sum, ops::default_stream(Device::CPU));
    return t.data<double>()[0];
  }

  // Strings between ranks: every rank's `mine` gathered on all (lengths first, then the
  // bytes padded to the longest), over the world communicator.
  std::vector<std::string> all_gather_strings(const std::string& mine) {
    comm::Communicator& w = world->world();
    Stream& st = ops::default_stream(Device::CPU);
    const int n = w.size();
    Tensor len = Tensor::empty({1}, DType::I64), lens = Tensor::empty({n}, DType::I64);
    len.data<int64_t>()[0] = int64_t(mine.size());
    w.all_gather(len, lens, st);
    int64_t longest = 1;
    for (int r = 0; r < n; ++r) longest = std::max(longest, lens.data<int64_t>()[r]);
    Tensor buf = Tensor::zeros({longest}, DType::U8), all = Tensor::empty({n * longest}, DType::U8);
    std::copy(mine.begin(), mine.end(), buf.data<uint8_t>());
    w.all_gather(buf, all, st);
    std::vector<std::string> out(n);
    for (int r = 0; r < n; ++r) {
      const char* p = reinterpret_cast<const char*>(all.data<uint8_t>()) + r * longest;
      out[r].assign(p, size_t(lens.data<int64_t>()[r]));
    }
    return out;
  }

  // Every rank of a multi-process run: the ranks of DP rank 0 write their TP shard of the
  // model (and, without the distributed optimizer, of the Adam moments); with it, every
  // rank writes its DP shard of the moments. Rank 0 starts the checkpoint, gathers the
  // shard records (JSON strings) and commits it.
  void save_distributed(const checkpoint::SaveOptions& o) {
    const Args& a = args;
    comm::Communicator& w = world->world();
    Stream& st = ops::default_stream(Device::CPU);
    if (dist_opt) dist_opt->wait_params_all();  // the parameters written must be current
    checkpoint::RankSnapshot snap = checkpoint::RankSnapshot::view(
        model->params(), dist_opt ? nullptr : opt.get(), {0, ps->pp_rank(), ps->dp_rank(), 0},
        !a.no_save_optim);
    const Tensor& flat = model->params().flat_params();
    if (dist_opt && flat.dtype() != DType::F32 && flat.dtype() != DType::F64) {
      // bf16/f16: the fp32 main params are sharded over DP; gather them (every rank).
      Tensor full = dist_opt->gather_main_params();
      if (ps->dp_rank() == 0) {
        snap.params = Tensor::empty(full.shape(), full.dtype());
        ops::copy(full, snap.params, ops::default_stream(full.device()));
      }
    }
    std::string tmp = w.rank() == 0 ? checkpoint::begin_checkpoint(*a.save, iteration, o) : "";
    tmp = all_gather_strings(tmp)[0];
    nlohmann::json recs = nlohmann::json::array();
    if (ps->dp_rank() == 0) recs.push_back(checkpoint::write_rank_files(tmp, snap));
    if (dist_opt && !a.no_save_optim) {
      snap.optimizer_steps = dist_opt->steps();
      std::vector<checkpoint::ShardSegment> segs;
      for (const auto& sg : dist_opt->segments()) segs.push_back({sg.param, sg.flat, sg.shard, sg.len});
      recs.push_back(checkpoint::write_optimizer_shard(tmp, snap, dist_opt->exp_avg(),
                                                       dist_opt->exp_avg_sq(), segs));
    }
    auto all = all_gather_strings(recs.dump());
    if (w.rank() == 0) {
      std::vector<nlohmann::json> parsed;
      for (const auto& r : all)
        for (auto& rec : nlohmann::json::parse(r)) parsed.push_back(rec);
      checkpoint::commit_checkpoint(*a.save, tmp, parsed, training_state(), o);
    }
    w.barrier(st);  // the checkpoint is visible to every rank when save() returns
  }

  void save() {
    const Args& a = args;
    checkpoint::SaveOptions o;
    o.model = model_cfg, o.save_rng = !a.no_save_rng;
    Timer t;
    t.start();
    if (world->size() > 1 || dist_opt) {
      save_distributed(o);
      log::info("  successfully saved checkpoint from iteration {:8d} to {} [ t {:.3f} s ]",
                iteration, *a.save, t.elapsed());
      return;
    }
    // fp32 main params (bf16/f16 models) and, unless --no-save-optim, the moments; a GPU's
    // buffers are copied to the host here.
    const auto snap = checkpoint::RankSnapshot::view(model->params(), opt.get(), {}, !a.no_save_optim);
    const std::span<const checkpoint::RankSnapshot> one(&snap, 1);
    if (async_saver) {
      async_saver->save(*a.save, one, training_state(), o);
      log::info("  scheduled asynchronous save of checkpoint at iteration {:8d} to {}", iteration,
                *a.save);
    } else {
      checkpoint::save_checkpoint(*a.save, one, training_state(), o);
      log::info("  successfully saved checkpoint from iteration {:8d} to {} [ t {:.3f} s ]",
                iteration, *a.save, t.elapsed());
    }
  }

  void load() {
    const Args& a = args;
    auto latest = checkpoint::latest_iteration(*a.load);
    if (!latest && !a.ckpt_step) {
      log::warn("could not find a checkpoint in --load {}; starting from random initialisation",
                *a.load);
      return;
    }
    checkpoint::LoadOptions o;
    o.model = model_cfg, o.load_rng = !a.no_load_rng, o.finetune = a.finetune;
    o.partial_model = a.pipeline_model_parallel_size > 1;
    const bool load_optim = !(a.no_load_optim || a.finetune);
    // Through host buffers in the optimizer's dtype (fp32; f64 for f64 models), laid out
    // like the parameters: the checkpoint's values go exactly into the fp32 main params
    // (rounded into bf16/f16 model params), on any device; the distributed optimizer
    // keeps its shard of the whole moments.
    auto& P = model->params();
    const DType hd = P.flat_params().dtype() == DType::F64 ? DType::F64 : DType::F32;
    Tensor values = Tensor::zeros({P.total_numel()}, hd), m, v;
    if (load_optim) m = Tensor::zeros({P.total_numel()}, hd), v = Tensor::zeros({P.total_numel()}, hd);
    auto st = checkpoint::load_checkpoint_host(*a.load, a.ckpt_step, P, values,
                                               load_optim ? &m : nullptr, load_optim ? &v : nullptr, o);
    Stream& dst = ops::default_stream(device);
    if (dist_opt) {
      ops::copy(values, P.flat_params(), dst);
      dist_opt->reload_main_params(values);
      if (load_optim) dist_opt->scatter_state(m, v);
    } else {
      opt->set_params(values);
      if (load_optim) ops::copy(m, opt->exp_avg(), dst), ops::copy(v, opt->exp_avg_sq(), dst);
    }
    if (scaler && !st.grad_scaler.empty())
      scaler->load_state({st.grad_scaler.at("scale").get<double>(),
                          st.grad_scaler.at("growth_tracker").get<int64_t>(),
                          st.grad_scaler.at("hysteresis_tracker").get<int64_t>()});
    if (!a.finetune) {
      iteration = st.iteration;
      consumed_train = st.consumed_train_samples, consumed_valid = st.consumed_valid_samples;
      flops_so_far = st.num_floating_point_operations_so_far;
      if (load_optim && dist_opt) dist_opt->set_steps(st.optimizer_steps);
      else if (load_optim) opt->set_steps(st.optimizer_steps);
      auto policy = a.override_opt_param_scheduler      ? optim::SchedulerLoadPolicy::OverrideFromArgs
                    : a.use_checkpoint_opt_param_scheduler ? optim::SchedulerLoadPolicy::UseCheckpoint
                                                           : optim::SchedulerLoadPolicy::RequireMatch;
      sched->load_state(st.scheduler, policy);
    }
    log::info("  successfully loaded checkpoint from {} [ iteration {} ]{}", *a.load,
              st.iteration, a.finetune ? " for finetuning (counters reset)" : "");
  }

  // The micro-batch j of this rank at consumed-sample offset `base` (Megatron's
  // pretraining sampler: global batch [base, base+gbs), chunks of mbs*DP, rank slice).
  model::MicroBatch load(const data::GPTSampleSource& ds, int64_t base, int64_t j,
                         int64_t& sample_offset) {
    const int64_t mbs = args.micro_batch_size, S = args.seq_length, dp = args.data_parallel_size;
    const int64_t dp_rank = ps->dp_rank();
    sample_offset = j * mbs * dp + dp_rank * mbs;
    model::MicroBatch mb;
    mb.tokens = Tensor::empty({mbs, S}, DType::I64);
    mb.labels = Tensor::empty({mbs, S}, DType::I64);
    mb.loss_mask = Tensor::empty({mbs, S}, DType::F32);
    for (int64_t b = 0; b < mbs; ++b) {
      const int64_t idx = (base + sample_offset + b) % ds.size();
      ds.get(idx, sample);
      MCPP_CHECK(int64_t(sample.tokens.size()) == S, "dataset returned {} tokens, expected {}",
                 sample.tokens.size(), S);
      std::copy(sample.tokens.begin(), sample.tokens.end(), mb.tokens.data<int64_t>() + b * S);
      std::copy(sample.labels.begin(), sample.labels.end(), mb.labels.data<int64_t>() + b * S);
      std::copy(sample.loss_mask.begin(), sample.loss_mask.end(),
                mb.loss_mask.data<float>() + b * S);
    }
    return mb;
  }

  // One global batch: forward (+ backward when training) over every micro-batch.
  // Returns {sum of masked token losses, number of masked tokens}.
  std::pair<double, double> run_batch(const data::GPTSampleSource& ds, int64_t base,
                                      int64_t iteration, bool training) {
    const int64_t M = args.num_microbatches;
    std::vector<model::MicroBatch> mbs(M);
    std::vector<int64_t> offsets(M);
    double tokens = 0;
    for (int64_t j = 0; j < M; ++j) {
      mbs[j] = load(ds, base, j, offsets[j]);
      const float* m = mbs[j].loss_mask.data<float>();
      for (int64_t i = 0; i < mbs[j].loss_mask.numel(); ++i) tokens += m[i];
    }
    // Loss = sum of masked token losses / masked tokens of the whole global batch
    // (ARCHITECTURE.md), so every split of the batch trains the same function: the
    // token count is summed over DP before any backward, and gradients are summed.
    tokens = dp_sum(tokens);
    // fp16: the loss scale multiplies the loss (and so every gradient) before backward.
    const double grad_scale = tokens > 0 ? (scaler ? scaler->scale() : 1.0) / tokens : 0.0;
    double loss_sum = 0;
    model::StepKeys keys;
    keys.iteration = iteration, keys.global_batch = args.global_batch_size;
    keys.training = training;
    if (args.pipeline_model_parallel_size > 1) {
      loss_sum = run_pipeline(mbs, offsets, keys, grad_scale, training);
      return {dp_sum(loss_sum), tokens};
    }
    for (int64_t j = 0; j < M; ++j) {
      keys.sample_offset = offsets[j];
      loss_sum += model->forward(mbs[j], keys);
      if (!training) continue;
      if (j == M - 1 && dp_grads) dp_grads->begin_final_backward();
      model->backward(grad_scale);
    }
    return {dp_sum(loss_sum), tokens};
  }

  // One global batch through this pipeline stage: the schedule's actions (forward-only
  // for evaluation), then the loss (held by the last stage) summed over the pipeline.
  double run_pipeline(const std::vector<model::MicroBatch>& mbs,
                      const std::vector<int64_t>& offsets, model::StepKeys keys,
                      double grad_scale, bool training) {
    namespace pl = parallel::pipeline;
    const int M = int(mbs.size());
    double loss_sum = 0;
    pl::StageCallbacks cb;
    cb.forward = [&](int m, int c, const Tensor& in) {
      keys.sample_offset = offsets[size_t(m)];
      auto r = model->forward_chunk(c, m, mbs[size_t(m)], keys, in);
      if (!training) model->drop_chunk(c, m);
      loss_sum += r.loss;
      return r.output;
    };
    cb.backward = [&](int m, int c, const Tensor& g) {
      return model->backward_chunk(c, m, g, grad_scale, /*final=*/m == M - 1);
    };
    // Gradient hooks fire only in each chunk's last backward (final above).
    if (training && dp_grads) dp_grads->begin_final_backward();
    const auto& c = model_cfg;
    pl::ExecutorOptions o;
    o.activation_shape = {c.seq_local() * args.micro_batch_size, c.hidden_size};
    o.dtype = c.dtype, o.device = c.device;
    Stream& st = ops::default_stream(c.device);
    const auto& actions = training ? schedule[size_t(ps->pp_rank())] : forward_only;
    pl::run_stage(actions, ps->pp(), *pp_grads, o, cb, st);
    Tensor t = Tensor::empty({1}, DType::F64);
    t.data<double>()[0] = loss_sum;
    ps->pp().all_reduce(t, comm::ReduceOp::Sum, ops::default_stream(Device::CPU));
    return t.data<double>()[0];
  }

  // --timing-log-level >= 1: Megatron's timers, which synchronise the device at start
  // and stop so that GPU time is measured, not launch time (this costs the host's run-
  // ahead at each section boundary; the default level 0 adds no synchronisation).
  void timed_section(const std::string& name, bool start) {
    if (args.timing_log_level < 1) return;
#ifdef MCPP_HAVE_CUDA
    if (device == Device::CUDA) ops::cuda::synchronize(ops::cuda::default_stream());
#endif
    if (start) timers(name).start();
    else timers(name).stop();
  }

  // Megatron's finalize_model_grads + get_grad_norm: gradients summed over DP (buckets;
  // reduce-scatter with the distributed optimizer), sequence-parallel partial gradients
  // summed over TP, and the squared global norm, counting TP-duplicated parameters once.
  double reduce_grads() {
    Stream& st = ops::default_stream(device);
    const bool pipelined = args.pipeline_model_parallel_size > 1;
    if (pipelined) {
      // Megatron's _allreduce_word_embedding_grads: the tied embedding's two copies (first
      // and last stage) get the sum of both gradients -- before the data-parallel
      // reduction, which with the distributed optimizer leaves only shards.
      if (!args.untie_embeddings_and_output_weights && ps->has(parallel::Group::Embedding) &&
          ps->embedding().size() > 1) {
        Tensor g = model->params().grad("embedding.word_embeddings.weight");
        ps->embedding().all_reduce(g, comm::ReduceOp::Sum, st);
      }
      if (args.overlap_grad_reduce) dp_grads->layer_ready(-1, st);
    }
    // grads-reduce: the part of the data-parallel reduction that backward did not hide
    // (all of it without --overlap-grad-reduce): the exposed communication time.
    timed_section("grads-reduce", true);
    dp_grads->finish(st);
    timed_section("grads-reduce", false);
    auto& P = model->params();
    const int tp_rank = ps->tp_rank();
    auto counted = [&](size_t i) {
      return (tp_rank == 0 || !model->tp_duplicated(i)) && !model->pipeline_duplicate(i);
    };
    double sq = 0;
    if (dist_opt) {
      if (model_cfg.sp()) dist_opt->all_reduce_grads(ps->tp(), [&](size_t i) {
          return model->sp_partial_grad(i);
        });
      if (scaler) dist_opt->scale_grads(scaler->inv_scale());
      sq = dist_opt->grad_sq_norm(counted);
    } else {
      model->finalize_tp_grads();
      // fp16: unscale before the norm (Megatron's _unscale_main_grads_and_check_for_nan);
      // an overflow shows as a non-finite norm, summed over the ranks below.
      if (scaler) ops::scale(P.flat_grads(), scaler->inv_scale(), st);
      if (ps->tp().size() == 1 && !pipelined) {
        sq = opt->grad_sq_norm();
      } else {
        // One reduction per run of counted parameters (each reads a value back to the
        // host); the padding between parameters holds zeros, so a run may span it.
        int64_t begin = -1, end = -1;
        auto flush = [&] {
          if (begin >= 0) sq += ops::sum_squares(P.flat_grads().narrow(begin, end - begin), st);
          begin = -1;
        };
        for (size_t i = 0; i < P.infos().size(); ++i) {
          if (!counted(i)) {
            flush();
            continue;
          }
          if (begin < 0) begin = P.infos()[i].offset;
          end = P.infos()[i].offset + P.infos()[i].numel();
        }
        flush();
      }
    }
    // Sum over the ranks holding distinct gradients: TP (x DP with sharded gradients)
    // (x PP: every stage holds other layers).
    comm::Communicator& g = dist_opt ? (pipelined ? world->world() : ps->group(parallel::Group::TP_DP))
                                     : (pipelined ? ps->mp() : ps->tp());
    if (g.size() > 1) {
      Tensor t = Tensor::empty({1}, DType::F64);
      t.data<double>()[0] = sq;
      g.all_reduce(t, comm::ReduceOp::Sum, Stream::cpu());
      sq = t.data<double>()[0];
    }
    return sq;
  }

  double evaluate(int split, int64_t& consumed) {
    const auto& ds = datasets[split];
    double loss = 0, tokens = 0;
    for (int64_t k = 0; k < args.eval_iters; ++k) {
      auto [l, t] = run_batch(*ds, consumed, 0, false);
      loss += l, tokens += t;
      consumed += args.global_batch_size;
    }
    return tokens > 0 ? loss / tokens : 0.0;
  }

  // Debug log (--logging-level 10): calls and bytes per iteration of every group and
  // operation since the last log line -- the volumes the planner's cost model predicts.
  std::map<std::string, comm::CommStats> comm_seen;
  void log_comm_volumes(int64_t iters) {
    std::vector<std::pair<std::string, comm::Communicator*>> groups = {
        {"tp", &ps->tp()}, {"dp", &ps->dp()}, {"tp-dp", &ps->group(parallel::Group::TP_DP)}};
    for (auto& [name, c] : groups) {
      const comm::CommStats now = c->stats();
      comm::CommStats& before = comm_seen[name];
      for (int k = 0; k < comm::kNumOpKinds; ++k) {
        const uint64_t calls = now.calls[k] - before.calls[k], bytes = now.bytes[k] - before.bytes[k];
        if (calls == 0) continue;
        log::debug("comm per iteration, group '{}' ({} ranks): {} {} calls {} bytes", name,
                   c->size(), comm::op_name(comm::OpKind(k)), calls / uint64_t(iters),
                   bytes / uint64_t(iters));
      }
      before = now;
    }
  }

  // Megatron's report_memory line, once after the first log line, on the ranks of DP rank 0:
  // bytes of live tensors (allocated) and of the caching pool (reserved), and their peaks.
  void log_memory(int64_t iteration) {
    report_memory = false;
#ifdef MCPP_HAVE_CUDA
    if (ps->dp_rank() != 0) return;
    const auto m = ops::cuda::memory_stats();
    auto mb = [](size_t b) {  // Python's str() of a float
      const double v = double(b) / 1048576.0;
      std::string t = fmt::format("{}", v);
      return t.find_first_of(".e") == std::string::npos ? t + ".0" : t;
    };
    const std::string line = fmt::format(
        "(after {} iterations) memory (MB) | allocated: {} | max allocated: {} | reserved: {} | "
        "max reserved: {}",
        iteration, mb(m.in_use), mb(m.peak), mb(m.reserved), mb(m.reserved_peak));
    if (world->size() > 1) log::info_all("{}", line);  // the logger prefixes "[rank r]"
    else log::info("[Rank 0] {}", line);
#endif
  }

  void print_validation(const std::string& where, double loss) {
    std::string line = format_validation_line(where, {{"lm loss", loss}});
    std::string rule = validation_rule(line);
    log::info("{}\n{}\n{}", rule, line, rule);
  }
};

Trainer::Trainer(Args args) : s_(std::make_unique<State>()) {
  auto& s = *s_;
  s.args = std::move(args);
  Args& a = s.args;
  s.device = resolve_device(a);
  s.world = comm::init({.timeout = std::chrono::minutes(a.distributed_timeout_minutes),
                        .device = s.device,
                        .nccl_configs = a.nccl_communicator_config_path
                                            ? comm::read_nccl_config(*a.nccl_communicator_config_path)
                                            : comm::NcclConfigs{}});
  validate_args(a, s.world->size());
  if (a.nccl_communicator_config_path && s.world->device() != Device::CUDA)
    log::warn("--nccl-communicator-config-path: this run has no NCCL groups ({} on {}); the "
              "file was read and checked but applies to GPU runs only",
              s.world->backend(), s.device == Device::CUDA ? "cuda" : "cpu");
  if (a.logging_level)  // Python's logging levels
    log::set_level(*a.logging_level <= 10   ? log::Level::Debug
                   : *a.logging_level <= 20 ? log::Level::Info
                   : *a.logging_level <= 30 ? log::Level::Warn
                                            : log::Level::Error);
  reject_unsupported(a, s.device);
  parallel::ParallelSizes sizes;
  sizes.tp = int(a.tensor_model_parallel_size), sizes.pp = int(a.pipeline_model_parallel_size);
  sizes.tp_pp_dp_mapping = a.use_tp_pp_dp_mapping;
  sizes.untie_embeddings = a.untie_embeddings_and_output_weights;
  s.ps = std::make_unique<parallel::ParallelState>(*s.world, sizes);
  if (a.threads > 0) {
    omp_set_num_threads(int(a.threads));
  }
  // BLAS runs between OpenMP regions: give it the same cores.
  openblas_set_num_threads(omp_get_max_threads());

  s.tok = build_tokenizer(a);
  const int64_t vocab = s.tok->vocab_size();
  a.padded_vocab_size = padded_vocab_size(vocab, a.make_vocab_size_divisible_by,
                                          a.tensor_model_parallel_size);
  print_args(a);
  for (const auto& line : describe_by_design_flags(a)) log::info("{}", line);
  log::info("{}", padded_vocab_message(vocab, *a.padded_vocab_size));
  log::info("setting number of microbatches to constant {}", a.num_microbatches);
  log::info("CPU threads: {} (OpenMP), BLAS {}", omp_get_max_threads(), openblas_get_num_threads());

  s.model_cfg = model_config(a, s.device, model_dtype(a));
  log::info("> device: {}{}, parameters and activations {}{}", s.device == Device::CUDA ? "cuda" : "cpu",
            s.world->device() == Device::CUDA ? " (one GPU per rank, NCCL groups)" : "",
            dtype_name(s.model_cfg.dtype),
            s.model_cfg.dtype == DType::F32 ? "" : ", fp32 main params and main grads");
  s.model_cfg.tp_rank = s.ps->tp_rank();
  const int64_t dp = a.data_parallel_size;
  // The distributed optimizer splits every bucket into DP equal blocks: align each
  // parameter to a multiple of DP (and of 64 elements, as Megatron pads param starts).
  const int pp = int(a.pipeline_model_parallel_size), vpp = int(a.virtual_pipeline_model_parallel_size);
  const model::PipelinePart part = pipeline_part(a, s.ps->pp_rank());
  if (pp > 1) {
    namespace pl = parallel::pipeline;
    const int stage = s.ps->pp_rank();
    // Megatron's schedule: 1F1B, interleaved with virtual stages.
    s.schedule_kind = schedule_kind(a);
    s.schedule = pl::build_schedule(s.schedule_kind, pp, vpp, int(a.num_microbatches),
                                    int(a.microbatch_group_size_per_vp_stage.value_or(0)));
    s.forward_only = pl::forward_only(s.schedule)[size_t(stage)];
    s.pp_grads = s.world->split(s.ps->layout().groups(parallel::Group::PP), "pp-grad");
    MCPP_CHECK(s.pp_grads && s.pp_grads->rank() == stage && s.ps->pp().rank() == stage,
               "pipeline group ranks do not follow the pipeline stages");
    std::string chunks;
    for (const auto& ch : part.chunks)
      chunks += fmt::format(" [{}-{}]", ch.front(), ch.back());
    log::info("> pipeline: {} stages x {} model chunks, {} schedule, {} micro-batches; stage 0 "
              "layers{}",
              pp, vpp, pl::to_string(s.schedule_kind), a.num_microbatches, chunks);
  }
  // The memory plan against what this rank can get, before anything large is allocated: a
  // config that cannot fit fails here with the plan's numbers and what to change, not as an
  // out-of-memory error in the first backward (GPU) or the kernel's OOM killer ending the
  // job without a word (CPU). The plan leaves out only a few MiB (cuBLASLt's workspace),
  // so the check never stops a run that would fit.
  if (s.device == Device::CPU) {
    // The host's available memory, shared by this job's ranks on the host.
    const int64_t avail = host_memory_available();
    const int local = host_local_ranks();
    if (avail >= 0) {
      const std::string advice =
          memory_fit_advice(a, s.model_cfg, s.ps->pp_rank(), avail / local);
      MCPP_CHECK(advice.empty(), "{} (this host: {:.0f} MiB available for {} rank(s) of this job)",
                 advice, double(avail) / 1048576.0, local);
    }
  }
#ifdef MCPP_HAVE_CUDA
  if (s.device == Device::CUDA) {
    const auto ms = ops::cuda::memory_stats();
    const std::string advice = memory_fit_advice(a, s.model_cfg, s.ps->pp_rank(),
                                                 int64_t(ms.device_free + ms.reserved));
    MCPP_CHECK(advice.empty(), "{} (this GPU: {:.0f} MiB free, {:.0f} MiB held by this run)",
               advice, double(ms.device_free) / 1048576.0, double(ms.reserved) / 1048576.0);
  }
#endif
  s.model = std::make_unique<model::GPTModel>(s.model_cfg, &s.ps->tp(), part);
  log::info("> initialized tensor model parallel with size {}, pipeline model parallel with "
            "size {}, data parallel with size {}{}{}",
            a.tensor_model_parallel_size, pp, dp, a.sequence_parallel ? ", sequence parallel" : "",
            a.use_distributed_optimizer ? ", distributed optimizer" : "");
  log::info(" > number of parameters on (tensor, pipeline) model parallel rank ({}, {}): {}",
            s.ps->tp_rank(), s.ps->pp_rank(), s.model->params().total_numel());
  if (a.recompute_granularity)
    log::info("> activation recomputation: {}{}", *a.recompute_granularity,
              *a.recompute_granularity == "full"
                  ? fmt::format(", method {}, {} layers", *a.recompute_method, *a.recompute_num_layers)
                  : std::string(", the attention core"));
  if (a.keep_mlp_activations > 0) {
    int kept = 0, layers = 0;
    for (const auto& ch : s.model->part().chunks) {
      for (bool k : model::keeps_mlp_activation(s.model_cfg, int(ch.size()))) kept += k;
      layers += int(ch.size());
    }
    log::info(
        "> MLP activations kept for backward, not recomputed (--keep-mlp-activations {}): "
        "{} of this rank's {} layers",
        a.keep_mlp_activations, kept, layers);
  }
  {
    auto& P = s.model->params();
    std::vector<parallel::ParamSpan> spans;
    for (size_t i = 0; i < P.infos().size(); ++i) {
      const auto& p = P.infos()[i];
      const int64_t next = i + 1 < P.infos().size() ? P.infos()[i + 1].offset : P.total_numel();
      spans.push_back({p.offset, next - p.offset, p.layer});
    }
    // Megatron's default bucket: max(40M, 1M * DP) parameters (only with overlap).
    const int64_t bucket = a.ddp_bucket_size.value_or(
        a.overlap_grad_reduce ? std::max<int64_t>(40000000, 1000000 * dp) : P.total_numel());
    s.dp_grads = std::make_unique<parallel::DataParallelGrads>(
        P.flat_grads(), std::move(spans), s.ps->dp(), bucket, a.overlap_grad_reduce,
        a.use_distributed_optimizer, a.grad_reduce_in_bf16);
    const auto& g = *s.dp_grads;
    log::info(
        "> gradient buckets: {} (--ddp-bucket-size {}), {} in {}{}{}", g.buckets().size(), bucket,
        a.use_distributed_optimizer ? "reduce-scatter" : "all-reduce", dtype_name(g.reduce_dtype()),
        g.staging_bytes() > 0
            ? fmt::format(" (--grad-reduce-in-bf16: {} bytes of bf16 staging)", g.staging_bytes())
            : std::string(),
        a.overlap_grad_reduce ? ", overlapped with backward" : "");
    if (a.overlap_grad_reduce)
      s.model->set_grad_ready_hook([g = s.dp_grads.get(), dev = s.device](int layer) {
        g->layer_ready(layer, ops::default_stream(dev));
      });
  }
  const optim::AdamWConfig adam{a.adam_beta1, a.adam_beta2, a.adam_eps};
  if (a.use_distributed_optimizer) {
    s.dist_opt = std::make_unique<optim::DistributedAdamW>(s.model->params(), adam, *s.dp_grads);
    // fp32 main params + two moments, against the same state held for the whole buffer.
    const int64_t full = 3 * s.model->params().total_numel() * int64_t(sizeof(float));
    if (a.overlap_param_gather) {
      std::vector<int> layers;
      for (const auto& p : s.model->params().infos()) layers.push_back(p.layer);
      s.dist_opt->set_overlap_param_gather(true, std::move(layers));
      s.model->set_params_needed_hook(
          [o = s.dist_opt.get()](int layer) { o->wait_params(layer); });
    }
    log::info("> distributed optimizer: {} bytes of optimizer state on this rank, {:.3f} of the "
              "{} bytes an unsharded optimizer holds",
              s.dist_opt->state_bytes(), double(s.dist_opt->state_bytes()) / double(full), full);
  } else
    s.opt = std::make_unique<optim::AdamW>(s.model->params(), adam);
  {
    // The memory plan before the first step allocates any activation (Megatron's
    // "Theoretical memory footprints" line), per pipeline stage, predicted from the flags
    // alone (`megatron plan` prints the same); the allocated weights, gradients and
    // optimizer state must agree (checked here), the activations are measured after the
    // first iteration.
    s.plan = plan_stage_memory(a, s.model_cfg, s.ps->pp_rank());
    auto& P = s.model->params();
    int64_t have = int64_t(P.flat_params().nbytes() + P.flat_grads().nbytes());
    have += s.dp_grads->staging_bytes();
    if (s.dist_opt)
      have += int64_t(s.dp_grads->shard().nbytes()) + s.dist_opt->state_bytes();
    else
      for (const Tensor* t : {&s.opt->exp_avg(), &s.opt->exp_avg_sq(), &s.opt->main_params()})
        if (t->defined()) have += int64_t(t->nbytes());
    const auto& m = s.plan;
    if (have != m.weights_and_optimizer())
      log::warn("memory plan: {} bytes of weights, gradients and optimizer state planned, {} "
                "allocated",
                m.weights_and_optimizer(), have);
    if (s.ps->dp_rank() == 0 && s.ps->tp_rank() == 0)
      log::write(log::Level::Info,
                 fmt::format("Theoretical memory footprints: weight and optimizer={:.2f} MB, "
                             "activation={:.2f} MB, total={:.2f} MB | weights+grads+optimizer: "
                             "{} B | per micro-batch: {} B | micro-batches in flight at most: "
                             "{} | shared scratch: {} B",
                             double(m.weights_and_optimizer()) / 1048576.0,
                             double(m.activations()) / 1048576.0, double(m.total()) / 1048576.0,
                             m.weights_and_optimizer(), m.per_microbatch, m.in_flight, m.scratch),
                 /*all_ranks=*/true);
  }
  if (a.fp16) {
    optim::LossScalerConfig lc;
    lc.loss_scale = a.loss_scale.value_or(0.0), lc.initial_scale = a.initial_loss_scale;
    lc.min_scale = a.min_loss_scale, lc.window = int64_t(a.loss_scale_window);
    lc.hysteresis = a.hysteresis;
    s.scaler = std::make_unique<optim::LossScaler>(lc);
    log::info("> fp16 loss scaling: {}", s.scaler->dynamic()
                                           ? fmt::format("dynamic, initial scale {}, window {}, "
                                                         "hysteresis {}, min {}",
                                                         lc.initial_scale, lc.window,
                                                         lc.hysteresis, lc.min_scale)
                                           : fmt::format("constant {}", lc.loss_scale));
  }
  s.sched = std::make_unique<optim::OptimizerParamScheduler>(lr_scheduler_config(a));
  if (a.save) checkpoint::check_save_dir_writable(*a.save);  // harden: fail at start-up
  if (a.load) s.load();
  if (a.async_save) {
    MCPP_CHECK_HINT(a.save, "add --save DIR", "--async-save needs --save");
    s.async_saver = std::make_unique<checkpoint::AsyncSaver>();
  }
  if (a.exit_signal_handler) std::signal(SIGTERM, on_exit_signal);

  // Samples per split, as get_train_valid_test_num_samples().
  data::GPTDatasetsArgs d;
  d.data_path = a.data_path, d.mock_data = a.mock_data, d.seq_length = a.seq_length;
  d.split = a.split.value_or("969, 30, 1");
  d.seed = uint32_t(a.seed), d.eod = s.tok->eod(), d.pad = data::pad_id_for(s.tok->pad(), s.tok->eod());
  d.vocab_size = vocab;
  d.padded_vocab_size = *a.padded_vocab_size;  // harden: dataset ids checked when opened
  d.reads = {!a.skip_train, a.eval_interval && a.eval_iters > 0, a.eval_interval && a.eval_iters > 0};
  d.eod_mask_loss = a.eod_mask_loss;
  d.data_cache_path = a.data_cache_path.value_or("");
  const int64_t gbs = a.global_batch_size;
  d.num_samples[0] = a.train_samples.value_or(a.train_iters * gbs);
  if (a.eval_interval)
    d.num_samples[1] = (a.train_iters / *a.eval_interval + 1) * a.eval_iters * gbs;
  d.num_samples[2] = a.eval_iters * gbs;
  log::info("> building train, validation, and test datasets ...");
  // With --data-cache-path rank 0 builds (and caches) the indices first, as Megatron
  // does; the other ranks then read its cache instead of all writing the same files.
  comm::Communicator& w = s.world->world();
  if (!d.data_cache_path.empty() && w.size() > 1) {
    if (w.rank() == 0) s.datasets = data::build_train_valid_test_datasets(d);
    w.barrier(ops::default_stream(Device::CPU));
    if (w.rank() != 0) s.datasets = data::build_train_valid_test_datasets(d);
  } else {
    s.datasets = data::build_train_valid_test_datasets(d);
  }
  MCPP_CHECK_HINT(s.datasets[0] || a.skip_train, "give the train split a non-zero weight in --split",
                  "no training dataset was built (--split {})", d.split);
  for (int i = 0; i < 3; ++i)
    if (s.datasets[i])
      log::info("    {}: {}", i == 0 ? "train" : i == 1 ? "validation" : "test",
                s.datasets[i]->describe());
}

Trainer::~Trainer() = default;

TrainSummary Trainer::run() {
  auto& s = *s_;
  const Args& a = s.args;
  TrainSummary out;
  const int64_t gbs = a.global_batch_size;
  const double flops_per_iter = num_floating_point_operations(a, gbs);
  const auto t_start = std::chrono::steady_clock::now();
  Timer interval;
  interval.start();
  double interval_loss = 0, last_grad_norm = 0;
  int64_t interval_iters = 0, interval_advanced = 0;
  int64_t& iteration = s.iteration;
  const int64_t start_iteration = iteration;
  bool saved_now = false;
  log::info("training ...");
  if (iteration > 0) log::info("resuming at iteration {} ({} samples consumed)", iteration,
                               s.consumed_train);

  while (!a.skip_train && iteration < a.train_iters) {
    if (s.async_saver) s.async_saver->poll();  // a failed background save surfaces here
    ++iteration;
    saved_now = false;
    s.model->params().zero_grads();
    s.timed_section("forward-backward", true);
    auto [loss_sum, tokens] = s.run_batch(*s.datasets[0], s.consumed_train, iteration, true);
    s.timed_section("forward-backward", false);
    const double loss = tokens > 0 ? loss_sum / tokens : 0.0;

    s.timed_section("optimizer", true);
    const double grad_norm = std::sqrt(s.reduce_grads());
    // fp16: a non-finite norm is a gradient overflow of the loss scale (Megatron's
    // found_inf): the scaler backs off, the step and the LR schedule's step are skipped.
    const bool overflow = !std::isfinite(grad_norm);
    if (s.scaler) s.scaler->update(overflow);
    const bool skip = overflow || !std::isfinite(loss);
    if (skip && s.scaler && std::isfinite(loss)) {
      ++s.skipped_iters;
      log::debug("iteration {}: gradient overflow at loss scale {}; step skipped", iteration,
                 s.scaler->scale());
    } else if (skip) {
      // Megatron's check-for-nan: the update is skipped and counted.
      ++s.skipped_iters, ++s.nan_iters;
      log::warn("iteration {}: non-finite loss ({}) or grad norm ({}); update skipped", iteration,
                loss, grad_norm);
    } else {
      if (s.dist_opt) {
        s.dist_opt->clip(a.clip_grad, grad_norm);
        s.dist_opt->step(s.sched->lr(), s.sched->wd());
      } else {
        s.opt->clip(a.clip_grad, grad_norm);
        s.opt->step(s.sched->lr(), s.sched->wd());
      }
      s.sched->step(gbs);
    }
    s.timed_section("optimizer", false);
    s.consumed_train += gbs;
    s.flops_so_far += flops_per_iter;
    if (iteration == start_iteration + 1 && s.ps->dp_rank() == 0 && s.ps->tp_rank() == 0) {
      // Like Megatron's memory report after the first iteration, for saved activations:
      // one line per pipeline stage.
      const auto m = s.model->activation_memory();
      log::write(log::Level::Info,
                 fmt::format("(after {} iterations) activations | peak saved: {:.2f} MB | "
                             "micro-batches in flight at the peak: {} | largest per "
                             "micro-batch: {} B | shared scratch: {} B",
                             iteration, m.peak / 1048576.0, m.max_in_flight, m.per_slot_max,
                             m.scratch),
                 /*all_ranks=*/true);
    }
    out.losses.push_back(loss);
    ++interval_iters;
    if (!skip) interval_loss += loss, ++interval_advanced, last_grad_norm = grad_norm;

    if (iteration % a.log_interval == 0 || iteration == a.train_iters) {
#ifdef MCPP_HAVE_CUDA
      if (s.device == Device::CUDA) ops::cuda::synchronize(ops::cuda::default_stream());
#endif
      const double elapsed = interval.elapsed(true);
      const double per_iter = elapsed / double(interval_iters);
      IterationLog L;
      L.iteration = iteration, L.train_iters = a.train_iters;
      L.consumed_samples = s.consumed_train;
      L.elapsed_ms_per_iteration = per_iter * 1e3;
      L.throughput_tflops = throughput_tflops_per_gpu(flops_per_iter, per_iter, s.world->size());
      L.learning_rate = s.sched->lr();
      L.global_batch_size = gbs;
      // Averaged over the iterations that stepped, as Megatron's advanced iterations.
      L.losses = {{"lm loss", interval_loss / double(std::max<int64_t>(1, interval_advanced))}};
      L.loss_scale = s.scaler ? s.scaler->scale() : 1.0;
      L.grad_norm = last_grad_norm;
      L.skipped_iterations = s.skipped_iters, L.nan_iterations = s.nan_iters;
      L.tokens_per_sec_per_gpu = double(gbs * a.seq_length) / per_iter / s.world->size();
      log::info("{}", format_iteration_line(L));
      if (s.report_memory && s.device == Device::CUDA) s.log_memory(iteration);
#ifdef MCPP_HAVE_CUDA
      if (s.device == Device::CUDA && ops::cuda::op_profiling()) {
        // MCPP_PROFILE_OPS=1: GPU time per op over this interval, largest first.
        auto times = ops::cuda::op_profile_collect();
        double sum = 0;
        for (const auto& t : times) sum += t.ms;
        log::info("GPU time per op over the last {} iterations (ms per iteration; {:.1f} of "
                  "{:.1f} in ops):", interval_iters, sum / double(interval_iters), per_iter * 1e3);
        for (size_t i = 0; i < times.size() && i < 20; ++i)
          log::info("    {:<48} {:>6} calls {:>9.2f} ms", times[i].name,
                    times[i].calls / interval_iters, times[i].ms / double(interval_iters));
      }
#endif
      s.log_comm_volumes(interval_iters);
      if (a.timing_log_level >= 1) {
        log::info("(min, max) time across ranks (ms):");
        for (auto& [name, t] : s.timers.all()) {
          double ms = const_cast<Timer&>(t).elapsed(true) * 1e3 / double(interval_iters);
          std::string dots(std::max<int>(2, 48 - int(name.size())), '.');
          log::info("    {} {}: ({:.2f}, {:.2f})", name, dots, ms, ms);
        }
      }
      interval_loss = 0, interval_iters = 0, interval_advanced = 0;
      interval.start();
    }
    if (a.eval_interval && iteration % *a.eval_interval == 0 && s.datasets[1]) {
      out.last_valid_loss = s.evaluate(1, s.consumed_valid);
      s.print_validation("iteration " + std::to_string(iteration), out.last_valid_loss);
      interval.elapsed(true), interval.start();  // evaluation time is not training time
    }
    if (a.save && a.save_interval && iteration % *a.save_interval == 0) {
      s.save();
      saved_now = true;
    }
    // Exit conditions, as checkpoint_and_decide_exit(): each saves first when --save is set.
    std::string exit_reason;
    if (g_exit_signal.load())
      exit_reason = "exiting on SIGTERM (--exit-signal-handler)";
    else if (a.exit_interval && iteration % *a.exit_interval == 0)
      exit_reason = fmt::format("exiting program at iteration {} (--exit-interval {})", iteration,
                                *a.exit_interval);
    if (a.exit_duration_in_mins) {
      double mins = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start)
                        .count() / 60.0;
      if (mins > double(*a.exit_duration_in_mins))
        exit_reason = fmt::format("exiting program after {:.2f} minutes (--exit-duration-in-mins {})",
                                  mins, *a.exit_duration_in_mins);
    }
    if (!exit_reason.empty()) {
      if (a.save && !saved_now) s.save(), saved_now = true;
      if (s.async_saver) s.async_saver->wait();
      log::info("{}", exit_reason);
      out.iterations = iteration - start_iteration;
      out.consumed_samples = s.consumed_train;
      out.skipped_iterations = s.skipped_iters;
      out.loss_scale = s.scaler ? s.scaler->scale() : 1.0;
      return out;
    }
  }
  if (a.save && !saved_now && iteration > start_iteration) s.save();
  if (s.async_saver) s.async_saver->wait();
  log::info("after training is done");
  if (s.datasets[1] && a.eval_interval) {
    out.last_valid_loss = s.evaluate(1, s.consumed_valid);
    s.print_validation("iteration " + std::to_string(iteration) + " on validation set",
                       out.last_valid_loss);
  }
  if (s.datasets[2] && a.eval_interval) {
    int64_t consumed_test = 0;
    double test = s.evaluate(2, consumed_test);
    s.print_validation("iteration " + std::to_string(iteration) + " on test set", test);
  }
  out.iterations = iteration - start_iteration;
  out.consumed_samples = s.consumed_train;
  out.skipped_iterations = s.skipped_iters;
  out.loss_scale = s.scaler ? s.scaler->scale() : 1.0;
  return out;
}

int train_main(const std::vector<std::string>& argv) {
  Args a = parse_args(argv);
  if (a.help) {
    std::printf("%s", help_text().c_str());
    return 0;
  }
  Trainer t(std::move(a));
  t.run();
  return 0;
}

}  // namespace mcpp::training
