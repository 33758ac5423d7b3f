// Checkpoint format, resharding across TP layouts, state round trips.
#include <gtest/gtest.h>

#include <filesystem>

#include "checkpoint/async_saver.h"
#include "checkpoint/fs.h"
#include "checkpoint/safetensors.h"
#include "ckpt_test_util.h"

using namespace mcpp;
using namespace mcpp::testing;
namespace fs = std::filesystem;
namespace ck = mcpp::checkpoint;

namespace checkpoint_test {

constexpr uint64_t kCkptParamSalt = 11, kCkptAvgSalt = 12, kCkptSqSalt = 13;

using Rank = CkptRank;

Rank make_rank(const std::string& fam, int64_t tp, int64_t r, bool filled) {
  return make_ckpt_rank(fam, tp, r, filled, {kCkptParamSalt, kCkptAvgSalt, kCkptSqSalt, 7});
}

void expect_filled(const Rank& k) {
  const auto& ps = k.m->params();
  EXPECT_EQ(count_mismatches(ps, k.m->params().flat_params(), kCkptParamSalt), 0);
  EXPECT_EQ(count_mismatches(ps, k.opt->exp_avg(), kCkptAvgSalt), 0);
  EXPECT_EQ(count_mismatches(ps, k.opt->exp_avg_sq(), kCkptSqSalt), 0);
  EXPECT_EQ(k.opt->steps(), 7);
}

// Saves the model of family fam at TP=tp_save (all ranks in this process) and loads it into
// every rank of TP=tp_load.
void reshard(const std::string& fam, int64_t tp_save, int64_t tp_load) {
  const std::string dir = scratch_dir();
  std::vector<Rank> save_ranks;
  std::vector<ck::RankSnapshot> snaps;
  for (int64_t r = 0; r < tp_save; ++r) save_ranks.push_back(make_rank(fam, tp_save, r, true));
  for (auto& k : save_ranks) snaps.push_back(ck::RankSnapshot::view(k.m->params(), k.opt.get()));
  ck::SaveOptions so;
  so.model = tiny_config(fam, tp_save, 0);
  ck::save_checkpoint(dir, snaps, sample_state(10), so);
  for (int64_t r = 0; r < tp_load; ++r) {
    Rank k = make_rank(fam, tp_load, r, false);
    auto st = ck::load_checkpoint(dir, std::nullopt, *k.m, k.opt.get());
    EXPECT_EQ(st.iteration, 10);
    SCOPED_TRACE(fam + " TP " + std::to_string(tp_save) + " -> " + std::to_string(tp_load) +
                 " rank " + std::to_string(r));
    expect_filled(k);
  }
}


// local_pieces (the checkpoint's geometry) agrees with ParamStore::global_index (the init's).
TEST(Checkpoint, PiecesAgreeWithGlobalIndex) {
  for (std::string fam : {"gpt", "llama"})
    for (int64_t tp : {1, 2})
      for (int64_t r = 0; r < tp; ++r) {
        model::GPTModel m(tiny_config(fam, tp, r));
        const auto& ps = m.params();
        for (const auto& p : ps.infos()) {
          const int64_t gcols = p.global_shape.size() > 1 ? p.global_shape[1] : 1;
          int64_t n = 0;
          for (const auto& pc : ck::local_pieces(p, r, tp))
            for (int64_t i = 0; i < pc.rows; ++i)
              for (int64_t j = 0; j < pc.cols; ++j, ++n)
                ASSERT_EQ(ps.global_index(p, pc.l_row + i, pc.l_col + j),
                          (pc.g_row + i) * gcols + pc.g_col + j)
                    << p.name;
          EXPECT_EQ(n, p.numel()) << p.name;
        }
      }
}

TEST(Checkpoint, SerialRoundTripAndLayout) {
  const std::string dir = scratch_dir();
  Rank a = make_rank("llama", 1, 0, true);
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(10));
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(20));
  EXPECT_EQ(read_bytes(dir + "/latest_checkpointed_iteration.txt"), "20");
  EXPECT_TRUE(fs::exists(dir + "/iter_0000020/metadata.json"));
  EXPECT_TRUE(fs::exists(dir + "/iter_0000020/model_tp00_pp00.safetensors"));
  EXPECT_TRUE(fs::exists(dir + "/iter_0000020/optim_tp00_pp00_dp00.safetensors"));
  EXPECT_EQ(ck::list_iterations(dir), (std::vector<int64_t>{10, 20}));
  EXPECT_EQ(ck::latest_iteration(dir), 20);

  auto md = ck::read_metadata(dir);
  EXPECT_EQ(md["format_version"], ck::kFormatVersion);
  const auto& fc1 = md["tensors"]["decoder.layers.0.mlp.linear_fc1.weight"];
  EXPECT_EQ(fc1["split"], "swiglu_rows");
  EXPECT_EQ(fc1["shards"][0]["pieces"].size(), 2u);  // [gate; up]
  EXPECT_TRUE(md["tensors"].contains("optimizer.exp_avg_sq.output_layer.weight"));
  EXPECT_EQ(md["model"]["hidden_size"], 16);

  Rank b = make_rank("llama", 1, 0, false);
  auto st = ck::load_checkpoint(dir, std::nullopt, *b.m, b.opt.get());
  expect_filled(b);
  const auto want = sample_state(20);
  EXPECT_EQ(st.iteration, 20);
  EXPECT_EQ(st.consumed_train_samples, want.consumed_train_samples);
  EXPECT_EQ(st.consumed_valid_samples, want.consumed_valid_samples);
  EXPECT_EQ(st.scheduler.num_steps, want.scheduler.num_steps);
  EXPECT_EQ(st.scheduler.lr_decay_style, optim::LrDecayStyle::Cosine);
  EXPECT_DOUBLE_EQ(st.scheduler.max_lr, want.scheduler.max_lr);
  EXPECT_EQ(st.rng_seed, 1234u);
  EXPECT_EQ(st.rng_iteration, 20);
  EXPECT_EQ(st.data_loader, want.data_loader);
  EXPECT_EQ(st.config, want.config);
  EXPECT_FALSE(st.mcpp_version.empty());
  // --ckpt-step picks an older one.
  EXPECT_EQ(ck::load_checkpoint(dir, 10, *b.m, b.opt.get()).iteration, 10);
}

