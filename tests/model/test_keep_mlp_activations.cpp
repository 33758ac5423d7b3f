// --keep-mlp-activations: a layer that keeps its MLP activation for backward runs the
// same element functions and GEMMs as one that recomputes it from fc1's output, so
// training is bit for bit the same. A few AdamW steps of two micro-batches each, GPT
// (GELU) and Llama (SwiGLU), f32 and f64, with dropout (residual adds after dropout) and
// without (residual adds in the GEMMs), under every recomputation setting: the losses,
// every step's gradients and the final parameters must equal those of keeping nothing.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>

#include "base/philox.h"
#include "model/gpt_model.h"
#include "model/moe/moe_layer.h"
#include "optim/optimizer.h"
#include "tiny_model.h"

using namespace mcpp;
using model::GPTModel;
using model::TransformerConfig;

namespace keep_mlp_activations_test {

using RC = TransformerConfig::Recompute;
using RM = TransformerConfig::RecomputeMethod;

struct Training {
  std::vector<double> losses;  // per micro-batch
  std::vector<Tensor> grads;   // the flat gradients before each step
  Tensor params;               // after the last step
  int64_t saved = 0, scratch = 0;
};

model::MicroBatch batch(int step, int m, int64_t B, int64_t S, int64_t V) {
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({B, S}, DType::I64);
  mb.labels = Tensor::empty({B, S}, DType::I64);
  mb.loss_mask = Tensor::empty({B, S}, DType::F32);
  const uint64_t k = uint64_t(step * 16 + m);
  for (int64_t i = 0; i < B * S; ++i) {
    mb.tokens.data<int64_t>()[i] = int64_t(Philox::u32(5, 2 * k, uint64_t(i)) % uint64_t(V));
    mb.labels.data<int64_t>()[i] = int64_t(Philox::u32(5, 2 * k + 1, uint64_t(i)) % uint64_t(V));
    mb.loss_mask.data<float>()[i] = (i + m) % 7 == 3 ? 0.f : 1.f;
  }
  return mb;
}

// after: called with the model once training is done (what a test reads from it).
Training train(const TransformerConfig& c,
               const std::function<void(GPTModel&)>& after = nullptr) {
  const int steps = 3, M = 2;
  const int64_t B = 2, S = c.seq_length;
  GPTModel m(c);
  optim::AdamW opt(m.params(), {});
  Training t;
  for (int it = 0; it < steps; ++it) {
    m.params().zero_grads();
    for (int j = 0; j < M; ++j) {
      model::StepKeys k;
      k.iteration = it, k.sample_offset = j * B, k.global_batch = M * B;
      t.losses.push_back(m.forward(batch(it, j, B, S, c.padded_vocab_size), k));
      m.backward(1.0 / double(M * B * S));
    }
    t.grads.push_back(m.params().flat_grads().clone());
    opt.clip(1.0, std::sqrt(opt.grad_sq_norm()));
    opt.step(3e-2, 0.1);
  }
  t.params = m.params().flat_params().clone();
  t.saved = m.activation_memory().per_slot_max, t.scratch = m.activation_memory().scratch;
  if (after) after(m);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// Every micro-batch's loss, every step's gradients and the final parameters, bit for bit.
void expect_same_training(const Training& t, const Training& ref) {
  ASSERT_EQ(t.losses.size(), ref.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_EQ(std::memcmp(&t.losses[i], &ref.losses[i], sizeof(double)), 0)
        << "micro-batch " << i << ": " << t.losses[i] << " vs " << ref.losses[i];
  ASSERT_EQ(t.grads.size(), ref.grads.size());
  for (size_t i = 0; i < ref.grads.size(); ++i)
    EXPECT_TRUE(same_bits(t.grads[i], ref.grads[i])) << "gradients of step " << i;
  EXPECT_TRUE(same_bits(t.params, ref.params)) << "parameters after the last step";
}

struct Setting {
  const char* name;
  RC rc;
  RM method;
  int64_t layers;
};

TEST(KeepMlpActivations, TrainingIsBitwiseThatOfRecomputing) {
  const int L = 3;
  const Setting settings[] = {{"no recompute", RC::None, RM::Uniform, 1},
                              {"selective", RC::Selective, RM::Uniform, 1},
                              {"full block 1", RC::Full, RM::Block, 1},
                              {"full uniform 2", RC::Full, RM::Uniform, 2}};
  for (bool llama : {false, true})
    for (DType dt : {DType::F32, DType::F64})
      for (double dropout : {0.1, 0.0})
        for (const Setting& s : settings) {
          TransformerConfig c = model::test::tiny(llama, L, dropout);
          c.dtype = dt, c.recompute = s.rc, c.recompute_method = s.method;
          c.recompute_num_layers = s.layers;
          const Training ref = train(c);
          // Layers that full recomputation re-runs keep nothing (they save nothing at all).
          const int stored = s.rc != RC::Full ? L : s.method == RM::Block ? L - 1 : 0;
          for (int64_t keep : {1, 2, 3, 8}) {
            SCOPED_TRACE(fmt::format("{} {} dropout {} {}, keep {}", llama ? "llama" : "gpt",
                                     dtype_name(dt), dropout, s.name, keep));
            c.keep_mlp_activations = keep;
            const Training t = train(c);
            expect_same_training(t, ref);
            // The memory: one [T, F] per kept layer; the shared one goes when all keep.
            const int kept = int(std::min<int64_t>(keep, stored));
            const int64_t act = 2 * c.seq_length * c.ffn_hidden_size * int64_t(dtype_size(dt));
            EXPECT_EQ(t.saved, ref.saved + kept * act);
            EXPECT_EQ(t.scratch, ref.scratch - (kept == L ? act : 0));
            GPTModel probe(c);
            EXPECT_EQ(probe.saved_bytes_per_microbatch(0, 2, c.seq_length), t.saved);
            EXPECT_EQ(probe.scratch_bytes(2, c.seq_length), t.scratch);
          }
        }
}

TEST(KeepMlpActivations, MoeLayersTrainBitwiseAsRecomputing) {
  // A MoE layer that keeps nothing gathers its permuted input again and recomputes the
  // experts' fc2 input in backward (model/moe/experts.h): the same bits as keeping both,
  // and per kept layer its N x H permuted rows and N x I fc2 inputs more (N = T k rows).
  const int L = 3;
  for (bool llama : {false, true})
    for (DType dt : {DType::F32, DType::F64})
      for (double dropout : {0.1, 0.0}) {
        TransformerConfig c = model::test::tiny(llama, L, dropout);
        c.dtype = dt, c.add_bias_linear = false;  // MoE layers have no biases
        c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 6;
        c.moe.aux_loss_coeff = {1e-2};
        const Training ref = train(c);
        for (int64_t keep : {1, 3}) {
          SCOPED_TRACE(fmt::format("{} {} dropout {}, keep {}", llama ? "llama" : "gpt",
                                   dtype_name(dt), dropout, keep));
          c.keep_mlp_activations = keep;
          const Training t = train(c);
          expect_same_training(t, ref);
          const int64_t N = 2 * c.seq_length * c.moe.topk;  // B = 2
          const int64_t per_layer =
              N * (c.hidden_size + c.moe.ffn_hidden_size) * int64_t(dtype_size(dt));
          EXPECT_EQ(t.saved, ref.saved + keep * per_layer);
          EXPECT_EQ(t.scratch, ref.scratch);
        }
      }
}

// Shared experts (model/moe/shared_experts.h) follow the same policy: a layer that does not
// keep its MLP activations recomputes the shared expert's activation from its fc1 output in
// backward. The same bits, with and without the shared expert's gate, and per kept layer
// one [T, Is] more.
TEST(KeepMlpActivations, SharedExpertsTrainBitwiseAsRecomputing) {
  const int L = 3;
  for (bool llama : {false, true})
    for (bool gate : {false, true}) {
      TransformerConfig c = model::test::tiny(llama, L, 0.1);
      c.dtype = DType::F64, c.add_bias_linear = false;
      c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 6;
      c.moe.shared_ffn_hidden_size = 10, c.moe.shared_expert_gate = gate;
      const Training ref = train(c);
      for (int64_t keep : {1, 3}) {
        SCOPED_TRACE(fmt::format("{} gate {}, keep {}", llama ? "llama" : "gpt", gate, keep));
        c.keep_mlp_activations = keep;
        const Training t = train(c);
        expect_same_training(t, ref);
        const int64_t T = 2 * c.seq_length, N = T * c.moe.topk;  // B = 2
        const int64_t per_layer =
            (N * (c.hidden_size + c.moe.ffn_hidden_size) + T * c.moe.shared_ffn_hidden_size) *
            int64_t(dtype_size(c.dtype));
        EXPECT_EQ(t.saved, ref.saved + keep * per_layer);
        EXPECT_EQ(t.scratch, ref.scratch);
      }
    }
}

TEST(KeepMlpActivations, WhichLayersKeep) {
  TransformerConfig c = model::test::tiny(false, 4, 0.0);
  auto keeps = [&](int n) { return model::keeps_mlp_activation(c, n); };
  EXPECT_EQ(keeps(4), std::vector<bool>({false, false, false, false}));
  c.keep_mlp_activations = 2;
  EXPECT_EQ(keeps(4), std::vector<bool>({true, true, false, false}));
  c.keep_mlp_activations = 9;
  EXPECT_EQ(keeps(3), std::vector<bool>({true, true, true}));
  // Full recomputation, block: the first recompute_num_layers layers are re-run whole; the
  // count starts after them.
  c.recompute = RC::Full, c.recompute_method = RM::Block, c.recompute_num_layers = 1;
  c.keep_mlp_activations = 2;
  EXPECT_EQ(keeps(4), std::vector<bool>({false, true, true, false}));
  c.recompute_method = RM::Uniform;
  EXPECT_EQ(keeps(4), std::vector<bool>({false, false, false, false}));
  c.recompute = RC::Selective;
  EXPECT_EQ(keeps(4), std::vector<bool>({true, true, false, false}));
  c.keep_mlp_activations = -1;
  EXPECT_THROW(GPTModel{c}, Error);
}


// --recompute-modules layernorm (selective recomputation): the two norms' outputs are not
// kept; backward re-runs each norm's forward into one shared [T, H] buffer before the GEMM
// that reads it. The norm kernels and GEMMs see the same inputs, so training is bit for
// bit that of keeping them -- alone, with core_attn, and with --keep-mlp-activations --
// and each layer keeps two [T, H] tensors fewer (the shared buffer is one [T, H] of
// scratch).
TEST(RecomputeModules, NormsTrainBitwiseAsKeepingThem) {
  const int L = 3;
  for (bool llama : {false, true})
    for (DType dt : {DType::F32, DType::F64})
      for (double dropout : {0.1, 0.0})
        for (bool core_attn : {false, true})
          for (int64_t keep : {0, 2}) {
            SCOPED_TRACE(fmt::format("{} {} dropout {} core_attn {} keep {}",
                                     llama ? "llama" : "gpt", dtype_name(dt), dropout, core_attn,
                                     keep));
            TransformerConfig c = model::test::tiny(llama, L, dropout);
            c.dtype = dt, c.keep_mlp_activations = keep;
            c.recompute = core_attn ? RC::Selective : RC::None;  // the reference keeps norms
            const Training ref = train(c);
            c.recompute = RC::Selective, c.recompute_core_attn = core_attn;
            c.recompute_norms = true;
            const Training t = train(c);
            expect_same_training(t, ref);
            const int64_t th = 2 * c.seq_length * c.hidden_size * int64_t(dtype_size(dt));
            EXPECT_EQ(t.saved, ref.saved - 2 * L * th);
            EXPECT_EQ(t.scratch, ref.scratch + th);
            GPTModel probe(c);
            EXPECT_EQ(probe.saved_bytes_per_microbatch(0, 2, c.seq_length), t.saved);
          }
}

// --recompute-modules mlp: the dense MLPs keep neither fc1's output nor their activation;
// backward runs fc1's forward again (the same kernel, GELU or SwiGLU in its epilogue) from
// the kept input into one shared [T, FC1W] buffer. Training is bit for bit that of keeping
// it -- alone, with core_attn and layernorm -- each dense layer keeps one [T, FC1W] fewer,
// and in a model interleaving MoE layers only the dense ones change.
TEST(RecomputeModules, MlpTrainsBitwiseAsKeepingFc1) {
  const int L = 3;
  for (bool llama : {false, true})
    for (DType dt : {DType::F32, DType::F64})
      for (bool others : {false, true})
        for (bool moe : {false, true}) {
          SCOPED_TRACE(fmt::format("{} {} core_attn+layernorm {} moe {}", llama ? "llama" : "gpt",
                                   dtype_name(dt), others, moe));
          TransformerConfig c = model::test::tiny(llama, L, 0.1);
          c.dtype = dt;
          if (moe) {  // layer 1 is a MoE layer, 0 and 2 dense
            c.add_bias_linear = false;
            c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 6;
            c.moe.layer_pattern = {0, 1, 0};
          }
          c.recompute = RC::Selective, c.recompute_core_attn = others;
          c.recompute_norms = others;
          const Training ref = train(c);
          c.recompute_mlp = true;
          const Training t = train(c);
          expect_same_training(t, ref);
          const int64_t dense = moe ? 2 : L, T = 2 * c.seq_length;
          const int64_t fc1 = T * (c.swiglu ? 2 : 1) * c.ffn_hidden_size * int64_t(dtype_size(dt));
          EXPECT_EQ(t.saved, ref.saved - dense * fc1);
          EXPECT_EQ(t.scratch, ref.scratch + fc1);
          GPTModel probe(c);
          EXPECT_EQ(probe.saved_bytes_per_microbatch(0, 2, c.seq_length), t.saved);
        }
}

// --recompute-modules shared_experts: the MoE layers' shared experts keep neither their fc1
// output nor their activation; backward runs their fc1 again from the layer's input. The
// same GEMMs on the same inputs, so training is bit for bit that of keeping them (gated and
// not, with and without --keep-mlp-activations), with one [T, (2)Is] fewer kept a layer
// (and the kept activations of the layers that keep them), one [T, (2)Is] more of scratch.
TEST(RecomputeModules, SharedExpertsTrainBitwiseAsKeepingThem) {
  const int L = 3;
  for (bool llama : {false, true})
    for (bool gate : {false, true})
      for (int64_t keep : {0, 2}) {
        SCOPED_TRACE(fmt::format("{} gate {} keep {}", llama ? "llama" : "gpt", gate, keep));
        TransformerConfig c = model::test::tiny(llama, L, 0.1);
        c.dtype = DType::F64, c.add_bias_linear = false, c.keep_mlp_activations = keep;
        c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 6;
        c.moe.shared_ffn_hidden_size = 10, c.moe.shared_expert_gate = gate;
        c.recompute = RC::Selective, c.recompute_core_attn = false;
        const Training ref = train(c);
        c.recompute_shared_experts = true;
        const Training t = train(c);
        expect_same_training(t, ref);
        const int64_t T = 2 * c.seq_length, Is = c.moe.shared_ffn_hidden_size;
        const int64_t fc1 = T * (c.swiglu ? 2 : 1) * Is * 8, act = T * Is * 8;  // f64
        EXPECT_EQ(t.saved, ref.saved - L * fc1 - std::min<int64_t>(keep, L) * act);
        EXPECT_EQ(t.scratch, ref.scratch + fc1);
        GPTModel probe(c);
        EXPECT_EQ(probe.saved_bytes_per_microbatch(0, 2, c.seq_length), t.saved);
      }
}

// --recompute-modules moe: a MoE layer keeps nothing of its own; backward re-runs its whole
// forward (router, routing, experts, shared experts) into one buffer set shared by every
// MoE layer. The same computation on the same input, so training is bit for bit that of
// keeping it -- with and without shared experts, capacity dropping, the other modules, and
// interleaved dense layers -- and each micro-batch's routing is counted once in the
// layers' statistics. Each MoE layer keeps its whole saved set fewer; the shared set is
// one layer's (with the experts' activation kept) in the scratch.
TEST(RecomputeModules, MoeTrainsBitwiseAsKeepingIt) {
  const int L = 3;
  for (bool llama : {false, true})
    for (bool shared : {false, true})
      for (bool dense : {false, true})
        for (bool others : {false, true}) {
          SCOPED_TRACE(fmt::format("{} shared {} dense {} others {}", llama ? "llama" : "gpt",
                                   shared, dense, others));
          TransformerConfig c = model::test::tiny(llama, L, 0.1);
          c.dtype = DType::F64, c.add_bias_linear = false;
          c.moe.num_experts = 4, c.moe.topk = 2, c.moe.ffn_hidden_size = 6;
          c.moe.aux_loss_coeff = {1e-2}, c.moe.z_loss_coeff = 1e-3;
          if (shared) c.moe.shared_ffn_hidden_size = 10, c.moe.shared_expert_gate = true;
          if (others) c.moe.capacity_factor = 1.0;  // tokens dropped, deterministically
          // ... and global_aux_loss, whose running mean over the micro-batches a recomputed
          // forward must not count twice (nor see a later micro-batch's counts).
          using Bal = TransformerConfig::Moe::Balance;
          if (others) c.moe.balance = {Bal::AuxLoss, Bal::GlobalAuxLoss};
          if (others) c.moe.aux_loss_coeff = {1e-2, 3e-2};
          if (dense) c.moe.layer_pattern = {1, 0, 1};
          const int moe_layers = dense ? 2 : L;
          c.recompute = RC::Selective, c.recompute_core_attn = others;
          c.recompute_norms = others, c.recompute_shared_experts = others && shared;
          auto stats = [&](GPTModel& m) {
            std::vector<double> v;
            auto& b = m.stage().block(0);
            for (int i = 0; i < b.size(); ++i)
              if (auto* l = dynamic_cast<model::moe::MoeLayer*>(&b.layer(i).mlp())) {
                const auto& s = l->stats();
                v.insert(v.end(), s.tokens_per_expert.begin(), s.tokens_per_expert.end());
                v.insert(v.end(), s.aux_loss.begin(), s.aux_loss.end());
                v.push_back(s.z_loss), v.push_back(double(s.forwards));
              }
            return v;
          };
          std::vector<double> ref_stats, rc_stats;
          const Training ref = train(c, [&](GPTModel& m) { ref_stats = stats(m); });
          GPTModel plain(c);
          c.recompute_moe = true;
          const Training t = train(c, [&](GPTModel& m) { rc_stats = stats(m); });
          expect_same_training(t, ref);
          EXPECT_EQ(rc_stats, ref_stats);
          ASSERT_EQ(ref_stats.size(), size_t(moe_layers) * 9);
          EXPECT_EQ(ref_stats[8], 6.0);  // 3 steps x 2 micro-batches, each counted once
          // What one MoE layer saves (keeping its activation, the shared set's setting) is
          // what each layer keeps no more, and what the scratch holds once more.
          const model::StepContext d =
              model::make_step_context(c, c.seq_length, 2, model::StepKeys{}, nullptr);
          auto& mlp = plain.stage().block(0).layer(dense ? 0 : 1).mlp();
          auto one = mlp.new_saved();
          const int64_t set = model::predicted_bytes(
              [&](const model::TensorVisitor& v) { mlp.saved_specs(d, true, *one, v); });
          auto kept = mlp.new_saved();
          const int64_t per_layer = model::predicted_bytes(
              [&](const model::TensorVisitor& v) { mlp.saved_specs(d, false, *kept, v); });
          ASSERT_GT(per_layer, 0);
          EXPECT_EQ(t.saved, ref.saved - moe_layers * per_layer);
          EXPECT_EQ(t.scratch, ref.scratch + set);
          GPTModel probe(c);
          EXPECT_EQ(probe.saved_bytes_per_microbatch(0, 2, c.seq_length), t.saved);
        }
}

}  // namespace keep_mlp_activations_test
