#include "checkpoint/fully_parallel.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>

#include "base/error.h"
#include "ops/ops.h"
#include "parallel/host_collectives.h"

namespace mcpp::checkpoint {

std::vector<int> distribute_by_bytes(std::span<const int64_t> bytes,
                                     std::span<const std::vector<int>> holders) {
  MCPP_CHECK(bytes.size() == holders.size(), "distribute_by_bytes: {} sizes for {} items",
             bytes.size(), holders.size());
  std::vector<size_t> order(bytes.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (holders[a].size() != holders[b].size()) return holders[a].size() < holders[b].size();
    return bytes[a] > bytes[b];
  });
  std::map<int, int64_t> load;  // group rank -> bytes assigned so far
  std::vector<int> owner(bytes.size(), -1);
  for (size_t i : order) {
    MCPP_CHECK(!holders[i].empty(), "distribute_by_bytes: item {} has no holder", i);
    int best = holders[i][0];
    for (int r : holders[i])
      if (load[r] < load[best] || (load[r] == load[best] && r < best)) best = r;
    owner[i] = best;
    load[best] += bytes[i];
  }
  return owner;
}

std::vector<int> distribute_by_bytes(std::span<const int64_t> bytes, int group_size) {
  std::vector<int> all(size_t(std::max(group_size, 1)));
  std::iota(all.begin(), all.end(), 0);
  const std::vector<std::vector<int>> holders(bytes.size(), all);
  return distribute_by_bytes(bytes, holders);
}

// Every replica lists the same tensors (dense ones on the DP x CP replicas, experts on the
// expert-DP replicas) in the same order and assigns them by bytes alike.
std::set<std::string> written_by_others(const RankSnapshot& rank) {
  std::set<std::string> others;
  for (const bool experts : {false, true}) {
    const RankSnapshot::Share sh = experts ? rank.expert_share : rank.dense_share;
    if (sh.count <= 1 || !(experts ? rank.write_experts : rank.write_dense)) continue;
    std::vector<std::string> keys;
    std::vector<int64_t> bytes;
    auto item = [&](const std::string& key, int64_t n, DType dt) {
      keys.push_back(key), bytes.push_back(n * int64_t(dtype_size(dt)));
    };
    for (const model::ParamInfo& p : rank.infos) {  // write_rank_files' rule
      const bool dup = p.split == model::TpSplit::None && dup_rank(rank, p.expert) != 0;
      if (dup || p.pipeline_duplicate || (p.expert >= 0) != experts) continue;
      item(p.name, p.numel(), rank.params.dtype());
      if (rank.exp_avg.defined()) {
        item("optimizer.exp_avg." + p.name, p.numel(), rank.exp_avg.dtype());
        if (rank.exp_avg_sq.defined())
          item("optimizer.exp_avg_sq." + p.name, p.numel(), rank.exp_avg_sq.dtype());
      }
    }
    for (const model::BufferInfo& b : rank.buffer_infos) {
      if ((b.split == model::TpSplit::None && dup_rank(rank, b.expert) != 0) ||
          (b.expert >= 0) != experts)
        continue;
      item(b.name, b.numel(), b.dtype);
    }
    const std::vector<int> owner = distribute_by_bytes(bytes, sh.count);
    for (size_t i = 0; i < keys.size(); ++i)
      if (owner[i] != sh.index) others.insert(keys[i]);
  }
  return others;
}

namespace {

// What every member needs: id -> (dtype, elements, holders), the ids in sorted order.
struct Needed {
  DType dtype;
  int64_t numel = 0;
  std::vector<int> holders;
};

// "E<message>" from a member that failed before reading; else one "id\tdtype\tnumel" line
// per item.
std::string describe_items(const std::vector<ReadItem>& items) {
  std::string s = "I";
  for (const ReadItem& it : items) {
    MCPP_CHECK(it.id.find_first_of("\t\n") == std::string::npos,
               "checkpoint tensor id '{}' holds a tab or newline", it.id);
    s += fmt::format("{}\t{}\t{}\n", it.id, dtype_name(it.dst.dtype()), it.dst.numel());
  }
  return s;
}

}  // namespace

