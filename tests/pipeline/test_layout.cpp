// --pipeline-model-parallel-layout (parallel/pipeline/layout.h): the expansion of the
// string, its mapping to (pipeline rank, model chunk) as Megatron's
// PipelineParallelLayerLayout numbers them, and every error.
#include <gtest/gtest.h>

#include "base/error.h"
#include "parallel/pipeline/layout.h"
#include "parallel/pipeline/schedule.h"

namespace mcpp::parallel::pipeline {
namespace layout_test {

using Stages = std::vector<std::string>;
using Layers = std::vector<std::vector<int>>;

template <class F>
void expect_layout_error(F&& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an mcpp::Error containing '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("--pipeline-model-parallel-layout"), std::string::npos)
        << e.what();
  }
}

TEST(PipelineLayout, Expansion) {
  EXPECT_EQ(expand_layout("EttttL"), (Stages{"EttttL"}));
  EXPECT_EQ(expand_layout("Ettt|tL"), (Stages{"Ettt", "tL"}));
  EXPECT_EQ(expand_layout("Et*3|t*2L"), (Stages{"Ettt", "ttL"}));
  // Megatron's docstring examples: "xy(ab|cd|ef)*2,pq", "(ab)*3", "ab,(cd|)*2", "(|ab)*2,cd".
  EXPECT_EQ(expand_layout("E(tt|)*3,tL"), (Stages{"Ett", "tt", "tt", "tL"}));
  EXPECT_EQ(expand_layout("(t)*3"), (Stages{"ttt"}));
  EXPECT_EQ(expand_layout("Et,(t|)*2L"), (Stages{"Ett", "t", "L"}));
  EXPECT_EQ(expand_layout("E(|tt)*2,tL"), (Stages{"E", "tt", "tttL"}));
  // The DeepSeek-V3 recipe's shape: "Et*2|(tt|)*5t|tmL".
  EXPECT_EQ(expand_layout("Et*2|(tt|)*5t|tmL"),
            (Stages{"Ett", "tt", "tt", "tt", "tt", "tt", "t", "tmL"}));
  // A repeated boundary, a zero count, commas anywhere, multi-digit counts.
  EXPECT_EQ(expand_layout("Et|*2tL"), (Stages{"Et", "", "tL"}));
  EXPECT_EQ(expand_layout("Et*0t,t|t*12L").back(), std::string(12, 't') + "L");
  // Nested groups (Megatron's regexes do not nest; the grammar here does).
  EXPECT_EQ(expand_layout("E((t|)*2t|)*2L"), (Stages{"Et", "t", "t", "t", "t", "t", "L"}));
  EXPECT_EQ(expand_layout("E(t(tt)*2)*2|L"), (Stages{"E" + std::string(10, 't'), "L"}));
  EXPECT_EQ(expand_layout("E|L"), (Stages{"E", "L"}));
}

TEST(PipelineLayout, SyntaxErrors) {
  expect_layout_error([] { expand_layout("Ett|xL"); }, "unknown layer symbol 'x'");
  expect_layout_error([] { expand_layout("EMM*|L"); }, "unknown layer symbol 'M'");  // hybrid
  expect_layout_error([] { expand_layout("Et t|L"); }, "unknown layer symbol ' '");
  expect_layout_error([] { expand_layout("Et2|L"); }, "unknown layer symbol '2'");
  expect_layout_error([] { expand_layout("*2Et|L"); }, "repeats nothing");
  expect_layout_error([] { expand_layout("Et*|L"); }, "has no count");
  expect_layout_error([] { expand_layout("Et*2*3|L"); }, "a repeat of a repeat");
  expect_layout_error([] { expand_layout("E(tt|L"); }, "never closed");
  expect_layout_error([] { expand_layout("Ett)|L"); }, "without '('");
  expect_layout_error([] { expand_layout("E(tt)|L"); }, "must be followed by *N");
  expect_layout_error([] { expand_layout("Et*99999999L"); }, "above 9999999");
  expect_layout_error([] { expand_layout("E(t*9999999)*9L"); }, "more than");
}

TEST(PipelineLayout, MappingPP2) {
  // Stage i -> rank i % PP, chunk i / PP; layers numbered in stage order.
  const auto l = parse_layout("Ettt|tL", 2, 4, 0);
  EXPECT_EQ(l.vpp, 1);
  EXPECT_EQ(l.layers, (Layers{{0, 1, 2}, {3}}));
  EXPECT_EQ(describe_layout(l), (Stages{"rank 0: E t0-t2", "rank 1: t3 L"}));
  // The first stage holds the embedding alone; the last the MTP layers and the loss alone.
  EXPECT_EQ(parse_layout("E|ttttL", 2, 4, 0).layers, (Layers{{}, {0, 1, 2, 3}}));
  const auto m = parse_layout("Ett|mmL", 2, 2, 2);
  EXPECT_EQ(m.layers, (Layers{{0, 1}, {}}));
  EXPECT_EQ(describe_layout(m), (Stages{"rank 0: E t0-t1", "rank 1: m*2 L"}));
  // One stage: the whole model.
  EXPECT_EQ(parse_layout("EtttmL", 1, 3, 1).layers, (Layers{{0, 1, 2}}));
}

TEST(PipelineLayout, MappingPP2xVPP2) {
  // Stages 0..3 = (rank 0, chunk 0), (rank 1, chunk 0), (rank 0, chunk 1), (rank 1, chunk 1).
  const auto l = parse_layout("Ett|t|t|ttL", 2, 6, 0);
  EXPECT_EQ(l.vpp, 2);
  EXPECT_EQ(l.layers, (Layers{{0, 1}, {3}, {2}, {4, 5}}));
  EXPECT_EQ(l.stage(0, 1), "t");
  EXPECT_EQ(l.stage(1, 1), "ttL");
  EXPECT_EQ(describe_layout(l), (Stages{"rank 0: E t0-t1 | t3", "rank 1: t2 | t4-t5 L"}));
  // An even layout is assign_layers' split: Megatron's get_transformer_layer_offset.
  EXPECT_EQ(parse_layout("Ett|tt|tt|ttL", 2, 8, 0).layers, assign_layers(8, 2, 2));
  EXPECT_EQ(parse_layout("E(tt|)*7ttL", 4, 16, 0).layers, assign_layers(16, 4, 2));
  // Empty chunks in the middle of the rounds.
  EXPECT_EQ(parse_layout("Et||tt|L", 2, 3, 0).layers, (Layers{{0}, {1, 2}, {}, {}}));
}

TEST(PipelineLayout, StageLayers) {
  // Without a layout: assign_layers; with one: its partition, checked against V.
  EXPECT_EQ(stage_layers(4, 2, 1, {}), assign_layers(4, 2, 1));
  EXPECT_EQ(stage_layers(4, 2, 1, {1, 3, {}, 0}), assign_layers(4, 2, 1, 1, 3));
  LayerSplit s;
  s.layout = "Ettt|tL";
  EXPECT_EQ(stage_layers(4, 2, 1, s), (Layers{{0, 1, 2}, {3}}));
  expect_layout_error([&] { stage_layers(4, 2, 2, s); }, "sets 1 model chunks per pipeline rank");
  s.first = 3;
  expect_layout_error([&] { stage_layers(4, 2, 1, s); },
                      "--decoder-first/last-pipeline-num-layers");
}

TEST(PipelineLayout, Errors) {
  expect_layout_error([] { parse_layout("Ett|t|tL", 2, 4, 0); },
                      "3 stages are not divisible by --pipeline-model-parallel-size 2");
  expect_layout_error([] { parse_layout("Ett|ttL", 1, 4, 0); }, "would be 2 virtual stages");
  expect_layout_error([] { parse_layout("tt|ttL", 2, 4, 0); },
                      "embedding (E) must appear exactly once");
  expect_layout_error([] { parse_layout("Ett|EttL", 2, 4, 0); }, "found 2");
  expect_layout_error([] { parse_layout("tEt|ttL", 2, 4, 0); }, "E must open the first stage");
  expect_layout_error([] { parse_layout("|EttttL", 2, 4, 0); }, "E must open the first stage");
  expect_layout_error([] { parse_layout("Ett|tt", 2, 4, 0); }, "loss (L) must appear exactly once");
  expect_layout_error([] { parse_layout("Ett|tLt", 2, 4, 0); }, "L must close the last stage");
  expect_layout_error([] { parse_layout("EttL|tt", 2, 4, 0); }, "L must close the last stage");
  expect_layout_error([] { parse_layout("Ett|ttL", 2, 3, 0); },
                      "4 transformer layers (t), but --num-layers is 3");
  expect_layout_error([] { parse_layout("Ett|tmL", 2, 3, 0); },
                      "1 MTP layers (m), but --mtp-num-layers is 0");
  expect_layout_error([] { parse_layout("Ett|tL", 2, 3, 1); },
                      "0 MTP layers (m), but --mtp-num-layers is 1");
  expect_layout_error([] { parse_layout("Ett|mtL", 2, 3, 1); }, "after an MTP layer");
  expect_layout_error([] { parse_layout("Ettm|tL", 2, 3, 1); }, "after an MTP layer");
  // m outside a rank's last chunk (Megatron's rule), m on another rank (Megatron's standalone
  // MTP stage, not implemented here).
  expect_layout_error([] { parse_layout("Et|tm||L", 2, 2, 1); }, "requires them in a rank's last");
  expect_layout_error([] { parse_layout("Ett|tt|m|L", 4, 4, 1); }, "standalone MTP stage");
  // A rank whose every chunk is empty (a chunk without layers elsewhere is fine).
  expect_layout_error([] { parse_layout("Et||tL", 3, 2, 0); },
                      "pipeline rank 1 holds nothing in any of its 1 stage(s)");
  expect_layout_error([] { parse_layout("Et|||||tL", 3, 2, 0); },
                      "pipeline rank 1 holds nothing in any of its 2 stage(s)");
}

}  // namespace layout_test
}  // namespace mcpp::parallel::pipeline
