// NumPy RNG compatibility against fixtures made by tests/golden/make_numpy_rng_fixtures.py.
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "base/numpy_rng.h"

namespace numpy_rng_test {

nlohmann::json fixtures() {
  std::ifstream f(std::string(MCPP_SOURCE_DIR) + "/tests/golden/numpy_rng_fixtures.json");
  EXPECT_TRUE(f.good());
  return nlohmann::json::parse(f);
}


TEST(NumpyRng, PublishedMT19937Outputs) {
  mcpp::NumpyRandomState rs(5489);
  EXPECT_EQ(rs.next_u32(), 3499211612u);
  EXPECT_EQ(rs.next_u32(), 581869302u);
  EXPECT_EQ(rs.next_u32(), 3890346734u);
}

TEST(NumpyRng, RandomStateRawMatchesNumpy) {
  for (auto& c : fixtures()["mt_raw"]) {
    mcpp::NumpyRandomState rs(c["seed"].get<uint32_t>());
    for (auto& v : c["u32"]) EXPECT_EQ(rs.next_u32(), v.get<uint32_t>()) << c["seed"];
  }
}

TEST(NumpyRng, ShuffleMatchesNumpy) {
  for (auto& c : fixtures()["shuffle"]) {
    int64_t n = c["n"];
    mcpp::NumpyRandomState rs(c["seed"].get<uint32_t>());
    std::vector<int32_t> a(n);
    std::iota(a.begin(), a.end(), 0);
    rs.shuffle(a.data(), n);
    std::vector<uint32_t> b(n / 2 + 1);
    std::iota(b.begin(), b.end(), 0u);
    rs.shuffle(b.data(), int64_t(b.size()));
    auto first = c["first"].get<std::vector<int64_t>>();
    for (size_t i = 0; i < first.size(); ++i)
      ASSERT_EQ(a[i], first[i]) << "seed " << c["seed"] << " n " << n;
    int64_t s = 0;
    for (int64_t i = 0; i < n; ++i) s += i * a[i];
    EXPECT_EQ(s, c["sum_i_times_v"].get<int64_t>());
    auto second = c["second_first"].get<std::vector<int64_t>>();
    for (size_t i = 0; i < second.size() && i < b.size(); ++i) ASSERT_EQ(b[i], second[i]);
  }
}

TEST(NumpyRng, PCG64RawMatchesNumpy) {
  for (auto& c : fixtures()["pcg_raw"]) {
    mcpp::NumpyGenerator g(c["seed"].get<uint64_t>());
    for (auto& v : c["u64"])
      EXPECT_EQ(g.next_u64(), std::stoull(v.get<std::string>())) << c["seed"];
  }
}

TEST(NumpyRng, IntegersInt32MatchNumpy) {
  for (auto& c : fixtures()["integers"]) {
    mcpp::NumpyGenerator g(c["seed"].get<uint64_t>());
    int64_t size = c["size"];
    std::vector<int32_t> v(size);
    for (auto& x : v) x = g.integers_i32(c["low"], c["high"]);
    auto first = c["first"].get<std::vector<int32_t>>();
    for (size_t i = 0; i < first.size(); ++i) ASSERT_EQ(v[i], first[i]) << "seed " << c["seed"];
    auto last = c["last"].get<std::vector<int32_t>>();
    for (size_t i = 0; i < last.size(); ++i) ASSERT_EQ(v[size - 10 + i], last[i]);
    EXPECT_EQ(std::accumulate(v.begin(), v.end(), int64_t(0)), c["sum"].get<int64_t>());
  }
}

}  // namespace numpy_rng_test
