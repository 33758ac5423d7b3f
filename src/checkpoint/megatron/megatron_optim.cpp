// The optimizer state of Megatron-LM's legacy checkpoints (megatron_import.h).
//
// What a model_optim_rng.pt holds under 'optimizer' with the non-distributed optimizer
// (megatron/core/optimizer/optimizer.py; one optimizer: ChainedOptimizer.state_dict() is that
// optimizer's):
//   * FP32Optimizer (fp32 runs): torch's Optimizer.state_dict() itself, {state, param_groups};
//   * Float16OptimizerWithFloat16Params (bf16/fp16): {optimizer: torch's state dict,
//     grad_scaler, fp32_from_fp16_params: per group, the fp32 main params of the group's
//     half-precision parameters, in the group's order}.
// torch numbers the parameters of its state dict group after group; param_groups[g]['params']
// lists the numbers of group g's parameters and state maps a number to {exp_avg, exp_avg_sq,
// step} (torch Adam: step per parameter; apex / Transformer Engine FusedAdam: step per group;
// newer Megatron may fold equal steps into state['common_step']). Which parameter a number
// is: legacy_param_slots (the grouping rule of _get_param_groups).
#include <algorithm>
#include <cmath>
#include <set>
#include <tuple>

#include "base/error.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/megatron/torch_pickle.h"

