// The own flash-attention kernels alone (flash_attention.cu), at the attention shapes of
// bench_gpu_train's four models: forward and backward, with and without attention dropout,
// on each dQ path. One table, milliseconds a call (median of --reps after two warm-ups).
//
// It is built from flash_attention.cu's source itself, not against the megatron_cuda
// library, so one nvcc call makes a binary that needs only libfmt, cuBLAS (for --hot) and
// the driver: built on the CI-like machine and carried to the GPU machine, it measures a
// kernel change without the GPU machine's ~90 s build (the device time of a session is
// short):
//   nvcc -std=c++20 -arch=sm_90a -O3 --expt-relaxed-constexpr -DFMT_USE_CONSTEXPR=1 -I src \
//     -o bench_flash_kernels bench/gpu/bench_flash_kernels.cu src/base/error.cpp \
//     src/ops/attention_backend.cpp src/tensor/dtype.cpp -lfmt -lcublas
// CMake builds it as well (target bench_flash_kernels). Two builds of different trees, run
// alternately in one call, compare a change (the H200 runs at its power cap: compare only
// within a call). The experimental variant of flash_attention_sm90_bwd.cuh builds the same
// way with -DMCPP_FA_DKV_MIN_BLOCKS=3 added; --wgmma then checks it bit for bit against the
// mma.sync kernels.
//
// Usage: bench_flash_kernels [--reps N] [--only NAME] [--wgmma] [--hot MS]   (NAME: 124M,
// 350M, XL or Llama)
// --hot MS: before each timed call (warm-ups too), about MS milliseconds of cuBLAS bf16
// GEMMs (8192^3) on the same stream, untimed. Alone, the kernels run at the idle card's
// 1.98 GHz; inside a training step the H200 sits at its 700 W cap at about 1.4-1.6 GHz
// (bench/RESULTS.md); the GEMMs before each call are meant to put it there, so that a
// change is compared at the clock the step gives it (not yet checked on the GPU).
// Columns: fwd; fwd with dropout 0.1 writing the keep bits (as the model's layers run it);
// bwd without dropout with dS handed over (dS); bwd with dropout reading the forward's keep
// bits, with dS (as the layers run it) and recomputing dS in the dQ kernel (no dS).
// --wgmma: instead, the mma.sync kernels against the wgmma ones (fa_fwd_wgmma_kernel,
// fa_bwd_dkv_wgmma_kernel, fa_bwd_dq_ds_wgmma_kernel: what the library launches on Hopper),
// without and with dropout, on the same inputs: both times, the largest difference of the
// output (out; dK and dV; dQ) relative to its largest value, of lse, and whether the keep
// bits both forwards wrote are the same bytes.
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <cublas_v2.h>

#include "ops/cuda/flash_attention.cu"

namespace mcpp::ops::cuda {
// The library's reporter lives in device.cu with the allocator and the streams; this
// binary has none of those.
void cuda_fail(const char* file, int line, const char* expr, int code, const char* name,
               const char* msg) {
  fail_at(file, line, fmt::format("CUDA call failed: {} -> {} ({}): {}", expr, name, code, msg));
}
}  // namespace mcpp::ops::cuda

namespace {

using namespace mcpp;

// bf16 values in [-2, 2) from a hash of the index.
__global__ void fill_kernel(uint16_t* p, int64_t n, uint32_t seed) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 0x9E3779B1u ^ seed;
    h ^= h >> 16, h *= 0x85EBCA6Bu, h ^= h >> 13, h *= 0xC2B2AE35u, h ^= h >> 16;
    const float f = float(h >> 8) * (4.f / 16777216.f) - 2.f;
    uint32_t u;
    std::memcpy(&u, &f, 4);
    p[i] = uint16_t(u >> 16);
  }
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) MCPP_FAIL("bench_flash_kernels: {}: {}", what, cudaGetErrorString(e));
}

