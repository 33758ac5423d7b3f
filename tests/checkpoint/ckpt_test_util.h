// Helpers of the checkpoint tests: tiny models, TP-invariant fills, scratch folders.
#pragma once
#include <gtest/gtest.h>
#include <omp.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include "base/philox.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/safetensors.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"

namespace mcpp::testing {

// Equal dtype, shape and bytes.
inline bool same_bytes(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// s contains part (the message shows s whole where not).
inline void expect_has(const std::string& s, const std::string& part) {
  EXPECT_NE(s.find(part), std::string::npos) << "missing '" << part << "' in:\n" << s;
}

// The message of the mcpp::Error that f throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The models are tiny and the work is I/O: one thread avoids OpenMP start-up costs on a busy
// machine (set before any test runs).
inline const int kOneThread = (omp_set_num_threads(1), 0);

inline std::string scratch_dir() {
  auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir =
      std::filesystem::temp_directory_path() / ("mcpp_ckpt_" + std::to_string(::getpid()) + "_" +
                                                info->test_suite_name() + "_" + info->name());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir.string();
}

// A model's logits for the reference batch of a Hugging Face golden fixture (its
// reference.safetensors: `tokens` [B, S] int64, `logits` [B, S, V] float64 from transformers)
// against those logits: the largest difference relative to the largest logit.
inline double hf_logits_rel_err(model::GPTModel& m, const std::string& reference) {
  auto ref = checkpoint::load_safetensors(reference).tensors;
  const Tensor& tok = ref.at("tokens");
  const Tensor& lref = ref.at("logits");
  const int64_t B = tok.size(0), S = tok.size(1), V = lref.size(2);
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({B, S}, DType::I64);
  mb.labels = Tensor::zeros({B, S}, DType::I64);
  mb.loss_mask = Tensor::empty({B, S}, DType::F32);
  for (int64_t i = 0; i < B * S; ++i) {
    mb.tokens.data<int64_t>()[i] = tok.data<int64_t>()[i];
    mb.loss_mask.data<float>()[i] = 1.0f;
  }
  model::StepKeys keys;
  keys.training = false;
  m.forward(mb, keys);
  const Tensor& lg = m.logits();  // [S, B, V] as [S*B, V]
  EXPECT_EQ(lg.numel(), S * B * V);
  if (lg.numel() != S * B * V) return 1e30;
  double err = 0, scale = 0;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t b = 0; b < B; ++b)
      for (int64_t v = 0; v < V; ++v) {
        const double r = lref.data<double>()[(b * S + s) * V + v];
        err = std::max(err, std::abs(double(lg.data<float>()[(s * B + b) * V + v]) - r));
        scale = std::max(scale, std::abs(r));
      }
  return err / scale;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), {}};
}
inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(bytes.data(), std::streamsize(bytes.size()));
}

// family "gpt": LayerNorm, GELU, biases, learned positions, tied ("gpt_qk": and
// --qk-layernorm, its LayerNorm form with biases; "gpt_qk_wd": and
// --apply-wd-to-qk-layernorm); "llama": RMSNorm, SwiGLU,
// GQA (4 heads, 2 groups), RoPE, untied, no biases; "qwen2": llama + linear_qkv's bias alone
// (--add-qkv-bias); "qwen3": llama + --qk-layernorm ("qwen3_wd": and
// --apply-wd-to-qk-layernorm); "llama4": llama with 4 layers.
inline model::TransformerConfig tiny_config(const std::string& family, int64_t tp_size = 1,
                                            int64_t tp_rank = 0, DType dt = DType::F32) {
  model::TransformerConfig c;
  c.num_layers = 2, c.hidden_size = 16, c.num_attention_heads = 4, c.kv_channels = 4;
  c.seq_length = 8, c.max_position_embeddings = 12, c.padded_vocab_size = 64;
  c.hidden_dropout = 0, c.attention_dropout = 0, c.dtype = dt, c.seed = 77;
  c.tp_size = tp_size, c.tp_rank = tp_rank;
  if (family.starts_with("gpt")) {
    c.num_query_groups = 4, c.ffn_hidden_size = 32;
    c.qk_layernorm = family.starts_with("gpt_qk");        // --qk-layernorm (LayerNorm)
    c.qk_layernorm_weight_decay = family == "gpt_qk_wd";  // --apply-wd-to-qk-layernorm
  } else {
    c.num_query_groups = 2, c.ffn_hidden_size = 24, c.rope = true;
    c.rmsnorm = true, c.swiglu = true, c.tie_embeddings = false, c.add_bias_linear = false;
    c.add_qkv_bias = family == "qwen2";
    c.rotary_interleaved = family == "llama_interleaved";  // --rotary-interleaved
    c.qk_layernorm = family.starts_with("qwen3");         // --qk-layernorm
    c.qk_layernorm_weight_decay = family == "qwen3_wd";   // --apply-wd-to-qk-layernorm
    if (family == "llama4") c.num_layers = 4;              // room for virtual stages
  }
  return c;
}