namespace mcpp::checkpoint::megatron {

using K = Value::Kind;

namespace {

// A Dict's value under an integer key (torch's state dict numbers), or null.
const Value* get_int(const Value& d, int64_t k) {
  for (const auto& [kv, v] : d.entries)
    if (kv->is(K::Int) && kv->i == k) return v.get();
  return nullptr;
}

double number(const Value& v, const std::string& what) {
  MCPP_CHECK(v.is(K::Float) || v.is(K::Int), "{} is a {}, expected a number", what, v.describe());
  return v.is(K::Float) ? v.f : double(v.i);
}

const char* kHint = "the import reads Megatron's standard parameter groups; convert the "
                    "weights alone with --no-load-optim and train on with --finetune";

}  // namespace

bool megatron_no_weight_decay(const std::string& key, size_t dims, bool qk_norm_decay) {
  const bool qk_norm = key.find("q_layernorm.") != std::string::npos ||
                       key.find("k_layernorm.") != std::string::npos;
  return (key.ends_with(".bias") || dims == 1) && !(qk_norm_decay && qk_norm);
}

std::vector<ParamSlot> legacy_param_slots(const Value& groups, const std::vector<RankParam>& params,
                                          const std::string& what, bool qk_norm_decay) {
  auto no_weight_decay = [&](const RankParam& p) {
    return megatron_no_weight_decay(p.key, p.shape.size(), qk_norm_decay);
  };
  MCPP_CHECK(groups.is(K::List) && !groups.items.empty(),
             "{}: optimizer param_groups is a {}, expected a non-empty list", what,
             groups.describe());
  // The parameters each group must hold, in named_parameters() order.
  std::vector<size_t> decay, no_decay;
  for (size_t i = 0; i < params.size(); ++i)
    (no_weight_decay(params[i]) ? no_decay : decay).push_back(i);
  std::vector<ParamSlot> slots(params.size(), ParamSlot{-1, -1, -1});
  std::set<int64_t> indices;
  bool seen[2] = {false, false};
  for (size_t g = 0; g < groups.items.size(); ++g) {
    const Value& pg = *groups.items[g];
    const std::string gw = fmt::format("{}: optimizer param_groups[{}]", what, g);
    MCPP_CHECK(pg.is(K::Dict), "{} is a {}, expected a dict", gw, pg.describe());
    const Value* wd = pg.get("wd_mult");
    MCPP_CHECK_HINT(wd, kHint,
                    "{} has no 'wd_mult': not the parameter groups of Megatron-Core's optimizer",
                    gw);
    const double wd_mult = number(*wd, gw + ".wd_mult");
    if (const Value* lm = pg.get("lr_mult"))
      MCPP_CHECK_HINT(number(*lm, gw + ".lr_mult") == 1.0, kHint,
                      "{} has lr_mult {} (a per-parameter LR override megatron.cpp does not map)",
                      gw, number(*lm, ""));
    for (const char* flag : {"is_expert_parallel", "is_decoupled_lr"})
      if (const Value* f = pg.get(flag))
        MCPP_CHECK_HINT(!(f->is(K::Bool) && f->b), kHint,
                        "{} is an {} group, which the import does not map", gw, flag);
    const bool nd = wd_mult == 0.0;
    MCPP_CHECK_HINT(!seen[nd], kHint, "{} is a second group with wd_mult {}", gw, wd_mult);
    seen[nd] = true;
    const std::vector<size_t>& members = nd ? no_decay : decay;
    const Value* ids = pg.get("params");
    MCPP_CHECK(ids && ids->is(K::List), "{} has no 'params' list", gw);
    MCPP_CHECK_HINT(ids->items.size() == members.size(),
                    "a rank file's model and optimizer state do not belong together, or the "
                    "run grouped parameters differently (--no-weight-decay-cond ...)",
                    "{} lists {} parameters, but the rank's model has {} {} parameters", gw,
                    ids->items.size(), members.size(),
                    nd ? "bias / 1-D (no weight decay)" : "weight-decayed");
    for (size_t j = 0; j < members.size(); ++j) {
      const Value& id = *ids->items[j];
      MCPP_CHECK(id.is(K::Int) && id.i >= 0, "{}.params[{}] is a {}, expected a parameter number",
                 gw, j, id.describe());
      MCPP_CHECK(indices.insert(id.i).second, "{}.params[{}]: parameter number {} appears twice",
                 gw, j, id.i);
      slots[members[j]] = ParamSlot{int64_t(g), int64_t(j), id.i};
    }
  }
  for (size_t i = 0; i < params.size(); ++i)
    MCPP_CHECK_HINT(slots[i].group >= 0, kHint,
                    "{}: no optimizer param group holds '{}' ({})", what, params[i].key,
                    no_weight_decay(params[i]) ? "no weight decay" : "weight-decayed");
  return slots;
}

void read_rank_optimizer(const Value& root, const TorchFile& tf,
                         const std::vector<RankParam>& params, int64_t tp, int64_t T,
                         const std::string& path, bool qk_norm_decay, OptimizerShards& out) {
  const Value* opt = root.get("optimizer");
  MCPP_CHECK_HINT(opt && opt->is(K::Dict),
                  "a ChainedOptimizer of several optimizers saves a list; convert the weights "
                  "alone with --no-load-optim",
                  "{}: 'optimizer' is a {}, expected a dict", path,
                  opt ? opt->describe() : "missing entry");
  // Float16OptimizerWithFloat16Params wraps torch's state dict; FP32Optimizer is it.
  const Value* tsd = opt->get("optimizer");
  const Value* mains = nullptr;
  if (tsd) {
    mains = opt->get("fp32_from_fp16_params");
    if (!mains) mains = opt->get("fp32_from_fp16");  // older releases' key
  } else {
    tsd = opt;
  }
  const std::string ow = path + ": optimizer";
  MCPP_CHECK(tsd->is(K::Dict), "{}: the torch optimizer state is a {}", ow, tsd->describe());
  const Value* state = tsd->get("state");
  const Value* groups = tsd->get("param_groups");
  MCPP_CHECK_HINT(state && groups && state->is(K::Dict),
                  "a ChainedOptimizer of several optimizers is not imported; convert the "
                  "weights alone with --no-load-optim and train on with --finetune",
                  "{} has no 'state' dict and 'param_groups' (torch.optim state dict)", ow);
  const std::vector<ParamSlot> slots = legacy_param_slots(*groups, params, path, qk_norm_decay);

  // The step: per parameter (torch Adam), per group (FusedAdam) or common_step; one value.
  auto take_step = [&](const Value& v, const std::string& where) {
    int64_t s;
    if (v.is(K::Tensor)) {
      MCPP_CHECK(v.shape.empty() || (v.shape.size() == 1 && v.shape[0] == 1),
                 "{} is a tensor of shape {}, expected a scalar", where, shape_str(v.shape));
      const Tensor t = tf.tensor(v, DType::F64, where);
      const double d = t.data<double>()[0];
      MCPP_CHECK(d >= 0 && d < 1e15 && d == std::floor(d), "{} is {}, expected a step count",
                 where, d);
      s = int64_t(d);
    } else {
      const double d = number(v, where);
      MCPP_CHECK(d >= 0 && d < 1e15 && d == std::floor(d), "{} is {}, expected a step count",
                 where, d);
      s = int64_t(d);
    }
    MCPP_CHECK_HINT(!out.step || *out.step == s,
                    "Megatron steps every parameter together; the file is damaged or not "
                    "Megatron's",
                    "{} is {}, but another parameter's step is {}", where, s, *out.step);
    out.step = s;
  };
  if (const Value* cs = state->get("common_step")) take_step(*cs, ow + ".state['common_step']");
  for (size_t g = 0; g < groups->items.size(); ++g) {
    const Value& pg = *groups->items[g];
    if (const Value* s = pg.get("step"); s && !s->is(K::None))
      take_step(*s, fmt::format("{}.param_groups[{}]['step']", ow, g));
    if (!out.betas_eps) {
      const Value* b = pg.get("betas");
      const Value* e = pg.get("eps");
      if (b && e && (b->is(K::Tuple) || b->is(K::List)) && b->items.size() == 2)
        out.betas_eps = std::array<double, 3>{number(*b->items[0], ow + " betas"),
                                              number(*b->items[1], ow + " betas"),
                                              number(*e, ow + " eps")};
    }
  }
  if (mains) {
    MCPP_CHECK(mains->is(K::List) && mains->items.size() == groups->items.size(),
               "{}: fp32_from_fp16_params is a {} of {} entries, expected a list per param "
               "group ({})",
               ow, mains->describe(), mains->items.size(), groups->items.size());
  }
  auto put = [&](std::map<std::string, std::vector<Tensor>>& m, const RankParam& p, Tensor t) {
    auto& v = m[p.name];
    v.resize(size_t(T));
    // the tied output layer's copy on the last stage shares the embedding's name: first wins
    if (!v[size_t(tp)].defined()) v[size_t(tp)] = std::move(t);
  };
  // Float16Optimizer: fp32_from_fp16_params[g] holds the group's half-precision parameters.
  std::vector<int64_t> half_pos(params.size(), -1);
  if (mains) {
    std::vector<int64_t> count(groups->items.size(), 0);
    std::vector<size_t> order(params.size());
    for (size_t i = 0; i < params.size(); ++i) order[i] = i;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::tie(slots[a].group, slots[a].position) < std::tie(slots[b].group, slots[b].position);
    });
    for (size_t i : order)
      if (params[i].dtype == DType::BF16 || params[i].dtype == DType::F16)
        half_pos[i] = count[size_t(slots[i].group)]++;
    for (size_t g = 0; g < count.size(); ++g) {
      const Value& lst = *mains->items[g];
      MCPP_CHECK(lst.is(K::List) && int64_t(lst.items.size()) == count[g],
                 "{}: fp32_from_fp16_params[{}] holds {} tensors, the group has {} "
                 "half-precision parameters",
                 ow, g, lst.is(K::List) ? lst.items.size() : 0, count[g]);
    }
  }
  for (size_t i = 0; i < params.size(); ++i) {
    const RankParam& p = params[i];
    const ParamSlot& s = slots[i];
    const std::string pw = fmt::format("{}.state[{}] ('{}')", ow, s.index, p.key);
    const Value* st = get_int(*state, s.index);
    MCPP_CHECK_HINT(st && st->is(K::Dict),
                    "a checkpoint saved before the first optimizer step has no moments: "
                    "convert the weights alone with --no-load-optim",
                    "{} is missing", pw);
    for (const char* k : {"exp_avg", "exp_avg_sq"}) {
      const Value* t = st->get(k);
      MCPP_CHECK_HINT(t && t->is(K::Tensor), "the import reads Adam's state (--optimizer adam)",
                      "{} has no tensor '{}'", pw, k);
      MCPP_CHECK(t->shape == p.shape, "{}['{}'] has shape {}, the parameter {}", pw, k,
                 shape_str(t->shape), shape_str(p.shape));
      put(std::string(k) == "exp_avg" ? out.exp_avg : out.exp_avg_sq, p, tf.tensor(*t, DType::F32, pw + "." + k));
    }
    if (const Value* sv = st->get("step")) take_step(*sv, pw + "['step']");
    if (half_pos[i] >= 0) {
      const Value& m = *mains->items[size_t(s.group)]->items[size_t(half_pos[i])];
      const std::string mw =
          fmt::format("{}: fp32_from_fp16_params[{}][{}] ('{}')", ow, s.group, half_pos[i], p.key);
      MCPP_CHECK(m.is(K::Tensor) && m.shape == p.shape, "{} is a {} of shape {}, the parameter {}",
                 mw, m.describe(), m.is(K::Tensor) ? shape_str(m.shape) : "-", shape_str(p.shape));
      put(out.main_params, p, tf.tensor(m, DType::F32, mw));
    }
  }
  MCPP_CHECK_HINT(out.step.has_value(), "the import reads Adam's state (--optimizer adam)",
                  "{}: no step count (neither per parameter, per group nor common_step)", ow);
  // fp16: the loss scaler (megatron/core/optimizer/grad_scaler.py DynamicGradScaler), the
  // same on every rank; a resume continues with its scale and trackers.
  const Value* gs = opt->get("grad_scaler");
  if (gs && !gs->is(K::None) && out.grad_scaler.empty()) {
    const std::string gw = ow + " grad_scaler";
    MCPP_CHECK(gs->is(K::Dict), "{} is a {}, expected a dict", gw, gs->describe());
    const Value* sc = gs->get("scale");
    MCPP_CHECK(sc && (sc->is(K::Tensor) || sc->is(K::Float) || sc->is(K::Int)),
               "{} has no 'scale'", gw);
    double scale;
    if (sc->is(K::Tensor)) {
      MCPP_CHECK(sc->shape.empty() || (sc->shape.size() == 1 && sc->shape[0] == 1),
                 "{}['scale'] has shape {}, expected one value", gw, shape_str(sc->shape));
      scale = double(tf.tensor(*sc, DType::F32, gw + "['scale']").data<float>()[0]);
    } else {
      scale = number(*sc, gw + "['scale']");
    }
    MCPP_CHECK(std::isfinite(scale) && scale > 0, "{}['scale'] is {}, expected a positive number",
               gw, scale);
    auto tracker = [&](const char* k) {
      const Value* t = gs->get(k);
      MCPP_CHECK(t && t->is(K::Int) && t->i >= 0, "{}['{}'] is {}, expected a count", gw, k,
                 t ? t->describe() : "missing");
      return t->i;
    };
    out.grad_scaler = {{"scale", scale},
                       {"growth_tracker", tracker("growth_tracker")},
                       {"hysteresis_tracker", tracker("hysteresis_tracker")}};
  }
}

