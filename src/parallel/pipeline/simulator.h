// Replays per-stage action lists (schedule.h) with a cost model, without a model
// or MPI: the oracle for schedule tests and the engine of `megatron plan`.
//
// Matching. Transfers are matched per channel (src stage, dst stage, activation |
// gradient) in order: the n-th send with the n-th receive. A pair whose
// (micro-batch, chunk) do not agree is a mismatch (the receiver would consume the
// wrong tensor); a channel with more sends than receives (or the reverse) is
// unmatched. Both are reported before any timing.
//
// Timing. Every stage runs its list in order on its own clock. Forward and
// backward take CostModel time; a batch of transfers (Action::batch) is posted
// as a whole, then:
//   Eager       sends complete at once (buffered, like isend of a small message);
//               a receive completes when its matching send has been posted.
//   Rendezvous  a send and its receive complete together, once both sides have
//               posted them (like NCCL send/recv of a large tensor). Stricter:
//               a schedule that is deadlock-free here is deadlock-free on NCCL.
// A transfer completes at max(post times) + p2p cost. When no stage can move and
// some are unfinished, the replay reports a deadlock naming what each stuck
// stage waits for.
#pragma once
#include <string>
#include <vector>

#include "parallel/pipeline/schedule.h"

namespace mcpp::parallel::pipeline {

struct CostModel {
  double forward = 1.0;   // one model chunk's forward on one micro-batch
  double backward = 2.0;  // its backward
  double p2p = 0.0;       // one transfer (latency; sends are otherwise free)
  // Optional [stage][chunk] factor on forward and backward (e.g. layers in the chunk
  // over layers in an even stage, for uneven splits); empty = 1 everywhere.
  std::vector<std::vector<double>> scale;
  double factor(int stage, int chunk) const {
    return scale.empty() ? 1.0 : scale.at(size_t(stage)).at(size_t(chunk));
  }
};

enum class P2PSemantics : uint8_t { Eager, Rendezvous };

struct StageStats {
  double busy = 0;         // time spent in forward/backward
  double idle = 0;         // makespan - busy: waiting, at the start, between, at the end
  double finish = 0;       // when its last action completed
  int peak_in_flight = 0;  // most (microbatch, chunk) forwards held whose backward has not run
};

struct SimResult {
  bool ok = false;                    // no problems, no deadlock
  std::vector<std::string> problems;  // mismatches, unmatched transfers, deadlock, bad order
  double makespan = 0;
  std::vector<StageStats> stages;
  // Mean over stages of idle / makespan (the pipeline bubble as a fraction of the step).
  double bubble_fraction = 0;
  // [stage][step]: when each action completed (forward/backward: start = end - cost).
  std::vector<std::vector<double>> end_time;
};

SimResult simulate(const Schedule& schedule, const CostModel& cost = {},
                   P2PSemantics semantics = P2PSemantics::Eager);

}  // namespace mcpp::parallel::pipeline
