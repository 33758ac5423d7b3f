// dist_optimizer_driver: under `mpirun -np 2` (the world is the data-parallel group),
// DistributedAdamW against AdamW, bit for bit. Both step the same parameters (odd sizes,
// padded to 16 elements, weight decay on some) with the same summed gradients: AdamW on
// every rank with g0 + g1, DistributedAdamW with each rank's own g_r reduce-scattered (one
// fp32 addition either way). After every step the model's flat parameters (padding
// included), the fp32 main parameters and the moments must agree exactly, for f32, bf16
// and f16 models. bf16/f16 is the path where the step writes the rounded parameters
// straight into this rank's block of the flat buffer and the all-gather runs in place
// (MPI_IN_PLACE); f32 gathers from the main parameters. Each with the parameter gather
// overlapped or not, one bucket or several, and in a group of one (each rank alone: the
// local backend, whose in-place gather copies nothing).
// Prints "all checks passed" or FAIL lines.
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "comm/world.h"
#include "model/params.h"
#include "ops/ops.h"
#include "optim/distributed_optimizer.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/grad_buffer.h"
#include "parallel/host_collectives.h"

using namespace mcpp;

namespace {

int g_fail = 0;

void check(bool ok, const std::string& what, int rank) {
  if (!ok && g_fail++ < 20) std::printf("[group rank %d] FAIL: %s\n", rank, what.c_str());
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.numel() == b.numel() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

// (numel, layer, weight decay), registry order.
struct Param {
  int64_t numel;
  int layer;
  bool decay;
};
const Param kParams[] = {{37, -1, true}, {64, 0, true},  {5, 0, false},
                         {130, 1, true}, {16, 1, false}, {77, -1, true}};

model::ParamStore make_params(DType dt) {
  model::ParamStore ps;
  int k = 0;
  for (const auto& p : kParams) {
    model::ParamInfo info;
    info.name = "p" + std::to_string(k++);
    info.global_shape = info.local_shape = {p.numel};
    info.init_std = 0.5;
    info.weight_decay = p.decay;
    info.layer = p.layer;
    ps.add(info);
  }
  ps.allocate(dt, DType::F32, Device::CPU, 0, 1);  // 16-element alignment
  ps.initialize(1234);
  return ps;
}

// Rank r's gradient of flat element i at step t (padding stays zero).
float grad(int t, int r, int64_t i) {
  return float(std::sin(0.37 * double(i) + 1.3 * r + 0.71 * t) * std::ldexp(1.0, int(i % 7) - 3));
}

// Gradients of ranks r0 .. r1-1 summed in fp32, in rank order (two ranks: the one
// addition the reduce-scatter makes).
void set_grads(model::ParamStore& ps, int t, int r0, int r1) {
  float* g = ps.flat_grads().data<float>();
  for (const auto& p : ps.infos())
    for (int64_t i = p.offset; i < p.offset + p.numel(); ++i) {
      float sum = grad(t, r0, i);
      for (int r = r0 + 1; r < r1; ++r) sum += grad(t, r, i);
      g[i] = sum;
    }
}

void run(comm::Communicator& dp, DType dt, int64_t bucket, bool overlap) {
  Stream& st = Stream::cpu();
  const int me = dp.rank(), R = dp.size();
  const bool whole = std::getenv("MCPP_FP32_MAIN_PARAMS") != nullptr;
  const std::string name =
      fmt::format("group of {}, {} model{}, bucket {}{}", R, dtype_name(dt),
                  dt == DType::BF16 ? (whole ? ", fp32 main params" : ", split main params") : "",
                  bucket, overlap ? ", overlapped gather" : "");
  model::ParamStore ref = make_params(dt), ps = make_params(dt);
  optim::AdamW ref_opt(ref, {});
  std::vector<parallel::ParamSpan> spans;
  for (size_t i = 0; i < ps.infos().size(); ++i) {
    const auto& p = ps.infos()[i];
    const int64_t next = i + 1 < ps.infos().size() ? ps.infos()[i + 1].offset : ps.total_numel();
    spans.push_back({p.offset, next - p.offset, p.layer});
  }
  parallel::DataParallelGrads grads(ps.flat_grads(), spans, dp, bucket, false, true);
  optim::DistributedAdamW opt(ps, {}, grads, overlap);
  check(opt.main_params_split() == (dt == DType::BF16 && !whole) &&
            ref_opt.main_params_split() == opt.main_params_split(),
        name + ": main parameters split as they should be", me);
  check(grads.buckets().size() > 1 || bucket > ps.total_numel(),
        name + ": expected several buckets", me);

  for (int t = 1; t <= 3; ++t) {
    const double lr = 1e-2 / t, wd = 0.1;
    set_grads(ref, t, 0, R);
    ref_opt.step(lr, wd);
    set_grads(ps, t, me, me + 1);
    grads.begin_final_backward();
    grads.finish(st);
    opt.step(lr, wd);
    if (overlap) opt.wait_params_all();

    const std::string at = fmt::format("{}, step {}", name, t);
    check(same_bits(ps.flat_params(), ref.flat_params()), at + ": model parameters differ", me);
    Tensor main = opt.gather_main_params();
    const Tensor want_main =
        ref_opt.has_main_params() ? ref_opt.full_main_params() : ref.flat_params();
    check(same_bits(main, want_main), at + ": main parameters differ", me);
    for (const auto& s : opt.segments()) {
      check(
          same_bits(opt.exp_avg().narrow(s.shard, s.len), ref_opt.exp_avg().narrow(s.flat, s.len)),
          fmt::format("{}: exp_avg of parameter {} differs", at, s.param), me);
      check(same_bits(opt.exp_avg_sq().narrow(s.shard, s.len),
                      ref_opt.exp_avg_sq().narrow(s.flat, s.len)),
            fmt::format("{}: exp_avg_sq of parameter {} differs", at, s.param), me);
    }
  }

  // Through the Optimizer interface: the squared gradient norm over a filter, each rank's
  // shard summed over DP, is AdamW's over the whole buffer (to fp64 rounding: the sums
  // run in other orders); all parameters, and every other one.
  set_grads(ref, 4, 0, R);
  set_grads(ps, 4, me, me + 1);
  grads.begin_final_backward();
  grads.finish(st);
  const optim::Optimizer& iface = opt;
  const optim::ParamFilter odd = [](size_t i) { return i % 2 == 1; };
  for (const optim::ParamFilter* f : {static_cast<const optim::ParamFilter*>(nullptr), &odd}) {
    const double got = parallel::sum_over(dp, iface.grad_sq_norm(f));
    const double want = ref_opt.grad_sq_norm(f);
    check(want > 0 && std::abs(got - want) <= 1e-12 * want,
          fmt::format("{}: grad_sq_norm{} {} != AdamW's {}", name, f ? " (odd parameters)" : "",
                      got, want),
          me);
  }
  // load_state: a fresh optimizer given the whole state (the reference's, laid out like
  // the parameters) holds this rank's shard of it, and the same main parameters.
  model::ParamStore ps2 = make_params(dt);
  parallel::DataParallelGrads grads2(ps2.flat_grads(), spans, dp, bucket, false, true);
  optim::DistributedAdamW fresh(ps2, {}, grads2);
  const Tensor values = ref_opt.full_main_params().defined() ? ref_opt.full_main_params()
                                                              : ref.flat_params();
  fresh.load_state(values, &ref_opt.exp_avg(), &ref_opt.exp_avg_sq());
  check(same_bits(ps2.flat_params(), ps.flat_params()), name + ": load_state: model parameters",
        me);
  check(same_bits(fresh.gather_main_params(), opt.gather_main_params()),
        name + ": load_state: main parameters", me);
  check(same_bits(fresh.exp_avg(), opt.exp_avg()) && same_bits(fresh.exp_avg_sq(), opt.exp_avg_sq()),
        name + ": load_state: moments", me);
}

}  // namespace

int g_bf16_runs = 0;

int main() {
  auto world = comm::init({.timeout = std::chrono::seconds(60)});
  comm::Communicator& dp = world->world();
  if (dp.size() != 2) {
    std::printf("FAIL: run under mpirun -np 2\n");
    return 1;
  }
  auto alone = world->split({{0}, {1}}, "alone");
  // bf16 twice: main parameters split into the model's values and lower halves (the
  // default, ops/split_main.h), then whole fp32 (MCPP_FP32_MAIN_PARAMS=1).
  for (DType dt : {DType::F32, DType::BF16, DType::F16, DType::BF16}) {
    const bool whole = dt == DType::BF16 && std::getenv("MCPP_FP32_MAIN_PARAMS") == nullptr &&
                       g_bf16_runs++ == 1;
    if (whole) setenv("MCPP_FP32_MAIN_PARAMS", "1", 1);
    run(*alone, dt, 100, false);
    for (int64_t bucket : {int64_t(100), int64_t(1 << 20)})
      for (bool overlap : {false, true}) run(dp, dt, bucket, overlap);
    if (whole) unsetenv("MCPP_FP32_MAIN_PARAMS");
  }
  if (g_fail == 0) std::printf("[rank %d] all checks passed\n", dp.rank());
  return g_fail ? 1 : 0;
}
