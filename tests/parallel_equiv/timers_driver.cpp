// timers_driver: under `mpirun -np 2`, Megatron's "(min, max) time across ranks" really
// reduces across ranks (it once printed each rank's own value twice):
//   * parallel::min_max_over against values that differ by rank, known in advance;
//   * training::timers_min_max with real timers where rank 1 is made slower (it sleeps
//     longer inside the timed section): the (min, max) must equal the min and max of the
//     ranks' own times, gathered separately here as the oracle, and differ from each other;
//   * members disagreeing on the number of values get an error, not a hang;
//   * format_timer_lines' layout.
// Prints "all checks passed" or FAIL lines.
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "base/error.h"
#include "comm/world.h"
#include "ops/ops.h"
#include "parallel/host_collectives.h"
#include "training/training_log.h"

using namespace mcpp;

namespace {

int g_fail = 0;

void check(bool ok, const std::string& what, int rank) {
  if (!ok && g_fail++ < 20) std::printf("[rank %d] FAIL: %s\n", rank, what.c_str());
}

}  // namespace

int main() {
  auto world = comm::init({.timeout = std::chrono::seconds(60)});
  comm::Communicator& w = world->world();
  const int me = w.rank();
  if (w.size() != 2) {
    std::printf("FAIL: run under mpirun -np 2\n");
    return 1;
  }

  // Known values: rank r holds 10 (r + 1), -(r + 1), 5.
  {
    const std::vector<double> v = {10.0 * (me + 1), -(me + 1.0), 5.0};
    const auto mm = parallel::min_max_over(w, v);
    check(mm.size() == 3, "min_max_over: 3 results", me);
    check(mm[0] == std::make_pair(10.0, 20.0),
          fmt::format("min_max_over[0] = ({}, {}), want (10, 20)", mm[0].first, mm[0].second), me);
    check(mm[1] == std::make_pair(-2.0, -1.0),
          fmt::format("min_max_over[1] = ({}, {}), want (-2, -1)", mm[1].first, mm[1].second), me);
    check(mm[2] == std::make_pair(5.0, 5.0),
          fmt::format("min_max_over[2] = ({}, {}), want (5, 5)", mm[2].first, mm[2].second), me);
  }

  // Real timers, rank 1 slower: 2 iterations of a section taking 2 ms (rank 0) or 30 ms
  // (rank 1) each.
  {
    Timers timers;
    for (int it = 0; it < 2; ++it) {
      timers("forward-backward").start();
      std::this_thread::sleep_for(std::chrono::milliseconds(me == 0 ? 2 : 30));
      timers("forward-backward").stop();
      timers("optimizer").start();
      timers("optimizer").stop();
    }
    // The oracle: each rank's own ms per iteration, gathered.
    std::vector<double> mine;
    for (const auto& [name, t] : timers.all())
      mine.push_back(timers(name).elapsed(false) * 1e3 / 2);
    Tensor in = Tensor::empty({int64_t(mine.size())}, DType::F64);
    Tensor all = Tensor::empty({2 * int64_t(mine.size())}, DType::F64);
    for (size_t i = 0; i < mine.size(); ++i) in.data<double>()[i] = mine[i];
    w.all_gather(in, all, ops::default_stream(Device::CPU));
    const auto got = training::timers_min_max(timers, 2, w);
    check(got.size() == 2 && got[0].first == "forward-backward" && got[1].first == "optimizer",
          "timers_min_max: the timers by name", me);
    for (size_t i = 0; i < got.size() && i < mine.size(); ++i) {
      const double r0 = all.data<double>()[i], r1 = all.data<double>()[mine.size() + i];
      const auto [lo, hi] = got[i].second;
      check(lo == std::min(r0, r1) && hi == std::max(r0, r1),
            fmt::format("{}: (min, max) = ({}, {}), the ranks' own times are {} and {}",
                        got[i].first, lo, hi, r0, r1),
            me);
    }
    // sleep_for sleeps at least as long as asked: rank 1's 30 ms per iteration is the max.
    check(
        !got.empty() && got[0].second.second >= 30.0 && got[0].second.first < got[0].second.second,
        fmt::format("forward-backward: max {} ms should be rank 1's >= 30 ms, above the min {}",
                    got.empty() ? 0.0 : got[0].second.second,
                    got.empty() ? 0.0 : got[0].second.first),
        me);
    // The timers were reset: the next interval starts from zero.
    check(timers("forward-backward").elapsed(false) == 0.0, "timers reset after the reduction", me);
  }

  // A mismatch in the number of values is an error on every member.
  {
    std::vector<double> v(size_t(me + 1), 1.0);
    bool threw = false;
    try {
      parallel::min_max_over(w, v);
    } catch (const Error& e) {
      threw = std::string(e.what()).find("same list") != std::string::npos;
    }
    check(threw, "min_max_over with 1 and 2 values: an error naming the mismatch", me);
  }

  {
    const auto lines = training::format_timer_lines({"optimizer"}, {{1.0, 2.5}});
    // Dots pad the name to 48 characters (at least 2), as the trainer has always printed.
    const std::string want = "    optimizer " + std::string(48 - 9, '.') + ": (1.00, 2.50)";
    check(lines.size() == 1 && lines[0] == want,
          fmt::format("format_timer_lines: '{}'", lines.empty() ? "" : lines[0]), me);
  }

  // Everyone's verdict, so that both ranks print the same.
  Tensor f = Tensor::empty({1}, DType::F64);
  f.data<double>()[0] = g_fail;
  w.all_reduce(f, comm::ReduceOp::Sum, ops::default_stream(Device::CPU));
  if (f.data<double>()[0] == 0 && me == 0) std::printf("all checks passed\n");
  return f.data<double>()[0] == 0 ? 0 : 1;
}
