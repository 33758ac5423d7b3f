// validate_args: Megatron's derived defaults and every configuration error, with hints.
#include <fmt/format.h>

#include <algorithm>
#include <iterator>

#include "model/memory_estimate.h"
#include "test_util.h"
#include "training/memory_plan.h"
#include "training/trainer.h"
#include "training/training_log.h"

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

namespace validate_test {
void expect_invalid(const std::vector<std::string>& argv, std::initializer_list<std::string> n,
                    int world = 1) {
  expect_error([&] { parse_and_validate(argv, world); }, n);
}

TEST(Validate, DerivedDefaults) {
  Args a = parse_and_validate(base_argv(), 4);
  EXPECT_EQ(a.ffn_hidden_size, 256);  // 4h
  EXPECT_EQ(a.kv_channels, 16);       // h / heads
  EXPECT_EQ(a.num_query_groups, 4);   // = heads without GQA
  EXPECT_EQ(a.world_size, 4);
  EXPECT_EQ(a.data_parallel_size, 4);
  EXPECT_EQ(a.global_batch_size, 8);  // mbs * DP
  EXPECT_EQ(a.num_microbatches, 1);
  EXPECT_EQ(a.lr_decay_iters, 10);  // = train_iters
  EXPECT_EQ(a.start_weight_decay, 0.01);
  EXPECT_EQ(a.end_weight_decay, 0.01);
  EXPECT_FALSE(a.split.has_value());  // mock data: no split
}

TEST(Validate, SwigluFfnAndGqaAndTp) {
  // Llama-2-7B-like widths: int(4h*2/3/64)*64 = 10880 for h = 4096.
  auto v = with(without(without(without(base_argv(), "--hidden-size"), "--num-attention-heads"),
                        "--max-position-embeddings"),
                {"--hidden-size", "4096", "--num-attention-heads", "32", "--swiglu",
                 "--group-query-attention", "--num-query-groups", "8", "--max-position-embeddings",
                 "4096", "--tensor-model-parallel-size", "2"});
  Args a = parse_and_validate(v, 4);
  EXPECT_EQ(a.ffn_hidden_size, 10880);
  EXPECT_EQ(a.kv_channels, 128);
  EXPECT_EQ(a.num_query_groups, 8);
  EXPECT_EQ(a.data_parallel_size, 2);
  EXPECT_EQ(a.global_batch_size, 4);
  // h = 768 with SwiGLU: int(2048/64)*64 = 2048.
  Args b = parse_and_validate(
      with(without(base_argv(), "--hidden-size"), {"--hidden-size", "768", "--swiglu"}));
  EXPECT_EQ(b.ffn_hidden_size, 2048);
  // Explicit values win.
  Args c =
      parse_and_validate(with(base_argv(), {"--ffn-hidden-size", "100", "--kv-channels", "8"}));
  EXPECT_EQ(c.ffn_hidden_size, 100);
  EXPECT_EQ(c.kv_channels, 8);
}

TEST(Validate, TrainSamplesDeriveItersAndDecaySamples) {
  auto v = with(without(base_argv(), "--train-iters"),
                {"--train-samples", "1000", "--global-batch-size", "16"});
  Args a = parse_and_validate(v);
  EXPECT_TRUE(a.sample_based());
  EXPECT_EQ(a.train_iters, 62);  // 1000 // 16
  EXPECT_EQ(a.lr_decay_samples, 1000);
  EXPECT_FALSE(a.lr_decay_iters.has_value());
  EXPECT_EQ(a.num_microbatches, 8);
}

TEST(Validate, SplitDefaultWithDataPath) {
  Args a = parse_and_validate(with(without(base_argv(), "--mock-data"), {"--data-path", "x"}));
  EXPECT_EQ(a.split, "969, 30, 1");
}

TEST(Validate, RequiredFlags) {
  for (const char* flag :
       {"--num-layers", "--hidden-size", "--num-attention-heads", "--max-position-embeddings",
        "--micro-batch-size", "--seq-length", "--lr"})
    expect_invalid(without(base_argv(), flag), {"missing required flag(s):", flag});
  expect_invalid(without(without(base_argv(), "--lr"), "--seq-length"),
                 {"missing required flag(s): --seq-length, --lr"});
  // --lr is required only for training.
  Args a = parse_args(without(base_argv(), "--lr"));
  EXPECT_NO_THROW(validate_args(a, 1, /*training=*/false));
}

TEST(Validate, ExactlyOneOfTrainItersAndSamples) {
  expect_invalid(without(base_argv(), "--train-iters"),
                 {"exactly one of --train-iters and --train-samples", "neither"});
  expect_invalid(with(base_argv(), {"--train-samples", "100"}),
                 {"exactly one of --train-iters and --train-samples", "both"});
}

TEST(Validate, HiddenNotDivisibleByHeads) {
  auto v = with(without(base_argv(), "--hidden-size"), {"--hidden-size", "66"});
  expect_invalid(v,
                 {"--hidden-size 66 is not divisible by --num-attention-heads 4", "--kv-channels"});
  Args a = parse_and_validate(with(v, {"--kv-channels", "16"}));  // fine with explicit head dim
  EXPECT_EQ(a.kv_channels, 16);
}

TEST(Validate, HeadsAndGroupsAndTp) {
  expect_invalid(with(base_argv(), {"--group-query-attention", "--num-query-groups", "3"}),
                 {"--num-attention-heads 4 is not divisible by --num-query-groups 3"});
  expect_invalid(with(base_argv(), {"--tensor-model-parallel-size", "3"}),
                 {"--num-attention-heads 4 is not divisible by --tensor-model-parallel-size 3"}, 3);
  expect_invalid(with(base_argv(), {"--group-query-attention", "--num-query-groups", "2",
                                    "--tensor-model-parallel-size", "4"}),
                 {"--num-query-groups 2 is not divisible by --tensor-model-parallel-size 4"}, 4);
}

TEST(Validate, GlobalBatchMultipleOfMicroTimesDp) {
  expect_invalid(with(base_argv(), {"--global-batch-size", "10"}),
                 {"--global-batch-size 10 is not a multiple of --micro-batch-size 2 x "
                  "data-parallel size 2 = 4",
                  "use a multiple of 4, e.g. 8 or 12"},
                 2);
}

TEST(Validate, SeqLengthAboveMaxPositions) {
  auto v = with(without(base_argv(), "--seq-length"), {"--seq-length", "64"});
  expect_invalid(v, {"--seq-length 64 is larger than --max-position-embeddings 32"});
  expect_invalid(with(v, {"--position-embedding-type", "rope"}),
                 {"--seq-length 64 is larger than --max-position-embeddings 32"});
}

TEST(Validate, WorldNotDivisibleByModelParallel) {
  expect_invalid(with(base_argv(), {"--tensor-model-parallel-size", "4"}),
                 {"world size (6) is not divisible by --tensor-model-parallel-size 4"}, 6);
}

TEST(Validate, WarmupFractionWithWarmupIters) {
  expect_invalid(with(base_argv(), {"--lr-warmup-fraction", "0.1", "--lr-warmup-iters", "2"}),
                 {"can only specify one of --lr-warmup-fraction (0.1) and --lr-warmup-iters (2)"});
  auto s =
      with(without(base_argv(), "--train-iters"),
           {"--train-samples", "100", "--lr-warmup-fraction", "0.1", "--lr-warmup-samples", "5"});
  expect_invalid(s, {"can only specify one of --lr-warmup-fraction"});
  expect_invalid(with(base_argv(), {"--lr-warmup-samples", "5"}),
                 {"--lr-warmup-samples is for sample-based runs"});
}

TEST(Validate, MinLrAboveLr) {
  expect_invalid(with(base_argv(), {"--min-lr", "0.01"}),
                 {"--min-lr 0.01 is larger than --lr 0.001"});
}

TEST(Validate, DropoutRange) {
  expect_invalid(with(base_argv(), {"--hidden-dropout", "1.0"}),
                 {"--hidden-dropout 1 is outside [0, 1)"});
  expect_invalid(with(base_argv(), {"--attention-dropout", "-0.1"}),
                 {"--attention-dropout -0.1 is outside [0, 1)"});
  EXPECT_NO_THROW(parse_and_validate(with(base_argv(), {"--hidden-dropout", "0"})));
}

TEST(Validate, NegativeSizes) {
  expect_invalid(with(base_argv(), {"--num-layers", "-2"}), {"--num-layers -2 must be positive"});
  expect_invalid(with(base_argv(), {"--micro-batch-size", "0"}),
                 {"--micro-batch-size 0 must be positive"});
  expect_invalid(with(base_argv(), {"--ffn-hidden-size", "-1"}),
                 {"--ffn-hidden-size -1 must be positive"});
  expect_invalid(with(base_argv(), {"--lr-warmup-iters", "-1"}),
                 {"--lr-warmup-iters -1 must not be negative"});
  expect_invalid(with(base_argv(), {"--vocab-size", "-3"}), {"--vocab-size -3 must be positive"});
}

TEST(Validate, NullTokenizerNeedsVocabSize) {
  expect_invalid(without(base_argv(), "--vocab-size"),
                 {"--tokenizer-type NullTokenizer needs --vocab-size"});
  expect_invalid(without(base_argv(), "--tokenizer-type"),
                 {"GPT2BPETokenizer (pretrain_gpt.py's default) needs --vocab-file and "
                  "--merge-file"});
  expect_invalid(with(base_argv(), {"--tokenizer-type", "SentencePieceTokenizer"}),
                 {"--tokenizer-type SentencePieceTokenizer needs --tokenizer-model"});
  expect_invalid(with(base_argv(), {"--tokenizer-type", "BertWordPieceCase"}),
                 {"--tokenizer-type BertWordPieceCase is not implemented"});
}

TEST(Validate, Bf16WithFp16) {
  expect_invalid(with(base_argv(), {"--bf16", "--fp16"}), {"--bf16 and --fp16 were both given"});
  EXPECT_TRUE(parse_and_validate(with(base_argv(), {"--bf16"})).bf16);
  // Loss scaling acts on --fp16 only: other values would be ignored, so they are errors.
  expect_invalid(with(base_argv(), {"--bf16", "--initial-loss-scale", "65536"}),
                 {"--initial-loss-scale scales the loss of --fp16 training only", "--fp16"});
  expect_invalid(with(base_argv(), {"--loss-scale", "128"}), {"--loss-scale scales the loss"});
  EXPECT_NO_THROW(parse_and_validate(with(base_argv(), {"--bf16", "--hysteresis", "2"})));
  Args f = parse_and_validate(with(base_argv(), {"--fp16", "--loss-scale-window", "500",
                                                 "--hysteresis", "3", "--min-loss-scale", "2",
                                                 "--initial-loss-scale", "1024"}));
  EXPECT_EQ(f.loss_scale_window, 500);
  EXPECT_EQ(f.hysteresis, 3);
  EXPECT_EQ(f.min_loss_scale, 2);
  EXPECT_EQ(f.initial_loss_scale, 1024);
  EXPECT_FALSE(f.loss_scale.has_value());
}

// --grad-reduce-in-bf16: an error without --bf16 (naming the fix); one log line and no
// error where there is no data-parallel reduction to make (DP 1); silent otherwise.
TEST(Validate, GradReduceInBf16) {
  expect_invalid(
      with(base_argv(), {"--grad-reduce-in-bf16"}),
      {"--grad-reduce-in-bf16 needs --bf16", "neither --bf16 nor --fp16 was given", "add --bf16"},
      2);
  expect_invalid(
      with(base_argv(), {"--fp16", "--grad-reduce-in-bf16"}),
      {"--grad-reduce-in-bf16 needs --bf16", "--fp16 was given", "--bf16 instead of --fp16"}, 2);
  const std::string note = "--grad-reduce-in-bf16 has no effect: the data-parallel size is 1";
  auto validated_output = [](const std::vector<std::string>& argv, int world, Args& a) {
    testing::internal::CaptureStdout();
    a = parse_and_validate(argv, world);
    return testing::internal::GetCapturedStdout();
  };
  Args a;
  std::string out = validated_output(with(base_argv(), {"--bf16", "--grad-reduce-in-bf16"}), 2, a);
  EXPECT_TRUE(a.grad_reduce_in_bf16);
  EXPECT_EQ(a.data_parallel_size, 2);
  EXPECT_EQ(out.find(note), std::string::npos) << out;
  // DP 1: one rank, or TP over every rank.
  out = validated_output(with(base_argv(), {"--bf16", "--grad-reduce-in-bf16"}), 1, a);
  EXPECT_TRUE(a.grad_reduce_in_bf16);
  ASSERT_NE(out.find(note), std::string::npos) << out;
  EXPECT_EQ(out.find(note, out.find(note) + 1), std::string::npos) << "logged twice:\n" << out;
  out = validated_output(
      with(base_argv(), {"--bf16", "--grad-reduce-in-bf16", "--tensor-model-parallel-size", "2"}),
      2, a);
  EXPECT_NE(out.find(note), std::string::npos) << out;
  EXPECT_FALSE(parse_and_validate(with(base_argv(), {"--bf16"}), 2).grad_reduce_in_bf16);
}

// --num-distributed-optimizer-instances: what Megatron asserts, with the flags named.
TEST(Validate, DistributedOptimizerInstances) {
  const auto dist = with(base_argv(), {"--use-distributed-optimizer"});
  Args a = parse_and_validate(with(dist, {"--num-distributed-optimizer-instances", "2"}), 4);
  EXPECT_EQ(a.num_distributed_optimizer_instances, 2);
  EXPECT_EQ(parse_and_validate(dist, 4).num_distributed_optimizer_instances, 1);
  expect_invalid(with(dist, {"--num-distributed-optimizer-instances", "0"}),
                 {"--num-distributed-optimizer-instances 0 must be at least 1"}, 4);
  expect_invalid(with(base_argv(), {"--num-distributed-optimizer-instances", "2"}),
                 {"--num-distributed-optimizer-instances 2 needs --use-distributed-optimizer",
                  "add --use-distributed-optimizer"},
                 4);
  expect_invalid(with(dist, {"--num-distributed-optimizer-instances", "3"}),
                 {"--num-distributed-optimizer-instances 3 does not divide the data-parallel "
                  "size 4 x --context-parallel-size 1 = 4",
                  "choose a divisor of 4"},
                 4);
  // TP 2 x DP 2 on 4 ranks: DP 2 splits into 2 instances of one rank.
  EXPECT_NO_THROW(parse_and_validate(with(dist, {"--num-distributed-optimizer-instances", "2",
                                                 "--tensor-model-parallel-size", "2"}),
                                     4));
  expect_invalid(with(dist, {"--num-distributed-optimizer-instances", "4",
                             "--tensor-model-parallel-size", "2"}),
                 {"does not divide the data-parallel size 2"}, 4);
  // Expert parallelism: refused, naming both flags.
  expect_invalid(with(dist, {"--num-distributed-optimizer-instances", "2", "--num-experts", "4",
                             "--disable-bias-linear", "--expert-model-parallel-size", "2"}),
                 {"--num-distributed-optimizer-instances 2 with --expert-model-parallel-size 2",
                  "not implemented yet"},
                 4);
}

TEST(Validate, RotaryPercentRange) {
  expect_invalid(with(base_argv(), {"--rotary-percent", "0"}),
                 {"--rotary-percent 0 is outside (0, 1]"});
  expect_invalid(with(base_argv(), {"--rotary-percent", "1.5"}),
                 {"--rotary-percent 1.5 is outside (0, 1]"});
  EXPECT_NO_THROW(parse_and_validate(with(base_argv(), {"--rotary-percent", "0.5"})));
}

TEST(Validate, ValuesNotImplementedYet) {
  expect_invalid(with(base_argv(), {"--expert-model-parallel-size", "2"}),
                 {"--expert-model-parallel-size 2"}, 2);
  expect_invalid(with(base_argv(), {"--position-embedding-type", "mrope"}),
                 {"--position-embedding-type mrope is not implemented yet",
                  "learned_absolute, rope, yarn or none"});
  expect_invalid(with(base_argv(), {"--optimizer", "soap"}),
                 {"--optimizer soap", "is not implemented yet", "lion, muon or adaptive_muon"});
  // Megatron's deprecated dist_muon: Muon with the distributed optimizer.
  const Args d = parse_and_validate(with(base_argv(), {"--optimizer", "dist_muon"}));
  EXPECT_EQ(d.optimizer, "muon");
  EXPECT_TRUE(d.use_distributed_optimizer);
  Args a = parse_and_validate(with(base_argv(), {"--use-rotary-position-embeddings"}));
  EXPECT_EQ(a.position_embedding_type, "rope");
}

// --log-memory-interval follows the iteration lines (Megatron's assert); the memory line's
// format, with --log-device-memory-used's field (both flags refuse a CPU run at start-up,
// TrainingLog's constructor).
TEST(Validate, MemoryLogging) {
  EXPECT_EQ(parse_and_validate(with(base_argv(), {"--log-interval", "5",
                                                  "--log-memory-interval", "10"}))
                .log_memory_interval,
            std::optional<int64_t>(10));
  expect_invalid(with(base_argv(), {"--log-interval", "4", "--log-memory-interval", "10"}),
                 {"--log-memory-interval 10 is not a positive multiple of --log-interval 4"});
  EXPECT_EQ(format_memory_line(20, 3 << 20, 5 << 20, 8 << 20, 8 << 20, std::nullopt),
            "(after 20 iterations) memory (MB) | allocated: 3.0 | max allocated: 5.0 | "
            "reserved: 8.0 | max reserved: 8.0");
  EXPECT_EQ(format_memory_line(1, 1 << 19, 1 << 20, 1 << 21, 1 << 21, uint64_t(3) << 30),
            "(after 1 iterations) memory (MB) | allocated: 0.5 | max allocated: 1.0 | "
            "reserved: 2.0 | max reserved: 2.0 | total device memory used: 3072.0");
}

// --exit-signal: a signal's name as Megatron's enum takes it, printed as Signals.<NAME>;
// a signal nothing listens for (no --exit-signal-handler) or one that cannot be caught is
// an error.
TEST(Validate, ExitSignal) {
  const auto handler = with(base_argv(), {"--exit-signal-handler"});
  Args a = parse_and_validate(with(handler, {"--exit-signal", "SIGUSR1"}));
  EXPECT_EQ(a.exit_signal, "SIGUSR1");
  EXPECT_EQ(signal_number(a.exit_signal), std::optional<int>(10));
  EXPECT_NE(format_args(a).find("Signals.SIGUSR1"), std::string::npos);
  EXPECT_EQ(parse_and_validate(base_argv()).exit_signal, "SIGTERM");
  EXPECT_NO_THROW(parse_and_validate(with(base_argv(), {"--exit-signal", "SIGTERM"})));
  expect_invalid(with(handler, {"--exit-signal", "15"}), {"--exit-signal 15 is not a signal name"});
  expect_invalid(with(handler, {"--exit-signal", "SIGKILL"}), {"cannot be caught"});
  expect_invalid(with(base_argv(), {"--exit-signal", "SIGUSR2"}),
                 {"without --exit-signal-handler", "add --exit-signal-handler"});
}

TEST(Validate, IterationsToSkip) {
  EXPECT_EQ(parse_and_validate(with(base_argv(), {"--iterations-to-skip", "3", "7"}))
                .iterations_to_skip,
            (std::vector<int64_t>{3, 7}));
  expect_invalid(with(base_argv(), {"--iterations-to-skip", "0"}),
                 {"--iterations-to-skip 0: iterations count from 1"});
}

TEST(Validate, XavierUniformInit) {
  const Args a = parse_and_validate(with(base_argv(), {"--init-method-xavier-uniform"}));
  EXPECT_TRUE(model_config(a, Device::CPU, DType::F32).init_method_xavier_uniform);
  EXPECT_FALSE(
      model_config(parse_and_validate(base_argv()), Device::CPU, DType::F32)
          .init_method_xavier_uniform);
}

// One data source (Megatron's rule), per-split paths without --split, the files'
// flags against their command-line forms; --split's default only for one blend.
TEST(Validate, DataSources) {
  const auto none = without(base_argv(), "--mock-data");
  Args a = parse_and_validate(with(none, {"--train-data-path", "0.5", "A", "0.5", "B",
                                          "--valid-data-path", "C"}));
  EXPECT_EQ(a.train_data_path, (std::vector<std::string>{"0.5", "A", "0.5", "B"}));
  EXPECT_EQ(a.valid_data_path, (std::vector<std::string>{"C"}));
  EXPECT_FALSE(a.split.has_value());
  a = parse_and_validate(with(none, {"--data-args-path", "/d/words.txt"}));
  EXPECT_EQ(a.split, std::optional<std::string>("969, 30, 1"));
  EXPECT_NO_THROW(parse_and_validate(with(none, {"--per-split-data-args-path", "/d/s.json"})));
  expect_invalid(with(base_argv(), {"--train-data-path", "A"}),
                 {"a single data source must be given", "--mock-data", "--train/valid/test"});
  expect_invalid(with(none, {"--data-path", "A", "--train-data-path", "B"}),
                 {"a single data source must be given"});
  expect_invalid(with(none, {"--data-path", "A", "--data-args-path", "/d/w.txt"}),
                 {"--data-path and --data-args-path /d/w.txt both give the data"});
  expect_invalid(with(none, {"--train-data-path", "A", "--per-split-data-args-path", "/d/s.json"}),
                 {"--per-split-data-args-path /d/s.json both give the data"});
  expect_invalid(with(none, {"--train-data-path", "A", "--split", "90,10,0"}),
                 {"--split 90,10,0 with --train/valid/test-data-path", "drop --split"});
  expect_invalid(with(none, {"--valid-data-path", "A"}),
                 {"without --train-data-path", "--skip-train"});
}

// --optimizer sgd / lion and their settings (Megatron's defaults: momentum 0.9, Lion's
// betas 0.95 / 0.98); the legacy checkpoint layout, which holds Adam's state only.
TEST(Validate, ElementWiseOptimizers) {
  Args a = parse_and_validate(with(base_argv(), {"--optimizer", "sgd"}));
  EXPECT_EQ(a.sgd_momentum, 0.9);
  a = parse_and_validate(with(base_argv(), {"--optimizer", "lion", "--lion-beta2", "0.99"}));
  EXPECT_EQ(a.lion_beta1, 0.95);
  EXPECT_EQ(a.lion_beta2, 0.99);
  expect_invalid(with(base_argv(), {"--optimizer", "sgd", "--sgd-momentum", "-0.5"}),
                 {"--sgd-momentum -0.5 must not be negative"});
  expect_invalid(with(base_argv(), {"--optimizer", "lion", "--lion-beta1", "1"}),
                 {"--lion-beta1 1 must lie in [0, 1)"});
  expect_invalid(with(base_argv(), {"--optimizer", "adagrad"}), {"'adagrad' is not one of"});
  const auto legacy = with(base_argv(), {"--optimizer", "lion", "--ckpt-format", "torch",
                                         "--save", "/tmp/x"});
  expect_invalid(legacy, {"--ckpt-format torch with --optimizer lion", "--no-save-optim"});
  EXPECT_NO_THROW(parse_and_validate(with(legacy, {"--no-save-optim"})));
  // The memory plan counts one state buffer instead of Adam's two.
  const auto plan = [](Args x) {
    x.padded_vocab_size = 128;  // the trainer's, from the tokenizer
    return plan_stage_memory(x, model_config(x, Device::CPU, DType::F32), 0).optimizer;
  };
  const Args adam = parse_and_validate(base_argv());
  EXPECT_EQ(plan(adam), 2 * plan(parse_and_validate(with(base_argv(), {"--optimizer", "sgd"}))));
}

// --eval-global-batch-size (default: the global batch), --eval-micro-batch-size (default: the
// micro-batch), --start-eval-at-iter; with virtual pipeline stages the evaluation's
// micro-batch count must make an interleaved schedule too.
TEST(Validate, EvaluationBatch) {
  Args a = parse_and_validate(with(base_argv(), {"--global-batch-size", "8"}), 2);
  EXPECT_EQ(*a.eval_global_batch_size, 8);
  EXPECT_EQ(a.eval_num_microbatches, 2);
  a = parse_and_validate(with(base_argv(), {"--global-batch-size", "8", "--eval-global-batch-size",
                                            "20", "--eval-micro-batch-size", "2",
                                            "--start-eval-at-iter", "4"}),
                         2);
  EXPECT_EQ(*a.eval_global_batch_size, 20);
  EXPECT_EQ(a.eval_num_microbatches, 5);
  EXPECT_EQ(*a.start_eval_at_iter, 4);
  expect_invalid(with(base_argv(), {"--eval-global-batch-size", "6"}),
                 {"--eval-global-batch-size 6 must be divisible by the eval micro-batch size 2 x "
                  "data-parallel size 2",
                  "use a multiple of 4"},
                 2);
  EXPECT_EQ(*a.eval_micro_batch_size, 2);
  // Another evaluation micro-batch: the evaluation's micro-batch count follows it, and the
  // evaluation batch must be a multiple of it times DP (not of the training micro-batch).
  a = parse_and_validate(with(base_argv(), {"--global-batch-size", "8", "--eval-micro-batch-size",
                                            "4"}),
                         2);
  EXPECT_EQ(*a.eval_micro_batch_size, 4);
  EXPECT_EQ(a.eval_num_microbatches, 1);
  EXPECT_EQ(a.num_microbatches, 2);
  a = parse_and_validate(with(base_argv(), {"--global-batch-size", "8", "--eval-micro-batch-size",
                                            "1", "--eval-global-batch-size", "6"}),
                         2);
  EXPECT_EQ(a.eval_num_microbatches, 3);
  expect_invalid(with(base_argv(), {"--global-batch-size", "8", "--eval-micro-batch-size", "3"}),
                 {"--eval-global-batch-size 8 must be divisible by the eval micro-batch size 3 x "
                  "data-parallel size 2",
                  "use a multiple of 6"},
                 2);
  expect_invalid(with(base_argv(), {"--eval-micro-batch-size", "0"}),
                 {"--eval-micro-batch-size 0 must be positive"});
  expect_invalid(with(base_argv(), {"--eval-global-batch-size", "0"}),
                 {"--eval-global-batch-size 0 must be positive"});
  expect_invalid(with(base_argv(), {"--start-eval-at-iter", "-1"}),
                 {"--start-eval-at-iter -1 must not be negative"});
  // Interleaved 1F1B: 4 training micro-batches make a schedule at PP 2, 3 evaluation ones
  // do not.
  const auto vpp = with(base_argv(), {"--num-layers", "4", "--pipeline-model-parallel-size", "2",
                                      "--num-virtual-stages-per-pipeline-rank", "2",
                                      "--global-batch-size", "8"});
  EXPECT_NO_THROW(parse_and_validate(vpp, 2));
  expect_invalid(with(vpp, {"--eval-global-batch-size", "6"}), {"--eval-global-batch-size 6"}, 2);
}

// --use-precision-aware-optimizer: bf16 Adam moments under the distributed optimizer; the
// dtypes without the switch, fp16/fp8 moments, moments of SGD/Lion, and bf16 main grads or
// fp16 main params are errors naming the flag; the plan counts 2 bytes a bf16 moment.
TEST(Validate, PrecisionAwareOptimizer) {
  const auto dist = with(base_argv(), {"--use-distributed-optimizer"});
  const auto pa = with(dist, {"--use-precision-aware-optimizer"});
  Args a = parse_and_validate(with(pa, {"--exp-avg-dtype", "bf16", "--exp-avg-sq-dtype", "bf16"}));
  EXPECT_TRUE(a.use_precision_aware_optimizer);
  EXPECT_EQ(a.exp_avg_dtype, "bf16");
  EXPECT_EQ(a.exp_avg_sq_dtype, "bf16");
  EXPECT_NO_THROW(parse_and_validate(with(dist, {"--exp-avg-dtype", "fp32"})));
  expect_invalid(with(dist, {"--exp-avg-dtype", "bf16"}),
                 {"--exp-avg-dtype bf16 takes effect only with --use-precision-aware-optimizer",
                  "add --use-precision-aware-optimizer"});
  expect_invalid(with(base_argv(), {"--use-precision-aware-optimizer"}),
                 {"only with the distributed optimizer", "add --use-distributed-optimizer"});
  expect_invalid(with(pa, {"--exp-avg-sq-dtype", "fp16"}),
                 {"--exp-avg-sq-dtype fp16 is not implemented yet", "bf16 or fp32"});
  expect_invalid(with(pa, {"--exp-avg-dtype", "fp8"}), {"--exp-avg-dtype fp8 is not implemented"});
  expect_invalid(with(pa, {"--exp-avg-dtype", "int4"}), {"'int4' is not one of"});
  expect_invalid(with(pa, {"--optimizer", "lion", "--exp-avg-dtype", "bf16"}),
                 {"--exp-avg-dtype bf16 with --optimizer lion", "use --optimizer adam"});
  expect_invalid(with(pa, {"--main-grads-dtype", "bf16"}),
                 {"--main-grads-dtype bf16 is not implemented yet", "--grad-reduce-in-bf16"});
  expect_invalid(with(base_argv(), {"--main-grads-dtype", "bf16"}),
                 {"--main-grads-dtype bf16 is not implemented yet"});
  expect_invalid(with(pa, {"--main-params-dtype", "fp16"}),
                 {"--main-params-dtype fp16 is not implemented yet"});
  // The plan: Adam's two fp32 moments (8 bytes) against two bf16 ones (4) on an f32 model.
  const auto plan = [](Args x) {
    x.padded_vocab_size = 128;  // the trainer's, from the tokenizer
    return plan_stage_memory(x, model_config(x, Device::CPU, DType::F32), 0).optimizer;
  };
  const int64_t f32 = plan(parse_and_validate(pa));
  EXPECT_EQ(plan(a), f32 / 2);
  EXPECT_EQ(plan(parse_and_validate(with(pa, {"--exp-avg-dtype", "bf16"}))), 3 * f32 / 4);
}

// --use-rope-scaling / --rope-scaling-factor: RoPE only, a positive factor; they reach the
// model config with Megatron's other three constants.
TEST(Validate, RopeScaling) {
  expect_invalid(with(base_argv(), {"--use-rope-scaling"}),
                 {"--use-rope-scaling rescales RoPE's frequencies, but --position-embedding-type "
                  "is learned_absolute",
                  "add --position-embedding-type rope"});
  const auto rope = with(base_argv(), {"--position-embedding-type", "rope", "--use-rope-scaling"});
  expect_invalid(with(rope, {"--rope-scaling-factor", "0"}),
                 {"--rope-scaling-factor 0.0 is not positive", "give --rope-scaling-factor > 0"});
  expect_invalid(with(rope, {"--rope-scaling-factor", "-8"}), {"--rope-scaling-factor -8.0"});
  // Without --use-rope-scaling the factor is unused (Megatron's default 8.0 or any other).
  EXPECT_NO_THROW(parse_and_validate(with(base_argv(), {"--rope-scaling-factor", "0"})));
  Args a = parse_and_validate(with(rope, {"--rope-scaling-factor", "32"}));
  EXPECT_TRUE(a.use_rope_scaling);
  EXPECT_EQ(a.rope_scaling_factor, 32.0);
  // Printed as Python would: True, 32.0 (and False, 8.0 by default).
  const std::string shown = format_args(a), dflt = format_args(parse_and_validate(base_argv()));
  EXPECT_NE(shown.find("  use_rope_scaling ................................ True\n"),
            std::string::npos);
  EXPECT_NE(shown.find("  rope_scaling_factor ............................. 32.0\n"),
            std::string::npos);
  EXPECT_NE(dflt.find("  use_rope_scaling ................................ False\n"),
            std::string::npos);
  EXPECT_NE(dflt.find("  rope_scaling_factor ............................. 8.0\n"),
            std::string::npos);
  a.padded_vocab_size = 128;
  const auto c = model_config(a, Device::CPU, DType::F32);
  EXPECT_TRUE(c.rope_scaling);
  EXPECT_EQ(c.rope_scaling_factor, 32.0);
  EXPECT_EQ(c.rope_low_freq_factor, 1.0);
  EXPECT_EQ(c.rope_high_freq_factor, 4.0);
  EXPECT_EQ(c.rope_original_max_positions, 8192);
  // The deprecated --use-rotary-position-embeddings is RoPE too.
  EXPECT_NO_THROW(parse_and_validate(
      with(base_argv(), {"--use-rotary-position-embeddings", "--use-rope-scaling"})));
  Args off = parse_and_validate(base_argv());
  off.padded_vocab_size = 128;
  EXPECT_FALSE(model_config(off, Device::CPU, DType::F32).rope_scaling);
}

// --rotary-seq-len-interpolation-factor: Megatron's int flag, RoPE only, positive; it reaches
// the model config (with or without Llama 3.x scaling: both apply) and prints as an int.
TEST(Validate, RotarySeqLenInterpolationFactor) {
  expect_invalid(with(base_argv(), {"--rotary-seq-len-interpolation-factor", "4"}),
                 {"--rotary-seq-len-interpolation-factor divides RoPE's positions, but "
                  "--position-embedding-type is learned_absolute",
                  "HINT: add --position-embedding-type rope"});
  const auto rope = with(base_argv(), {"--position-embedding-type", "rope"});
  for (const char* bad : {"0", "-2"})
    expect_invalid(with(rope, {"--rotary-seq-len-interpolation-factor", bad}),
                   {fmt::format("--rotary-seq-len-interpolation-factor {} must be a positive "
                                "integer",
                                bad),
                    "HINT: give --rotary-seq-len-interpolation-factor N >= 1"});
  // Megatron's type=int: a fraction is a parse error naming the flag.
  expect_invalid(with(rope, {"--rotary-seq-len-interpolation-factor", "2.5"}),
                 {"--rotary-seq-len-interpolation-factor expects an integer, got '2.5'"});
  Args a = parse_and_validate(
      with(rope, {"--rotary-seq-len-interpolation-factor", "4", "--use-rope-scaling"}));
  EXPECT_EQ(a.rotary_seq_len_interpolation_factor, 4.0);
  EXPECT_NE(format_args(a).find("  rotary_seq_len_interpolation_factor ............. 4\n"),
            std::string::npos);
  EXPECT_NE(format_args(parse_and_validate(base_argv()))
                .find("  rotary_seq_len_interpolation_factor ............. None\n"),
            std::string::npos);
  // A checkpoint's fractional factor (--use-checkpoint-args) prints as Python's float.
  a.rotary_seq_len_interpolation_factor = 2.5;
  EXPECT_NE(format_args(a).find("  rotary_seq_len_interpolation_factor ............. 2.5\n"),
            std::string::npos);
  a.rotary_seq_len_interpolation_factor = 4;
  a.padded_vocab_size = 128;
  const auto c = model_config(a, Device::CPU, DType::F32);
  EXPECT_EQ(c.seq_len_interpolation_factor, 4.0);
  EXPECT_TRUE(c.rope_scaling);
  Args off = parse_and_validate(rope);
  off.padded_vocab_size = 128;
  EXPECT_EQ(model_config(off, Device::CPU, DType::F32).seq_len_interpolation_factor, 1.0);
}

// --rope-type: rope is plain RoPE (accepted, with or without RoPE positions, as Megatron's
// standard attention); yarn belongs to multi-latent attention, refused with what exists.
TEST(Validate, RopeType) {
  for (const char* pos : {"rope", "learned_absolute"}) {
    Args a = parse_and_validate(
        with(base_argv(), {"--rope-type", "rope", "--position-embedding-type", pos}));
    EXPECT_EQ(a.rope_type, "rope");
    EXPECT_NE(format_args(a).find("  rope_type ....................................... rope\n"),
              std::string::npos);
  }
  expect_invalid(with(base_argv(), {"--rope-type", "yarn", "--position-embedding-type", "rope"}),
                 {"--rope-type yarn: Megatron-LM's standard attention takes only --rope-type "
                  "rope; --rope-type yarn is multi-latent attention's",
                  "standard attention's YaRN is --position-embedding-type yarn",
                  "HINT: drop --rope-type, or add --multi-latent-attention"});
  // With multi-latent attention yarn is the default and rope the alternative.
  Args m = parse_and_validate(with(base_argv(), {"--multi-latent-attention", "--rope-type",
                                                 "yarn", "--position-embedding-type", "rope"}));
  EXPECT_EQ(m.rope_type, "yarn");
  expect_invalid(with(base_argv(), {"--rope-type", "longrope"}), {"--rope-type: 'longrope' is "
                                                                  "not one of rope, yarn"});
}

// --log-progress writes into --save: without it, an error (Megatron writes nothing, silently).
TEST(Validate, LogProgressNeedsSave) {
  expect_invalid(with(base_argv(), {"--log-progress"}),
                 {"--log-progress appends to <--save>/progress.txt, but no --save was given",
                  "HINT: add --save DIR, or drop --log-progress"});
  Args a = parse_and_validate(with(base_argv(), {"--log-progress", "--save", "/tmp/x"}));
  EXPECT_TRUE(a.log_progress);
}

TEST(Validate, ScheduleConsistency) {
  expect_invalid(with(base_argv(), {"--lr-decay-style", "WSD"}),
                 {"--lr-decay-style WSD needs --lr-wsd-decay-iters"});
  expect_invalid(with(base_argv(), {"--lr-warmup-iters", "10"}),
                 {"warmup (20 samples) is not shorter than decay (20 samples)"});
  expect_invalid(with(base_argv(), {"--start-weight-decay", "0.0"}),
                 {"need a non-constant --weight-decay-incr-style"});
  expect_invalid(with(base_argv(), {"--weight-decay-incr-style", "linear"}),
                 {"needs --start-weight-decay and --end-weight-decay"});
  expect_invalid(with(without(base_argv(), "--mock-data"), {}),
                 {"no training data: neither --data-path nor --mock-data"});
}

TEST(PaddedVocab, MegatronRule) {
  EXPECT_EQ(padded_vocab_size(50257, 128, 1), 50304);
  EXPECT_EQ(padded_vocab_size(50257, 128, 2), 50432);  // multiple of 256
  EXPECT_EQ(padded_vocab_size(50304, 128, 1), 50304);  // already a multiple
  EXPECT_EQ(padded_vocab_size(32000, 128, 8), 32768);
  EXPECT_EQ(padded_vocab_size(100, 1, 1), 100);
  EXPECT_EQ(padded_vocab_message(50257, 50304),
            " > padded vocab (size: 50257) with 47 dummy tokens (new size: 50304)");
  expect_error([] { padded_vocab_size(50257, 0, 1); }, {"cannot pad the vocabulary"});
}

TEST(PrintArgs, MegatronFormat) {
  Args a = parse_and_validate(
      with(without(base_argv(), "--mock-data"), {"--data-path", "0.5", "a", "0.5", "b"}));
  const std::string s = format_args(a);
  EXPECT_EQ(s.rfind("------------------------ arguments ------------------------\n", 0), 0u);
  EXPECT_NE(s.find("\n-------------------- end of arguments ---------------------"),
            std::string::npos);
  // 48 - len(name) dots, then the value as Python's str() shows it.
  auto line = [](const std::string& name, const std::string& value) {
    return "\n  " + name + " " + std::string(48 - name.size(), '.') + " " + value + "\n";
  };
  EXPECT_EQ(line("hidden_size", "64"),
            "\n  hidden_size ..................................... 64\n");  // 37 dots
  for (auto [name, value] : std::vector<std::pair<std::string, std::string>>{
           {"hidden_size", "64"},
           {"lr", "0.001"},
           {"adam_eps", "1e-08"},
           {"add_bias_linear", "True"},
           {"rotary_percent", "1.0"},
           {"save", "None"},
           {"data_path", "['0.5', 'a', '0.5', 'b']"},
           {"fp8", "None"},  // --fp8-format not given
           {"data_parallel_size", "1"},
           {"ffn_hidden_size", "256"},
           {"tokenizer_type", "NullTokenizer"},
           {"device", "auto"}})
    EXPECT_NE(s.find(line(name, value)), std::string::npos) << name << " = " << value;
  // Sorted case-insensitively by line, as Megatron.
  EXPECT_LT(s.find("  adam_beta1 "), s.find("  adam_beta2 "));
  EXPECT_LT(s.find("  lr "), s.find("  lr_decay_iters "));
  EXPECT_LT(s.find("  hidden_dropout "), s.find("  hidden_size "));
  // One line per dest: 838 flags map to fewer dests, plus ours and the derived ones.
  size_t lines = std::count(s.begin(), s.end(), '\n');
  EXPECT_GT(lines, 800u);
}

TEST(PythonFloat, MatchesPythonStr) {
  EXPECT_EQ(python_float(1.0), "1.0");
  EXPECT_EQ(python_float(0.0), "0.0");
  EXPECT_EQ(python_float(1e-5), "1e-05");
  EXPECT_EQ(python_float(0.0001), "0.0001");
  EXPECT_EQ(python_float(6e-4), "0.0006");
  EXPECT_EQ(python_float(4294967296.0), "4294967296.0");
  EXPECT_EQ(python_float(1e16), "1e+16");
  EXPECT_EQ(python_float(-2.5), "-2.5");
}

TEST(SchedulerConfig, FromArgsInSamples) {
  Args a = parse_and_validate(with(base_argv(), {"--global-batch-size", "8", "--train-iters", "100",
                                                 "--lr-warmup-iters", "10"}));
  auto c = lr_scheduler_config(a);
  EXPECT_EQ(c.decay_steps, 800);
  EXPECT_DOUBLE_EQ(c.warmup_steps, 80.0);
  EXPECT_EQ(c.wd_incr_steps, 800);
  EXPECT_DOUBLE_EQ(c.max_lr, 1e-3);
  Args b = parse_and_validate(with(
      base_argv(), {"--global-batch-size", "8", "--lr-warmup-fraction", "0.05", "--lr-decay-iters",
                    "50", "--lr-decay-style", "WSD", "--lr-wsd-decay-iters", "5"}));
  auto d = lr_scheduler_config(b);
  EXPECT_EQ(d.decay_steps, 400);
  EXPECT_DOUBLE_EQ(d.warmup_steps, 20.0);
  EXPECT_EQ(d.wsd_decay_steps, 40);
  EXPECT_EQ(d.wd_incr_steps, 80);
  Args s = parse_and_validate(
      with(without(base_argv(), "--train-iters"),
           {"--train-samples", "1000", "--lr-warmup-samples", "100", "--lr-decay-samples", "900"}));
  auto e = lr_scheduler_config(s);
  EXPECT_EQ(e.decay_steps, 900);
  EXPECT_DOUBLE_EQ(e.warmup_steps, 100.0);
  EXPECT_EQ(e.wd_incr_steps, 1000);
}

TEST(Validate, PipelineLayoutsAndRecomputation) {
  // 4 layers, micro-batch 2, DP 1 at world 2 x PP 2: global batch 8 = 4 micro-batches.
  auto pp = [](std::initializer_list<std::string> more) {
    return with(with(base_argv(), {"--num-layers", "4", "--pipeline-model-parallel-size", "2",
                                   "--global-batch-size", "8"}),
                more);
  };
  Args a = parse_and_validate(pp({}), 2);
  EXPECT_EQ(a.virtual_pipeline_model_parallel_size, 1);
  EXPECT_EQ(a.data_parallel_size, 1);
  a = parse_and_validate(pp({"--num-layers-per-virtual-pipeline-stage", "1"}), 2);
  EXPECT_EQ(a.virtual_pipeline_model_parallel_size, 2);
  a = parse_and_validate(pp({"--num-virtual-stages-per-pipeline-rank", "2"}), 2);
  EXPECT_EQ(a.virtual_pipeline_model_parallel_size, 2);
  expect_invalid(pp({"--num-virtual-stages-per-pipeline-rank", "4"}),
                 {"pipeline stage 0 has 2 layers, which is not divisible by 4 virtual"}, 2);
  expect_invalid(pp({"--num-virtual-stages-per-pipeline-rank", "2",
                     "--num-layers-per-virtual-pipeline-stage", "1"}),
                 {"cannot be set at the same time"}, 2);
  expect_invalid(with(base_argv(), {"--num-virtual-stages-per-pipeline-rank", "2"}),
                 {"needs --pipeline-model-parallel-size > 1"});
  EXPECT_NO_THROW(parse_and_validate(pp({"--decoder-first-pipeline-num-layers", "1"}), 2));
  expect_invalid(pp({"--decoder-first-pipeline-num-layers", "5"}),
                 {"--num-layers 4 is fewer than the layers given to the first/last stages"}, 2);
  EXPECT_NO_THROW(parse_and_validate(
      pp({"--decoder-first-pipeline-num-layers", "1", "--decoder-last-pipeline-num-layers", "3"}),
      2));
  // Interleaved: 5 micro-batches in groups of 4 leave a last group of 1 < PP.
  expect_invalid(pp({"--num-virtual-stages-per-pipeline-rank", "2", "--global-batch-size", "10",
                     "--microbatch-group-size-per-virtual-pipeline-stage", "4"}),
                 {"micro-batch"}, 2);
  expect_invalid(pp({"--microbatch-group-size-per-virtual-pipeline-stage", "2"}),
                 {"applies to the interleaved schedule only"}, 2);
  // Recomputation, as Megatron's TransformerConfig checks it.
  a = parse_and_validate(pp({"--recompute-activations"}), 2);
  EXPECT_EQ(a.recompute_granularity.value_or(""), "selective");
  expect_invalid(pp({"--recompute-granularity", "full"}),
                 {"--recompute-granularity full needs --recompute-method uniform|block"}, 2);
  expect_invalid(pp({"--recompute-granularity", "full", "--recompute-method", "uniform"}),
                 {"needs --recompute-num-layers"}, 2);
  expect_invalid(pp({"--recompute-granularity", "full", "--recompute-method", "block",
                     "--recompute-num-layers", "3"}),
                 {"--recompute-num-layers 3 is outside [1, layers per model chunk = 2]"}, 2);
  EXPECT_NO_THROW(parse_and_validate(pp({"--recompute-granularity", "full", "--recompute-method",
                                         "uniform", "--recompute-num-layers", "3"}),
                                     2));
  expect_invalid(pp({"--recompute-granularity", "selective", "--recompute-method", "block"}),
                 {"--recompute-method block applies to --recompute-granularity full only"}, 2);
  expect_invalid(pp({"--recompute-num-layers", "1"}),
                 {"given without --recompute-granularity full"}, 2);
  expect_invalid(pp({"--recompute-granularity", "partial"}), {"partial"}, 2);
  // --recompute-modules: Megatron's names, its default (core_attn), and what is built here.
  a = parse_and_validate(pp({"--recompute-activations"}), 2);
  EXPECT_EQ(a.recompute_modules, std::vector<std::string>{"core_attn"});
  a = parse_and_validate(
      pp({"--recompute-granularity", "selective", "--recompute-modules", "layernorm"}), 2);
  EXPECT_EQ(a.recompute_modules, std::vector<std::string>{"layernorm"});
  auto cfg = model_config(a, Device::CPU, DType::F32);
  EXPECT_TRUE(cfg.recompute_norms);
  EXPECT_FALSE(cfg.recompute_core_attn);
  a = parse_and_validate(pp({"--recompute-activations", "--recompute-modules", "core_attn",
                             "layernorm"}),
                         2);
  cfg = model_config(a, Device::CPU, DType::F32);
  EXPECT_TRUE(cfg.recompute_norms && cfg.recompute_core_attn);
  cfg = model_config(parse_and_validate(pp({"--recompute-activations"}), 2), Device::CPU,
                     DType::F32);
  EXPECT_TRUE(cfg.recompute_core_attn && !cfg.recompute_norms);
  expect_invalid(pp({"--recompute-modules", "layernorm"}),
                 {"--recompute-modules layernorm applies to --recompute-granularity selective"},
                 2);
  expect_invalid(pp({"--recompute-granularity", "full", "--recompute-method", "uniform",
                     "--recompute-num-layers", "1", "--recompute-modules", "core_attn"}),
                 {"applies to --recompute-granularity selective"}, 2);
  a = parse_and_validate(pp({"--recompute-activations", "--recompute-modules", "mlp"}), 2);
  EXPECT_TRUE(model_config(a, Device::CPU, DType::F32).recompute_mlp);
  // mla_up_proj: an MLA model's up projections; an error without multi-latent attention.
  expect_invalid(pp({"--recompute-activations", "--recompute-modules", "mla_up_proj"}),
                 {"--recompute-modules mla_up_proj", "add --multi-latent-attention"}, 2);
  a = parse_and_validate(with(pp({"--recompute-activations", "--recompute-modules", "core_attn",
                                  "mla_up_proj"}),
                              {"--multi-latent-attention", "--position-embedding-type", "rope",
                               "--kv-lora-rank", "8", "--qk-head-dim", "8",
                               "--qk-pos-emb-head-dim", "4", "--v-head-dim", "8"}),
                         2);
  cfg = model_config(a, Device::CPU, DType::F32);
  EXPECT_TRUE(cfg.recompute_mla_up_proj && cfg.recompute_core_attn);
  // moe: the MoE layers whole; --moe-layer-recompute, Megatron's deprecated spelling, adds
  // it to the default modules (or to the ones given) under selective granularity.
  expect_invalid(pp({"--recompute-activations", "--recompute-modules", "moe"}),
                 {"--recompute-modules moe: this model has no MoE layers"}, 2);
  const std::initializer_list<std::string> moe4 = {"--num-experts", "4", "--disable-bias-linear"};
  a = parse_and_validate(with(pp({"--recompute-activations", "--recompute-modules", "moe"}), moe4),
                         2);
  cfg = model_config(a, Device::CPU, DType::F32);
  EXPECT_TRUE(cfg.recompute_moe && !cfg.recompute_core_attn && !cfg.recompute_mlp);
  a = parse_and_validate(with(pp({"--moe-layer-recompute"}), moe4), 2);
  EXPECT_EQ(a.recompute_granularity, std::optional<std::string>("selective"));
  EXPECT_EQ(a.recompute_modules, (std::vector<std::string>{"core_attn", "moe"}));
  EXPECT_TRUE(model_config(a, Device::CPU, DType::F32).recompute_moe);
  a = parse_and_validate(with(pp({"--moe-layer-recompute", "--recompute-granularity", "selective",
                                  "--recompute-modules", "layernorm", "moe"}),
                              moe4),
                         2);
  EXPECT_EQ(a.recompute_modules, (std::vector<std::string>{"layernorm", "moe"}));
  expect_invalid(with(pp({"--moe-layer-recompute", "--recompute-granularity", "full",
                          "--recompute-method", "uniform", "--recompute-num-layers", "1"}),
                      moe4),
                 {"--moe-layer-recompute with --recompute-granularity full"}, 2);
  expect_invalid(with(pp({"--moe-layer-recompute"}), {"--num-experts", "4", "--disable-bias-linear",
                                                      "--fp8-format", "hybrid", "--bf16"}),
                 {"--recompute-modules moe with --fp8-format"}, 2);
  expect_invalid(with(pp({"--moe-layer-recompute", "--keep-mlp-activations", "1"}), moe4),
                 {"--recompute-modules moe recomputes what --keep-mlp-activations 1 asks"}, 2);
  // moe_act: what the MoE layers always do (unless --keep-mlp-activations); Megatron's
  // requirements kept.
  const std::vector<std::string> moe_flags = {"--num-experts", "4", "--disable-bias-linear",
                                              "--moe-grouped-gemm"};
  auto with_all = [&](std::vector<std::string> v, const std::vector<std::string>& more) {
    v.insert(v.end(), more.begin(), more.end());
    return v;
  };
  EXPECT_NO_THROW(parse_and_validate(
      with_all(pp({"--recompute-activations", "--recompute-modules", "core_attn", "moe_act"}),
               moe_flags),
      2));
  expect_invalid(pp({"--recompute-activations", "--recompute-modules", "moe_act"}),
                 {"--recompute-modules moe_act: this model has no MoE layers"}, 2);
  expect_invalid(pp({"--recompute-activations", "--recompute-modules", "moe_act", "--num-experts",
                     "4", "--disable-bias-linear"}),
                 {"--recompute-modules moe_act needs --moe-grouped-gemm"}, 2);
  expect_invalid(pp({"--recompute-activations", "--recompute-modules", "mlp", "--num-experts",
                     "4", "--disable-bias-linear"}),
                 {"--recompute-modules mlp: every layer of this model is a MoE layer"}, 2);
  expect_invalid(pp({"--recompute-activations", "--recompute-modules", "mlp",
                     "--keep-mlp-activations", "1"}),
                 {"--recompute-modules mlp recomputes what --keep-mlp-activations 1 asks"}, 2);
  // shared_experts: the MoE layers' shared experts (and only where there are some).
  expect_invalid(pp({"--recompute-activations", "--recompute-modules", "shared_experts"}),
                 {"--recompute-modules shared_experts: this model has no shared experts"}, 2);
  const std::initializer_list<std::string> shared = {
      "--recompute-activations", "--recompute-modules", "core_attn", "shared_experts",
      "--num-experts", "4", "--moe-shared-expert-intermediate-size", "64",
      "--disable-bias-linear"};
  a = parse_and_validate(pp(shared), 2);
  cfg = model_config(a, Device::CPU, DType::F32);
  EXPECT_TRUE(cfg.recompute_shared_experts && cfg.recompute_core_attn && !cfg.recompute_norms);
  expect_invalid(with(pp(shared), {"--fp8-format", "hybrid", "--bf16"}),
                 {"--recompute-modules shared_experts with --fp8-format"}, 2);
  expect_invalid(pp({"--recompute-activations", "--recompute-modules", "norms"}),
                 {"'norms' is not a module Megatron can recompute"}, 2);
  expect_invalid(pp({"--recompute-activations", "--recompute-modules", "layernorm",
                     "--fp8-format", "hybrid", "--bf16"}),
                 {"--recompute-modules layernorm with --fp8-format"}, 2);
}

// --mtp-num-layers / --mtp-loss-scaling-factor: into the model config; Megatron's RoPE
// requirement; what is not implemented yet is refused with the flag named.
TEST(Validate, MultiTokenPrediction) {
  const std::initializer_list<std::string> rope = {"--position-embedding-type", "rope"};
  Args a = parse_and_validate(with(with(base_argv(), rope), {"--mtp-num-layers", "2",
                                                             "--mtp-loss-scaling-factor", "0.3"}));
  auto cfg = model_config(a, Device::CPU, DType::F32);
  EXPECT_EQ(cfg.mtp_num_layers, 2);
  EXPECT_EQ(cfg.mtp_loss_scaling_factor, 0.3);
  EXPECT_EQ(model_config(parse_and_validate(base_argv()), Device::CPU, DType::F32).mtp_num_layers,
            0);
  // 0 is Megatron's "no MTP"; the factor alone scales nothing.
  EXPECT_EQ(parse_and_validate(with(base_argv(), {"--mtp-num-layers", "0"})).mtp_num_layers,
            std::optional<int64_t>(0));
  expect_invalid(with(base_argv(), {"--mtp-loss-scaling-factor", "0.5"}),
                 {"--mtp-loss-scaling-factor 0.5 without --mtp-num-layers"});
  expect_invalid(with(base_argv(), {"--mtp-num-layers", "-1"}),
                 {"--mtp-num-layers -1 must not be negative"});
  expect_invalid(with(base_argv(), {"--mtp-num-layers", "1"}),
                 {"--mtp-num-layers with --position-embedding-type learned_absolute",
                  "rotary"});
  auto mtp = with(with(base_argv(), rope), {"--mtp-num-layers", "1"});
  EXPECT_NO_THROW(parse_and_validate(with(mtp, {"--pipeline-model-parallel-size", "2"}), 2));
  EXPECT_NO_THROW(parse_and_validate(with(mtp, {"--context-parallel-size", "2"}), 2));
  EXPECT_NO_THROW(parse_and_validate(with(mtp, {"--fp8-format", "hybrid", "--bf16"})));
  expect_invalid(with(mtp, {"--ckpt-format", "torch"}), {"--mtp-num-layers", "legacy layout"});
}

TEST(Validate, KeepMlpActivations) {
  auto pp = [](std::initializer_list<std::string> more) {
    return with(with(base_argv(), {"--num-layers", "4", "--pipeline-model-parallel-size", "2",
                                   "--global-batch-size", "8"}),
                more);
  };
  EXPECT_EQ(parse_and_validate(base_argv()).keep_mlp_activations, 0);
  EXPECT_EQ(
      parse_and_validate(with(base_argv(), {"--keep-mlp-activations", "2"})).keep_mlp_activations,
      2);
  // More than a chunk's layers: every layer keeps its activation.
  EXPECT_NO_THROW(parse_and_validate(pp({"--keep-mlp-activations", "100"}), 2));
  expect_invalid(with(base_argv(), {"--keep-mlp-activations", "-1"}),
                 {"--keep-mlp-activations -1 must not be negative"});
  // Selective recomputation drops the attention core only: the flag applies as without it.
  EXPECT_NO_THROW(parse_and_validate(
      pp({"--recompute-granularity", "selective", "--keep-mlp-activations", "1"}), 2));
  // Full recomputation: the layers it leaves stored (block) keep; where it re-runs every
  // layer (uniform; block over whole chunks) the flag would keep nothing and is an error.
  EXPECT_NO_THROW(
      parse_and_validate(pp({"--recompute-granularity", "full", "--recompute-method", "block",
                             "--recompute-num-layers", "1", "--keep-mlp-activations", "1"}),
                         2));
  expect_invalid(pp({"--recompute-granularity", "full", "--recompute-method", "uniform",
                     "--recompute-num-layers", "1", "--keep-mlp-activations", "1"}),
                 {"--keep-mlp-activations 1 keeps nothing with --recompute-granularity full",
                  "--recompute-method uniform"},
                 2);
  expect_invalid(pp({"--recompute-granularity", "full", "--recompute-method", "block",
                     "--recompute-num-layers", "2", "--keep-mlp-activations", "1"}),
                 {"--keep-mlp-activations 1 keeps nothing", "--recompute-method block"}, 2);
  EXPECT_NO_THROW(parse_and_validate(pp({"--recompute-granularity", "full", "--recompute-method",
                                         "uniform", "--recompute-num-layers", "1"}),
                                     2));
}

// --padded-vocab-size: used as given (Megatron), checked against TP at validation and
// against the tokenizer once it is known.
TEST(PaddedVocab, GivenSize) {
  Args a = parse_and_validate(with(base_argv(), {"--padded-vocab-size", "1000"}));
  EXPECT_EQ(a.padded_vocab_size, 1000);
  EXPECT_EQ(resolve_padded_vocab_size(a, 101), 1000);  // NullTokenizer: 100 + EOD
  EXPECT_EQ(a.padded_vocab_size, 1000);
  EXPECT_EQ(resolve_padded_vocab_size(a, 1000), 1000);  // exactly the tokenizer's size
  EXPECT_EQ(padded_vocab_message(101, 1000, true),
            " > padded vocab (size: 101) with 899 dummy tokens (new size: 1000, "
            "--padded-vocab-size)");
  expect_error([&] { resolve_padded_vocab_size(a, 1001); },
               {"--padded-vocab-size 1000 is smaller than the vocabulary of the tokenizer "
                "(NullTokenizer, 1001 token ids)",
                "give --padded-vocab-size at least 1001", "multiple of", "1024"});
  // Not given: Megatron's padding of the tokenizer's size.
  Args b = parse_and_validate(base_argv());
  EXPECT_FALSE(b.padded_vocab_size.has_value());
  EXPECT_EQ(resolve_padded_vocab_size(b, 101), 128);
  EXPECT_EQ(b.padded_vocab_size, 128);
  // TP 2: the rows split evenly.
  Args c = parse_and_validate(
      with(base_argv(), {"--padded-vocab-size", "1000", "--tensor-model-parallel-size", "2"}), 2);
  EXPECT_EQ(c.padded_vocab_size, 1000);
  expect_invalid(
      with(base_argv(), {"--padded-vocab-size", "1001", "--tensor-model-parallel-size", "2"}),
      {"--padded-vocab-size 1001 is not divisible by --tensor-model-parallel-size 2",
       "a multiple of 2 (e.g. 1002)"},
      2);
  expect_invalid(with(base_argv(), {"--padded-vocab-size", "0"}),
                 {"--padded-vocab-size 0 is outside [1, 2^31 - 1)"});
  expect_invalid(with(base_argv(), {"--padded-vocab-size", "3000000000"}),
                 {"--padded-vocab-size 3000000000 is outside"});
}

// --save-retain-interval: Megatron's asserts (positive, a multiple of --save-interval), and
// it needs --save and --save-interval to act on.
TEST(Validate, SaveRetainInterval) {
  const auto save = with(base_argv(), {"--save", "/tmp/x", "--save-interval", "5"});
  Args a = parse_and_validate(with(save, {"--save-retain-interval", "20"}));
  EXPECT_EQ(a.save_retain_interval, 20);
  expect_invalid(with(save, {"--save-retain-interval", "12"}),
                 {"--save-retain-interval 12 is not a multiple of --save-interval 5", "(e.g. 15)"});
  expect_invalid(with(save, {"--save-retain-interval", "0"}),
                 {"--save-retain-interval must be positive, got 0"});
  expect_invalid(with(save, {"--save-retain-interval", "-5"}),
                 {"--save-retain-interval must be positive, got -5"});
  expect_invalid(with(base_argv(), {"--save", "/tmp/x", "--save-retain-interval", "5"}),
                 {"--save-interval was not given", "add --save DIR --save-interval M"});
  expect_invalid(with(base_argv(), {"--save-retain-interval", "5"}), {"--save was not given"});
}

// --pretrained-checkpoint and --exit-on-missing-checkpoint reach Args; --use-checkpoint-args
// reads --pretrained-checkpoint's checkpoint when --load is not given (Megatron's assert).
TEST(Validate, PretrainedCheckpointFlags) {
  Args a = parse_and_validate(
      with(base_argv(), {"--pretrained-checkpoint", "/ckpt/base", "--exit-on-missing-checkpoint",
                         "--use-checkpoint-args"}));
  EXPECT_EQ(a.pretrained_checkpoint, "/ckpt/base");
  EXPECT_TRUE(a.exit_on_missing_checkpoint);
  expect_invalid(with(base_argv(), {"--use-checkpoint-args"}),
                 {"--use-checkpoint-args", "--load was not given (nor --pretrained-checkpoint)"});
}

// --dist-ckpt-strictness: Megatron's values reach Args; return_* is refused with a HINT
// (a training run has no caller to return mismatched keys to); others fail in the parser.
TEST(Validate, DistCkptStrictness) {
  EXPECT_EQ(parse_and_validate(base_argv()).dist_ckpt_strictness, "assume_ok_unexpected");
  for (const char* v : {"log_unexpected", "log_all", "raise_unexpected", "raise_all", "ignore_all"})
    EXPECT_EQ(parse_and_validate(with(base_argv(), {"--dist-ckpt-strictness", v}))
                  .dist_ckpt_strictness,
              v);
  for (const char* v : {"return_unexpected", "return_all"})
    expect_invalid(with(base_argv(), {"--dist-ckpt-strictness", v}),
                   {"--dist-ckpt-strictness", v, "HINT", "log_unexpected"});
  expect_invalid(with(base_argv(), {"--dist-ckpt-strictness", "strict"}), {"strict"});
}

// --apply-wd-to-qk-layernorm: the q/k norm weights (and only they) join the decayed
// parameters; every other norm weight and bias keeps none. Its deprecated spelling says the
// same; without --qk-layernorm there is nothing to decay: an error.
TEST(Validate, ApplyWdToQkLayernorm) {
  const auto qk = with(base_argv(), {"--normalization", "RMSNorm", "--qk-layernorm",
                                     "--position-embedding-type", "rope"});
  auto decayed = [](const Args& a) {
    std::vector<std::string> names;
    for (const auto& p : model::parameter_registry(model_config(a, Device::CPU, DType::F32), {}))
      if (p.weight_decay) names.push_back(p.name);
    std::sort(names.begin(), names.end());
    return names;
  };
  const Args off = parse_and_validate(qk, 1);
  const Args on = parse_and_validate(with(qk, {"--apply-wd-to-qk-layernorm"}), 1);
  const Args old = parse_and_validate(
      with(qk, {"--no-weight-decay-cond-type", "apply_wd_to_qk_layernorm"}), 1);
  EXPECT_FALSE(off.apply_wd_to_qk_layernorm);
  EXPECT_TRUE(on.apply_wd_to_qk_layernorm);
  EXPECT_TRUE(old.apply_wd_to_qk_layernorm);
  std::vector<std::string> extra;
  const auto a = decayed(off), b = decayed(on);
  std::set_difference(b.begin(), b.end(), a.begin(), a.end(), std::back_inserter(extra));
  ASSERT_EQ(extra.size(), 4u);  // two layers, q and k
  for (const auto& n : extra)
    EXPECT_TRUE(n.find("q_layernorm.weight") != std::string::npos ||
                n.find("k_layernorm.weight") != std::string::npos)
        << n;
  EXPECT_EQ(decayed(old), b);
  for (const auto& n : a) EXPECT_EQ(n.find("layernorm"), std::string::npos) << n;
  expect_invalid(with(base_argv(), {"--apply-wd-to-qk-layernorm"}),
                 {"--apply-wd-to-qk-layernorm without --qk-layernorm",
                  "HINT: add --qk-layernorm, or drop --apply-wd-to-qk-layernorm"});
}

// --qk-layernorm with --normalization LayerNorm (the default): accepted, its q/k norms have
// a bias each, and --apply-wd-to-qk-layernorm decays the biases with the weights (Megatron's
// get_standard_config_overrides matches every "q_layernorm." / "k_layernorm." name). Under
// multi-latent attention the latents' LayerNorm is refused, naming both flags.
TEST(Validate, QkLayernormLayerNormForm) {
  const auto qk = with(base_argv(), {"--qk-layernorm"});
  auto decayed = [](const Args& a, std::vector<std::string>* all = nullptr) {
    std::vector<std::string> names;
    for (const auto& p : model::parameter_registry(model_config(a, Device::CPU, DType::F32), {})) {
      if (all) all->push_back(p.name);
      if (p.weight_decay) names.push_back(p.name);
    }
    std::sort(names.begin(), names.end());
    return names;
  };
  const Args off = parse_and_validate(qk, 1);
  EXPECT_EQ(off.normalization, "LayerNorm");
  std::vector<std::string> all;
  const auto a = decayed(off, &all);
  for (const char* n :
       {"q_layernorm.weight", "q_layernorm.bias", "k_layernorm.weight", "k_layernorm.bias"})
    EXPECT_EQ(
        std::count(all.begin(), all.end(), std::string("decoder.layers.0.self_attention.") + n), 1)
        << n;
  const auto b = decayed(parse_and_validate(with(qk, {"--apply-wd-to-qk-layernorm"}), 1));
  std::vector<std::string> extra;
  std::set_difference(b.begin(), b.end(), a.begin(), a.end(), std::back_inserter(extra));
  EXPECT_EQ(extra.size(), 8u);  // two layers, q and k, weight and bias
  for (const auto& n : extra)
    EXPECT_TRUE(n.find("q_layernorm.") != std::string::npos ||
                n.find("k_layernorm.") != std::string::npos)
        << n;
  expect_invalid(with(qk, {"--multi-latent-attention", "--q-lora-rank", "8",
                           "--position-embedding-type", "rope"}),
                 {"--qk-layernorm with --multi-latent-attention and --normalization LayerNorm",
                  "HINT: add --normalization RMSNorm"});
}

// --no-position-embedding: Megatron allows the deprecated switch with RoPE only.
TEST(Validate, NoPositionEmbeddingOnlyWithRope) {
  const Args a = parse_and_validate(
      with(base_argv(), {"--position-embedding-type", "rope", "--no-position-embedding"}), 1);
  EXPECT_FALSE(a.add_position_embedding);
  expect_invalid(with(base_argv(), {"--no-position-embedding"}),
                 {"--no-position-embedding with --position-embedding-type learned_absolute",
                  "use --position-embedding-type rope"});
}

// --check-weight-hash-across-dp-replicas-interval N: reaches Args; N >= 1, else an error
// naming the flag with a HINT (Megatron's None, the default, turns the check off).
TEST(Validate, CheckWeightHashInterval) {
  EXPECT_FALSE(parse_and_validate(base_argv()).check_weight_hash_across_dp_replicas_interval);
  EXPECT_EQ(parse_and_validate(with(base_argv(),
                                    {"--check-weight-hash-across-dp-replicas-interval", "5"}))
                .check_weight_hash_across_dp_replicas_interval,
            5);
  for (const char* n : {"0", "-2"})
    expect_invalid(with(base_argv(), {"--check-weight-hash-across-dp-replicas-interval", n}),
                   {fmt::format("--check-weight-hash-across-dp-replicas-interval {} must be "
                                "positive",
                                n),
                    "HINT: give --check-weight-hash-across-dp-replicas-interval a value >= 1"});
}

// --embedding-init-method-std and --mid-level-dataset-surplus reach their fields (and the
// model config); bad values are errors naming the flag. --local-rank (any launcher's) is
// accepted by design.
TEST(Validate, EmbeddingStdSurplusAndLocalRank) {
  Args a = parse_and_validate(with(base_argv(), {"--embedding-init-method-std", "0.005",
                                                 "--mid-level-dataset-surplus", "0.1",
                                                 "--local-rank=3"}));
  EXPECT_EQ(a.embedding_init_method_std, 0.005);
  EXPECT_EQ(model_config(a, Device::CPU, DType::F32).embedding_init_std(), 0.005);
  EXPECT_EQ(a.mid_level_dataset_surplus, 0.1);
  EXPECT_EQ(parse_and_validate(base_argv()).mid_level_dataset_surplus, 0.005);
  EXPECT_FALSE(parse_and_validate(base_argv()).embedding_init_method_std.has_value());
  const auto lines = describe_by_design_flags(a);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("--local-rank 3: accepted by design"), std::string::npos) << lines[0];
  expect_error([] { parse_and_validate(with(base_argv(), {"--embedding-init-method-std", "0"})); },
               {"--embedding-init-method-std 0 must be positive"});
  expect_error(
      [] { parse_and_validate(with(base_argv(), {"--mid-level-dataset-surplus", "-0.5"})); },
      {"--mid-level-dataset-surplus -0.5 must be a non-negative number"});
}

