#include "training/trainer.h"

#include <omp.h>

#include <cblas.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cmath>

#include "base/log.h"
#include "base/timer.h"
#include "checkpoint/async_saver.h"
#include "checkpoint/checkpoint.h"
#include "data/dataset_builder.h"
#include "data/tokenizers/tokenizer.h"
#include "model/gpt_model.h"
#include "ops/ops.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "training/flops.h"
#include "training/log_line.h"

namespace mcpp::training {

namespace {

std::unique_ptr<data::Tokenizer> build_tokenizer(const Args& a) {
  data::TokenizerArgs t;
  t.type = a.tokenizer_type, t.vocab_size = a.vocab_size;
  t.vocab_file = a.vocab_file.value_or(""), t.merge_file = a.merge_file.value_or("");
  t.tokenizer_model = a.tokenizer_model.value_or("");
  return data::make_tokenizer(t);
}

model::TransformerConfig model_config(const Args& a, DType dt) {
  model::TransformerConfig c;
  c.num_layers = a.num_layers, c.hidden_size = a.hidden_size;
  c.ffn_hidden_size = a.ffn_hidden_size, c.num_attention_heads = a.num_attention_heads;
  c.num_query_groups = a.num_query_groups, c.kv_channels = a.kv_channels;
  c.seq_length = a.seq_length, c.max_position_embeddings = a.max_position_embeddings;
  c.padded_vocab_size = *a.padded_vocab_size;
  c.rope = a.position_embedding_type == "rope";
  c.rotary_base = double(a.rotary_base), c.rotary_percent = a.rotary_percent;
  c.rmsnorm = a.normalization == "RMSNorm", c.norm_epsilon = a.layernorm_epsilon;
  c.swiglu = a.swiglu, c.tie_embeddings = !a.untie_embeddings_and_output_weights;
  c.add_bias_linear = a.add_bias_linear;
  c.hidden_dropout = a.hidden_dropout, c.attention_dropout = a.attention_dropout;
  c.init_method_std = a.init_method_std, c.seed = uint64_t(a.seed), c.dtype = dt;
  c.tp_size = a.tensor_model_parallel_size, c.tp_rank = 0;
  return c;
}

// Flags the trainer cannot honour yet are errors here, never silently ignored.
void reject_unsupported(const Args& a) {
  auto no = [](bool cond, const char* flag, const char* hint) {
    MCPP_CHECK_HINT(!cond, hint, "{} is not supported by megatron.cpp's trainer yet", flag);
  };
  no(a.bf16 || a.fp16, "--bf16/--fp16 on the CPU backend",
     "the CPU backend trains in fp32; mixed precision comes with --device cuda");
  no(a.device == "cuda", "--device cuda", "train with --device cpu (the default) for now");
  no(a.reset_position_ids, "--reset-position-ids", "drop the flag");
  no(a.reset_attention_mask, "--reset-attention-mask", "drop the flag");
  MCPP_CHECK_HINT(!a.save_interval || a.save, "add --save DIR",
                  "--save-interval {} given without --save", *a.save_interval);
  MCPP_CHECK_HINT(!a.save_interval || *a.save_interval > 0, "use a positive interval",
                  "--save-interval must be positive, got {}", *a.save_interval);
  no(a.tensor_model_parallel_size > 1, "--tensor-model-parallel-size > 1",
     "tensor parallelism lands with the parallelism issue");
}

std::atomic<bool> g_exit_signal{false};
extern "C" void on_exit_signal(int) { g_exit_signal.store(true); }

}  // namespace

struct Trainer::State {
  Args args;
  std::unique_ptr<data::Tokenizer> tok;
  std::unique_ptr<model::GPTModel> model;
  std::unique_ptr<optim::AdamW> opt;
  std::unique_ptr<optim::OptimizerParamScheduler> sched;
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
    st.optimizer_steps = opt->steps();
    st.rng_seed = uint64_t(args.seed), st.rng_iteration = iteration;
    st.num_floating_point_operations_so_far = flops_so_far;
    st.data_loader = {{"consumed_train_samples", consumed_train},
                      {"consumed_valid_samples", consumed_valid}};
    nlohmann::json cfg = nlohmann::json::object();
    for (const auto& [k, v] : args.given) cfg[k] = v;
    st.config = cfg;
    return st;
  }

