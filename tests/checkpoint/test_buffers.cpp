// Persistent buffers in checkpoints (issue 16 part 2): ParamStore's non-trainable buffers
// (a router's expert bias, FP8 amax history) are saved with the model by the parameters'
// rule (TP rank 0 for a duplicated one, every TP rank's box for a split one), reload bit for
// bit under any TP layout, through the synchronous and the asynchronous save; a checkpoint
// written before a buffer existed loads with a warning, one holding a buffer the model does
// not register loads with a warning, a shape mismatch and a corrupted buffer are errors,
// and the HF export leaves buffers out.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "checkpoint/async_saver.h"
#include "checkpoint/hf.h"
#include "checkpoint/training_checkpoint.h"
#include "comm/world.h"
#include "ckpt_test_util.h"

using namespace mcpp;
using namespace mcpp::testing;
namespace fs = std::filesystem;
namespace ck = mcpp::checkpoint;
using model::BufferInfo;
using model::ParamStore;
using model::TpSplit;

namespace buffers_test {

constexpr uint64_t kParamSalt = 31, kBufSalt = 32;
const std::string kBias = "decoder.layers.0.mlp.router.expert_bias";     // [8], duplicated
const std::string kAmax = "decoder.layers.1.self_attention.amax_history";  // [3, 8], by columns

// The tiny GPT model's parameters at (tp, rank), with the two buffers when `buffers`
// (bias_rows: the expert bias's length, to provoke a shape mismatch). The buffers start
// at their registered initial values: the bias zero, the history one.
ParamStore make_store(int64_t tp, int64_t rank, bool buffers, int64_t bias_rows = 8) {
  model::GPTModel m(tiny_config("gpt", tp, rank));
  ParamStore ps;
  for (const auto& p : m.params().infos()) ps.add(p);
  if (buffers) {
    ps.add_buffer(BufferInfo{kBias, {bias_rows}, {}, DType::F32, TpSplit::None, 0});
    BufferInfo amax{kAmax, {3, 8}, {}, DType::F32, TpSplit::Cols, 1};
    amax.init = model::Init::Ones;
    ps.add_buffer(amax);
  }
  ps.allocate(DType::F32, rank, tp);
  return ps;
}

// Visits every local element of every buffer with its global flat index.
template <typename F>
void for_each_buffer_element(const ParamStore& ps, F&& f) {
  for (size_t i = 0; i < ps.buffer_infos().size(); ++i) {
    const BufferInfo& b = ps.buffer_infos()[i];
    const int64_t rows = b.local_shape[0], cols = b.local_shape.size() > 1 ? b.local_shape[1] : 1;
    float* d = ps.buffer(i).data<float>();
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c)
        f(b, d[r * cols + c],
          ParamStore::global_flat_index(b.split, b.global_shape, b.local_shape, ps.tp_rank(), r, c));
  }
}

// Parameters and buffers filled with layout-independent non-trivial values.
void fill(ParamStore& ps, uint64_t buf_salt = kBufSalt) {
  fill_global(ps, ps.flat_params(), kParamSalt);
  for_each_buffer_element(ps, [&](const BufferInfo& b, float& v, int64_t g) {
    v = float(global_value(buf_salt, b.name, g));
  });
}

// Buffer elements that differ (bitwise) from fill()'s values.
int64_t buffer_mismatches(const ParamStore& ps, uint64_t buf_salt = kBufSalt) {
  int64_t bad = 0;
  for_each_buffer_element(ps, [&](const BufferInfo& b, float& v, int64_t g) {
    const float want = float(global_value(buf_salt, b.name, g));
    bad += std::memcmp(&v, &want, sizeof v) != 0;
  });
  return bad;
}

ck::SaveOptions save_opts() {
  ck::SaveOptions so;
  so.model = tiny_config("gpt");
  return so;
}
ck::LoadOptions load_opts() {
  ck::LoadOptions lo;
  lo.model = tiny_config("gpt");
  return lo;
}

// Saves one snapshot per store (the ranks of one layout) at iteration 5.
void save_ranks(const std::string& dir, std::vector<ParamStore>& stores) {
  std::vector<ck::RankSnapshot> snaps;
  for (auto& s : stores) snaps.push_back(ck::RankSnapshot::view(s, nullptr));
  ck::save_checkpoint(dir, snaps, sample_state(5), save_opts());
}