TEST(Checkpoint, ReshardGptTp1ToTp2) { reshard("gpt", 1, 2); }
TEST(Checkpoint, ReshardGptTp2ToTp1) { reshard("gpt", 2, 1); }
TEST(Checkpoint, ReshardGptTp2ToTp4) { reshard("gpt", 2, 4); }
TEST(Checkpoint, ReshardLlamaTp1ToTp2) { reshard("llama", 1, 2); }
TEST(Checkpoint, ReshardLlamaTp2ToTp1) { reshard("llama", 2, 1); }
// --add-qkv-bias: linear_qkv.bias splits by query group like the weight.
TEST(Checkpoint, ReshardQkvBiasTp2ToTp1) { reshard("qwen2", 2, 1); }
TEST(Checkpoint, ReshardQkvBiasTp1ToTp2) { reshard("qwen2", 1, 2); }

// The metadata records --add-qkv-bias where it adds a tensor (absent otherwise, so older
// checkpoints and GPT-2's, whose every linear has a bias, read as before); a model without
// it refuses the checkpoint, naming the field.
TEST(Checkpoint, QkvBiasInMetadata) {
  auto q = tiny_config("qwen2");
  EXPECT_EQ(ck::model_config_json(q).at("add_qkv_bias"), true);
  auto g = tiny_config("gpt");
  g.add_qkv_bias = true;  // implied by add_bias_linear: not recorded
  EXPECT_FALSE(ck::model_config_json(g).contains("add_qkv_bias"));
  EXPECT_FALSE(ck::model_config_json(tiny_config("llama")).contains("add_qkv_bias"));

  const std::string dir = scratch_dir();
  Rank a = make_rank("qwen2", 1, 0, true);
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(10));
  auto md = ck::read_metadata(dir);
  EXPECT_TRUE(md["tensors"].contains("decoder.layers.1.self_attention.linear_qkv.bias"));
  const auto back = ck::model_config_from_metadata(md);
  EXPECT_TRUE(back.add_qkv_bias && !back.add_bias_linear);
  Rank l = make_rank("llama", 1, 0, false);
  try {
    ck::load_checkpoint(dir, std::nullopt, *l.m, l.opt.get());
    FAIL() << "a model without --add-qkv-bias loaded it";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("add_qkv_bias: checkpoint true vs this run false"),
              std::string::npos)
        << e.what();
  }
}

