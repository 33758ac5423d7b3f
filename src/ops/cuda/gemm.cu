// GEMM and linear layers through cuBLASLt. A, B: f32, bf16 or f16 (one dtype); C: A's
// dtype or f32 (bf16 activations with f32 parameter gradients: dw += dy^T x runs with
// beta = 1 on an f32 output). f32 accumulation always; f32 inputs use full-precision f32
// (set MCPP_ALLOW_TF32=1 for TF32). The bias add runs in the GEMM's epilogue when the
// bias has the output's dtype, else in a small kernel; db += sum_t dy uses the
// deterministic column reduction. The algorithm is chosen once per (shape, dtypes,
// transposes, epilogue, pointer alignments) and cached: cuBLASLt's heuristic ranks its
// candidates by a model, and its first pick is not always the fastest on the real shape,
// so the first call of a key times up to kTuneCandidates of them on the call's own
// operands (into scratch outputs) and keeps the fastest whose output is bitwise equal to
// the heuristic's first pick. The choice can then differ between runs (timing noise) but
// the numbers cannot: candidates that compute anything else (split-K, stream-K orders)
// are never taken. MCPP_GEMM_AUTOTUNE=0 keeps the heuristic's first pick;
// gemm_tuning_report() lists what tuning found; a benchmark may rank the equal candidates
// its own way (set_gemm_tune_ranker: bench/gpu/gemm_sustained.h times them at the
// power-capped clock).
//
// Row-major to cuBLAS's column-major: row-major C[M,N] = op(A)[M,K] op(B)[K,N] is
// column-major C^T[N,M] = op(B)^T op(A)^T, so cuBLASLt gets m = N, n = M, with B's
// memory as its first operand and A's as its second.
#include <cublasLt.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <tuple>
#include <vector>

#include <fmt/format.h>

#include "ops/cuda/common.cuh"
#include "ops/cuda/gemm_tuning.h"
#include "ops/cuda/reduce.cuh"
#include "ops/ops.h"

namespace mcpp::ops::cuda {

namespace {

constexpr size_t kWorkspaceBytes = size_t(32) << 20;

cudaDataType_t cuda_type(DType t, const char* op) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: MCPP_FAIL("{}: dtype {} not supported by the CUDA GEMM (f32, bf16, f16 are)", op,
                       dtype_name(t));
  }
}

cublasLtHandle_t lt_handle() {
  static cublasLtHandle_t h = [] {
    cublasLtHandle_t x;
    CUBLAS_CHECK(cublasLtCreate(&x));
    return x;
  }();
  return h;
}

bool allow_tf32() {
  static bool v = [] {
    const char* e = std::getenv("MCPP_ALLOW_TF32");
    return e && e[0] == '1';
  }();
  return v;
}

uint32_t alignment(const void* p) {
  auto a = reinterpret_cast<uintptr_t>(p);
  uint32_t al = 256;
  while (al > 1 && (a % al) != 0) al >>= 1;
  return al;
}

using AlgoKey = std::tuple<int, int, int64_t, int64_t, int64_t, int, int, int, int, int, uint32_t,
                           uint32_t, uint32_t, uint32_t, int64_t>;

struct AlgoCache {
  std::mutex mu;
  std::map<AlgoKey, cublasLtMatmulAlgo_t> algos;
  std::map<AlgoKey, cublasLtMatmulAlgo_t> classes;  // by shape class (gemm_shape_class)
  std::vector<std::string> report;  // one line per tuned key
};
AlgoCache& algo_cache() {
  static AlgoCache* c = new AlgoCache;
  return *c;
}


// RAII for the cuBLASLt descriptors of one call.

constexpr int kTuneCandidates = 8;
constexpr int kTuneReps = 3;

// MCPP_GEMM_AUTOTUNE: unset or 1 tunes, 0 keeps the heuristic's first pick
// (docs/environment.md). Other values are an error rather than a silent default: the old
// "sustained" ranking is bench_gpu_train --gemm-tune sustained now.
std::atomic<bool>& autotune_flag() {
  static std::atomic<bool> v{[] {
    const char* e = std::getenv("MCPP_GEMM_AUTOTUNE");
    if (!e || !*e || std::string(e) == "1") return true;
    if (std::string(e) == "0") return false;
    throw Error(fmt::format("MCPP_GEMM_AUTOTUNE={} is not 0 or 1", e),
                "unset it (tuning on) or set 0 (cuBLASLt's first pick); the power-capped "
                "'sustained' ranking is a benchmark option now: bench_gpu_train --gemm-tune "
                "sustained");
  }()};
  return v;
}

