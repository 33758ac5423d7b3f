#include "parallel/parallel_state.h"

#include <fmt/ranges.h>

#include <algorithm>

namespace mcpp::parallel {
namespace {

std::vector<std::string> split_tokens(std::string_view s) {
  std::vector<std::string> out;
  size_t start = 0;
  while (start <= s.size()) {
    size_t end = s.find('-', start);
    if (end == std::string_view::npos) end = s.size();
    out.emplace_back(s.substr(start, end - start));
    start = end + 1;
  }
  return out;
}

// Strides of a mixed-radix number with digits `shape` (first fastest).
std::vector<int64_t> prefix_product(const std::vector<int>& shape) {
  std::vector<int64_t> r{1};
  for (int v : shape) r.push_back(r.back() * v);
  return r;
}

std::vector<int> decompose(int64_t index, const std::vector<int>& shape) {
  std::vector<int> idx;
  int64_t stride = 1;
  for (int s : shape) idx.push_back(int((index / stride) % s)), stride *= s;
  return idx;
}

constexpr std::string_view kAxes[] = {"tp", "cp", "ep", "dp", "pp"};

// Fills in etp and checks what Megatron's initialize_model_parallel asserts, with
// the flag names a user types.
ParallelSizes validated(ParallelSizes s) {
  if (s.etp == 0) s.etp = s.tp;
  const std::pair<const char*, int> flags[] = {
      {"--tensor-model-parallel-size", s.tp},   {"--pipeline-model-parallel-size", s.pp},
      {"--context-parallel-size", s.cp},        {"--expert-model-parallel-size", s.ep},
      {"--expert-tensor-parallel-size", s.etp},
  };
  MCPP_CHECK(s.world >= 1, "world size {} must be at least 1", s.world);
  MCPP_CHECK_HINT(s.cp_a2a == 0 || (s.cp_a2a >= 1 && s.cp % s.cp_a2a == 0),
                  "give --hierarchical-context-parallel-sizes A P with A x P = "
                  "--context-parallel-size",
                  "--hierarchical-context-parallel-sizes: an all-to-all level of {} does not "
                  "divide --context-parallel-size {}",
                  s.cp_a2a, s.cp);
  for (auto [flag, v] : flags) MCPP_CHECK(v >= 1, "{} {} must be at least 1", flag, v);
  const int64_t mp = int64_t(s.tp) * s.pp * s.cp;
  MCPP_CHECK_HINT(s.world % mp == 0,
                  fmt::format("launch a multiple of {} processes, or change the sizes", mp),
                  "world size {} is not divisible by tensor ({}) x pipeline ({}) x context "
                  "({}) parallel size = {}",
                  s.world, s.tp, s.pp, s.cp, mp);
  const int64_t emp = int64_t(s.etp) * s.ep * s.pp;
  MCPP_CHECK_HINT(s.world % emp == 0,
                  fmt::format("launch a multiple of {} processes, or change the sizes", emp),
                  "world size {} is not divisible by expert tensor ({}) x expert model ({}) x "
                  "pipeline ({}) parallel size = {}",
                  s.world, s.etp, s.ep, s.pp, emp);
  return s;
}

std::string_view order_of(const ParallelSizes& s) {
  return s.tp_pp_dp_mapping ? "tp-cp-ep-pp-dp" : "tp-cp-ep-dp-pp";
}

}  // namespace

RankGroups generate_masked_orthogonal_rank_groups(int world_size,
                                                  const std::vector<int>& parallel_size,
                                                  const std::vector<bool>& mask) {
  MCPP_CHECK(parallel_size.size() == mask.size(), "internal: {} sizes and {} mask entries",
             parallel_size.size(), mask.size());
  std::vector<int> masked_shape, unmasked_shape;
  std::vector<int64_t> masked_stride, unmasked_stride;
  const auto global_stride = prefix_product(parallel_size);
  for (size_t i = 0; i < parallel_size.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(parallel_size[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(global_stride[i]);
  }
  const int64_t group_size = prefix_product(masked_shape).back();
  MCPP_CHECK(global_stride.back() == world_size, "internal: axis sizes multiply to {}, world is {}",
             global_stride.back(), world_size);
  const int64_t num_groups = world_size / group_size;
  RankGroups groups;
  groups.reserve(size_t(num_groups));
  for (int64_t g = 0; g < num_groups; ++g) {
    const auto gi = decompose(g, unmasked_shape);
    int64_t base = 0;
    for (size_t k = 0; k < gi.size(); ++k) base += gi[k] * unmasked_stride[k];
    std::vector<int> ranks;
    ranks.reserve(size_t(group_size));
    for (int64_t r = 0; r < group_size; ++r) {
      const auto ri = decompose(r, masked_shape);
      int64_t rank = base;
      for (size_t k = 0; k < ri.size(); ++k) rank += ri[k] * masked_stride[k];
      ranks.push_back(int(rank));
    }
    groups.push_back(std::move(ranks));
  }
  return groups;
}

RankGenerator::RankGenerator(int tp, int ep, int dp, int pp, int cp, std::string_view order) {
  const int size_of[] = {tp, cp, ep, dp, pp};  // by kAxes
  names_ = split_tokens(order);
  for (const auto& n : names_) {
    auto it = std::find(std::begin(kAxes), std::end(kAxes), n);
    MCPP_CHECK(it != std::end(kAxes),
               "parallel order '{}': unknown axis '{}' (expected tp, cp, "
               "ep, dp, pp)",
               order, n);
    MCPP_CHECK(std::count(names_.begin(), names_.end(), n) == 1,
               "parallel order '{}': axis '{}' twice", order, n);
  }
  for (size_t a = 0; a < 5; ++a) {
    const bool listed = std::find(names_.begin(), names_.end(), kAxes[a]) != names_.end();
    MCPP_CHECK(listed || size_of[a] == 1,
               "parallel order '{}' lacks '{}', whose size is {} (not 1)", order, kAxes[a],
               size_of[a]);
    if (!listed) names_.emplace_back(kAxes[a]);
  }
  world_ = 1;
  for (const auto& n : names_) {
    int s = size_of[std::find(std::begin(kAxes), std::end(kAxes), n) - std::begin(kAxes)];
    sizes_.push_back(s), world_ *= s;
  }
}

int RankGenerator::axis(std::string_view name) const {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return int(i);
  MCPP_FAIL("unknown parallel axis '{}' (expected tp, cp, ep, dp, pp)", name);
}

RankGroups RankGenerator::get_ranks(std::string_view token) const {
  std::vector<bool> mask(names_.size(), false);
  for (const auto& t : split_tokens(token)) mask[size_t(axis(t))] = true;
  return generate_masked_orthogonal_rank_groups(world_, sizes_, mask);
}

int RankGenerator::coord(int rank, std::string_view name) const {
  MCPP_CHECK(rank >= 0 && rank < world_, "rank {} outside a world of {}", rank, world_);
  return decompose(rank, sizes_)[size_t(axis(name))];
}

int RankGenerator::rank_of(int tp, int cp, int ep, int dp, int pp) const {
  const int c[] = {tp, cp, ep, dp, pp};
  int64_t rank = 0, stride = 1;
  for (size_t i = 0; i < names_.size(); ++i) {
    const int v = c[std::find(std::begin(kAxes), std::end(kAxes), names_[i]) - std::begin(kAxes)];
    MCPP_CHECK(v >= 0 && v < sizes_[i], "{} coordinate {} outside 0..{}", names_[i], v,
               sizes_[i] - 1);
    rank += v * stride, stride *= sizes_[i];
  }
  return int(rank);
}

std::string_view group_name(Group g) {
  static constexpr std::string_view names[kNumGroups] = {"tp",
                                                         "pp",
                                                         "dp",
                                                         "cp",
                                                         "dp-cp",
                                                         "tp-cp",
                                                         "tp-pp",
                                                         "tp-dp",
                                                         "tp-dp-cp",
                                                         "embedding",
                                                         "position-embedding",
                                                         "ep",
                                                         "expert-tp",
                                                         "tp-ep",
                                                         "tp-ep-pp",
                                                         "expert-dp",
                                                         "cp-a2a",
                                                         "cp-p2p",
                                                         "intra-dp-cp",
                                                         "inter-dist-opt",
                                                         "intra-dist-opt"};
  return names[size_t(g)];
}

Layout::Layout(const ParallelSizes& sizes)
    : sizes_(validated(sizes)),
      dp_(sizes_.world / (sizes_.tp * sizes_.pp * sizes_.cp)),
      etp_(sizes_.etp),
      edp_(sizes_.world / (sizes_.etp * sizes_.ep * sizes_.pp)),
      dense_(sizes_.tp, 1, dp_, sizes_.pp, sizes_.cp, order_of(sizes_)),
      expert_(etp_, sizes_.ep, edp_, sizes_.pp, 1, order_of(sizes_)) {
  auto set = [&](Group g, const RankGenerator& gen, std::string_view token) {
    groups_[size_t(g)] = gen.get_ranks(token);
  };
  set(Group::TP, dense_, "tp");
  set(Group::PP, dense_, "pp");
  set(Group::DP, dense_, "dp");
  set(Group::CP, dense_, "cp");
  set(Group::DP_CP, dense_, "dp-cp");
  set(Group::TP_CP, dense_, "tp-cp");
  set(Group::MP, dense_, "tp-pp");
  set(Group::TP_DP, dense_, "tp-dp");
  set(Group::TP_DP_CP, dense_, "tp-dp-cp");
  set(Group::EP, expert_, "ep");
  set(Group::ExpertTP, expert_, "tp");
  set(Group::TP_EP, expert_, "tp-ep");
  set(Group::TP_EP_PP, expert_, "tp-ep-pp");
  set(Group::ExpertDP, expert_, "dp");
  // Megatron asserts the same: pipeline stages are shared by dense and expert layers.
  MCPP_CHECK_HINT(expert_.get_ranks("pp") == groups(Group::PP),
                  "with --use-tp-pp-dp-mapping keep expert-tensor x expert-model parallel size "
                  "equal to tensor x context parallel size",
                  "pipeline groups differ between the dense layout (TP {} CP {}) and the "
                  "expert layout (ETP {} EP {}), order {}",
                  tp(), cp(), etp_, ep(), order());
  // Hierarchical CP: within each CP group's list, level 0 takes A consecutive members and
  // level 1 the members A apart (Megatron's "(l s u) -> (l u) s" rearrangement).
  const int A = sizes_.cp_a2a;
  for (const auto& cp_ranks : groups(Group::CP)) {
    const int n = int(cp_ranks.size());
    if (A == 0) {
      for (int r : cp_ranks) {
        groups_[size_t(Group::CpA2A)].push_back({r});
        groups_[size_t(Group::CpP2P)].push_back({r});
      }
      continue;
    }
    for (int p = 0; p < n / A; ++p)
      groups_[size_t(Group::CpA2A)].emplace_back(cp_ranks.begin() + p * A,
                                                 cp_ranks.begin() + (p + 1) * A);
    for (int q = 0; q < A; ++q) {
      std::vector<int> ring;
      for (int p = 0; p < n / A; ++p) ring.push_back(cp_ranks[size_t(p * A + q)]);
      groups_[size_t(Group::CpP2P)].push_back(std::move(ring));
    }
  }
  // --num-distributed-optimizer-instances N (Megatron's initialize_model_parallel): each
  // DP x CP list is cut into N runs of DP*CP/N; instance i is run i of every list.
  const int N = sizes_.dist_opt_instances;
  MCPP_CHECK(N >= 1, "--num-distributed-optimizer-instances {} must be at least 1", N);
  MCPP_CHECK_HINT((dp_ * cp()) % N == 0,
                  "choose --num-distributed-optimizer-instances as a divisor of the data-parallel "
                  "x context-parallel size",
                  "--num-distributed-optimizer-instances {}: data-parallel ({}) x context-parallel "
                  "({}) size {} is not divisible by it",
                  N, dp_, cp(), dp_ * cp(), N);
  const int intra = dp_ * cp() / N;
  RankGroups instance(static_cast<size_t>(N));
  // At N = 1 the three kinds stay empty: no communicator is made for them (on GPUs each
  // would be another NCCL communicator, one of them world-sized); ParallelState's
  // accessors answer with dp_cp() then.
  if (N > 1)
    for (const auto& dpcp : groups(Group::DP_CP)) {
      for (int i = 0; i < N; ++i) {
        groups_[size_t(Group::IntraDpCp)].emplace_back(dpcp.begin() + i * intra,
                                                       dpcp.begin() + (i + 1) * intra);
        instance[size_t(i)].insert(instance[size_t(i)].end(), dpcp.begin() + i * intra,
                                   dpcp.begin() + (i + 1) * intra);
      }
      for (int q = 0; q < intra; ++q) {
        std::vector<int> across;
        for (int i = 0; i < N; ++i) across.push_back(dpcp[size_t(i * intra + q)]);
        groups_[size_t(Group::InterDistOpt)].push_back(std::move(across));
      }
    }
  if (N > 1)
    for (auto& ranks : instance) {
      std::sort(ranks.begin(), ranks.end());
      groups_[size_t(Group::IntraDistOpt)].push_back(std::move(ranks));
    }
  // default_embedding_ranks / default_position_embedding_ranks: first and last stage
  // of each pipeline group.
  for (const auto& pp_ranks : groups(Group::PP)) {
    std::vector<int> emb{pp_ranks.front()};
    if (pp_ranks.size() > 1 && !sizes_.untie_embeddings) emb.push_back(pp_ranks.back());
    groups_[size_t(Group::Embedding)].push_back(std::move(emb));
    groups_[size_t(Group::PositionEmbedding)].push_back({pp_ranks.front()});
  }
}

std::string_view Layout::order() const { return order_of(sizes_); }

Coords Layout::coords(int rank) const {
  Coords c;
  c.tp = dense_.coord(rank, "tp"), c.cp = dense_.coord(rank, "cp");
  c.dp = dense_.coord(rank, "dp"), c.pp = dense_.coord(rank, "pp");
  c.etp = expert_.coord(rank, "tp"), c.ep = expert_.coord(rank, "ep");
  c.edp = expert_.coord(rank, "dp");
  return c;
}

int Layout::rank_of(int tp, int cp, int dp, int pp) const {
  return dense_.rank_of(tp, cp, 0, dp, pp);
}

std::vector<int> Layout::group_of(Group g, int rank) const {
  for (const auto& grp : groups(g))
    if (std::find(grp.begin(), grp.end(), rank) != grp.end()) return grp;
  return {};
}

ParallelState::ParallelState(comm::World& world, ParallelSizes sizes)
    : layout_([&] {
        MCPP_CHECK(sizes.world == 0 || sizes.world == world.size(),
                   "parallel sizes are for {} ranks, the world has {}", sizes.world, world.size());
        sizes.world = world.size();
        return sizes;
      }()),
      rank_(world.rank()),
      coords_(layout_.coords(rank_)) {
  // Same kinds in the same order on every rank: each split is collective over the world.
  // Kinds without groups (the distributed-optimizer instances' at N = 1) get none.
  for (int g = 0; g < kNumGroups; ++g)
    if (!layout_.groups(Group(g)).empty())
      comms_[size_t(g)] = world.split(layout_.groups(Group(g)), std::string(group_name(Group(g))));
}

comm::Communicator& ParallelState::group(Group g) const {
  MCPP_CHECK(comms_[size_t(g)], "world rank {} is in no '{}' group (pipeline stage {} of {})",
             rank_, group_name(g), coords_.pp, layout_.pp());
  return *comms_[size_t(g)];
}

}  // namespace mcpp::parallel
