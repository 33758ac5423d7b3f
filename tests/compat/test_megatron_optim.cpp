// Issue 23 A.5, optimizer state: the legacy fixtures of tests/golden/make_megatron_ckpt.py
// carry Megatron's non-distributed optimizer state (GPT: FP32Optimizer, today's group order,
// per-parameter steps; Llama: Float16OptimizerWithFloat16Params, the older group order,
// per-group step, fp32_from_fp16_params). Checked here against what the script wrote
// independently of the importer:
//   * every rank key's [group, position, state index] (<fam>_legacy_optim_index.json) equals
//     what legacy_param_slots derives from the file's param_groups;
//   * the imported TP=1 exp_avg / exp_avg_sq / main params equal the script's truth
//     (<fam>_legacy_optim.safetensors) for every parameter, by name, bit for bit;
//   * the converted checkpoint loads into AdamW with those moments and step, and one step
//     from it equals AdamW computed by hand (double) from the truth;
//   * damaged optimizer entries and the distributed optimizer give errors / notes that name
//     the file and the entry.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "../checkpoint/ckpt_test_util.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/megatron/torch_pickle.h"
#include "checkpoint/megatron/torch_zip.h"
#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"
#include "golden_fixture.h"

namespace mcpp {
namespace megatron_optim_test {

namespace fs = std::filesystem;
namespace mg = checkpoint::megatron;
using K = mg::Value::Kind;
using testing::read_bytes;
using testing::scratch_dir;
using testing::write_bytes;

using compat_fixture::fixture;
std::string rank_file(const std::string& fam, const std::string& rank) {
  return fixture(fam + "_legacy/iter_0000010/" + rank + "/model_optim_rng.pt");
}
nlohmann::json index_of(const std::string& fam) {
  std::ifstream f(fixture(fam + "_legacy_optim_index.json"));
  return nlohmann::json::parse(f);
}

// The file's trainable parameters in its model state dict's order (what read_legacy builds).
std::vector<mg::RankParam> rank_params(const mg::Value& root) {
  std::vector<mg::RankParam> out;
  for (const auto& [k, v] : root.get("model")->entries)
    if (v->is(K::Tensor)) out.push_back({k->s, k->s, v->shape, v->dtype});
  return out;
}
const mg::Value* torch_sd(const mg::Value& root) {
  const mg::Value* o = root.get("optimizer");
  return o->get("optimizer") ? o->get("optimizer") : o;
}

TEST(MegatronOptim, ParamSlotsFollowMegatronsGrouping) {
  for (const char* fam : {"gpt", "llama"}) {
    const auto idx = index_of(fam);
    ASSERT_EQ(idx.at("ranks").size(), 4u) << fam;
    for (const auto& [rank, keys] : idx.at("ranks").items()) {
      mg::MappedFile mf(rank_file(fam, rank));
      mg::TorchFile tf(mf.bytes(), rank);
      const auto params = rank_params(*tf.root());
      const auto slots =
          mg::legacy_param_slots(*torch_sd(*tf.root())->get("param_groups"), params, rank);
      ASSERT_EQ(params.size(), keys.size()) << fam << " " << rank;
      for (size_t i = 0; i < params.size(); ++i) {
        const auto& want = keys.at(params[i].key);
        EXPECT_EQ(slots[i].group, want[0].get<int64_t>()) << fam << rank << params[i].key;
        EXPECT_EQ(slots[i].position, want[1].get<int64_t>()) << fam << rank << params[i].key;
        EXPECT_EQ(slots[i].index, want[2].get<int64_t>()) << fam << rank << params[i].key;
      }
    }
  }
}

// Bitwise equality of two F32 tensors; returns the number of differing elements.
int64_t differing(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return -1;
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  int64_t n = 0;
  for (int64_t i = 0; i < a.numel(); ++i) n += std::memcmp(&x[i], &y[i], sizeof(float)) != 0;
  return n;
}

TEST(MegatronOptim, ImportedStateEqualsTheFixtureForEveryParameter) {
  for (const char* fam : {"gpt", "llama"}) {
    const auto truth = checkpoint::load_safetensors(fixture(std::string(fam) + "_legacy_optim.safetensors"));
    auto im = mg::read(*mg::detect(fixture(std::string(fam) + "_legacy")));
    ASSERT_TRUE(im.optimizer.has_value()) << fam << ": " << im.optimizer_skipped;
    const auto& os = *im.optimizer;
    EXPECT_EQ(os.step, 10) << fam;
    EXPECT_EQ(os.beta2, 0.95) << fam;
    EXPECT_TRUE(os.has_scheduler) << fam;
    EXPECT_EQ(os.num_steps, 80) << fam;
    EXPECT_EQ(os.lr_warmup_steps, 16) << fam;
    EXPECT_EQ(os.lr_decay_style, "cosine") << fam;
    EXPECT_EQ(os.consumed_train_samples, 80) << fam;
    const bool half = std::string(fam) == "llama";
    EXPECT_EQ(os.main_params.empty(), !half) << fam;
    ASSERT_EQ(os.exp_avg.size(), im.tensors.size()) << fam;
    int64_t names = 0;
    for (const auto& [name, w] : im.tensors) {
      ++names;
      for (const char* part : {"exp_avg", "exp_avg_sq", "main"}) {
        auto t = truth.tensors.find(std::string(part) + "/" + name);
        ASSERT_NE(t, truth.tensors.end()) << fam << " " << part << " " << name;
        const Tensor& want = t->second;
        const Tensor& got = std::string(part) == "exp_avg"      ? os.exp_avg.at(name)
                            : std::string(part) == "exp_avg_sq" ? os.exp_avg_sq.at(name)
                            : half                              ? os.main_params.at(name)
                                                                : w;
        EXPECT_EQ(differing(got, want), 0) << fam << " " << part << " " << name;
      }
      // the main params round to the stored bf16 weights, and differ from them
      if (half) EXPECT_GT(differing(os.main_params.at(name), w), 0) << name;
    }
    EXPECT_EQ(names, int64_t(truth.tensors.size() / 3)) << fam;  // the truth has no tied copy
  }
}

// convert -> load into AdamW -> one step, against AdamW by hand from the fixture's truth.
TEST(MegatronOptim, ResumeFromTheConvertedCheckpointStepsFromTheImportedMoments) {
  const std::string out = scratch_dir() + "/gpt";
  auto im = mg::convert_to_checkpoint(fixture("gpt_legacy"), std::nullopt, out);
  const auto truth = checkpoint::load_safetensors(fixture("gpt_legacy_optim.safetensors"));
  model::GPTModel m(im.config);
  const double b1 = 0.9, b2 = 0.95, eps = 1e-8, lr = 1e-3, wd = 0.1;
  optim::AdamW opt(m.params(), {b1, b2, eps});
  auto st = checkpoint::load_checkpoint(out, std::nullopt, m, &opt);
  EXPECT_EQ(st.iteration, 10);
  EXPECT_EQ(st.consumed_train_samples, 80);
  EXPECT_EQ(opt.steps(), 10);
  EXPECT_EQ(st.scheduler.num_steps, 80);
  EXPECT_EQ(st.scheduler.max_lr, 3e-4);
  EXPECT_EQ(st.scheduler.lr_decay_steps, 800);
  auto& ps = m.params();
  float* g = ps.flat_grads().data<float>();
  for (int64_t i = 0; i < ps.flat_grads().numel(); ++i) g[i] = float(1e-3 * std::sin(0.37 * double(i)));
  opt.step(lr, wd);
  const double t = 11, bc1 = 1 - std::pow(b1, t), bc2 = 1 - std::pow(b2, t);
  double worst = 0;
  int64_t checked = 0;
  for (const auto& p : ps.infos()) {
    const float* m0 = truth.at("exp_avg/" + p.name).data<float>();
    const float* v0 = truth.at("exp_avg_sq/" + p.name).data<float>();
    const float* w0 = truth.at("main/" + p.name).data<float>();
    const float* w1 = ps.param(p.name).data<float>();
    const float* m1 = opt.exp_avg().data<float>() + p.offset;
    for (int64_t i = 0; i < p.numel(); ++i, ++checked) {
      const double gi = double(g[p.offset + i]);
      const double mi = b1 * double(m0[i]) + (1 - b1) * gi;
      const double vi = b2 * double(v0[i]) + (1 - b2) * gi * gi;
      const double w = double(w0[i]) * (1 - lr * (p.weight_decay ? wd : 0.0)) -
                       lr / bc1 * mi / (std::sqrt(vi) / std::sqrt(bc2) + eps);
      worst = std::max(worst, std::abs(double(w1[i]) - w) / (1e-3 + std::abs(w)));
      worst = std::max(worst, std::abs(double(m1[i]) - mi) / (1e-6 + std::abs(mi)));
    }
  }
  EXPECT_GT(checked, 5000);
  EXPECT_LT(worst, 1e-5);
  // the moments mattered: a step from zero moments lands elsewhere
  model::GPTModel m2(im.config);
  optim::AdamW fresh(m2.params(), {b1, b2, eps});
  checkpoint::LoadOptions o;
  checkpoint::load_checkpoint(out, std::nullopt, m2.params(), nullptr, o);
  std::memcpy(m2.params().flat_grads().data<float>(), g, size_t(ps.flat_grads().numel()) * 4);
  fresh.step(lr, wd);
  EXPECT_GT(differing(m2.params().flat_params(), ps.flat_params()), ps.flat_params().numel() / 2);
}

// The main params round to the stored bf16 weights; a main param of another parameter (two
// norm weights of one shape swapped) is noticed.
TEST(MegatronOptim, MainParamsThatAreNotTheWeightsRoundingAreNoted) {
  auto im = mg::read(*mg::detect(fixture("llama_legacy")));
  for (const auto& n : im.notes) EXPECT_EQ(n.find("do not round"), std::string::npos) << n;
  auto& mp = im.optimizer->main_params;
  std::swap(mp.at("decoder.layers.0.input_layernorm.weight"),
            mp.at("decoder.layers.1.input_layernorm.weight"));
  im.notes.clear();
  mg::check_optimizer(im, "x");
  ASSERT_EQ(im.notes.size(), 1u);
  EXPECT_NE(im.notes[0].find("2 tensor(s) (first 'decoder.layers.0.input_layernorm.weight')"),
            std::string::npos)
      << im.notes[0];
}

TEST(MegatronOptim, LlamaConvertKeepsTheMainParamsAndLoadsThemExactly) {
  const std::string out = scratch_dir() + "/llama";
  auto im = mg::convert_to_checkpoint(fixture("llama_legacy"), std::nullopt, out);
  const auto truth = checkpoint::load_safetensors(fixture("llama_legacy_optim.safetensors"));
  model::GPTModel m(im.config);
  optim::AdamW opt(m.params(), {0.9, 0.95, 1e-8});
  checkpoint::load_checkpoint(out, std::nullopt, m, &opt);
  EXPECT_EQ(opt.steps(), 10);
  for (const auto& p : m.params().infos()) {
    EXPECT_EQ(differing(m.params().param(p.name), truth.at("main/" + p.name)), 0)
        << p.name;
    EXPECT_EQ(differing(opt.exp_avg_sq().narrow(p.offset, p.numel()).view(p.global_shape),
                        truth.at("exp_avg_sq/" + p.name)),
              0)
        << p.name;
  }
}

// ---- damaged entries: errors naming the file and the entry --------------------------------

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(MegatronOptim, DamagedOptimizerEntriesAreErrors) {
  const std::string path = rank_file("gpt", "mp_rank_01_000");
  mg::MappedFile mf(path);
  auto fresh = [&] { return std::make_unique<mg::TorchFile>(mf.bytes(), path); };
  auto run = [&](mg::TorchFile& tf) {
    mg::OptimizerShards out;
    mg::read_rank_optimizer(*tf.root(), tf, rank_params(*tf.root()), 1, 2, path, false, out);
  };
  {  // intact: reads
    auto tf = fresh();
    EXPECT_EQ(error_of([&] { run(*tf); }), "no error");
  }
  auto state_of = [](mg::TorchFile& tf) { return const_cast<mg::Value*>(tf.root()->get("optimizer")->get("state")); };
  {  // a state entry missing
    auto tf = fresh();
    auto& e = state_of(*tf)->entries;
    e.erase(e.begin() + 3);
    const std::string m = error_of([&] { run(*tf); });
    EXPECT_NE(m.find("optimizer.state[3]"), std::string::npos) << m;
    EXPECT_NE(m.find("is missing"), std::string::npos) << m;
    EXPECT_NE(m.find("mp_rank_01_000"), std::string::npos) << m;
  }
  {  // a moment of another shape
    auto tf = fresh();
    mg::Value* st0 = state_of(*tf)->entries[0].second.get();
    const_cast<mg::Value*>(st0->get("exp_avg"))->shape.back() += 1;
    const std::string m = error_of([&] { run(*tf); });
    EXPECT_NE(m.find("['exp_avg'] has shape"), std::string::npos) << m;
  }
  {  // steps that disagree
    auto tf = fresh();
    mg::Value* st2 = state_of(*tf)->entries[2].second.get();
    auto* step = const_cast<mg::Value*>(st2->get("step"));
    step->kind = K::Int, step->i = 7;
    const std::string m = error_of([&] { run(*tf); });
    EXPECT_NE(m.find("['step'] is 7"), std::string::npos) << m;
  }
  {  // a group that lost a parameter
    auto tf = fresh();
    auto* groups = const_cast<mg::Value*>(tf.get()->root()->get("optimizer")->get("param_groups"));
    auto* ids = const_cast<mg::Value*>(groups->items[0]->get("params"));
    ids->items.pop_back();
    const std::string m = error_of([&] { run(*tf); });
    EXPECT_NE(m.find("param_groups[0] lists"), std::string::npos) << m;
  }
  {  // a group without wd_mult (not Megatron-Core's grouping)
    auto tf = fresh();
    auto* g0 = const_cast<mg::Value*>(tf->root()->get("optimizer")->get("param_groups")->items[0].get());
    for (auto& [k, v] : g0->entries)
      if (k->s == "wd_mult") k->s = "wd_mul";
    const std::string m = error_of([&] { run(*tf); });
    EXPECT_NE(m.find("has no 'wd_mult'"), std::string::npos) << m;
    EXPECT_NE(m.find("--finetune"), std::string::npos) << m;
  }
  {  // a decoupled-LR group
    auto tf = fresh();
    auto* g0 = const_cast<mg::Value*>(tf->root()->get("optimizer")->get("param_groups")->items[1].get());
    const_cast<mg::Value*>(g0->get("is_decoupled_lr"))->b = true;
    const std::string m = error_of([&] { run(*tf); });
    EXPECT_NE(m.find("is_decoupled_lr"), std::string::npos) << m;
  }
  {  // no optimizer dict at all is read_legacy's business; a list (ChainedOptimizer) is refused
    auto tf = fresh();
    auto* root = const_cast<mg::Value*>(tf->root().get());
    for (auto& [k, v] : root->entries)
      if (k->s == "optimizer") v->kind = K::List;
    const std::string m = error_of([&] { run(*tf); });
    EXPECT_NE(m.find("'optimizer' is a"), std::string::npos) << m;
  }
}

TEST(MegatronOptim, MissingMainParamsOfAHalfPrecisionRunAreAnError) {
  const std::string path = rank_file("llama", "mp_rank_00_001");
  mg::MappedFile mf(path);
  mg::TorchFile tf(mf.bytes(), path);
  auto* mains = const_cast<mg::Value*>(tf.root()->get("optimizer")->get("fp32_from_fp16_params"));
  mains->items[1]->items.pop_back();
  mg::OptimizerShards out;
  const std::string m = error_of([&] {
    mg::read_rank_optimizer(*tf.root(), tf, rank_params(*tf.root()), 0, 2, path, false, out);
  });
  EXPECT_NE(m.find("fp32_from_fp16_params[1] holds"), std::string::npos) << m;
}

// Rewrites one byte of a torch.save file's data.pkl (same length) and fixes its CRC: the byte
// `from` of the value after the string `after` (past a memo opcode) becomes `to`; with
// from == 0, every occurrence of `after` in data.pkl becomes the same-length string `to_str`.
std::string patch_pickle(std::string f, const std::string& after, char from, char to,
                         const std::string& to_str = "") {
  mg::ZipArchive z({reinterpret_cast<const uint8_t*>(f.data()), f.size()}, "x");
  std::string pkl;
  for (const auto& [n, _] : z.entries())
    if (n.ends_with("/data.pkl")) pkl = n;
  auto e = z.entry(pkl);
  const size_t at = size_t(e.data() - reinterpret_cast<const uint8_t*>(f.data())), len = e.size();
  auto crc = [&](size_t a, size_t n) {
    uint32_t c = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; ++i) {
      c ^= uint8_t(f[a + i]);
      for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
    }
    return c ^ 0xFFFFFFFFu;
  };
  const uint32_t old_crc = crc(at, len);
  size_t q = f.find(after, at);
  EXPECT_NE(q, std::string::npos);
  if (from == 0) {
    for (; q != std::string::npos && q < at + len; q = f.find(after, q + 1))
      f.replace(q, after.size(), to_str);
  } else if (q != std::string::npos) {
    q += after.size();
    if (f[q] == 'q') q += 2;          // BINPUT n
    else if (f[q] == 'r') q += 5;     // LONG_BINPUT n
    else if (f[q] == '\x94') q += 1;  // MEMOIZE
    EXPECT_EQ(f[q], from);
    f[q] = to;
  }
  const uint32_t new_crc = crc(at, len);
  std::string ob(4, '\0'), nb(4, '\0');
  for (int k = 0; k < 4; ++k) ob[size_t(k)] = char(old_crc >> (8 * k)), nb[size_t(k)] = char(new_crc >> (8 * k));
  for (size_t p = f.find(ob); p != std::string::npos; p = f.find(ob, p + 4)) f.replace(p, 4, nb);
  return f;
}

TEST(MegatronOptim, DistributedOptimizerCheckpointImportsWeightsAndSaysSo) {
  const std::string top = scratch_dir(), dir = top + "/src";  // scratch_dir() empties it
  fs::copy(fixture("gpt_legacy"), dir, fs::copy_options::recursive);
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename() == "model_optim_rng.pt")  // args.use_distributed_optimizer = True
      write_bytes(e.path().string(),
                  patch_pickle(read_bytes(e.path().string()), "use_distributed_optimizer", '\x89', '\x88'));
  auto im = mg::convert_to_checkpoint(dir, std::nullopt, top + "/out");
  EXPECT_FALSE(im.optimizer.has_value());
  EXPECT_TRUE(im.had_optimizer);
  EXPECT_NE(im.optimizer_skipped.find("distrib_optim.pt"), std::string::npos) << im.optimizer_skipped;
  auto st = checkpoint::load_checkpoint(top + "/out", std::nullopt,
                                        *std::make_unique<model::GPTModel>(im.config), nullptr);
  EXPECT_EQ(st.iteration, 0);  // a starting point, as before
  // the torch_dist fixture has no optimizer.* keys: nothing to say
  auto d = mg::read(*mg::detect(fixture("gpt_dist")));
  EXPECT_FALSE(d.had_optimizer);
  EXPECT_TRUE(d.optimizer_skipped.empty());
}

