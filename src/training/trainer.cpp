// The training loop (trainer.h): Megatron's train() and train_step(), evaluation, and the
// glue to checkpoints (checkpoint/training_checkpoint.h). Set-up is trainer_setup.cpp;
// what the loop prints, training_log.cpp.
#include "training/trainer.h"

#include <chrono>
#include <cmath>

#include "base/log.h"
#include "checkpoint/training_checkpoint.h"
#include "ops/ops.h"
#include "optim/grads.h"
#include "parallel/host_collectives.h"
#include "training/flops.h"
#include "training/profiler.h"
#include "training/log_line.h"
#include "training/moe_step.h"
#include "training/trainer_state.h"

namespace mcpp::training {

// One global batch through this rank: its micro-batches (data/micro_batches.h), forward
// (+ backward when training). Returns {sum of masked token losses, number of masked
// tokens}, both summed over DP.
std::pair<double, double> Trainer::State::forward_backward(const data::GPTSampleSource& ds,
                                                           int64_t consumed, int64_t it,
                                                           bool training) {
  const data::BatchShape shape{args.micro_batch_size, args.seq_length, args.num_microbatches,
                               args.data_parallel_size, ps->dp_rank()};
  const data::LocalBatch batch = data::load_local_batch(ds, shape, consumed, sample);
  // Loss = sum of masked token losses / masked tokens of the whole global batch
  // (ARCHITECTURE.md), so every split of the batch trains the same function: the token
  // count is summed over DP before any backward, and gradients are summed.
  const double tokens = parallel::sum_over(ps->dp(), batch.loss_tokens);
  // fp16: the loss scale multiplies the loss (and so every gradient) before backward.
  const double grad_scale = tokens > 0 ? (scaler ? scaler->scale() : 1.0) / tokens : 0.0;
  model::StepKeys keys;
  keys.iteration = it, keys.global_batch = args.global_batch_size;
  keys.training = training;
  const double loss_sum = fwd_bwd->run(batch, keys, grad_scale, training);
  return {parallel::sum_over(ps->dp(), loss_sum), tokens};
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

  log->section("optimizer", true);
  finalize_grads();
  r.moe = moe_finish_global_batch(*model, *ps, args.moe_per_layer_logging);  // expert bias
  r.grad_norm = optim::grad_norm(*opt, model->params(), ps->tp_rank(), *norm_group);
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
    opt->step(sched->lr(), sched->wd());
    sched->step(args.global_batch_size);
  }
  log->section("optimizer", false);
  return r;
}

double Trainer::State::evaluate(int split, int64_t& consumed) {
  const auto& ds = datasets[split];
  double loss = 0, tokens = 0;
  for (int64_t k = 0; k < args.eval_iters; ++k) {
    auto [l, t] = forward_backward(*ds, consumed, 0, false);
    loss += l, tokens += t;
    consumed += args.global_batch_size;
  }
  return tokens > 0 ? loss / tokens : 0.0;
}

