// --softmax-type (Megatron's attention sinks; model/core_attention.h): vanilla, off-by-one or
// learnable, on every attention path (every context-parallel exchange among them).
#include "base/error.h"
#include "model/config.h"
#include "training/arguments.h"

namespace mcpp::training {

void validate_attention_sink(const Args& a) {
  model::softmax_type_of(a.softmax_type);  // the name (argparse's choices)
}

}  // namespace mcpp::training