// --qk-layernorm with --normalization LayerNorm: the q/k norms' weights and biases (replicated
// over TP) reshard; the metadata records the flag and the form (rmsnorm false, as the model's
// other norms: a checkpoint written before the LayerNorm form existed, always rmsnorm true,
// reads as the RMSNorm form), so the config reads back the same, and a model without q/k
// norms or with the RMSNorm form refuses it, naming the field.
TEST(Checkpoint, QkLayerNormReshardAndMetadata) {
  reshard("gpt_qk", 2, 1);
  reshard("gpt_qk", 1, 2);
  const auto j = ck::model_config_json(tiny_config("gpt_qk"));
  EXPECT_EQ(j.at("qk_layernorm"), true);
  EXPECT_EQ(j.at("rmsnorm"), false);

  const std::string base = scratch_dir(), dir = base + "/ln", qdir = base + "/rms";
  Rank a = make_rank("gpt_qk", 1, 0, true);
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(10));
  const auto md = ck::read_metadata(dir);
  for (const char* n :
       {"q_layernorm.weight", "q_layernorm.bias", "k_layernorm.weight", "k_layernorm.bias"})
    EXPECT_TRUE(md["tensors"].contains(std::string("decoder.layers.1.self_attention.") + n)) << n;
  const auto back = ck::model_config_from_metadata(md);
  EXPECT_TRUE(back.qk_layernorm && !back.rmsnorm);
  Rank q = make_rank("qwen3", 1, 0, true);  // the RMSNorm form: no biases
  ck::save_checkpoint(qdir, *q.m, q.opt.get(), sample_state(10));
  const auto qmd = ck::read_metadata(qdir);
  EXPECT_TRUE(ck::model_config_from_metadata(qmd).qk_layernorm &&
              ck::model_config_from_metadata(qmd).rmsnorm);
  EXPECT_FALSE(qmd["tensors"].contains("decoder.layers.1.self_attention.q_layernorm.bias"));
  Rank g = make_rank("gpt", 1, 0, false);  // no q/k norms
  EXPECT_NE(error_of([&] {
              ck::load_checkpoint(dir, std::nullopt, *g.m, g.opt.get());
            }).find("qk_layernorm: checkpoint true vs this run false"),
            std::string::npos);
  auto rms = tiny_config("gpt_qk");
  rms.rmsnorm = true;  // the RMSNorm form (no biases)
  model::GPTModel r(rms);
  EXPECT_NE(error_of([&] {
              ck::load_checkpoint(dir, std::nullopt, r, nullptr);
            }).find("rmsnorm: checkpoint false vs this run true"),
            std::string::npos);
}

TEST(Checkpoint, Tp2WritesDuplicatedTensorsOnce) {
  const std::string dir = scratch_dir();
  std::vector<Rank> ks;
  std::vector<ck::RankSnapshot> snaps;
  for (int r = 0; r < 2; ++r) ks.push_back(make_rank("gpt", 2, r, true));
  for (auto& k : ks) snaps.push_back(ck::RankSnapshot::view(k.m->params(), nullptr));
  ck::save_checkpoint(dir, snaps, sample_state(3));
  auto md = ck::read_metadata(dir);
  EXPECT_EQ(md["tensors"]["decoder.final_layernorm.weight"]["shards"].size(), 1u);
  EXPECT_EQ(md["tensors"]["embedding.word_embeddings.weight"]["shards"].size(), 2u);
  EXPECT_EQ(
      md["tensors"]["decoder.layers.1.mlp.linear_fc2.weight"]["shards"][1]["pieces"][0]["offsets"],
      (nlohmann::json{0, 16}));  // row-parallel: columns 16..31 on rank 1
  EXPECT_TRUE(fs::exists(dir + "/iter_0000003/model_tp01_pp00.safetensors"));
  EXPECT_FALSE(md["has_optimizer"]);
}

