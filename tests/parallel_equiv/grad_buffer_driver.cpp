// grad_buffer_driver: under `mpirun -np 2` (the world is the data-parallel group), checks
// DataParallelGrads -- all-reduce and reduce-scatter (distributed optimizer), overlap on
// (layers reported in backprop order) and off, fp32 and bf16 reduction
// (--grad-reduce-in-bf16) -- against a reduction each rank computes itself: every rank's
// gradients are a function of (step, rank, index), so no rank needs another's data.
//   fp32: g0 + g1 (one fp32 addition: the same whatever the order).
//   bf16: bf16(bf16(g0) + bf16(g1)) back in fp32: each rank's gradient rounded to bf16 once,
//         the sum of the two rounded once more (a sum of two bf16 values is exact in fp32).
// The bf16 rounding is written out here (round to nearest even on the bits), not taken
// from tensor/dtype.h, so the reference shares no code with what it checks. The inputs
// are chosen so that the bf16 result differs from the fp32 one for many elements: a
// reduction that silently stayed in fp32 fails. Two steps per setting reuse the buffers.
// A group of one (each rank alone) checks that the flag then changes nothing. Two
// distributed-optimizer instances of one rank each (--num-distributed-optimizer-instances 2
// at DP 2: reduce-scatter within a group of one, then the shard all-reduced over the
// world) must give the same sums, in fp32 and in bf16, overlapped or not.
// Prints "all checks passed" or FAIL lines.
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "comm/world.h"
#include "ops/ops.h"
#include "parallel/data_parallel/grad_buffer.h"

using namespace mcpp;
namespace P = mcpp::parallel;

