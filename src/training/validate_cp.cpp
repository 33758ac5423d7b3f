// Context-parallel flags (--context-parallel-size, --cp-comm-type,
// --hierarchical-context-parallel-sizes) and the document-masking
// flags' device (--reset-position-ids, --reset-attention-mask), checked as Megatron's
// validate_args and TransformerEngine's attention do at start-up, each error naming the
// flag and ending in a HINT. Runs after the tensor-parallel checks (it needs TP, SP and
// the query-group count resolved). docs/context-parallel.md describes the feature.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"
#include "training/arguments.h"

namespace mcpp::training {

void validate_context_parallel(Args& a) {
  const int64_t cp = a.context_parallel_size, tp = a.tensor_model_parallel_size;
  // --cp-comm-type: one value for all layers or one per layer (Megatron's nargs +).
  MCPP_CHECK_HINT(!a.cp_comm_type.empty(), "give --cp-comm-type p2p, a2a, all_gather or a2a+p2p",
                  "--cp-comm-type needs a value");
  MCPP_CHECK_HINT(
      a.cp_comm_type.size() == 1 || int64_t(a.cp_comm_type.size()) == a.num_layers,
      fmt::format("give one value for every layer, or exactly {} values (one per layer)",
                  a.num_layers),
      "--cp-comm-type has {} values for --num-layers {}", a.cp_comm_type.size(), a.num_layers);
  bool hierarchical = false;
  for (const std::string& t : a.cp_comm_type) {
    MCPP_CHECK_HINT(t == "p2p" || t == "a2a" || t == "all_gather" || t == "a2a+p2p",
                    "use p2p (ring), a2a (all-to-all over heads), all_gather or a2a+p2p "
                    "(all-to-all inside groups, a ring between them)",
                    "--cp-comm-type {}: unknown communication type", t);
    hierarchical = hierarchical || t == "a2a+p2p";
  }
  // --hierarchical-context-parallel-sizes: Megatron asserts the product is CP whenever it
  // is given; a2a+p2p needs it, with two levels (all-to-all, then the ring).
  if (const auto& h = a.hierarchical_context_parallel_sizes) {
    int64_t product = 1;
    for (int64_t v : *h) {
      MCPP_CHECK_HINT(v >= 1, "give positive sizes whose product is --context-parallel-size",
                      "--hierarchical-context-parallel-sizes {}: a size below 1",
                      fmt::join(*h, " "));
      product *= v;
    }
    MCPP_CHECK_HINT(product == cp,
                    fmt::format("give sizes whose product is --context-parallel-size {}", cp),
                    "--hierarchical-context-parallel-sizes {} multiply to {}, not "
                    "--context-parallel-size {}",
                    fmt::join(*h, " "), product, cp);
    MCPP_CHECK_HINT(!hierarchical || h->size() == 2,
                    "give two sizes A P with A x P = --context-parallel-size: the all-to-all "
                    "groups' and the ring's",
                    "--cp-comm-type a2a+p2p takes two levels of "
                    "--hierarchical-context-parallel-sizes, not {}",
                    h->size());
  }
  MCPP_CHECK_HINT(!hierarchical || a.hierarchical_context_parallel_sizes,
                  fmt::format("add --hierarchical-context-parallel-sizes A P with A x P = "
                              "--context-parallel-size {} (all-to-all inside groups of A "
                              "consecutive CP ranks, a ring of P such groups)",
                              cp),
                  "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes");
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
  if (hierarchical) {
    // a2a+p2p scatters heads over the all-to-all level only.
    const int64_t g = (*a.hierarchical_context_parallel_sizes)[0];
    MCPP_CHECK_HINT((a.num_attention_heads / tp) % g == 0 && (a.num_query_groups / tp) % g == 0,
                    "choose a first --hierarchical-context-parallel-sizes value dividing the "
                    "heads and query groups of a tensor-parallel rank",
                    "--cp-comm-type a2a+p2p needs --num-attention-heads {} and "
                    "--num-query-groups {} (divided by --tensor-model-parallel-size {}) "
                    "divisible by the all-to-all level of --hierarchical-context-parallel-sizes, "
                    "{}",
                    a.num_attention_heads, a.num_query_groups, tp, g);
  }
  // Everything above runs on the GPU too: the attention blocks (ops/cuda/attention_cp.cu:
  // cuDNN or the own kernels, with the lse merge), a2a's reshuffles (row gathers around
  // the all-to-all), the document starts per chunk and the dropout of a rank's two chunks.
}

}  // namespace mcpp::training