// A benchmark's ranking of the bitwise-equal candidates (set_gemm_tune_ranker, device.h);
// empty: the short-run times decide. Held by value and copied under its lock, so a ranker
// installed while another thread tunes takes effect from the next key.
struct RankerSlot {
  std::mutex mu;
  GemmTuneRanker ranker;
};
RankerSlot& ranker_slot() {
  static RankerSlot* r = new RankerSlot;
  return *r;
}
GemmTuneRanker current_ranker() {
  RankerSlot& r = ranker_slot();
  std::lock_guard<std::mutex> lk(r.mu);
  return r.ranker;
}

// GELU epilogues: Forward writes gelu(C) to C and the pre-activation to aux; Backward
// multiplies C by gelu'(aux) (aux [M, N] row-major, C's dtype).
enum class Gelu { None, Forward, Backward };

// Times the heuristic's candidates on the call's operands; returns the fastest whose
// output (and aux output, when aux_out is set) is bitwise equal to candidate 0's. Every
// run writes scratch buffers, never C or aux_out, and reads C (c_in) as the real call
// will. `line` gets what was found, for gemm_tuning_report().
cublasLtMatmulAlgo_t tune(const LtDescs& d, const cublasLtMatmulHeuristicResult_t* res,
                          int n_res, float alpha, const void* A, const void* B, float beta,
                          const void* c_in, int64_t out_bytes, void* aux_out,
                          int64_t aux_bytes, Stream& s, std::string& line) {
  cudaStream_t cs = stream_of(s);
  void* ws = workspace(kWorkspaceBytes, s);
  const bool with_aux = aux_out != nullptr;
  const size_t ob = size_t(out_bytes), ab = with_aux ? size_t(aux_bytes) : 1;
  TuningBuffer ref{ob}, out{ob}, flag{sizeof(unsigned)}, ref_aux{ab}, out_aux{ab};
  if (!ref.p || !out.p || !flag.p || !ref_aux.p || !out_aux.p) {
    line = "no device memory to tune; heuristic's first pick";
    return res[0].algo;
  }
  cudaEvent_t e0, e1;
  CUDA_CHECK(cudaEventCreate(&e0));
  CUDA_CHECK(cudaEventCreate(&e1));
  // One run of candidate i into (dst, dst_aux); false when cuBLASLt refuses it.
  auto launch = [&](int i, void* dst, void* dst_aux) {
    if (with_aux &&
        cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &dst_aux,
                                       sizeof(dst_aux)) != CUBLAS_STATUS_SUCCESS)
      return false;
    return cublasLtMatmul(lt_handle(), d.op, &alpha, B, d.a, A, d.b, &beta, c_in, d.c, dst, d.c,
                          &res[i].algo, ws, kWorkspaceBytes, cs) == CUBLAS_STATUS_SUCCESS;
  };
  auto time_ms = [&](int i) {
    float best = 1e30f;
    for (int r = 0; r < kTuneReps; ++r) {
      CUDA_CHECK(cudaEventRecord(e0, cs));
      if (!launch(i, out.p, out_aux.p)) return -1.f;
      CUDA_CHECK(cudaEventRecord(e1, cs));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      best = std::min(best, ms);
    }
    return best;
  };
  auto differs = [&](const void* a, const void* b, int64_t bytes) {
    return device_bytes_differ(a, b, bytes, static_cast<unsigned*>(flag.p), cs);
  };
  int best = 0;
  float t0 = -1.f;
  if (launch(0, ref.p, ref_aux.p)) t0 = time_ms(0);
  float best_ms = t0;
  std::vector<std::pair<int, float>> equal_ms;  // (candidate, short-run ms)
  if (t0 > 0) {
    equal_ms.push_back({0, t0});
    for (int i = 1; i < n_res; ++i) {
      if (res[i].state != CUBLAS_STATUS_SUCCESS || !launch(i, out.p, out_aux.p)) continue;
      if (differs(ref.p, out.p, out_bytes) ||
          (with_aux && differs(ref_aux.p, out_aux.p, aux_bytes)))
        continue;
      const float ms = time_ms(i);
      if (ms <= 0) continue;
      equal_ms.push_back({i, ms});
      if (ms < best_ms) best = i, best_ms = ms;
    }
  }
  const int equal = int(std::max<size_t>(equal_ms.size(), 1));
  std::string detail;
  std::string label;
  if (const GemmTuneRanker ranker = current_ranker(); ranker && equal_ms.size() > 1) {
    GemmTuneCandidates c;
    for (const auto& [i, ms] : equal_ms)
      c.names.push_back(fmt::format("#{} {}", i, algo_config(res[i].algo))),
          c.short_ms.push_back(ms);
    // reps back-to-back calls of candidate j into the scratch outputs; ms per call.
    c.run = [&](size_t j, int reps) {
      CUDA_CHECK(cudaEventRecord(e0, cs));
      for (int r = 0; r < reps; ++r) launch(equal_ms.at(j).first, out.p, out_aux.p);
      CUDA_CHECK(cudaEventRecord(e1, cs));
      CUDA_CHECK(cudaEventSynchronize(e1));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
      return ms / float(std::max(reps, 1));
    };
    const GemmTuneChoice ch = ranker(c);
    MCPP_CHECK(ch.index < equal_ms.size(), "GEMM tune ranker chose candidate {} of {}", ch.index,
               equal_ms.size());
    best = equal_ms[ch.index].first, best_ms = ch.ms;
    label = " " + ch.label, detail = ch.detail;
  }
  if (with_aux)  // the real call's aux pointer back
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &aux_out, sizeof(aux_out)));
  CUDA_CHECK(cudaEventDestroy(e0));
  CUDA_CHECK(cudaEventDestroy(e1));
  line = fmt::format("{} candidates, {} bitwise equal to the first; first {:.3f} ms, chosen #{} "
                     "{:.3f} ms{} ({}){}",
                     n_res, equal, t0, best, best_ms, label,
                     algo_config(res[best].algo), detail);
  return res[best].algo;
}

