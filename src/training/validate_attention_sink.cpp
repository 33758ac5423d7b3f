// --softmax-type (Megatron's attention sinks; model/core_attention.h): vanilla, off-by-one or
// learnable, on every attention path but the hierarchical context-parallel one.
#include <algorithm>

#include "base/error.h"
#include "model/config.h"
#include "training/arguments.h"

namespace mcpp::training {

void validate_attention_sink(const Args& a) {
  model::softmax_type_of(a.softmax_type);  // the name (argparse's choices)
  if (a.softmax_type == "vanilla") return;
  const bool hierarchical =
      std::count(a.cp_comm_type.begin(), a.cp_comm_type.end(), "a2a+p2p") > 0;
  MCPP_CHECK_HINT(a.context_parallel_size == 1 || !hierarchical,
                  "use --cp-comm-type p2p, all_gather or a2a with attention sinks",
                  "--softmax-type {} with --cp-comm-type a2a+p2p is not implemented (the sinks "
                  "join p2p's, all_gather's and a2a's attention)",
                  a.softmax_type);
}

}  // namespace mcpp::training
