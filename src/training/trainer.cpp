// The training loop (trainer.h): Megatron's train() and train_step(), evaluation, and the
// glue to checkpoints (checkpoint/training_checkpoint.h). Set-up is trainer_setup.cpp;
// what the loop prints, training_log.cpp.
#include "training/trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "base/log.h"
#include "checkpoint/megatron/megatron_train.h"
#include "checkpoint/training_checkpoint.h"
#include "ops/ops.h"
#include "optim/grads.h"
#include "parallel/fp8_amax.h"
#include "parallel/host_collectives.h"
#include "training/flops.h"
#include "training/profiler.h"
#include "training/log_line.h"
#include "training/moe_step.h"
#include "training/mtp_step.h"
#include "training/trainer_state.h"
#include "training/upcycle.h"
#include "training/weight_hash.h"

namespace mcpp::training {

// One global batch through this rank: its micro-batches (data/micro_batches.h), forward
// (+ backward when training). Returns {sum of masked token losses, number of masked
// tokens}, both summed over DP.
std::pair<double, double> Trainer::State::forward_backward(const data::GPTSampleSource& ds,
                                                           int64_t consumed, int64_t it,
                                                           bool training) {
  // Training steps follow the ramp-up (if any); evaluation reads --eval-global-batch-size
  // samples (the global batch unless given) in micro-batches of --eval-micro-batch-size (the
  // micro-batch unless given), as Megatron's evaluate().
  const int64_t gbs = training ? step_global_batch() : *args.eval_global_batch_size;
  const int64_t mbs = training ? args.micro_batch_size : *args.eval_micro_batch_size;
  data::BatchShape shape{mbs, args.seq_length, gbs / (mbs * args.data_parallel_size),
                         args.data_parallel_size, ps->dp_rank(),
                         args.context_parallel_size, ps->cp_rank(),
                         args.reset_position_ids, args.reset_attention_mask};
  shape.mtp_depths = args.mtp_num_layers.value_or(0);
  log->section("batch-generator", true, 2);
  const data::LocalBatch batch = data::load_local_batch(ds, shape, consumed, sample);
  log->section("batch-generator", false, 2);
  if (!training && !eval_shape_logged && !batch.micro_batches.empty()) {
    eval_shape_logged = true;
    log::info("evaluation: {} micro-batches a data-parallel rank, micro-batch size {} "
              "(--eval-micro-batch-size {}, --eval-global-batch-size {})",
              batch.micro_batches.size(), batch.micro_batches[0].tokens.size(0), mbs, gbs);
  }
  return run_batch(batch, gbs, it, training);
}

std::pair<double, double> Trainer::State::run_batch(const data::LocalBatch& batch, int64_t gbs,
                                                    int64_t it, bool training) {
  // The gradient scale of each micro-batch from global token counts (forward_backward.h:
  // Megatron's per-micro-batch mean, or --calculate-per-token-loss), so every split of the
  // batch over DP, CP and micro-batches trains the same function. The logged loss is the
  // masked token mean of the global batch either way. fp16: the loss scale multiplies
  // the loss (and so every gradient) before backward.
  const LossScales ls =
      loss_scales(batch, *ps, args.calculate_per_token_loss, scaler ? scaler->scale() : 1.0);
  const double tokens = ls.tokens;
  model::StepKeys keys;
  keys.iteration = it, keys.global_batch = gbs;
  keys.loss_scale = scaler ? scaler->scale() : 1.0;
  if (args.calculate_per_token_loss) keys.loss_tokens = tokens;
  keys.training = training;
  const double loss_sum = fwd_bwd->run(batch, keys, ls.grad_scale, training);
  return {parallel::sum_over(data_cp_group(*ps), loss_sum), tokens};
}

// The ramp-up's batch for the next step; with PP the schedule of that many micro-batches.
void Trainer::State::update_step_batch() {
  const int64_t before = batches->current_global_batch_size();
  batches->update(consumed_train);
  const int64_t gbs = batches->current_global_batch_size();
  if (gbs != before) log::info("ramping up batch size from {} to {}", before, gbs);
  const int64_t m = batches->num_microbatches();
  if (args.pipeline_model_parallel_size > 1 && m != built_schedule_microbatches) {
    namespace pl = parallel::pipeline;
    schedule = pl::build_schedule(schedule_kind, int(args.pipeline_model_parallel_size),
                                  int(args.virtual_pipeline_model_parallel_size), int(m),
                                  int(args.microbatch_group_size_per_vp_stage.value_or(0)));
    fwd_bwd->train_actions = &schedule[size_t(ps->pp_rank())];
    built_schedule_microbatches = m;
  }
}

void Trainer::State::finish_async_save(bool blocking) {
  // multi-rank saves: committed here, collectively (true also when none is pending)
  bool done = checkpoint::finalize_async_save(world->world(), *async_saver, blocking);
  if (blocking)
    async_saver->wait();
  else
    done = async_saver->poll() && done;
  if (done && progress && progress_async_iteration) {  // --log-progress: now it is committed
    progress->append(
        fmt::format("Saved async checkpoint\tIteration: {}", *progress_async_iteration));
    progress_async_iteration.reset();
  }
}

// Megatron's finalize_model_grads, then the fp16 unscale (_unscale_main_grads): the
// optimizer's gradients are then those of the global batch, unscaled.
void Trainer::State::finalize_grads() {
  parallel::FinalizeOptions o;
  o.sequence_parallel = model_cfg.sp();
  o.overlap_grad_reduce = args.overlap_grad_reduce;
  o.timer = [this](std::string_view name, bool start) { log->section(name, start); };
  parallel::finalize_model_grads(*ps, grad_params, model->params().flat_grads(), *dp_grads,
                                 opt->grads(), opt->segments(), o, ops::default_stream(device));
  if (scaler) opt->scale_grads(scaler->inv_scale());
}

// Megatron's train_step: zero the gradients, forward-backward over the micro-batches,
// finalize the gradients, the global norm, and the optimizer step -- skipped (and
// counted) when the gradients overflowed the fp16 loss scale or the loss is not finite.
StepResult Trainer::State::train_step() {
  StepResult r;
  model->params().zero_grads();
  log->section("forward-backward", true);
  const auto [loss_sum, tokens] = forward_backward(*datasets[0], consumed_train, iteration, true);
  log->section("forward-backward", false);
  r.loss = tokens > 0 ? loss_sum / tokens : 0.0;
  // FP8 delayed scaling: this step's amaxes over TP x DP x CP, then the scales (fp8_amax.h).
  parallel::fp8_reduce_amaxes_and_update_scales(*model, *ps, ops::default_stream(device));

  log->section("optimizer", true);
  finalize_grads();
  r.moe = moe_finish_global_batch(*model, *ps, args.moe_per_layer_logging);  // expert bias
  for (auto& v : mtp_finish_global_batch(*model, *ps)) r.moe.push_back(std::move(v));
  r.grad_norm =
      optim::grad_norm(*opt, model->params(), ps->tp_rank(), *norm_group, expert_norm_group);
  // fp16: a non-finite norm is a gradient overflow of the loss scale (Megatron's
  // found_inf): the scaler backs off, the step and the LR schedule's step are skipped.
  const bool overflow = !std::isfinite(r.grad_norm);
  if (scaler) scaler->update(overflow);
  r.skipped = overflow || !std::isfinite(r.loss);
  if (r.skipped && scaler && std::isfinite(r.loss)) {
    ++skipped_iters;
    log::debug("iteration {}: gradient overflow at loss scale {}; step skipped", iteration,
               scaler->scale());
  } else if (r.skipped) {
    // Megatron's check-for-nan: the update is skipped and counted.
    ++skipped_iters, ++nan_iters;
    log::warn("iteration {}: non-finite loss ({}) or grad norm ({}); update skipped", iteration,
              r.loss, r.grad_norm);
  } else {
    opt->clip(args.clip_grad, r.grad_norm);
    if (args.decoupled_lr) opt->set_decoupled_lr(decoupled_lr());
    if (args.use_mup) opt->set_mup(mup_rates());
    opt->step(sched->lr(), sched->wd());
    sched->step(step_global_batch());  // Megatron: increment = this step's batch
  }
  log->section("optimizer", false);
  return r;
}

// Megatron's full validation: micro-batches of one sample, DP rank r reading samples r,
// r + DP, ... of the set's epoch (MegatronFullValidationSampler), cyclically (a rank with
// fewer samples starts its own over, and the next evaluation goes on from where this one
// stopped), for v.iters iterations of --eval-global-batch-size's micro-batch count.
double Trainer::State::evaluate_full(ValidSet& v) {
  const int64_t n = v.ds->size(), dp = args.data_parallel_size, r = ps->dp_rank();
  const int64_t mine = (n - r + dp - 1) / dp;  // >= 1: start-up checked n >= DP
  data::BatchShape shape{1, args.seq_length, args.eval_num_microbatches, dp, r,
                         args.context_parallel_size, ps->cp_rank(), args.reset_position_ids,
                         args.reset_attention_mask};
  shape.mtp_depths = args.mtp_num_layers.value_or(0);
  double loss = 0, tokens = 0;
  for (int64_t k = 0; k < v.iters; ++k) {
    data::LocalBatch batch;
    for (int64_t j = 0; j < args.eval_num_microbatches; ++j) {
      const int64_t idx[1] = {(v.cursor++ % mine) * dp + r};
      batch.micro_batches.push_back(data::load_samples(*v.ds, shape, idx, sample));
      batch.sample_offsets.push_back(j * dp + r);
      const Tensor& m = batch.micro_batches.back().loss_mask;
      for (int64_t i = 0; i < m.numel(); ++i) batch.loss_tokens += m.data<float>()[i];
    }
    auto [l, t] = run_batch(batch, *args.eval_global_batch_size, 0, false);
    loss += l, tokens += t;
    consumed_valid += *args.eval_global_batch_size;  // as Megatron counts it
  }
  return tokens > 0 ? loss / tokens : 0.0;
}

double Trainer::State::evaluate(int split, int64_t& consumed) {
  const auto& ds = datasets[split];
  double loss = 0, tokens = 0;
  for (int64_t k = 0; k < args.eval_iters; ++k) {
    auto [l, t] = forward_backward(*ds, consumed, 0, false);
    loss += l, tokens += t;
    consumed += *args.eval_global_batch_size;
  }
  return tokens > 0 ? loss / tokens : 0.0;
}

checkpoint::TrainingState Trainer::State::training_state() const {
  checkpoint::TrainingState st;
  st.iteration = iteration;
  st.consumed_train_samples = consumed_train, st.consumed_valid_samples = consumed_valid;
  st.skipped_train_samples = skipped_train;
  st.scheduler = sched->state();
  st.optimizer_steps = opt->steps();
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

checkpoint::megatron::LegacyTrainOptions Trainer::State::legacy_options() const {
  checkpoint::megatron::LegacyTrainOptions o;
  o.config = model_cfg;
  const auto impl = args.given.find("transformer_impl");  // Megatron's default: TE names
  o.impl = impl != args.given.end() && impl->second == "local"
               ? checkpoint::megatron::TransformerImpl::Local
               : checkpoint::megatron::TransformerImpl::TransformerEngine;
  o.beta1 = args.adam_beta1, o.beta2 = args.adam_beta2, o.eps = args.adam_eps;
  o.save_optim = !args.no_save_optim;
  o.retain_interval = args.save_retain_interval;
  o.virtual_stages = std::max<int64_t>(1, args.virtual_pipeline_model_parallel_size);
  o.first_stage_layers = args.decoder_first_pipeline_num_layers;
  o.last_stage_layers = args.decoder_last_pipeline_num_layers;
  o.layout = args.pipeline_model_parallel_layout;
  return o;
}

void Trainer::State::save(bool non_persistent) {
  // Megatron's non-persistent "global" checkpoints: the same checkpoint in a folder of their
  // own, each save deleting the older ones there once it is committed (Megatron deletes
  // them before it writes); --save-retain-interval and --log-progress are not involved.
  const std::string dir = non_persistent ? args.non_persistent_dir(*args.save) : *args.save;
  if (args.ckpt_format == "torch") {  // Megatron-LM's legacy layout (no async: refused)
    auto lo = legacy_options();
    if (non_persistent) lo.retain_interval.reset(), lo.keep_only_latest = true;
    checkpoint::megatron::save_legacy_training_checkpoint(
        dir, world->world(), *ps, model->params(), *opt, training_state(), lo);
    if (progress && !non_persistent)
      progress->checkpoint_saved(iteration, flops_so_far, flops_at_job_start,
                                 consumed_train * args.seq_length, false);
    return;
  }
  checkpoint::SaveOptions o;
  o.model = model_cfg, o.save_rng = !args.no_save_rng;
  o.tokenizer = tokenizer_files;
  o.retain_interval = args.save_retain_interval;
  o.fully_parallel = args.ckpt_fully_parallel_save;
  if (non_persistent) o.retain_interval.reset(), o.keep_only_latest = true;
  // --log-progress: a save in flight is committed (and said so) before the next starts, as
  // the saver would wait for it anyway.
  if (progress && async_saver) finish_async_save(/*blocking=*/true);
  checkpoint::save_training_checkpoint(dir, world->world(), *ps, model->params(), *opt,
                                       !args.no_save_optim, training_state(), o, async_saver.get());
  if (!progress || non_persistent) return;
  progress->checkpoint_saved(iteration, flops_so_far, flops_at_job_start,
                             consumed_train * args.seq_length, async_saver != nullptr);
  if (async_saver) progress_async_iteration = iteration;
}

void Trainer::State::load() {
  const Args& a = args;
  // --moe-use-upcycling: the dense checkpoint in --load becomes the MoE model's iteration 1
  // in --save (upcycle.h), which is loaded instead, without optimizer or RNG state
  // (Megatron turns on --no-load-optim and --no-load-rng).
  const bool upcycled = a.moe_use_upcycling;
  if (upcycled) {
    if (!a.no_load_optim) log::warn("enabling --no-load-optim for upcycling");
    if (!a.no_load_rng) log::warn("enabling --no-load-rng for upcycling");
    upcycle_dense_checkpoint(a, model_cfg, world->world());
  }
  const std::string& dir = upcycled ? *a.save : load_source->dir;
  // (--ckpt-step picked the dense iteration; the upcycled model is iteration 1.)
  const std::optional<int64_t> step = upcycled ? std::optional<int64_t>(1) : a.ckpt_step;
  // --finetune, or --pretrained-checkpoint taken because --load held no checkpoint
  // (Megatron sets args.finetune then): weights only, from iteration 0.
  const bool finetune = a.finetune || load_source->finetune;
  checkpoint::LoadOptions o;
  o.model = model_cfg, o.load_rng = !a.no_load_rng && !upcycled, o.finetune = finetune;
  // A pipeline stage, or an EP rank (its experts), holds part of the checkpoint's tensors.
  o.partial_model = a.pipeline_model_parallel_size > 1 || a.expert_model_parallel_size > 1;
  o.strictness = checkpoint::parse_strictness(a.dist_ckpt_strictness);
  // --ckpt-fully-parallel-load: by default (Megatron's "dp") the DP x CP replicas share the
  // reading, with "ep_dp" the expert-DP group. Any group is correct: ranks exchange only
  // tensors whose ids (key and boxes) agree (fully_parallel.h).
  if (a.ckpt_fully_parallel_load)
    o.replicas = a.ckpt_fully_parallel_load_process_group == "ep_dp" ? &ps->expert_dp()
                                                                       : &ps->dp_cp();
  const bool load_optim = !(a.no_load_optim || finetune || upcycled);
  std::optional<checkpoint::TrainingState> st;
  bool has_scheduler = !upcycled;  // the upcycled checkpoint holds none: the flags' schedule
  if (checkpoint::megatron::holds_legacy_checkpoint(dir, step)) {
    // Megatron-LM's legacy layout, whatever --ckpt-format (--load probes what it holds)
    auto l = checkpoint::megatron::load_legacy_training_checkpoint(dir, step,
                                                                   model->params(), *opt,
                                                                   load_optim, o);
    st = l.state, has_scheduler = l.has_scheduler;
  } else {
    st = checkpoint::load_training_checkpoint(dir, step, model->params(), *opt,
                                              load_optim, o);
  }
  if (!st) return;
  if (scaler && !st->grad_scaler.empty())
    scaler->load_state({st->grad_scaler.at("scale").get<double>(),
                        st->grad_scaler.at("growth_tracker").get<int64_t>(),
                        st->grad_scaler.at("hysteresis_tracker").get<int64_t>()});
  if (!finetune) {
    iteration = st->iteration;
    consumed_train = st->consumed_train_samples, consumed_valid = st->consumed_valid_samples;
    skipped_train = st->skipped_train_samples;
    if (const auto n = a.override_ckpt_iteration) {  // Megatron's rewind of the data loader
      const auto saved = st->config.find("global_batch_size");
      if (saved != st->config.end() && saved->is_string() &&
          *saved != std::to_string(a.global_batch_size))
        log::warn("--override-ckpt-iteration recomputes consumed_train_samples = target_iter * "
                  "current global_batch_size ({}), but this checkpoint was saved at "
                  "global_batch_size {}. If the target iteration is in the checkpoint run's "
                  "units, the data loader resumes from a shifted sample offset.",
                  a.global_batch_size, saved->get<std::string>());
      iteration = *n, consumed_train = *n * a.global_batch_size, skipped_train = 0;
      log::info("--override-ckpt-iteration: start at iteration {} (consumed_train_samples {})",
                iteration, consumed_train);
    }
    flops_so_far = st->num_floating_point_operations_so_far;
    auto policy = a.override_opt_param_scheduler ? optim::SchedulerLoadPolicy::OverrideFromArgs
                  : a.use_checkpoint_opt_param_scheduler ? optim::SchedulerLoadPolicy::UseCheckpoint
                                                         : optim::SchedulerLoadPolicy::RequireMatch;
    if (has_scheduler) sched->load_state(st->scheduler, policy);
  }
  log::info("  successfully loaded checkpoint from {} [ iteration {} ]{}", dir, st->iteration,
            finetune ? " for finetuning (counters reset)" : "");
}

void Trainer::State::check_weight_hashes() {
  // The parameters after the step's all-gather: with --overlap-param-gather it is still in
  // flight here (Megatron disables the forward pre-hook for the check, which completes it).
  opt->wait_params_all();
  check_param_hashes_across_dp_replicas(model->params(), *ps, world->world(), iteration);
  log::info(">>> Weight hashes match after {} iterations...", iteration);
}

namespace {

void print_validation(const std::string& suffix, const std::string& where, double loss) {
  std::string line = format_validation_line(where, {{"lm loss", loss}}, suffix);
  std::string rule = validation_rule(line);
  log::info("{}\n{}\n{}", rule, line, rule);
}

}  // namespace

// Megatron's train(): train_step, the log line, evaluation, checkpoints, and the exit
// conditions, iteration after iteration.
TrainSummary Trainer::run() {
  auto& s = *s_;
  const Args& a = s.args;
  TrainSummary out;
  double flops_per_iter = 0;
  const auto t_start = std::chrono::steady_clock::now();
  int64_t& iteration = s.iteration;
  const int64_t start_iteration = iteration;
  int64_t first_step = iteration;  // the iteration before this run's first step (skips move it)
  bool saved_now = false;
  auto finish = [&] {
    out.iterations = iteration - start_iteration;
    out.consumed_samples = s.consumed_train;
    out.skipped_iterations = s.skipped_iters;
    out.loss_scale = s.scaler ? s.scaler->scale() : 1.0;
    return out;
  };
  if (a.ckpt_convert_format) {  // Megatron's conversion: the loaded state saved, no training
    const bool legacy = checkpoint::megatron::holds_legacy_checkpoint(s.load_source->dir);
    s.save();
    if (s.async_saver) s.finish_async_save(/*blocking=*/true);
    log::info("> converted checkpoint: {} -> {}.", legacy ? "torch" : "torch_dist",
              a.ckpt_format);
    return finish();
  }
  log::info("training ...");
  if (iteration > 0)
    log::info("resuming at iteration {} ({} samples consumed)", iteration, s.consumed_train);
  // Megatron's train() checks once before the first step, then every N iterations.
  if (a.check_weight_hash_across_dp_replicas_interval && !a.skip_train) {
    if (data_cp_group(*s.ps).size() == 1 && s.ps->expert_dp().size() == 1)
      log::info("> --check-weight-hash-across-dp-replicas-interval: one data-parallel "
                "replica, no other copy of the weights to compare with");
    s.check_weight_hashes();
  }
  s.log->restart_interval();

  StepProfiler profiler(a, s.device, s.world->world().rank(), s.world->world().size());
  while (!a.skip_train && iteration < a.train_iters) {
    // A finished background save is committed here (collectively under mpirun), and a
    // failed one surfaces here.
    if (s.async_saver) s.finish_async_save(/*blocking=*/false);
    // --iterations-to-skip (Megatron's dummy_train_step): the global batch is consumed and
    // counted as skipped; no forward, backward, step, scheduler step, log line, evaluation
    // or save.
    if (std::find(a.iterations_to_skip.begin(), a.iterations_to_skip.end(), iteration + 1) !=
        a.iterations_to_skip.end()) {
      s.update_step_batch();
      const int64_t gbs = s.step_global_batch();
      s.consumed_train += gbs, s.skipped_train += gbs;
      if (iteration == first_step) ++first_step;
      ++iteration;
      log::info("skipping iteration {} (--iterations-to-skip): its {} samples are consumed",
                iteration, gbs);
      continue;
    }
    profiler.before_step(iteration);
    ++iteration;
    saved_now = false;
    s.update_step_batch();  // Megatron: update_num_microbatches(consumed, True) per step
    const int64_t gbs = s.step_global_batch();
    flops_per_iter = num_floating_point_operations(a, gbs);
    const StepResult r = s.train_step();
    profiler.after_step(iteration);
    s.consumed_train += gbs;
    s.skipped_train += a.batch_size_deficit;  // --decrease-batch-size-if-needed, as Megatron
    s.flops_so_far += flops_per_iter;
    if (iteration == first_step + 1) {
      s.log->activation_memory(iteration, s.model->activation_memory());
      if (a.overlap_grad_reduce && s.dp_grads)
        log::info("> --overlap-grad-reduce: {} of {} gradient buckets started their reduction "
                  "during backward",
                  s.dp_grads->started_during_backward(), s.dp_grads->buckets().size());
    }
    out.losses.push_back(r.loss);
    s.log->record(r.loss, r.grad_norm, r.skipped);
    s.log->record_moe(r.moe, r.skipped);
    IntervalState st;
    st.consumed_samples = s.consumed_train, st.learning_rate = s.sched->lr();
    st.loss_scale = s.scaler ? s.scaler->scale() : 1.0;
    st.skipped_iterations = s.skipped_iters, st.nan_iterations = s.nan_iters;
    st.flops_per_iteration = flops_per_iter;
    st.global_batch_size = gbs;
    st.skipped_samples = s.skipped_train;
    if (a.decoupled_lr) st.decoupled_learning_rate = s.decoupled_lr();
    if (s.log->due(iteration)) {
      // Megatron logs the last iteration's values (not interval averages); both are
      // collective over the groups that hold distinct parts of the model.
      if (a.log_num_zeros_in_grad)
        st.num_zeros_in_grad = optim::count_zeros_in_grads(*s.opt, s.model->params(),
                                                           s.ps->tp_rank(), *s.norm_group,
                                                           s.expert_norm_group);
      if (a.log_params_norm)
        st.params_norm = optim::params_norm(
            *s.opt, s.model->params(), s.ps->tp_rank(),
            parallel::grad_norm_group(*s.ps, s.world->world(), /*sharded_over_dp=*/false),
            s.expert_mp_group);
    }
    s.log->tensorboard_iteration(iteration, st);
    if (s.log->due(iteration)) s.log->log_interval(iteration, st);
    if (a.eval_interval && iteration % *a.eval_interval == 0 && !s.valid_sets.empty() &&
        iteration >= a.start_eval_at_iter.value_or(0)) {
      for (auto& v : s.valid_sets) {
        out.last_valid_loss = a.full_validation ? s.evaluate_full(v)
                                                : s.evaluate(1, s.consumed_valid);
        print_validation(v.suffix, "iteration " + std::to_string(iteration),
                         out.last_valid_loss);
        s.log->tensorboard_validation(iteration, s.consumed_train, out.last_valid_loss,
                                      v.suffix);
      }
      s.log->restart_interval();  // evaluation time is not training time
    }
    // After evaluation and before the checkpoint, as Megatron's post-training-step callbacks.
    if (const auto n = a.check_weight_hash_across_dp_replicas_interval; n && iteration % *n == 0)
      s.check_weight_hashes();
    if (a.save && a.save_interval && iteration % *a.save_interval == 0) {
      s.save();
      saved_now = true;
    } else if (a.save && a.non_persistent_save_interval &&
               iteration % *a.non_persistent_save_interval == 0) {
      // Not saved_now: an exit, and the end of training, still save to --save, so the
      // final state is never only in the non-persistent folder (Megatron skips the exit's).
      s.save(/*non_persistent=*/true);
    }
    // Exit conditions, as checkpoint_and_decide_exit(): each saves first when --save is set.
    // A signal reaches some ranks and the clock runs apart: every rank takes what any rank
    // saw (Megatron all-reduces both), so all of them save and exit at the same iteration.
    std::vector<double> seen = {a.exit_signal_handler && exit_signal_received() ? 1.0 : 0.0,
                                0.0};
    const double mins =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count() / 60.0;
    if (a.exit_duration_in_mins && mins > double(*a.exit_duration_in_mins)) seen[1] = 1.0;
    if (a.exit_signal_handler || a.exit_duration_in_mins) parallel::sum_over(s.world->world(), seen);
    std::string exit_reason;
    if (seen[0] > 0)
      exit_reason = fmt::format("exiting on {} (--exit-signal-handler)", a.exit_signal);
    else if (a.exit_interval && iteration % *a.exit_interval == 0)
      exit_reason = fmt::format("exiting program at iteration {} (--exit-interval {})", iteration,
                                *a.exit_interval);
    if (seen[1] > 0)
      exit_reason =
          fmt::format("exiting program after {:.2f} minutes (--exit-duration-in-mins {})", mins,
                      *a.exit_duration_in_mins);
    if (!exit_reason.empty()) {
      if (a.save && !saved_now) s.save(), saved_now = true;
      if (s.async_saver) s.finish_async_save(/*blocking=*/true);
      log::info("{}", exit_reason);
      return finish();
    }
  }
  if (a.save && !saved_now && iteration > start_iteration) s.save();
  if (s.async_saver) s.finish_async_save(/*blocking=*/true);
  log::info("after training is done");
  if (a.eval_interval)
    for (auto& v : s.valid_sets) {
      out.last_valid_loss =
          a.full_validation ? s.evaluate_full(v) : s.evaluate(1, s.consumed_valid);
      print_validation(v.suffix, "iteration " + std::to_string(iteration) + " on validation set",
                       out.last_valid_loss);
    }
  if (s.datasets[2] && a.eval_interval) {
    int64_t consumed_test = 0;
    double test = s.evaluate(2, consumed_test);
    print_validation("", "iteration " + std::to_string(iteration) + " on test set", test);
  }
  return finish();
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
