// cuBLASLt's FP8 GEMM (catalogue.inc, fp8_gemm): C[M,N] = sa * sb * (A[M,K] @ B[N,K]^T)
// (+ bias) (+ addend | + C). Hopper's FP8 tensor-core GEMMs take one layout only: both
// operands K-major, cuBLAS's "TN" (docs: cublasLtMatmul, FP8 restrictions), which is why
// the linear layers keep row-wise and column-wise (transposed) FP8 copies
// (fp8_cast_transpose): fprop X·Wᵀ, dgrad G·(Wᵀ)ᵀ, wgrad Gᵀ·(Xᵀ)ᵀ are all this one form.
// The scales are device pointers (cuBLASLt's A/B_SCALE_POINTER, the dequantisation
// factors 1/scale), so nothing synchronises with the host. The algorithm is chosen once
// per (shape, types, epilogue, alignments) and cached, as the bf16 GEMMs (gemm.cu): the
// first call of a key times up to kTuneCandidates of cuBLASLt's heuristic candidates on its
// own operands (into scratch outputs) and keeps the fastest whose output is bitwise equal
// to the heuristic's first pick, so the numbers never depend on the timing (split-K and
// stream-K orders that round differently are never taken). The switch (MCPP_GEMM_AUTOTUNE,
// set_gemm_autotune), the scratch and the bitwise check are gemm.cu's (gemm_tuning.h);
// fp8_gemm_tuning_report() lists what tuning found.
//
// Row-major to column-major as in gemm.cu: row-major C[M,N] is column-major C^T[N,M] =
// B·A^T with cuBLAS's A = our B (op T, stored K x N) and cuBLAS's B = our A (op N, K x M).
#include <cublasLt.h>
#include <cuda_fp8.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include "ops/cuda/common.cuh"
#include "ops/cuda/fp8.h"
#include "ops/cuda/fp8_block.h"
#include "ops/fp8_grid.h"
#include "ops/cuda/gemm_tuning.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

cublasLtHandle_t fp8_lt_handle() {
  static cublasLtHandle_t h = [] {
    cublasLtHandle_t x;
    CUBLAS_CHECK(cublasLtCreate(&x));
    return x;
  }();
  return h;
}

cudaDataType_t lt_type(DType t, const char* op, const char* name) {
  switch (t) {
    case DType::FP8E4M3:
      return CUDA_R_8F_E4M3;
    case DType::FP8E5M2:
      return CUDA_R_8F_E5M2;
    case DType::BF16:
      return CUDA_R_16BF;
    case DType::F32:
      return CUDA_R_32F;
    default:
      MCPP_FAIL("{}: {} is {}; FP8 operands, bf16 or f32 outputs", op, name, dtype_name(t));
  }
}

