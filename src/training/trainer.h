// The training loop of `megatron train`, as Megatron's pretrain(): set-up (args,
// tokenizer, model, optimizer, scheduler, datasets; trainer_setup.cpp), then iterations
// of train_step -- num_microbatches forward/backward passes (forward_backward.h)
// accumulated into one optimizer step after finalize_model_grads -- the Megatron log line
// every --log-interval (training_log.h), evaluation every --eval-interval, checkpoints
// (checkpoint/training_checkpoint.h), and the exit conditions (trainer.cpp).
#pragma once
#include <memory>
#include <vector>

#include "data/tokenizers/tokenizer.h"
#include "training/arguments.h"

namespace mcpp::training {

struct TrainSummary {
  int64_t iterations = 0;          // iterations run by this call
  std::vector<double> losses;      // lm loss of every iteration run
  double last_valid_loss = 0;      // last validation lm loss (0 when none ran)
  int64_t consumed_samples = 0;
  int64_t skipped_iterations = 0;  // steps skipped (fp16 overflows, non-finite losses)
  double loss_scale = 1.0;         // the fp16 loss scale at the end (1 without --fp16)
};

class Trainer {
 public:
  explicit Trainer(Args args);
  ~Trainer();
  TrainSummary run();

 private:
  struct State;
  std::unique_ptr<State> s_;
};

// The tokenizer the flags select (--tokenizer-type and its files).
std::unique_ptr<data::Tokenizer> build_tokenizer(const Args& a);

// `megatron train` entry point: parses flags, trains, returns the exit code.
int train_main(const std::vector<std::string>& argv);

}  // namespace mcpp::training