TEST(Checkpoint, LoadsIntoOtherDtype) {
  const std::string dir = scratch_dir();
  Rank a = make_rank("gpt", 1, 0, true);
  ck::save_checkpoint(dir, *a.m, nullptr, sample_state(1));
  model::GPTModel m64(tiny_config("gpt", 1, 0, DType::F64));
  ck::load_checkpoint(dir, std::nullopt, m64, nullptr);
  const auto& p32 = a.m->params();
  const auto& p64 = m64.params();
  for (int64_t i = 0; i < p32.total_numel(); ++i)
    ASSERT_EQ(double(const_cast<model::ParamStore&>(p32).flat_params().data<float>()[i]),
              const_cast<model::ParamStore&>(p64).flat_params().data<double>()[i]);
}

TEST(Checkpoint, NoSaveOptimAndFlags) {
  const std::string dir = scratch_dir();
  Rank a = make_rank("gpt", 1, 0, true);
  ck::save_checkpoint(dir, *a.m, nullptr, sample_state(5));  // --no-save-optim
  Rank b = make_rank("gpt", 1, 0, false);
  try {
    ck::load_checkpoint(dir, std::nullopt, *b.m, b.opt.get());
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--no-load-optim"), std::string::npos) << e.what();
  }
  auto st = ck::load_checkpoint(dir, std::nullopt, *b.m, nullptr);  // --no-load-optim
  EXPECT_EQ(count_mismatches(b.m->params(), b.m->params().flat_params(), kCkptParamSalt), 0);
  EXPECT_EQ(st.iteration, 5);

  ck::LoadOptions lo;
  lo.load_rng = false;  // --no-load-rng
  st = ck::load_checkpoint(dir, std::nullopt, *b.m, nullptr, lo);
  EXPECT_EQ(st.rng_seed, 0u);
  lo.finetune = true;  // --finetune: weights only, counters restart
  st = ck::load_checkpoint(dir, std::nullopt, *b.m, nullptr, lo);
  EXPECT_EQ(st.iteration, 0);
  EXPECT_EQ(st.consumed_train_samples, 0);
  EXPECT_EQ(st.scheduler.num_steps, 0);
}

// SGD's and Lion's one state buffer is saved as exp_avg, the optimizer recorded; a load
// into another optimizer's state is refused naming both and the way out.
TEST(Checkpoint, OptimizerRuleRecordedAndChecked) {
  using optim::UpdateRule;
  const RankSalts salts{kCkptParamSalt, kCkptAvgSalt, kCkptSqSalt, 7};
  for (UpdateRule saved : {UpdateRule::Sgd, UpdateRule::Lion, UpdateRule::Adam}) {
    const std::string name = optim::rule_name(saved);
    SCOPED_TRACE(name);
    const std::string dir = scratch_dir() + "/" + name;
    Rank a = make_ckpt_rank("llama", 1, 0, true, salts, saved);
    ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(6));
    const auto md = ck::read_metadata(dir, std::nullopt);
    EXPECT_EQ(md.value("optimizer", ""), name);
    int64_t avg = 0, sq = 0;
    for (auto& [key, v] : md.at("tensors").items())
      avg += key.starts_with("optimizer.exp_avg."), sq += key.starts_with("optimizer.exp_avg_sq.");
    EXPECT_EQ(avg, int64_t(a.m->params().infos().size()));
    EXPECT_EQ(sq, saved == UpdateRule::Adam ? avg : 0);

    Rank same = make_ckpt_rank("llama", 1, 0, false, salts, saved);
    ck::load_checkpoint(dir, std::nullopt, *same.m, same.opt.get());
    EXPECT_EQ(count_mismatches(same.m->params(), same.opt->exp_avg(), kCkptAvgSalt), 0);
    EXPECT_EQ(same.opt->steps(), 7);  // the saving optimizer's count
    for (UpdateRule other : {UpdateRule::Adam, UpdateRule::Sgd, UpdateRule::Lion}) {
      if (other == saved) continue;
      Rank b = make_ckpt_rank("llama", 1, 0, false, salts, other);
      const std::string err =
          error_of([&] { ck::load_checkpoint(dir, std::nullopt, *b.m, b.opt.get()); });
      EXPECT_NE(err.find("holds the state of the " + name + " optimizer"), std::string::npos)
          << err;
      EXPECT_NE(err.find(std::string("--optimizer ") + optim::rule_name(other)),
                std::string::npos)
          << err;
      EXPECT_NE(err.find("--no-load-optim"), std::string::npos) << err;
      // The weights alone load into any optimizer (--no-load-optim).
      ck::load_checkpoint(dir, std::nullopt, *b.m, nullptr);
      EXPECT_EQ(count_mismatches(b.m->params(), b.m->params().flat_params(), kCkptParamSalt), 0);
    }
  }
}

