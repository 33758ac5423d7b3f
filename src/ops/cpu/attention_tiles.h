// Building blocks of the CPU attention kernels (src/ops/cpu/attention.cpp): 64-byte
// aligned scratch buffers, a register-blocked tile GEMM and row-wise softmax helpers
// (max, exp, sum) on rows whose length is a multiple of the SIMD width. Internal to
// the CPU backend; everything here is header-only and inline.
//
// Why not cblas on tiles: the tiles are 64 x 64 x HD; OpenBLAS spends a large share of
// such a call packing, and calling it from inside an OpenMP region risks oversubscribing
// the cores (openblas_set_num_threads is process-wide). GCC's vector extensions give a
// portable register-blocked kernel (zmm with AVX-512, two ymm otherwise) that reaches a
// good fraction of peak on these sizes without intrinsics.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>

namespace mcpp::ops::cpu::tiles {

#if defined(__AVX512F__)
inline constexpr int kVecBytes = 64;
#else
inline constexpr int kVecBytes = 32;
#endif

template <typename T>
struct VecOf;
template <>
struct VecOf<float> {
  typedef float type __attribute__((vector_size(kVecBytes)));
  typedef int32_t itype __attribute__((vector_size(kVecBytes)));
};
template <>
struct VecOf<double> {
  typedef double type __attribute__((vector_size(kVecBytes)));
};
template <typename T>
using Vec = typename VecOf<T>::type;
template <typename T>
inline constexpr int kLanes = int(sizeof(Vec<T>) / sizeof(T));

template <typename T>
inline Vec<T> vload(const T* p) {
  Vec<T> v;
  std::memcpy(&v, p, sizeof v);  // an unaligned vector load
  return v;
}
template <typename T>
inline void vstore(T* p, Vec<T> v) {
  std::memcpy(p, &v, sizeof v);
}

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// 64-byte aligned scratch of n elements, zero-initialised unless the caller will write
// every element anyway (zeroing a large buffer costs as much as the page faults).
enum class Init { Zero, Uninitialised };
template <typename T>
class Buffer {
 public:
  explicit Buffer(int64_t n, Init init = Init::Zero) : n_(n) {
    size_t bytes = size_t(round_up(n > 0 ? n : 1, 64 / int64_t(sizeof(T)))) * sizeof(T);
    p_.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (!p_) throw std::bad_alloc();
    if (init == Init::Zero) std::memset(p_.get(), 0, bytes);
  }
  T* get() const { return p_.get(); }
  void zero() const { std::memset(p_.get(), 0, size_t(n_) * sizeof(T)); }