// --hot: bf16 GEMMs of 8192^3 through cuBLAS, enough of them for about `ms` milliseconds
// (timed once at set-up), run before each timed call on its stream.
struct Heater {
  cublasHandle_t h = nullptr;
  void* m = nullptr;  // A, B, C: three 8192 x 8192 bf16 matrices
  int n = 0;          // GEMMs a heat()
  static constexpr int kN = 8192;
  Heater(double ms, cudaStream_t cs) {
    if (ms <= 0) return;
    const int64_t e = int64_t(kN) * kN;
    check(cudaMalloc(&m, size_t(3 * e) * 2), "malloc");
    fill_kernel<<<1024, 256, 0, cs>>>(static_cast<uint16_t*>(m), 2 * e, 3);
    if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS ||
        cublasSetStream(h, cs) != CUBLAS_STATUS_SUCCESS)
      MCPP_FAIL("bench_flash_kernels --hot: cuBLAS could not start");
    n = 4;
    cudaEvent_t a, b;
    check(cudaEventCreate(&a), "event");
    check(cudaEventCreate(&b), "event");
    heat();  // warm-up, then time four
    check(cudaEventRecord(a, cs), "record");
    heat();
    check(cudaEventRecord(b, cs), "record");
    check(cudaEventSynchronize(b), "heat");
    float t = 0;
    check(cudaEventElapsedTime(&t, a, b), "elapsed");
    check(cudaEventDestroy(a), "event");
    check(cudaEventDestroy(b), "event");
    n = std::max(1, int(ms / (t / 4) + 0.5));
    std::printf("--hot %.1f: %d GEMMs of 8192^3 (%.2f ms each) before each timed call\n", ms,
                n, t / 4);
  }
  ~Heater() {
    if (h) cublasDestroy(h);
    if (m) cudaFree(m);
  }
  Heater(const Heater&) = delete;
  Heater& operator=(const Heater&) = delete;
  void heat() const {
    const float one = 1.f, zero = 0.f;
    const int64_t e = int64_t(kN) * kN;
    auto* a = static_cast<uint16_t*>(m);
    for (int i = 0; i < n; ++i)
      if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, kN, kN, kN, &one, a, CUDA_R_16BF, kN,
                       a + e, CUDA_R_16BF, kN, &zero, a + 2 * e, CUDA_R_16BF, kN,
                       CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS)
        MCPP_FAIL("bench_flash_kernels --hot: cublasGemmEx failed");
  }
};

struct AttnShape {
  const char* name;
  int64_t B, S, NH, NG, HD;
};

