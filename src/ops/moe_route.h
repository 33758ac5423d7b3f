// The router's settings as the routing ops (catalogue.inc, ---- MoE routing) take them: the
// score function and top-k of Megatron's topk_routing_with_score_function, and which of the
// load-balancing statistics (aux_loss / seq_aux_loss, z-loss) to compute. A plain value type
// so that ops/ needs nothing from model/ (model/moe/moe_layer.cpp fills it from the config).
#pragma once
#include <cstdint>

namespace mcpp::ops {

// What the CUDA routing kernels take (a token's scores live in one thread's registers);
// larger routers route on the host (model/moe/moe_layer.cpp checks these).
inline constexpr int64_t kMoeRouteMaxExpertsCuda = 256, kMoeRouteMaxTopkCuda = 16;

struct MoeRouteSpec {
  int64_t E = 0, k = 0;                    // experts, experts per token
  bool sigmoid = false;                    // score function sigmoid (else softmax)
  bool pre_softmax = false;                // softmax before the top-k (softmax only)
  int64_t num_groups = 0, group_topk = 0;  // group-limited top-k (0: off)
  double scaling = 0;                      // top-k scaling factor (0: none)
  bool aux = false, seq_aux = false;       // aux_loss / seq_aux_loss statistics
  bool z = false;                          // z-loss statistics
  double aux_coeff = 0, z_coeff = 0;       // the coefficients (the backward's only)
};

}  // namespace mcpp::ops
