// GPU op benchmark: times each CUDA op at training shapes (GPT-2 350M / Llama-style 1B,
// 16 x 1024 or 8 x 2048 tokens) and prints one table: op, shape, median time, and the
// rate against the op's floor (TFLOP/s for GEMMs and attention, GB/s of compulsory
// traffic, each input read once and each output written once, for the rest).
// Usage: bench_gpu_ops [--quick] [--only WORD]   (CUDA events, 3 warm-ups, median of N runs;
// --only times just the ops whose name holds WORD, e.g. --only norm)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ops/cuda/cudnn_attention.h"
#include "ops/cuda/device.h"
#include "ops/attention_backend.h"
#include "ops/cuda/flash_attention.h"
#include "ops/ops.h"
#include "ops/momentum_step.h"
#include "ops/split_main.h"

using namespace mcpp;
namespace gpu = mcpp::ops::cuda;

namespace {

// Random values in [-1, 1) from a hash of the index (never zeros: see METHOD.md).
template <typename T>
__global__ void rand_fill(T* p, int64_t n, uint32_t seed, float scale) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 16, h *= 0x85EBCA6Bu, h ^= h >> 13, h *= 0xC2B2AE35u, h ^= h >> 16;
    p[i] = T(scale * (float(h >> 8) * (2.f / 16777216.f) - 1.f));
  }
}
__global__ void rand_ids(int32_t* p, int64_t n, uint32_t V) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u;
    h ^= h >> 15, h *= 0x2C1B3C6Du, h ^= h >> 12;
    p[i] = int32_t(h % V);
  }
}

Tensor rnd(const Shape& s, DType dt, float scale = 1.f) {
  static uint32_t seed = 1;
  Tensor t = Tensor::empty(s, dt, Device::CUDA);
  auto cs = static_cast<cudaStream_t>(gpu::default_stream().handle);
  int64_t n = t.numel();
  unsigned grid = unsigned(std::min<int64_t>((n + 255) / 256, 65536));
  if (dt == DType::F32)
    rand_fill<<<grid, 256, 0, cs>>>(static_cast<float*>(t.raw()), n, seed++, scale);
  else if (dt == DType::BF16)
    rand_fill<<<grid, 256, 0, cs>>>(static_cast<__nv_bfloat16*>(t.raw()), n, seed++, scale);
  else
    rand_fill<<<grid, 256, 0, cs>>>(static_cast<__half*>(t.raw()), n, seed++, scale);
  CUDA_CHECK(cudaGetLastError());
  return t;
}

Tensor ids(const Shape& s, int64_t V) {
  Tensor t = Tensor::empty(s, DType::I32, Device::CUDA);
  auto cs = static_cast<cudaStream_t>(gpu::default_stream().handle);
  rand_ids<<<1024, 256, 0, cs>>>(static_cast<int32_t*>(t.raw()), t.numel(), uint32_t(V));
  CUDA_CHECK(cudaGetLastError());
  return t;
}

int g_reps = 10;
std::string g_only;  // --only: time just the ops whose name holds this

bool skipped(const std::string& op) {
  return !g_only.empty() && op.find(g_only) == std::string::npos;
}

double time_ms(const std::function<void()>& fn) {
  Stream& s = gpu::default_stream();
  auto cs = static_cast<cudaStream_t>(s.handle);
  for (int i = 0; i < 3; ++i) fn();
  std::vector<float> t(g_reps);
  cudaEvent_t a, b;
  CUDA_CHECK(cudaEventCreate(&a));
  CUDA_CHECK(cudaEventCreate(&b));
  for (int i = 0; i < g_reps; ++i) {
    CUDA_CHECK(cudaEventRecord(a, cs));
    fn();
    CUDA_CHECK(cudaEventRecord(b, cs));
    CUDA_CHECK(cudaEventSynchronize(b));
    CUDA_CHECK(cudaEventElapsedTime(&t[i], a, b));
  }
  CUDA_CHECK(cudaEventDestroy(a));
  CUDA_CHECK(cudaEventDestroy(b));
  std::sort(t.begin(), t.end());
  return t[g_reps / 2];
}

struct Row {
  std::string op, shape;
  double ms, rate;
  const char* unit;
};
std::vector<Row> g_rows;

void flops(const std::string& op, const std::string& shape, double f,
           const std::function<void()>& fn) {
  if (skipped(op)) return;
  double ms = time_ms(fn);
  g_rows.push_back({op, shape, ms, f / (ms * 1e-3) / 1e12, "TFLOP/s"});
  std::fprintf(stderr, "  %-28s %-34s %9.3f ms\n", op.c_str(), shape.c_str(), ms);
}
void bytes(const std::string& op, const std::string& shape, double by,
           const std::function<void()>& fn) {
  if (skipped(op)) return;
  double ms = time_ms(fn);
  g_rows.push_back({op, shape, ms, by / (ms * 1e-3) / 1e9, "GB/s"});
  std::fprintf(stderr, "  %-28s %-34s %9.3f ms\n", op.c_str(), shape.c_str(), ms);
}