// Loads dir into fresh stores of TP `tp` (with buffers) and checks every value.
void expect_loads_at(const std::string& dir, int64_t tp) {
  for (int64_t r = 0; r < tp; ++r) {
    SCOPED_TRACE("load at TP " + std::to_string(tp) + " rank " + std::to_string(r));
    ParamStore ps = make_store(tp, r, true);
    ck::load_checkpoint(dir, std::nullopt, ps, nullptr, load_opts());
    EXPECT_EQ(count_mismatches(ps, ps.flat_params(), kParamSalt), 0);
    EXPECT_EQ(buffer_mismatches(ps), 0);
  }
}

std::string load_error(const std::string& dir, ParamStore& ps) {
  try {
    ck::load_checkpoint(dir, std::nullopt, ps, nullptr, load_opts());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}


TEST(CheckpointBuffers, SerialRoundTripIsBitExact) {
  const std::string dir = scratch_dir();
  ParamStore a = make_store(1, 0, true);
  fill(a);
  optim::AdamW opt(a, optim::OptimizerConfig{});
  ck::save_checkpoint(dir, a, &opt, sample_state(5), save_opts());

  const auto md = ck::read_metadata(dir);
  for (const std::string& k : {kBias, kAmax}) {
    ASSERT_TRUE(md["tensors"].contains(k)) << k;
    EXPECT_EQ(md["tensors"][k].value("buffer", false), true) << k;
    EXPECT_EQ(md["tensors"][k]["shards"][0]["file"], "model_tp00_pp00.safetensors");
    // Never optimised: no Adam moments.
    EXPECT_FALSE(md["tensors"].contains("optimizer.exp_avg." + k)) << k;
  }
  EXPECT_EQ(md["tensors"][kAmax]["split"], "cols");
  // Parameters carry no "buffer" field (today's checkpoints stay byte-identical).
  EXPECT_FALSE(md["tensors"]["embedding.word_embeddings.weight"].contains("buffer"));
  // inspect lists and verifies them.
  int bad = -1;
  const std::string report = ck::describe_checkpoint(dir, &bad);
  EXPECT_EQ(bad, 0);
  expect_has(report, kBias + "  [8] F32 none (buffer)");

  ParamStore b = make_store(1, 0, true);
  ASSERT_GT(buffer_mismatches(b), 0);  // fresh: initial values, not the saved ones
  optim::AdamW opt_b(b, optim::OptimizerConfig{});
  ck::load_checkpoint(dir, std::nullopt, b, &opt_b, load_opts());
  EXPECT_EQ(count_mismatches(b, b.flat_params(), kParamSalt), 0);
  EXPECT_EQ(buffer_mismatches(b), 0);
}

// Both TP ranks' stores in this process: TP2 -> TP1 -> TP2 (and TP2 -> TP4).
TEST(CheckpointBuffers, ReshardTp2ToTp1AndBack) {
  const std::string base = scratch_dir(), dir2 = base + "/tp2", dir1 = base + "/tp1";
  std::vector<ParamStore> tp2;
  for (int64_t r = 0; r < 2; ++r) tp2.push_back(make_store(2, r, true)), fill(tp2.back());
  save_ranks(dir2, tp2);
  const auto md = ck::read_metadata(dir2);
  EXPECT_EQ(md["tensors"][kBias]["shards"].size(), 1u);  // duplicated: TP rank 0 only
  EXPECT_EQ(md["tensors"][kAmax]["shards"].size(), 2u);  // split: a box from each rank
  EXPECT_EQ(md["tensors"][kAmax]["shards"][1]["pieces"][0]["offsets"], nlohmann::json({0, 4}));
  expect_loads_at(dir2, 1);
  expect_loads_at(dir2, 4);

  std::vector<ParamStore> tp1;
  tp1.push_back(make_store(1, 0, true));
  ck::load_checkpoint(dir2, std::nullopt, tp1[0], nullptr, load_opts());
  save_ranks(dir1, tp1);
  expect_loads_at(dir1, 2);
}

// DP > 0 ranks hold replicas of the model (write_model = false): the buffers are written
// once, by DP rank 0, whatever the optimizer (the distributed optimizer's shards hold the
// parameters' moments only).
TEST(CheckpointBuffers, WrittenByDpRankZeroOnly) {
  const std::string dir = scratch_dir();
  std::vector<ParamStore> stores;
  std::vector<ck::RankSnapshot> snaps;
  for (int64_t dp = 0; dp < 2; ++dp)
    for (int64_t r = 0; r < 2; ++r) stores.push_back(make_store(2, r, true)), fill(stores.back());
  for (size_t i = 0; i < stores.size(); ++i) {
    snaps.push_back(ck::RankSnapshot::view(stores[i], nullptr, {0, 0, int64_t(i / 2), 0}));
    snaps.back().write_model = i / 2 == 0;
  }
  ck::save_checkpoint(dir, snaps, sample_state(5), save_opts());
  const auto md = ck::read_metadata(dir);
  EXPECT_EQ(md["tensors"][kBias]["shards"].size(), 1u);
  EXPECT_EQ(md["tensors"][kAmax]["shards"].size(), 2u);
  expect_loads_at(dir, 1);
}

// --async-save: the snapshot owns copies of the buffers, so the values of the save are
// written even when training changes the live buffers before the write finishes.
TEST(CheckpointBuffers, AsyncSaveSnapshotsBuffers) {
  const std::string dir = scratch_dir();
  ParamStore a = make_store(1, 0, true);
  fill(a);
  // The snapshot's clone owns its buffers (deterministic; the save below races the refill).
  const ck::RankSnapshot view = ck::RankSnapshot::view(a, nullptr);
  const ck::RankSnapshot copy = view.clone();
  ASSERT_EQ(copy.buffers.size(), 2u);
  fill(a, kBufSalt + 1);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(std::memcmp(view.buffers[i].raw(), a.buffer(i).raw(), a.buffer(i).nbytes()), 0);
    EXPECT_NE(std::memcmp(copy.buffers[i].raw(), a.buffer(i).raw(), a.buffer(i).nbytes()), 0);
  }
  fill(a);
  {
    ck::AsyncSaver saver;
    saver.save(dir, a, nullptr, sample_state(5), save_opts());
    fill(a, kBufSalt + 1);  // the next steps' values
    saver.wait();
  }
  ASSERT_GT(buffer_mismatches(a), 0);
  expect_loads_at(dir, 1);
  expect_loads_at(dir, 2);
}

