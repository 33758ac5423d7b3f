// Small collectives on host values over any group: the numbers and strings the trainer,
// the checkpoint orchestration and the logs exchange between ranks (CPU tensors, which
// every backend's groups accept).
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "comm/communicator.h"

namespace mcpp::parallel {

// Sum of one number over the group.
double sum_over(comm::Communicator& group, double v);
// Element-wise sum of `values` over the group, in place (every member passes as many).
void sum_over(comm::Communicator& group, std::vector<double>& values);
// Every member's `mine`, by group rank (lengths first, then the bytes padded to the
// longest).
std::vector<std::string> all_gather_strings(comm::Communicator& group, const std::string& mine);
// Every member's `mine`, by group rank, in two collectives (the lengths, then the values
// padded to the longest); the members may hold different numbers of values.
std::vector<std::vector<uint64_t>> all_gather_u64(comm::Communicator& group,
                                                  std::span<const uint64_t> mine);
// (min, max) over the group of each of `values`, element by element (Megatron's timers'
// "(min, max) time across ranks"). Every member passes the same number of values (checked:
// an error names both counts).
std::vector<std::pair<double, double>> min_max_over(comm::Communicator& group,
                                                    std::span<const double> values);

}  // namespace mcpp::parallel
