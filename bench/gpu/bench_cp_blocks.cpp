// The context-parallel ring's block attention on one GPU against one full attention call
// of the same total work (issue 20: "the ring's block attention costs at most 5% more").
// For a sequence of S tokens split into 2 x CP chunks (rank r holding chunks r and
// 2CP-1-r), every rank's share of a whole ring -- the ring's own code,
// parallel/context_parallel's RingRank, forward steps with their merges, then backward
// steps, dK/dV accumulated per owner as the ring carries them home -- is run here rank
// after rank on one GPU. Together they do exactly the work of one causal attention over S,
// which is timed beside them twice: the full call as training runs it (cuDNN's fused
// attention, bf16 without dropout) and the own flash kernel (--attention-backend flash).
// The ring runs two ways: its fused steps (one block a step in Megatron's step shapes,
// what the ring runs where cuDNN takes the blocks) and chunk blocks
// (MCPP_CP_FUSED_STEPS=0: each visible pair of chunks its own block, what it runs with
// dropout or the document mask).
// Communication is not included (one GPU); the multi-GPU issue measures the ring's overlap.
// Shapes: the Llama-style 1B's attention (32 heads, 8 query groups, head dim 64), B = 1.
// --profile: where the difference goes -- the forward and the backward timed apart (full
// call and fused ring), then one ring and one full call under the op profiler (GPU time
// per catalogue op: blocks, merges, fills against attention_forward / attention_backward).
// Usage: bench_cp_blocks [--seq 8192,16384,32768] [--cp 2,4] [--reps 5] [--dropout P]
//                        [--profile]
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include "base/philox.h"
#include "ops/attention_backend.h"
#include "ops/cuda/device.h"
#include "ops/ops.h"
#include "parallel/context_parallel/cp_attention.h"

using namespace mcpp;
namespace cp = mcpp::parallel::context_parallel;
namespace gpu = mcpp::ops::cuda;

