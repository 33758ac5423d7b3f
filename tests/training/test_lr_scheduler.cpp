// OptimizerParamScheduler against values computed by hand from megatron.md §2.3.
// Common setting: init 0, max 1.0, min 0.1, warmup 100 samples, decay 1000 samples.
#include <gtest/gtest.h>

#include <cmath>

#include "base/error.h"
#include "optim/lr_scheduler.h"

using namespace mcpp;
using namespace mcpp::optim;

namespace lr_scheduler_test {
SchedulerConfig cfg(LrDecayStyle style) {
  SchedulerConfig c;
  c.init_lr = 0.0;
  c.max_lr = 1.0;
  c.min_lr = 0.1;
  c.warmup_steps = 100;
  c.decay_steps = 1000;
  c.decay_style = style;
  c.start_wd = c.end_wd = 0.01;
  c.wd_incr_steps = 1000;
  return c;
}
double lr_at(const SchedulerConfig& c, int64_t n) {
  OptimizerParamScheduler s(c);
  s.step(n);
  return s.lr();
}

TEST(LrScheduler, ConstructorStepsZeroAndStepsCountSamples) {
  OptimizerParamScheduler s(cfg(LrDecayStyle::Linear));
  EXPECT_EQ(s.num_steps(), 0);
  EXPECT_DOUBLE_EQ(s.lr(), 0.0);  // start of warmup: init_lr
  s.step(64);
  s.step(64);
  EXPECT_EQ(s.num_steps(), 128);
}

TEST(LrScheduler, WarmupIncludingInit) {
  auto c = cfg(LrDecayStyle::Linear);
  EXPECT_DOUBLE_EQ(lr_at(c, 50), 0.5);
  EXPECT_DOUBLE_EQ(lr_at(c, 100), 1.0);  // n <= warmup is still warmup
  c.init_lr = 0.2;
  EXPECT_DOUBLE_EQ(lr_at(c, 25), 0.4);  // 0.2 + 0.8 * 25/100
  c.warmup_steps = 0;
  EXPECT_DOUBLE_EQ(lr_at(c, 0), 1.0);  // no warmup: starts at max
}

TEST(LrScheduler, Linear) {
  auto c = cfg(LrDecayStyle::Linear);
  EXPECT_DOUBLE_EQ(lr_at(c, 550), 0.55);  // r = 450/900 = 0.5
  EXPECT_NEAR(lr_at(c, 1000), 0.1, 1e-15);
  EXPECT_DOUBLE_EQ(lr_at(c, 1001), 0.1);  // past decay: min
  EXPECT_DOUBLE_EQ(lr_at(c, 5000), 0.1);
}

TEST(LrScheduler, Cosine) {
  auto c = cfg(LrDecayStyle::Cosine);
  EXPECT_NEAR(lr_at(c, 550), 0.55, 1e-12);
  EXPECT_NEAR(lr_at(c, 325), 0.1 + 0.9 * 0.5 * (std::cos(M_PI / 4) + 1), 1e-12);  // 0.868198
  EXPECT_NEAR(lr_at(c, 325), 0.8681980515, 1e-9);
  EXPECT_NEAR(lr_at(c, 1000), 0.1, 1e-12);
}

TEST(LrScheduler, Constant) {
  auto c = cfg(LrDecayStyle::Constant);
  EXPECT_DOUBLE_EQ(lr_at(c, 50), 0.5);  // warmup still applies
  EXPECT_DOUBLE_EQ(lr_at(c, 500), 1.0);
  EXPECT_DOUBLE_EQ(lr_at(c, 5000), 1.0);  // constant ignores the decay length
}

TEST(LrScheduler, InverseSquareRoot) {
  auto c = cfg(LrDecayStyle::InverseSquareRoot);
  EXPECT_DOUBLE_EQ(lr_at(c, 400), 0.5);  // sqrt(100)/sqrt(400)
  EXPECT_NEAR(lr_at(c, 900), 1.0 / 3.0, 1e-15);
  EXPECT_NEAR(lr_at(c, 1000), 0.316227766, 1e-9);
  EXPECT_DOUBLE_EQ(lr_at(c, 1001), 0.1);  // past decay: min
  c.min_lr = 0.45;
  EXPECT_DOUBLE_EQ(lr_at(c, 900), 0.45);  // floored at min
}

TEST(LrScheduler, WsdFourDecayStyles) {
  auto c = cfg(LrDecayStyle::WSD);
  c.wsd_decay_steps = 200;  // anneal from 800 to 1000
  for (auto style : {WsdDecayStyle::Linear, WsdDecayStyle::Cosine, WsdDecayStyle::Exponential,
                     WsdDecayStyle::MinusSqrt}) {
    c.wsd_decay_style = style;
    EXPECT_DOUBLE_EQ(lr_at(c, 500), 1.0) << to_string(style);  // stable phase
    EXPECT_DOUBLE_EQ(lr_at(c, 800), 1.0) << to_string(style);
    EXPECT_NEAR(lr_at(c, 1000), 0.1, 1e-12) << to_string(style);
    EXPECT_DOUBLE_EQ(lr_at(c, 1200), 0.1) << to_string(style);
  }
  // w = (900 - 800) / 200 = 0.5.
  c.wsd_decay_style = WsdDecayStyle::Linear;
  EXPECT_NEAR(lr_at(c, 900), 0.55, 1e-12);
  c.wsd_decay_style = WsdDecayStyle::Cosine;
  EXPECT_NEAR(lr_at(c, 900), 0.55, 1e-12);
  c.wsd_decay_style = WsdDecayStyle::Exponential;  // 2 * 0.5^0.5 - 1 = 0.414214
  EXPECT_NEAR(lr_at(c, 900), 0.1 + 0.9 * (std::sqrt(2.0) - 1.0), 1e-12);
  EXPECT_NEAR(lr_at(c, 900), 0.4727922061, 1e-9);
  c.wsd_decay_style = WsdDecayStyle::MinusSqrt;  // 1 - sqrt(0.5) = 0.292893
  EXPECT_NEAR(lr_at(c, 900), 0.3636038969, 1e-9);
  c.wsd_decay_style = WsdDecayStyle::Linear;  // w = 0.25 at 850
  EXPECT_NEAR(lr_at(c, 850), 0.775, 1e-12);
}

TEST(LrScheduler, WeightDecayIncrementStyles) {
  auto c = cfg(LrDecayStyle::Linear);
  c.start_wd = 0.0;
  c.end_wd = 0.1;
  c.wd_incr_style = WdIncrStyle::Linear;
  OptimizerParamScheduler lin(c);
  EXPECT_DOUBLE_EQ(lin.wd(), 0.0);
  lin.step(250);
  EXPECT_DOUBLE_EQ(lin.wd(), 0.025);
  lin.step(1000);
  EXPECT_DOUBLE_EQ(lin.wd(), 0.1);  // past the increment window: end
  c.wd_incr_style = WdIncrStyle::Cosine;
  OptimizerParamScheduler cosine(c);
  cosine.step(250);
  EXPECT_NEAR(cosine.wd(), 0.1 * 0.5 * (std::cos(M_PI * 0.75) + 1), 1e-15);  // 0.0146447
  EXPECT_NEAR(cosine.wd(), 0.0146446609, 1e-9);
  cosine.step(750);
  EXPECT_NEAR(cosine.wd(), 0.1, 1e-15);
  OptimizerParamScheduler constant(cfg(LrDecayStyle::Linear));
  constant.step(300);
  EXPECT_DOUBLE_EQ(constant.wd(), 0.01);
}

TEST(LrScheduler, DecoupledGroupLr) {
  OptimizerParamScheduler s(cfg(LrDecayStyle::Linear));
  s.step(550);
  EXPECT_DOUBLE_EQ(s.lr_for(2.0, 0.0), 1.0);  // own max/min, same coefficient
}

TEST(LrScheduler, InvalidSettings) {
  auto c = cfg(LrDecayStyle::Linear);
  c.min_lr = 2.0;
  EXPECT_THROW(OptimizerParamScheduler{c}, Error);
  c = cfg(LrDecayStyle::Linear);
  c.warmup_steps = 1000;
  EXPECT_THROW(OptimizerParamScheduler{c}, Error);
  c = cfg(LrDecayStyle::WSD);  // no wsd_decay_steps
  EXPECT_THROW(OptimizerParamScheduler{c}, Error);
  c = cfg(LrDecayStyle::Linear);
  c.end_wd = 0.5;  // constant style needs start == end
  EXPECT_THROW(OptimizerParamScheduler{c}, Error);
  EXPECT_THROW(parse_lr_decay_style("cosin"), Error);
  EXPECT_EQ(parse_lr_decay_style("inverse-square-root"), LrDecayStyle::InverseSquareRoot);
  EXPECT_EQ(parse_wsd_decay_style("minus_sqrt"), WsdDecayStyle::MinusSqrt);
}

TEST(LrScheduler, CheckpointStateRoundTripAndPolicies) {
  OptimizerParamScheduler a(cfg(LrDecayStyle::Cosine));
  a.step(640);
  SchedulerState st = a.state();
  EXPECT_EQ(st.num_steps, 640);
  OptimizerParamScheduler b(cfg(LrDecayStyle::Cosine));
  b.load_state(st, SchedulerLoadPolicy::RequireMatch);
  EXPECT_EQ(b.num_steps(), 640);
  EXPECT_DOUBLE_EQ(b.lr(), a.lr());

  auto other = cfg(LrDecayStyle::Cosine);
  other.max_lr = 2.0;
  OptimizerParamScheduler c(other);
  try {
    c.load_state(st, SchedulerLoadPolicy::RequireMatch);
    FAIL() << "mismatch accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("learning rate = 2 but the checkpoint has 1"),
              std::string::npos)
        << e.what();
  }
  c.load_state(st, SchedulerLoadPolicy::UseCheckpoint);
  EXPECT_DOUBLE_EQ(c.lr(), a.lr());
  OptimizerParamScheduler d(other);
  d.load_state(st, SchedulerLoadPolicy::OverrideFromArgs);
  EXPECT_EQ(d.num_steps(), 640);
  EXPECT_DOUBLE_EQ(d.config().max_lr, 2.0);
}

}  // namespace lr_scheduler_test
