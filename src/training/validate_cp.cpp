// Context-parallel flags (--context-parallel-size, --cp-comm-type) and the document-masking
// flags' device (--reset-position-ids, --reset-attention-mask), checked as Megatron's
// validate_args and TransformerEngine's attention do at start-up, each error naming the
// flag and ending in a HINT. Runs after the tensor-parallel checks (it needs TP, SP and
// the query-group count resolved). docs/context-parallel.md describes the feature.
#include <fmt/format.h>

#include "base/error.h"
#include "training/arguments.h"

namespace mcpp::training {

void validate_context_parallel(Args& a) {
  const int64_t cp = a.context_parallel_size, tp = a.tensor_model_parallel_size;
  // --cp-comm-type: one value for all layers or one per layer (Megatron's nargs +).
  MCPP_CHECK_HINT(!a.cp_comm_type.empty(), "give --cp-comm-type p2p, a2a or all_gather",
                  "--cp-comm-type needs a value");
  MCPP_CHECK_HINT(
      a.cp_comm_type.size() == 1 || int64_t(a.cp_comm_type.size()) == a.num_layers,
      fmt::format("give one value for every layer, or exactly {} values (one per layer)",
                  a.num_layers),
      "--cp-comm-type has {} values for --num-layers {}", a.cp_comm_type.size(), a.num_layers);
  for (const std::string& t : a.cp_comm_type) {
    MCPP_CHECK_HINT(t != "a2a+p2p",
                    "use p2p, a2a or all_gather (a2a+p2p needs "
                    "--hierarchical-context-parallel-sizes, which megatron.cpp does not have yet)",
                    "--cp-comm-type a2a+p2p is not implemented yet by megatron.cpp");
    MCPP_CHECK_HINT(t == "p2p" || t == "a2a" || t == "all_gather",
                    "use p2p (ring), a2a (all-to-all over heads) or all_gather",
                    "--cp-comm-type {}: unknown communication type", t);
  }
  if (a.cp_comm_type.size() == 1) a.cp_comm_type.assign(size_t(a.num_layers), a.cp_comm_type[0]);
  // Document masking (--reset-attention-mask, --reset-position-ids) runs on both backends.
  if (cp == 1) return;

  // The load-balanced split: 2*CP equal chunks, rank r holding chunks r and 2CP-1-r.
  MCPP_CHECK_HINT(a.seq_length % (2 * cp) == 0,
                  fmt::format("choose --seq-length as a multiple of 2 x --context-parallel-size "
                              "= {}",
                              2 * cp),
                  "--context-parallel-size {} splits --seq-length {} into {} equal chunks: not "
                  "divisible",
                  cp, a.seq_length, 2 * cp);
  if (a.sequence_parallel)
    MCPP_CHECK_HINT((a.seq_length / cp) % tp == 0,
                    fmt::format("choose --seq-length as a multiple of --context-parallel-size x "
                                "--tensor-model-parallel-size = {}",
                                cp * tp),
                    "--sequence-parallel splits each context-parallel rank's {} tokens over "
                    "--tensor-model-parallel-size {}: not divisible",
                    a.seq_length / cp, tp);
  for (const std::string& t : a.cp_comm_type)
    if (t == "a2a") {
      // All-to-all scatters this TP rank's heads over the CP ranks, whole key/value
      // groups at a time (linear_qkv's grouped layout keeps a group's heads together).
      MCPP_CHECK_HINT((a.num_attention_heads / tp) % cp == 0 &&
                          (a.num_query_groups / tp) % cp == 0,
                      "choose --context-parallel-size dividing the heads and query groups of a "
                      "tensor-parallel rank, or use --cp-comm-type p2p",
                      "--cp-comm-type a2a needs --num-attention-heads {} and --num-query-groups "
                      "{} (divided by --tensor-model-parallel-size {}) divisible by "
                      "--context-parallel-size {}",
                      a.num_attention_heads, a.num_query_groups, tp, cp);
      break;
    }
  // Everything above runs on the GPU too: the attention blocks (ops/cuda/attention_cp.cu:
  // cuDNN or the own kernels, with the lse merge), a2a's reshuffles (row gathers around
  // the all-to-all), the document starts per chunk and the dropout of a rank's two chunks.
}

}  // namespace mcpp::training
