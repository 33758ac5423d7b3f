// The MoE expert GEMMs three ways, at the shapes of bench_gpu_moe's two models: one
// cuBLASLt call per expert (on 1 or 4 streams, as model/moe/experts.cpp runs them), one
// pointer-array batched cuBLASLt call over fixed-size row chunks of every expert (here an
// expert's last chunk overlaps the one before, so no padding and no partial chunk; rows
// written twice must then get the same bits from both chunks, which the column's count of
// elements unlike the loop's checks), and, for balanced rows only, one strided batched call
// over the experts (the bound a grouped GEMM could reach). Forward (y = x w^T), data
// gradient (dx = dy w) and weight gradient (dw += dy^T x into f32, beta 1). Each way's
// algorithm is the fastest of cuBLASLt's candidates that give its first pick's bits, as
// ops/cuda/gemm.cu tunes. One table: milliseconds a step's worth of one GEMM kind (median
// of --reps rounds of 10 calls) and TFLOP/s. bench/RESULTS.md has its runs.
//
// Standalone, one nvcc call (no library, so it is built on the CPU machine and carried):
//   nvcc -std=c++17 -arch=sm_90a -O3 -o bench_grouped_gemm bench/gpu/bench_grouped_gemm.cu \
//     -lcublasLt
// Usage: bench_grouped_gemm [--reps N] [--chunk ROWS] [--wchunk ROWS] [--skew F]
//                           [--only Fine|Mixtral]
// The weight gradient's pointer-array way runs in rounds of --wchunk rows (column 3).
// --skew F: expert e gets mean * (1 + F sin(2.39 e)) rows (0: balanced; default 0.2).
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace {

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s\n", __FILE__, __LINE__, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)
#define LT(x)                                                                      \
  do {                                                                             \
    cublasStatus_t s_ = (x);                                                       \
    if (s_ != CUBLAS_STATUS_SUCCESS) {                                             \
      std::fprintf(stderr, "%s:%d cublasLt status %d\n", __FILE__, __LINE__, int(s_)); \
      std::exit(1);                                                                \
    }                                                                              \
  } while (0)

cublasLtHandle_t g_lt;
void* g_ws[5];  // one a stream: concurrent GEMMs must not share one (split-K, stream-K state)
constexpr size_t kWs = size_t(32) << 20;

__global__ void fill_kernel(__nv_bfloat16* p, size_t n, uint32_t seed) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed;
    h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
    p[i] = __float2bfloat16((float(h & 0xffff) / 65536.f - 0.5f) * 0.1f);
  }
}

__global__ void diff_kernel(const uint16_t* a, const uint16_t* b, size_t n,
                            unsigned long long* out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    if (a[i] != b[i]) atomicAdd(out, 1ull);
}

// How many bf16 elements of a and b differ in their bits.
unsigned long long count_diff(const void* a, const void* b, size_t n) {
  unsigned long long* d;
  CK(cudaMalloc(&d, 8));
  CK(cudaMemset(d, 0, 8));
  diff_kernel<<<1024, 256>>>(static_cast<const uint16_t*>(a), static_cast<const uint16_t*>(b), n,
                             d);
  unsigned long long h = 0;
  CK(cudaMemcpy(&h, d, 8, cudaMemcpyDeviceToHost));
  CK(cudaFree(d));
  return h;
}

// Rows [src_off[e], src_off[e] + n[e]) of src into block e of dst (C rows each), the rest of
// the block zero: the weight gradient's last partial chunk of each expert, zero-padded.
__global__ void gather_tail_kernel(const __nv_bfloat16* src, const int64_t* src_off,
                                   const int64_t* n, __nv_bfloat16* dst, int64_t C,
                                   int64_t width) {
  const int e = blockIdx.y;
  const int64_t total = C * width;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / width;
    dst[e * total + i] = r < n[e] ? src[(src_off[e] + r) * width + i % width]
                                  : __float2bfloat16(0.f);
  }
}

