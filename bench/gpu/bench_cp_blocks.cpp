// The context-parallel ring's block attention on one GPU against one full attention call
// of the same total work (issue 20: "the ring's block attention costs at most 5% more").
// For a sequence of S tokens split into 2 x CP chunks (rank r holding chunks r and
// 2CP-1-r), every block that the CP ranks run over a whole ring -- each query chunk
// against itself (causal) and against every earlier key chunk -- is run here one after the
// other on one GPU: attention_block_forward + attention_lse_merge for all blocks, then
// attention_block_backward for all blocks from the merged output. Together they do exactly
// the work of one causal attention over S, which is timed beside them twice: the full
// call as training runs it (cuDNN's fused attention, bf16 without dropout) and the own
// flash kernel (--attention-backend flash), the kernel family the blocks use.
// Communication is not included (one GPU); the multi-GPU issue measures the ring's overlap.
// Shapes: the Llama-style 1B's attention (32 heads, 8 query groups, head dim 64), B = 1.
// --profile: where the difference goes -- the forward and the backward timed apart (full
// call and blocks), then one ring and one full call under the op profiler (GPU time per
// catalogue op: blocks, merges, fills against attention_forward / attention_backward).
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

using namespace mcpp;
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
      "| S | CP | blocks | full, cuDNN (ms) | full, own flash (ms) | CP blocks fwd+merge+bwd (ms) "
      "| blocks / cuDNN | blocks / own flash |\n|---:|---:|---:|---:|---:|---:|---:|---:|\n";
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
      // Per query chunk: the running output and lse, and one block's.
      const size_t nc = static_cast<size_t>(n);
      std::vector<Tensor> o(nc), l(nc);
      for (int64_t c = 0; c < n; ++c) {
        o[size_t(c)] = Tensor::empty({C * B, O}, dt, Device::CUDA);
        l[size_t(c)] = Tensor::empty({B, NH, C}, DType::F32, Device::CUDA);
      }
      Tensor oi = Tensor::empty({C * B, O}, dt, Device::CUDA);
      Tensor li = Tensor::empty({B, NH, C}, DType::F32, Device::CUDA);
      int64_t blocks = 0;
      auto ring_fwd = [&] {
        blocks = 0;
        for (int64_t qa = 0; qa < n; ++qa) {  // every query chunk, whichever rank holds it
          ops::fill(o[size_t(qa)], 0.0, st);
          ops::fill(l[size_t(qa)], -std::numeric_limits<double>::infinity(), st);
          for (int64_t kc = 0; kc <= qa; ++kc, ++blocks) {
            ops::AttentionDims d = full;
            d.S = C, d.S_global = S, d.q_offset = qa * C, d.k_offset = kc * C;
            ops::attention_block_forward(rows(qkv, qa), rows(qkv, kc), d, kc == qa, scale, p, key,
                                         oi, li, st);
            ops::attention_lse_merge(oi, li, d, o[size_t(qa)], l[size_t(qa)], st);
          }
        }
      };
      auto ring_bwd = [&] {
        ops::fill(dqkv, 0.0, st);
        for (int64_t qa = 0; qa < n; ++qa)
          for (int64_t kc = 0; kc <= qa; ++kc) {
            ops::AttentionDims d = full;
            d.S = C, d.S_global = S, d.q_offset = qa * C, d.k_offset = kc * C;
            Tensor dq = rows(dqkv, qa), dkv = rows(dqkv, kc);
            ops::attention_block_backward(rows(dout, qa), rows(qkv, qa), rows(qkv, kc),
                                          o[size_t(qa)], l[size_t(qa)], d, kc == qa, scale, p, key,
                                          dq, dkv, st);
          }
      };
      auto ring = [&] { ring_fwd(), ring_bwd(); };
      const double t_ring = time_ms(reps, st, ring);
      if (profile) {
        auto fwd = [&] { ops::attention_forward(qkv, full, scale, p, key, out, lse, st); };
        auto bwd = [&] {
          ops::attention_backward(dout, qkv, out, lse, full, scale, p, key, dqkv, st);
        };
        fwd();
        const double tf = time_ms(reps, st, fwd), tb = time_ms(reps, st, bwd);
        ring_fwd();
        const double rf = time_ms(reps, st, ring_fwd), rb = time_ms(reps, st, ring_bwd);
        std::printf("### S %lld, CP %lld: forward full %.2f ms, blocks+merges %.2f (%.3fx); "
                    "backward full %.2f, blocks %.2f (%.3fx)\n\n",
                    (long long)S, (long long)CP, tf, rf, rf / tf, tb, rb, rb / tb);
        for (int which = 0; which < 2; ++which) {
          gpu::op_profile_collect();
          gpu::set_op_profiling(true);
          if (which == 0) full_call(); else ring();
          gpu::set_op_profiling(false);
          std::printf("%s, one call under the op profiler:\n\n| op | calls | ms |\n|---|---:|---:|\n",
                      which == 0 ? "full attention" : "CP blocks");
          for (const auto& op : gpu::op_profile_collect())
            std::printf("| %s | %lld | %.3f |\n", op.name.c_str(), (long long)op.calls, op.ms);
          std::printf("\n");
        }
      }
      char row[256];
      std::snprintf(row, sizeof row, "| %lld | %lld | %lld | %.2f | %.2f | %.2f | %.3fx | %.3fx |\n",
                    (long long)S, (long long)CP, (long long)blocks, t_auto, t_flash, t_ring,
                    t_ring / t_auto, t_ring / t_flash);
      table += row;
      std::fprintf(stderr, "%s", row);
    }
  }
  std::printf("%s", table.c_str());
  return 0;
}
