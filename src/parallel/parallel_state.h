// Megatron's process-group layout (megatron/core/parallel_state.py: RankGenerator,
// generate_masked_orthogonal_rank_groups, initialize_model_parallel) and the
// per-rank set of communicators built from it.
//
// Order `tp-cp-ep-dp-pp` (default) lists axes fastest-varying first:
//   global_rank = tp + TP*(cp + CP*(dp + DP*pp))           (dense generator, EP = 1)
//   global_rank = etp + ETP*(ep + EP*(edp + EDP*pp))       (expert generator, CP = 1)
// `--use-tp-pp-dp-mapping` swaps dp and pp (`tp-cp-ep-pp-dp`). A group for the axes
// "X-Y" is all ranks sharing every other coordinate, members in enumeration order
// (first-listed axis fastest), which is also their group rank.
//
// Everything above ParallelState is pure (no MPI), so tests check megatron.md §4's
// worked examples exactly.
#pragma once
#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "comm/world.h"

namespace mcpp::parallel {

using RankGroups = std::vector<std::vector<int>>;

// parallel_size: axis sizes in order; mask: the axes that vary inside a group.
RankGroups generate_masked_orthogonal_rank_groups(int world_size,
                                                  const std::vector<int>& parallel_size,
                                                  const std::vector<bool>& mask);

class RankGenerator {
 public:
  // order: "-"-separated subset of tp, cp, ep, dp, pp; missing axes (size 1) are
  // appended, as Megatron does. Throws when an axis > 1 is missing from the order.
  RankGenerator(int tp, int ep, int dp, int pp, int cp, std::string_view order);
  int world_size() const { return world_; }
  // token: "-"-separated axes, e.g. "tp", "tp-pp", "dp-cp" (any order).
  RankGroups get_ranks(std::string_view token) const;
  // This rank's coordinate along `axis` ("tp", "cp", "ep", "dp", "pp").
  int coord(int rank, std::string_view axis) const;
  // Inverse of coord: the rank with these coordinates (by axis name).
  int rank_of(int tp, int cp, int ep, int dp, int pp) const;

 private:
  int axis(std::string_view name) const;
  std::vector<std::string> names_;  // in order
  std::vector<int> sizes_;
  int world_ = 1;
};

struct ParallelSizes {
  int world = 0;  // number of ranks; 0 = the World's size (ParallelState fills it in)
  int tp = 1;     // --tensor-model-parallel-size
  int pp = 1;     // --pipeline-model-parallel-size
  int cp = 1;     // --context-parallel-size
  int ep = 1;     // --expert-model-parallel-size
  int etp = 0;    // --expert-tensor-parallel-size; 0 = same as tp (Megatron's default)
  bool tp_pp_dp_mapping = false;  // --use-tp-pp-dp-mapping
  bool untie_embeddings = false;  // --untie-embeddings-and-output-weights: the embedding
                                  // group is the first stage only
  // --hierarchical-context-parallel-sizes A P (two levels, A x P = cp): the all-to-all
  // level's size A; 0 = none (the two hierarchical groups are then groups of one).
  int cp_a2a = 0;
  // --num-distributed-optimizer-instances N: the DP x CP group of each rank is cut into N
  // instances of DP*CP/N consecutive members (Megatron's partial distributed optimizer).
  int dist_opt_instances = 1;
};

enum class Group : uint8_t {
  TP,
  PP,
  DP,
  CP,
  DP_CP,
  TP_CP,
  MP /* tp-pp */,
  TP_DP,
  TP_DP_CP,
  Embedding,
  PositionEmbedding,
  EP,
  ExpertTP,
  TP_EP,
  TP_EP_PP,
  ExpertDP,
  // Hierarchical CP (Megatron's create_hierarchical_groups over each CP group's list):
  // level 0, A consecutive CP ranks (the all-to-all of a2a+p2p); level 1, the ranks A
  // apart (its ring). Groups of one without --hierarchical-context-parallel-sizes.
  CpA2A,
  CpP2P,
  // --num-distributed-optimizer-instances N (Megatron's intra/inter partial DP groups):
  // each DP x CP group's list cut into N runs of DP*CP/N consecutive members (one
  // distributed-optimizer instance each); the members at the same place of every run; and
  // every rank of one instance over the whole world (TP x PP x its DP*CP/N: the ranks
  // whose optimizer shards are distinct, Megatron's intra_dist_opt group). At N = 1 the
  // three kinds have no groups (and no communicators).
  IntraDpCp,
  InterDistOpt,
  IntraDistOpt,
};
inline constexpr int kNumGroups = 21;
std::string_view group_name(Group g);  // "tp", "dp-cp", "tp-pp", "embedding", "expert-dp", ...

struct Coords {
  int tp = 0, cp = 0, dp = 0, pp = 0;  // dense generator
  int etp = 0, ep = 0, edp = 0;        // expert generator
};

// The whole layout of a world: pure, no communication.
class Layout {
 public:
  explicit Layout(const ParallelSizes& sizes);  // validates; throws mcpp::Error
  const ParallelSizes& sizes() const { return sizes_; }
  int world() const { return sizes_.world; }
  int tp() const { return sizes_.tp; }
  int pp() const { return sizes_.pp; }
  int cp() const { return sizes_.cp; }
  int dp() const { return dp_; }  // world / (TP*PP*CP)
  int ep() const { return sizes_.ep; }
  int etp() const { return etp_; }
  int edp() const { return edp_; }  // world / (ETP*EP*PP)
  int dist_opt_instances() const { return sizes_.dist_opt_instances; }
  std::string_view order() const;  // "tp-cp-ep-dp-pp" or "tp-cp-ep-pp-dp"

