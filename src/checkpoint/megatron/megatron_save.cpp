// megatron_import.h's convert_to_checkpoint: a Megatron-LM checkpoint -> a megatron.cpp one.
#include <cstring>

#include "base/error.h"
#include "base/log.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/megatron/megatron_import.h"
#include "model/gpt_model.h"

namespace mcpp::checkpoint::megatron {

Imported convert_to_checkpoint(const std::string& src, std::optional<int64_t> iteration,
                               const std::string& save_dir) {
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
  Imported im = read(*d);
  for (const auto& n : im.notes) log::warn("{}", n);
  model::GPTModel m(im.config);
  auto& ps = m.params();
  for (const auto& p : ps.infos()) {
    const Tensor& from = im.tensors.at(p.name);  // check_against_model: present, same shape
    Tensor to = ps.param(p.name);
    MCPP_CHECK(to.dtype() == DType::F32 && to.numel() == from.numel(),
               "internal: parameter {} is not an F32 tensor of {} elements", p.name, from.numel());
    std::memcpy(to.data<float>(), from.data<float>(), size_t(from.numel()) * sizeof(float));
  }
  if (im.had_optimizer)
    log::warn("{} holds optimizer state; it is not imported (the Adam moments restart from "
              "zero): train on with --load OUT --finetune (or --no-load-optim)",
              d->iter_dir);
  TrainingState st;  // iteration 0: a starting point, as convert --from-hf writes
  st.rng_seed = im.config.seed;
  st.config = {{"converted_from_megatron", d->iter_dir},
               {"megatron_iteration", d->iteration},
               {"megatron_layout", layout_name(d->layout)}};
  save_checkpoint(save_dir, m, nullptr, st);
  log::info("imported {} ({} layers, hidden {}, padded vocab {}, from TP {} x PP {}) into {}",
            d->iter_dir, im.config.num_layers, im.config.hidden_size,
            im.config.padded_vocab_size, im.source_tp, im.source_pp, save_dir);
  return im;
}

}  // namespace mcpp::checkpoint::megatron