checkpoint::TrainingState Trainer::State::training_state() const {
  checkpoint::TrainingState st;
  st.iteration = iteration;
  st.consumed_train_samples = consumed_train, st.consumed_valid_samples = consumed_valid;
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

void Trainer::State::save() {
  checkpoint::SaveOptions o;
  o.model = model_cfg, o.save_rng = !args.no_save_rng;
  checkpoint::save_training_checkpoint(*args.save, world->world(), *ps, model->params(), *opt,
                                       !args.no_save_optim, training_state(), o, async_saver.get());
}

void Trainer::State::load() {
  const Args& a = args;
  checkpoint::LoadOptions o;
  o.model = model_cfg, o.load_rng = !a.no_load_rng, o.finetune = a.finetune;
  o.partial_model = a.pipeline_model_parallel_size > 1;
  const bool load_optim = !(a.no_load_optim || a.finetune);
  const auto st = checkpoint::load_training_checkpoint(*a.load, a.ckpt_step, model->params(), *opt,
                                                       load_optim, o);
  if (!st) return;
  if (scaler && !st->grad_scaler.empty())
    scaler->load_state({st->grad_scaler.at("scale").get<double>(),
                        st->grad_scaler.at("growth_tracker").get<int64_t>(),
                        st->grad_scaler.at("hysteresis_tracker").get<int64_t>()});
  if (!a.finetune) {
    iteration = st->iteration;
    consumed_train = st->consumed_train_samples, consumed_valid = st->consumed_valid_samples;
    flops_so_far = st->num_floating_point_operations_so_far;
    auto policy = a.override_opt_param_scheduler ? optim::SchedulerLoadPolicy::OverrideFromArgs
                  : a.use_checkpoint_opt_param_scheduler ? optim::SchedulerLoadPolicy::UseCheckpoint
                                                         : optim::SchedulerLoadPolicy::RequireMatch;
    sched->load_state(st->scheduler, policy);
  }
  log::info("  successfully loaded checkpoint from {} [ iteration {} ]{}", *a.load, st->iteration,
            a.finetune ? " for finetuning (counters reset)" : "");
}

namespace {

void print_validation(const std::string& where, double loss) {
  std::string line = format_validation_line(where, {{"lm loss", loss}});
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
  const int64_t gbs = a.global_batch_size;
  const double flops_per_iter = num_floating_point_operations(a, gbs);
  const auto t_start = std::chrono::steady_clock::now();
  int64_t& iteration = s.iteration;
  const int64_t start_iteration = iteration;
  bool saved_now = false;
  auto finish = [&] {
    out.iterations = iteration - start_iteration;
    out.consumed_samples = s.consumed_train;
    out.skipped_iterations = s.skipped_iters;
    out.loss_scale = s.scaler ? s.scaler->scale() : 1.0;
    return out;
  };
  log::info("training ...");
  if (iteration > 0)
    log::info("resuming at iteration {} ({} samples consumed)", iteration, s.consumed_train);
  s.log->restart_interval();

  StepProfiler profiler(a, s.device, s.world->world().rank(), s.world->world().size());
  while (!a.skip_train && iteration < a.train_iters) {
    if (s.async_saver) s.async_saver->poll();  // a failed background save surfaces here
    profiler.before_step(iteration);
    ++iteration;
    saved_now = false;
    const StepResult r = s.train_step();
    profiler.after_step(iteration);
    s.consumed_train += gbs;
    s.flops_so_far += flops_per_iter;
    if (iteration == start_iteration + 1)
      s.log->activation_memory(iteration, s.model->activation_memory());
    out.losses.push_back(r.loss);
    s.log->record(r.loss, r.grad_norm, r.skipped);
    s.log->record_moe(r.moe, r.skipped);
    if (s.log->due(iteration))
      s.log->log_interval(iteration,
                          {s.consumed_train, s.sched->lr(), s.scaler ? s.scaler->scale() : 1.0,
                           s.skipped_iters, s.nan_iters, flops_per_iter});
    if (a.eval_interval && iteration % *a.eval_interval == 0 && s.datasets[1]) {
      out.last_valid_loss = s.evaluate(1, s.consumed_valid);
      print_validation("iteration " + std::to_string(iteration), out.last_valid_loss);
      s.log->restart_interval();  // evaluation time is not training time
    }
    if (a.save && a.save_interval && iteration % *a.save_interval == 0) {
      s.save();
      saved_now = true;
    }
    // Exit conditions, as checkpoint_and_decide_exit(): each saves first when --save is set.
    std::string exit_reason;
    if (exit_signal_received())
      exit_reason = "exiting on SIGTERM (--exit-signal-handler)";
    else if (a.exit_interval && iteration % *a.exit_interval == 0)
      exit_reason = fmt::format("exiting program at iteration {} (--exit-interval {})", iteration,
                                *a.exit_interval);
    if (a.exit_duration_in_mins) {
      double mins =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count() / 60.0;
      if (mins > double(*a.exit_duration_in_mins))
        exit_reason =
            fmt::format("exiting program after {:.2f} minutes (--exit-duration-in-mins {})", mins,
                        *a.exit_duration_in_mins);
    }
    if (!exit_reason.empty()) {
      if (a.save && !saved_now) s.save(), saved_now = true;
      if (s.async_saver) s.async_saver->wait();
      log::info("{}", exit_reason);
      return finish();
    }
  }
  if (a.save && !saved_now && iteration > start_iteration) s.save();
  if (s.async_saver) s.async_saver->wait();
  log::info("after training is done");
  if (s.datasets[1] && a.eval_interval) {
    out.last_valid_loss = s.evaluate(1, s.consumed_valid);
    print_validation("iteration " + std::to_string(iteration) + " on validation set",
                     out.last_valid_loss);
  }
  if (s.datasets[2] && a.eval_interval) {
    int64_t consumed_test = 0;
    double test = s.evaluate(2, consumed_test);
    print_validation("iteration " + std::to_string(iteration) + " on test set", test);
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
