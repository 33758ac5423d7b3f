// Writes the Hugging Face golden fixtures: for each tiny golden model (perturbed weights),
// <out>/<gpt2|llama|qwen2|qwen3|mistral>/ holds the HF export (model.safetensors, config.json)
// and ours.safetensors (the batch's tokens [B, S] and our f32 logits [S, B, Vp]).
// check_hf_export.py then runs an independent PyTorch implementation of the HF architectures
// on the export and writes reference_logits.safetensors and check.json next to them.
//   build/tests/golden/golden_hf_export tests/golden/hf && /usr/bin/python3 \
//     tests/golden/check_hf_export.py tests/golden/hf
#include <cstdio>
#include <filesystem>

#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "golden_models.h"

using namespace mcpp;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: golden_hf_export OUT_DIR\n");
    return 1;
  }
  for (std::string fam : {"gpt", "llama", "qwen2", "qwen3", "mistral"}) {
    auto cfg = golden::golden_config(fam, DType::F32);
    model::GPTModel m(cfg);
    golden::perturb(m.params());
    auto mb = golden::golden_batch();
    model::StepKeys keys;
    keys.training = false;
    m.forward(mb, keys);
    const std::string dir = std::string(argv[1]) + "/" + (fam == "gpt" ? "gpt2" : fam);
    std::filesystem::create_directories(dir);
    // Mistral is the Llama layout without biases: exported as MistralForCausalLM on request.
    checkpoint::export_hf(dir, cfg, m.params(), DType::F32, fam == "mistral" ? "mistral" : "");
    checkpoint::save_safetensors(dir + "/ours.safetensors",
                                 {{"tokens", mb.tokens}, {"logits", m.logits().clone()}});
    std::printf("wrote %s\n", dir.c_str());
  }
  return 0;
}