// Row-major C[M,N] = alpha op(A) op(B) + beta C (+ bias[N] when bias != null), then the
// GELU epilogue `gelu` with aux. batch > 1: that many such products of consecutive
// matrices of A, B and C (strided batches; no bias or aux then).
void lt_matmul(bool ta, bool tb, int64_t M, int64_t N, int64_t K, float alpha, const void* A,
               DType at, const void* B, DType bt, float beta, void* C, DType ct,
               const void* bias, Stream& s, const char* op, Gelu gelu = Gelu::None,
               void* aux = nullptr, const void* c_in = nullptr, int64_t batch = 1) {
  // c_in: cuBLASLt's C, read with beta, when it is not the output D (= C otherwise).
  const void* cin = c_in ? c_in : C;
  MCPP_CHECK(at == bt, "{}: A is {} but B is {}; GEMM operands must share a dtype", op,
             dtype_name(at), dtype_name(bt));
  MCPP_CHECK(ct == at || ct == DType::F32, "{}: output {} for {} inputs; {} or f32 expected", op,
             dtype_name(ct), dtype_name(at), dtype_name(at));
  if (M == 0 || N == 0 || batch == 0) return;
  MCPP_CHECK(batch == 1 || (!bias && gelu == Gelu::None), "{}: a batched GEMM has no epilogue",
             op);
  cudaDataType_t in_t = cuda_type(at, op), out_t = cuda_type(ct, op);
  cublasComputeType_t compute = (at == DType::F32 && allow_tf32())
                                    ? CUBLAS_COMPUTE_32F_FAST_TF32
                                    : CUBLAS_COMPUTE_32F;
  LtDescs d;
  CUBLAS_CHECK(cublasLtMatmulDescCreate(&d.op, compute, CUDA_R_32F));
  cublasOperation_t opa = tb ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS's A = our B
  cublasOperation_t opb = ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // cuBLAS's B = our A
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSA, &opa,
                                              sizeof(opa)));
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_TRANSB, &opb,
                                              sizeof(opb)));
  cublasLtEpilogue_t epi = bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
  if (gelu == Gelu::Forward) epi = bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  if (gelu == Gelu::Backward) {
    MCPP_CHECK(!bias, "{}: no bias with the GELU-gradient epilogue", op);
    epi = CUBLASLT_EPILOGUE_DGELU;
  }
  CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi,
                                              sizeof(epi)));
  if (gelu != Gelu::None) {
    // aux is row-major [M, N] = column-major [N, M] with leading dimension N, like C.
    int64_t ld = N;
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER,
                                                &aux, sizeof(aux)));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &ld,
                                                sizeof(ld)));
  }
  if (bias)
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(d.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias,
                                                sizeof(bias)));
  // Stored (column-major) shapes of cuBLAS's A (= our B), B (= our A), C.
  uint64_t a_rows = tb ? K : N, a_cols = tb ? N : K;
  uint64_t b_rows = ta ? M : K, b_cols = ta ? K : M;
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.a, in_t, a_rows, a_cols, int64_t(a_rows)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.b, in_t, b_rows, b_cols, int64_t(b_rows)));
  CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&d.c, out_t, N, M, N));
  // Strided batches: each operand's matrices one after another. Every matrix's start, not
  // only the first's, bounds the alignment.
  uint32_t al_stride = 256;
  if (batch > 1) {
    const int32_t n = int32_t(batch);
    MCPP_CHECK(batch <= INT32_MAX, "{}: a batch of {} matrices is too many for cuBLASLt", op,
               batch);
    auto set_batch = [&](cublasLtMatrixLayout_t l, int64_t stride, DType t) {
      CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n,
                                                    sizeof(n)));
      CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(
          l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
      const auto bytes = uintptr_t(stride) * dtype_size(t);
      al_stride = std::min(al_stride, alignment(reinterpret_cast<const void*>(bytes)));
    };
    set_batch(d.a, N * K, bt);
    set_batch(d.b, M * K, at);
    set_batch(d.c, M * N, ct);
  }

  uint32_t al_a = std::min(alignment(B), al_stride), al_b = std::min(alignment(A), al_stride),
           al_c = std::min({alignment(C), alignment(cin), al_stride}),
           al_bias = std::min(bias ? alignment(bias) : 256u, aux ? alignment(aux) : 256u);
  AlgoKey key{ta, tb, M, N, K, int(at), int(ct), int(epi), int(compute), beta != 0.f, al_a,
              al_b, al_c, al_bias, batch};
  cublasLtMatmulAlgo_t algo;
  bool found = false;
  {
    AlgoCache& cache = algo_cache();
    std::lock_guard<std::mutex> lk(cache.mu);
    auto it = cache.algos.find(key);
    if (it != cache.algos.end()) algo = it->second, found = true;
  }
  AlgoKey class_key = key;
  std::get<2>(class_key) = gemm_shape_class(M), std::get<4>(class_key) = gemm_shape_class(K);
  if (!found) {
    AlgoCache& cache = algo_cache();
    std::lock_guard<std::mutex> lk(cache.mu);
    auto it = cache.classes.find(class_key);
    cublasLtMatmulHeuristicResult_t chk{};
    if (it != cache.classes.end() &&
        cublasLtMatmulAlgoCheck(lt_handle(), d.op, d.a, d.b, d.c, d.c, &it->second, &chk) ==
            CUBLAS_STATUS_SUCCESS &&
        chk.workspaceSize <= kWorkspaceBytes)
      algo = it->second, found = true, cache.algos[key] = algo;
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
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(lt_handle(), d.op, d.a, d.b, d.c, d.c,
                                                       pref, gemm_autotune_enabled() ? kTuneCandidates
                                                                                : 1,
                                                       res, &n_res);
    cublasLtMatmulPreferenceDestroy(pref);
    MCPP_CHECK(st == CUBLAS_STATUS_SUCCESS && n_res > 0,
               "{}: cuBLASLt has no algorithm for [{}x{}]x[{}x{}] {}{} -> {} ({})", op, M, K, K,
               N, dtype_name(at), bias ? " with bias" : "", dtype_name(ct),
               cublasGetStatusString(st));
    algo = res[0].algo;
    if (n_res > 1) {
      std::string line;
      algo = tune(d, res, n_res, alpha, A, B, beta, cin,
                  batch * M * N * int64_t(dtype_size(ct)),
                  gelu == Gelu::Forward ? aux : nullptr, M * N * int64_t(dtype_size(ct)), s,
                  line);
      line = fmt::format("{} {}[{}x{}]x[{}x{}]{}{} {}: {}", op,
                         batch > 1 ? fmt::format("{} x ", batch) : "", M, K, K, N,
                         ta ? " tA" : "", tb ? " tB" : "", dtype_name(ct), line);
      std::lock_guard<std::mutex> lk(algo_cache().mu);
      algo_cache().report.push_back(line);
    }
    AlgoCache& cache = algo_cache();
    std::lock_guard<std::mutex> lk(cache.mu);
    cache.algos[key] = algo;
    cache.classes.emplace(class_key, algo);
  }
  void* ws = workspace(kWorkspaceBytes, s);
  CUBLAS_CHECK(cublasLtMatmul(lt_handle(), d.op, &alpha, B, d.a, A, d.b, &beta, cin, d.c, C, d.c,
                              &algo, ws, kWorkspaceBytes, stream_of(s)));
}

