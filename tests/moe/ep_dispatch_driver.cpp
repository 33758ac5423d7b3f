// The all-to-all token dispatcher (parallel/expert_parallel/alltoall_dispatch.h) under
// mpirun, against a reference every rank computes itself: rank r's rows per global expert
// are a known function of (scenario, r, e), and each row's values say where it came from,
// so a rank knows exactly which rows it must receive, in which order. Checked per scenario,
// dtype (f64, f32) and EP group (the expert grid's EP group of a ParallelState):
//   * the plan: splits, counts per local expert (the grouped GEMM's m splits);
//   * dispatch: every received row, exactly, in [local expert][source rank] order;
//   * combine(dispatch(x)) == x (rows come back to their places);
//   * the duals: sum over ranks <dispatch(x), g> == sum over ranks <x, dispatch_backward(g)>,
//     and the same for combine / combine_backward, with random x and g;
// Scenarios: mixed counts with an expert nobody routes to; the same with a rank that sends
// nothing; every row to the last expert (all ranks but one receive nothing); no rows at all.
//
//   ep_dispatch_driver EP EL     world = any multiple of EP; EL experts per EP rank
// Exit status 0 when every check passed (rank 0 prints the verdict).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "comm/world.h"
#include "ops/ops.h"
#include "parallel/expert_parallel/alltoall_dispatch.h"
#include "parallel/parallel_state.h"

using namespace mcpp;
namespace ep = mcpp::parallel::expert_parallel;

namespace {

int g_failures = 0, g_rank = 0;

void fail(const std::string& what) {
  if (g_failures++ < 20) std::fprintf(stderr, "[rank %d] FAIL: %s\n", g_rank, what.c_str());
}

// Rows rank r sends to global expert e.
int64_t count(int scenario, int r, int64_t e, int EP, int64_t E) {
  switch (scenario) {
    case 0:
      if (e == 1) return 0;  // an expert nobody routes to
      return 1 + (r * 7 + e * 3) % 4;
    case 1:
      if (r == EP - 1 || e == 1) return 0;  // and a rank that sends nothing
      return (r * 7 + e * 3) % 4;
    case 2:
      return e == E - 1 ? 2 + r : 0;  // everything to the last expert
    default:
      return 0;
  }
}

constexpr int64_t W = 3;  // row width
// The value of column c of rank r's i-th row of expert e (exact in bf16 range of f32).
double value(int r, int64_t e, int64_t i, int64_t c) { return r * 1000 + e * 40 + i * 4 + c; }

double get(const Tensor& t, int64_t i) {
  return t.dtype() == DType::F64 ? t.data<double>()[i] : double(t.data<float>()[i]);
}
void set(Tensor& t, int64_t i, double v) {
  if (t.dtype() == DType::F64)
    t.data<double>()[i] = v;
  else
    t.data<float>()[i] = float(v);
}

double dot(const Tensor& a, const Tensor& b) {
  double d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) d += get(a, i) * get(b, i);
  return d;
}

double group_sum(double v, comm::Communicator& g) {
  Tensor t = Tensor::from(std::vector<double>{v}, {1});
  g.all_reduce(t, comm::ReduceOp::Sum, Stream::cpu());
  return t.data<double>()[0];
}

