// Issue 23 A.1 (Megatron's example-script flags), each against an independent reference:
//   * the batch-size ramp-up against Megatron's formula worked by hand (the 175B
//     example's `--rampup-batch-size 16 16 5859375`, and a small ramp step by step), and
//     update_train_iters' count;
//   * --log-params-norm / --log-num-zeros-in-grad against fp64 sums over the parameters
//     that count (TP duplicates on TP rank 0 only);
//   * --decoupled-lr: only the embedding/output parameters move when the others' rate is 0;
//   * the parser: the new flags reach Args, the by-design ones are accepted and explained.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "base/error.h"
#include "comm/local/local_communicator.h"
#include "data/num_microbatches.h"
#include "model/params.h"
#include "optim/grads.h"
#include "optim/optimizer.h"
#include "training/arguments.h"
#include "training/validate_compat.h"

namespace mcpp {
namespace compat_test {

// ---- ramp-up ---------------------------------------------------------------------------

// GPT-3 175B: start 16, +16, over 5,859,375 samples to 1536: 95 increments, one every
// 5859375 / 95 = 61677.63... samples. Worked by hand:
//   consumed 0           -> int(0 / 61677.63) = 0   -> 16
//   consumed 61677       -> 0 (just below one increment) -> 16
//   consumed 61678       -> 1 -> 32
//   consumed 3000000     -> int(48.64) = 48 -> 16 + 48*16 = 784
//   consumed 5859375     -> not > samples: int(95.0) = 95 -> 16 + 95*16 = 1536
//   consumed 5859376     -> beyond the ramp -> 1536
TEST(Rampup, Gpt3_175bScheduleMatchesMegatronsFormula) {
  data::NumMicroBatchesCalculator c(1536, 1, 8, data::BatchRampup{16, 16, 5859375});
  const std::pair<int64_t, int64_t> want[] = {{0, 16},        {61677, 16},      {61678, 32},
                                              {3000000, 784}, {5859375, 1536}, {5859376, 1536}};
  for (auto [consumed, gbs] : want) {
    c.update(consumed);
    EXPECT_EQ(c.current_global_batch_size(), gbs) << "consumed " << consumed;
    EXPECT_EQ(c.num_microbatches(), gbs / 8) << "consumed " << consumed;
  }
}

// A small ramp, step by step as the trainer runs it: start 4, +4 to 16 over 40 samples
// (one increment per 13.33 samples). Steps consume 4,4,4,4 (consumed 0..12 -> 0
// increments), then 8 (16 -> 1), 8 (24 -> 1), 12 (32 -> 2), then 16 from consumed 44 > 40.
TEST(Rampup, StepByStepBatchesAndConsumedSamples) {
  data::NumMicroBatchesCalculator c(16, 2, 2, data::BatchRampup{4, 4, 40});
  const int64_t want[] = {4, 4, 4, 4, 8, 8, 12, 16, 16};
  int64_t consumed = 0;
  for (int64_t gbs : want) {
    c.update(consumed);
    EXPECT_EQ(c.current_global_batch_size(), gbs) << "consumed " << consumed;
    EXPECT_EQ(c.num_microbatches(), gbs / 4);
    consumed += c.current_global_batch_size();
  }
  EXPECT_EQ(consumed, 76);
  // --train-iters 9 reads those 76 samples; without a ramp 9 x 16.
  EXPECT_EQ(data::samples_for_iters(9, 16, 2, 2, data::BatchRampup{4, 4, 40}), 76);
  EXPECT_EQ(data::samples_for_iters(9, 16, 2, 2, std::nullopt), 144);
}

// get_train_valid_test_num_samples' validation size: train_iters // interval + 1 points
// (every interval and the end), less start_eval_at_iter // interval, times eval_iters x the
// eval global batch.
TEST(Rampup, ValidationSamplesAsMegatron) {
  EXPECT_EQ(data::validation_samples(100, 10, 5, 32, std::nullopt), 11 * 5 * 32);
  EXPECT_EQ(data::validation_samples(100, 10, 5, 32, 25), (11 - 2) * 5 * 32);
  EXPECT_EQ(data::validation_samples(6, 2, 1, 8, 4), (4 - 2) * 8);
  EXPECT_EQ(data::validation_samples(10, 5, 2, 4, 1000), 0);  // every point skipped
}

// update_train_iters for --train-samples 100: ramp steps while consumed <= 40 (and <=
// 100): consumed 0,4,8,12 (+4 each), 16 (+8), 24 (+8), 32 (+12), 44 > 40 stops: 7 steps,
// 44 consumed; then (100 - 44) // 16 = 3 whole batches: 10 iterations.
TEST(Rampup, TrainItersFromSamplesAsUpdateTrainIters) {
  EXPECT_EQ(data::rampup_train_iters(100, 16, 2, 2, {4, 4, 40}), 10);
  // A ramp longer than the run: steps while consumed <= 20: 0,4,8,12,16 -> 5 steps, 20
  // consumed, nothing left.
  EXPECT_EQ(data::rampup_train_iters(20, 16, 2, 2, {4, 4, 40}), 5);
}

TEST(Rampup, BadRampsAreErrorsNamingTheFlag) {
  auto fails = [](int64_t gbs, int64_t mbs, int64_t dp, data::BatchRampup r, const char* what) {
    try {
      data::NumMicroBatchesCalculator c(gbs, mbs, dp, r);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--rampup-batch-size"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  fails(16, 1, 1, {0, 4, 10}, "must be positive");
  fails(16, 1, 1, {4, 0, 10}, "must be positive");
  fails(16, 1, 1, {16, 4, 10}, "is not below");
  fails(16, 1, 1, {4, 5, 10}, "not divisible by the increment");
  fails(16, 2, 2, {6, 2, 10}, "not a multiple of --micro-batch-size");  // 6 % 4
}

// --step-batch-size-schedule: Megatron's parsing (suffixes, commas, tokens -> samples by
// integer division, sorted), the batch at each consumed count, update_train_iters and the
// samples of N iterations, and the errors, each naming the flag.
TEST(StepSchedule, ParsesAndStepsAsMegatron) {
  const auto s = data::parse_step_batch_schedule("1.5K:8, 0:4 3k:16", 32);
  ASSERT_EQ(s.steps.size(), 3u);
  EXPECT_EQ(s.steps[0], (std::pair<int64_t, int64_t>{0, 4}));
  EXPECT_EQ(s.steps[1], (std::pair<int64_t, int64_t>{46, 8}));   // 1500 // 32
  EXPECT_EQ(s.steps[2], (std::pair<int64_t, int64_t>{93, 16}));  // 3000 // 32
  EXPECT_EQ(s.final_batch(), 16);
  EXPECT_EQ(data::parse_step_batch_schedule("0:768 250B:1536", 0).steps[1].first, 250000000000);
  data::NumMicroBatchesCalculator c(2, 2, s);
  // Megatron's loop: the batch of the consumed count before each step.
  const int64_t want[] = {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 8, 8, 8, 8, 8, 8, 16, 16};
  int64_t consumed = 0, it = 0;
  for (int64_t gbs : want) {
    c.update(consumed);
    EXPECT_EQ(c.current_global_batch_size(), gbs) << "step " << it << ", consumed " << consumed;
    EXPECT_EQ(c.num_microbatches(), gbs / 4);
    consumed += gbs, ++it;
  }
  EXPECT_EQ(data::samples_for_iters(20, s), consumed);
  EXPECT_EQ(data::samples_for_iters(25, s), consumed + 5 * 16);
  // update_train_iters: steps while fewer than train_samples are consumed.
  for (int64_t train : {1, 48, 49, 100, 113, 500}) {
    int64_t n = 0, k = 0;
    while (k < train) k += s.batch_at(k), ++n;
    EXPECT_EQ(data::schedule_train_iters(train, s), n) << train;
  }
  auto fails = [](const char* text, const char* what) {
    try {
      data::parse_step_batch_schedule(text, 32);
      ADD_FAILURE() << "no error for " << text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--step-batch-size-schedule"), std::string::npos);
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_FALSE(e.hint().empty());
    }
  };
  fails("0:4 64", "expected THRESHOLD:BATCH_SIZE");
  fails("32:4", "the first entry must have threshold 0");
  fails("0:4 64:8 70:16", "strictly increasing");  // 64 and 70 tokens are both 2 samples
  fails("0:0", "must be positive");
  fails("0:four", "is not a number");
  fails("", "has no entry");
  // The batch in effect must split into micro-batches; earlier ones are not checked.
  data::NumMicroBatchesCalculator odd(2, 2, data::parse_step_batch_schedule("0:6 64:8", 32));
  EXPECT_NO_THROW(odd.check_from(2, 100));   // past the 6: only the 8 is used
  EXPECT_THROW(odd.check_from(0, 100), Error);
  EXPECT_THROW(odd.update(0), Error);
  EXPECT_NO_THROW(odd.update(2));
}

// ---- params norm, zeros in the gradients, decoupled LR ----------------------------------

model::ParamStore store(bool second_is_embedding) {
  model::ParamStore ps;
  const int64_t sizes[] = {5, 37, 16, 3};
  for (int k = 0; k < 4; ++k) {
    model::ParamInfo p;
    p.name = "p" + std::to_string(k);
    p.global_shape = p.local_shape = {sizes[k]};
    p.init_std = 0.1;
    // p2 is TP-partitioned (counted on every TP rank), the others duplicated.
    p.split = k == 2 ? model::TpSplit::Rows : model::TpSplit::None;
    p.embedding_or_output = second_is_embedding && k == 1;
    ps.add(p);
  }
  ps.allocate(DType::F32, 0, 1);
  ps.initialize(11);
  float* g = ps.flat_grads().data<float>();
  for (const auto& p : ps.infos())
    for (int64_t i = 0; i < p.numel(); ++i)
      g[p.offset + i] = (p.offset + i) % 3 == 0 ? 0.0f : float(0.01 * double(p.offset + i) - 0.2);
  return ps;
}

TEST(LogFields, ParamsNormAndZerosCountEachElementOnce) {
  model::ParamStore ps = store(false);
  optim::AdamW opt(ps, {});
  comm::LocalCommunicator one("mp", 0, std::chrono::seconds(5));
  for (int tp_rank : {0, 1}) {
    double sq = 0;
    int64_t zeros = 0;
    const float* w = ps.flat_params().data<float>();
    const float* g = ps.flat_grads().data<float>();
    for (const auto& p : ps.infos()) {
      if (tp_rank != 0 && p.split == model::TpSplit::None) continue;  // rank 0 counts those
      for (int64_t i = 0; i < p.numel(); ++i) {
        sq += double(w[p.offset + i]) * double(w[p.offset + i]);
        zeros += g[p.offset + i] == 0.0f;
      }
    }
    EXPECT_NEAR(optim::params_norm(opt, ps, tp_rank, one), std::sqrt(sq), 1e-12 * std::sqrt(sq));
    EXPECT_EQ(optim::count_zeros_in_grads(opt, ps, tp_rank, one), zeros);
    EXPECT_GT(zeros, 0);
  }
}

TEST(DecoupledLr, OnlyTheEmbeddingOrOutputGroupMovesWhenTheOthersRateIsZero) {
  model::ParamStore ps = store(true);
  std::vector<float> before(ps.flat_params().data<float>(),
                            ps.flat_params().data<float>() + ps.total_numel());
  optim::AdamW opt(ps, {});
  opt.set_decoupled_lr(0.1);
  opt.step(/*lr=*/0.0, /*wd=*/0.0);
  const float* after = ps.flat_params().data<float>();
  for (size_t k = 0; k < ps.infos().size(); ++k) {
    const auto& p = ps.infos()[k];
    int64_t moved = 0;
    for (int64_t i = 0; i < p.numel(); ++i) moved += after[p.offset + i] != before[p.offset + i];
    if (k == 1)
      EXPECT_GT(moved, p.numel() / 2) << "the decoupled parameter did not move";
    else
      EXPECT_EQ(moved, 0) << p.name << " moved with lr 0";
  }
}

// ---- parsing ----------------------------------------------------------------------------

std::vector<std::string> argv_with(std::vector<std::string> extra) {
  std::vector<std::string> v = {
      "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length",
      "32", "--max-position-embeddings", "32", "--micro-batch-size", "2", "--lr", "1e-3",
      "--train-samples", "100", "--mock-data", "--tokenizer-type", "NullTokenizer",
      "--vocab-size", "512", "--global-batch-size", "16"};
  v.insert(v.end(), extra.begin(), extra.end());
  return v;
}

TEST(Parse, NewFlagsReachArgs) {
  auto a = training::parse_args(argv_with(
      {"--rampup-batch-size", "4", "4", "40", "--decoupled-lr", "2e-3", "--decoupled-min-lr",
       "1e-5", "--apply-layernorm-1p", "--no-mmap-bin-files", "--log-params-norm",
       "--log-num-zeros-in-grad", "--no-create-attention-mask-in-dataloader",
       "--empty-unused-memory-level", "2", "--deterministic-mode"}));
  ASSERT_TRUE(a.rampup_batch_size.has_value());
  EXPECT_EQ(*a.rampup_batch_size, (std::vector<int64_t>{4, 4, 40}));
  EXPECT_EQ(a.decoupled_lr, 2e-3);
  EXPECT_EQ(a.decoupled_min_lr, 1e-5);
  EXPECT_TRUE(a.layernorm_zero_centered_gamma);
  EXPECT_FALSE(a.mmap_bin_files);
  EXPECT_TRUE(a.log_params_norm && a.log_num_zeros_in_grad);
  training::validate_args(a, 1);
  EXPECT_EQ(a.train_iters, 10);  // update_train_iters with the ramp (see above)
  const auto why = training::describe_by_design_flags(a);
  std::string all;
  for (const auto& l : why) all += l + "\n";
  for (const char* f : {"--no-create-attention-mask-in-dataloader", "--empty-unused-memory-level",
                        "--deterministic-mode"})
    EXPECT_NE(all.find(f), std::string::npos) << f << " not described:\n" << all;
  // print_args shows the ramp as Megatron's namespace does.
  EXPECT_NE(training::format_args(a).find("rampup_batch_size ............................... [4, 4, 40]"),
            std::string::npos)
      << training::format_args(a);
  auto b = training::parse_args(argv_with({}));
  EXPECT_NE(training::format_args(b).find("rampup_batch_size ............................... None"),
            std::string::npos);
}

TEST(Parse, CompatErrorsNameTheFlag) {
  auto expect_error = [](std::vector<std::string> extra, const char* what) {
    try {
      auto a = training::parse_args(argv_with(extra));
      training::validate_args(a, 1);
      ADD_FAILURE() << "no error for " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  expect_error({"--rampup-batch-size", "4", "4"}, "--rampup-batch-size needs exactly 3 values");
  expect_error({"--rampup-batch-size", "16", "4", "40"}, "is not below --global-batch-size");
  expect_error({"--decoupled-min-lr", "1e-5"}, "--decoupled-lr was not given");
  expect_error({"--decoupled-lr", "1e-3", "--decoupled-min-lr", "2e-3"},
               "is outside [0, --decoupled-lr");
  expect_error({"--use-checkpoint-args"}, "--load was not given");
  // The trainer's list, as `megatron plan` meets it too.
  auto a = training::parse_args(argv_with({"--bf16"}));
  training::validate_args(a, 1);
  try {
    training::check_trainer_support(a, Device::CPU);
    ADD_FAILURE() << "--bf16 on the CPU accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--bf16 on the CPU backend"), std::string::npos);
    EXPECT_NE(e.hint().find("drop --bf16"), std::string::npos) << e.hint();
  }
  EXPECT_NO_THROW(training::check_trainer_support(a, Device::CUDA));
}

}  // namespace compat_test
}  // namespace mcpp
