// CUDA device set-up for the CUDA backend: device selection, the default stream, a
// stream-ordered caching allocator (cudaMallocAsync on a pool that keeps freed memory)
// registered as Tensor's CUDA allocator, memory statistics, and the error-check macros.
//
// Allocation order: a tensor is allocated and freed in the order of the *allocation
// stream* (the default stream unless set_alloc_stream says otherwise). Memory freed on
// the host is reused by later work on that stream only after the work already queued
// there, so one stream needs no synchronisation. Work on another stream that reads a
// tensor must be joined back (cudaStreamWaitEvent) before the tensor is freed, as with
// PyTorch's record_stream.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/error.h"
#include "tensor/tensor.h"

namespace mcpp::ops::cuda {

// Selects the device, creates the default stream and the memory pool, and registers the
// allocator. Idempotent; the first call decides the device. Throws mcpp::Error when no
// CUDA device is usable.
void init_device(int ordinal = 0);
bool device_available();  // true when a CUDA device is present (does not initialise)

// The backend's default stream (non-blocking, created by init_device).
Stream& default_stream();
// A new non-blocking stream (never destroyed: streams live as long as the process).
Stream new_stream();
void synchronize(const Stream& s);
// Tensors allocated from this thread from now on are ordered on `s`.
void set_alloc_stream(const Stream& s);

struct MemoryStats {
  size_t in_use = 0;     // bytes held by live tensors
  size_t peak = 0;       // high-water mark of in_use since the last reset
  size_t reserved = 0;   // bytes the pool holds from the driver (live + cached)
  size_t reserved_peak = 0;
  size_t device_free = 0;  // bytes the driver can still give this process (cudaMemGetInfo)
};
MemoryStats memory_stats();
void reset_peak_memory();
// Returns cached, unused pool memory to the driver (e.g. before measuring).
void trim_memory_pool();

// Whether the decode kernels are launched to overlap the kernel before them (programmatic
// dependent launch, ops/cuda/common.cuh's launch_dependent): on an sm_90+ GPU unless
// MCPP_DECODE_PDL=0.
bool pdl_enabled();

// A device scratch buffer shared by the ops of one stream order (cuBLASLt workspace), one
// per stream; grows on demand, never shrinks.
void* workspace(size_t bytes, const Stream& s);

// ---- op profiler -------------------------------------------------------------------
// With profiling on (set_op_profiling(true): the trainer's --profile window, bench_gpu_train
// --profile), every catalogue op dispatched to the CUDA backend is bracketed by two CUDA
// events on its stream and an NVTX range (nested dispatches count once, in the outermost
// op). op_profile_collect()
// synchronises the device and returns the GPU time per op name since the last collect:
// where a training step's time goes, without Nsight. Off, it costs one branch per op.
struct OpTime {
  std::string name;
  int64_t calls = 0;
  double ms = 0;  // summed GPU time between each call's two events
};
void set_op_profiling(bool on);
bool op_profiling();
// The dispatcher's bracket (ops/dispatch.cpp); does nothing while profiling is off.
class OpScope {
 public:
  // shape_of: a tensor whose shape is appended to the name (tells GEMMs apart).
  OpScope(const char* name, const Stream& s, const Tensor* shape_of = nullptr);
  ~OpScope();
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  int slot_ = -1;
  const Stream* s_ = nullptr;
};
// Sorted by time, largest first; clears the recorded events.
std::vector<OpTime> op_profile_collect();
// An NVTX range of the calling thread (e.g. "iteration 11"), for Nsight Systems' timeline.
void nvtx_push(const std::string& name);
void nvtx_pop();
// cudaProfilerStart/Stop: `nsys profile --capture-range=cudaProfilerApi` records only
// between them. Without a profiler attached, does nothing.
void cuda_profiler_capture(bool on);

// One line per GEMM key tuned so far (ops/cuda/gemm.cu): candidates, how many computed
// the same bits as cuBLASLt's first pick, its time and the chosen one's.
std::string gemm_tuning_report();
// Turns GEMM tuning on or off (MCPP_GEMM_AUTOTUNE=0 starts with it off) and forgets every
// algorithm chosen so far; returns the previous setting. For tests.
bool set_gemm_autotune(bool on);
// A benchmark's own ranking of GEMM candidates (bench/gpu/gemm_sustained.h ranks them at
// the power-capped clock). Tuning calls it for a key with at least two candidates whose
// output is bitwise equal to cuBLASLt's first pick: their names, short-run times (ms), and
// run(j, reps), which launches candidate j reps times back to back on the tuning buffers
// and returns ms per call. The choice names one of them, so the numbers stay those of the
// first pick whatever the ranker does.
struct GemmTuneCandidates {
  std::vector<std::string> names;  // "#i algo A tile T stages S cluster C"
  std::vector<float> short_ms;
  std::function<float(size_t j, int reps)> run;
};
struct GemmTuneChoice {
  size_t index = 0;    // into the candidates
  float ms = 0;        // its time as the ranker measured it (for the report)
  std::string label;   // e.g. "sustained", after the time in the report
  std::string detail;  // appended to the report line
};
using GemmTuneRanker = std::function<GemmTuneChoice(const GemmTuneCandidates&)>;
// Installs `r` (empty: the short-run ranking), forgets every algorithm chosen so far, and
// returns the previous ranker.
GemmTuneRanker set_gemm_tune_ranker(GemmTuneRanker r);

// Error reporting with file:line (mcpp::Error).
[[noreturn]] void cuda_fail(const char* file, int line, const char* expr, int code,
                            const char* name, const char* msg);

}  // namespace mcpp::ops::cuda

#define CUDA_CHECK(expr)                                                              \
  do {                                                                                \
    cudaError_t mcpp_err_ = (expr);                                                   \
    if (mcpp_err_ != cudaSuccess) [[unlikely]]                                        \
      ::mcpp::ops::cuda::cuda_fail(__FILE__, __LINE__, #expr, int(mcpp_err_),         \
                                   cudaGetErrorName(mcpp_err_),                       \
                                   cudaGetErrorString(mcpp_err_));                    \
  } while (0)

#define CUBLAS_CHECK(expr)                                                            \
  do {                                                                                \
    cublasStatus_t mcpp_st_ = (expr);                                                 \
    if (mcpp_st_ != CUBLAS_STATUS_SUCCESS) [[unlikely]]                               \
      ::mcpp::ops::cuda::cuda_fail(__FILE__, __LINE__, #expr, int(mcpp_st_),          \
                                   cublasGetStatusName(mcpp_st_),                     \
                                   cublasGetStatusString(mcpp_st_));                  \
  } while (0)
