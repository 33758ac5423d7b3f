// Sampling: top-k never leaves the k best, top-p keeps the minimal nucleus, tiny
// temperatures are greedy, frequencies follow the softmax, seeds reproduce, padding
// columns are never chosen, and Megatron's invalid combinations are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <set>

#include "base/error.h"
#include "base/philox.h"
#include "inference/sampling.h"

using namespace mcpp;
using inference::SamplingParams;

namespace sampling_test {

std::vector<float> random_logits(int64_t V, uint64_t seed) {
  std::vector<float> l(static_cast<size_t>(V));
  for (int64_t i = 0; i < V; ++i) l[size_t(i)] = float(2.0 * Philox::normal(seed, 0, uint64_t(i)));
  return l;
}

TEST(Sampling, TopKNeverLeavesTheKBest) {
  auto l = random_logits(50, 1);
  std::vector<int> order(50);
  for (int i = 0; i < 50; ++i) order[size_t(i)] = i;
  std::sort(order.begin(), order.end(), [&](int a, int b) { return l[size_t(a)] > l[size_t(b)]; });
  const std::set<int64_t> best(order.begin(), order.begin() + 5);
  SamplingParams p;
  p.top_k = 5, p.temperature = 3.0;  // flat: every one of the 5 shows up
  std::set<int64_t> seen;
  for (uint64_t step = 0; step < 3000; ++step) {
    int64_t id = inference::sample(l, 50, p, 0, step);
    ASSERT_TRUE(best.count(id)) << id;
    seen.insert(id);
  }
  EXPECT_EQ(seen, best);
}

TEST(Sampling, TopPKeepsTheMinimalNucleus) {
  // p = 0.5, 0.3, 0.15, 0.05.
  std::vector<float> l = {std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
  SamplingParams p;
  p.top_p = 0.7;  // 0.5 < 0.7 <= 0.5 + 0.3: nucleus {1, 3}
  std::map<int64_t, int> n;
  const int N = 20000;
  for (uint64_t step = 0; step < N; ++step) ++n[inference::sample(l, 4, p, 7, step)];
  EXPECT_EQ(n.size(), 2u);
  EXPECT_NEAR(double(n[1]) / N, 0.5 / 0.8, 0.015);
  EXPECT_NEAR(double(n[3]) / N, 0.3 / 0.8, 0.015);
  p.top_p = 0.5;  // the first token alone reaches 0.5
  for (uint64_t step = 0; step < 500; ++step) ASSERT_EQ(inference::sample(l, 4, p, 7, step), 1);
  p.top_p = 0.96;  // needs all four
  std::set<int64_t> all;
  for (uint64_t step = 0; step < 5000; ++step) all.insert(inference::sample(l, 4, p, 7, step));
  EXPECT_EQ(all.size(), 4u);
}

TEST(Sampling, FrequenciesFollowTheTemperedSoftmax) {
  std::vector<float> l = {0.f, 1.f, 2.f, -1.f};
  SamplingParams p;
  p.temperature = 2.0;
  std::vector<double> want(4);
  double z = 0;
  for (int i = 0; i < 4; ++i) z += want[size_t(i)] = std::exp(l[size_t(i)] / 2.0);
  std::vector<int> n(4);
  const int N = 40000;
  for (uint64_t step = 0; step < N; ++step) ++n[size_t(inference::sample(l, 4, p, 3, step))];
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(double(n[size_t(i)]) / N, want[size_t(i)] / z, 0.01) << i;
}

TEST(Sampling, TinyTemperatureIsGreedy) {
  for (uint64_t s = 0; s < 20; ++s) {
    auto l = random_logits(100, 10 + s);
    const int64_t best = inference::argmax(l, 100);
    SamplingParams p;
    p.temperature = 1e-4;
    for (uint64_t step = 0; step < 20; ++step)
      ASSERT_EQ(inference::sample(l, 100, p, s, step), best);
    SamplingParams g;
    g.greedy = true;
    EXPECT_EQ(inference::sample(l, 100, g, s, 0), best);
    g.greedy = false, g.top_k = 1;  // Megatron's greedy
    EXPECT_EQ(inference::sample(l, 100, g, s, 0), best);
  }
}

TEST(Sampling, SameSeedSameSamplesOtherSeedOthers) {
  auto l = random_logits(100, 2);
  SamplingParams a, b;
  a.seed = b.seed = 42;
  std::vector<int64_t> x, y, z;
  for (uint64_t step = 0; step < 64; ++step) {
    x.push_back(inference::sample(l, 100, a, 0, step));
    y.push_back(inference::sample(l, 100, b, 0, step));
  }
  EXPECT_EQ(x, y);
  b.seed = 43;
  for (uint64_t step = 0; step < 64; ++step) z.push_back(inference::sample(l, 100, b, 0, step));
  EXPECT_NE(x, z);
}

TEST(Sampling, PaddingColumnsAreNeverChosen) {
  std::vector<float> l = {0.f, 1.f, 0.5f, 100.f};  // column 3 is vocabulary padding
  SamplingParams p;
  for (uint64_t step = 0; step < 200; ++step) ASSERT_LT(inference::sample(l, 3, p, 0, step), 3);
  EXPECT_EQ(inference::argmax(l, 3), 1);
}

TEST(Sampling, InvalidSettingsAreErrors) {
  auto bad = [](auto mutate) {
    SamplingParams p;
    mutate(p);
    EXPECT_THROW(inference::validate(p), Error);
  };
  bad([](SamplingParams& p) { p.top_k = 5, p.top_p = 0.9; });
  bad([](SamplingParams& p) { p.temperature = 0; });
  bad([](SamplingParams& p) { p.temperature = 101; });
  bad([](SamplingParams& p) { p.top_p = 1.5; });
  bad([](SamplingParams& p) { p.top_k = -1; });
  SamplingParams g;
  g.greedy = true, g.temperature = 0;  // ignored when greedy
  EXPECT_NO_THROW(inference::validate(g));
}

}  // namespace sampling_test
