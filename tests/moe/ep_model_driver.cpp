// A whole MoE model with expert parallelism (the all-to-all and the all-gather dispatcher)
// under mpirun, against the serial model run by every rank itself (so the two dispatchers
// also agree with each other). The EP ranks of a group each run their own
// micro-batch (as the data-parallel ranks EP folds over do); rank q's EP model must give:
//   * the serial model's loss, aux and z losses on micro-batch q;
//   * for dense parameters (router, attention, shared experts, norms), the serial gradient
//     of micro-batch q (the DP reduction is the trainer's, not the model's);
//   * for its local experts (global index q*El + j), the serial gradient summed over every
//     EP rank's micro-batch (the rows routed to them from all ranks).
// f64, dropout on, tolerance 1e-10 relative. Families: SwiGLU top-2 softmax with aux/z
// losses and a gated shared expert; GELU top-3 sigmoid with groups, scaling, seq_aux_loss
// and a dense first layer; top-1 pre-softmax with every token routed to expert 0 (all but
// one rank receive no rows).
//
//   ep_model_driver EP           world = any multiple of EP
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "base/philox.h"
#include "comm/world.h"
#include "model/gpt_model.h"
#include "model/moe/moe_layer.h"
#include "moe_test_util.h"
#include "parallel/parallel_state.h"

using namespace mcpp;
using model::TransformerConfig;
namespace moe = model::moe;
using test::moe_layers;

namespace {

int g_failures = 0, g_rank = 0;

void fail(const std::string& what) {
  if (g_failures++ < 20) std::fprintf(stderr, "[rank %d] FAIL: %s\n", g_rank, what.c_str());
}

TransformerConfig family(int f) {
  TransformerConfig c;
  c.num_layers = 2, c.hidden_size = 8, c.num_attention_heads = 4, c.kv_channels = 2;
  c.seq_length = 6, c.max_position_embeddings = 8, c.padded_vocab_size = 16;
  c.hidden_dropout = 0.1, c.attention_dropout = 0.1, c.dtype = DType::F64;
  c.init_method_std = 0.3, c.num_query_groups = 2, c.ffn_hidden_size = 12;
  c.add_bias_linear = false;
  c.moe.ffn_hidden_size = 6;
  if (f == 0) {
    c.rope = c.rmsnorm = c.swiglu = true;
    c.moe.num_experts = 8, c.moe.topk = 2;
    c.moe.aux_loss_coeff = {0.05}, c.moe.z_loss_coeff = 0.01;
    c.moe.shared_ffn_hidden_size = 8, c.moe.shared_expert_gate = true;
  } else if (f == 1) {
    c.moe.num_experts = 8, c.moe.topk = 3;
    c.moe.score = TransformerConfig::Moe::Score::Sigmoid;
    c.moe.num_groups = 4, c.moe.group_topk = 3, c.moe.topk_scaling_factor = 2.0;
    c.moe.balance = {TransformerConfig::Moe::Balance::SeqAuxLoss}, c.moe.aux_loss_coeff = {0.05};
    c.moe.layer_pattern = {0, 1};
  } else {
    c.moe.num_experts = 4, c.moe.topk = 1, c.moe.pre_softmax = true;
    c.moe.aux_loss_coeff = {0.05};
  }
  return c;
}

model::MicroBatch batch(int64_t B, int64_t S, int64_t V, uint64_t seed) {
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({B, S}, DType::I64);
  mb.labels = Tensor::empty({B, S}, DType::I64);
  mb.loss_mask = Tensor::empty({B, S}, DType::F32);
  for (int64_t i = 0; i < B * S; ++i) {
    mb.tokens.data<int64_t>()[i] = Philox::u32(seed, 1, uint64_t(i)) % V;
    mb.labels.data<int64_t>()[i] = Philox::u32(seed, 2, uint64_t(i)) % V;
    mb.loss_mask.data<float>()[i] = i % 5 == 2 ? 0.f : 1.f;
  }
  return mb;
}

struct Pass {
  double loss = 0, aux = 0, z = 0;
  std::map<std::string, std::vector<double>> grads;
};

Pass run(model::GPTModel& m, const model::MicroBatch& mb, const model::StepKeys& k) {
  auto& ps = m.params();
  ps.zero_grads();
  Pass p;
  p.loss = m.forward(mb, k);
  for (auto* l : moe_layers(m)) p.aux += l->stats().last_aux_sum(), p.z += l->stats().last_z_loss;
  m.backward(1.0);
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const Tensor g = ps.grad(i);
    p.grads[ps.infos()[i].name] = std::vector<double>(g.data<double>(), g.data<double>() + g.numel());
  }
  return p;
}

bool close(double a, double b) { return std::abs(a - b) <= 1e-10 * (1 + std::abs(b)); }