// A layout convert does not map (groups without wd_mult): an error naming the file and the
// group, whose HINT is --no-load-optim; with it the weights convert; inspect still describes.
TEST(MegatronOptim, UnmappedGroupsAreRefusedAndNoLoadOptimConvertsTheWeights) {
  const std::string top = scratch_dir(), dir = top + "/src";
  fs::copy(fixture("llama_legacy"), dir, fs::copy_options::recursive);
  for (const auto& e : fs::recursive_directory_iterator(dir))
    if (e.path().filename() == "model_optim_rng.pt")
      write_bytes(e.path().string(),
                  patch_pickle(read_bytes(e.path().string()), "wd_mult", 0, 0, "wd_mulz"));
  const std::string m = error_of([&] { mg::convert_to_checkpoint(dir, std::nullopt, top + "/a"); });
  EXPECT_NE(m.find("param_groups[0] has no 'wd_mult'"), std::string::npos) << m;
  EXPECT_NE(m.find("model_optim_rng.pt"), std::string::npos) << m;
  EXPECT_NE(m.find("--no-load-optim"), std::string::npos) << m;
  EXPECT_FALSE(fs::exists(top + "/a/latest_checkpointed_iteration.txt"));
  auto im = mg::convert_to_checkpoint(dir, std::nullopt, top + "/b", /*load_optim=*/false);
  EXPECT_FALSE(im.optimizer.has_value());
  model::GPTModel mm(im.config);
  auto st = checkpoint::load_checkpoint(top + "/b", std::nullopt, mm, nullptr);
  EXPECT_EQ(st.iteration, 0);
  std::string all;
  for (const auto& l : mg::describe(*mg::detect(dir))) all += l + "\n";
  EXPECT_NE(all.find("optimizer state convert refuses"), std::string::npos) << all;
  EXPECT_NE(all.find("model      4 layers"), std::string::npos) << all;
}

}  // namespace megatron_optim_test
}  // namespace mcpp