// A checkpoint written before the buffers existed: the parameters load, every buffer keeps
// its initial value, and one warning line names them.
TEST(CheckpointBuffers, OldCheckpointWithoutBuffersLoadsWithWarning) {
  const std::string dir = scratch_dir();
  ParamStore old = make_store(1, 0, false);
  fill(old);
  ck::save_checkpoint(dir, old, nullptr, sample_state(5), save_opts());
  EXPECT_FALSE(ck::read_metadata(dir)["tensors"].contains(kBias));

  ParamStore ps = make_store(1, 0, true);
  ::testing::internal::CaptureStderr();
  ck::load_checkpoint(dir, std::nullopt, ps, nullptr, load_opts());
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(count_mismatches(ps, ps.flat_params(), kParamSalt), 0);
  for_each_buffer_element(ps, [&](const BufferInfo& b, float& v, int64_t) {
    EXPECT_EQ(v, b.name == kBias ? 0.f : 1.f) << b.name;
  });
  expect_has(err, "keep their initial values");
  expect_has(err, kBias);
  expect_has(err, kAmax);
  EXPECT_EQ(std::count(err.begin(), err.end(), '\n'), 1) << err;
}

// A buffer the loading model does not register (a checkpoint of an MoE or FP8 run loaded by
// `convert --to-hf` or a plain model) is skipped with a warning; the HF export has no
// place for buffers and holds exactly the tensors of the model without them.
TEST(CheckpointBuffers, UnregisteredBufferIgnoredAndLeftOutOfHfExport) {
  const std::string base = scratch_dir(), with = base + "/with", without = base + "/without";
  ParamStore a = make_store(1, 0, true), plain = make_store(1, 0, false);
  fill(a), fill(plain);
  ck::save_checkpoint(with, a, nullptr, sample_state(5), save_opts());
  ck::save_checkpoint(without, plain, nullptr, sample_state(5), save_opts());

  model::GPTModel m(tiny_config("gpt")), m0(tiny_config("gpt"));
  ::testing::internal::CaptureStderr();
  ck::load_checkpoint(with, std::nullopt, m, nullptr);
  const std::string err = ::testing::internal::GetCapturedStderr();
  expect_has(err, "ignoring 2 buffer(s)");
  expect_has(err, kBias);
  EXPECT_EQ(count_mismatches(m.params(), m.params().flat_params(), kParamSalt), 0);
  ck::load_checkpoint(without, std::nullopt, m0, nullptr);

  const auto hf = ck::to_hf_tensors(tiny_config("gpt"), m.params(), DType::F32);
  const auto hf0 = ck::to_hf_tensors(tiny_config("gpt"), m0.params(), DType::F32);
  ASSERT_EQ(hf.size(), hf0.size());
  for (auto it = hf.begin(), it0 = hf0.begin(); it != hf.end(); ++it, ++it0) {
    EXPECT_EQ(it->first, it0->first);
    EXPECT_EQ(it->first.find("expert_bias"), std::string::npos);
    EXPECT_EQ(it->first.find("amax"), std::string::npos);
    ASSERT_EQ(it->second.nbytes(), it0->second.nbytes());
    EXPECT_EQ(std::memcmp(it->second.raw(), it0->second.raw(), it->second.nbytes()), 0)
        << it->first;
  }
}

