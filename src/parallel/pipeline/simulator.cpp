#include "parallel/pipeline/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

namespace mcpp::parallel::pipeline {
namespace {

constexpr double kNotYet = std::numeric_limits<double>::quiet_NaN();

bool is_transfer(Op op) { return op != Op::Forward && op != Op::Backward; }
bool is_send(Op op) { return op == Op::SendActivation || op == Op::SendGrad; }
bool is_activation(Op op) { return op == Op::SendActivation || op == Op::RecvActivation; }

std::string describe(const Action& a) {
  std::string s = fmt::format("{} micro-batch {} chunk {}", to_string(a.op), a.microbatch, a.chunk);
  if (is_transfer(a.op))
    s += fmt::format(" {} stage {}", is_send(a.op) ? "to" : "from", a.peer_stage);
  return s;
}

struct Ref {
  int stage, index;
};

}  // namespace

SimResult simulate(const Schedule& sched, const CostModel& cost, P2PSemantics semantics) {
  SimResult res;
  const int pp = int(sched.size());
  res.stages.resize(pp);

  // ---- static matching: channel (src, dst, is_activation) -> sends, receives in order ----
  std::map<std::tuple<int, int, bool>, std::pair<std::vector<Ref>, std::vector<Ref>>> channels;
  for (int s = 0; s < pp; ++s)
    for (int i = 0; i < int(sched[s].size()); ++i) {
      const Action& a = sched[s][i];
      if (!is_transfer(a.op)) continue;
      if (a.peer_stage < 0 || a.peer_stage >= pp || a.peer_stage == s) {
        res.problems.push_back(
            fmt::format("stage {} step {}: {} has an invalid peer", s, i, describe(a)));
        continue;
      }
      const bool send = is_send(a.op);
      auto key = send ? std::tuple(s, a.peer_stage, is_activation(a.op))
                      : std::tuple(a.peer_stage, s, is_activation(a.op));
      (send ? channels[key].first : channels[key].second).push_back({s, i});
    }
  std::vector<std::vector<Ref>> partner(pp);
  for (int s = 0; s < pp; ++s) partner[s].assign(sched[s].size(), Ref{-1, -1});
  for (auto& [key, ch] : channels) {
    auto [src, dst, act] = key;
    const char* what = act ? "activation" : "gradient";
    auto& [sends, recvs] = ch;
    if (sends.size() != recvs.size())
      res.problems.push_back(fmt::format("{} channel stage {} -> {}: {} sends but {} receives",
                                         what, src, dst, sends.size(), recvs.size()));
    for (size_t n = 0; n < std::min(sends.size(), recvs.size()); ++n) {
      const Action& a = sched[src][sends[n].index];
      const Action& b = sched[dst][recvs[n].index];
      // Activations wrap from the last stage's chunk c to stage 0's chunk c+1;
      // gradients from stage 0's chunk c to the last stage's chunk c-1.
      const int want_chunk = act ? a.chunk + (src == pp - 1 ? 1 : 0) : a.chunk - (src == 0 ? 1 : 0);
      if (a.microbatch != b.microbatch || b.chunk != want_chunk)
        res.problems.push_back(fmt::format(
            "{} channel stage {} -> {}, transfer {}: sender has micro-batch {} chunk {} "
            "(step {}), receiver expects micro-batch {} chunk {} (step {})",
            what, src, dst, n, a.microbatch, a.chunk, sends[n].index, b.microbatch, b.chunk,
            recvs[n].index));
      partner[src][sends[n].index] = recvs[n];
      partner[dst][recvs[n].index] = sends[n];
    }
  }
  if (!res.problems.empty()) return res;

  // ---- timed replay ----
  std::vector<size_t> pc(pp, 0);
  std::vector<double> clock(pp, 0.0);
  std::vector<bool> posted(pp, false);
  std::vector<std::vector<double>> post_time(pp), done_time(pp);
  std::vector<std::set<std::pair<int, int>>> held(pp), seen_fwd(pp), seen_bwd(pp);
  for (int s = 0; s < pp; ++s) {
    post_time[s].assign(sched[s].size(), kNotYet);
    done_time[s].assign(sched[s].size(), kNotYet);
  }
  auto unit_end = [&](int s, size_t i) {
    const auto& L = sched[s];
    if (!is_transfer(L[i].op) || L[i].batch < 0) return i + 1;
    size_t e = i + 1;
    while (e < L.size() && is_transfer(L[e].op) && L[e].batch == L[i].batch) ++e;
    return e;
  };

  bool progress = true;
  while (progress) {
    progress = false;
    for (int s = 0; s < pp; ++s) {
      auto& st = res.stages[s];
      while (pc[s] < sched[s].size()) {
        const Action& a = sched[s][pc[s]];
        if (!is_transfer(a.op)) {
          const auto key = std::pair(a.microbatch, a.chunk);
          if (a.op == Op::Forward) {
            if (!seen_fwd[s].insert(key).second)
              res.problems.push_back(
                  fmt::format("stage {}: second forward of micro-batch {} "
                              "chunk {}",
                              s, a.microbatch, a.chunk));
            held[s].insert(key);
            st.peak_in_flight = std::max(st.peak_in_flight, int(held[s].size()));
            const double t = cost.forward * cost.factor(s, a.chunk);
            clock[s] += t, st.busy += t;
            done_time[s][pc[s]] = clock[s];
          } else {
            if (!held[s].erase(key))
              res.problems.push_back(
                  fmt::format("stage {}: backward of micro-batch {} chunk {} "
                              "without a forward before it",
                              s, a.microbatch, a.chunk));
            if (!seen_bwd[s].insert(key).second)
              res.problems.push_back(
                  fmt::format("stage {}: second backward of micro-batch {} "
                              "chunk {}",
                              s, a.microbatch, a.chunk));
            const double t = cost.backward * cost.factor(s, a.chunk);
            clock[s] += t, st.busy += t;
            done_time[s][pc[s]] = clock[s];
          }
          ++pc[s];
          progress = true;
          continue;
        }
        const size_t e = unit_end(s, pc[s]);
        if (!posted[s]) {
          for (size_t i = pc[s]; i < e; ++i) post_time[s][i] = clock[s];
          posted[s] = true;
          progress = true;
        }
        bool all_done = true;
        for (size_t i = pc[s]; i < e; ++i) {
          if (!std::isnan(done_time[s][i])) continue;
          const Ref p = partner[s][i];
          const double peer_post = post_time[p.stage][p.index];
          if (semantics == P2PSemantics::Eager && is_send(sched[s][i].op)) {
            done_time[s][i] = post_time[s][i] + cost.p2p;
          } else if (!std::isnan(peer_post)) {
            const double t = std::max(post_time[s][i], peer_post) + cost.p2p;
            done_time[s][i] = t;
            if (semantics == P2PSemantics::Rendezvous) done_time[p.stage][p.index] = t;
          } else {
            all_done = false;
          }
        }
        if (!all_done) break;
        for (size_t i = pc[s]; i < e; ++i) clock[s] = std::max(clock[s], done_time[s][i]);
        pc[s] = e;
        posted[s] = false;
        progress = true;
      }
    }
  }

  for (int s = 0; s < pp; ++s)
    if (pc[s] < sched[s].size())
      res.problems.push_back(fmt::format("deadlock: stage {} blocked at step {} ({})", s, pc[s],
                                         describe(sched[s][pc[s]])));
  for (int s = 0; s < pp; ++s) {
    res.stages[s].finish = clock[s];
    res.makespan = std::max(res.makespan, clock[s]);
    if (!held[s].empty() && pc[s] == sched[s].size())
      res.problems.push_back(
          fmt::format("stage {}: {} forwards never had their backward", s, held[s].size()));
  }
  double idle_sum = 0;
  for (auto& st : res.stages) {
    st.idle = res.makespan - st.busy;
    idle_sum += st.idle;
  }
  if (res.makespan > 0 && pp > 0) res.bubble_fraction = idle_sum / pp / res.makespan;
  res.end_time = std::move(done_time);
  res.ok = res.problems.empty();
  return res;
}

}  // namespace mcpp::parallel::pipeline