TEST(Checkpoint, ResaveSameIteration) {
  const std::string dir = scratch_dir();
  Rank a = make_rank("gpt", 1, 0, true);
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(4));
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(4));
  EXPECT_EQ(ck::list_iterations(dir), (std::vector<int64_t>{4}));
  size_t entries = 0;
  for (auto& e : fs::directory_iterator(dir)) (void)e, ++entries;
  EXPECT_EQ(entries, 2u);  // iter_0000004 and the tracker, nothing left aside
}

TEST(Checkpoint, StateJsonRoundTrip) {
  auto st = sample_state(42);
  st.num_floating_point_operations_so_far = 1.5e15;
  auto back = ck::state_from_json(ck::state_to_json(st));
  EXPECT_EQ(ck::state_to_json(back), ck::state_to_json(st));
}

TEST(Checkpoint, DescribeVerifiesChecksums) {
  const std::string dir = scratch_dir();
  Rank a = make_rank("llama", 1, 0, true);
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(10));
  std::string d = ck::describe_checkpoint(dir);
  EXPECT_NE(d.find("iteration 10"), std::string::npos) << d;
  EXPECT_NE(d.find("decoder.layers.1.self_attention.linear_qkv.weight"), std::string::npos);
  EXPECT_NE(d.find("all checksums verified"), std::string::npos) << d;
  // Flip one byte near the end of the model file (tensor data).
  const std::string f = dir + "/iter_0000010/model_tp00_pp00.safetensors";
  std::string bytes = read_bytes(f);
  bytes[bytes.size() - 5] ^= 0x40;
  write_bytes(f, bytes);
  d = ck::describe_checkpoint(dir + "/iter_0000010");
  EXPECT_NE(d.find("BAD"), std::string::npos) << d;
  EXPECT_NE(d.find("1 shard(s) failed"), std::string::npos) << d;
}

// ---- --save-retain-interval (SaveOptions::retain_interval) --------------------------------

ck::SaveOptions retaining(int64_t every) {
  ck::SaveOptions so;
  so.retain_interval = every;
  return so;
}

// Megatron's rule: after each save the tracker's previous iteration goes unless it is a
// multiple of N. Saving 1..7 with N = 3 keeps 3, 6 and the latest, 7.
TEST(CheckpointRetain, KeepsMultiplesAndTheLatest) {
  const std::string dir = scratch_dir();
  Rank a = make_rank("gpt", 1, 0, true);
  for (int64_t it = 1; it <= 7; ++it)
    ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(it), retaining(3));
  EXPECT_EQ(ck::list_iterations(dir), (std::vector<int64_t>{3, 6, 7}));
  EXPECT_EQ(ck::latest_iteration(dir), 7);
  for (auto& e : fs::directory_iterator(dir))  // nothing left aside (*.del-<pid>)
    EXPECT_EQ(e.path().filename().string().find(".del-"), std::string::npos) << e.path();
  // Without the option nothing is deleted.
  const std::string keep = dir + "/all";
  for (int64_t it = 1; it <= 3; ++it)
    ck::save_checkpoint(keep, *a.m, a.opt.get(), sample_state(it));
  EXPECT_EQ(ck::list_iterations(keep), (std::vector<int64_t>{1, 2, 3}));
}

// Kept whatever the interval: iteration 0, a re-save of the same iteration, a symbolic link;
// a tracker that is not an iteration number deletes nothing.
TEST(CheckpointRetain, NeverDeletesZeroSameIterationOrSymlink) {
  const std::string dir = scratch_dir();
  Rank a = make_rank("gpt", 1, 0, true);
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(0), retaining(5));
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(4), retaining(5));
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(4), retaining(5));
  EXPECT_EQ(ck::list_iterations(dir), (std::vector<int64_t>{0, 4}));
  // iteration 4 as a link to a folder elsewhere: the link and its target stay.
  fs::rename(dir + "/iter_0000004", dir + "/real4");
  fs::create_directory_symlink("real4", dir + "/iter_0000004");
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(7), retaining(5));
  EXPECT_TRUE(fs::is_symlink(dir + "/iter_0000004"));
  EXPECT_TRUE(fs::exists(dir + "/real4/metadata.json"));
  EXPECT_EQ(ck::list_iterations(dir), (std::vector<int64_t>{0, 4, 7}));
  write_bytes(dir + "/" + ck::kTrackerFile, "release");
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(8), retaining(5));
  EXPECT_EQ(ck::list_iterations(dir), (std::vector<int64_t>{0, 4, 7, 8}));
}