void read_scheduler(const Value& root, const std::string& path, OptimizerState& out) {
  if (const Value* it = root.get("args")) {
    if (const Value* c = it->get("consumed_train_samples"); c && c->is(K::Int) && c->i >= 0)
      out.consumed_train_samples = c->i;
    if (const Value* c = it->get("consumed_valid_samples"); c && c->is(K::Int) && c->i >= 0)
      out.consumed_valid_samples = c->i;
  }
  if (const Value* f = root.get("num_floating_point_operations_so_far");
      f && (f->is(K::Float) || f->is(K::Int)))
    out.flops_so_far = number(*f, path);
  const Value* s = root.get("opt_param_scheduler");
  if (!s || !s->is(K::Dict)) return;
  const std::string sw = path + ": opt_param_scheduler";
  auto num = [&](const char* k) -> std::optional<double> {
    const Value* v = s->get(k);
    if (!v || v->is(K::None)) return std::nullopt;
    const double d = number(*v, sw + "." + k);
    MCPP_CHECK(std::isfinite(d) && d >= 0, "{}.{} is {}", sw, k, d);
    return d;
  };
  auto str = [&](const char* k) -> std::string {
    const Value* v = s->get(k);
    MCPP_CHECK(v && v->is(K::Str), "{}.{} is {}, expected a string", sw, k,
               v ? v->describe() : "missing");
    return v->s;
  };
  const auto max_lr = num("max_lr"), min_lr = num("min_lr"), warm = num("lr_warmup_steps"),
             decay = num("lr_decay_steps"), steps = num("num_steps");
  if (!max_lr || !min_lr || !warm || !decay || !steps) return;  // an older layout: not mapped
  out.has_scheduler = true;
  out.max_lr = *max_lr, out.min_lr = *min_lr, out.lr_warmup_steps = *warm;
  out.lr_decay_steps = int64_t(*decay), out.num_steps = int64_t(*steps);
  out.lr_decay_style = str("lr_decay_style");
  out.start_wd = num("start_wd").value_or(0), out.end_wd = num("end_wd").value_or(0);
  out.wd_incr_steps = int64_t(num("wd_incr_steps").value_or(0));
  out.wd_incr_style = s->get("wd_incr_style") ? str("wd_incr_style") : "constant";
}

}  // namespace mcpp::checkpoint::megatron