template <typename T>
std::vector<T> to_host(const void* p, int64_t n) {
  std::vector<T> h(static_cast<size_t>(n));
  check(cudaMemcpy(h.data(), p, size_t(n) * sizeof(T), cudaMemcpyDeviceToHost), "copy");
  return h;
}
float bf16_value(uint16_t v) {
  const uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// --wgmma: fa_fwd_kernel against fa_fwd_wgmma_kernel (head dims 64 and 128) and
// fa_bwd_dkv_kernel against fa_bwd_dkv_wgmma_kernel, and fa_bwd_dq_ds_kernel against
// fa_bwd_dq_ds_wgmma_kernel, on the same inputs (bf16), without and with dropout.
template <int HD, typename Time>
void compare_wgmma(const AttnShape& c, const ops::cuda::FlashArgs& fa,
                   const ops::cuda::FlashArgs& fd, void* out, float* lse, void* mask, void* dqkv,
                   const void* dout, const float* delta, void* ds, int64_t chunk,
                   cudaStream_t cs, Time& time) {
  namespace gpu = mcpp::ops::cuda;
  using gpu::bf16;
  const int64_t no = c.S * c.B * c.NH * c.HD, nl = c.B * c.NH * c.S;
  static bool once =
      (gpu::allow_smem(gpu::fa_fwd_kernel<bf16, HD, false>, gpu::fwd_bytes<HD>()),
       gpu::allow_smem(gpu::fa_fwd_kernel<bf16, HD, true>, gpu::fwd_bytes<HD>()),
       gpu::allow_smem(gpu::fa_fwd_wgmma_kernel<bf16, HD, false>, gpu::fwd_wgmma_bytes<HD>()),
       gpu::allow_smem(gpu::fa_fwd_wgmma_kernel<bf16, HD, true>, gpu::fwd_wgmma_bytes<HD>()),
       gpu::allow_smem(gpu::fa_bwd_dkv_kernel<bf16, HD, false>, gpu::dkv_bytes<HD>()),
       gpu::allow_smem(gpu::fa_bwd_dkv_kernel<bf16, HD, true>, gpu::dkv_bytes<HD>()),
       gpu::allow_smem(gpu::fa_bwd_dkv_wgmma_kernel<bf16, HD, false>,
                       gpu::bwd_dkv_wgmma_bytes<HD>()),
       gpu::allow_smem(gpu::fa_bwd_dkv_wgmma_kernel<bf16, HD, true>,
                       gpu::bwd_dkv_wgmma_bytes<HD>()),
       gpu::allow_smem(gpu::fa_bwd_dq_ds_kernel<bf16, HD>, gpu::dq_ds_bytes<HD>()),
       gpu::allow_smem(gpu::fa_bwd_dq_ds_wgmma_kernel<bf16, HD>, gpu::dq_ds_wgmma_bytes<HD>()),
       true);
  (void)once;
  const int64_t mask_bytes = gpu::flash_attention_mask_bytes(fd);
  for (bool drop : {false, true}) {
    gpu::FaParams P = gpu::make(drop ? fd : fa);
    P.out = out, P.lse = lse;
    P.mask = drop && P.D.aligned ? static_cast<uint8_t*>(mask) : nullptr;
    const dim3 grid(unsigned((P.S + 63) / 64), unsigned(P.B * P.NH));
    auto run = [&](bool wg) {
      constexpr size_t kb = gpu::fwd_bytes<HD>(), wb = gpu::fwd_wgmma_bytes<HD>();
      if (wg && drop)
        gpu::fa_fwd_wgmma_kernel<bf16, HD, true><<<grid, 128, wb, cs>>>(P);
      else if (wg)
        gpu::fa_fwd_wgmma_kernel<bf16, HD, false><<<grid, 128, wb, cs>>>(P);
      else if (drop)
        gpu::fa_fwd_kernel<bf16, HD, true><<<grid, 128, kb, cs>>>(P);
      else
        gpu::fa_fwd_kernel<bf16, HD, false><<<grid, 128, kb, cs>>>(P);
      check(cudaGetLastError(), "launch");
    };
    if (P.mask) check(cudaMemset(mask, 0, size_t(mask_bytes)), "memset");
    run(false);
    check(cudaStreamSynchronize(cs), "fa_fwd_kernel");
    const auto o_ref = to_host<uint16_t>(out, no);
    const auto l_ref = to_host<float>(lse, nl);
    const auto m_ref = drop && P.mask ? to_host<uint8_t>(mask, mask_bytes) : std::vector<uint8_t>{};
    check(cudaMemset(out, 0, size_t(no) * 2), "memset");
    if (P.mask) check(cudaMemset(mask, 0, size_t(mask_bytes)), "memset");
    run(true);
    check(cudaStreamSynchronize(cs), "fa_fwd_wgmma_kernel");
    const auto o_wg = to_host<uint16_t>(out, no);
    const auto l_wg = to_host<float>(lse, nl);
    float dmax = 0, omax = 0, lmax = 0;
    for (size_t i = 0; i < o_ref.size(); ++i) {
      dmax = std::max(dmax, std::fabs(bf16_value(o_ref[i]) - bf16_value(o_wg[i])));
      omax = std::max(omax, std::fabs(bf16_value(o_ref[i])));
    }
    for (size_t i = 0; i < l_ref.size(); ++i) lmax = std::max(lmax, std::fabs(l_ref[i] - l_wg[i]));
    std::string bits = "-";
    if (drop && P.mask) bits = to_host<uint8_t>(mask, mask_bytes) == m_ref ? "equal" : "DIFFER";
    const float t0 = time([&] { run(false); }), t1 = time([&] { run(true); });
    std::printf("| %s fwd | %s | %.3f | %.3f | %.2e | %.2e | %s |\n", c.name, drop ? "0.1" : "0",
                t0, t1, omax > 0 ? dmax / omax : dmax, lmax, bits.c_str());
    std::fflush(stdout);

    // dK, dV from the lse just written (and, with dropout, the keep bits): no dS hand-over.
    gpu::FaParams B = P;
    B.out = dqkv, B.dout = dout, B.delta = delta, B.mask_ready = B.mask != nullptr;
    const dim3 bgrid(unsigned((B.S + 63) / 64), unsigned(B.B * B.NG));
    auto run_dkv = [&](bool wg) {
      constexpr size_t kb = gpu::dkv_bytes<HD>(), wb = gpu::bwd_dkv_wgmma_bytes<HD>();
      if (wg && drop)
        gpu::fa_bwd_dkv_wgmma_kernel<bf16, HD, true><<<bgrid, 128, wb, cs>>>(B);
      else if (wg)
        gpu::fa_bwd_dkv_wgmma_kernel<bf16, HD, false><<<bgrid, 128, wb, cs>>>(B);
      else if (drop)
        gpu::fa_bwd_dkv_kernel<bf16, HD, true><<<bgrid, 128, kb, cs>>>(B);
      else
        gpu::fa_bwd_dkv_kernel<bf16, HD, false><<<bgrid, 128, kb, cs>>>(B);
      check(cudaGetLastError(), "launch");
    };
    const int64_t nq = c.S * c.B * (c.NH + 2 * c.NG) * c.HD;
    check(cudaMemset(dqkv, 0, size_t(nq) * 2), "memset");
    run_dkv(false);
    check(cudaStreamSynchronize(cs), "fa_bwd_dkv_kernel");
    const auto g_ref = to_host<uint16_t>(dqkv, nq);
    check(cudaMemset(dqkv, 0, size_t(nq) * 2), "memset");
    run_dkv(true);
    check(cudaStreamSynchronize(cs), "fa_bwd_dkv_wgmma_kernel");
    const auto g_wg = to_host<uint16_t>(dqkv, nq);
    float gd = 0, gmax = 0;
    for (size_t i = 0; i < g_ref.size(); ++i) {
      gd = std::max(gd, std::fabs(bf16_value(g_ref[i]) - bf16_value(g_wg[i])));
      gmax = std::max(gmax, std::fabs(bf16_value(g_ref[i])));
    }
    const float b0 = time([&] { run_dkv(false); }), b1 = time([&] { run_dkv(true); });
    std::printf("| %s dK/dV | %s | %.3f | %.3f | %.2e | - | - |\n", c.name, drop ? "0.1" : "0", b0,
                b1, gmax > 0 ? gd / gmax : gd);
    std::fflush(stdout);

    // dQ = dS K from the dS tiles each family's dK/dV kernel hands over (the Hopper kernels
    // store them swizzled at head dim 64), for the first chunk of sequences:
    // fa_bwd_dq_ds_kernel against fa_bwd_dq_ds_wgmma_kernel.
    if (!ds) continue;
    B.ds = ds, B.b0 = 0;
    const int64_t nb = std::min(chunk, c.B);
    const dim3 cgrid(bgrid.x, unsigned(nb * B.NG)), qgrid(bgrid.x, unsigned(nb * B.NH));
    auto run_dq = [&](bool wg) {
      constexpr size_t wb = gpu::dq_ds_wgmma_bytes<HD>();
      if (wg)
        gpu::fa_bwd_dq_ds_wgmma_kernel<bf16, HD><<<qgrid, 128, wb, cs>>>(B);
      else
        gpu::fa_bwd_dq_ds_kernel<bf16, HD><<<qgrid, 128, gpu::dq_ds_bytes<HD>(), cs>>>(B);
      check(cudaGetLastError(), "launch");
    };
    auto dq_of = [&](bool wg) {
      check(cudaMemset(dqkv, 0, size_t(nq) * 2), "memset");
      constexpr size_t wb = gpu::bwd_dkv_wgmma_bytes<HD>();
      if (wg && drop)
        gpu::fa_bwd_dkv_wgmma_kernel<bf16, HD, true><<<cgrid, 128, wb, cs>>>(B);
      else if (wg)
        gpu::fa_bwd_dkv_wgmma_kernel<bf16, HD, false><<<cgrid, 128, wb, cs>>>(B);
      else if (drop)
        gpu::fa_bwd_dkv_kernel<bf16, HD, true><<<cgrid, 128, gpu::dkv_bytes<HD>(), cs>>>(B);
      else
        gpu::fa_bwd_dkv_kernel<bf16, HD, false><<<cgrid, 128, gpu::dkv_bytes<HD>(), cs>>>(B);
      run_dq(wg);
      check(cudaStreamSynchronize(cs), "dq kernels");
      return to_host<uint16_t>(dqkv, nq);
    };
    const auto q_ref = dq_of(false), q_wg = dq_of(true);
    float qd = 0, qmax = 0;
    for (size_t i = 0; i < q_ref.size(); ++i) {
      qd = std::max(qd, std::fabs(bf16_value(q_ref[i]) - bf16_value(q_wg[i])));
      qmax = std::max(qmax, std::fabs(bf16_value(q_ref[i])));
    }
    const float d0 = time([&] { run_dq(false); }), d1 = time([&] { run_dq(true); });
    std::printf("| %s dQ from dS (%lld seqs) | %s | %.3f | %.3f | %.2e | - | - |\n", c.name,
                (long long)nb, drop ? "0.1" : "0", d0, d1, qmax > 0 ? qd / qmax : qd);
    std::fflush(stdout);
  }
}

}  // namespace