// The Hugging Face tokenizer switches: --tokenizer-hf-no-include-special-tokens reaches its
// field (data::TokenizerArgs::include_special_tokens through build_tokenizer);
// --tokenizer-hf-no-use-fast is accepted by design.
TEST(Validate, HfTokenizerSwitches) {
  const Args a = parse_args(with(base_argv(), {"--tokenizer-hf-no-include-special-tokens",
                                               "--tokenizer-hf-no-use-fast"}));
  const Args sync = parse_args(with(base_argv(), {"--train-sync-interval", "4",
                                                  "--num-dataset-builder-threads", "8"}));
  const auto sync_lines = describe_by_design_flags(sync);
  ASSERT_EQ(sync_lines.size(), 2u);
  EXPECT_NE(sync_lines[0].find("--train-sync-interval 4: accepted by design"), std::string::npos)
      << sync_lines[0];
  // --null-tokenizer-eod-id / --null-tokenizer-pad-id reach the NullTokenizer the run builds.
  const Args null_ids = parse_args(with(base_argv(), {"--null-tokenizer-eod-id", "0",
                                                      "--null-tokenizer-pad-id", "5"}));
  const auto tok = build_tokenizer(null_ids);
  EXPECT_EQ(tok->eod(), 0);
  EXPECT_EQ(tok->pad(), 5);
  EXPECT_TRUE(a.tokenizer_hf_no_include_special_tokens);
  EXPECT_FALSE(parse_args(base_argv()).tokenizer_hf_no_include_special_tokens);
  const auto lines = describe_by_design_flags(a);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("--tokenizer-hf-no-use-fast True: accepted by design"),
            std::string::npos)
      << lines[0];
}