uint32_t align_of(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

using Key = std::tuple<int64_t, int64_t, int64_t, int, int, int, bool, bool, bool, uint32_t,
                       uint32_t, uint32_t, int, int>;
struct Cache {
  std::mutex mu;
  std::map<Key, cublasLtMatmulAlgo_t> algos;
  std::map<Key, cublasLtMatmulAlgo_t> classes;  // by shape class (gemm_shape_class)
  std::vector<std::string> report;  // one line per tuned key
};
Cache& cache() {
  static Cache* c = new Cache;
  return *c;
}


bool is_fp8(DType t) { return t == DType::FP8E4M3 || t == DType::FP8E5M2; }

constexpr int kTuneCandidates = 8;
constexpr int kTuneReps = 3;





// Times candidates res[0, n) of one call (operands A = cuBLAS's A, B = cuBLAS's B, C input
// cin) into scratch outputs; returns the fastest whose output is bitwise equal to
// candidate 0's. `line` gets what was found.
cublasLtMatmulAlgo_t tune(const LtDescs& d, const cublasLtMatmulHeuristicResult_t* res, int n,
                          const float* alpha, const void* A, const void* B, const float* beta,
                          const void* cin, size_t out_bytes, void* ws, cudaStream_t cs,
                          std::string& line) {
  TuningBuffer ref{out_bytes}, out{out_bytes}, flag{sizeof(unsigned)};
  if (!ref.p || !out.p || !flag.p) {
    line = "no device memory to tune; heuristic's first pick";
    return res[0].algo;
  }
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  auto launch = [&](int i, void* dst) {
    return cublasLtMatmul(fp8_lt_handle(), d.op, alpha, A, d.a, B, d.b, beta, cin, d.c, dst, d.c,
                          &res[i].algo, ws, kWorkspaceBytes, cs) == CUBLAS_STATUS_SUCCESS;
  };
  auto time_ms = [&](int i) {
    float best = 1e30f;
    for (int r = 0; r < kTuneReps; ++r) {
      CUDA_CHECK(cudaEventRecord(e0, cs));
      if (!launch(i, out.p)) return -1.f;
      CUDA_CHECK(cudaEventRecord(e1, cs));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      best = std::min(best, ms);
    }
    return best;
  };
  auto differs = [&]() {
    return device_bytes_differ(ref.p, out.p, int64_t(out_bytes), static_cast<unsigned*>(flag.p),
                               cs);
  };
  int best = 0, equal = 0;
  float t0 = -1.f;
  if (launch(0, ref.p)) t0 = time_ms(0);
  float best_ms = t0;
  if (t0 > 0) {
    equal = 1;
    for (int i = 1; i < n; ++i) {
      if (res[i].state != CUBLAS_STATUS_SUCCESS || !launch(i, out.p) || differs()) continue;
      ++equal;
      const float ms = time_ms(i);
      if (ms > 0 && ms < best_ms) best = i, best_ms = ms;
    }
  }
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  line = fmt::format("{} candidates, {} bitwise equal to the first; first {:.3f} ms ({}), chosen "
                     "#{} {:.3f} ms ({})",
                     n, std::max(equal, 1), t0, algo_config(res[0].algo), best, best_ms,
                     algo_config(res[best].algo));
  return res[best].algo;
}

// One FP8 GEMM with our A's and B's scale modes (scalar: fp8_gemm; VEC128 / BLK128x128:
// fp8_block_gemm). Returns false, touching nothing, when `soft` and cuBLASLt has no
// algorithm (fp8_block_gemm then tries another form).
bool fp8_gemm_modes(const char* op, const Tensor& a, const Tensor& a_scale_inv, int mode_a,
                    const Tensor& b, const Tensor& b_scale_inv, int mode_b, const Tensor& bias,
                    const Tensor& addend, bool accumulate, bool fast_accum, Tensor& c, Stream& s,
                    bool soft) {
  const bool block = mode_a != CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
  check_cuda(a, op, "A");
  check_cuda(b, op, "B");
  check_cuda(c, op, "C");
  check_f32(a_scale_inv, op, "a_scale_inv");
  check_f32(b_scale_inv, op, "b_scale_inv");
  MCPP_CHECK(is_fp8(a.dtype()) && is_fp8(b.dtype()) &&
                 !(a.dtype() == DType::FP8E5M2 && b.dtype() == DType::FP8E5M2),
             "{}: A {} and B {} must be FP8, not both E5M2", op, a.str(), b.str());
  MCPP_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(1),
             "{}: A {} and B {} must be [M, K] and [N, K]", op, a.str(), b.str());
  const int64_t M = a.size(0), K = a.size(1), N = b.size(0);
  MCPP_CHECK(c.numel() == M * N && (c.dtype() == DType::BF16 || c.dtype() == DType::F32),
             "{}: C {} must be bf16 or f32 with {}x{} elements", op, c.str(), M, N);
  MCPP_CHECK_HINT(M % 16 == 0 && N % 16 == 0 && K % 16 == 0,
                  "FP8 training needs hidden sizes, FFN sizes and micro-batch tokens (seq x "
                  "micro-batch) that are multiples of 16",
                  "{}: [{}x{}]x[{}x{}]^T: cuBLASLt's FP8 GEMM needs every dimension a multiple "
                  "of 16",
                  op, M, K, N, K);
  if (bias.defined())
    MCPP_CHECK(bias.device() == Device::CUDA && bias.dtype() == c.dtype() && bias.numel() == N,
               "{}: bias {} must be C's dtype with {} elements", op, bias.str(), N);
  if (addend.defined())
    MCPP_CHECK(
        addend.device() == Device::CUDA && addend.dtype() == c.dtype() && addend.numel() == M * N,
        "{}: addend {} must be C's dtype and size", op, addend.str());
  MCPP_CHECK(!(addend.defined() && accumulate), "{}: addend and accumulate exclude each other", op);
  if (M == 0 || N == 0) return true;
  const void* cin = addend.defined() ? addend.raw() : c.raw();
  const float alpha = 1.f, beta = (addend.defined() || accumulate) ? 1.f : 0.f;

  LtDescs d;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ot = CUBLAS_OP_T, on = CUBLAS_OP_N;
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &ot, sizeof(ot)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &on, sizeof(on)));
  const void* sa = b_scale_inv.raw();  // cuBLAS's A is our B
  const void* sb = a_scale_inv.raw();
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &sa, sizeof(sa)));
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &sb, sizeof(sb)));
  if (block) {  // ---- FP8 blockwise: the scale tensors' modes (cuBLAS's A is our B)
    const cublasLtMatmulMatrixScale_t ma = cublasLtMatmulMatrixScale_t(mode_b),
                                      mb = cublasLtMatmulMatrixScale_t(mode_a);
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &ma, sizeof(ma)));
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mb, sizeof(mb)));
  }
  const int8_t fast = fast_accum ? 1 : 0;
  CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_FAST_ACCUM, &fast, sizeof(fast)));
  if (bias.defined()) {
    cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
    const void* bp = bias.raw();
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bp, sizeof(bp)));
    cudaDataType_t bt = lt_type(bias.dtype(), op, "bias");
    CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
  }
  const cudaDataType_t at = lt_type(b.dtype(), op, "B"), bt = lt_type(a.dtype(), op, "A"),
                       ct = lt_type(c.dtype(), op, "C");
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, at, uint64_t(K), uint64_t(N), K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, bt, uint64_t(K), uint64_t(M), K));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, ct, uint64_t(N), uint64_t(M), N));

  const uint32_t al_a = align_of(b.raw()), al_b = align_of(a.raw()),
                 al_c = std::min(align_of(c.raw()), align_of(cin));
  const Key key{M,
                N,
                K,
                int(a.dtype()),
                int(b.dtype()),
                int(c.dtype()),
                bias.defined(),
                beta != 0.f,
                fast_accum,
                al_a,
                al_b,
                al_c,
                mode_a,
                mode_b};
  cublasLtMatmulAlgo_t algo;
  bool found = false;
  {
    std::lock_guard<std::mutex> lk(cache().mu);
    auto it = cache().algos.find(key);
    if (it != cache().algos.end()) algo = it->second, found = true;
  }
  // A MoE expert's rows change every step: a new M (or K, the wgrad's tokens) first tries the
  // algorithm of its shape class, as gemm.cu does.
  Key class_key = key;
  std::get<0>(class_key) = gemm_shape_class(M), std::get<2>(class_key) = gemm_shape_class(K);
  if (!found) {
    std::lock_guard<std::mutex> lk(cache().mu);
    auto it = cache().classes.find(class_key);
    cublasLtMatmulHeuristicResult_t chk{};
    if (it != cache().classes.end() &&
        cublasLtMatmulAlgoCheck(fp8_lt_handle(), d.op, d.a, d.b, d.c, d.c, &it->second, &chk) ==
            CUBLAS_STATUS_SUCCESS &&
        chk.workspaceSize <= kWorkspaceBytes)
      algo = it->second, found = true, cache().algos[key] = algo;
  }
  if (!found) {
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = kWorkspaceBytes;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                         sizeof(ws));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &al_a,
                                         sizeof(al_a));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &al_b,
                                         sizeof(al_b));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c,
                                         sizeof(al_c));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &al_c,
                                         sizeof(al_c));
    cublasLtMatmulHeuristicResult_t res[kTuneCandidates]{};
    int n_res = 0;
    const cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(fp8_lt_handle(), d.op, d.a, d.b, d.c, d.c, pref,
                                       gemm_autotune_enabled() ? kTuneCandidates : 1, res, &n_res);
    cublasLtMatmulPreferenceDestroy(pref);
    if (soft && (st != CUBLAS_STATUS_SUCCESS || n_res == 0)) return false;
    MCPP_CHECK_HINT(st == CUBLAS_STATUS_SUCCESS && n_res > 0,
                    block ? "use --fp8-recipe tensorwise or delayed on this GPU / cuBLAS"
                          : "check the shapes: multiples of 16",
                    "{}: cuBLASLt has no FP8 algorithm for [{}x{}] {} x [{}x{}]^T {}{}{} -> {} "
                    "({})",
                    op, M, K, dtype_name(a.dtype()), N, K, dtype_name(b.dtype()),
                    block ? fmt::format(" with block scales ({} x {}; --fp8-recipe blockwise)",
                                        mode_a == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                            ? "128x128"
                                            : "1x128",
                                        mode_b == CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                                            ? "128x128"
                                            : "1x128")
                          : std::string(),
                    bias.defined() ? " with bias" : "", beta != 0.f ? " +C" : "",
                    dtype_name(c.dtype()), cublasGetStatusString(st));
    algo = res[0].algo;
    if (n_res > 1) {
      std::string line;
      algo = tune(d, res, n_res, &alpha, b.raw(), a.raw(), &beta, cin,
                  size_t(M * N) * dtype_size(c.dtype()), workspace(kWorkspaceBytes, s),
                  stream_of(s), line);
      line = fmt::format("{} [{}x{}] {} x [{}x{}]^T {}{}{} -> {}: {}", op, M, K,
                         dtype_name(a.dtype()), N, K, dtype_name(b.dtype()),
                         bias.defined() ? " +bias" : "", beta != 0.f ? " +C" : "",
                         dtype_name(c.dtype()), line);
      std::lock_guard<std::mutex> lk(cache().mu);
      cache().report.push_back(line);
    }
    std::lock_guard<std::mutex> lk(cache().mu);
    cache().algos[key] = algo;
    cache().classes.emplace(class_key, algo);
  }
  void* ws = workspace(kWorkspaceBytes, s);
  CUBLAS_CHECK(cublasLtMatmul(fp8_lt_handle(), d.op, &alpha, b.raw(), d.a, a.raw(), d.b, &beta, cin,
                              d.c, c.raw(), d.c, &algo, ws, kWorkspaceBytes, stream_of(s)));
  return true;
}

}  // namespace

