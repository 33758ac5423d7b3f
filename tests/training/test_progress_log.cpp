// --log-progress (training/progress_log.h): progress.txt's lines in Megatron's tab-separated
// form, and the start of the cumulative throughput read back from the file as Megatron's
// get_start_time_from_progress_log does (restarting at another world size, asynchronous saves
// counted once committed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "training/progress_log.h"

using namespace mcpp::training;
namespace fs = std::filesystem;

namespace progress_log_test {

std::time_t local(int y, int mo, int d, int h, int mi, int s) {
  std::tm tm{};
  tm.tm_year = y - 1900, tm.tm_mon = mo - 1, tm.tm_mday = d;
  tm.tm_hour = h, tm.tm_min = mi, tm.tm_sec = s, tm.tm_isdst = -1;
  return std::mktime(&tm);
}

std::string saved(const char* when, int world, const char* what, const char* flops) {
  return progress_line(when, "7", world,
                       std::string(what) +
                           "\tIteration: 10\tJob throughput: 1.0 TFLOP/s/GPU\t"
                           "Cumulative throughput: 1.0 TFLOP/s/GPU\t"
                           "Floating-point operations: " +
                           flops + "\tTokens (in billions): 0.00");
}

std::vector<std::string> lines_of(const std::string& path) {
  std::ifstream in(path);
  std::vector<std::string> out;
  for (std::string l; std::getline(in, l);) out.push_back(l);
  return out;
}


TEST(ProgressLog, LineIsMegatronsFormat) {
  EXPECT_EQ(progress_line("2026-01-02 03:04:05", "1234", 8, "Starting job"),
            "2026-01-02 03:04:05\tJob ID: 1234\t# GPUs: 8\tStarting job\n");
  EXPECT_EQ(progress_line("2026-01-02 03:04:05", "", 1, "Starting job"),
            "2026-01-02 03:04:05\tJob ID: \t# GPUs: 1\tStarting job\n");
}

TEST(ProgressLog, StartIsTheFirstJobOfTheLastRunWithThisWorldSize) {
  const std::string text =
      progress_line("2026-01-01 00:00:00", "1", 8, "Starting job") +
      saved("2026-01-01 01:00:00", 8, "Saved checkpoint", "1.00e+15") +
      progress_line("2026-01-01 02:00:00", "2", 4, "Starting job") +  // another world size
      saved("2026-01-01 03:00:00", 4, "Saved checkpoint", "2.00e+15") +
      progress_line("2026-01-01 04:00:00", "3", 8, "Starting job") +  // the run starts again
      saved("2026-01-01 05:00:00", 8, "Saving async checkpoint", "3.00e+15") +
      progress_line("2026-01-01 06:00:00", "3", 8, "Saved async checkpoint\tIteration: 10") +
      progress_line("2026-01-01 07:00:00", "4", 8, "Starting job") +
      "a line that does not parse\n" + saved("2026-01-01 08:00:00", 8, "Saved checkpoint", "x");
  const auto s8 = progress_start(text, 8);
  ASSERT_TRUE(s8.has_value());
  EXPECT_EQ(s8->time, local(2026, 1, 1, 4, 0, 0));
  EXPECT_EQ(s8->flops, 2e15);  // the last checkpoint saved before it (by the world-4 job)
  const auto s4 = progress_start(text, 4);
  EXPECT_FALSE(s4.has_value()) << "world size 4's run ended at 04:00";
  EXPECT_FALSE(progress_start("", 8).has_value());
  // An asynchronous save counts once committed: a job started between its "Saving" and
  // "Saved" lines starts from the save before.
  const std::string async =
      saved("2026-01-01 00:00:00", 2, "Saved checkpoint", "1.00e+15") +
      saved("2026-01-01 01:00:00", 2, "Saving async checkpoint", "5.00e+15") +
      progress_line("2026-01-01 02:00:00", "9", 2, "Starting job") +
      progress_line("2026-01-01 03:00:00", "9", 2, "Saved async checkpoint\tIteration: 10");
  EXPECT_EQ(progress_start(async, 2)->flops, 1e15);
}

TEST(ProgressLog, RankZeroAppendsStartAndSaves) {
  const fs::path dir =
      fs::temp_directory_path() / ("mcpp_progress_" + std::to_string(::getpid())) / "not" / "there";
  fs::remove_all(dir.parent_path().parent_path());
  ASSERT_EQ(setenv("SLURM_JOB_ID", "4242", 1), 0);
  {
    ProgressLog other(dir.string(), 2, /*writer=*/false);  // rank 1: nothing
    other.checkpoint_saved(5, 1e12, 0, 1000, false);
    EXPECT_FALSE(fs::exists(dir));
  }
  ProgressLog log(dir.string(), 2, /*writer=*/true);  // creates the folder
  log.checkpoint_saved(20, 3e15, 1e15, 2'500'000'000, false);
  log.checkpoint_saved(30, 4e15, 1e15, 3'000'000'000, true);
  unsetenv("SLURM_JOB_ID");
  const auto lines = lines_of((dir / "progress.txt").string());
  ASSERT_EQ(lines.size(), 3u);
  auto fields = [](const std::string& l) {
    std::vector<std::string> f;
    std::stringstream ss(l);
    for (std::string x; std::getline(ss, x, '\t');) f.push_back(x);
    return f;
  };
  const auto start = fields(lines[0]);
  ASSERT_EQ(start.size(), 4u);
  EXPECT_EQ(start[0].size(), 19u);  // YYYY-MM-DD HH:MM:SS
  EXPECT_EQ(start[1], "Job ID: 4242");
  EXPECT_EQ(start[2], "# GPUs: 2");
  EXPECT_EQ(start[3], "Starting job");
  const auto s = fields(lines[1]);
  ASSERT_EQ(s.size(), 9u);
  EXPECT_EQ(s[3], "Saved checkpoint");
  EXPECT_EQ(s[4], "Iteration: 20");
  EXPECT_EQ(s[5].rfind("Job throughput: ", 0), 0u) << s[5];
  EXPECT_EQ(s[5].substr(s[5].size() - 12), " TFLOP/s/GPU") << s[5];
  EXPECT_EQ(s[6].rfind("Cumulative throughput: ", 0), 0u) << s[6];
  EXPECT_EQ(s[7], "Floating-point operations: 3.00e+15");
  EXPECT_EQ(s[8], "Tokens (in billions): 2.50");
  // This job's 2e15 operations per its seconds; since the file's start (this job's own line),
  // all 3e15 (no earlier save is recorded) over at least as long.
  const double job = std::stod(s[5].substr(16)), cum = std::stod(s[6].substr(23));
  EXPECT_GT(job, 0);
  EXPECT_GT(cum, 0);
  EXPECT_LE(cum, job * 1.5 * 1.001 + 0.1);
  const auto a = fields(lines[2]);
  ASSERT_EQ(a.size(), 9u);
  EXPECT_EQ(a[3], "Saving async checkpoint");
  EXPECT_EQ(a[7], "Floating-point operations: 4.00e+15");
  fs::remove_all(dir.parent_path().parent_path());
}

}  // namespace progress_log_test
