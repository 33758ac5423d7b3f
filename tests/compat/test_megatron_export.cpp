// `megatron convert --to-megatron` (checkpoint/megatron/megatron_export.h, torch_write.h):
//   * torch_write's files read back through the restricted reader (values, dtypes, ZIP64,
//     CRC), so the writer and reader agree on every record;
//   * round trip: our checkpoint -> Megatron's legacy layout (TP1/PP1, TP2/PP2; GPT fp32 and
//     Llama bf16 with GQA + SwiGLU) -> `--from-megatron` back: weights, Adam moments, main
//     params bit for bit, the step, iteration, scheduler and consumed samples the same;
//   * against PyTorch's own files: the TP2 x PP2 fixtures of make_megatron_ckpt.py, imported
//     and exported again, hold the same tensors under the same keys, dtypes and shapes,
//     and the same optimizer state per parameter, as the fixture files;
//   * bad input: unwritable or foreign --save, a TP that does not divide the query groups, a
//     PP that does not divide the layers, MoE: errors naming the flag or file.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <tuple>

#include <filesystem>
#include <fstream>

#include "../checkpoint/ckpt_test_util.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/megatron/megatron_export.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/megatron/torch_pickle.h"
#include "checkpoint/megatron/torch_write.h"
#include "model/gpt_model.h"
#include "golden_fixture.h"