ExchangeReport read_and_exchange(comm::Communicator& group, std::vector<ReadItem>& items,
                                 const std::string& failure) {
  ExchangeReport rep;
  rep.items = int64_t(items.size());
  Stream& st = ops::default_stream(Device::CPU);
  // 1. Who needs what (or who failed before reading anything).
  const std::vector<std::string> lists =
      parallel::all_gather_strings(group, failure.empty() ? describe_items(items) : "E" + failure);
  if (!failure.empty()) return rep;  // the caller rethrows its own error
  for (size_t r = 0; r < lists.size(); ++r)
    if (!lists[r].empty() && lists[r][0] == 'E')
      MCPP_FAIL("rank {} of {} failed: {}", r, group.describe(), lists[r].substr(1));
  std::map<std::string, Needed> need;
  for (size_t r = 0; r < lists.size(); ++r) {
    std::istringstream in(lists[r].substr(1));
    std::string line;
    while (std::getline(in, line)) {
      const size_t a = line.find('\t'), b = line.find('\t', a + 1);
      MCPP_CHECK(a != std::string::npos && b != std::string::npos, "malformed item '{}'", line);
      const std::string id = line.substr(0, a);
      const DType dt = dtype_from_name(line.substr(a + 1, b - a - 1));
      const int64_t n = std::stoll(line.substr(b + 1));
      auto [it, fresh] = need.try_emplace(id, Needed{dt, n, {}});
      MCPP_CHECK(fresh || (it->second.dtype == dt && it->second.numel == n),
                 "checkpoint tensor {}: ranks of {} expect {} {} and {} {} elements", id,
                 group.describe(), dtype_name(it->second.dtype), it->second.numel,
                 dtype_name(dt), n);
      it->second.holders.push_back(int(r));
    }
  }
  // 2. Who reads what: balanced by bytes over the ranks that need each tensor.
  std::vector<int64_t> bytes;
  std::vector<std::vector<int>> holders;
  for (const auto& [id, n] : need) {
    bytes.push_back(n.numel * int64_t(dtype_size(n.dtype)));
    holders.push_back(n.holders);
  }
  const std::vector<int> owner = distribute_by_bytes(bytes, holders);
  std::map<std::string, int> owner_of;
  {
    size_t i = 0;
    for (const auto& [id, n] : need) owner_of[id] = owner[i++];
  }
  // 3. This rank's share from storage; a failure anywhere stops every member here.
  std::map<std::string, ReadItem*> mine;
  for (ReadItem& it : items) {
    MCPP_CHECK(mine.emplace(it.id, &it).second, "checkpoint tensor {} is needed twice", it.id);
  }
  std::string error;
  try {
    for (ReadItem& it : items)
      if (owner_of.at(it.id) == group.rank()) it.read(), ++rep.items_read;
  } catch (const Error& e) {
    error = e.summary().empty() ? std::string("an error") : e.summary();
    parallel::all_gather_strings(group, error);
    throw;
  } catch (const std::exception& e) {
    error = *e.what() ? e.what() : "an error";
    parallel::all_gather_strings(group, error);
    throw;
  }
  const std::vector<std::string> errs = parallel::all_gather_strings(group, error);
  for (size_t r = 0; r < errs.size(); ++r)
    if (!errs[r].empty())
      MCPP_FAIL("rank {} of {} could not read its share of the checkpoint: {}", r,
                group.describe(), errs[r]);
  // 4. Each tensor that another rank needs, from the rank that read it (Megatron's
  // "broadcast" exchange). Ranks that do not need it receive it into scratch memory.
  for (const auto& [id, n] : need) {
    const int src = owner_of.at(id);
    if (n.holders.size() == 1 && n.holders[0] == src) continue;  // nobody else needs it
    auto it = mine.find(id);
    Tensor t = it != mine.end() ? it->second->dst.view({n.numel})
                                : Tensor::empty({n.numel}, n.dtype);
    group.broadcast(t, src, st);
    if (it != mine.end() && src != group.rank()) rep.bytes_received += t.nbytes();
  }
  return rep;
}

}  // namespace mcpp::checkpoint