// Mixture-of-experts load balancing and score functions (validate_moe.cpp): Megatron's lists
// of types paired with coefficients, sqrtsoftplus with the expert bias, and what is refused
// with a HINT (Megatron's rejections, combinations it would silently ignore, what is not
// implemented yet).
TEST(Validate, MoeLoadBalancingListsAndScoreFunctions) {
  const auto moe = with(base_argv(), {"--num-experts", "4", "--disable-bias-linear"});
  const Args a = parse_and_validate(
      with(moe, {"--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss",
                 "global_aux_loss", "--moe-aux-loss-coeff", "1e-3", "0", "2e-2"}));
  EXPECT_EQ(a.moe_aux_loss_coeff_values, (std::vector<double>{1e-3, 0.0, 2e-2}));
  const model::TransformerConfig c = model_config(a, Device::CPU, DType::F32);
  using B = model::TransformerConfig::Moe::Balance;
  EXPECT_EQ(c.moe.balance, (std::vector<B>{B::AuxLoss, B::SeqAuxLoss, B::GlobalAuxLoss}));
  EXPECT_EQ(c.moe.coeff(B::AuxLoss), 1e-3);
  EXPECT_EQ(c.moe.coeff(B::SeqAuxLoss), 0.0);  // listed with 0: off
  EXPECT_EQ(c.moe.coeff(B::GlobalAuxLoss), 2e-2);
  EXPECT_EQ(c.moe.coeff(B::Sinkhorn), 0.0);  // not listed
  EXPECT_TRUE(c.moe.aux_loss_on());
  // sqrtsoftplus, with the expert bias (allowed with sigmoid and sqrtsoftplus only).
  const Args q = parse_and_validate(with(moe, {"--moe-router-score-function", "sqrtsoftplus",
                                               "--moe-router-enable-expert-bias",
                                               "--moe-router-topk", "1"}));
  EXPECT_EQ(model_config(q, Device::CPU, DType::F32).moe.score,
            model::TransformerConfig::Moe::Score::SqrtSoftplus);
  expect_invalid(with(moe, {"--moe-router-load-balancing-type", "aux_loss", "seq_aux_loss",
                            "--moe-aux-loss-coeff", "1e-2"}),
                 {"--moe-router-load-balancing-type lists 2 type(s) and --moe-aux-loss-coeff 1 "
                  "coefficient(s)"});
  expect_invalid(with(moe, {"--moe-router-load-balancing-type", "global_aux_loss",
                            "--moe-aux-loss-coeff", "1e-2", "1e-3"}),
                 {"lists 1 type(s) and --moe-aux-loss-coeff 2 coefficient(s)"});
  expect_invalid(with(moe, {"--moe-router-enable-expert-bias"}),
                 {"--moe-router-enable-expert-bias",
                  "sigmoid and sqrtsoftplus score functions only", "not softmax"});
  expect_invalid(with(moe, {"--moe-router-load-balancing-type", "quantile_balancing"}),
                 {"--moe-router-load-balancing-type quantile_balancing is not implemented yet"});
  expect_invalid(with(moe, {"--moe-router-load-balancing-type", "aux_loss", "quantile_balancing",
                            "--moe-aux-loss-coeff", "1e-2", "0"}),
                 {"quantile_balancing is not implemented yet"});
  expect_invalid(with(moe, {"--moe-router-load-balancing-type", "switch"}),
                 {"--moe-router-load-balancing-type", "'switch' is not one of",
                  "global_aux_loss"});
  expect_invalid(with(moe, {"--moe-router-load-balancing-type", "sinkhorn", "aux_loss",
                            "--moe-aux-loss-coeff", "0", "1e-2"}),
                 {"lists sinkhorn with other types"});
  expect_invalid(with(moe, {"--moe-router-load-balancing-type", "aux_loss", "aux_loss",
                            "--moe-aux-loss-coeff", "1e-2", "1e-3"}),
                 {"lists aux_loss twice"});
  // Megatron's own rejections stay: sinkhorn with an aux coefficient or a capacity factor.
  expect_invalid(with(moe, {"--moe-router-load-balancing-type", "sinkhorn",
                            "--moe-aux-loss-coeff", "1e-2"}),
                 {"Sinkhorn routing does not support an aux loss"});
  expect_invalid(with(moe, {"--moe-router-load-balancing-type", "sinkhorn",
                            "--moe-expert-capacity-factor", "1.0"}),
                 {"--moe-expert-capacity-factor works with the aux_loss, seq_aux_loss, "
                  "global_aux_loss and none"});
  expect_invalid(with(moe, {"--moe-router-load-balancing-type", "sinkhorn",
                            "--moe-router-score-function", "sqrtsoftplus"}),
                 {"--moe-router-score-function sqrtsoftplus has no effect"});
  expect_invalid(with(moe, {"--moe-router-score-function", "sqrtsoftplus",
                            "--moe-router-pre-softmax"}),
                 {"--moe-router-pre-softmax applies to --moe-router-score-function softmax"});
  expect_invalid(with(moe, {"--moe-router-load-balancing-type", "aux_loss", "global_aux_loss",
                            "--moe-aux-loss-coeff", "1e-2", "-1"}),
                 {"--moe-aux-loss-coeff -1 (for global_aux_loss) must be finite and "
                  "non-negative"});
  // A capacity factor works with every aux-loss type (Megatron's list check).
  EXPECT_NO_THROW(parse_and_validate(
      with(moe, {"--moe-router-load-balancing-type", "seq_aux_loss", "global_aux_loss", "none",
                 "--moe-aux-loss-coeff", "1e-2", "1e-2", "0", "--moe-expert-capacity-factor",
                 "1.5"})));
}

}  // namespace validate_test
