// ckpt_compare A B [rtol]: loads the latest checkpoint of save directories A and B into
// one serial (TP 1) model each -- so either may have been written under any TP/DP layout
// -- and compares every parameter and both Adam moments. A tensor passes when
// max|a - b| <= rtol * max|b| (default 1e-5). Prints the worst tensor; exit 1 on failure.
//
// One exception, by mathematics rather than tolerance: the key part of linear_qkv.bias has
// a zero true gradient (softmax is invariant to adding q.b_k to every score of a row), so
// its gradient is rounding noise and Adam turns that noise into steps of up to ~lr*g/eps.
// Those elements are held to an absolute bound (1e-4) instead and reported apart.
// rtol 0 asks for the same bits everywhere, those elements included (two runs that must
// not differ at all, e.g. with and without --keep-mlp-activations).
#include <cmath>
#include <cstdio>
#include <string>

#include "checkpoint/checkpoint.h"
#include "model/gpt_model.h"
#include "optim/optimizer.h"

using namespace mcpp;

struct Loaded {
  std::unique_ptr<model::GPTModel> model;
  std::unique_ptr<optim::AdamW> opt;
  checkpoint::TrainingState st;
};

static Loaded load(const std::string& dir) {
  Loaded l;
  const auto md = checkpoint::read_metadata(dir);
  model::TransformerConfig c = checkpoint::model_config_from_metadata(md);
  c.tp_size = 1, c.tp_rank = 0, c.sequence_parallel = false;
  l.model = std::make_unique<model::GPTModel>(c);
  // The optimizer whose moments the checkpoint holds (SGD and Lion: exp_avg alone; Muon:
  // its momentum beside the scalar rule's moments; adaptive Muon: and its second moment).
  optim::OptimizerConfig oc;
  const std::string rule = md.value("optimizer", std::string("adam"));
  const bool lion = rule == "lion" || rule.ends_with("muon_lion");
  oc.rule = rule == "sgd" ? optim::UpdateRule::Sgd
            : lion        ? optim::UpdateRule::Lion
                          : optim::UpdateRule::Adam;
  l.opt = std::make_unique<optim::AdamW>(l.model->params(), oc);
  // adaptive Muon: its second moment where Adam's is, with either scalar rule
  optim::MuonConfig mc;
  mc.adaptive = rule.rfind("adaptive_muon", 0) == 0;
  if (rule.rfind("muon", 0) == 0 || mc.adaptive) l.opt->enable_muon(mc, {});
  l.st = checkpoint::load_checkpoint(dir, std::nullopt, *l.model, l.opt.get());
  return l;
}

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: ckpt_compare A B [rtol]\n");
    return 2;
  }
  const double rtol = argc > 3 ? std::atof(argv[3]) : 1e-5;
  const bool exact = rtol == 0;
  try {
    Loaded a = load(argv[1]), b = load(argv[2]);
    if (a.st.iteration != b.st.iteration) {
      std::printf("FAIL: iterations differ: %lld vs %lld\n", (long long)a.st.iteration,
                  (long long)b.st.iteration);
      return 1;
    }
    const auto& P = a.model->params();
    const auto& cfg = a.model->config();
    const int64_t HD = cfg.kv_channels, hpg = cfg.heads_per_group(), group = (hpg + 2) * HD;
    auto is_key_bias = [&](const std::string& name, int64_t k) {
      const int64_t j = k % group;
      return name.ends_with("linear_qkv.bias") && j >= hpg * HD && j < (hpg + 1) * HD;
    };
    double key_bias_worst = 0;
    double worst = 0;
    std::string worst_name;
    int failed = 0;
    for (size_t i = 0; i < P.infos().size(); ++i) {
      const auto& p = P.infos()[i];
      for (int what = 0; what < (a.opt->exp_avg_sq().defined() ? 3 : 2); ++what) {
        auto pick = [&](Loaded& l) {
          const Tensor& flat = what == 0 ? l.model->params().flat_params()
                               : what == 1 ? l.opt->exp_avg() : l.opt->exp_avg_sq();
          return flat.narrow(p.offset, p.numel());
        };
        Tensor ta = pick(a), tb = pick(b);
        const float* x = ta.data<float>();
        const float* y = tb.data<float>();
        double diff = 0, mag = 0;
        for (int64_t k = 0; k < ta.numel(); ++k) {
          if (!exact && is_key_bias(p.name, k)) {
            key_bias_worst = std::max(key_bias_worst, std::fabs(double(x[k]) - double(y[k])));
            continue;
          }
          diff = std::max(diff, std::fabs(double(x[k]) - double(y[k])));
          mag = std::max(mag, std::fabs(double(y[k])));
        }
        const double rel = mag > 0 ? diff / mag : diff;
        const char* kind = what == 0 ? "param" : what == 1 ? "exp_avg" : "exp_avg_sq";
        if (rel > worst) worst = rel, worst_name = p.name + " (" + kind + ")";
        if (rel > rtol) {
          ++failed;
          std::printf("FAIL: %s %s: max|a-b| = %.3e, max|b| = %.3e, relative %.3e > %.1e\n",
                      p.name.c_str(), kind, diff, mag, rel, rtol);
        }
      }
    }
    if (key_bias_worst > 1e-4) {
      ++failed;
      std::printf("FAIL: key bias differs by %.3e > 1e-4 absolute\n", key_bias_worst);
    }
    if (!exact)
      std::printf("key bias (zero true gradient): max |a-b| = %.3e (bound 1e-4)\n", key_bias_worst);
    std::printf("%s: %zu tensors x %d compared at iteration %lld, worst relative difference "
                "%.3e (%s)\n",
                failed ? "FAIL" : "ok", P.infos().size(), a.opt->exp_avg_sq().defined() ? 3 : 2,
                (long long)a.st.iteration, worst,
                worst_name.c_str());
    return failed ? 1 : 0;
  } catch (const std::exception& e) {
    std::printf("FAIL: %s\n", e.what());
    return 1;
  }
}
