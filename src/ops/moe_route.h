// The router's settings as the routing ops (catalogue.inc, ---- MoE routing) take them: the
// score function and top-k of Megatron's topk_routing_with_score_function, the capacity and
// padding of its token dropping (apply_router_token_dropping, pad_routing_map), and which of
// the load-balancing statistics (aux_loss, seq_aux_loss, global_aux_loss, z-loss) to
// compute. A plain value
// type so that ops/ needs nothing from model/ (model/moe/moe_layer.cpp fills it from the
// config).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>

#ifdef __CUDACC__
#define MCPP_MOE_HD __host__ __device__
#else
#define MCPP_MOE_HD
#endif

namespace mcpp::ops {

// What the CUDA routing kernels take (a token's scores live in one thread's registers);
// larger routers route on the host (model/moe/moe_layer.cpp checks these).
inline constexpr int64_t kMoeRouteMaxExpertsCuda = 256, kMoeRouteMaxTopkCuda = 16;

// The score function: softmax over E, or each expert's sigmoid / sqrt(softplus) of its logit.
enum class MoeScore : uint8_t { Softmax, Sigmoid, SqrtSoftplus };

struct MoeRouteSpec {
  int64_t E = 0, k = 0;                    // experts, experts per token
  MoeScore score = MoeScore::Softmax;      // the score function
  bool pre_softmax = false;                // softmax before the top-k (softmax only)
  int64_t num_groups = 0, group_topk = 0;  // group-limited top-k (0: off)
  double scaling = 0;                      // top-k scaling factor (0: none)
  // Token dropping, per block of tokens (one rank's, as Megatron routes them):
  double capacity_factor = 0;     // > 0: at most moe_capacity(...) rows per expert and block
  bool drop_by_position = false;  // keep the earliest tokens (else the highest weights)
  bool pad_to_capacity = false;   // fill every expert to its capacity (weight-0 rows)
  int64_t pad_multiple = 0;       // > 1: each expert's rows per block padded to a multiple
  // The aux losses, any of them together (one aux top-k per token counts for all):
  // aux_loss, seq_aux_loss, global_aux_loss, and their coefficients (the backward's only).
  bool aux = false, seq_aux = false, global_aux = false;
  double aux_coeff = 0, seq_aux_coeff = 0, global_aux_coeff = 0;
  bool z = false;      // z-loss statistics
  double z_coeff = 0;  // its coefficient (the backward's only)
  // Context parallelism: the ranks whose tokens share aux_loss's and seq_aux_loss's token
  // count (their counts summed by the caller between moe_route_counts and moe_route_stats).
  int64_t cp = 1;
  // global_aux_loss: the DP x CP ranks whose tokens share its token count (its counts row
  // summed over them, and averaged over micro-batches, by the caller).
  int64_t global_ranks = 1;

  MCPP_MOE_HD bool sigmoid_like() const { return score != MoeScore::Softmax; }
  MCPP_MOE_HD bool any_aux() const { return aux || seq_aux || global_aux; }
  bool drops() const { return capacity_factor > 0; }
  // Whether the index needs more than a counting sort of the experts (N != T*k possible).
  bool shapes_rows() const { return capacity_factor > 0 || pad_multiple > 1; }
};

// The aux counts' rows [R, E] (moe_route_counts, moe_route_stats, moe_route_backward) for B
// sequences: seq_aux_loss's B (one per sequence), then aux_loss's one, then
// global_aux_loss's one, each only when on. The rows before moe_aux_global_row are the ones
// summed over CP.
MCPP_MOE_HD inline int64_t moe_aux_row(const MoeRouteSpec& r, int64_t B) {
  return r.seq_aux ? B : 0;
}
MCPP_MOE_HD inline int64_t moe_aux_global_row(const MoeRouteSpec& r, int64_t B) {
  return moe_aux_row(r, B) + (r.aux ? 1 : 0);
}
MCPP_MOE_HD inline int64_t moe_aux_rows(const MoeRouteSpec& r, int64_t B) {
  return moe_aux_global_row(r, B) + (r.global_aux ? 1 : 0);
}

// Megatron's capacity of one expert for a block of Tb tokens: ceil(Tb k / E * cf), at most
// Tb (model/moe/routing.h computes the same number).
inline int64_t moe_capacity(const MoeRouteSpec& r, int64_t Tb) {
  return std::min<int64_t>(
      Tb, int64_t(std::ceil(double(Tb * r.k) / double(r.E) * r.capacity_factor)));
}

// The most rows the dispatch index of T tokens in `blocks` blocks can hold: T*k dropless or
// dropping, E*capacity*blocks with pad-to-capacity, plus under pad_multiple rows per expert
// and block for the FP8 padding (an expert holds at most all of a block's tokens).
inline int64_t moe_route_max_rows(const MoeRouteSpec& r, int64_t T, int64_t blocks) {
  int64_t rows = T * r.k;
  if (r.capacity_factor > 0 && r.pad_to_capacity)
    rows = r.E * moe_capacity(r, T / blocks) * blocks;
  if (r.pad_multiple > 1) rows = std::min(rows + r.E * blocks * (r.pad_multiple - 1), r.E * T);
  return rows;
}

}  // namespace mcpp::ops