// The previous checkpoint goes only once the new one and the tracker are durable: a save
// that fails to update the tracker leaves it in place.
TEST(CheckpointRetain, DeletesOnlyAfterTheTrackerIsWritten) {
  const std::string dir = scratch_dir();
  Rank a = make_rank("gpt", 1, 0, true);
  ck::SaveOptions so = retaining(10);
  so.cleanup_stale = false;  // keep the obstacle below
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(1), so);
  // The tracker's temporary file is a non-empty folder: writing the tracker fails.
  const std::string obstacle = dir + "/" + ck::kTrackerFile + ".tmp-" + std::to_string(::getpid());
  fs::create_directories(obstacle + "/x");
  EXPECT_THROW(ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(2), so), Error);
  EXPECT_TRUE(fs::exists(dir + "/iter_0000001/metadata.json"));
  EXPECT_EQ(ck::read_text_file(dir + "/" + ck::kTrackerFile), "1");
  fs::remove_all(obstacle);
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(3), so);
  EXPECT_EQ(ck::list_iterations(dir), (std::vector<int64_t>{2, 3}));  // 1 went, 2 stays
}

// The background writer (--async-save) deletes after its commit, and a folder left by a
// deletion that was killed (*.del-<pid>) is removed by the next save.
TEST(CheckpointRetain, AsyncSaveAndLeftovers) {
  const std::string dir = scratch_dir();
  model::GPTModel m(tiny_config("llama"));
  optim::AdamW opt(m.params(), {});
  ck::AsyncSaver saver;
  for (int64_t it = 2; it <= 8; it += 2)
    saver.save(dir, m.params(), &opt, sample_state(it), retaining(4));
  saver.wait();
  EXPECT_EQ(ck::list_iterations(dir), (std::vector<int64_t>{4, 8}));
  fs::create_directories(dir + "/iter_0000006.del-12345/x");
  ck::save_checkpoint(dir, m.params(), &opt, sample_state(10), retaining(4));
  EXPECT_FALSE(fs::exists(dir + "/iter_0000006.del-12345"));
  EXPECT_EQ(ck::list_iterations(dir), (std::vector<int64_t>{4, 8, 10}));
}

// A non-persistent save (SaveOptions::keep_only_latest): once its tracker is written, every
// older iter_* folder of the folder goes, complete or not, whatever the tracker named before;
// a symbolic link and a newer folder stay.
TEST(CheckpointRetain, KeepOnlyLatestDeletesEveryOlderFolder) {
  const std::string dir = scratch_dir();
  Rank a = make_rank("gpt", 1, 0, true);
  ck::SaveOptions latest;
  latest.keep_only_latest = true;
  for (int64_t it : {3, 6}) ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(it), latest);
  EXPECT_EQ(ck::list_iterations(dir), (std::vector<int64_t>{6}));
  fs::create_directories(dir + "/iter_0000007/x");  // incomplete (no metadata.json), older
  fs::create_directories(dir + "/iter_0000012/x");  // newer than the save below: kept
  fs::create_directories(dir + "/real2");
  fs::create_directory_symlink("real2", dir + "/iter_0000002");
  ck::save_checkpoint(dir, *a.m, a.opt.get(), sample_state(9), latest);
  EXPECT_EQ(ck::list_iterations(dir), (std::vector<int64_t>{9}));
  EXPECT_FALSE(fs::exists(dir + "/iter_0000006"));
  EXPECT_FALSE(fs::exists(dir + "/iter_0000007"));
  EXPECT_TRUE(fs::exists(dir + "/iter_0000012/x"));
  EXPECT_TRUE(fs::is_symlink(dir + "/iter_0000002"));
  EXPECT_EQ(ck::latest_iteration(dir), 9);
  for (auto& e : fs::directory_iterator(dir))  // nothing left aside
    EXPECT_EQ(e.path().filename().string().find(".del-"), std::string::npos) << e.path();
}

}  // namespace checkpoint_test