__global__ void max_diff_kernel(const float* a, const float* b, size_t n, float* out) {
  float d = 0, m = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x)
    d = fmaxf(d, fabsf(a[i] - b[i])), m = fmaxf(m, fabsf(a[i]));
  atomicMax(reinterpret_cast<int*>(out), __float_as_int(d));  // non-negative floats
  atomicMax(reinterpret_cast<int*>(out) + 1, __float_as_int(m));
}

// max |a - b| / max |a| over n floats.
float rel_diff(const float* a, const float* b, size_t n) {
  float* d;
  CK(cudaMalloc(&d, 8));
  CK(cudaMemset(d, 0, 8));
  max_diff_kernel<<<1024, 256>>>(a, b, n, d);
  float h[2];
  CK(cudaMemcpy(h, d, 8, cudaMemcpyDeviceToHost));
  CK(cudaFree(d));
  return h[1] > 0 ? h[0] / h[1] : h[0];
}

__nv_bfloat16* rand_bf16(size_t n, uint32_t seed) {
  __nv_bfloat16* p;
  CK(cudaMalloc(&p, n * 2));
  fill_kernel<<<1024, 256>>>(p, n, seed);
  return p;
}

// One column-major GEMM D = alpha op(A) op(B) + beta C (cuBLASLt's terms).
struct Shape {
  int64_t m, n, k;
  cublasOperation_t ta, tb;
  int64_t lda, ldb, ldc;
  bool f32_out;  // D in f32, beta 1 (the weight gradient into the main gradient)
};

struct Plan {
  cublasLtMatmulDesc_t op{};
  cublasLtMatrixLayout_t a{}, b{}, c{};
  std::vector<cublasLtMatmulAlgo_t> algos;
  int best = 0;
};

void set_batch(cublasLtMatrixLayout_t l, int count, bool ptr, int64_t stride) {
  if (count <= 1 && !ptr) return;  // a pointer array of one is still read as one
  int32_t c = count;
  LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &c, sizeof c));
  if (ptr) {
    int32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
    LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode,
                                        sizeof mode));
  } else {
    LT(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET,
                                        &stride, sizeof stride));
  }
}

// batch: 1 (one GEMM), or a count with pointer arrays (ptr) or strides {sa, sb, sc}.
Plan make_plan(const Shape& s, int batch, bool ptr, int64_t sa = 0, int64_t sb = 0,
               int64_t sc = 0) {
  Plan p;
  LT(cublasLtMatmulDescCreate(&p.op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  LT(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSA, &s.ta, sizeof s.ta));
  LT(cublasLtMatmulDescSetAttribute(p.op, CUBLASLT_MATMUL_DESC_TRANSB, &s.tb, sizeof s.tb));
  const int64_t ar = s.ta == CUBLAS_OP_N ? s.m : s.k, ac = s.ta == CUBLAS_OP_N ? s.k : s.m;
  const int64_t br = s.tb == CUBLAS_OP_N ? s.k : s.n, bc = s.tb == CUBLAS_OP_N ? s.n : s.k;
  LT(cublasLtMatrixLayoutCreate(&p.a, CUDA_R_16BF, ar, ac, s.lda));
  LT(cublasLtMatrixLayoutCreate(&p.b, CUDA_R_16BF, br, bc, s.ldb));
  LT(cublasLtMatrixLayoutCreate(&p.c, s.f32_out ? CUDA_R_32F : CUDA_R_16BF, s.m, s.n, s.ldc));
  set_batch(p.a, batch, ptr, sa);
  set_batch(p.b, batch, ptr, sb);
  set_batch(p.c, batch, ptr, sc);
  cublasLtMatmulPreference_t pref;
  LT(cublasLtMatmulPreferenceCreate(&pref));
  LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &kWs,
                                          sizeof kWs));
  cublasLtMatmulHeuristicResult_t res[8];
  int got = 0;
  LT(cublasLtMatmulAlgoGetHeuristic(g_lt, p.op, p.a, p.b, p.c, p.c, pref, 8, res, &got));
  for (int i = 0; i < got; ++i) p.algos.push_back(res[i].algo);
  cublasLtMatmulPreferenceDestroy(pref);
  if (p.algos.empty()) {
    std::fprintf(stderr, "no cuBLASLt algorithm for m %ld n %ld k %ld batch %d ptr %d\n",
                 long(s.m), long(s.n), long(s.k), batch, int(ptr));
    std::exit(1);
  }
  return p;
}