// The GELU epilogues need aux's leading dimension (the output width) a multiple of 8
// and 16-byte aligned matrices; MCPP_GEMM_GELU_EPILOGUE=0 turns them off (then the
// activation runs as its own kernel).
bool gelu_epilogue_ok(int64_t N, const void* c, const void* aux) {
  static bool enabled = [] {
    const char* e = std::getenv("MCPP_GEMM_GELU_EPILOGUE");
    return !(e && e[0] == '0');
  }();
  return enabled && N % 8 == 0 && alignment(c) >= 16 && alignment(aux) >= 16;
}

// y[T, N] += b[N] (b of any float dtype), for biases whose dtype the epilogue can't take.
template <typename T, typename TB>
static __global__ void add_bias_kernel(T* y, const TB* __restrict__ b, int64_t rows, int64_t N) {
  int64_t n = rows * N;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x)
    y[i] = from_f<T>(to_f(y[i]) + to_f(b[i % N]));
}

}  // namespace

bool gemm_autotune_enabled() { return autotune_flag().load(); }

namespace {
// gemm and gemm_add: C = alpha op(A) op(B) + beta c_in (c_in: C itself when null).
void gemm_impl(bool trans_a, bool trans_b, double alpha, const Tensor& A, const Tensor& B,
               double beta, const Tensor* c_in, Tensor& C, Stream& s, const char* op) {
  check_cuda(A, op, "A");
  check_cuda(B, op, "B");
  check_cuda(C, op, "C");
  const int d = int(A.dim());
  MCPP_CHECK((d == 2 || d == 3) && B.dim() == d && C.dim() == d,
             "{}: 2-D operands (or 3-D: a batch) expected, got {}, {}, {}", op, A.str(), B.str(),
             C.str());
  const int64_t batch = d == 3 ? A.size(0) : 1;
  MCPP_CHECK(d == 2 || (B.size(0) == batch && C.size(0) == batch),
             "{}: batch sizes differ: {}, {}, {}", op, A.str(), B.str(), C.str());
  int64_t M = trans_a ? A.size(-1) : A.size(-2), K = trans_a ? A.size(-2) : A.size(-1);
  int64_t Kb = trans_b ? B.size(-1) : B.size(-2), N = trans_b ? B.size(-2) : B.size(-1);
  MCPP_CHECK(K == Kb && C.size(-2) == M && C.size(-1) == N,
             "{}: shapes do not match: op(A) [{}, {}], op(B) [{}, {}], C {}", op, M, K, Kb, N,
             C.str());
  if (c_in) {
    check_cuda(*c_in, op, "C");
    MCPP_CHECK(c_in->shape() == C.shape() && c_in->dtype() == C.dtype(),
               "{}: C {} and D {} differ in shape or dtype", op, c_in->str(), C.str());
    MCPP_CHECK(c_in->raw() != C.raw() || C.numel() == 0, "{}: C and D are one buffer; use gemm",
               op);
  }
  if (K == 0) {
    if (c_in) copy(*c_in, C, s);
    scale(C, beta, s);
    return;
  }
  lt_matmul(trans_a, trans_b, M, N, K, float(alpha), A.raw(), A.dtype(), B.raw(), B.dtype(),
            float(beta), C.raw(), C.dtype(), nullptr, s, op, Gelu::None, nullptr,
            c_in ? c_in->raw() : nullptr, batch);
}
}  // namespace