namespace {

int g_fail = 0;

void check(bool ok, const std::string& what, int rank) {
  if (!ok && g_fail++ < 20) std::printf("[rank %d] FAIL: %s\n", rank, what.c_str());
}

// fp32 -> nearest bf16 (ties to even), as fp32. Inputs are finite.
float round_bf16(float x) {
  uint32_t u = std::bit_cast<uint32_t>(x);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return std::bit_cast<float>(u & 0xFFFF0000u);
}

// Rank r's gradient element i at step t: full fp32 mantissas over eight binades, signs
// mixed, so that rounding to bf16 matters and sums cancel now and then.
float grad(int t, int r, int64_t i) {
  const double v = std::sin(1.7 * double(i) + 0.9 * r + 2.3 * t + 0.3);
  return float(std::ldexp(v, int((i * 7 + r + t) % 8) - 4));
}

// Parameters in registry order: (numel, layer); every numel even, so each bucket splits
// into 2 blocks. With bucket size 9 (backprop order) the buckets are [20, 36) = head,
// layer 1; [10, 20) = layer 0; [0, 10) = embedding.
struct Param {
  int64_t numel;
  int layer;
};
const Param kParams[] = {{10, -1}, {6, 0}, {4, 0}, {8, 1}, {2, 1}, {6, -1}};

std::vector<P::ParamSpan> spans(int64_t& total) {
  std::vector<P::ParamSpan> out;
  total = 0;
  for (const auto& p : kParams) {
    out.push_back({total, p.numel, p.layer});
    total += p.numel;
  }
  return out;
}

// inter: the group across distributed-optimizer instances (null: one instance).
void run(comm::Communicator& dp, int64_t bucket, bool overlap, bool rs, bool bf16,
         comm::Communicator* inter = nullptr) {
  Stream& st = ops::default_stream(Device::CPU);
  // R: the ranks a bucket is split over; S: the ranks whose gradients are summed. `gen`
  // picks this rank's gradients: its place among the S.
  const int me = dp.rank(), R = dp.size(), S = R * (inter ? inter->size() : 1);
  const int gen = inter ? inter->rank() * R + me : me;
  const std::string name = fmt::format(
      "group of {}{}, bucket {}, {}, {}{}", R,
      inter ? fmt::format(" x {} instances", inter->size()) : std::string(), bucket,
      rs ? "reduce-scatter" : "all-reduce", bf16 ? "bf16" : "fp32", overlap ? ", overlap" : "");
  int64_t total = 0;
  auto sp = spans(total);
  Tensor grads = Tensor::zeros({total}, DType::F32);
  P::DataParallelGrads g(grads, sp, dp, bucket, overlap, rs, bf16, nullptr, inter);
  const bool reduced_bf16 = bf16 && S > 1;  // a group of one reduces nothing
  check(g.reduce_dtype() == (reduced_bf16 ? DType::BF16 : DType::F32),
        name + ": reduce dtype " + std::string(dtype_name(g.reduce_dtype())), me);
  const int64_t want_staging = reduced_bf16 ? 2 * (total + (rs ? total / R : 0)) : 0;
  check(g.staging_bytes() == want_staging,
        fmt::format("{}: {} staging bytes, expected {}", name, g.staging_bytes(), want_staging),
        me);

  for (int t = 0; t < 2; ++t) {
    float* gp = grads.data<float>();
    for (int64_t i = 0; i < total; ++i) gp[i] = grad(t, gen, i);
    // The reference reduction of element i.
    int64_t differ = 0;  // elements whose bf16 reduction differs from the fp32 one
    auto want = [&](int64_t i) {
      float f32 = 0, b16 = 0;
      for (int q = 0; q < S; ++q) f32 += grad(t, q, i);
      if (S == 1) return f32;
      b16 = round_bf16(round_bf16(grad(t, 0, i)) + round_bf16(grad(t, 1, i)));
      differ += b16 != f32;
      return bf16 ? b16 : f32;
    };

    g.begin_final_backward();
    if (overlap)
      for (int layer : {1, 0, -1}) g.layer_ready(layer, st);
    g.finish(st);
    // Overlap: every bucket's last layer was reported, so all of them started before
    // finish(); without it none did.
    const size_t early = overlap ? g.buckets().size() : 0;
    check(g.started_during_backward() == early,
          fmt::format("{}, step {}: {} buckets started during backward, expected {}", name, t,
                      g.started_during_backward(), early),
          me);

    int64_t bad = 0, checked = 0;
    auto expect = [&](float got, int64_t i) {
      const float w = want(i);
      ++checked;
      if (got != w && bad++ < 3)
        check(
            false,
            fmt::format("{}, step {}: element {}: got {:.9g}, expected {:.9g}", name, t, i, got, w),
            me);
    };
    if (rs) {
      const float* sh = g.shard().data<float>();
      for (size_t b = 0; b < g.buckets().size(); ++b) {
        const auto& bk = g.buckets()[b];
        const int64_t n = g.block(b);
        for (int64_t j = 0; j < n; ++j) expect(sh[bk.shard_offset + j], bk.begin + me * n + j);
      }
      check(checked == total / R, fmt::format("{}: {} shard elements", name, checked), me);
    } else {
      for (int64_t i = 0; i < total; ++i) expect(gp[i], i);
    }
    check(bad == 0, fmt::format("{}, step {}: {} of {} elements differ", name, t, bad, checked),
          me);
    if (S > 1)
      check(differ > checked / 4,
            fmt::format("{}, step {}: only {} of {} elements round differently in bf16 (the "
                        "inputs do not tell bf16 from fp32 reduction)",
                        name, t, differ, checked),
            me);
  }
}

}  // namespace

int main() {
  auto world = comm::init({.timeout = std::chrono::seconds(60)});
  comm::Communicator& dp = world->world();
  if (dp.size() != 2) {
    std::printf("FAIL: run under mpirun -np 2 (the bf16 reference assumes one partial sum)\n");
    return 1;
  }
  // Each rank alone: the flag has no effect in a group of one.
  auto alone = world->split({{0}, {1}}, "alone");
  for (bool rs : {false, true})
    for (bool bf16 : {false, true}) run(*alone, 9, false, rs, bf16);
  for (int64_t bucket : {int64_t(9), int64_t(1000)})
    for (bool rs : {false, true})
      for (bool overlap : {false, true})
        for (bool bf16 : {false, true}) run(dp, bucket, overlap, rs, bf16);
  // Two instances of one rank each: the reduce-scatter within each, the shard summed over
  // the world.
  for (int64_t bucket : {int64_t(9), int64_t(1000)})
    for (bool overlap : {false, true})
      for (bool bf16 : {false, true}) run(*alone, bucket, overlap, true, bf16, &dp);
  if (g_fail == 0) std::printf("[rank %d] all checks passed\n", dp.rank());
  return g_fail ? 1 : 0;
}
