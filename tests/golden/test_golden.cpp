// Golden tests: our model against an independent PyTorch implementation
// (make_golden.py), on weights and a batch exported by golden_export. Checks the
// logits, the loss and every parameter gradient, in f64 (to 1e-10) and f32 (1e-5).
#include <gtest/gtest.h>

#include <cmath>

#include "checkpoint/safetensors.h"
#include "golden_models.h"

using namespace mcpp;

namespace {

std::string data_dir() { return std::string(MCPP_SOURCE_DIR) + "/tests/golden/data/"; }

double get(const Tensor& t, int64_t i) {
  return t.dtype() == DType::F32 ? double(t.data<float>()[i]) : t.data<double>()[i];
}

// max |a-b| / (max |b| + tiny): a relative error over the whole tensor.
double rel_err(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.numel(), b.numel());
  double num = 0, den = 1e-30;
  for (int64_t i = 0; i < a.numel(); ++i) {
    num = std::max(num, std::abs(get(a, i) - get(b, i)));
    den = std::max(den, std::abs(get(b, i)));
  }
  return num / den;
}

void check_family(const std::string& fam, DType dt, double tol) {
  auto in = checkpoint::load_safetensors(data_dir() + fam + "_inputs.safetensors");
  auto ex = checkpoint::load_safetensors(data_dir() + fam + "_expected.safetensors");
  model::GPTModel m(golden::golden_config(fam, dt));
  auto& ps = m.params();
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const Tensor& src = in.at(ps.infos()[i].name);
    Tensor dst = ps.param(i);
    ASSERT_EQ(src.shape(), dst.shape()) << ps.infos()[i].name;
    for (int64_t e = 0; e < src.numel(); ++e) {
      if (dt == DType::F32) dst.data<float>()[e] = float(src.data<double>()[e]);
      else dst.data<double>()[e] = src.data<double>()[e];
    }
  }
  model::MicroBatch mb{in.at("batch.tokens"), in.at("batch.labels"), in.at("batch.loss_mask")};
  double n_tok = 0;
  for (int64_t i = 0; i < mb.loss_mask.numel(); ++i) n_tok += mb.loss_mask.data<float>()[i];
  model::StepKeys keys;
  keys.training = false;
  ps.zero_grads();
  double loss = m.forward(mb, keys) / n_tok;
  const double ref_loss = ex.at("loss").data<double>()[0];
  EXPECT_NEAR(loss, ref_loss, tol * std::abs(ref_loss)) << fam;
  EXPECT_LT(rel_err(m.logits(), ex.at("logits")), tol) << fam << " logits";
  m.backward(1.0 / n_tok);
  int checked = 0;
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const auto& name = ps.infos()[i].name;
    EXPECT_LT(rel_err(ps.grad(i), ex.at("grad." + name)), tol) << fam << " grad of " << name;
    ++checked;
  }
  EXPECT_EQ(checked + 0, int(ex.tensors.size()) - 2) << "every reference gradient compared";
}

}  // namespace

TEST(Golden, GptF64) { check_family("gpt", DType::F64, 1e-10); }
TEST(Golden, LlamaF64) { check_family("llama", DType::F64, 1e-10); }
TEST(Golden, GptF32) { check_family("gpt", DType::F32, 1e-5); }
TEST(Golden, LlamaF32) { check_family("llama", DType::F32, 1e-5); }
TEST(Golden, MlaF64) { check_family("mla", DType::F64, 1e-10); }
TEST(Golden, MlaF32) { check_family("mla", DType::F32, 1e-5); }
TEST(Golden, MlaRopeF64) { check_family("mla_rope", DType::F64, 1e-10); }
TEST(Golden, MlaRopeF32) { check_family("mla_rope", DType::F32, 1e-5); }
TEST(Golden, LlamaInterleavedF64) { check_family("llama_interleaved", DType::F64, 1e-10); }
TEST(Golden, LlamaInterleavedF32) { check_family("llama_interleaved", DType::F32, 1e-5); }
