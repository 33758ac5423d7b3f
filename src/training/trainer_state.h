// Trainer::State: everything one rank's training run holds, shared by trainer.cpp (the
// loop) and trainer_setup.cpp (building it from the flags). Private to src/training.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/async_saver.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/megatron/megatron_train.h"
#include "comm/world.h"
#include "data/gpt_dataset.h"
#include "data/micro_batches.h"
#include "data/num_microbatches.h"
#include "model/gpt_model.h"
#include "optim/loss_scaler.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/grad_buffer.h"
#include "parallel/finalize_model_grads.h"
#include "parallel/parallel_state.h"
#include "parallel/pipeline/schedule.h"
#include "training/forward_backward.h"
#include "training/memory_plan.h"
#include "training/progress_log.h"
#include "training/trainer.h"
#include "training/training_log.h"
#include "training/validate_compat.h"

namespace mcpp::training {

// What one train_step did.
struct StepResult {
  double loss = 0;       // lm loss of the global batch
  double grad_norm = 0;  // before clipping; non-finite on an fp16 overflow
  bool skipped = false;  // no update (overflow or non-finite loss)
  // The log line's MoE aux-loss values (moe_step.h), then the MTP losses (mtp_step.h).
  std::vector<std::pair<std::string, double>> moe;
};

struct Trainer::State {
  // Declared first, destroyed last: every communicator outlives its users.
  std::unique_ptr<comm::World> world;
  std::unique_ptr<parallel::ParallelState> ps;
  // Pipeline parallelism: a second communicator over each pipeline group, for gradients
  // (activations use ps->pp()), and this stage's action lists.
  std::unique_ptr<comm::Communicator> pp_grads;
  parallel::pipeline::ScheduleKind schedule_kind = parallel::pipeline::ScheduleKind::OneFOneB;
  StageMemory plan;                                      // predicted at start-up
  parallel::pipeline::Schedule schedule;                 // [stage][action], training step
  std::vector<parallel::pipeline::Action> forward_only;  // this stage, evaluation
  Args args;
  std::unique_ptr<data::Tokenizer> tok;
  model::TransformerConfig model_cfg;
  std::unique_ptr<model::GPTModel> model;
  std::unique_ptr<parallel::DataParallelGrads> dp_grads;
  std::unique_ptr<optim::Optimizer> opt;  // AdamW, or with --use-distributed-optimizer sharded
  // finalize_model_grads's view of every parameter, and the group the grad norm sums over.
  std::vector<parallel::GradParam> grad_params;
  comm::Communicator* norm_group = nullptr;
  // EP > 1: the group over which expert gradients' squares add up in the grad norm (null
  // when the optimizer's shards are distinct over norm_group), and expert parameters'
  // (--log-params-norm).
  comm::Communicator* expert_norm_group = nullptr;
  comm::Communicator* expert_mp_group = nullptr;
  std::unique_ptr<optim::OptimizerParamScheduler> sched;
  std::unique_ptr<optim::LossScaler> scaler;  // --fp16
  std::unique_ptr<ForwardBackward> fwd_bwd;
  std::unique_ptr<TrainingLog> log;
  Device device = Device::CPU;  // --device, resolved
  std::array<std::shared_ptr<data::GPTSampleSource>, 3> datasets;
  // The validation sets Megatron's valid iterators read: datasets[1], or with
  // --multiple-validation-sets each --valid-data-path prefix; the log's suffix ("" for one
  // set; "-NAME" or "-INDEX" for several) and, with --full-validation, this DP rank's place
  // in its cyclic one-sample sampler (0 at every start, as Megatron's) and the iterations
  // of one evaluation (ceil(samples / DP): what the DP rank with the most samples reads).
  struct ValidSet {
    std::shared_ptr<data::GPTSampleSource> ds;
    std::string suffix;
    int64_t cursor = 0, iters = 0;
  };
  std::vector<ValidSet> valid_sets;
  int64_t consumed_train = 0, consumed_valid = 0;
  // samples of --iterations-to-skip (counted in consumed_train too) and the global batch's
  // deficit of every step under --decrease-batch-size-if-needed (not consumed)
  int64_t skipped_train = 0;
  int64_t skipped_iters = 0, nan_iters = 0;
  data::GPTSample sample;  // scratch of the micro-batch assembly
  int64_t iteration = 0;
  double flops_so_far = 0;
  std::unique_ptr<checkpoint::AsyncSaver> async_saver;
  // --log-progress: <--save>/progress.txt; the FLOPs loaded from the checkpoint (this job's
  // start), and the iteration of an asynchronous save not committed yet.
  std::unique_ptr<ProgressLog> progress;
  double flops_at_job_start = 0;
  std::optional<int64_t> progress_async_iteration;
  // --rampup-batch-size: this step's global batch and micro-batches (Megatron's
  // num_microbatches_calculator, updated from consumed_train before every step); without
  // a ramp-up they stay args' global_batch_size / num_microbatches.
  std::unique_ptr<data::NumMicroBatchesCalculator> batches;
  // Tokenizer files --load's checkpoint carries (and this run's checkpoints carry on).
  std::optional<checkpoint::TokenizerFiles> tokenizer_files;
  // The checkpoint the run starts from: --load, or --pretrained-checkpoint (a finetune).
  std::optional<LoadSource> load_source;
  int64_t built_schedule_microbatches = 0;  // PP: the micro-batches `schedule` was built for
  bool eval_shape_logged = false;  // the first evaluation's micro-batches, logged once
  void update_step_batch();                 // batches->update + the PP schedule to match
  int64_t step_global_batch() const { return batches->current_global_batch_size(); }
  // --decoupled-lr: the embedding/output group's LR now (the schedule with its own max/min).
  double decoupled_lr() const {
    return sched->lr_for(*args.decoupled_lr, args.decoupled_min_lr.value_or(args.min_lr));
  }
  // --use-mup: this step's muP groups (Megatron's get_mup_config_overrides): the schedule with
  // max and min LR divided by the width multiplier for the hidden matrices (SGD: multiplied,
  // for the vector-like parameters), and Adam's epsilon divided by it; nothing at width 1.
  optim::Optimizer::MupRates mup_rates() const {
    optim::Optimizer::MupRates r;
    const double m = args.mup_width_mult;
    if (!args.use_mup || m == 1.0) return r;
    if (args.optimizer == "sgd") {
      r.vector_lr = sched->lr_for(args.lr * m, args.min_lr * m);
      return r;
    }
    r.hidden_lr = sched->lr_for(args.lr / m, args.min_lr / m);
    if (args.optimizer.find("adam") != std::string::npos) r.hidden_eps = args.adam_eps / m;
    return r;
  }