void gemm(bool trans_a, bool trans_b, double alpha, const Tensor& A, const Tensor& B,
          double beta, Tensor& C, Stream& s) {
  gemm_impl(trans_a, trans_b, alpha, A, B, beta, nullptr, C, s, "gemm");
}

void gemm_add(bool trans_a, bool trans_b, double alpha, const Tensor& A, const Tensor& B,
              double beta, const Tensor& C, Tensor& D, Stream& s) {
  gemm_impl(trans_a, trans_b, alpha, A, B, beta, &C, D, s, "gemm_add");
}

namespace {
// The checks every y = x w^T (+ b) op shares; its GEMM's sizes.
struct LinearDims {
  int64_t rows, out, in;
};
LinearDims check_linear(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                        const char* op) {
  check_cuda(x, op, "x");
  check_cuda(w, op, "w");
  check_cuda(y, op, "y");
  MCPP_CHECK(w.dim() == 2, "{}: w is {}; [out, in] expected", op, w.str());
  const int64_t out = w.size(0), in = w.size(1);
  MCPP_CHECK(x.size(-1) == in, "{}: x {} does not match w {} (in = {})", op, x.str(), w.str(),
             in);
  const int64_t rows = x.numel() / std::max<int64_t>(in, 1);
  check_numel(y, rows * out, op, "y");
  if (b.defined()) {
    check_cuda(b, op, "b");
    check_numel(b, out, op, "b");
  }
  return {rows, out, in};
}
}  // namespace