 private:
  struct Free {
    void operator()(T* p) const { std::free(p); }
  };
  std::unique_ptr<T[], Free> p_;
  int64_t n_;
};

// Scratch of at least n elements owned by the calling thread and kept between calls
// (slot tells apart the buffers one thread uses at once). Large scratch that is
// allocated and freed per call comes back from mmap as fresh pages, and faulting them
// in cost 10-20% of a forward at S = 256; OpenMP's pool threads are long-lived, so the
// pages stay warm. The price: each thread keeps its largest scratch until it exits.
template <typename T, int Slot>
T* thread_scratch(int64_t n) {
  struct Cache {
    T* p = nullptr;
    int64_t capacity = 0;
    ~Cache() { std::free(p); }
  };
  thread_local Cache cache;
  if (cache.p == nullptr || n > cache.capacity) {
    std::free(cache.p);  // the old one first: it may be most of the memory
    cache.capacity = round_up(n > 0 ? n : 1, 64 / int64_t(sizeof(T)));
    cache.p = static_cast<T*>(std::aligned_alloc(64, size_t(cache.capacity) * sizeof(T)));
    if (cache.p == nullptr) {
      cache.capacity = 0;
      throw std::bad_alloc();
    }
  }
  // The analyzer destroys function-scope thread_locals at return (a false positive).
  return cache.p;  // NOLINT(clang-analyzer-unix.Malloc)
}

// C[MR rows, NC vectors] (+)= A[MR, K] @ B[K, NC*L]. The MR x NC accumulators stay in
// registers (MR x NC = 16 of the 32 zmm), each k step loads NC vectors of B and
// broadcasts MR scalars of A: 16 FMAs per 8 loads.
template <typename T, int MR, int NC>
inline void micro_kernel(int64_t K, const T* A, int64_t lda, const T* B, int64_t ldb, T* C,
                         int64_t ldc, bool accumulate) {
  constexpr int L = kLanes<T>;
  Vec<T> c[MR][NC];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NC; ++n) c[m][n] = accumulate ? vload(C + m * ldc + n * L) : Vec<T>{};
  for (int64_t k = 0; k < K; ++k) {
    Vec<T> b[NC];
    for (int n = 0; n < NC; ++n) b[n] = vload(B + k * ldb + n * L);
    for (int m = 0; m < MR; ++m) {
      const T a = A[m * lda + k];
      for (int n = 0; n < NC; ++n) c[m][n] += a * b[n];
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NC; ++n) vstore(C + m * ldc + n * L, c[m][n]);
}

// Row granularity of tile_gemm: callers pad M to a multiple of kMR.
inline constexpr int kMR = 8;

// C[M, N] (+)= A[M, K] @ B[K, N], row-major with leading dimensions; M a multiple of kMR,
// N a multiple of kLanes<T> (callers pad their tiles with zeros). Narrow column blocks
// (HD = 32 in f32 is two vectors) take 8 rows at a time so that there are still 16
// independent accumulators to hide the FMA latency.
template <typename T>
inline void tile_gemm(int64_t M, int64_t N, int64_t K, const T* A, int64_t lda, const T* B,
                      int64_t ldb, T* C, int64_t ldc, bool accumulate) {
  constexpr int L = kLanes<T>;
  for (int64_t n = 0; n < N; n += 4 * L) {
    const int64_t nv = (N - n) / L < 4 ? (N - n) / L : 4;
    const T* b = B + n;
    if (nv <= 2) {
      for (int64_t m = 0; m < M; m += 8) {
        if (nv == 2)
          micro_kernel<T, 8, 2>(K, A + m * lda, lda, b, ldb, C + m * ldc + n, ldc, accumulate);
        else
          micro_kernel<T, 8, 1>(K, A + m * lda, lda, b, ldb, C + m * ldc + n, ldc, accumulate);
      }
      continue;
    }
    for (int64_t m = 0; m < M; m += 4) {
      if (nv == 4)
        micro_kernel<T, 4, 4>(K, A + m * lda, lda, b, ldb, C + m * ldc + n, ldc, accumulate);
      else
        micro_kernel<T, 4, 3>(K, A + m * lda, lda, b, ldb, C + m * ldc + n, ldc, accumulate);
    }
  }
}

// exp on a vector of floats: Cody-Waite range reduction x = n ln2 + r, |r| <= ln2/2, and
// a degree-6 polynomial for e^r (Cephes expf coefficients), scaled by 2^n through the
// exponent bits. About 2 ulp. Inputs below -87.3 (including -inf, used for masked
// scores) give exactly 0, which is what the softmax wants.
inline Vec<float> vexp(Vec<float> x) {
  using V = Vec<float>;
  using VI = VecOf<float>::itype;
  const V lo = V{} - 87.3f, hi = V{} + 88.7f;
  const auto underflow = x < lo;
  x = x < lo ? lo : x;
  x = x > hi ? hi : x;
  const float magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  V n = (x * 1.44269504088896341f + magic) - magic;
  V r = x - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  V p = V{} + 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  VI e = (__builtin_convertvector(n, VI) + 127) << 23;
  V scale;
  std::memcpy(&scale, &e, sizeof scale);
  V y = p * scale;
  return underflow ? V{} : y;
}

// Row helpers on rows of n elements, n a multiple of kLanes<T>.
template <typename T>
inline T row_max(const T* x, int64_t n) {
  constexpr int L = kLanes<T>;
  Vec<T> m = Vec<T>{} - std::numeric_limits<T>::infinity();
  for (int64_t j = 0; j < n; j += L) {
    Vec<T> v = vload(x + j);
    m = v > m ? v : m;
  }
  T r = m[0];
  for (int l = 1; l < L; ++l) r = m[l] > r ? m[l] : r;
  return r;
}

// x[j] = exp(x[j] * a - c) in place; returns the sum of the results.
template <typename T>
inline T row_exp_sum(T* x, int64_t n, T a, T c) {
  constexpr int L = kLanes<T>;
  Vec<T> s{};
  for (int64_t j = 0; j < n; j += L) {
    Vec<T> v = vload(x + j) * a - c;
    if constexpr (std::is_same_v<T, float>) {
      v = vexp(v);
    } else {
      for (int l = 0; l < L; ++l) v[l] = std::exp(v[l]);  // f64 is the accuracy reference
    }
    vstore(x + j, v);
    s += v;
  }
  T r = 0;
  for (int l = 0; l < L; ++l) r += s[l];
  return r;
}

}  // namespace mcpp::ops::cpu::tiles