  // trainer_setup.cpp: the steps of Trainer::Trainer.
  void setup_parallel();
  void build_model();
  void build_optimizer();
  void build_datasets();
  // valid_sets from --multiple-validation-sets' own datasets (else datasets[1]).
  void build_validation_sets(std::vector<std::shared_ptr<data::GPTSampleSource>> sets);

  // trainer.cpp
  std::pair<double, double> forward_backward(const data::GPTSampleSource& ds, int64_t consumed,
                                             int64_t iteration, bool training);
  void finalize_grads();
  StepResult train_step();
  // The forward (and, training, backward) of a loaded batch: {loss sum, tokens} over DP x CP.
  std::pair<double, double> run_batch(const data::LocalBatch& batch, int64_t global_batch,
                                      int64_t iteration, bool training);
  double evaluate(int split, int64_t& consumed);
  double evaluate_full(ValidSet& v);  // --full-validation: one epoch of v
  checkpoint::TrainingState training_state() const;
  // non_persistent: --non-persistent-save-interval's save, into Args::non_persistent_dir,
  // which keeps only the newest (Megatron's save_checkpoint(non_persistent_ckpt=True)).
  void save(bool non_persistent = false);
  // --ckpt-format torch: what the legacy layout's saves need (megatron_train.h).
  checkpoint::megatron::LegacyTrainOptions legacy_options() const;
  void load();
  // --check-weight-hash-across-dp-replicas-interval: every replica's weights are the same
  // (training/weight_hash.h), or an error on every rank.
  void check_weight_hashes();
  // --async-save: commit a finished background save (blocking: wait for it first).
  void finish_async_save(bool blocking);
};

// SIGTERM with --exit-signal-handler: the loop saves and exits at the end of the iteration.
// --exit-signal-handler: the handler for signal `signum` (signal_number(--exit-signal)).
void install_exit_signal_handler(int signum);
bool exit_signal_received();

}  // namespace mcpp::training