void launch(const Plan& p, int algo, const Shape& s, const void* A, const void* B, void* C,
            cudaStream_t st, int ws = 0) {
  const float alpha = 1.f, beta = s.f32_out ? 1.f : 0.f;
  LT(cublasLtMatmul(g_lt, p.op, &alpha, A, p.a, B, p.b, &beta, C, p.c, C, p.c,
                    &p.algos[size_t(algo)], g_ws[ws], kWs, st));
}

template <class F>
float time_ms(cudaStream_t st, int reps, const F& body) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<float> v;
  for (int r = 0; r < reps; ++r) {
    CK(cudaEventRecord(e0, st));
    for (int i = 0; i < 10; ++i) body();
    CK(cudaEventRecord(e1, st));
    CK(cudaEventSynchronize(e1));
    float ms;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    v.push_back(ms / 10);
  }
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The fastest of a plan's candidates for body(algo), chosen on 3 short rounds. With out
// (bf16 outputs, n elements), only candidates that write the bits of the heuristic's first
// pick, as ops/cuda/gemm.cu's tuning allows (no split-K or stream-K orders).
template <class F>
int pick(Plan& p, cudaStream_t st, const F& body, const void* out = nullptr, size_t n = 0) {
  float best = 1e30f;
  void* ref = nullptr;
  for (int a = 0; a < int(p.algos.size()); ++a) {
    body(a);
    CK(cudaStreamSynchronize(st));
    if (out && a == 0) {
      CK(cudaMalloc(&ref, n * 2));
      CK(cudaMemcpy(ref, out, n * 2, cudaMemcpyDeviceToDevice));
    } else if (out && count_diff(out, ref, n) != 0) {
      continue;
    }
    const float t = time_ms(st, 3, [&] { body(a); });
    if (t < best) best = t, p.best = a;
  }
  if (ref) CK(cudaFree(ref));
  return p.best;
}

struct Model {
  const char* name;
  int experts;
  int64_t tokens_x_topk, hidden, ffn;  // ffn: fc2's input width; fc1's output 2 * ffn
};

std::vector<int64_t> row_counts(const Model& md, double skew) {
  const int E = md.experts;
  const double mean = double(md.tokens_x_topk) / E;
  std::vector<int64_t> c(size_t(E), 0);
  int64_t sum = 0;
  for (int e = 0; e < E; ++e)
    sum += c[size_t(e)] = int64_t(std::llround(mean * (1 + skew * std::sin(2.39 * e))));
  c[0] += md.tokens_x_topk - sum;  // the total as the model's
  return c;
}

struct Kind {
  const char* name;
  int64_t out, in;  // the linear layer: w [out, in]
  int gemm;         // 0 forward, 1 data gradient, 2 weight gradient
};

// Column-major shapes of one expert's GEMM with n rows (gemm.cu's row-major mapping).
Shape shape_of(const Kind& k, int64_t rows) {
  switch (k.gemm) {
    case 0:  // y^T[out, rows] = w^T(T of [in, out]) x^T[in, rows]
      return {k.out, rows, k.in, CUBLAS_OP_T, CUBLAS_OP_N, k.in, k.in, k.out, false};
    case 1:  // dx^T[in, rows] = w[in, out] dy^T[out, rows]
      return {k.in, rows, k.out, CUBLAS_OP_N, CUBLAS_OP_N, k.in, k.out, k.in, false};
    default:  // dw^T[in, out] += x^T[in, rows] (dy^T[out, rows])^T
      return {k.in, k.out, rows, CUBLAS_OP_N, CUBLAS_OP_T, k.in, k.out, k.in, true};
  }
}

