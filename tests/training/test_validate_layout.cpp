// --pipeline-model-parallel-layout at start-up: the virtual stages it sets, the partition
// every user of the split sees (pipeline_part), and its errors naming the flag.
#include "test_util.h"
#include "training/memory_plan.h"
#include "training/trainer.h"

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

namespace validate_layout_test {

void expect_invalid(const std::vector<std::string>& argv, std::initializer_list<std::string> n,
                    int world) {
  expect_error([&] { parse_and_validate(argv, world); }, n);
}

// 4 layers, PP 2 at world 2 (DP 1), global batch 8 = 4 micro-batches of 2.
std::vector<std::string> pp2(std::initializer_list<std::string> more) {
  return with(with(base_argv(), {"--num-layers", "4", "--pipeline-model-parallel-size", "2",
                                 "--global-batch-size", "8"}),
              more);
}

const char* kFlag = "--pipeline-model-parallel-layout";

TEST(ValidateLayout, SetsVirtualStagesAndThePartition) {
  Args a = parse_and_validate(pp2({kFlag, "Ettt|tL"}), 2);
  EXPECT_EQ(a.virtual_pipeline_model_parallel_size, 1);
  EXPECT_EQ(pipeline_part(a, 0).chunks, (std::vector<std::vector<int>>{{0, 1, 2}}));
  EXPECT_EQ(pipeline_part(a, 1).chunks, (std::vector<std::vector<int>>{{3}}));
  EXPECT_TRUE(pipeline_part(a, 1).last_stage);
  // Four stages over PP 2: two model chunks a rank, the interleaved schedule.
  a = parse_and_validate(pp2({kFlag, "Et|tt|t|L"}), 2);
  EXPECT_EQ(a.virtual_pipeline_model_parallel_size, 2);
  EXPECT_EQ(schedule_kind(a), parallel::pipeline::ScheduleKind::Interleaved1F1B);
  EXPECT_EQ(pipeline_part(a, 0).chunks, (std::vector<std::vector<int>>{{0}, {3}}));
  EXPECT_EQ(pipeline_part(a, 1).chunks, (std::vector<std::vector<int>>{{1, 2}, {}}));
  // The embedding alone on the first stage.
  a = parse_and_validate(pp2({kFlag, "E|ttttL"}), 2);
  EXPECT_EQ(pipeline_part(a, 0).chunks, (std::vector<std::vector<int>>{{}}));
  // MTP layers with the loss.
  a = parse_and_validate(
      pp2({kFlag, "Ett|ttmL", "--mtp-num-layers", "1", "--position-embedding-type", "rope"}), 2);
  EXPECT_EQ(pipeline_part(a, 1).chunks, (std::vector<std::vector<int>>{{2, 3}}));
  // One stage without PP.
  EXPECT_NO_THROW(parse_and_validate(with(base_argv(), {kFlag, "EttL"}), 1));
  // Block recomputation counts the chunks that hold layers.
  EXPECT_NO_THROW(
      parse_and_validate(pp2({kFlag, "E|ttttL", "--recompute-granularity", "full",
                              "--recompute-method", "block", "--recompute-num-layers", "2"}),
                         2));
}

TEST(ValidateLayout, Errors) {
  expect_invalid(pp2({kFlag, "Ett|t|tL"}),
                 {kFlag, "3 stages are not divisible by --pipeline-model-parallel-size 2"}, 2);
  expect_invalid(with(base_argv(), {kFlag, "Et|tL"}),
                 {kFlag, "would be 2 virtual stages, which need --pipeline-model-parallel-size"},
                 1);
  expect_invalid(pp2({kFlag, "Ettt|tL", "--num-virtual-stages-per-pipeline-rank", "1"}),
                 {"cannot be combined with --num-layers-per-virtual-pipeline-stage"}, 2);
  expect_invalid(pp2({kFlag, "Ettt|tL", "--num-layers-per-virtual-pipeline-stage", "2"}),
                 {"cannot be combined with --num-layers-per-virtual-pipeline-stage"}, 2);
  expect_invalid(pp2({kFlag, "Ettt|tL", "--decoder-first-pipeline-num-layers", "3"}),
                 {kFlag, "cannot be combined with --decoder-first/last-pipeline-num-layers"}, 2);
  expect_invalid(pp2({kFlag, "Ett|tL"}), {kFlag, "3 transformer layers (t), but --num-layers is 4"},
                 2);
  expect_invalid(pp2({kFlag, "tEtt|tL"}), {kFlag, "E must open the first stage"}, 2);
  expect_invalid(pp2({kFlag, "Ett|tLt"}), {kFlag, "L must close the last stage"}, 2);
  expect_invalid(pp2({kFlag, "Ett|ttmL"}), {kFlag, "1 MTP layers (m), but --mtp-num-layers is 0"},
                 2);
  expect_invalid(pp2({kFlag, "Ett|tt*L"}), {kFlag, "has no count"}, 2);
  expect_invalid(pp2({kFlag, "Ett|ttML"}), {kFlag, "unknown layer symbol 'M'"}, 2);
  // The schedule's own checks still apply to the chunks the layout makes.
  expect_invalid(pp2({kFlag, "Et|t|t|tL", "--pipeline-schedule", "gpipe"}),
                 {"--pipeline-schedule gpipe runs one model chunk per rank"}, 2);
}

}  // namespace validate_layout_test