void linear_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& y, Stream& s) {
  const char* op = "linear_forward";
  const auto [rows, out, in] = check_linear(x, w, b, y, op);
  bool fuse_bias = b.defined() && b.dtype() == y.dtype();
  lt_matmul(false, true, rows, out, in, 1.f, x.raw(), x.dtype(), w.raw(), w.dtype(), 0.f, y.raw(),
            y.dtype(), fuse_bias ? b.raw() : nullptr, s, op);
  if (b.defined() && !fuse_bias && rows * out > 0) {
    MCPP_DISPATCH_ACT(y.dtype(), op, MCPP_DISPATCH_ACT2(b.dtype(), op, {
      add_bias_kernel<T, T2><<<grid_for(rows * out, 256), 256, 0, stream_of(s)>>>(
          static_cast<T*>(y.raw()), static_cast<const T2*>(b.raw()), rows, out);
    }));
    MCPP_LAUNCH_CHECK();
  }
}

void linear_backward(const Tensor& dy, const Tensor& x, const Tensor& w, Tensor& dx,
                     bool accumulate_dx, Tensor& dw, Tensor& db, Stream& s) {
  const char* op = "linear_backward";
  check_cuda(dy, op, "dy");
  check_cuda(x, op, "x");
  check_cuda(w, op, "w");
  int64_t out = w.size(0), in = w.size(1);
  int64_t rows = x.numel() / std::max<int64_t>(in, 1);
  check_numel(dy, rows * out, op, "dy");
  if (dx.defined()) {
    check_cuda(dx, op, "dx");
    check_numel(dx, rows * in, op, "dx");
    // dx[T, in] (+)= dy[T, out] @ w[out, in]
    lt_matmul(false, false, rows, in, out, 1.f, dy.raw(), dy.dtype(), w.raw(), w.dtype(),
              accumulate_dx ? 1.f : 0.f, dx.raw(), dx.dtype(), nullptr, s, op);
  }
  if (dw.defined()) {
    check_cuda(dw, op, "dw");
    check_numel(dw, out * in, op, "dw");
    // dw[out, in] += dy[T, out]^T @ x[T, in]
    lt_matmul(true, false, out, in, rows, 1.f, dy.raw(), dy.dtype(), x.raw(), x.dtype(), 1.f,
              dw.raw(), dw.dtype(), nullptr, s, op);
  }
  if (db.defined()) {
    check_f32(db, op, "db");
    check_numel(db, out, op, "db");
    MCPP_DISPATCH_ACT(dy.dtype(), op, {
      ColSum<T> f{static_cast<const T*>(dy.raw()), out};
      column_reduce_add<1>(f, rows, out, static_cast<float*>(db.raw()), nullptr, stream_of(s));
    });
  }
}

