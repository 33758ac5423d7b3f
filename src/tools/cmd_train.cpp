// `megatron train`: Megatron-LM's pretrain_gpt.py, same flags.
#include "tools/commands.h"
#include "training/trainer.h"

namespace {
mcpp::tools::Registrar register_train{"train", mcpp::training::train_main};
}