  Coords coords(int rank) const;
  int rank_of(int tp, int cp, int dp, int pp) const;
  // All groups of one kind, in Megatron's enumeration order. Embedding groups
  // cover only first/last stages; every other kind partitions the world.
  const RankGroups& groups(Group g) const { return groups_[size_t(g)]; }
  // The group of `g` holding `rank` (empty when none does).
  std::vector<int> group_of(Group g, int rank) const;
  const RankGenerator& dense() const { return dense_; }
  const RankGenerator& expert() const { return expert_; }

 private:
  ParallelSizes sizes_;
  int dp_ = 1, etp_ = 1, edp_ = 1;
  RankGenerator dense_, expert_;
  std::array<RankGroups, kNumGroups> groups_;
};

// This rank's communicators for every group kind. Construction is collective over
// the world (each kind is one World::split). Destroy before the World.
class ParallelState {
 public:
  // sizes.world is taken from `world` (leave it 0 or set it equal).
  ParallelState(comm::World& world, ParallelSizes sizes);

  const Layout& layout() const { return layout_; }
  int rank() const { return rank_; }  // world rank
  const Coords& coords() const { return coords_; }

  bool has(Group g) const { return comms_[size_t(g)] != nullptr; }
  comm::Communicator& group(Group g) const;  // throws when this rank is in no such group

  comm::Communicator& tp() const { return group(Group::TP); }
  comm::Communicator& pp() const { return group(Group::PP); }
  comm::Communicator& dp() const { return group(Group::DP); }
  comm::Communicator& cp() const { return group(Group::CP); }
  comm::Communicator& dp_cp() const { return group(Group::DP_CP); }
  comm::Communicator& mp() const { return group(Group::MP); }
  comm::Communicator& embedding() const { return group(Group::Embedding); }
  comm::Communicator& ep() const { return group(Group::EP); }
  comm::Communicator& expert_dp() const { return group(Group::ExpertDP); }
  comm::Communicator& cp_a2a() const { return group(Group::CpA2A); }
  comm::Communicator& cp_p2p() const { return group(Group::CpP2P); }
  // The distributed optimizer's groups (--num-distributed-optimizer-instances): at N = 1
  // intra_dp_cp() is dp_cp() itself, and inter_dist_opt() exists only for N > 1.
  comm::Communicator& intra_dp_cp() const {
    return layout_.dist_opt_instances() > 1 ? group(Group::IntraDpCp) : dp_cp();
  }
  comm::Communicator& inter_dist_opt() const { return group(Group::InterDistOpt); }

  int tp_rank() const { return coords_.tp; }
  int pp_rank() const { return coords_.pp; }
  int dp_rank() const { return coords_.dp; }
  int cp_rank() const { return coords_.cp; }
  int ep_rank() const { return coords_.ep; }
  bool is_first_stage() const { return coords_.pp == 0; }
  bool is_last_stage() const { return coords_.pp == layout_.pp() - 1; }

 private:
  Layout layout_;
  int rank_ = 0;
  Coords coords_;
  std::array<std::unique_ptr<comm::Communicator>, kNumGroups> comms_;
};

}  // namespace mcpp::parallel
