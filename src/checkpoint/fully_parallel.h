// Fully parallel checkpoint save and load (Megatron's dist_checkpointing/strategies/
// fully_parallel.py and exchange_utils.py): the tensors that several ranks hold identical
// copies of (the DP x CP replicas of one TP/PP shard; the expert-DP replicas of one EP
// rank's experts) are written, or read, once, by one of those ranks, chosen so that every
// rank handles about the same number of bytes.
//
//   save: no data moves. Every replica computes the same assignment from its own list of
//         tensors (identical on every replica) and writes its share into files of its own
//         (model_tpXX_ppXX_dpXX); metadata.json says which file holds which tensor.
//   load: the replicas of a group exchange the ids of the tensors they need, each reads its
//         share from storage (checksums verified as always), and each tensor is then
//         broadcast from the rank that read it to the group. The result is bit for bit the
//         one of every rank reading everything itself.
#pragma once
#include <cstdint>
#include <functional>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "checkpoint/checkpoint.h"
#include "comm/communicator.h"
#include "tensor/tensor.h"

namespace mcpp::checkpoint {

// Megatron's distribute_shards_to_ranks: item i (bytes[i], held by the group ranks
// holders[i]) goes to the holder with the fewest bytes so far (ties: the lowest rank);
// items held by fewer ranks first, then larger first, then in index order. Every member
// computes the same result from the same lists.
std::vector<int> distribute_by_bytes(std::span<const int64_t> bytes,
                                     std::span<const std::vector<int>> holders);
// Every one of `group_size` ranks holds every item.
std::vector<int> distribute_by_bytes(std::span<const int64_t> bytes, int group_size);

// Fully parallel save: of the tensors `rank` would write alone (write_rank_files' rule), the
// keys (moments with their "optimizer.exp_avg." prefix) that another replica writes instead,
// by rank.dense_share / expert_share. No data moves.
std::set<std::string> written_by_others(const RankSnapshot& rank);

// One tensor a loading rank needs. Two ranks' items with the same id hold the same values
// after the load (the id names the checkpoint key and the rank's boxes of it), so either may
// read it for both. read() fills dst from storage; dst is a contiguous host tensor.
struct ReadItem {
  std::string id;
  Tensor dst;
  std::function<void()> read;
};

struct ExchangeReport {
  int64_t items = 0, items_read = 0;  // this rank's tensors, and those it read itself
  uint64_t bytes_received = 0;        // of this rank's tensors, through the exchange
};

// Collective over `group` (every member calls it once per load, with its own items):
// reads this rank's share and exchanges the rest. `failure` non-empty: this rank failed
// before (the metadata checks); it reads nothing, and every member throws. A member whose
// read fails makes every member throw (its own error there; the others name its rank).
ExchangeReport read_and_exchange(comm::Communicator& group, std::vector<ReadItem>& items,
                                 const std::string& failure = {});

}  // namespace mcpp::checkpoint
