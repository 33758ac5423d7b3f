// megatron_import.h's convert_to_checkpoint: a Megatron-LM checkpoint -> a megatron.cpp one.
#include <cstring>
#include <memory>

#include "base/error.h"
#include "base/log.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/megatron/megatron_import.h"
#include "model/gpt_model.h"
#include "optim/lr_scheduler.h"
#include "optim/optimizer.h"

namespace mcpp::checkpoint::megatron {

Imported convert_to_checkpoint(const std::string& src, std::optional<int64_t> iteration,
                               const std::string& save_dir, bool load_optim) {
  std::optional<Detected> d = detect(src, iteration);
  MCPP_CHECK_HINT(d.has_value(),
                  "give the folder Megatron-LM saved into (holding latest_checkpointed_"
                  "iteration.txt and iter_N/), or an iter_N/ folder of it; --ckpt-step N picks "
                  "another iteration",
                  "{} holds no Megatron-LM checkpoint: neither iter_N/mp_rank_*/"
                  "model_optim_rng.pt (legacy) nor iter_N/.metadata + metadata.json (torch_dist)",
                  src);
  log::info("reading {} ({} layout, iteration {}, {} file(s))", d->iter_dir,
            layout_name(d->layout), d->iteration, d->files.size());
  d->load_optim = load_optim;
  Imported im = read(*d);
  for (const auto& n : im.notes) log::warn("{}", n);
  model::GPTModel m(im.config);
  auto& ps = m.params();
  // A bf16/fp16 run's fp32 main params are its precise weights: they are what is saved (as
  // our own checkpoints save the optimizer's main params); the half-precision weights are
  // their rounding.
  const std::map<std::string, Tensor>& values =
      im.optimizer && !im.optimizer->main_params.empty() ? im.optimizer->main_params : im.tensors;
  auto copy = [](const Tensor& from, Tensor to, const std::string& name) {
    MCPP_CHECK(to.dtype() == DType::F32 && to.numel() == from.numel(),
               "internal: {} is not an F32 tensor of {} elements", name, from.numel());
    std::memcpy(to.data<float>(), from.data<float>(), size_t(from.numel()) * sizeof(float));
  };
  for (const auto& p : ps.infos())  // check_against_model / check_optimizer: present, same shape
    copy(values.at(p.name), ps.param(p.name), p.name);
  TrainingState st;
  st.rng_seed = im.config.seed;
  st.config = {{"converted_from_megatron", d->iter_dir},
               {"megatron_iteration", d->iteration},
               {"megatron_layout", layout_name(d->layout)}};
  for (const auto& [k, v] : im.args_given) st.config[k] = v;  // bf16, tokenizer, ... as flags
  std::unique_ptr<optim::AdamW> opt;
  if (im.optimizer) {
    const OptimizerState& os = *im.optimizer;
    opt = std::make_unique<optim::AdamW>(ps, optim::OptimizerConfig{os.beta1, os.beta2, os.eps});
    for (const auto& p : ps.infos()) {
      copy(os.exp_avg.at(p.name), opt->exp_avg().narrow(p.offset, p.numel()), p.name);
      copy(os.exp_avg_sq.at(p.name), opt->exp_avg_sq().narrow(p.offset, p.numel()), p.name);
    }
    opt->set_steps(os.step);
    // the betas and eps of the saved param groups, as the flags that go with the moments
    st.config["adam_beta1"] = fmt::format("{}", os.beta1);
    st.config["adam_beta2"] = fmt::format("{}", os.beta2);
    st.config["adam_eps"] = fmt::format("{}", os.eps);
    // Megatron's iteration and counters: --load resumes where Megatron stopped.
    st.iteration = d->iteration == "release" ? 0 : std::stoll(d->iteration);
    st.rng_iteration = st.iteration;
    st.consumed_train_samples = os.consumed_train_samples;
    st.consumed_valid_samples = os.consumed_valid_samples;
    st.num_floating_point_operations_so_far = os.flops_so_far;
    st.optimizer_steps = os.step;
    st.grad_scaler = os.grad_scaler;  // fp16: --load OUT continues the loss scale
    if (os.has_scheduler) st.scheduler = scheduler_state(os);
    log::info("imported the Adam state (step {}, betas {} {}, eps {}){}{}: --load OUT resumes "
              "at iteration {} (pass Megatron's optimizer and LR flags; dropout masks differ "
              "from Megatron's, whose RNG states have no counterpart here)",
              os.step, os.beta1, os.beta2, os.eps,
              os.main_params.empty() ? "" : ", the fp32 main params as the weights",
              os.has_scheduler ? ", the LR scheduler's state" : "", st.iteration);
  } else if (im.had_optimizer && !load_optim) {
    log::info("--no-load-optim: the optimizer state of {} is left out (weights only)", d->iter_dir);
  } else if (im.had_optimizer) {
    log::warn("{}; weights are imported, the optimizer state is not (the Adam moments restart "
              "from zero): train on with --load OUT --finetune (or --no-load-optim)",
              im.optimizer_skipped);
  }
  save_checkpoint(save_dir, m, opt.get(), st);
  log::info("imported {} ({} layers, hidden {}, padded vocab {}, from TP {} x PP {}) into {}",
            d->iter_dir, im.config.num_layers, im.config.hidden_size,
            im.config.padded_vocab_size, im.source_tp, im.source_pp, save_dir);
  return im;
}

}  // namespace mcpp::checkpoint::megatron
