// Per-group NCCL communicator settings: Megatron's --nccl-communicator-config-path, a
// YAML file that maps process-group names to NCCL's ncclConfig_t fields, e.g.
//
//   dp:                 # data-parallel group (also: tp, pp, cp, dp_cp, tp_dp_cp, ep, ...)
//     max_ctas: 8       # NCCL channels (CTAs, one per SM) the group's kernels may use
//     min_ctas: 1
//     cga_cluster_size: 2
//
// Names match ours ("dp-cp") or Megatron's ("dp_cp"). Only this two-level mapping of
// integers (and comments) is read; anything else is an error naming the file and line.
// The settings are applied where the group's NCCL communicator is created (comm/nccl).
// Few CTAs on the data-parallel group leave the SMs to the backward's GEMMs while
// --overlap-grad-reduce runs the gradient reduction beside them.
#pragma once
#include <map>
#include <string>

namespace mcpp::comm {

struct NcclGroupConfig {
  int cga_cluster_size = -1;  // -1: NCCL's default
  int max_ctas = -1;
  int min_ctas = -1;
};

using NcclConfigs = std::map<std::string, NcclGroupConfig>;  // by our group name

// Parses the YAML file; throws mcpp::Error naming the file and line on anything else.
NcclConfigs read_nccl_config(const std::string& path);

// The group's settings, or nullptr; `name` is our group name ("dp", "dp-cp", ...).
const NcclGroupConfig* find_nccl_config(const NcclConfigs& c, const std::string& name);

}  // namespace mcpp::comm
