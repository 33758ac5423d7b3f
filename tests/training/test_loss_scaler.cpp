// LossScaler against Megatron's DynamicGradScaler semantics, stepped by hand.
#include <gtest/gtest.h>

#include "base/error.h"
#include "optim/loss_scaler.h"

namespace loss_scaler_test {

using namespace mcpp::optim;

TEST(LossScaler, HysteresisBackoffAndGrowth) {
  LossScalerConfig c;
  c.initial_scale = 1024, c.min_scale = 256, c.window = 3, c.hysteresis = 2;
  LossScaler s(c);
  EXPECT_EQ(s.scale(), 1024);
  s.update(true);  // first overflow: hysteresis 2 -> 1, scale kept
  EXPECT_EQ(s.scale(), 1024);
  s.update(true);  // second: halve
  EXPECT_EQ(s.scale(), 512);
  s.update(true);  // tracker stays <= 0: halve again, then clamp at min
  EXPECT_EQ(s.scale(), 256);
  s.update(true);
  EXPECT_EQ(s.scale(), 256);
  EXPECT_EQ(s.skipped_iterations(), 4);
  s.update(false), s.update(false);
  EXPECT_EQ(s.scale(), 256);
  s.update(false);  // window of 3 clean steps: double, hysteresis restored
  EXPECT_EQ(s.scale(), 512);
  s.update(true);  // hysteresis 2 again: no backoff on the first overflow
  EXPECT_EQ(s.scale(), 512);
  s.update(false), s.update(false);
  s.update(true);  // growth tracker reset by the overflow; hysteresis now 0 -> halve
  EXPECT_EQ(s.scale(), 256);
}

TEST(LossScaler, ConstantScaleNeverMoves) {
  LossScalerConfig c;
  c.loss_scale = 128;
  LossScaler s(c);
  s.update(true), s.update(false);
  EXPECT_EQ(s.scale(), 128);
  EXPECT_FALSE(s.dynamic());
  EXPECT_EQ(s.skipped_iterations(), 1);
  c.loss_scale = 0, c.window = 0;
  EXPECT_THROW(LossScaler{c}, mcpp::Error);
}

}  // namespace loss_scaler_test
