// ParamStore's non-trainable persistent buffers (issue 16 part 2): registered with a
// partition description, allocated and initialised by allocate(), readable and writable
// by name, outside the flat parameter/gradient buffers; and the registry flags that the
// registering modules set (no behaviour hangs on parameter names).
#include <gtest/gtest.h>

#include "model/gpt_model.h"
#include "tiny_model.h"

using namespace mcpp;
using model::BufferInfo;
using model::Init;
using model::ParamInfo;
using model::ParamStore;
using model::TpSplit;

namespace param_buffers_test {

ParamStore store_with_buffers(int64_t tp_rank, int64_t tp_size, bool buffers) {
  ParamStore s;
  s.add(model::make_param("w", {4, 6}, TpSplit::Rows, Init::Normal, 0.02, true, -1, tp_size));
  s.add(model::make_param("b", {6}, TpSplit::None, Init::Zeros, 0, false, -1, tp_size));
  if (buffers) {
    BufferInfo zeros{"router.expert_bias", {8}, {}, DType::F32, TpSplit::None, 3, -1};
    BufferInfo ones{"fp8.amax_history", {2, 6}, {}, DType::F64, TpSplit::Cols, 3, 1, Init::Ones};
    BufferInfo given{"scales", {4, 3}, {}, DType::F64, TpSplit::Rows};
    for (int i = 0; i < 12; ++i) given.values.push_back(10.0 * i);
    s.add_buffer(zeros);
    s.add_buffer(ones);
    s.add_buffer(given);
  }
  s.allocate(DType::F64, tp_rank, tp_size);
  s.initialize(7);
  return s;
}


TEST(ParamBuffers, AllocatedInitialisedShardedAndOutsideTheFlatBuffers) {
  for (int64_t r = 0; r < 2; ++r) {
    ParamStore plain = store_with_buffers(r, 2, false), s = store_with_buffers(r, 2, true);
    // Not in the flat buffers: the same parameter layout, values and total as without.
    EXPECT_EQ(s.total_numel(), plain.total_numel());
    for (int64_t i = 0; i < s.total_numel(); ++i)
      ASSERT_EQ(s.flat_params().data<double>()[i], plain.flat_params().data<double>()[i]);
    ASSERT_EQ(s.buffer_infos().size(), 3u);
    EXPECT_FALSE(s.has("router.expert_bias"));
    EXPECT_TRUE(s.has_buffer("router.expert_bias"));

    Tensor z = s.buffer("router.expert_bias");
    EXPECT_EQ(z.shape(), (Shape{8}));
    EXPECT_EQ(z.dtype(), DType::F32);
    for (int64_t i = 0; i < 8; ++i) EXPECT_EQ(z.data<float>()[i], 0.f);

    Tensor o = s.buffer("fp8.amax_history");  // [2, 6] split by columns: [2, 3] a rank
    EXPECT_EQ(o.shape(), (Shape{2, 3}));
    EXPECT_EQ(s.buffer_infos()[1].expert, 1);
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(o.data<double>()[i], 1.0);

    Tensor g = s.buffer("scales");  // global [4, 3] = 10 * flat index, split by rows
    EXPECT_EQ(g.shape(), (Shape{2, 3}));
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(g.data<double>()[i], 10.0 * double(r * 6 + i));

    // Writable in place, read back by name.
    g.data<double>()[4] = -1.5;
    EXPECT_EQ(s.buffer("scales").data<double>()[4], -1.5);
  }
}

TEST(ParamBuffers, RejectsBadRegistrations) {
  ParamStore s;
  s.add(model::make_param("w", {4}, TpSplit::None, Init::Ones, 0, false, -1, 1));
  EXPECT_THROW(s.add_buffer(BufferInfo{"w", {4}}), Error);  // a parameter's name
  s.add_buffer(BufferInfo{"x", {4}});
  EXPECT_THROW(s.add_buffer(BufferInfo{"x", {4}}), Error);  // twice
  BufferInfo normal{"n", {4}};
  normal.init = Init::Normal;
  EXPECT_THROW(s.add_buffer(normal), Error);
  BufferInfo short_values{"v", {4}};
  short_values.values = {1, 2, 3};
  EXPECT_THROW(s.add_buffer(short_values), Error);
  EXPECT_THROW(s.buffer("x"), Error);  // before allocate
  BufferInfo odd{"odd", {3, 2}, {}, DType::F32, TpSplit::Rows};
  s.add_buffer(odd);
  EXPECT_THROW(s.allocate(DType::F32, 0, 2), Error);  // 3 rows over 2 ranks
  ParamStore t;
  t.add_buffer(BufferInfo{"y", {2}});
  t.allocate(DType::F32, 0, 1);
  EXPECT_THROW(t.add_buffer(BufferInfo{"z", {2}}), Error);  // after allocate
  EXPECT_THROW(t.buffer("nope"), Error);
}

// The modules set the flags when they register: sequence_parallel exactly on what acts on
// the sequence shard (norms, learned positions), never on row-parallel biases; every
// dense parameter in the dense gradient group.
TEST(ParamRegistry, ModulesSetPartitionFlags) {
  for (bool llama : {false, true}) {
    auto c = model::test::tiny(llama, 2, 0.0);
    c.tp_size = 2;
    for (const ParamInfo& p : model::parameter_registry(c, {})) {
      const bool norm = p.name.find("layernorm") != std::string::npos;
      const bool pos = p.name == "embedding.position_embeddings.weight";
      EXPECT_EQ(p.sequence_parallel, norm || pos) << p.name;
      EXPECT_EQ(p.grad_group, model::GradGroup::Dense) << p.name;
      EXPECT_EQ(p.expert, -1) << p.name;
      if (p.name.find("linear_proj.bias") != std::string::npos ||
          p.name.find("linear_fc2.bias") != std::string::npos)
        EXPECT_EQ(p.split, TpSplit::None) << p.name;
      if (p.split == TpSplit::Rows) EXPECT_EQ(p.local_shape[0] * 2, p.global_shape[0]) << p.name;
      if (p.split == TpSplit::Cols) EXPECT_EQ(p.local_shape[1] * 2, p.global_shape[1]) << p.name;
    }
  }
}

}  // namespace param_buffers_test