// Value of global element g of tensor `name` under `salt`: the same for every TP layout.
inline double global_value(uint64_t salt, const std::string& name, int64_t g) {
  return Philox::normal(salt, hash_name(name), uint64_t(g));
}

// Fills flat (laid out like ps) with global_value(salt, ...) by global index.
inline void fill_global(const model::ParamStore& ps, Tensor flat, uint64_t salt) {
  for (const auto& p : ps.infos()) {
    const int64_t rows = p.local_shape[0], cols = p.numel() / rows;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        const double v = global_value(salt, p.name, ps.global_index(p, r, c));
        const int64_t i = p.offset + r * cols + c;
        if (flat.dtype() == DType::F32)
          flat.data<float>()[i] = float(v);
        else
          flat.data<double>()[i] = v;
      }
  }
}

// Number of elements of flat (laid out like ps) that differ from fill_global(salt).
inline int64_t count_mismatches(const model::ParamStore& ps, const Tensor& flat, uint64_t salt) {
  Tensor want = Tensor::zeros(flat.shape(), flat.dtype());
  fill_global(ps, want, salt);
  int64_t bad = 0;
  for (const auto& p : ps.infos())
    for (int64_t i = p.offset; i < p.offset + p.numel(); ++i) {
      const bool eq = flat.dtype() == DType::F32 ? flat.data<float>()[i] == want.data<float>()[i]
                                                 : flat.data<double>()[i] == want.data<double>()[i];
      bad += !eq;
    }
  return bad;
}

inline checkpoint::TrainingState sample_state(int64_t iteration) {
  checkpoint::TrainingState st;
  st.iteration = iteration;
  st.consumed_train_samples = iteration * 8, st.consumed_valid_samples = 16;
  st.scheduler.max_lr = 3e-4, st.scheduler.min_lr = 3e-5, st.scheduler.lr_warmup_steps = 80;
  st.scheduler.lr_decay_steps = 800, st.scheduler.lr_decay_style = optim::LrDecayStyle::Cosine;
  st.scheduler.num_steps = iteration * 8;
  st.optimizer_steps = iteration;
  st.rng_seed = 1234, st.rng_iteration = iteration;
  st.data_loader = {{"epoch", 0}, {"sample_index", iteration * 8}};
  st.config = {{"lr", "0.0003"}, {"hidden_size", "16"}};
  return st;
}

// One TP rank's model and AdamW state; `filled`: parameters and moments set to
// fill_global's values under the three salts, and `steps` Adam steps taken.
struct CkptRank {
  std::unique_ptr<model::GPTModel> m;
  std::unique_ptr<optim::AdamW> opt;
};
struct RankSalts {
  uint64_t param, avg, sq;
  int64_t steps;
};
// rule: the optimizer's (SGD and Lion have exp_avg alone).
inline CkptRank make_ckpt_rank(const std::string& fam, int64_t tp, int64_t r, bool filled,
                               const RankSalts& s,
                               optim::UpdateRule rule = optim::UpdateRule::Adam) {
  CkptRank k;
  k.m = std::make_unique<model::GPTModel>(tiny_config(fam, tp, r));
  optim::OptimizerConfig oc;
  oc.rule = rule;
  k.opt = std::make_unique<optim::AdamW>(k.m->params(), oc);
  if (filled) {
    fill_global(k.m->params(), k.m->params().flat_params(), s.param);
    fill_global(k.m->params(), k.opt->exp_avg(), s.avg);
    if (k.opt->exp_avg_sq().defined()) fill_global(k.m->params(), k.opt->exp_avg_sq(), s.sq);
    k.opt->set_steps(s.steps);
  }
  return k;
}

}  // namespace mcpp::testing