std::string fmt_shape(std::initializer_list<int64_t> d) {
  std::string s;
  for (int64_t v : d) s += (s.empty() ? "" : "x") + std::to_string(v);
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--quick") == 0)
      quick = true;
    else if (std::strcmp(argv[i], "--only") == 0 && i + 1 < argc)
      g_only = argv[++i];
  }
  if (quick) g_reps = 3;
  gpu::init_device();
  Stream& s = gpu::default_stream();
  const DType bf = DType::BF16;
  cudaDeviceProp prop;
  CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::fprintf(stderr, "device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);

  // ---- GEMMs -------------------------------------------------------------------------
  {
    const int64_t n = 8192;
    Tensor A = rnd({n, n}, bf), B = rnd({n, n}, bf), C = rnd({n, n}, bf);
    flops("gemm bf16 (ceiling check)", fmt_shape({n, n, n}), 2.0 * n * n * n,
          [&] { ops::gemm(false, false, 1.0, A, B, 0.0, C, s); });
  }
  {
    // GPT-2 350M MLP fc1: T = 16 x 1024 tokens, 1024 -> 4096.
    const int64_t T = 16384, in = 1024, out = 4096;
    Tensor x = rnd({T, in}, bf), w = rnd({out, in}, bf, 0.05f), b = rnd({out}, bf);
    Tensor y = rnd({T, out}, bf), dy = rnd({T, out}, bf), dx = rnd({T, in}, bf);
    Tensor dw = rnd({out, in}, DType::F32), db = rnd({out}, DType::F32);
    double f = 2.0 * T * in * out;
    std::string sh = fmt_shape({T, in, out});
    flops("linear_forward +bias", sh, f, [&] { ops::linear_forward(x, w, b, y, s); });
    flops("linear_backward dx,dw,db", sh, 2 * f,
          [&] { ops::linear_backward(dy, x, w, dx, false, dw, db, s); });
    Tensor none;
    flops("linear_backward dx only", sh, f,
          [&] { ops::linear_backward(dy, x, w, dx, false, none, none, s); });
  }
  {
    // GPT-3 XL fc1 at micro-batch 16 (T = 32768, 2048 -> 8192): the step's GEMM in each of
    // its forms, and the weight gradient both as the model does it (f32 main grad, +=) and
    // as PyTorch's autocast does it (bf16 output, beta 0), to tell layout and output dtype
    // apart from the clock. Then the forward again after ~3 s of back-to-back GEMMs:
    // the rate under sustained load, as inside a training step.
    const int64_t T = 32768, in = 2048, out = 8192;
    Tensor x = rnd({T, in}, bf), w = rnd({out, in}, bf, 0.05f), y = rnd({T, out}, bf);
    Tensor dy = rnd({T, out}, bf, 0.05f), dx = rnd({T, in}, bf);
    Tensor dw32 = rnd({out, in}, DType::F32), dw16 = rnd({out, in}, bf);
    const double f = 2.0 * T * in * out;
    const std::string sh = fmt_shape({T, in, out});
    auto fwd = [&] { ops::gemm(false, true, 1.0, x, w, 0.0, y, s); };
    flops("gemm XL fc1 fwd (x w^T)", sh, f, fwd);
    flops("gemm XL fc1 dx (dy w)", sh, f, [&] { ops::gemm(false, false, 1.0, dy, w, 0.0, dx, s); });
    flops("gemm XL fc1 dw f32 += (dy^T x)", sh, f,
          [&] { ops::gemm(true, false, 1.0, dy, x, 1.0, dw32, s); });
    flops("gemm XL fc1 dw bf16 (dy^T x)", sh, f,
          [&] { ops::gemm(true, false, 1.0, dy, x, 0.0, dw16, s); });
    if (!skipped("gemm XL fc1 fwd, sustained")) {
      const auto t0 = std::chrono::steady_clock::now();
      while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3)) {
        for (int i = 0; i < 50; ++i) fwd();
        CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s.handle)));
      }
      flops("gemm XL fc1 fwd, sustained", sh, f, fwd);
    }
  }
  // ---- norms: GPT-2 124M (64 x 1024 tokens, H = 768), 350M (16 x 1024, H = 1024), 1.3B
  // (16 x 2048, H = 2048); bf16 activations, f32 weights ------------------------------------
  for (auto [T, H] : {std::pair<int64_t, int64_t>{65536, 768}, {16384, 1024}, {32768, 2048}}) {
    Tensor x = rnd({T, H}, bf), w = rnd({H}, DType::F32), b = rnd({H}, DType::F32);
    Tensor y = rnd({T, H}, bf), mean = rnd({T}, DType::F32), rstd = rnd({T}, DType::F32);
    Tensor dy = rnd({T, H}, bf), dx = rnd({T, H}, bf);
    Tensor dw = rnd({H}, DType::F32), db = rnd({H}, DType::F32);
    std::string sh = fmt_shape({T, H});
    double io = double(T) * H * 2;
    bytes("layernorm_forward", sh, 2 * io,
          [&] { ops::layernorm_forward(x, w, b, 1e-5, y, mean, rstd, s); });
    bytes("layernorm_backward", sh, 3 * io,
          [&] { ops::layernorm_backward(dy, x, w, mean, rstd, dx, false, dw, db, s); });
    bytes("layernorm_backward dx+=", sh, 4 * io,
          [&] { ops::layernorm_backward(dy, x, w, mean, rstd, dx, true, dw, db, s); });
    bytes("rmsnorm_forward", sh, 2 * io, [&] { ops::rmsnorm_forward(x, w, 1e-5, y, rstd, s); });
    bytes("rmsnorm_backward", sh, 3 * io,
          [&] { ops::rmsnorm_backward(dy, x, w, rstd, dx, false, dw, s); });
  }
  // ---- activations, elementwise ----------------------------------------------------------
  {
    const int64_t T = 16384, H = 1024;
    Tensor x = rnd({T, H}, bf), y = rnd({T, H}, bf), dy = rnd({T, H}, bf);
    std::string sh = fmt_shape({T, H});
    double io = double(T) * H * 2;
    bytes("add bf16", sh, 3 * io, [&] { ops::add(x, dy, y, s); });
    Tensor res = rnd({16, 1024, H}, bf), x3 = x.view({16, 1024, H});
    auto g = ops::GlobalIndex3::whole(16, 1024, H);
    bytes("dropout_add_forward p=0.1", sh, 3 * io,
          [&] { ops::dropout_add_forward(x3, res, 0.1, {1, 2}, g, res, s); });
    Tensor xf = rnd({T, H}, DType::F32);
    bytes("copy f32->bf16", sh, io * 3, [&] { ops::copy(xf, y, s); });
    bytes("axpy bf16 -> f32", sh, io * 5, [&] { ops::axpy(0.5, x, xf, s); });
  }
  {
    const int64_t T = 16384, F = 4096;
    Tensor x = rnd({T, F}, bf), y = rnd({T, F}, bf), dy = rnd({T, F}, bf), dx = rnd({T, F}, bf);
    std::string sh = fmt_shape({T, F});
    double io = double(T) * F * 2;
    bytes("gelu_forward", sh, 2 * io, [&] { ops::gelu_forward(x, y, s); });
    bytes("gelu_backward", sh, 3 * io, [&] { ops::gelu_backward(dy, x, dx, s); });
    Tensor x2 = rnd({8192, 2 * 8192}, bf), y2 = rnd({8192, 8192}, bf),
           dx2 = rnd({8192, 2 * 8192}, bf);
    double io2 = 8192.0 * 8192 * 2;
    bytes("swiglu_forward", "8192x(2x8192)", 3 * io2, [&] { ops::swiglu_forward(x2, y2, s); });
    bytes("swiglu_backward", "8192x(2x8192)", 5 * io2,
          [&] { ops::swiglu_backward(y2, x2, dx2, s); });
  }
  // ---- FP8 cast + transpose + amax (docs/fp8.md) at the GPT-3 XL step's shapes (32768
  // tokens; H 2048, FFN 8192), against a bf16 copy of the same tensor: bytes are the bf16
  // read plus the FP8 writes (row-wise and column-wise: 4 a value; row-wise only: 3) ------
  for (int64_t C : {int64_t(2048), int64_t(8192)}) {
    const int64_t R = 32768;
    Tensor x = rnd({R, C}, bf), y = rnd({R, C}, bf);
    Tensor q = Tensor::empty({R, C}, DType::FP8E4M3, Device::CUDA),
           qt = Tensor::empty({C, R}, DType::FP8E4M3, Device::CUDA),
           g = Tensor::empty({R, C}, DType::FP8E5M2, Device::CUDA),
           gt = Tensor::empty({C, R}, DType::FP8E5M2, Device::CUDA), none;
    Tensor sc = Tensor::empty({1}, DType::F32, Device::CUDA),
           amax = Tensor::empty({1}, DType::F32, Device::CUDA),
           sinv = Tensor::empty({1}, DType::F32, Device::CUDA);
    ops::fill(sc, 1.0, s);
    ops::fill(amax, 0.0, s);
    const std::string sh = fmt_shape({R, C});
    const double n = double(R) * C;
    bytes("copy bf16 (fp8 reference)", sh, 4 * n, [&] { ops::copy(x, y, s); });
    bytes("fp8_cast_transpose e4m3", sh, 4 * n,
          [&] { ops::fp8_cast_transpose(x, ops::Fp8Format::E4M3, sc, q, qt, amax, sinv, s); });
    bytes("fp8_cast_transpose e5m2", sh, 4 * n,
          [&] { ops::fp8_cast_transpose(x, ops::Fp8Format::E5M2, sc, g, gt, amax, sinv, s); });
    bytes("fp8_cast_transpose row-only", sh, 3 * n,
          [&] { ops::fp8_cast_transpose(x, ops::Fp8Format::E4M3, sc, q, none, amax, sinv, s); });
    bytes("fp8_cast_transpose col-only", sh, 3 * n,
          [&] { ops::fp8_cast_transpose(x, ops::Fp8Format::E4M3, sc, none, qt, amax, none, s); });
    // The fused casts (fp8_fused.cu) against the passes they replace; bytes: the fused
    // op's own traffic for both, so the rates compare directly.
    Tensor db = Tensor::empty({C}, DType::F32, Device::CUDA), pre = rnd({R, C}, bf),
           g16 = rnd({R, C}, bf), wd = rnd({C, 16}, bf), xd = rnd({R, 16}, bf);
    ops::fill(db, 0.0, s);
    // the bias gradient as the unfused FP8 path takes it (linear_backward's db alone)
    auto column_sum_add = [&](const Tensor& v, Tensor& d, Stream& st) {
      Tensor no;
      ops::linear_backward(v, xd, wd, no, false, no, d, st);
    };
    bytes("fp8_cast_transpose e5m2 + dbias (unfused)", sh, 4 * n, [&] {
      ops::fp8_cast_transpose(x, ops::Fp8Format::E5M2, sc, g, gt, amax, sinv, s);
      column_sum_add(x, db, s);
    });
    bytes("fp8_cast_transpose_dbias e5m2", sh, 4 * n, [&] {
      ops::fp8_cast_transpose_dbias(x, ops::Fp8Format::E5M2, sc, g, gt, amax, sinv, db, s);
    });
    bytes("fp8 gelu_forward + cast row-only (unfused)", sh, 3 * n, [&] {
      ops::gelu_forward(pre, y, s);
      ops::fp8_cast_transpose(y, ops::Fp8Format::E4M3, sc, q, none, amax, sinv, s);
    });
    bytes("fp8_gelu_cast row-only", sh, 3 * n, [&] {
      ops::fp8_gelu_cast(pre, ops::Fp8Format::E4M3, sc, none, q, none, amax, sinv, s);
    });
    bytes("fp8 gelu_forward + cast col-only (unfused)", sh, 3 * n, [&] {
      ops::gelu_forward(pre, y, s);
      ops::fp8_cast_transpose(y, ops::Fp8Format::E4M3, sc, none, qt, none, none, s);
    });
    bytes("fp8_gelu_cast col-only", sh, 3 * n, [&] {
      ops::fp8_gelu_cast(pre, ops::Fp8Format::E4M3, sc, none, none, qt, none, none, s);
    });
    bytes("fp8 gelu_backward + cast + dbias (unfused)", sh, 6 * n, [&] {
      ops::gelu_backward(x, pre, g16, s);
      ops::fp8_cast_transpose(g16, ops::Fp8Format::E5M2, sc, g, gt, amax, sinv, s);
      column_sum_add(g16, db, s);
    });
    bytes("fp8_dgelu_cast + dbias", sh, 6 * n, [&] {
      ops::fp8_dgelu_cast(x, pre, ops::Fp8Format::E5M2, sc, none, g, gt, amax, sinv, db, s);
    });
    bytes("fp8_cast_transpose_dbias e5m2, no dbias", sh, 4 * n, [&] {
      ops::fp8_cast_transpose_dbias(x, ops::Fp8Format::E5M2, sc, g, gt, amax, sinv, none, s);
    });
    if (C == 8192) {
      // SwiGLU's fused casts at the Llama-style 1B's MLP (F = C): pre [R, 2F] = [gate | up];
      // the forward reads pre and writes the row-wise copy of [R, F] (4n + n), the backward
      // reads dact and pre and writes both copies of [R, 2F] (2n + 4n + 4n).
      Tensor pre2 = rnd({R, 2 * C}, bf),
             g2 = Tensor::empty({R, 2 * C}, DType::FP8E5M2, Device::CUDA),
             g2t = Tensor::empty({2 * C, R}, DType::FP8E5M2, Device::CUDA);
      bytes("fp8_swiglu_cast row-only", fmt_shape({R, 2 * C}), 5 * n, [&] {
        ops::fp8_swiglu_cast(pre2, ops::Fp8Format::E4M3, sc, none, q, none, amax, sinv, s);
      });
      bytes("fp8_dswiglu_cast", fmt_shape({R, 2 * C}), 10 * n, [&] {
        ops::fp8_dswiglu_cast(x, pre2, ops::Fp8Format::E5M2, sc, none, g2, g2t, amax, sinv, none,
                              s);
      });
    }
  }
  // ---- the 16-byte vector paths at training sizes: SwiGLU of a 32768-token step with
  // F = 8192, dropout + residual of GPT-2 124M (64 x 1024 tokens, H = 768) -----------------
  {
    const int64_t T = 32768, F = 8192;
    Tensor x = rnd({T, 2 * F}, bf), y = rnd({T, F}, bf), dy = rnd({T, F}, bf),
           dx = rnd({T, 2 * F}, bf);
    double io = double(T) * F * 2;  // bytes of one [T, F] bf16 tensor
    std::string sh = fmt_shape({T, 2 * F});
    bytes("swiglu_forward", sh, 3 * io, [&] { ops::swiglu_forward(x, y, s); });
    bytes("swiglu_backward", sh, 5 * io, [&] { ops::swiglu_backward(dy, x, dx, s); });
    // The MLP backward: the activation recomputed and the gradient, as two ops (x read
    // twice) and as one (x read once). The floor of both is the fused op's traffic, so
    // their rates compare directly.
    bytes("swiglu_fwd + swiglu_bwd", sh, 6 * io, [&] {
      ops::swiglu_forward(x, y, s);
      ops::swiglu_backward(dy, x, dx, s);
    });
    bytes("swiglu_backward_recompute", sh, 6 * io,
          [&] { ops::swiglu_backward_recompute(dy, x, dx, y, s); });
  }
  // ---- the routed experts' activation with the probabilities at a Mixtral-style step (65536
  // expert rows, I = 4096): the unfused ops of before and the two fused ops -------------------
  {
    const int64_t N = 65536, F = 4096;
    Tensor fc1 = rnd({N, 2 * F}, bf), act = rnd({N, F}, bf), ap = rnd({N, F}, bf),
           dap = rnd({N, F}, bf), dact = rnd({N, F}, bf), dfc1 = rnd({N, 2 * F}, bf),
           p = rnd({N}, DType::F32), dp = rnd({N}, DType::F32);
    double io = double(N) * F * 2;  // bytes of one [N, F] bf16 tensor
    std::string sh = fmt_shape({N, 2 * F});
    const ops::MlpActivation swiglu = ops::MlpActivation::Swiglu;
    bytes("moe swiglu_forward + moe_scale_rows", sh, 3 * io, [&] {
      ops::swiglu_forward(fc1, act, s);
      ops::moe_scale_rows(act, p, ap, s);
    });
    bytes("moe_act_scale_forward", sh, 3 * io,
          [&] { ops::moe_act_scale_forward(fc1, p, swiglu, ap, s); });
    bytes("moe scale_rows + row_dot + scale_rows + swiglu_bwd", sh, 5 * io, [&] {
      ops::moe_scale_rows(act, p, ap, s);
      ops::moe_row_dot(dap, act, dp, s);
      ops::moe_scale_rows(dap, p, dact, s);
      ops::swiglu_backward(dact, fc1, dfc1, s);
    });
    Tensor none;
    bytes("moe_act_scale_backward", sh, 5 * io,
          [&] { ops::moe_act_scale_backward(dap, fc1, p, swiglu, dfc1, dp, none, s); });
    // ap recomputed over dap (the experts' backward when the forward kept no ap): one more
    // [N, F] written; dap is rewritten each call, its values then ap's (same traffic).
    bytes("moe_act_scale_backward + ap in place", sh, 6 * io,
          [&] { ops::moe_act_scale_backward(dap, fc1, p, swiglu, dfc1, dp, dap, s); });
  }
  {
    const int64_t S = 1024, B = 64, H = 768;
    Tensor x = rnd({S, B, H}, bf), res = rnd({S, B, H}, bf), dx = rnd({S, B, H}, bf);
    auto g = ops::GlobalIndex3::whole(S, B, H);
    double io = double(S) * B * H * 2;
    std::string sh = fmt_shape({S * B, H});
    bytes("dropout_add_forward p=0", sh, 3 * io, [&] {
      ops::dropout_add_forward(x, res, 0.0, {1, 2}, g, res, s);
    });
    bytes("dropout_add_forward p=0.1", sh, 3 * io, [&] {
      ops::dropout_add_forward(x, res, 0.1, {1, 2}, g, res, s);
    });
    bytes("dropout_backward p=0", sh, 2 * io, [&] {
      ops::dropout_backward(x, 0.0, {1, 2}, g, dx, s);
    });
    bytes("dropout_backward p=0.1", sh, 2 * io, [&] {
      ops::dropout_backward(x, 0.1, {1, 2}, g, dx, s);
    });
  }
  // ---- embedding, cross-entropy -------------------------------------------------------
  {
    const int64_t B = 16, S = 1024, H = 1024, V = 50304;
    Tensor id = ids({B, S}, V), table = rnd({V, H}, bf), y = rnd({S, B, H}, bf);
    Tensor dtable = rnd({V, H}, DType::F32);
    std::string sh = fmt_shape({B, S, H}) + " V" + std::to_string(V);
    double io = double(B) * S * H * 2;
    bytes("embedding_forward", sh, 2 * io, [&] { ops::embedding_forward(id, table, 0, y, s); });
    bytes("embedding_backward", sh, io * 5,
          [&] { ops::embedding_backward(y, id, 0, dtable, s); });
  }
  {
    const int64_t T = 8192, V = 50304;
    Tensor logits = rnd({T, V}, bf, 4.f), tg = ids({T}, V);
    Tensor mx = rnd({T}, DType::F32), se = rnd({T}, DType::F32), tl = rnd({T}, DType::F32),
           loss = rnd({T}, DType::F32), dl = rnd({T}, DType::F32);
    std::string sh = fmt_shape({T, V});
    double io = double(T) * V * 2;
    bytes("ce fwd (max+sumexp+loss)", sh, 2 * io, [&] {
      ops::ce_row_max(logits, mx, s);
      ops::ce_sum_exp_target(logits, mx, tg, 0, se, tl, s);
      ops::ce_loss(mx, se, tl, loss, s);
    });
    bytes("ce fwd one pass (stats+loss)", sh, io, [&] {
      ops::ce_stats(logits, tg, 0, mx, se, tl, s);
      ops::ce_loss(mx, se, tl, loss, s);
    });
    bytes("ce_backward (in place)", sh, 2 * io,
          [&] { ops::ce_backward(logits, mx, se, tg, 0, dl, logits, s); });
  }
  // ---- attention and RoPE ---------------------------------------------------------------
  // The four training shapes of bench_gpu_train (GPT-2 124M / 350M at mb 64, GPT-3 XL and
  // Llama-style 1B at mb 16): the op as dispatched (cuDNN when it takes the call), cuDNN's
  // backward on both dQ paths, and the own flash kernel.
  std::fprintf(stderr, "attention: %s\n", gpu::cudnn_attention_status().c_str());
  struct AC {
    int64_t B, S, NH, NG, HD;
  };
  for (AC c : {AC{64, 1024, 12, 12, 64}, AC{64, 1024, 16, 16, 64}, AC{16, 2048, 16, 16, 128},
               AC{16, 2048, 32, 8, 64}}) {
    ops::AttentionDims d;
    d.S = c.S, d.B = c.B, d.NH = c.NH, d.NG = c.NG, d.HD = c.HD;
    Tensor qkv = rnd({c.S, c.B, d.qkv_width()}, bf), out = rnd({c.S, c.B, c.NH * c.HD}, bf);
    Tensor lse = rnd({c.B, c.NH, c.S}, DType::F32), dout = rnd(out.shape(), bf),
           dqkv = rnd(qkv.shape(), bf);
    double fwd = 2.0 * c.B * c.NH * double(c.S) * c.S * c.HD;  // causal: half of 4 B NH S^2 HD
    std::string sh = "B" + std::to_string(c.B) + " S" + std::to_string(c.S) + " NH" +
                     std::to_string(c.NH) + " NG" + std::to_string(c.NG) + " HD" +
                     std::to_string(c.HD);
    double sc = 1.0 / std::sqrt(double(c.HD));
    flops("attention_forward", sh, fwd,
          [&] { ops::attention_forward(qkv, d, sc, 0.0, {}, out, lse, s); });
    flops("attention_backward", sh, 2.5 * fwd, [&] {
      ops::attention_backward(dout, qkv, out, lse, d, sc, 0.0, {}, dqkv, s);
    });
    const gpu::FlashArgs fa{qkv.raw(), d, bf, sc};
    auto cs = static_cast<cudaStream_t>(s.handle);
    if (gpu::cudnn_attention_enabled()) {
      for (int det : {1, 0})
        flops(det ? "  cuDNN bwd, ordered dQ" : "  cuDNN bwd, atomic dQ", sh, 2.5 * fwd, [&] {
          if (!gpu::cudnn_attention_backward(fa, dout.raw(), out.raw(),
                                             static_cast<float*>(lse.raw()), dqkv.raw(), cs, det))
            MCPP_FAIL("cuDNN rejected the attention backward for {}", sh);
        });
    }
    if (gpu::flash_attention_applies(bf, c.HD, 0.0)) {
      Tensor delta = rnd({c.B, c.NH, c.S}, DType::F32);
      flops("  own flash fwd", sh, fwd, [&] {
        gpu::flash_attention_forward(fa, out.raw(), static_cast<float*>(lse.raw()), cs);
      });
      flops("  own flash bwd (no delta)", sh, 2.5 * fwd, [&] {
        gpu::flash_attention_backward(fa, dout.raw(), static_cast<float*>(lse.raw()),
                                      static_cast<float*>(delta.raw()), dqkv.raw(), cs);
      });
      // With Megatron's default attention dropout (0.1) as the model's layers run it: the
      // forward writes the keep bits, the backward reads them.
      gpu::FlashArgs fd = fa;
      fd.dropout_p = 0.1, fd.key = {1234, 7};
      Tensor keep = Tensor::empty({(gpu::flash_attention_mask_bytes(fd) + 7) / 8}, DType::I64,
                                  Device::CUDA);
      flops("  own flash fwd, dropout 0.1", sh, fwd, [&] {
        gpu::flash_attention_forward(fd, out.raw(), static_cast<float*>(lse.raw()), cs,
                                     keep.raw());
      });
      flops("  own flash bwd, dropout 0.1", sh, 2.5 * fwd, [&] {
        gpu::flash_attention_backward(fd, dout.raw(), static_cast<float*>(lse.raw()),
                                      static_cast<float*>(delta.raw()), dqkv.raw(), cs,
                                      keep.raw(), true);
      });
      // The same with dS handed from the dK/dV kernel to the dQ kernel (what the op runs
      // when the buffer fits the workspace cap).
      const int64_t chunk = gpu::flash_attention_ds_chunk(fa, ops::attention_bwd_workspace_cap_from_env());
      if (chunk > 0) {
        Tensor ds = Tensor::empty({ops::flash_ds_bytes(chunk, c.NH, c.S) / 2}, bf, Device::CUDA);
        flops("  own flash bwd, dS hand-over", sh, 2.5 * fwd, [&] {
          gpu::flash_attention_backward(fa, dout.raw(), static_cast<float*>(lse.raw()),
                                        static_cast<float*>(delta.raw()), dqkv.raw(), cs,
                                        nullptr, false, ds.raw(), chunk);
        });
        flops("  own flash bwd, dropout 0.1, dS hand-over", sh, 2.5 * fwd, [&] {
          gpu::flash_attention_backward(fd, dout.raw(), static_cast<float*>(lse.raw()),
                                        static_cast<float*>(delta.raw()), dqkv.raw(), cs,
                                        keep.raw(), true, ds.raw(), chunk);
        });
      }
    }
    if (c.NG == 8) {
      double io = double(qkv.numel()) * 2 * 2;
      bytes("rope_forward (in place)", sh, io,
            [&] { ops::rope_forward(qkv, d, c.HD, 10000.0, 0, qkv, s); });
      bytes("rope_backward (in place)", sh, io,
            [&] { ops::rope_backward(qkv, d, c.HD, 10000.0, 0, qkv, s); });
    }
  }
  // ---- optimizer ------------------------------------------------------------------------
  {
    const int64_t n = 350'000'000;
    Tensor p = rnd({n}, DType::F32), g = rnd({n}, DType::F32), m = rnd({n}, DType::F32, 0.1f),
           v = rnd({n}, DType::F32, 0.01f);
    // v must be >= 0
    ops::scale(v, 0.0, s);
    ops::AdamWParams ap;
    ap.lr = 1e-4, ap.weight_decay = 0.1;
    Tensor none;
    bytes("adamw_step f32", "350M params", double(n) * 4 * 7,
          [&] { ops::adamw_step(p, g, m, v, none, ap, s); });
  }
  {
    // Mixed precision: fp32 main params, moments and grads, bf16 model params. The step
    // then the copy to the model (the two passes of before) against the fused step.
    // 268M = 2^28: about a fifth of GPT-3 XL's 1.3B, whole 16-byte packs.
    const int64_t n = int64_t(1) << 28;
    Tensor p = rnd({n}, DType::F32), g = rnd({n}, DType::F32), m = rnd({n}, DType::F32, 0.1f),
           v = rnd({n}, DType::F32), model = rnd({n}, DType::BF16);
    ops::scale(v, 0.0, s);  // v must be >= 0
    ops::AdamWParams ap;
    ap.lr = 1e-4, ap.weight_decay = 0.1;
    Tensor none;
    bytes("adamw_step + copy to bf16", "268M params", double(n) * (4 * 7 + 4 + 2), [&] {
      ops::adamw_step(p, g, m, v, none, ap, s);
      ops::copy(p, model, s);
    });
    bytes("adamw_step fused bf16 out", "268M params", double(n) * (4 * 7 + 2),
          [&] { ops::adamw_step(p, g, m, v, model, ap, s); });
    // The main parameters split into the bf16 model parameters and their lower halves
    // (ops/split_main.h, the default for bf16 models): 28 bytes an element.
    Tensor lo = Tensor::empty({n}, DType::U16, Device::CUDA);
    ops::split_main_params(p, model, lo, s);
    bytes("adamw_step_split (bf16 + lower halves)", "268M params", double(n) * (4 * 5 + 2 * 4),
          [&] { ops::adamw_step_split(model, lo, g, m, v, ap, s); });
    // --use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16: the two
    // moments 2 bytes each, 20 bytes an element.
    {
      Tensor m16 = Tensor::empty({n}, DType::BF16, Device::CUDA);
      Tensor v16 = Tensor::empty({n}, DType::BF16, Device::CUDA);
      ops::copy(m, m16, s), ops::copy(v, v16, s);
      bytes("adamw_step_split, bf16 moments", "268M params", double(n) * (4 * 1 + 2 * 8),
            [&] { ops::adamw_step_split(model, lo, g, m16, v16, ap, s); });
    }
    // --optimizer sgd / lion (ops/momentum_step.h): one state buffer, split main params as
    // above: 2 + 2 + 4 (g) + 4 (m) read, 2 + 2 + 4 written = 20 bytes an element.
    for (auto rule : {ops::MomentumStepParams::Rule::Sgd, ops::MomentumStepParams::Rule::Lion}) {
      ops::MomentumStepParams mp;
      mp.rule = rule, mp.lr = 1e-4, mp.weight_decay = 0.1;
      bytes(rule == ops::MomentumStepParams::Rule::Sgd ? "momentum_step_split (sgd)"
                                                        : "momentum_step_split (lion)",
            "268M params", double(n) * (4 * 3 + 2 * 4),
            [&] { ops::momentum_step_split(model, lo, g, m, mp, s); });
    }
  }
  // ---- the step's compute alone, at the power cap ----------------------------------------
  // For each bench_gpu_train model, one training step's GEMMs (per layer: the qkv, proj, fc1,
  // fc2 forward; input and f32 += weight gradients of each) and attention (forward and
  // backward), in the step's order, then the output layer: no norm, activation, cross-entropy
  // or optimizer kernel in between. Timed after 3 s of back to back replays, so at the
  // sustained (power-capped) clock. With the bandwidth-bound kernels left out this is close
  // to the step's floor on this GPU; the table's rate is over the GEMM and attention FLOPs.
  struct RM {
    const char* name;
    int64_t L, H, NH, NG, HD, F, V, B, S;
    bool swiglu;
    double target_tok_s;  // issue 7's 1.15x target
  };
  for (RM m : {RM{"GPT-2 124M", 12, 768, 12, 12, 64, 3072, 50304, 64, 1024, false, 604e3},
               RM{"GPT-2 350M", 24, 1024, 16, 16, 64, 4096, 50304, 64, 1024, false, 230e3},
               RM{"GPT-3 XL", 24, 2048, 16, 16, 128, 8192, 50304, 16, 2048, false, 72.5e3},
               RM{"Llama-style 1B", 16, 2048, 32, 8, 64, 8192, 32000, 16, 2048, true, 90e3}}) {
    const std::string op = std::string("compute replay ") + m.name;
    if (skipped(op)) continue;
    const int64_t T = m.B * m.S, Q = (m.NH + 2 * m.NG) * m.HD, F1 = m.swiglu ? 2 * m.F : m.F;
    ops::AttentionDims d;
    d.S = m.S, d.B = m.B, d.NH = m.NH, d.NG = m.NG, d.HD = m.HD;
    struct Lin {
      int64_t in, out;
      Tensor w, dw32;
    };
    // in/out features of qkv, proj, fc1, fc2, then the output layer.
    std::vector<Lin> lin;
    for (auto [in, out] :
         {std::pair<int64_t, int64_t>{m.H, Q}, {m.H, m.H}, {m.H, F1}, {m.F, m.H}, {m.H, m.V}})
      lin.push_back({in, out, rnd({out, in}, bf, 0.05f), rnd({out, in}, DType::F32)});
    int64_t widest = 0;
    for (const Lin& l : lin) widest = std::max({widest, l.in, l.out});
    Tensor xa = rnd({T * widest}, bf), ya = rnd({T * widest}, bf), da = rnd({T * widest}, bf);
    auto view = [&](const Tensor& t, int64_t cols) {
      return t.narrow(0, T * cols).view({T, cols});
    };
    Tensor qkv = rnd({m.S, m.B, Q}, bf), out = rnd({m.S, m.B, m.NH * m.HD}, bf);
    Tensor lse = rnd({m.B, m.NH, m.S}, DType::F32), dout = rnd(out.shape(), bf),
           dqkv = rnd(qkv.shape(), bf);
    const double sc = 1.0 / std::sqrt(double(m.HD));
    auto fwd = [&](Lin& l) {
      Tensor x = view(xa, l.in), y = view(ya, l.out);
      ops::gemm(false, true, 1.0, x, l.w, 0.0, y, s);
    };
    auto bwd = [&](Lin& l) {
      Tensor x = view(xa, l.in), dy = view(da, l.out), dx = view(ya, l.in);
      ops::gemm(false, false, 1.0, dy, l.w, 0.0, dx, s);
      ops::gemm(true, false, 1.0, dy, x, 1.0, l.dw32, s);
    };
    auto step = [&] {
      for (int64_t i = 0; i < m.L; ++i) {
        fwd(lin[0]);
        ops::attention_forward(qkv, d, sc, 0.0, {}, out, lse, s);
        fwd(lin[1]), fwd(lin[2]), fwd(lin[3]);
      }
      fwd(lin[4]);
      bwd(lin[4]);
      for (int64_t i = 0; i < m.L; ++i) {
        bwd(lin[3]), bwd(lin[2]), bwd(lin[1]);
        ops::attention_backward(dout, qkv, out, lse, d, sc, 0.0, {}, dqkv, s);
        bwd(lin[0]);
      }
    };
    double f = 0;
    for (const Lin& l : lin) f += 6.0 * T * l.in * l.out * (&l == &lin[4] ? 1 : m.L);
    f += 3.5 * 2.0 * m.B * m.NH * double(m.S) * m.S * m.HD * m.L;  // causal fwd + 2.5x bwd
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3)) {
      step();
      CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s.handle)));
    }
    const double target_ms = double(T) / m.target_tok_s * 1e3;
    char sh[96];
    std::snprintf(sh, sizeof sh, "B%lld S%lld, step target %.1f ms", (long long)m.B, (long long)m.S,
                  target_ms);
    flops(op, sh, f, step);
  }

  gpu::synchronize(s);
  auto mem = gpu::memory_stats();

  std::printf("\n| op | shape | time (ms) | rate |\n|---|---|---:|---:|\n");
  for (const Row& r : g_rows)
    std::printf("| %s | %s | %.3f | %.1f %s |\n", r.op.c_str(), r.shape.c_str(), r.ms, r.rate,
                r.unit);
  std::printf("\npeak tensor memory %.2f GiB, pool reserved peak %.2f GiB (%d runs, median)\n",
              mem.peak / 1073741824.0, mem.reserved_peak / 1073741824.0, g_reps);
  return 0;
}