  void save() {
    const Args& a = args;
    checkpoint::SaveOptions o;
    o.model = model_cfg, o.save_rng = !a.no_save_rng;
    const optim::AdamW* o_ptr = a.no_save_optim ? nullptr : opt.get();
    Timer t;
    t.start();
    if (async_saver) {
      async_saver->save(*a.save, model->params(), o_ptr, training_state(), o);
      log::info("  scheduled asynchronous save of checkpoint at iteration {:8d} to {}", iteration,
                *a.save);
    } else {
      checkpoint::save_checkpoint(*a.save, model->params(), o_ptr, training_state(), o);
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
    optim::AdamW* o_ptr = (a.no_load_optim || a.finetune) ? nullptr : opt.get();
    auto st = checkpoint::load_checkpoint(*a.load, a.ckpt_step, model->params(), o_ptr, o);
    if (!a.finetune) {
      iteration = st.iteration;
      consumed_train = st.consumed_train_samples, consumed_valid = st.consumed_valid_samples;
      flops_so_far = st.num_floating_point_operations_so_far;
      if (o_ptr) opt->set_steps(st.optimizer_steps);
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
    const int64_t dp_rank = 0;
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
    // (ARCHITECTURE.md), so every split of the batch trains the same function.
    const double grad_scale = tokens > 0 ? 1.0 / tokens : 0.0;
    double loss_sum = 0;
    model::StepKeys keys;
    keys.iteration = iteration, keys.global_batch = args.global_batch_size;
    keys.training = training;
    for (int64_t j = 0; j < M; ++j) {
      keys.sample_offset = offsets[j];
      loss_sum += model->forward(mbs[j], keys);
      if (training) model->backward(grad_scale);
    }
    return {loss_sum, tokens};
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
  validate_args(a, 1);
  reject_unsupported(a);
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

  s.model_cfg = model_config(a, DType::F32);
  s.model = std::make_unique<model::GPTModel>(s.model_cfg);
  log::info(" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): {}",
            s.model->params().total_numel());
  s.opt = std::make_unique<optim::AdamW>(
      s.model->params(), optim::AdamWConfig{a.adam_beta1, a.adam_beta2, a.adam_eps});
  s.sched = std::make_unique<optim::OptimizerParamScheduler>(lr_scheduler_config(a));
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
  d.eod_mask_loss = a.eod_mask_loss;
  const int64_t gbs = a.global_batch_size;
  d.num_samples[0] = a.train_samples.value_or(a.train_iters * gbs);
  if (a.eval_interval)
    d.num_samples[1] = (a.train_iters / *a.eval_interval + 1) * a.eval_iters * gbs;
  d.num_samples[2] = a.eval_iters * gbs;
  log::info("> building train, validation, and test datasets ...");
  s.datasets = data::build_train_valid_test_datasets(d);
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
  int64_t interval_iters = 0;
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
    s.timers("forward-backward").start();
    auto [loss_sum, tokens] = s.run_batch(*s.datasets[0], s.consumed_train, iteration, true);
    s.timers("forward-backward").stop();
    const double loss = tokens > 0 ? loss_sum / tokens : 0.0;

    s.timers("optimizer").start();
    const double grad_norm = std::sqrt(s.opt->grad_sq_norm());
    if (!std::isfinite(grad_norm) || !std::isfinite(loss)) {
      // Megatron's check-for-nan: the update is skipped and counted.
      ++s.skipped_iters, ++s.nan_iters;
      log::warn("iteration {}: non-finite loss ({}) or grad norm ({}); update skipped", iteration,
                loss, grad_norm);
    } else {
      s.opt->clip(a.clip_grad, grad_norm);
      s.opt->step(s.sched->lr(), s.sched->wd());
      s.sched->step(gbs);
    }
    s.timers("optimizer").stop();
    s.consumed_train += gbs;
    s.flops_so_far += flops_per_iter;
    out.losses.push_back(loss);
    interval_loss += loss, ++interval_iters, last_grad_norm = grad_norm;

    if (iteration % a.log_interval == 0 || iteration == a.train_iters) {
      const double elapsed = interval.elapsed(true);
      const double per_iter = elapsed / double(interval_iters);
      IterationLog L;
      L.iteration = iteration, L.train_iters = a.train_iters;
      L.consumed_samples = s.consumed_train;
      L.elapsed_ms_per_iteration = per_iter * 1e3;
      L.throughput_tflops = throughput_tflops_per_gpu(flops_per_iter, per_iter, 1);
      L.learning_rate = s.sched->lr();
      L.global_batch_size = gbs;
      L.losses = {{"lm loss", interval_loss / double(interval_iters)}};
      L.grad_norm = last_grad_norm;
      L.skipped_iterations = s.skipped_iters, L.nan_iterations = s.nan_iters;
      L.tokens_per_sec_per_gpu = double(gbs * a.seq_length) / per_iter;
      log::info("{}", format_iteration_line(L));
      if (a.timing_log_level >= 1) {
        log::info("(min, max) time across ranks (ms):");
        for (auto& [name, t] : s.timers.all()) {
          double ms = const_cast<Timer&>(t).elapsed(true) * 1e3 / double(interval_iters);
          std::string dots(std::max<int>(2, 48 - int(name.size())), '.');
          log::info("    {} {}: ({:.2f}, {:.2f})", name, dots, ms, ms);
        }
      }
      interval_loss = 0, interval_iters = 0;
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