TEST(CheckpointBuffers, ShapeMismatchNamesTheBuffer) {
  const std::string dir = scratch_dir();
  ParamStore a = make_store(1, 0, true);
  fill(a);
  ck::save_checkpoint(dir, a, nullptr, sample_state(5), save_opts());
  ParamStore b = make_store(1, 0, true, /*bias_rows=*/6);
  const std::string err = load_error(dir, b);
  expect_has(err, "buffer " + kBias);
  expect_has(err, "[8]");
  expect_has(err, "[6]");
  // Nothing half-loaded: the buffers keep their initial values.
  for_each_buffer_element(b, [&](const BufferInfo& bi, float& v, int64_t) {
    EXPECT_EQ(v, bi.name == kBias ? 0.f : 1.f) << bi.name;
  });
}

TEST(CheckpointBuffers, CorruptedBufferIsChecksumError) {
  const std::string dir = scratch_dir();
  ParamStore a = make_store(1, 0, true);
  fill(a);
  ck::save_checkpoint(dir, a, nullptr, sample_state(5), save_opts());
  // Flip one bit inside the expert bias's data (safetensors: u64 header length, JSON header
  // with each tensor's data_offsets, then the data).
  const std::string file = dir + "/iter_0000005/model_tp00_pp00.safetensors";
  std::string bytes = read_bytes(file);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  const auto header = nlohmann::json::parse(bytes.substr(8, n));
  const int64_t at = header.at(kBias).at("data_offsets")[0].get<int64_t>() + 8 + int64_t(n) + 5;
  bytes[size_t(at)] ^= 0x10;
  write_bytes(file, bytes);

  ParamStore b = make_store(1, 0, true);
  const std::string err = load_error(dir, b);
  expect_has(err, "checksum mismatch for tensor " + kBias);
  expect_has(err, "model_tp00_pp00.safetensors");
  int bad = 0;
  ck::describe_checkpoint(dir, &bad);
  EXPECT_EQ(bad, 1);
}

// The trainer's orchestration (training_checkpoint.h) on one process: the synchronous and
// the --async-save path save the buffers (the snapshot carries them on the host), and
// load_training_checkpoint reads them through the host buffers into the live ones.
TEST(CheckpointBuffers, TrainingCheckpointSyncAndAsync) {
  comm::InitOptions io;
  io.backend = comm::Backend::Local;
  auto world = comm::init(io);
  {
    parallel::ParallelState ps(*world, parallel::ParallelSizes{});
    const std::string base = scratch_dir();
    for (bool async : {false, true}) {
      SCOPED_TRACE(async ? "async" : "sync");
      const std::string dir = base + (async ? "/async" : "/sync");
      ParamStore a = make_store(1, 0, true);
      fill(a);
      optim::AdamW opt(a, optim::OptimizerConfig{});
      ck::AsyncSaver saver;
      ck::save_training_checkpoint(dir, world->world(), ps, a, opt, true, sample_state(5),
                                   save_opts(), async ? &saver : nullptr);
      saver.wait();
      EXPECT_TRUE(ck::read_metadata(dir)["tensors"].contains(kAmax));

      ParamStore b = make_store(1, 0, true);
      optim::AdamW opt_b(b, optim::OptimizerConfig{});
      auto st = ck::load_training_checkpoint(dir, std::nullopt, b, opt_b, true, load_opts());
      ASSERT_TRUE(st.has_value());
      EXPECT_EQ(count_mismatches(b, b.flat_params(), kParamSalt), 0);
      EXPECT_EQ(buffer_mismatches(b), 0);
    }
  }
}

}  // namespace buffers_test
