// `megatron convert`: megatron.cpp checkpoint <-> Hugging Face folder.
//   megatron convert --load DIR [--ckpt-step N] --to-hf OUT_DIR [--hf-dtype
//   float32|bfloat16|float16] megatron convert --from-hf HF_DIR --save DIR
//   [--make-vocab-size-divisible-by N]
//   megatron convert --from-megatron MEGATRON_DIR [--ckpt-step N] --save DIR
//   megatron convert --to-megatron --load DIR [--ckpt-step N] --save MEGATRON_DIR
//   [--target-tensor-parallel-size T] [--target-pipeline-parallel-size P] [--no-save-optim]
//   [--transformer-impl local|transformer_engine]
// The model shape comes from the checkpoint's metadata.json or the HF config.json; loading
// reshards, so a checkpoint of any TP layout converts.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>

#include "base/error.h"
#include "base/log.h"
#include "checkpoint/fs.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/weights.h"
#include "checkpoint/hf.h"
#include "checkpoint/megatron/megatron_export.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/tokenizer_files.h"
#include "model/gpt_model.h"
#include "tools/commands.h"

namespace {

using namespace mcpp;

const char* kUsage =
    "usage: megatron convert --load DIR [--ckpt-step N] --to-hf OUT_DIR [--hf-dtype DTYPE]\n"
    "                        [--hf-model-type TYPE] [--drop-mtp-layers]\n"
    "                        [--vocab-file F --merge-file F | --tokenizer-model F]\n"
    "       megatron convert --from-hf HF_DIR --save DIR [--make-vocab-size-divisible-by N]\n"
    "       megatron convert --from-megatron MEGATRON_DIR [--ckpt-step N] [--no-load-optim]\n"
    "                        --save DIR\n"
    "       megatron convert --to-megatron --load DIR [--ckpt-step N] --save MEGATRON_DIR\n"
    "                        [--target-tensor-parallel-size T]\n"
    "                        [--target-pipeline-parallel-size P]\n"
    "                        [--transformer-impl local|transformer_engine] [--no-save-optim]\n\n"
    "  --to-hf OUT_DIR   write OUT_DIR/model.safetensors and config.json (GPT2LMHeadModel,\n"
    "                    LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM,\n"
    "                    MixtralForCausalLM or Qwen3MoeForCausalLM, chosen from the model's\n"
    "                    architecture)\n"
    "  --hf-model-type TYPE  with --to-hf: mistral writes a Llama-style model without biases\n"
    "                    as MistralForCausalLM (default: the type the architecture maps to)\n"
    "  --vocab-file, --merge-file, --tokenizer-model, --tokenizer-type\n"
    "                    the tokenizer files to export beside the weights (Hugging Face names);\n"
    "                    default: the files the checkpoint carries (stored by --from-hf); the\n"
    "                    paths a checkpoint records are never followed: an untrusted\n"
    "                    checkpoint could name any local file\n"
    "  --hf-dtype        float32 (default), bfloat16 or float16\n"
    "  --drop-mtp-layers with --to-hf: leave out a model's multi-token prediction layers\n"
    "                    (mtp.layers.*; the exported architectures have no place for them);\n"
    "                    without it such a model is an error, never a silent drop\n"
    "  --from-hf HF_DIR  read a GPT-2, Llama, Mistral, Qwen2, Qwen3, Mixtral or Qwen3-MoE\n"
    "                    folder (config.json + safetensors) and save it\n"
    "                    as iteration 0 of a megatron.cpp checkpoint in --save, with the\n"
    "                    folder's tokenizer files inside it\n"
    "  --make-vocab-size-divisible-by N   vocabulary padding on import (default 128)\n"
    "  --from-megatron DIR  read a Megatron-LM checkpoint (legacy iter_N/mp_rank_*/\n"
    "                    model_optim_rng.pt or torch_dist iter_N/*.distcp; GPT and Llama models;\n"
    "                    any TP x PP) and save it in --save; the model shape comes from the\n"
    "                    checkpoint's args. With the legacy layout's non-distributed optimizer\n"
    "                    state (Adam moments, step, fp32 main params, LR scheduler) the result\n"
    "                    resumes at Megatron's iteration; otherwise it is iteration 0, weights\n"
    "                    only (docs/from-megatron.md)\n"
    "  --no-load-optim   with --from-megatron: the weights alone, as iteration 0\n"
    "  --ckpt-step N     with --from-megatron: iteration N instead of the tracker's\n"
    "  --to-megatron     write the checkpoint of --load in Megatron-LM's legacy layout\n"
    "                    (--ckpt-format torch: iter_N/mp_rank_TT[_PPP]/model_optim_rng.pt and\n"
    "                    the tracker) into --save, for Megatron's training and its\n"
    "                    tools/checkpoint loaders; dense GPT and Llama models; the Adam state as\n"
    "                    Megatron's non-distributed optimizer holds it; no RNG states (Megatron\n"
    "                    loads it with --no-load-rng). --save must be new or empty, or a\n"
    "                    Megatron checkpoint folder without that iteration\n"
    "  --target-tensor-parallel-size T, --target-pipeline-parallel-size P\n"
    "                    with --to-megatron: the Megatron layout to write (default 1 and 1)\n"
    "  --transformer-impl local|transformer_engine\n"
    "                    with --to-megatron: the parameter names of Megatron's local spec or of\n"
    "                    its Transformer Engine spec (default transformer_engine, Megatron's)\n"
    "  --no-save-optim   with --to-megatron: the weights alone (no optimizer, no scheduler)\n";

int64_t to_int(const std::string& flag, const std::string& v) {
  try {
    size_t n = 0;
    int64_t x = std::stoll(v, &n);
    if (n == v.size()) return x;
  } catch (const std::exception&) {
  }
  throw Error(fmt::format("{} expects an integer, got '{}'", flag, v));
}

// Copies the tokenizer files the user names (flags) next to the exported weights, in the
// file names Hugging Face loaders look for. The checkpoint's recorded tokenizer type picks
// the format when --tokenizer-type is not given; its recorded file paths are never opened:
// a downloaded checkpoint naming /etc/shadow as its vocab file must not copy it into a
// folder meant for upload.
void export_tokenizer_files(const nlohmann::json& config, const std::map<std::string, std::string>& f,
                            const std::string& out, int64_t max_positions,
                            const std::optional<checkpoint::TokenizerFiles>& carried) {
  namespace fs = std::filesystem;
  const bool flags = f.count("--vocab-file") || f.count("--merge-file") ||
                     f.count("--tokenizer-model") || f.count("--tokenizer-type");
  // The files the checkpoint carries (stored by `convert --from-hf`, verified on reading)
  // go out as they came in, byte for byte; tokenizer flags override them.
  if (carried && !flags) {
    for (const auto& [name, src] : carried->files)
      fs::copy_file(src, fs::path(out) / name, fs::copy_options::overwrite_existing);
    log::info("exported the checkpoint's {} files ({}) alongside the weights", carried->type,
              carried->files.size());
    return;
  }
  auto recorded = [&](const char* k) -> std::string {
    return config.is_object() && config.contains(k) && config[k].is_string()
               ? config[k].get<std::string>()
               : "";
  };
  auto flag = [&](const char* k) -> std::string { return f.count(k) ? f.at(k) : ""; };
  if (!f.count("--vocab-file") && !f.count("--merge-file") && !f.count("--tokenizer-model")) {
    std::string paths;
    for (const char* k : {"vocab_file", "merge_file", "tokenizer_model"})
      if (!recorded(k).empty()) paths += fmt::format(" {}={}", k, recorded(k));
    log::warn(
        "no tokenizer files exported (the checkpoint carries none): weights and config.json "
        "only; pass --vocab-file and --merge-file (GPT-2 BPE) or --tokenizer-model to add "
        "them{}",
        paths.empty() ? std::string()
                      : "; the paths the checkpoint records are not followed (" + paths.substr(1) +
                            ")");
    return;
  }
  std::string type = flag("--tokenizer-type");
  if (type.empty()) type = recorded("tokenizer_type");
  if (type.empty()) type = f.count("--tokenizer-model") ? "HuggingFaceTokenizer" : "GPT2BPETokenizer";
  auto given = [&](const char* k) -> std::string {  // "vocab_file" -> --vocab-file's value
    std::string name = std::string("--") + k;
    std::replace(name.begin(), name.end(), '_', '-');
    return flag(name.c_str());
  };
  std::vector<std::pair<std::string, std::string>> files;  // source -> name in out
  nlohmann::json tok_cfg = {{"model_max_length", max_positions}};
  if (type == "GPT2BPETokenizer") {
    files = {{given("vocab_file"), "vocab.json"}, {given("merge_file"), "merges.txt"}};
    tok_cfg.update({{"tokenizer_class", "GPT2Tokenizer"}, {"bos_token", "<|endoftext|>"},
                    {"eos_token", "<|endoftext|>"}, {"unk_token", "<|endoftext|>"}});
  } else if (type == "Llama2Tokenizer" || type == "SentencePieceTokenizer") {
    files = {{given("tokenizer_model"), "tokenizer.model"}};
    tok_cfg.update({{"tokenizer_class", "LlamaTokenizer"}});
  } else if (type == "HuggingFaceTokenizer") {
    fs::path p = given("tokenizer_model");
    if (fs::is_directory(p)) {
      for (const char* n : {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"})
        if (fs::exists(p / n)) files.push_back({(p / n).string(), n});
      tok_cfg = nullptr;  // the folder's own tokenizer_config.json is copied
    } else {
      files = {{p.string(), "tokenizer.json"}};
    }
  } else {
    log::warn("tokenizer {} has no Hugging Face file format; no tokenizer files exported", type);
    return;
  }
  for (const auto& [src, name] : files) {
    MCPP_CHECK_HINT(!src.empty() && fs::is_regular_file(src),
                    "pass the tokenizer's files: --vocab-file and --merge-file for GPT-2 BPE, "
                    "--tokenizer-model for SentencePiece or a Hugging Face tokenizer",
                    "tokenizer file for {} not given or not a regular file: '{}' (needed as "
                    "{}/{})",
                    type, src, out, name);
    fs::copy_file(src, fs::path(out) / name, fs::copy_options::overwrite_existing);
  }
  if (!tok_cfg.is_null()) std::ofstream(fs::path(out) / "tokenizer_config.json") << tok_cfg.dump(2);
  log::info("exported the {} files alongside the weights", type);
}

// Megatron-LM's tools/checkpoint/convert.py flags, each answered with what does the same
// here (an error: these flags never half-work).
void megatron_convert_py_flag(const std::string& a) {
  static const std::map<std::string, std::string> kEquivalent = {
      {"--model-type", "the model type comes from the checkpoint (GPT and Llama only); drop it"},
      {"--loader",
       "the source format follows the flag: --load DIR (a megatron.cpp checkpoint), "
       "--from-hf HF_DIR (a Hugging Face folder) or --from-megatron DIR (a Megatron-LM "
       "checkpoint, legacy or torch_dist)"},
      {"--saver",
       "the target format follows the flag: --to-hf OUT_DIR, --to-megatron --save DIR "
       "(Megatron's legacy layout), or --save DIR (with --from-hf)"},
      {"--load-dir",
       "use --load DIR (or --from-hf HF_DIR for a Hugging Face folder, --from-megatron DIR "
       "for a Megatron-LM checkpoint)"},
      {"--save-dir", "use --save DIR (or --to-hf OUT_DIR for a Hugging Face folder)"},
      {"--target-tensor-parallel-size",
       "it picks the layout of --to-megatron's output; megatron.cpp's own checkpoints need no "
       "resharding step: any TP/PP layout loads any checkpoint (train or generate with the "
       "--tensor-model-parallel-size you want)"},
      {"--target-pipeline-parallel-size",
       "it picks the layout of --to-megatron's output; megatron.cpp's own checkpoints need no "
       "resharding step: any TP/PP layout loads any checkpoint"},
      {"--target-expert-parallel-size",
       "no resharding step is needed: the layout is chosen when the checkpoint is loaded"},
      {"--true-vocab-size",
       "the vocabulary padding follows the loading layout automatically (re-padded or "
       "trimmed on load)"},
      {"--megatron-path", "megatron.cpp needs no Python source tree; drop it"},
      {"--max-queue-size", "conversion runs in one process; drop it"},
      {"--checkpoint-type", "the checkpoint's format is read from its metadata; drop it"},
      {"--loader-transformer-impl", "there is one Transformer implementation; drop it"},
      {"--saver-transformer-impl", "there is one Transformer implementation; drop it"},
      {"--no-checking", "drop it: a conversion is always checked"},
  };
  auto it = kEquivalent.find(a);
  if (it == kEquivalent.end()) return;
  throw Error(fmt::format("megatron convert: {} is a flag of Megatron-LM's "
                          "tools/checkpoint/convert.py; megatron.cpp's convert does not take it",
                          a),
              it->second);
}

// --to-megatron: a megatron.cpp checkpoint -> Megatron-LM's legacy layout.
int run_to_megatron(std::map<std::string, std::string>& f) {
  MCPP_CHECK_HINT(f.count("--load") && f.count("--save"), kUsage,
                  "megatron convert --to-megatron needs --load DIR (a megatron.cpp checkpoint) "
                  "and --save MEGATRON_DIR");
  for (const char* k :
       {"--to-hf", "--hf-dtype", "--hf-model-type", "--make-vocab-size-divisible-by",
        "--tokenizer-type", "--vocab-file", "--merge-file", "--tokenizer-model"})
    MCPP_CHECK_HINT(!f.count(k), kUsage,
                    "megatron convert --to-megatron does not take {} (the model, its vocabulary "
                    "padding and the tokenizer settings come from the checkpoint)",
                    k);
  checkpoint::megatron::ExportOptions o;
  o.impl = checkpoint::megatron::TransformerImpl::TransformerEngine;
  if (f.count("--target-tensor-parallel-size"))
    o.tp = to_int("--target-tensor-parallel-size", f["--target-tensor-parallel-size"]);
  if (f.count("--target-pipeline-parallel-size"))
    o.pp = to_int("--target-pipeline-parallel-size", f["--target-pipeline-parallel-size"]);
  MCPP_CHECK_HINT(o.tp >= 1 && o.tp <= 1024 && o.pp >= 1 && o.pp <= 1024,
                  "e.g. --target-tensor-parallel-size 2 --target-pipeline-parallel-size 2",
                  "--target-tensor-parallel-size {} / --target-pipeline-parallel-size {}: both "
                  "must be in [1, 1024]",
                  o.tp, o.pp);
  if (f.count("--transformer-impl")) {
    const std::string t = f["--transformer-impl"];
    MCPP_CHECK_HINT(t == "local" || t == "transformer_engine",
                    "use --transformer-impl local or transformer_engine (the spec the Megatron "
                    "run that loads it uses)",
                    "--transformer-impl '{}' is not a Megatron transformer implementation", t);
    o.impl = t == "local" ? checkpoint::megatron::TransformerImpl::Local
                          : checkpoint::megatron::TransformerImpl::TransformerEngine;
  }
  o.save_optim = !f.count("--no-save-optim");
  std::optional<int64_t> step;
  if (f.count("--ckpt-step")) step = to_int("--ckpt-step", f["--ckpt-step"]);
  MCPP_CHECK_HINT(!step || *step >= 0, kUsage, "--ckpt-step {} is negative", *step);
  const auto t0 = std::chrono::steady_clock::now();
  checkpoint::megatron::export_to_megatron(f["--load"], step, f["--save"], o);
  log::info("wrote {}", checkpoint::size_and_rate(
                            checkpoint::tree_bytes(f["--save"]),
                            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                                .count()));
  return 0;
}

int run_convert(const std::vector<std::string>& argv) {
  std::map<std::string, std::string> f;
  for (size_t i = 0; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (a == "--no-load-optim" || a == "--no-save-optim" || a == "--to-megatron" ||
        a == "--drop-mtp-layers") {  // switches
      f[a] = "1";
      continue;
    }
    if (a == "--target-tensor-parallel-size" || a == "--target-pipeline-parallel-size" ||
        a == "--transformer-impl") {  // --to-megatron's (megatron_convert_py_flag otherwise)
      MCPP_CHECK_HINT(i + 1 < argv.size(), kUsage, "megatron convert: {} needs a value", a);
      f[a] = argv[++i];
      continue;
    }
    static const char* known[] = {
        "--load",           "--ckpt-step",     "--to-hf",
        "--hf-dtype",       "--hf-model-type", "--from-hf",
        "--from-megatron",  "--save",          "--make-vocab-size-divisible-by",
        "--tokenizer-type", "--vocab-file",    "--merge-file",
        "--tokenizer-model"};
    bool ok = false;
    for (const char* k : known) ok |= a == k;
    megatron_convert_py_flag(a);  // Megatron's tools/checkpoint/convert.py: name the equivalent
    MCPP_CHECK_HINT(ok, kUsage, "megatron convert: unknown flag '{}'", a);
    MCPP_CHECK_HINT(i + 1 < argv.size(), kUsage, "megatron convert: {} needs a value", a);
    f[a] = argv[++i];
  }
  MCPP_CHECK_HINT(!f.count("--drop-mtp-layers") || f.count("--to-hf"), kUsage,
                  "megatron convert: --drop-mtp-layers applies to --to-hf only");
  const bool to_hf = f.count("--to-hf"), from_hf = f.count("--from-hf"),
             from_megatron = f.count("--from-megatron"), to_megatron = f.count("--to-megatron");
  if (!to_megatron)
    for (const char* k : {"--target-tensor-parallel-size", "--target-pipeline-parallel-size",
                          "--transformer-impl", "--no-save-optim"}) {
      if (!f.count(k)) continue;
      megatron_convert_py_flag(k);  // convert.py's flags: what does the same here
      MCPP_CHECK_HINT(false, kUsage, "megatron convert: {} applies to --to-megatron only", k);
    }
  MCPP_CHECK_HINT(int(to_hf) + int(from_hf) + int(from_megatron) + int(to_megatron) == 1, kUsage,
                  "megatron convert: give exactly one of --to-hf, --from-hf, --from-megatron "
                  "and --to-megatron");
  MCPP_CHECK_HINT(from_megatron || !f.count("--no-load-optim"), kUsage,
                  "megatron convert: --no-load-optim applies to --from-megatron only");
  if (to_megatron) return run_to_megatron(f);
  if (from_megatron) {
    MCPP_CHECK_HINT(f.count("--save"), kUsage, "megatron convert --from-megatron needs --save DIR");
    for (const char* k :
         {"--load", "--hf-dtype", "--hf-model-type", "--make-vocab-size-divisible-by",
          "--tokenizer-type", "--vocab-file", "--merge-file", "--tokenizer-model"})
      MCPP_CHECK_HINT(!f.count(k), kUsage,
                      "megatron convert --from-megatron does not take {} (the model and its "
                      "vocabulary padding come from the Megatron checkpoint's args)",
                      k);
    std::optional<int64_t> step;
    if (f.count("--ckpt-step")) step = to_int("--ckpt-step", f["--ckpt-step"]);
    MCPP_CHECK_HINT(!step || *step >= 0, kUsage, "--ckpt-step {} is negative", *step);
    const auto t0 = std::chrono::steady_clock::now();
    checkpoint::megatron::convert_to_checkpoint(f["--from-megatron"], step, f["--save"],
                                                !f.count("--no-load-optim"));
    log::info("read {:.3f} GB of Megatron files; wrote the checkpoint: {}",
              double(checkpoint::tree_bytes(f["--from-megatron"])) / 1e9,
              checkpoint::size_and_rate(
                  checkpoint::tree_bytes(f["--save"]),
                  std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
    return 0;
  }

  if (to_hf) {
    MCPP_CHECK_HINT(f.count("--load"), kUsage, "megatron convert --to-hf needs --load DIR");
    std::optional<int64_t> step;
    if (f.count("--ckpt-step")) step = to_int("--ckpt-step", f["--ckpt-step"]);
    DType dt = DType::F32;
    if (f.count("--hf-dtype")) {
      const std::string s = f["--hf-dtype"];
      dt = s == "float32"    ? DType::F32
           : s == "bfloat16" ? DType::BF16
           : s == "float16"  ? DType::F16
                             : DType::U8;
      MCPP_CHECK_HINT(dt != DType::U8, "use float32, bfloat16 or float16",
                      "--hf-dtype '{}' is not supported", s);
    }
    MCPP_CHECK_HINT(!step || *step >= 0, kUsage, "--ckpt-step {} is negative", *step);
    // The iteration the tracker (or --ckpt-step) names; its metadata must agree with it.
    // Weights only, f32 (checkpoints hold fp32 values: the main params of bf16/f16 runs),
    // TP = 1: loading reshards whatever layout wrote it.
    const auto t0 = std::chrono::steady_clock::now();  // progress: size and GB/s at the end
    auto w = checkpoint::load_model_weights(f["--load"], step);
    model::TransformerConfig cfg = w.config;
    if (f.count("--drop-mtp-layers") && cfg.mtp_num_layers > 0) {
      log::info("leaving out the {} multi-token prediction layers (--drop-mtp-layers)",
                cfg.mtp_num_layers);
      cfg.mtp_num_layers = 0;  // the export then reads the decoder's tensors alone
    }
    const auto& st = w.state;
    const std::string type = f.count("--hf-model-type") ? f["--hf-model-type"] : "";
    checkpoint::export_hf(f["--to-hf"], cfg, w.params, dt, type);
    export_tokenizer_files(st.config, f, f["--to-hf"], cfg.max_position_embeddings,
                           checkpoint::checkpoint_tokenizer(
                               w.metadata.value("__iter_dir", f["--load"]), w.metadata));
    log::info("exported iteration {} of {} as {} to {}", st.iteration, f["--load"],
              checkpoint::hf_arch_name(checkpoint::hf_export_arch(cfg, type)), f["--to-hf"]);
    log::info("wrote {}", checkpoint::size_and_rate(
                              checkpoint::tree_bytes(f["--to-hf"]),
                              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
                                  .count()));
    return 0;
  }
  MCPP_CHECK_HINT(f.count("--save"), kUsage, "megatron convert --from-hf needs --save DIR");
  MCPP_CHECK_HINT(!f.count("--hf-model-type"), kUsage,
                  "megatron convert --from-hf reads the model_type of the folder's config.json; "
                  "--hf-model-type is for --to-hf");
  const int64_t div =
      f.count("--make-vocab-size-divisible-by")
          ? to_int("--make-vocab-size-divisible-by", f["--make-vocab-size-divisible-by"])
          : 128;
  MCPP_CHECK_HINT(div >= 1 && div <= (int64_t(1) << 20), "e.g. --make-vocab-size-divisible-by 128",
                  "--make-vocab-size-divisible-by {} is outside [1, 2^20]", div);
  const auto t0 = std::chrono::steady_clock::now();  // progress: size and GB/s at the end
  model::TransformerConfig cfg =
      checkpoint::model_config_from_hf(checkpoint::read_hf_config(f["--from-hf"]), div);
  checkpoint::check_hf_fits_files(f["--from-hf"], cfg);
  model::GPTModel m(cfg);
  checkpoint::import_hf(f["--from-hf"], cfg, m.params());
  checkpoint::TrainingState st;  // iteration 0: a starting point (train on, or --finetune)
  st.rng_seed = cfg.seed;
  st.config = {{"converted_from_hf", f["--from-hf"]}};
  checkpoint::SaveOptions so;
  so.tokenizer = checkpoint::find_hf_tokenizer(f["--from-hf"]);  // carried inside (A.4)
  if (so.tokenizer)
    log::info("storing the Hugging Face tokenizer files ({} -> {}) in the checkpoint",
              so.tokenizer->files.size(), so.tokenizer->type.empty() ? "no usable tokenizer type"
                                                                    : so.tokenizer->type);
  else
    log::warn("{} holds no tokenizer files (vocab.json + merges.txt, tokenizer.json, "
              "tokenizer.model): the checkpoint carries none; generate and training will need "
              "the tokenizer flags",
              f["--from-hf"]);
  checkpoint::save_checkpoint(f["--save"], m, nullptr, st, so);
  log::info("imported {} ({} layers, hidden {}, padded vocab {}) into {}", f["--from-hf"],
            cfg.num_layers, cfg.hidden_size, cfg.padded_vocab_size, f["--save"]);
  log::info("read {:.3f} GB of Hugging Face files; wrote the checkpoint: {}",
            double(checkpoint::tree_bytes(f["--from-hf"])) / 1e9,
            checkpoint::size_and_rate(
                checkpoint::tree_bytes(f["--save"]),
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()));
  return 0;
}

static mcpp::tools::Registrar register_convert{"convert", run_convert};

}  // namespace
