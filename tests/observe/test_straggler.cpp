// The straggler report's lines (training/straggler.h) from given per-rank numbers: which
// rank each minimum and maximum names, fields no rank measured left out, the bottom / top
// throughput lines of --straggler-minmax-count, in Megatron's format.
#include <gtest/gtest.h>

#include <cmath>

#include "training/straggler.h"

namespace mcpp::training {
namespace straggler_test {

StragglerRank rank(double rtt, double data, double power, double etpt) {
  StragglerRank r;
  r.rtt_ms = rtt, r.data_ms = data, r.power_w = power, r.temp_c = 40 + power / 100;
  r.util_pct = 90, r.clock_mhz = 1500 + power, r.etpt_tflops = etpt;
  return r;
}

TEST(StragglerReport, NamesTheRankOfEachMinimumAndMaximum) {
  const std::vector<StragglerRank> ranks = {rank(100.0, 2.5, 600, 300.0),
                                            rank(140.25, 1.0, 650, 214.29),
                                            rank(90.0, 3.0, 580, 333.33)};
  const auto lines = format_straggler_report(ranks, 1, "2026-12-05 10:00:00");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "[2026-12-05 10:00:00] | MnRtt/Rnk: 90.00ms/2 | MxRtt/Rnk: 140.25ms/1 | "
            "MnPwr/Rnk: 580.00W/2 | MxPwr/Rnk: 650.00W/1 | MnTmp/Rnk: 45.80C/2 | "
            "MxTmp/Rnk: 46.50C/1 | MnUtl/Rnk: 90.00%/0 | MxUtl/Rnk: 90.00%/0 | "
            "MnClk/Rnk: 2080.00MHz/2 | MxClk/Rnk: 2150.00MHz/1 | MnDRtt/Rnk: 1.00ms/1 | "
            "MxDRtt/Rnk: 3.00ms/2 | MnEtpt/Rnk: 214.29TF/1 | MxEtpt/Rnk: 333.33TF/2");
}

TEST(StragglerReport, LeavesOutWhatNoRankMeasuredAndSkipsUnknownValues) {
  const double nan = std::nan("");
  std::vector<StragglerRank> ranks = {rank(10, 1, 0, 5), rank(30, 2, 0, 2)};
  for (auto& r : ranks) r.power_w = r.temp_c = r.util_pct = r.clock_mhz = nan;  // the CPU
  auto lines = format_straggler_report(ranks, 1, "t");
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_EQ(lines[0],
            "[t] | MnRtt/Rnk: 10.00ms/0 | MxRtt/Rnk: 30.00ms/1 | MnDRtt/Rnk: 1.00ms/0 | "
            "MxDRtt/Rnk: 2.00ms/1 | MnEtpt/Rnk: 2.00TF/1 | MxEtpt/Rnk: 5.00TF/0");
  // One rank without a reading (NVML failed there): the others' still count.
  ranks[1].power_w = 450;
  lines = format_straggler_report(ranks, 1, "t");
  EXPECT_NE(lines[0].find("MnPwr/Rnk: 450.00W/1 | MxPwr/Rnk: 450.00W/1"), std::string::npos)
      << lines[0];
}

TEST(StragglerReport, MinmaxCountListsTheSlowestAndFastestRanks) {
  std::vector<StragglerRank> ranks;
  const double etpt[] = {5.0, 1.5, 7.25, 3.0, 9.0, 2.0};
  for (double e : etpt) ranks.push_back(rank(10, 1, 500, e));
  const auto lines = format_straggler_report(ranks, 2, "t");
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[1], "^^^^ Bottom 2 Ranks with lowest  Etpt(TF): 1.50/1, 2.00/5,");
  EXPECT_EQ(lines[2], "^^^^ Top    2 Ranks with highest Etpt(TF): 7.25/2, 9.00/4,");
  // As Megatron: only for 1 < N < world.
  EXPECT_EQ(format_straggler_report(ranks, 6, "t").size(), 1u);
  EXPECT_EQ(format_straggler_report(ranks, 1, "t").size(), 1u);
}

}  // namespace straggler_test
}  // namespace mcpp::training
