#include "training/weight_hash.h"

#include <fmt/ranges.h>

#include <algorithm>
#include <string>
#include <vector>

#include "base/error.h"
#include "base/hash.h"
#include "ops/ops.h"
#include "parallel/host_collectives.h"
#include "training/forward_backward.h"

namespace mcpp::training {

namespace {

constexpr size_t kParamsShown = 5;  // differing parameters named per group
constexpr size_t kGroupsShown = 4;  // groups whose findings the error lists

// The parameters of one gradient group (dense or expert), in registry order, and the hash
// of each one's bytes.
struct Hashes {
  std::vector<size_t> index;
  std::vector<uint64_t> hash;
};

Hashes hash_params(const model::ParamStore& params, model::GradGroup which) {
  Hashes h;
  for (size_t i = 0; i < params.infos().size(); ++i) {
    if (params.infos()[i].grad_group != which) continue;
    Tensor w = params.param(i);
    if (w.device() != Device::CPU) {  // the copy returns once the host holds the bytes
      Tensor host = Tensor::empty(w.shape(), w.dtype());
      ops::copy(w, host, ops::default_stream(w.device()));
      w = host;
    }
    h.index.push_back(i);
    h.hash.push_back(hash64(w.raw(), w.nbytes()));
  }
  return h;
}

std::string ranks_str(const std::vector<int>& r) { return fmt::format("[{}]", fmt::join(r, ", ")); }

// What one group's gathered hashes show: "" when every member holds the same hashes, else a
// report naming the first differing parameters and, for each, the world ranks of each hash.
std::string compare(const model::ParamStore& params, const Hashes& mine,
                    const std::vector<std::vector<uint64_t>>& all, const comm::Communicator& g) {
  const std::vector<int>& world_rank = g.ranks();
  for (size_t r = 1; r < all.size(); ++r)
    if (all[r].size() != all[0].size())  // not the same model part: nothing to pair up
      return fmt::format("  over {}: world rank {} holds {} parameters, world rank {} holds {}",
                         g.describe(), world_rank[r], all[r].size(), world_rank[0], all[0].size());
  std::vector<std::string> lines;
  size_t differing = 0;
  for (size_t k = 0; k < mine.index.size(); ++k) {
    // hash -> world ranks, in the order of the members that first hold each
    std::vector<std::pair<uint64_t, std::vector<int>>> holders;
    for (size_t r = 0; r < all.size(); ++r) {
      auto it = std::find_if(holders.begin(), holders.end(),
                             [&](const auto& h) { return h.first == all[r][k]; });
      if (it == holders.end()) it = holders.insert(holders.end(), {all[r][k], {}});
      it->second.push_back(world_rank[r]);
    }
    if (holders.size() == 1) continue;
    if (++differing > kParamsShown) continue;
    std::string line = "    " + params.infos()[mine.index[k]].name + ":";
    for (size_t j = 0; j < holders.size(); ++j)
      line += fmt::format("{} hash {:016x} on world ranks {}", j ? ";" : "", holders[j].first,
                          ranks_str(holders[j].second));
    lines.push_back(line);
  }
  if (differing == 0) return "";
  std::string out = fmt::format("  over {}: {} of {} parameters differ", g.describe(), differing,
                                mine.index.size());
  for (const auto& l : lines) out += "\n" + l;
  if (differing > kParamsShown)
    out += fmt::format("\n    ... and {} more", differing - kParamsShown);
  return out;
}

}  // namespace

void check_param_hashes_across_dp_replicas(const model::ParamStore& params,
                                           const parallel::ParallelState& ps,
                                           comm::Communicator& world, int64_t iteration) {
  // Dense parameters over DP (x CP), experts over the expert-data-parallel group. Every
  // member of a group holds the same parameters, so each calls the gather or none does.
  // The group's first member reports for the group.
  std::string report;
  const std::pair<model::GradGroup, comm::Communicator*> kinds[] = {
      {model::GradGroup::Dense, &data_cp_group(ps)}, {model::GradGroup::Expert, &ps.expert_dp()}};
  for (const auto& [which, group] : kinds) {
    const Hashes mine = hash_params(params, which);
    if (mine.index.empty()) continue;
    const auto all = parallel::all_gather_u64(*group, mine.hash);
    if (group->rank() != 0) continue;
    const std::string found = compare(params, mine, all, *group);
    if (!found.empty()) report.append(report.empty() ? "" : "\n").append(found);
  }
  // The world's verdict: every rank sees every group's findings (each begins "  over ").
  std::string what;
  size_t groups = 0;
  for (const std::string& r : parallel::all_gather_strings(world, report)) {
    size_t at = 0;
    while (at < r.size()) {
      size_t end = r.find("\n  over ", at);
      end = end == std::string::npos ? r.size() : end;
      if (++groups <= kGroupsShown) what.append("\n").append(r, at, end - at);
      at = end + 1;
    }
  }
  if (groups == 0) return;
  if (groups > kGroupsShown)
    what += fmt::format("\n  ... and {} more groups", groups - kGroupsShown);
  throw Error(fmt::format("Parameter hashes not matching across DP replicas after {} iterations "
                          "({} hashes of each parameter's bytes){}",
                          iteration, hash64_algorithm(), what),
              "replicas apply the same update to the same weights, so this is a fault (a GPU's "
              "memory, a reduction): restart from the last checkpoint; if the same ranks "
              "differ again, suspect their GPUs or hosts");
}

}  // namespace mcpp::training