namespace mcpp::checkpoint::megatron {

void check_optimizer(Imported& im, const std::string& what) {
  if (!im.optimizer) return;
  OptimizerState& os = *im.optimizer;
  const bool half = !os.main_params.empty();
  for (auto* m : {&os.exp_avg, &os.exp_avg_sq, &os.main_params}) {
    if (im.config.tie_embeddings) m->erase("output_layer.weight");  // the last stage's copy
    if (m == &os.main_params && !half) continue;  // fp32 run: the weights are the main params
    const char* part = m == &os.exp_avg ? "exp_avg" : m == &os.exp_avg_sq ? "exp_avg_sq"
                                                                         : "fp32_from_fp16_params";
    for (const auto& [name, t] : im.tensors) {
      auto it = m->find(name);
      MCPP_CHECK_HINT(it != m->end(), "convert the weights alone with --no-load-optim",
                      "{}: the optimizer state ({}) has nothing for '{}'", what, part, name);
      MCPP_CHECK(it->second.shape() == t.shape(),
                 "{}: the optimizer's {} of '{}' has shape {} after merging the ranks, the "
                 "parameter {}",
                 what, part, name, shape_str(it->second.shape()), shape_str(t.shape()));
    }
    MCPP_CHECK(m->size() == im.tensors.size(), "{}: the optimizer state ({}) has {} tensors, the "
               "model {}", what, part, m->size(), im.tensors.size());
  }
  // Megatron copies the main params to the model after every step, so the stored bf16/fp16
  // weights are their rounding: within 2^-8 relative (bf16's half ulp is 2^-9) where the
  // weight is normal. A main param that is not is another parameter's: the mapping or the file
  // is wrong. Said, not refused (the main params are what the run would continue from).
  std::vector<std::string> off;
  for (const auto& [name, w] : im.tensors) {
    if (!half) break;
    const float* a = w.data<float>();
    const float* b = os.main_params.at(name).data<float>();
    for (int64_t i = 0; i < w.numel(); ++i)
      if (std::abs(double(a[i]) - double(b[i])) > std::ldexp(std::abs(double(a[i])), -8) + 1e-30 &&
          std::abs(a[i]) > 1e-30f) {
        off.push_back(name);
        break;
      }
  }
  if (!off.empty())
    im.notes.push_back(fmt::format(
        "{}: the fp32 main params of {} tensor(s) (first '{}') do not round to the stored "
        "half-precision weights; the main params are used: check the checkpoint, or convert "
        "with --no-load-optim to take the weights",
        what, off.size(), off.front()));
}

optim::SchedulerState scheduler_state(const OptimizerState& os) {
  optim::SchedulerState sc;
  sc.max_lr = os.max_lr, sc.min_lr = os.min_lr, sc.lr_warmup_steps = os.lr_warmup_steps;
  sc.lr_decay_steps = os.lr_decay_steps, sc.num_steps = os.num_steps;
  sc.lr_decay_style = optim::parse_lr_decay_style(os.lr_decay_style);
  sc.start_wd = os.start_wd, sc.end_wd = os.end_wd, sc.wd_incr_steps = os.wd_incr_steps;
  sc.wd_incr_style = optim::parse_wd_incr_style(os.wd_incr_style);
  return sc;
}

}  // namespace mcpp::checkpoint::megatron