void run_model(const Model& md, int reps, int64_t chunk, int64_t wchunk, double skew) {
  const std::vector<int64_t> counts = row_counts(md, skew);
  const int E = md.experts;
  const int64_t N = md.tokens_x_topk, H = md.hidden, I = md.ffn;
  std::vector<int64_t> off(size_t(E) + 1, 0);
  for (int e = 0; e < E; ++e) off[size_t(e) + 1] = off[size_t(e)] + counts[size_t(e)];
  const Kind kinds[] = {{"fc1 fwd", 2 * I, H, 0}, {"fc1 dgrad", 2 * I, H, 1},
                        {"fc1 wgrad", 2 * I, H, 2}, {"fc2 fwd", H, I, 0},
                        {"fc2 dgrad", H, I, 1},     {"fc2 wgrad", H, I, 2}};
  const int64_t maxw = 2 * I > H ? 2 * I : H;
  __nv_bfloat16* x = rand_bf16(size_t(N * maxw), 1);  // the GEMM's row input
  __nv_bfloat16* y = rand_bf16(size_t(N * maxw), 2);  // its row output (or dy)
  __nv_bfloat16* w = rand_bf16(size_t(E * 2 * I * H), 3);
  float* dw;
  CK(cudaMalloc(&dw, size_t(E * 2 * I * H) * 4));
  CK(cudaMemset(dw, 0, size_t(E * 2 * I * H) * 4));
  cudaStream_t st, side[4];
  CK(cudaStreamCreate(&st));
  for (auto& s : side) CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t fork, join[4];
  CK(cudaEventCreateWithFlags(&fork, cudaEventDisableTiming));
  for (auto& j : join) CK(cudaEventCreateWithFlags(&j, cudaEventDisableTiming));
  int64_t mn = counts[0], mx = counts[0];
  for (int64_t c : counts) mn = std::min(mn, c), mx = std::max(mx, c);
  std::printf("\n%s: %d experts, %ld rows (%ld..%ld an expert), hidden %ld, ffn %ld, chunk %ld\n",
              md.name, E, long(N), long(mn), long(mx), long(H), long(I), long(chunk));
  std::printf("| GEMM | loop, 1 stream | loop, 4 streams | pointer array, chunks (heuristic's first; elements != loop) | "
              "strided, balanced | pointer array / loop-4 |\n|---|---:|---:|---:|---:|---:|\n");
  for (const Kind& k : kinds) {
    const int64_t in_w = k.gemm == 1 ? k.out : k.in;  // the row input's width
    const int64_t out_w = k.gemm == 1 ? k.in : k.out;
    const double flop = 2.0 * double(N) * double(k.out) * double(k.in);
    auto expert_ptrs = [&](int e, const void*& A, const void*& B, void*& C) {
      const __nv_bfloat16* xe = x + off[size_t(e)] * in_w;
      __nv_bfloat16* ye = y + off[size_t(e)] * out_w;
      const __nv_bfloat16* we = w + size_t(e) * size_t(k.out * k.in);
      if (k.gemm == 2) {  // A = x rows [in wide], B = dy rows [out wide], C = dw
        A = x + off[size_t(e)] * k.in, B = y + off[size_t(e)] * k.out;
        C = dw + size_t(e) * size_t(k.out * k.in);
      } else {
        A = we, B = xe, C = ye;
      }
    };
    // 1) the per-expert loop, each expert's shape tuned on its own
    std::vector<Plan> plans;
    for (int e = 0; e < E; ++e) {
      plans.push_back(make_plan(shape_of(k, counts[size_t(e)]), 1, false));
      const void *A, *B;
      void* C;
      expert_ptrs(e, A, B, C);
      pick(
          plans.back(), st,
          [&](int a) { launch(plans.back(), a, shape_of(k, counts[size_t(e)]), A, B, C, st); },
          k.gemm == 2 ? nullptr : C, size_t(counts[size_t(e)] * out_w));
    }
    auto loop = [&](int ns) {
      if (ns > 1) {
        CK(cudaEventRecord(fork, st));
        for (int i = 0; i < ns; ++i) CK(cudaStreamWaitEvent(side[i], fork));
      }
      for (int e = 0; e < E; ++e) {
        const void *A, *B;
        void* C;
        expert_ptrs(e, A, B, C);
        launch(plans[size_t(e)], plans[size_t(e)].best, shape_of(k, counts[size_t(e)]), A, B, C,
               ns > 1 ? side[e % ns] : st, ns > 1 ? 1 + e % ns : 0);
      }
      if (ns > 1)
        for (int i = 0; i < ns; ++i) {
          CK(cudaEventRecord(join[i], side[i]));
          CK(cudaStreamWaitEvent(st, join[i]));
        }
    };
    const float t1 = time_ms(st, reps, [&] { loop(1); });
    __nv_bfloat16* yref = nullptr;  // the loop's output, to compare the pointer array's with
    if (k.gemm != 2) {
      CK(cudaMalloc(&yref, size_t(N * out_w) * 2));
      CK(cudaMemcpy(yref, y, size_t(N * out_w) * 2, cudaMemcpyDeviceToDevice));
    }
    const float t4 = time_ms(st, reps, [&] { loop(4); });
    // 2) pointer arrays over chunks (forward and data gradient: rows are independent)
    int nrounds = 0;
    float tp = 0, tp0 = 0;  // the fastest candidate; the heuristic's first
    unsigned long long ndiff = 0;
    if (k.gemm != 2) {
      std::vector<const void*> pa, pb;
      std::vector<void*> pc;
      for (int e = 0; e < E; ++e) {
        const int64_t n = counts[size_t(e)];
        for (int64_t s0 = 0; s0 < n; s0 += chunk) {
          const int64_t s = std::min(s0, n - chunk);  // the last chunk overlaps the one before
          const __nv_bfloat16* we = w + size_t(e) * size_t(k.out * k.in);
          pa.push_back(we);
          pb.push_back(x + (off[size_t(e)] + s) * in_w);
          pc.push_back(y + (off[size_t(e)] + s) * out_w);
        }
      }
      const int nb = int(pa.size());
      void** dp;
      CK(cudaMalloc(&dp, size_t(3 * nb) * sizeof(void*)));
      CK(cudaMemcpy(dp, pa.data(), size_t(nb) * sizeof(void*), cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dp + nb, pb.data(), size_t(nb) * sizeof(void*), cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dp + 2 * nb, pc.data(), size_t(nb) * sizeof(void*), cudaMemcpyHostToDevice));
      const Shape s = shape_of(k, chunk);
      Plan p = make_plan(s, nb, true);
      pick(
          p, st, [&](int a) { launch(p, a, s, dp, dp + nb, dp + 2 * nb, st); }, y,
          size_t(N * out_w));
      tp = time_ms(st, reps, [&] { launch(p, p.best, s, dp, dp + nb, dp + 2 * nb, st); });
      tp0 = time_ms(st, reps, [&] { launch(p, 0, s, dp, dp + nb, dp + 2 * nb, st); });
      CK(cudaStreamSynchronize(st));
      ndiff = count_diff(y, yref, size_t(N * out_w));
      CK(cudaFree(dp));
      CK(cudaFree(yref));
    }
    // 3) strided batched over balanced experts (N / E rows each): the bound
    const int64_t nb_rows = N / E;
    const Shape sb = shape_of(k, nb_rows);
    float ts;
    {
      const int64_t ws = k.out * k.in;
      Plan p = k.gemm == 2 ? make_plan(sb, E, false, nb_rows * k.in, nb_rows * k.out, ws)
                           : make_plan(sb, E, false, ws, nb_rows * in_w, nb_rows * out_w);
      const void* A = k.gemm == 2 ? static_cast<const void*>(x) : w;
      const void* B = k.gemm == 2 ? static_cast<const void*>(y) : x;
      void* C = k.gemm == 2 ? static_cast<void*>(dw) : y;
      pick(
          p, st, [&](int a) { launch(p, a, sb, A, B, C, st); },
          k.gemm == 2 ? nullptr : C, size_t(N * out_w));
      ts = time_ms(st, reps, [&] { launch(p, p.best, sb, A, B, C, st); });
    }
    // 4) weight gradient in rounds: round j adds chunk j (wchunk rows) of every expert that has
    // it, one pointer-array call with disjoint outputs; the experts' last partial chunks,
    // zero-padded into scratch by one kernel, make a last round (beta 1 throughout)
    float tr = 0, rdiff = 0;
    if (k.gemm == 2) {
      const int64_t C = wchunk, out_n = size_t(E) * k.out * k.in;
      std::vector<std::vector<const void*>> ra, rb;
      std::vector<std::vector<void*>> rc;
      std::vector<int64_t> tail_off(static_cast<size_t>(E)), tail_n(static_cast<size_t>(E));
      for (int e = 0; e < E; ++e) {
        const int64_t n = counts[size_t(e)], q = n / C;
        for (int64_t j = 0; j < q; ++j) {
          if (size_t(j) >= ra.size()) ra.resize(size_t(j) + 1), rb.resize(ra.size()),
                                      rc.resize(ra.size());
          ra[size_t(j)].push_back(x + (off[size_t(e)] + j * C) * k.in);
          rb[size_t(j)].push_back(y + (off[size_t(e)] + j * C) * k.out);
          rc[size_t(j)].push_back(dw + size_t(e) * size_t(k.out * k.in));
        }
        tail_off[size_t(e)] = off[size_t(e)] + q * C, tail_n[size_t(e)] = n - q * C;
      }
      __nv_bfloat16 *xs, *ys;
      int64_t* dtab;
      CK(cudaMalloc(&xs, size_t(E * C * k.in) * 2));
      CK(cudaMalloc(&ys, size_t(E * C * k.out) * 2));
      CK(cudaMalloc(&dtab, size_t(2 * E) * 8));
      CK(cudaMemcpy(dtab, tail_off.data(), size_t(E) * 8, cudaMemcpyHostToDevice));
      CK(cudaMemcpy(dtab + E, tail_n.data(), size_t(E) * 8, cudaMemcpyHostToDevice));
      ra.emplace_back(), rb.emplace_back(), rc.emplace_back();
      for (int e = 0; e < E; ++e) {
        ra.back().push_back(xs + size_t(e) * size_t(C * k.in));
        rb.back().push_back(ys + size_t(e) * size_t(C * k.out));
        rc.back().push_back(dw + size_t(e) * size_t(k.out * k.in));
      }
      const size_t R = ra.size();
      std::vector<void**> dptr(R);
      std::vector<Plan> rp;
      const Shape s = shape_of(k, C);
      for (size_t j = 0; j < R; ++j) {
        const size_t nb = ra[j].size();
        CK(cudaMalloc(&dptr[j], 3 * nb * sizeof(void*)));
        CK(cudaMemcpy(dptr[j], ra[j].data(), nb * sizeof(void*), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dptr[j] + nb, rb[j].data(), nb * sizeof(void*), cudaMemcpyHostToDevice));
        CK(cudaMemcpy(dptr[j] + 2 * nb, rc[j].data(), nb * sizeof(void*),
                      cudaMemcpyHostToDevice));
        rp.push_back(make_plan(s, int(nb), true));
      }
      auto rounds = [&](bool best) {
        gather_tail_kernel<<<dim3(64, unsigned(E)), 256, 0, st>>>(x, dtab, dtab + E, xs, C, k.in);
        gather_tail_kernel<<<dim3(64, unsigned(E)), 256, 0, st>>>(y, dtab, dtab + E, ys, C,
                                                                   k.out);
        for (size_t j = 0; j < R; ++j) {
          const size_t nb = ra[j].size();
          launch(rp[j], best ? rp[j].best : 0, s, dptr[j], dptr[j] + nb, dptr[j] + 2 * nb, st);
        }
      };
      for (size_t j = 0; j < R; ++j) {  // each round's fastest candidate
        const size_t nb = ra[j].size();
        pick(rp[j], st,
             [&](int a) { launch(rp[j], a, s, dptr[j], dptr[j] + nb, dptr[j] + 2 * nb, st); });
      }
      tr = time_ms(st, reps, [&] { rounds(true); });
      // the result against the loop's: dw from zero once each way
      float* ref;
      CK(cudaMalloc(&ref, out_n * 4));
      CK(cudaMemset(dw, 0, out_n * 4));
      loop(1);
      CK(cudaMemcpy(ref, dw, out_n * 4, cudaMemcpyDeviceToDevice));
      CK(cudaMemset(dw, 0, out_n * 4));
      rounds(true);
      CK(cudaStreamSynchronize(st));
      rdiff = rel_diff(ref, dw, out_n);
      CK(cudaFree(ref));
      for (void** d : dptr) CK(cudaFree(d));
      CK(cudaFree(xs));
      CK(cudaFree(ys));
      CK(cudaFree(dtab));
      nrounds = int(R);
    }
    auto tf = [&](float ms) { return flop / (double(ms) * 1e9); };
    const float mine = tp > 0 ? tp : tr;  // the pointer-array way, forward or weight gradient
    char ptr_col[64] = "-";
    if (tp > 0)
      std::snprintf(ptr_col, sizeof ptr_col, "%.3f (%.0f), first %.3f, %llu differ", tp, tf(tp),
                    tp0, ndiff);
    if (tr > 0)
      std::snprintf(ptr_col, sizeof ptr_col, "%d rounds: %.3f (%.0f), rel. diff %.1e", nrounds, tr,
                    tf(tr), double(rdiff));
    std::printf("| %s | %.3f (%.0f) | %.3f (%.0f) | %s | %.3f (%.0f) | %.2f |\n", k.name, t1,
                tf(t1), t4, tf(t4), ptr_col, ts, tf(ts), mine / t4);
    std::fflush(stdout);
  }
  CK(cudaFree(x));
  CK(cudaFree(y));
  CK(cudaFree(w));
  CK(cudaFree(dw));
}

}  // namespace

int main(int argc, char** argv) {
  int reps = 7;
  int64_t chunk = 256, wchunk = 512;
  double skew = 0.2;
  std::string only;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--chunk")) chunk = std::atol(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--wchunk")) wchunk = std::atol(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--skew")) skew = std::atof(argv[i + 1]);
    else if (!std::strcmp(argv[i], "--only")) only = argv[i + 1];
    else {
      std::fprintf(stderr, "unknown argument %s\n", argv[i]);
      return 2;
    }
  }
  LT(cublasLtCreate(&g_lt));
  for (void*& w : g_ws) CK(cudaMalloc(&w, kWs));
  std::printf("milliseconds a call (TFLOP/s); cuBLASLt %zu\n", cublasLtGetVersion());
  // bench_gpu_moe's models: tokens = micro-batch x 2048, times top-k
  const Model models[] = {{"Fine", 32, 8 * 2048 * 6, 2048, 1024},
                          {"Mixtral", 8, 16 * 2048 * 2, 2048, 4096}};
  for (const Model& m : models)
    if (only.empty() || only == m.name) run_model(m, reps, chunk, wchunk, skew);
  return 0;
}
