// `megatron <subcommand> [flags]`: the one binary of megatron.cpp.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "ops/cpu/runtime_env.h"
#include "tools/commands.h"


namespace {

void usage() {
  std::printf(
      "usage: megatron <command> [flags]\n\n"
      "commands:\n"
      "  train       pretrain a GPT/Llama model (Megatron-LM pretrain_gpt.py flags)\n"
      "  preprocess  JSONL -> Megatron .bin/.idx (tools/preprocess_data.py flags)\n"
      "  inspect     describe a dataset prefix or a checkpoint directory\n"
      "  convert     checkpoint <-> Hugging Face (safetensors) conversion\n"
      "  generate    sample text from a checkpoint (KV cache, greedy/top-k/top-p)\n"
      "  serve       HTTP server: Megatron's PUT /api and OpenAI's /v1 endpoints, batched\n"
      "  plan        pipeline layer assignment, schedule, bubble and in-flight micro-batches\n"
      "  merge-datasets  merge .bin/.idx prefixes (tools/merge_datasets.py)\n"
      "  help        this text\n\n"
      "`megatron <command> --help` lists a command's flags.\n");
}

}  // namespace

int main(int argc, char** argv) {
  // The data tools and the planner compute nothing with BLAS or OpenMP: they skip the
  // re-exec, whose second program start is serial time in every preprocess run, and
  // OpenBLAS's pool.
  const bool data_tool =
      argc >= 2 && (!std::strcmp(argv[1], "preprocess") || !std::strcmp(argv[1], "merge-datasets") ||
                    !std::strcmp(argv[1], "plan"));
  if (data_tool)
    mcpp::ops::cpu::release_blas_threads();
  else
    mcpp::ops::cpu::reexec_with_runtime_env(argv);
  if (argc < 2 || !std::strcmp(argv[1], "help") || !std::strcmp(argv[1], "--help") ||
      !std::strcmp(argv[1], "-h")) {
    usage();
    return argc < 2 ? 1 : 0;
  }
  std::string cmd = argv[1];
  std::vector<std::string> args(argv + 2, argv + argc);
  try {
    for (const auto& c : mcpp::tools::commands())
      if (c.name == cmd) return c.run(args);
    std::string names;
    for (const auto& c : mcpp::tools::commands()) names += " " + c.name;
    throw mcpp::Error("unknown command '" + cmd + "'", "available commands:" + names);
  } catch (const mcpp::Error& e) {
    mcpp::log::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    mcpp::log::error("internal error: {}", e.what());
    return 3;
  }
}