static int run(int argc, char** argv) {
  int reps = 20;
  std::string only;
  bool wgmma = false;
  double hot_ms = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--reps" && i + 1 < argc)
      reps = std::max(1, std::atoi(argv[++i]));
    else if (a == "--only" && i + 1 < argc)
      only = argv[++i];
    else if (a == "--wgmma")
      wgmma = true;
    else if (a == "--hot" && i + 1 < argc)
      hot_ms = std::atof(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: bench_flash_kernels [--reps N] [--only NAME] [--wgmma] [--hot MS]\n");
      return 2;
    }
  }
  namespace gpu = mcpp::ops::cuda;
  cudaStream_t cs;
  check(cudaStreamCreate(&cs), "stream");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  const Heater heater(hot_ms, cs);
  if (wgmma) {
    std::printf(
        "| kernel | dropout | mma.sync ms | wgmma ms | max |d out| / max |out| | "
        "max |d lse| | keep bits |\n|---|---:|---:|---:|---:|---:|---|\n");
  } else {
    std::printf(
        "| shape | fwd | fwd, dropout | bwd, dS | bwd, dropout, dS | bwd, dropout, no dS |\n");
    std::printf("|---|---:|---:|---:|---:|---:|\n");
  }
  for (AttnShape c :
       {AttnShape{"124M", 64, 1024, 12, 12, 64}, AttnShape{"350M", 64, 1024, 16, 16, 64},
        AttnShape{"XL", 16, 2048, 16, 16, 128}, AttnShape{"Llama", 16, 2048, 32, 8, 64}}) {
    if (!only.empty() && only != c.name) continue;
    ops::AttentionDims d;
    d.S = c.S, d.B = c.B, d.NH = c.NH, d.NG = c.NG, d.HD = c.HD;
    const int64_t nq = c.S * c.B * d.qkv_width(), no = c.S * c.B * c.NH * c.HD,
                  nl = c.B * c.NH * c.S;
    gpu::FlashArgs fa{nullptr, d, DType::BF16, 1.0 / std::sqrt(double(c.HD))};
    gpu::FlashArgs fd = fa;
    fd.dropout_p = 0.1, fd.key = {1234, 7};
    const int64_t chunk =
        gpu::flash_attention_ds_chunk(fa, ops::attention_bwd_workspace_cap_from_env());
    void *qkv, *out, *dout, *dqkv, *ds = nullptr, *mask;
    float *lse, *delta;
    check(cudaMalloc(&qkv, nq * 2), "malloc");
    check(cudaMalloc(&dqkv, nq * 2), "malloc");
    check(cudaMalloc(&out, no * 2), "malloc");
    check(cudaMalloc(&dout, no * 2), "malloc");
    check(cudaMalloc(&lse, nl * 4), "malloc");
    check(cudaMalloc(&delta, nl * 4), "malloc");
    check(cudaMemset(delta, 0, nl * 4), "memset");
    if (chunk > 0) check(cudaMalloc(&ds, ops::flash_ds_bytes(chunk, c.NH, c.S)), "malloc");
    check(cudaMalloc(&mask, gpu::flash_attention_mask_bytes(fd) + 8), "malloc");
    fill_kernel<<<1024, 256, 0, cs>>>(static_cast<uint16_t*>(qkv), nq, 1);
    fill_kernel<<<1024, 256, 0, cs>>>(static_cast<uint16_t*>(dout), no, 2);
    fa.qkv = fd.qkv = qkv;
    auto time = [&](auto fn) {
      heater.heat(), fn(), heater.heat(), fn();
      std::vector<float> ms(static_cast<size_t>(reps));
      for (float& t : ms) {
        heater.heat();
        check(cudaEventRecord(e0, cs), "record");
        fn();
        check(cudaEventRecord(e1, cs), "record");
        check(cudaEventSynchronize(e1), "kernel");
        check(cudaEventElapsedTime(&t, e0, e1), "elapsed");
      }
      std::sort(ms.begin(), ms.end());
      return ms[ms.size() / 2];
    };
    if (wgmma) {
      if (c.HD == 64)
        compare_wgmma<64>(c, fa, fd, out, lse, mask, dqkv, dout, delta, ds, chunk, cs, time);
      else
        compare_wgmma<128>(c, fa, fd, out, lse, mask, dqkv, dout, delta, ds, chunk, cs, time);
      for (void* p :
           {qkv, dqkv, out, dout, ds, mask, static_cast<void*>(lse), static_cast<void*>(delta)})
        if (p) check(cudaFree(p), "free");
      continue;
    }
    const float f0 = time([&] { gpu::flash_attention_forward(fa, out, lse, cs); });
    const float f1 = time([&] { gpu::flash_attention_forward(fd, out, lse, cs, mask); });
    auto bwd = [&](const gpu::FlashArgs& a, bool keep, bool with_ds) {
      return time([&] {
        gpu::flash_attention_backward(a, dout, lse, delta, dqkv, cs, keep ? mask : nullptr, keep,
                                      with_ds ? ds : nullptr, with_ds ? chunk : 0);
      });
    };
    auto cell = [&](const gpu::FlashArgs& a, bool keep, bool with_ds) {
      return with_ds && chunk == 0 ? std::string("-")
                                   : fmt::format("{:.3f}", bwd(a, keep, with_ds));
    };
    const std::string b0 = cell(fa, false, true), b1 = cell(fd, true, true),
                      b2 = cell(fd, true, false);
    std::printf("| %s: B %lld S %lld NH %lld NG %lld HD %lld | %.3f | %.3f | %s | %s | %s |\n",
                c.name, (long long)c.B, (long long)c.S, (long long)c.NH, (long long)c.NG,
                (long long)c.HD, f0, f1, b0.c_str(), b1.c_str(), b2.c_str());
    std::fflush(stdout);
    for (void* p :
         {qkv, dqkv, out, dout, ds, mask, static_cast<void*>(lse), static_cast<void*>(delta)})
      if (p) check(cudaFree(p), "free");
  }
  return 0;
}

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return 1;
  }
}