void fp8_gemm(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
              const Tensor& b_scale_inv, const Tensor& bias, const Tensor& addend, bool accumulate,
              bool fast_accum, Tensor& c, Stream& s) {
  fp8_gemm_modes("fp8_gemm", a, a_scale_inv, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, b,
                 b_scale_inv, CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F, bias, addend, accumulate,
                 fast_accum, c, s, false);
}

// ---- FP8 blockwise: cuBLASLt's block-scaled FP8 GEMM (the scale layouts: ops/fp8_grid.h,
// as fp8_block_cast writes them and Transformer Engine hands them to cuBLASLt). A +C that
// cuBLASLt refuses with block scales (the residual addend, wgrad's accumulation) is taken as
// the GEMM into scratch, then one add: the same sum, rounded once more in C's dtype.
void fp8_block_gemm(const Tensor& a, const Tensor& a_scale_inv, bool a_tile, const Tensor& b,
                    const Tensor& b_scale_inv, bool b_tile, const Tensor& bias,
                    const Tensor& addend, bool accumulate, Tensor& c, Stream& s) {
  const char* op = "fp8_block_gemm";
  MCPP_CHECK(!(a_tile && b_tile), "{}: 128x128 by 128x128 block scales is not a cuBLASLt GEMM "
             "(1D x 1D, 1D x 2D or 2D x 1D)", op);
  MCPP_CHECK(a.dim() == 2 && b.dim() == 2, "{}: A {} and B {} must be 2-D", op, a.str(), b.str());
  const int64_t M = a.size(0), K = a.size(1), N = b.size(0);
  int64_t r = 0, q = 0;
  fp8_block_scale_dims(M, K, a_tile, &r, &q);
  check_f32(a_scale_inv, op, "a_scale_inv");
  check_numel(a_scale_inv, r * q, op, "a_scale_inv");
  fp8_block_scale_dims(N, K, b_tile, &r, &q);
  check_f32(b_scale_inv, op, "b_scale_inv");
  check_numel(b_scale_inv, r * q, op, "b_scale_inv");
  const int ma = a_tile ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                        : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const int mb = b_tile ? CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F
                        : CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
  const bool plus_c = addend.defined() || accumulate;
  if (fp8_gemm_modes(op, a, a_scale_inv, ma, b, b_scale_inv, mb, bias, addend, accumulate, false, c,
                     s, plus_c))
    return;
  Tensor tmp = Tensor::empty(c.shape(), c.dtype(), Device::CUDA), none;
  fp8_gemm_modes(op, a, a_scale_inv, ma, b, b_scale_inv, mb, bias, none, false, false, tmp, s,
                 false);
  add(addend.defined() ? addend : c, tmp, c, s);
}

bool fp8_block_gemm_supported(std::string* why) {
  const size_t v = cublasLtGetVersion();
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
    if (why) *why = "no CUDA device could be queried";
    return false;
  }
  if (v < 120900) {
    if (why) *why = fmt::format("cuBLASLt {} has no block-scaled FP8 GEMMs (12.9 or newer)", v);
    return false;
  }
  // cuBLAS documents the 1x128 / 128x128 scale modes for Hopper; newer GPUs' FP8 block
  // scaling is MX (Transformer Engine emulates this recipe with MXFP8 there).
  if (prop.major != 9) {
    if (why)
      *why = fmt::format("{} (compute capability {}.{}): cuBLASLt's 1x128 / 128x128 block "
                         "scales are a Hopper (9.0) feature",
                         prop.name, prop.major, prop.minor);
    return false;
  }
  return true;
}

std::string fp8_gemm_tuning_report() {
  std::lock_guard<std::mutex> lk(cache().mu);
  std::string out;
  for (const auto& l : cache().report) out += l + "\n";
  return out;
}

}  // namespace mcpp::ops::cuda