namespace {

std::vector<int64_t> list(const char* s) {
  std::vector<int64_t> v;
  for (const char* p = s; *p;) {
    v.push_back(std::atoll(p));
    while (*p && *p != ',') ++p;
    if (*p) ++p;
  }
  return v;
}

// Milliseconds per call of f, the median of `reps` timed calls after one warm-up.
template <class F>
double time_ms(int reps, Stream& st, F&& f) {
  f();
  gpu::synchronize(st);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    gpu::synchronize(st);
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                    .count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> seqs = {8192, 16384, 32768}, cps = {2, 4};
  int reps = 5;
  double p = 0;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--seq" && i + 1 < argc) seqs = list(argv[++i]);
    else if (a == "--cp" && i + 1 < argc) cps = list(argv[++i]);
    else if (a == "--reps" && i + 1 < argc) reps = std::atoi(argv[++i]);
    else if (a == "--dropout" && i + 1 < argc) p = std::atof(argv[++i]);
    else if (a == "--profile") profile = true;
    else {
      std::fprintf(stderr, "bench_cp_blocks: unknown argument '%s' (--seq, --cp, --reps, --dropout, "
                   "--profile)\n",
                   a.c_str());
      return 2;
    }
  }
  gpu::init_device();
  Stream& st = gpu::default_stream();
  const int64_t B = 1, NH = 32, NG = 8, HD = 64, O = NH * HD;
  const DType dt = DType::BF16;
  const double scale = 1.0 / std::sqrt(double(HD));
  const ops::DropoutKey key{3, 4};
  // The table is printed at the end (the attention kernels log their plans as they go).
  std::string table =
      "| S | CP | ring | blocks | full, cuDNN (ms) | full, own flash (ms) | ring fwd+merge+bwd "
      "(ms) | ring / cuDNN | ring / own flash |\n|---:|---:|---|---:|---:|---:|---:|---:|---:|\n";
  for (int64_t S : seqs) {
    ops::AttentionDims full;
    full.S = S, full.B = B, full.NH = NH, full.NG = NG, full.HD = HD;
    const int64_t W = full.qkv_width();
    Tensor host = Tensor::empty({S * B, W}, DType::F32);
    for (int64_t i = 0; i < host.numel(); ++i)
      host.data<float>()[i] = Philox::uniform(7, 1, uint64_t(i)) * 2.f - 1.f;
    Tensor qkv = Tensor::empty({S * B, W}, dt, Device::CUDA);
    ops::copy(host, qkv, st);
    Tensor dout = Tensor::empty({S * B, O}, dt, Device::CUDA);
    ops::copy(host.flat().narrow(0, S * B * O), dout, st);
    Tensor out = Tensor::empty({S * B, O}, dt, Device::CUDA);
    Tensor lse = Tensor::empty({B, NH, S}, DType::F32, Device::CUDA);
    Tensor dqkv = Tensor::empty({S * B, W}, dt, Device::CUDA);
    auto full_call = [&] {
      ops::attention_forward(qkv, full, scale, p, key, out, lse, st);
      ops::attention_backward(dout, qkv, out, lse, full, scale, p, key, dqkv, st);
    };
    ops::set_attention_request(ops::AttentionRequest::Auto);
    const double t_auto = time_ms(reps, st, full_call);
    ops::set_attention_request(ops::AttentionRequest::Flash);
    const double t_flash = time_ms(reps, st, full_call);
    ops::set_attention_request(ops::AttentionRequest::Auto);
    for (int64_t CP : cps) {
      const int64_t n = 2 * CP, C = S / n;
      if (S % n) continue;
      auto rows = [&](const Tensor& t, int64_t c) { return t.narrow(c * C * B, C * B); };
      // Each rank's local tensors: its chunks r and 2CP-1-r, in that order.
      auto local = [&](const Tensor& t, int64_t r) {
        Tensor l = Tensor::empty({2 * C * B, t.size(1)}, dt, Device::CUDA);
        Tensor a = l.narrow(0, C * B), b = l.narrow(C * B, C * B);
        ops::copy(rows(t, r), a, st);
        ops::copy(rows(t, n - 1 - r), b, st);
        return l;
      };
      const size_t np = static_cast<size_t>(CP);
      std::vector<Tensor> q(np), g(np), o(np), l(np), dq(np), dkv(np);
      for (int64_t r = 0; r < CP; ++r) {
        const size_t i = size_t(r);
        q[i] = local(qkv, r), g[i] = local(dout, r);
        o[i] = Tensor::empty({2 * C * B, O}, dt, Device::CUDA);
        l[i] = Tensor::empty({B * NH * 2 * C}, DType::F32, Device::CUDA);
        dq[i] = Tensor::empty(q[i].shape(), dt, Device::CUDA);
        dkv[i] = Tensor::empty(q[i].shape(), dt, Device::CUDA);
      }
      cp::CpAttention a;
      a.ad = full, a.ad.S = 2 * C, a.ad.S_global = S;
      a.scale = scale, a.dropout_p = p, a.key = key;
      auto run_mode = [&](bool fused_env, std::string& mode, int64_t& blocks) {
        if (fused_env) unsetenv("MCPP_CP_FUSED_STEPS");
        else setenv("MCPP_CP_FUSED_STEPS", "0", 1);
        std::vector<cp::RingRank> rk;
        for (int64_t r = 0; r < CP; ++r) rk.emplace_back(a, CP, r, dt, st);
        unsetenv("MCPP_CP_FUSED_STEPS");
        mode = rk[0].fused ? "fused steps" : "chunk blocks";
        blocks = rk[0].fused ? CP * CP : n * (n + 1) / 2;
        auto ring_fwd = [&] {
          for (int64_t r = 0; r < CP; ++r) {
            const size_t i = size_t(r);
            rk[i].start_forward(o[i], l[i], st);
            for (int64_t k = 0; k < CP; ++k) {
              const int64_t j = (r - k + CP) % CP;
              rk[i].forward_step(q[i], q[size_t(j)], j, o[i], l[i], st);
            }
          }
        };
        auto ring_bwd = [&] {
          // As the ring: the diagonal step writes dq (=); the others' dK/dV are summed per
          // owner from zero.
          for (int64_t r = 0; r < CP; ++r) ops::fill(dkv[size_t(r)], 0.0, st);
          for (int64_t r = 0; r < CP; ++r) {
            rk[size_t(r)].backward_diagonal(g[size_t(r)], q[size_t(r)], o[size_t(r)],
                                            l[size_t(r)], dq[size_t(r)], st);
            for (int64_t k = 1; k < CP; ++k) {
              const int64_t j = (r - k + CP) % CP;
              rk[size_t(r)].backward_step(g[size_t(r)], q[size_t(r)], o[size_t(r)], l[size_t(r)],
                                          q[size_t(j)], j, dq[size_t(r)], dkv[size_t(j)], st);
            }
          }
          for (int64_t r = 0; r < CP; ++r) ops::axpy(1.0, dkv[size_t(r)], dq[size_t(r)], st);
        };
        auto ring = [&] { ring_fwd(), ring_bwd(); };
        const double t_ring = time_ms(reps, st, ring);
        if (profile && rk[0].fused == fused_env) {
          auto fwd = [&] { ops::attention_forward(qkv, full, scale, p, key, out, lse, st); };
          auto bwd = [&] {
            ops::attention_backward(dout, qkv, out, lse, full, scale, p, key, dqkv, st);
          };
          fwd();
          const double tf = time_ms(reps, st, fwd), tb = time_ms(reps, st, bwd);
          ring_fwd();
          const double rf = time_ms(reps, st, ring_fwd), rb = time_ms(reps, st, ring_bwd);
          std::printf("### S %lld, CP %lld, %s: forward full %.2f ms, ring %.2f (%.3fx); "
                      "backward full %.2f, ring %.2f (%.3fx)\n\n",
                      (long long)S, (long long)CP, mode.c_str(), tf, rf, rf / tf, tb, rb,
                      rb / tb);
          for (int which = 0; which < 2; ++which) {
            gpu::op_profile_collect();
            gpu::set_op_profiling(true);
            if (which == 0) full_call(); else ring();
            gpu::set_op_profiling(false);
            std::printf("%s, one call under the op profiler:\n\n| op | calls | ms |\n"
                        "|---|---:|---:|\n",
                        which == 0 ? "full attention" : mode.c_str());
            for (const auto& op : gpu::op_profile_collect())
              std::printf("| %s | %lld | %.3f |\n", op.name.c_str(), (long long)op.calls, op.ms);
            std::printf("\n");
          }
        }
        return t_ring;
      };
      for (const bool fused_env : {true, false}) {
        std::string mode;
        int64_t blocks = 0;
        const double t_ring = run_mode(fused_env, mode, blocks);
        char row[256];
        std::snprintf(row, sizeof row,
                      "| %lld | %lld | %s | %lld | %.2f | %.2f | %.2f | %.3fx | %.3fx |\n",
                      (long long)S, (long long)CP, mode.c_str(), (long long)blocks, t_auto,
                      t_flash, t_ring, t_ring / t_auto, t_ring / t_flash);
        table += row;
        std::fprintf(stderr, "%s", row);
      }
    }
  }
  std::printf("%s", table.c_str());
  return 0;
}