void linear_residual_forward(const Tensor& x, const Tensor& w, const Tensor& b,
                             const Tensor& residual, Tensor& y, Stream& s) {
  const char* op = "linear_residual_forward";
  const auto [rows, out, in] = check_linear(x, w, b, y, op);
  check_cuda(residual, op, "residual");
  check_numel(residual, rows * out, op, "residual");
  MCPP_CHECK(residual.dtype() == y.dtype(), "{}: residual {} and y {} must share a dtype", op,
             residual.str(), y.str());
  const bool fuse_bias = !b.defined() || b.dtype() == y.dtype();
  if (!fuse_bias) {  // a bias of another dtype: the plain op and the add in turn
    Tensor t = Tensor::empty(y.shape(), y.dtype(), Device::CUDA);
    linear_forward(x, w, b, t, s);
    add(residual.view(y.shape()), t, y, s);
    return;
  }
  lt_matmul(false, true, rows, out, in, 1.f, x.raw(), x.dtype(), w.raw(), w.dtype(), 1.f, y.raw(),
            y.dtype(), b.defined() ? b.raw() : nullptr, s, op, Gelu::None, nullptr,
            residual.raw());
}

void linear_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& b, Tensor& pre,
                         Tensor& y, Stream& s) {
  const char* op = "linear_gelu_forward";
  check_cuda(pre, op, "pre");
  check_cuda(y, op, "y");
  MCPP_CHECK(pre.dtype() == y.dtype() && pre.numel() == y.numel(),
             "{}: pre {} and y {} must match", op, pre.str(), y.str());
  const bool bias_ok = !b.defined() || b.dtype() == y.dtype();
  if (!bias_ok || !gelu_epilogue_ok(w.size(0), y.raw(), pre.raw())) {
    linear_forward(x, w, b, pre, s);
    gelu_forward(pre, y, s);
    return;
  }
  const auto [rows, out, in] = check_linear(x, w, b, y, op);
  lt_matmul(false, true, rows, out, in, 1.f, x.raw(), x.dtype(), w.raw(), w.dtype(), 0.f, y.raw(),
            y.dtype(), b.defined() ? b.raw() : nullptr, s, op, Gelu::Forward, pre.raw());
}

void linear_gelu_backward(const Tensor& dy, const Tensor& act, const Tensor& w,
                          const Tensor& pre, Tensor& dpre, Tensor& dw, Tensor& db, Stream& s) {
  const char* op = "linear_gelu_backward";
  check_cuda(pre, op, "pre");
  check_cuda(dpre, op, "dpre");
  MCPP_CHECK(pre.dtype() == dpre.dtype() && pre.numel() == dpre.numel(),
             "{}: pre {} and dpre {} must match", op, pre.str(), dpre.str());
  if (!gelu_epilogue_ok(w.size(1), dpre.raw(), pre.raw())) {
    linear_backward(dy, act, w, dpre, false, dw, db, s);
    gelu_backward(dpre, pre, dpre, s);
    return;
  }
  // dw and db as linear_backward does them; dpre from one GEMM with the DGELU epilogue.
  Tensor none;
  linear_backward(dy, act, w, none, false, dw, db, s);
  int64_t out = w.size(0), in = w.size(1), rows = act.numel() / std::max<int64_t>(in, 1);
  check_numel(dpre, rows * in, op, "dpre");
  lt_matmul(false, false, rows, in, out, 1.f, dy.raw(), dy.dtype(), w.raw(), w.dtype(), 0.f,
            dpre.raw(), dpre.dtype(), nullptr, s, op, Gelu::Backward, const_cast<void*>(pre.raw()));
}

bool set_gemm_autotune(bool on) {
  AlgoCache& cache = algo_cache();
  std::lock_guard<std::mutex> lk(cache.mu);
  cache.algos.clear();
  cache.classes.clear();
  cache.report.clear();
  return autotune_flag().exchange(on);
}

GemmTuneRanker set_gemm_tune_ranker(GemmTuneRanker r) {
  {
    AlgoCache& cache = algo_cache();
    std::lock_guard<std::mutex> lk(cache.mu);
    cache.algos.clear();
  cache.classes.clear();
    cache.report.clear();
  }
  RankerSlot& slot = ranker_slot();
  std::lock_guard<std::mutex> lk(slot.mu);
  std::swap(slot.ranker, r);
  return r;
}

std::string gemm_tuning_report() {
  AlgoCache& cache = algo_cache();
  std::lock_guard<std::mutex> lk(cache.mu);
  std::string r;
  for (const auto& l : cache.report) r += l + "\n";
  return r;
}

}  // namespace mcpp::ops::cuda