void run_case(int scenario, DType dt, comm::Communicator& g, int64_t El, std::mt19937_64& rng) {
  Stream& s = Stream::cpu();
  const int EP = g.size(), me = g.rank();
  const int64_t E = EP * El;
  const std::string tag = fmt::format("scenario {} {} EP {} El {}", scenario, dtype_name(dt), EP, El);
  std::vector<int64_t> counts(static_cast<size_t>(E));
  int64_t rows_in = 0;
  for (int64_t e = 0; e < E; ++e) rows_in += counts[size_t(e)] = count(scenario, me, e, EP, E);
  Tensor x = Tensor::empty({rows_in, W}, dt);
  {
    int64_t row = 0;
    for (int64_t e = 0; e < E; ++e)
      for (int64_t i = 0; i < counts[size_t(e)]; ++i, ++row)
        for (int64_t c = 0; c < W; ++c) set(x, row * W + c, value(me, e, i, c));
  }
  const ep::AlltoallPlan p = ep::plan_alltoall(counts, &g, s);

  // The plan and the rows, against the reference order [local expert][source][row].
  std::vector<double> want;
  std::vector<int64_t> per_expert(size_t(El), 0), from(size_t(EP), 0);
  for (int64_t j = 0; j < El; ++j)
    for (int src = 0; src < EP; ++src) {
      const int64_t e = me * El + j, n = count(scenario, src, e, EP, E);
      per_expert[size_t(j)] += n, from[size_t(src)] += n;
      for (int64_t i = 0; i < n; ++i)
        for (int64_t c = 0; c < W; ++c) want.push_back(value(src, e, i, c));
    }
  const int64_t rows_out = int64_t(want.size()) / W;
  if (p.rows_in != rows_in || p.rows_out != rows_out)
    fail(fmt::format("{}: plan rows {} -> {}, want {} -> {}", tag, p.rows_in, p.rows_out, rows_in,
                     rows_out));
  if (p.tokens_per_local_expert != per_expert) fail(tag + ": tokens per local expert");
  if (p.output_splits != from) fail(tag + ": output splits");
  Tensor y = Tensor::empty({rows_out, W}, dt);
  ep::dispatch_alltoall(x, y, p, &g, s);
  for (int64_t i = 0; i < y.numel() && i < int64_t(want.size()); ++i)
    if (get(y, i) != want[size_t(i)]) {
      fail(fmt::format("{}: dispatched element {} is {}, want {}", tag, i, get(y, i), want[size_t(i)]));
      break;
    }

  // Round trip: the experts' rows go back where they came from.
  Tensor back = Tensor::empty({rows_in, W}, dt);
  ep::combine_alltoall(y, back, p, &g, s);
  for (int64_t i = 0; i < x.numel(); ++i)
    if (get(back, i) != get(x, i)) {
      fail(fmt::format("{}: combine(dispatch(x)) differs at {}", tag, i));
      break;
    }

  // Duals: <D x, g>_group == <x, D^T g>_group for random x, g.
  std::uniform_real_distribution<double> u(-1, 1);
  Tensor xr = Tensor::empty({rows_in, W}, dt), gr = Tensor::empty({rows_out, W}, dt);
  for (int64_t i = 0; i < xr.numel(); ++i) set(xr, i, u(rng));
  for (int64_t i = 0; i < gr.numel(); ++i) set(gr, i, u(rng));
  Tensor dx = Tensor::empty({rows_out, W}, dt), dtg = Tensor::empty({rows_in, W}, dt);
  ep::dispatch_alltoall(xr, dx, p, &g, s);
  ep::dispatch_alltoall_backward(gr, dtg, p, &g, s);
  const double l1 = group_sum(dot(dx, gr), g), r1 = group_sum(dot(xr, dtg), g);
  if (std::abs(l1 - r1) > 1e-12 * (1 + std::abs(l1)))
    fail(fmt::format("{}: dispatch dual: {} vs {}", tag, l1, r1));
  Tensor cy = Tensor::empty({rows_in, W}, dt), cg = Tensor::empty({rows_out, W}, dt);
  ep::combine_alltoall(gr, cy, p, &g, s);  // combine: [rows_out] -> [rows_in]
  ep::combine_alltoall_backward(xr, cg, p, &g, s);
  const double l2 = group_sum(dot(cy, xr), g), r2 = group_sum(dot(gr, cg), g);
  if (std::abs(l2 - r2) > 1e-12 * (1 + std::abs(l2)))
    fail(fmt::format("{}: combine dual: {} vs {}", tag, l2, r2));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    auto w = comm::init({});
    g_rank = w->rank();
    const int EP = argc > 1 ? std::atoi(argv[1]) : 1;
    const int64_t El = argc > 2 ? std::atoll(argv[2]) : 2;
    parallel::ParallelSizes sz;
    sz.ep = EP;
    parallel::ParallelState ps(*w, sz);
    comm::Communicator& g = ps.ep();
    if (g.size() != EP) fail(fmt::format("EP group of {} ranks, want {}", g.size(), EP));
    std::mt19937_64 rng(1234 + uint64_t(w->rank()));
    int cases = 0;
    for (int scenario = 0; scenario < 4; ++scenario)
      for (DType dt : {DType::F64, DType::F32}) run_case(scenario, dt, g, El, rng), ++cases;
    Tensor f = Tensor::from(std::vector<double>{double(g_failures)}, {1});
    w->world().all_reduce(f, comm::ReduceOp::Sum, Stream::cpu());
    const int total = int(f.data<double>()[0]);
    if (w->rank() == 0)
      std::printf("ep_dispatch_driver: %d ranks, EP %d, %lld experts per rank, %d cases: %s\n",
                  w->size(), EP, (long long)El, cases, total == 0 ? "all checks passed" : "FAILED");
    return total == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "[rank %d] ERROR: %s\n", g_rank, e.what());
    return 1;
  }
}