namespace mcpp {
namespace megatron_export_test {

namespace fs = std::filesystem;
namespace mg = checkpoint::megatron;
using K = mg::Value::Kind;
using testing::error_of;
using testing::scratch_dir;

using compat_fixture::fixture;

TEST(TorchWrite, ValuesReadBackThroughTheReader) {
  for (bool z64 : {false, true}) {
    const std::string dir = scratch_dir();
    Tensor f = Tensor::from(std::vector<float>{1.5f, -2.25f, 3.0f, 1e-3f, 7.f, 0.1f}, {2, 3});
    Tensor l = Tensor::from(std::vector<int64_t>{5, -(int64_t(1) << 40)}, {2});
    mg::Py root = mg::Py::dict();
    root.set("none", mg::Py::none());
    root.set("t", mg::Py::boolean(true));
    root.set("big", mg::Py::integer(int64_t(1) << 40));
    root.set("neg", mg::Py::integer(-7));
    root.set("pi", mg::Py::real(3.141592653589793));
    root.set("s", mg::Py::str("héllo"));
    root.set("tup", mg::Py::tuple({mg::Py::real(0.9), mg::Py::real(0.95)}));
    root.set("dt", mg::Py::global("torch.bfloat16"));
    mg::Py ns = mg::Py::namespace_();
    ns.set("num_layers", mg::Py::integer(4));
    root.set("args", std::move(ns));
    mg::Py od = mg::Py::ordered_dict();
    od.set("f32", mg::Py::tensor_of(f, DType::F32));
    od.set("bf16", mg::Py::tensor_of(f, DType::BF16));
    od.set("f16", mg::Py::tensor_of(f, DType::F16));
    od.set("i64", mg::Py::tensor_of(l, DType::I64));
    od.set("scalar", mg::Py::tensor_of(Tensor::from(std::vector<float>{10.f}, {}), DType::F32));
    root.set("model", std::move(od));
    mg::Py lst = mg::Py::list({mg::Py::integer(1), mg::Py::list({})});
    root.set(3, std::move(lst));
    const std::string path = dir + "/x.pt";
    mg::save_torch_file(path, root, z64);
    mg::MappedFile mf(path);
    mg::TorchFile tf(mf.bytes(), path);
    const mg::Value& r = *tf.root();
    ASSERT_TRUE(r.is(K::Dict));
    EXPECT_TRUE(r.get("none")->is(K::None));
    EXPECT_TRUE(r.get("t")->b);
    EXPECT_EQ(r.get("big")->i, int64_t(1) << 40);
    EXPECT_EQ(r.get("neg")->i, -7);
    EXPECT_EQ(r.get("pi")->f, 3.141592653589793);
    EXPECT_EQ(r.get("s")->s, "héllo");
    EXPECT_EQ(r.get("tup")->items.size(), 2u);
    EXPECT_EQ(r.get("dt")->s, "torch.bfloat16");
    EXPECT_EQ(r.get("args")->s, "argparse.Namespace");
    EXPECT_EQ(r.get("args")->get("num_layers")->i, 4);
    const mg::Value& m = *r.get("model");
    const Tensor back = tf.tensor(*m.get("f32"), DType::F32, "f32");
    EXPECT_TRUE(testing::same_bytes(back, f));
    EXPECT_EQ(m.get("bf16")->dtype, DType::BF16);
    EXPECT_EQ(m.get("f16")->dtype, DType::F16);
    EXPECT_EQ(m.get("bf16")->shape, (std::vector<int64_t>{2, 3}));
    EXPECT_EQ(tf.tensor(*m.get("bf16"), DType::F32, "b").data<float>()[1], -2.25f);
    EXPECT_EQ(tf.tensor(*m.get("f16"), DType::F32, "h").data<float>()[0], 1.5f);
    EXPECT_EQ(tf.tensor(*m.get("i64"), DType::F64, "l").data<double>()[1],
              -double(int64_t(1) << 40));
    EXPECT_TRUE(m.get("scalar")->shape.empty());
    EXPECT_EQ(tf.tensor(*m.get("scalar"), DType::F32, "s").data<float>()[0], 10.f);
    // storages are 64-byte aligned, as PyTorch writes them
    mg::ZipArchive zip(mf.bytes(), path);
    for (const auto& [name, bytes] : zip.entries())
      if (name.find("/data/") != std::string::npos)
        EXPECT_EQ((bytes.data() - mf.bytes().data()) % 64, 0) << name;
    // a flipped storage byte fails its CRC
    std::string raw = testing::read_bytes(path);
    const size_t at = size_t(zip.entry("x/data/0").data() - mf.bytes().data());
    raw[at] ^= 1;
    testing::write_bytes(dir + "/bad.pt", raw);
    mg::MappedFile bad(dir + "/bad.pt");
    EXPECT_NE(error_of([&] { mg::ZipArchive(bad.bytes(), "bad"); }).find("CRC-32"),
              std::string::npos);
    EXPECT_FALSE(fs::exists(path + ".tmp-" + std::to_string(::getpid())));
  }
}

// Our checkpoint of `fam` (filled, 5 Adam steps), iteration 12.
std::string make_ours(const std::string& dir, const std::string& fam, bool bf16) {
  auto k = testing::make_ckpt_rank(fam, 1, 0, true, {11, 12, 13, 5});
  checkpoint::TrainingState st = testing::sample_state(12);
  st.optimizer_steps = 5;
  st.config["tokenizer_type"] = "NullTokenizer";
  if (bf16) st.config["bf16"] = "True";
  if (fam.ends_with("_wd")) st.config["apply_wd_to_qk_layernorm"] = "True";
  st.num_floating_point_operations_so_far = 2.5e9;
  const std::string ours = dir + "/ours_" + fam;
  checkpoint::save_checkpoint(ours, *k.m, k.opt.get(), st);
  if (bf16) {  // as a bf16 GPU run records its model (its weights are stored f32 all the same)
    const std::string md = ours + "/iter_0000012/metadata.json";
    nlohmann::json j = nlohmann::json::parse(testing::read_bytes(md));
    j["model"]["dtype"] = "bf16";
    std::ofstream(md) << j.dump();
  }
  return ours;
}

TEST(MegatronExport, RoundTripIsBitExact) {
  const std::string dir = scratch_dir();
  struct Case {
    std::string fam;
    bool bf16;
    int64_t tp, pp;
    mg::TransformerImpl impl;
  };
  for (const Case& c : {Case{"gpt", false, 1, 1, mg::TransformerImpl::Local},
                        Case{"gpt", false, 2, 2, mg::TransformerImpl::TransformerEngine},
                        Case{"llama", true, 1, 1, mg::TransformerImpl::TransformerEngine},
                        Case{"llama", true, 2, 2, mg::TransformerImpl::Local},
                        Case{"llama_interleaved", true, 2, 1, mg::TransformerImpl::Local},
                        Case{"qwen3", false, 2, 2, mg::TransformerImpl::TransformerEngine},
                        Case{"qwen3_wd", true, 2, 1, mg::TransformerImpl::Local},
                        Case{"gpt_qk", false, 2, 2, mg::TransformerImpl::TransformerEngine},
                        Case{"gpt_qk_wd", true, 2, 1, mg::TransformerImpl::Local}}) {
    const std::string tag = fmt::format("{} tp{} pp{}", c.fam, c.tp, c.pp);
    const std::string ours = make_ours(dir, c.fam, c.bf16);
    const std::string meg = fmt::format("{}/meg_{}_{}_{}", dir, c.fam, c.tp, c.pp);
    mg::ExportOptions o;
    o.tp = c.tp, o.pp = c.pp, o.impl = c.impl;
    EXPECT_EQ(mg::export_to_megatron(ours, {}, meg, o), 12) << tag;
    const std::string rank0 = meg + "/iter_0000012/" + mg::legacy_rank_dir(0, 0, c.pp);
    EXPECT_TRUE(fs::exists(rank0 + "/model_optim_rng.pt")) << tag;
    EXPECT_EQ(testing::read_bytes(meg + "/latest_checkpointed_iteration.txt"), "12");
    // back through the importer, then into a fresh model and AdamW
    const std::string back = meg + "_back";
    mg::Imported im = mg::convert_to_checkpoint(meg, {}, back);
    EXPECT_EQ(im.source_tp, c.tp);
    EXPECT_EQ(im.source_pp, c.pp);
    ASSERT_TRUE(im.optimizer.has_value()) << tag;
    EXPECT_EQ(im.optimizer->main_params.empty(), !c.bf16) << tag;
    auto want = testing::make_ckpt_rank(c.fam, 1, 0, true, {11, 12, 13, 5});
    auto got = testing::make_ckpt_rank(c.fam, 1, 0, false, {});
    const checkpoint::TrainingState st =
        checkpoint::load_checkpoint(back, {}, *got.m, got.opt.get());
    EXPECT_TRUE(testing::same_bytes(got.m->params().flat_params(), want.m->params().flat_params()))
        << tag;
    EXPECT_TRUE(testing::same_bytes(got.opt->exp_avg(), want.opt->exp_avg())) << tag;
    EXPECT_TRUE(testing::same_bytes(got.opt->exp_avg_sq(), want.opt->exp_avg_sq())) << tag;
    EXPECT_EQ(got.opt->steps(), 5) << tag;
    const checkpoint::TrainingState ref = testing::sample_state(12);
    EXPECT_EQ(st.iteration, 12);
    EXPECT_EQ(st.consumed_train_samples, ref.consumed_train_samples) << tag;
    EXPECT_EQ(st.consumed_valid_samples, ref.consumed_valid_samples) << tag;
    EXPECT_EQ(st.num_floating_point_operations_so_far, 2.5e9) << tag;
    EXPECT_EQ(st.scheduler.max_lr, ref.scheduler.max_lr);
    EXPECT_EQ(st.scheduler.min_lr, ref.scheduler.min_lr);
    EXPECT_EQ(st.scheduler.lr_warmup_steps, ref.scheduler.lr_warmup_steps);
    EXPECT_EQ(st.scheduler.lr_decay_steps, ref.scheduler.lr_decay_steps);
    EXPECT_EQ(st.scheduler.lr_decay_style, ref.scheduler.lr_decay_style);
    EXPECT_EQ(st.scheduler.num_steps, ref.scheduler.num_steps) << tag;
    EXPECT_EQ(st.config.value("bf16", ""), c.bf16 ? "True" : "False") << tag;
    // --rotary-interleaved goes out in args.rotary_interleaved and comes back; so do
    // --qk-layernorm and --apply-wd-to-qk-layernorm (args.qk_layernorm,
    // args.apply_wd_to_qk_layernorm, the norms' weights, and biases with LayerNorm, after
    // linear_qkv).
    const auto back_cfg = checkpoint::model_config_from_metadata(checkpoint::read_metadata(back));
    const bool qk = c.fam.starts_with("qwen3") || c.fam.starts_with("gpt_qk");
    EXPECT_EQ(back_cfg.rotary_interleaved, c.fam == "llama_interleaved") << tag;
    EXPECT_EQ(back_cfg.qk_layernorm, qk) << tag;
    EXPECT_EQ(back_cfg.rmsnorm, !c.fam.starts_with("gpt")) << tag;
    EXPECT_EQ(im.config.qk_layernorm_weight_decay, c.fam.ends_with("_wd")) << tag;
    if (c.fam.starts_with("gpt_qk")) {  // the biases in the rank files, after the weights
      const std::string f = rank0 + "/model_optim_rng.pt";
      mg::MappedFile mf(f);
      mg::TorchFile tf(mf.bytes(), f);
      std::vector<std::string> keys;
      for (const auto& [k, v] : tf.root()->get("model")->entries)
        if (k->s.starts_with("decoder.layers.0.self_attention.")) keys.push_back(k->s);
      const std::string a = "decoder.layers.0.self_attention.";
      const auto at = std::find(keys.begin(), keys.end(), a + "q_layernorm.weight");
      ASSERT_LE(at + 4, keys.end()) << tag;
      EXPECT_EQ(at[1], a + "q_layernorm.bias") << tag;
      EXPECT_EQ(at[2], a + "k_layernorm.weight") << tag;
      EXPECT_EQ(at[3], a + "k_layernorm.bias") << tag;
      EXPECT_EQ(at[-1].find(a + "linear_qkv."), 0u) << tag << " " << at[-1];
    }
  }
}

// A tensor entry's values as doubles (exact for every stored dtype here).
std::vector<double> values(const mg::TorchFile& tf, const mg::Value& t, const std::string& w) {
  const Tensor x = tf.tensor(t, DType::F64, w);
  return {x.data<double>(), x.data<double>() + x.numel()};
}

// rank key -> (exp_avg, exp_avg_sq, main param or null) of a legacy rank file.
struct OptEntry {
  const mg::Value *m, *v, *main;
};
std::map<std::string, OptEntry> optimizer_by_key(const mg::Value& root) {
  std::vector<mg::RankParam> params;
  for (const auto& [k, v] : root.get("model")->entries)
    if (v->is(K::Tensor)) params.push_back({k->s, k->s, v->shape, v->dtype});
  const mg::Value* o = root.get("optimizer");
  const mg::Value* tsd = o->get("optimizer") ? o->get("optimizer") : o;
  const mg::Value* mains = o->get("fp32_from_fp16_params");
  const auto slots = mg::legacy_param_slots(*tsd->get("param_groups"), params, "file");
  std::map<std::string, OptEntry> out;
  for (size_t i = 0; i < params.size(); ++i) {
    const mg::Value* st = nullptr;
    for (const auto& [k, v] : tsd->get("state")->entries)
      if (k->is(K::Int) && k->i == slots[i].index) st = v.get();
    EXPECT_NE(st, nullptr) << params[i].key;
    if (!st) continue;
    const mg::Value* main =
        mains ? mains->items[size_t(slots[i].group)]->items[size_t(slots[i].position)].get()
              : nullptr;
    out[params[i].key] = {st->get("exp_avg"), st->get("exp_avg_sq"), main};
  }
  return out;
}

// A training run's layout beyond TP x PP goes into the args as it was (a conversion writes
// DP 1, CP 1, no SP): data_parallel_size, context_parallel_size, sequence_parallel and
// world_size = TP x PP x CP x DP. Neither DP nor CP changes the files.
TEST(MegatronExport, ArgsRecordTheRunsLayout) {
  const std::string dir = scratch_dir();
  const std::string ours = make_ours(dir, "llama", false);
  for (const auto& [cp, dp, sp] : {std::tuple{int64_t(1), int64_t(1), false},
                                   std::tuple{int64_t(2), int64_t(3), true}}) {
    const std::string meg = fmt::format("{}/meg_cp{}_dp{}", dir, cp, dp);
    mg::ExportOptions o;
    o.tp = 2, o.pp = 1, o.cp = cp, o.dp = dp, o.sequence_parallel = sp;
    mg::export_to_megatron(ours, {}, meg, o);
    const std::string f = meg + "/iter_0000012/mp_rank_01/model_optim_rng.pt";
    mg::MappedFile mf(f);
    mg::TorchFile tf(mf.bytes(), f);
    const mg::Value& args = *tf.root()->get("args");
    EXPECT_EQ(args.get("context_parallel_size")->i, cp);
    EXPECT_EQ(args.get("data_parallel_size")->i, dp);
    EXPECT_EQ(args.get("world_size")->i, 2 * cp * dp);
    EXPECT_EQ(args.get("sequence_parallel")->b, sp);
    EXPECT_EQ(args.get("tensor_model_parallel_size")->i, 2);
  }
}

// Virtual pipeline stages: each rank file holds model0 and model1 (no "model"), chunk v of
// stage pp with layers v * L / V + pp * L / (P * V) onwards, the embedding in stage 0's
// model0 and the final layernorm in the last stage's last chunk; back through the importer
// bit for bit, Adam moments included (the optimizer lists the chunks one after the other).
TEST(MegatronExport, VirtualStagesWriteOneModelPerChunk) {
  const std::string dir = scratch_dir();
  auto k = testing::make_ckpt_rank("llama4", 1, 0, true, {11, 12, 13, 5});
  checkpoint::TrainingState st = testing::sample_state(12);
  st.optimizer_steps = 5;
  const std::string ours = dir + "/ours4";
  checkpoint::save_checkpoint(ours, *k.m, k.opt.get(), st);
  mg::ExportOptions o;
  o.tp = 1, o.pp = 2, o.vp = 2, o.impl = mg::TransformerImpl::Local;
  const std::string meg = dir + "/meg_vp";
  mg::export_to_megatron(ours, {}, meg, o);
  for (int64_t pp = 0; pp < 2; ++pp) {
    const std::string f = meg + "/iter_0000012/" + mg::legacy_rank_dir(0, pp, 2) +
                          "/model_optim_rng.pt";
    mg::MappedFile mf(f);
    mg::TorchFile tf(mf.bytes(), f);
    const mg::Value& root = *tf.root();
    EXPECT_EQ(root.get("model"), nullptr) << f;
    ASSERT_NE(root.get("model0"), nullptr) << f;
    ASSERT_NE(root.get("model1"), nullptr) << f;
    EXPECT_EQ(root.get("model2"), nullptr) << f;
    EXPECT_EQ(root.get("args")->get("virtual_pipeline_model_parallel_size")->i, 2);
    EXPECT_EQ(root.get("model0")->get("embedding.word_embeddings.weight") != nullptr, pp == 0);
    EXPECT_EQ(root.get("model1")->get("decoder.final_layernorm.weight") != nullptr, pp == 1);
    EXPECT_NE(root.get("model1")->get("decoder.layers.0.mlp.linear_fc1.weight"), nullptr);
  }
  const std::string back = meg + "_back";
  mg::Imported im = mg::convert_to_checkpoint(meg, {}, back);
  ASSERT_TRUE(im.optimizer.has_value());
  auto got = testing::make_ckpt_rank("llama4", 1, 0, false, {});
  checkpoint::load_checkpoint(back, {}, *got.m, got.opt.get());
  EXPECT_TRUE(testing::same_bytes(got.m->params().flat_params(), k.m->params().flat_params()));
  EXPECT_TRUE(testing::same_bytes(got.opt->exp_avg(), k.opt->exp_avg()));
  EXPECT_TRUE(testing::same_bytes(got.opt->exp_avg_sq(), k.opt->exp_avg_sq()));
}

// An fp16 run's loss scaler goes out as Float16OptimizerWithFloat16Params' grad_scaler and
// comes back with its scale and both trackers (a resume continues its schedule); a run
// without one (bf16) has none after the round trip.
TEST(MegatronExport, Fp16LossScalerRoundTrips) {
  const std::string dir = scratch_dir();
  auto k = testing::make_ckpt_rank("llama", 1, 0, true, {11, 12, 13, 5});
  checkpoint::TrainingState st = testing::sample_state(12);
  st.optimizer_steps = 5;
  st.config["fp16"] = "True";
  st.grad_scaler = {{"scale", 2048.0}, {"growth_tracker", 17}, {"hysteresis_tracker", 1}};
  const std::string ours = dir + "/ours16";
  checkpoint::save_checkpoint(ours, *k.m, k.opt.get(), st);
  const std::string md = ours + "/iter_0000012/metadata.json";
  nlohmann::json j = nlohmann::json::parse(testing::read_bytes(md));
  j["model"]["dtype"] = "f16";
  std::ofstream(md) << j.dump();
  mg::ExportOptions o;
  o.tp = 2;
  mg::export_to_megatron(ours, {}, dir + "/meg16", o);
  const mg::Imported im = mg::convert_to_checkpoint(dir + "/meg16", {}, dir + "/back16");
  ASSERT_TRUE(im.optimizer.has_value());
  EXPECT_EQ(im.optimizer->grad_scaler, st.grad_scaler);
  EXPECT_FALSE(im.optimizer->main_params.empty());  // fp32_from_fp16_params
  // and the converted checkpoint's training state holds it for --load
  auto got = testing::make_ckpt_rank("llama", 1, 0, false, {});
  EXPECT_EQ(checkpoint::load_checkpoint(dir + "/back16", {}, *got.m, got.opt.get()).grad_scaler,
            st.grad_scaler);
  // The bf16 export has no grad_scaler to read back.
  const std::string bf = make_ours(dir, "llama", true);
  mg::export_to_megatron(bf, {}, dir + "/meg_bf16", o);
  EXPECT_TRUE(mg::convert_to_checkpoint(dir + "/meg_bf16", {}, dir + "/back_bf16")
                  .optimizer->grad_scaler.empty());
}

// An uneven pipeline split (--decoder-first/last-pipeline-num-layers, as a training run
// writes it): 4 layers over PP 3 as 1 | 2 | 1, each stage's layers numbered from 0 in its
// file, the args naming the split; back through the importer bit for bit.
TEST(MegatronExport, UnevenStagesRoundTrip) {
  const std::string dir = scratch_dir();
  auto k = testing::make_ckpt_rank("llama4", 1, 0, true, {21, 22, 23, 5});
  checkpoint::TrainingState st = testing::sample_state(12);
  st.optimizer_steps = 5;
  const std::string ours = dir + "/ours";
  checkpoint::save_checkpoint(ours, *k.m, k.opt.get(), st);
  mg::ExportSource src;
  model::ParamStore& ps = k.m->params();
  src.config = k.m->config();
  src.state = st;
  src.has_optimizer = true, src.optimizer_steps = 5;
  src.shard = [&](const std::string& name, const char* what, int64_t, int64_t) {
    const model::ParamInfo& p = ps.info(name);
    const Tensor& from = std::strcmp(what, "param") == 0     ? ps.flat_params()
                         : std::strcmp(what, "exp_avg") == 0 ? k.opt->exp_avg()
                                                             : k.opt->exp_avg_sq();
    return from.narrow(p.offset, p.numel()).view(p.local_shape);
  };
  mg::ExportOptions o;
  o.tp = 1, o.pp = 3, o.first_stage_layers = 1, o.last_stage_layers = 1;
  const std::string meg = dir + "/meg_uneven", iter = meg + "/iter_0000012";
  for (int64_t pp = 0; pp < 3; ++pp) mg::write_legacy_rank(iter, src, o, 0, pp);
  testing::write_bytes(meg + "/latest_checkpointed_iteration.txt", "12");
  const int expect_layers[3] = {1, 2, 1};
  for (int64_t pp = 0; pp < 3; ++pp) {
    const std::string f = iter + "/" + mg::legacy_rank_dir(0, pp, 3) + "/model_optim_rng.pt";
    mg::MappedFile mf(f);
    mg::TorchFile tf(mf.bytes(), f);
    const mg::Value& model = *tf.root()->get("model");
    for (int l = 0; l < 3; ++l)
      EXPECT_EQ(model.get(fmt::format("decoder.layers.{}.mlp.linear_fc1.weight", l)) != nullptr,
                l < expect_layers[pp])
          << f << " layer " << l;
    EXPECT_EQ(tf.root()->get("args")->get("decoder_first_pipeline_num_layers")->i, 1);
  }
  mg::Imported im = mg::convert_to_checkpoint(meg, {}, meg + "_back");
  ASSERT_TRUE(im.optimizer.has_value());
  auto got = testing::make_ckpt_rank("llama4", 1, 0, false, {});
  checkpoint::load_checkpoint(meg + "_back", {}, *got.m, got.opt.get());
  EXPECT_TRUE(testing::same_bytes(got.m->params().flat_params(), k.m->params().flat_params()));
  EXPECT_TRUE(testing::same_bytes(got.opt->exp_avg(), k.opt->exp_avg()));
  EXPECT_TRUE(testing::same_bytes(got.opt->exp_avg_sq(), k.opt->exp_avg_sq()));
}

TEST(MegatronExport, MatchesPyTorchsOwnFixtureFiles) {
  const std::string dir = scratch_dir();
  for (const std::string fam : {"gpt", "llama"}) {
    const std::string ours = dir + "/" + fam, meg = dir + "/" + fam + "_meg";
    mg::convert_to_checkpoint(fixture(fam + "_legacy"), {}, ours);
    mg::ExportOptions o;
    o.tp = 2, o.pp = 2;
    o.impl = fam == "gpt" ? mg::TransformerImpl::Local : mg::TransformerImpl::TransformerEngine;
    mg::export_to_megatron(ours, {}, meg, o);
    for (const char* rank :
         {"mp_rank_00_000", "mp_rank_01_000", "mp_rank_00_001", "mp_rank_01_001"}) {
      const std::string tag = fam + " " + rank;
      const std::string fa = fixture(fam + "_legacy/iter_0000010/") + rank + "/model_optim_rng.pt";
      const std::string fb = meg + "/iter_0000010/" + rank + "/model_optim_rng.pt";
      mg::MappedFile ma(fa), mb(fb);
      mg::TorchFile ta(ma.bytes(), fa), tb(mb.bytes(), fb);
      const mg::Value &a = *ta.root(), &b = *tb.root();
      EXPECT_EQ(b.get("iteration")->i, 10) << tag;
      EXPECT_EQ(b.get("checkpoint_version")->f, 3.0) << tag;
      // the model: the same keys (extra states included), dtypes, shapes and values
      const mg::Value &sa = *a.get("model"), &sb = *b.get("model");
      ASSERT_EQ(sa.entries.size(), sb.entries.size()) << tag;
      for (const auto& [k, va] : sa.entries) {
        const mg::Value* vb = sb.get(k->s);
        ASSERT_NE(vb, nullptr) << tag << " " << k->s;
        ASSERT_EQ(va->kind, vb->kind) << tag << " " << k->s;
        if (!va->is(K::Tensor)) continue;
        EXPECT_EQ(va->dtype, vb->dtype) << tag << " " << k->s;
        EXPECT_EQ(va->shape, vb->shape) << tag << " " << k->s;
        EXPECT_EQ(values(ta, *va, k->s), values(tb, *vb, k->s)) << tag << " " << k->s;
      }
      // the optimizer, per parameter: moments and main params
      const auto oa = optimizer_by_key(a), ob = optimizer_by_key(b);
      ASSERT_EQ(oa.size(), ob.size()) << tag;
      for (const auto& [k, ea] : oa) {
        const OptEntry& eb = ob.at(k);
        EXPECT_EQ(eb.m->dtype, ea.m->dtype) << tag << k;
        EXPECT_EQ(eb.m->shape, ea.m->shape) << tag << k;
        EXPECT_EQ(values(ta, *ea.m, k), values(tb, *eb.m, k)) << tag << " exp_avg " << k;
        EXPECT_EQ(values(ta, *ea.v, k), values(tb, *eb.v, k)) << tag << " exp_avg_sq " << k;
        ASSERT_EQ(ea.main == nullptr, eb.main == nullptr) << tag << k;
        if (ea.main) {
          EXPECT_EQ(eb.main->dtype, DType::F32) << tag << k;
          EXPECT_EQ(values(ta, *ea.main, k), values(tb, *eb.main, k)) << tag << " main " << k;
        }
      }
      // the scheduler and the args that Megatron's loaders read
      const mg::Value &pa = *a.get("opt_param_scheduler"), &pb = *b.get("opt_param_scheduler");
      for (const char* k : {"max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "num_steps",
                            "start_wd", "end_wd", "wd_incr_steps"}) {
        auto num = [](const mg::Value* v) { return v->is(K::Int) ? double(v->i) : v->f; };
        EXPECT_EQ(num(pa.get(k)), num(pb.get(k))) << tag << " " << k;
      }
      EXPECT_EQ(pa.get("lr_decay_style")->s, pb.get("lr_decay_style")->s) << tag;
      const mg::Value &aa = *a.get("args"), &ab = *b.get("args");
      for (const char* k : {"num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                            "num_query_groups", "kv_channels", "max_position_embeddings",
                            "seq_length", "padded_vocab_size", "tensor_model_parallel_size",
                            "pipeline_model_parallel_size", "consumed_train_samples"})
        EXPECT_EQ(aa.get(k)->i, ab.get(k)->i) << tag << " " << k;
      for (const char* k : {"group_query_attention", "swiglu", "bf16", "fp16", "add_bias_linear",
                            "untie_embeddings_and_output_weights", "use_distributed_optimizer"})
        EXPECT_EQ(aa.get(k)->b, ab.get(k)->b) << tag << " " << k;
      for (const char* k : {"normalization", "position_embedding_type", "transformer_impl",
                            "tokenizer_type", "ckpt_format"})
        EXPECT_EQ(aa.get(k)->s, ab.get(k)->s) << tag << " " << k;
      EXPECT_EQ(aa.get("params_dtype")->s, ab.get("params_dtype")->s) << tag;
    }
  }
}

TEST(MegatronExport, BadInputGivesErrorsNamingTheFlagOrFile) {
  const std::string dir = scratch_dir();
  const std::string ours = make_ours(dir, "llama", false);
  mg::ExportOptions o;
  o.tp = 4;  // 2 query groups
  std::string e = error_of([&] { mg::export_to_megatron(ours, {}, dir + "/a", o); });
  EXPECT_NE(e.find("--target-tensor-parallel-size 4 does not divide"), std::string::npos) << e;
  o.tp = 1, o.pp = 3;  // 2 layers
  e = error_of([&] { mg::export_to_megatron(ours, {}, dir + "/a", o); });
  EXPECT_NE(e.find("--target-pipeline-parallel-size 3 does not divide"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir + "/a"));
  o.pp = 1;
  // a --save below a regular file cannot be created
  testing::write_bytes(dir + "/file", "x");
  e = error_of([&] { mg::export_to_megatron(ours, {}, dir + "/file/sub", o); });
  EXPECT_NE(e.find(dir + "/file"), std::string::npos) << e;
  // a folder holding something else is never written into
  fs::create_directories(dir + "/foreign");
  testing::write_bytes(dir + "/foreign/notes.txt", "mine");
  e = error_of([&] { mg::export_to_megatron(ours, {}, dir + "/foreign", o); });
  EXPECT_NE(e.find("is not empty and holds no Megatron checkpoint"), std::string::npos) << e;
  EXPECT_EQ(std::distance(fs::directory_iterator(dir + "/foreign"), fs::directory_iterator()), 1);
  // an iteration that exists is not overwritten
  mg::export_to_megatron(ours, {}, dir + "/m", o);
  e = error_of([&] { mg::export_to_megatron(ours, {}, dir + "/m", o); });
  EXPECT_NE(e.find("iter_0000012 exists already"), std::string::npos) << e;
  // mixture of experts: not implemented yet
  model::TransformerConfig moe = testing::tiny_config("gpt");
  moe.moe.num_experts = 4, moe.moe.topk = 2, moe.moe.ffn_hidden_size = 16;
  moe.add_bias_linear = false;
  model::GPTModel mm(moe);
  checkpoint::save_checkpoint(dir + "/moe", mm, nullptr, testing::sample_state(3));
  e = error_of([&] { mg::export_to_megatron(dir + "/moe", {}, dir + "/moe_meg", o); });
  EXPECT_NE(e.find("mixture-of-experts"), std::string::npos) << e;
  EXPECT_NE(e.find("not implemented yet"), std::string::npos) << e;
  EXPECT_FALSE(fs::exists(dir + "/moe_meg"));
}

}  // namespace megatron_export_test
}  // namespace mcpp