void check_family(int f, comm::Communicator& ep, bool alltoall) {
  const int EP = ep.size(), me = ep.rank();
  const std::string tag = fmt::format("family {} EP {} {}", f, EP, alltoall ? "alltoall" : "allgather");
  TransformerConfig cs = family(f), ce = cs;
  ce.moe.ep_size = EP, ce.moe.ep_rank = me, ce.moe.alltoall = alltoall;
  model::GPTModel serial(cs), par(ce);
  // The same weights (by name: the EP model holds a subset of the serial one's).
  std::map<std::string, size_t> where;
  for (size_t i = 0; i < serial.params().infos().size(); ++i)
    where[serial.params().infos()[i].name] = i;
  int64_t experts_here = 0;
  for (size_t i = 0; i < par.params().infos().size(); ++i) {
    const auto& info = par.params().infos()[i];
    auto it = where.find(info.name);
    if (it == where.end()) return fail(tag + ": no serial parameter " + info.name);
    Tensor w = par.params().param(i);
    const Tensor s = serial.params().param(it->second);
    if (w.numel() != s.numel()) return fail(tag + ": shape of " + info.name);
    std::copy(s.data<double>(), s.data<double>() + s.numel(), w.data<double>());
    if (info.grad_group == model::GradGroup::Expert) {
      ++experts_here;
      if (info.expert / ce.moe.local_experts() != me)
        fail(fmt::format("{}: rank {} holds {} (expert {})", tag, me, info.name, info.expert));
    }
  }
  const int64_t moe_layer_count = int64_t(moe_layers(par).size());
  if (experts_here != 2 * ce.moe.local_experts() * moe_layer_count)
    fail(fmt::format("{}: {} expert weights here, want {}", tag, experts_here,
                     2 * ce.moe.local_experts() * moe_layer_count));
  for (auto* l : moe_layers(par)) l->set_expert_parallel_group(&ep);

  const int64_t B = 2;
  auto keys_of = [&](int q) {
    model::StepKeys k;
    k.iteration = 3, k.sample_offset = q * B, k.global_batch = EP * B;
    return k;
  };
  auto mb_of = [&](int q) { return batch(B, cs.seq_length, 13, 100 + uint64_t(q)); };
  if (f == 2) {  // every token to expert 0: a zero router (equal logits; ties go to expert 0)
    for (auto* m : {&serial, &par})
      for (size_t i = 0; i < m->params().infos().size(); ++i)
        if (m->params().infos()[i].name.find("mlp.router.weight") != std::string::npos) {
          Tensor w = m->params().param(i);
          const int64_t H = cs.hidden_size;
          for (int64_t e = 0; e < w.size(0); ++e)
            for (int64_t h = 0; h < H; ++h) w.data<double>()[e * H + h] = 0.0;
        }
  }
  std::vector<Pass> ref;
  for (int q = 0; q < EP; ++q) ref.push_back(run(serial, mb_of(q), keys_of(q)));
  const Pass got = run(par, mb_of(me), keys_of(me));
  const Pass& want = ref[size_t(me)];
  if (!close(got.loss, want.loss)) fail(fmt::format("{}: loss {} vs {}", tag, got.loss, want.loss));
  if (!close(got.aux, want.aux)) fail(fmt::format("{}: aux {} vs {}", tag, got.aux, want.aux));
  if (!close(got.z, want.z)) fail(fmt::format("{}: z {} vs {}", tag, got.z, want.z));
  double expert_grad_norm = 0;
  for (size_t i = 0; i < par.params().infos().size(); ++i) {
    const auto& info = par.params().infos()[i];
    const bool expert = info.grad_group == model::GradGroup::Expert;
    std::vector<double> r(want.grads.at(info.name).size(), 0.0);
    for (int q = 0; q < EP; ++q)
      if (expert || q == me)
        for (size_t j = 0; j < r.size(); ++j) r[j] += ref[size_t(q)].grads.at(info.name)[j];
    const auto& g = got.grads.at(info.name);
    for (size_t j = 0; j < r.size(); ++j) {
      if (expert) expert_grad_norm += g[j] * g[j];
      if (!close(g[j], r[j])) {
        fail(fmt::format("{}: grad {}[{}] {} vs {}", tag, info.name, j, g[j], r[j]));
        break;
      }
    }
  }
  // The experts must have seen rows (else the comparison says little) -- in the group.
  Tensor n = Tensor::from(std::vector<double>{expert_grad_norm}, {1});
  ep.all_reduce(n, comm::ReduceOp::Sum, Stream::cpu());
  if (!(n.data<double>()[0] > 0)) fail(tag + ": no expert gradient anywhere");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto w = comm::init({});
    g_rank = w->rank();
    const int EP = argc > 1 ? std::atoi(argv[1]) : 1;
    parallel::ParallelSizes sz;
    sz.ep = EP;
    parallel::ParallelState ps(*w, sz);
    for (int f = 0; f < 3; ++f)
      for (bool a2a : {true, false}) check_family(f, ps.ep(), a2a);
    Tensor t = Tensor::from(std::vector<double>{double(g_failures)}, {1});
    w->world().all_reduce(t, comm::ReduceOp::Sum, Stream::cpu());
    const int total = int(t.data<double>()[0]);
    if (w->rank() == 0)
      std::printf("ep_model_driver: %d ranks, EP %d, 3 families x 2 dispatchers: %s\n", w->size(), EP,
                  total == 0 ? "all checks passed" : "FAILED");
    return total == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] ERROR: %s\n", g_rank, e.what());
    return 1;
  }
}
