// Device set-up and the stream-ordered caching allocator (see device.h).
#include "ops/cuda/device.h"
#include "ops/cuda/device_id.h"

#include "ops/cuda/common.cuh"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

namespace mcpp::ops::cuda {

void cuda_fail(const char* file, int line, const char* expr, int code, const char* name,
               const char* msg) {
  std::string hint;
  if (code == int(cudaErrorMemoryAllocation))
    hint = "reduce --micro-batch-size, enable activation recomputation, or use more GPUs";
  else if (code == int(cudaErrorNoDevice) || code == int(cudaErrorInsufficientDriver))
    hint = "run on a machine with an NVIDIA GPU and a driver matching CUDA 13";
  fail_at(file, line, fmt::format("CUDA call failed: {} -> {} ({}): {}", expr, name, code, msg),
          hint);
}

namespace {

struct Block {
  size_t bytes;
  cudaStream_t stream;
};

struct DeviceState {
  std::once_flag once;
  int ordinal = -1;
  cudaMemPool_t pool = nullptr;
  Stream stream{Device::CUDA, nullptr};
  std::mutex mu;
  std::unordered_map<void*, Block> live;
  size_t in_use = 0, peak = 0;
  // Workspace (cuBLASLt): one buffer per stream (ops on two streams may run at once:
  // ops::StreamFork), grown by reallocating in that stream's order.
  struct Ws {
    void* p = nullptr;
    size_t bytes = 0;
  };
  std::unordered_map<void*, Ws> ws;
};

DeviceState& state() {
  static DeviceState* st = new DeviceState;  // never destroyed: tensors may outlive main
  return *st;
}

thread_local cudaStream_t t_alloc_stream = nullptr;
thread_local bool t_alloc_stream_set = false;

cudaStream_t alloc_stream() {
  return t_alloc_stream_set ? t_alloc_stream : static_cast<cudaStream_t>(state().stream.handle);
}

void* device_alloc(size_t bytes) {
  DeviceState& st = state();
  cudaStream_t s = alloc_stream();
  void* p = nullptr;
  // 256-byte granularity keeps every tensor aligned for 16-byte vector access.
  size_t rounded = (bytes + 255) / 256 * 256;
  cudaError_t e = cudaMallocAsync(&p, rounded, st.pool, s);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    fail_at(__FILE__, __LINE__,
            fmt::format("CUDA out of memory allocating {:.1f} MiB ({} in use by tensors, {:.1f} "
                        "MiB free of {:.1f} MiB on the device): {}",
                        rounded / 1048576.0, st.in_use, free_b / 1048576.0,
                        total_b / 1048576.0, cudaGetErrorString(e)),
            "reduce --micro-batch-size, enable activation recomputation, or use more GPUs");
  }
  std::lock_guard<std::mutex> lk(st.mu);
  st.live[p] = {rounded, s};
  st.in_use += rounded;
  if (st.in_use > st.peak) st.peak = st.in_use;
  return p;
}

void device_free(void* p) {
  DeviceState& st = state();
  Block b{0, nullptr};
  {
    std::lock_guard<std::mutex> lk(st.mu);
    auto it = st.live.find(p);
    if (it == st.live.end()) return;
    b = it->second;
    st.in_use -= b.bytes;
    st.live.erase(it);
  }
  // Errors are ignored here: this runs from destructors, possibly after the runtime
  // has been torn down at exit.
  if (cudaFreeAsync(p, b.stream) != cudaSuccess) (void)cudaGetLastError();
}

}  // namespace

bool device_available() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return n > 0;
}

void init_device(int ordinal) {
  DeviceState& st = state();
  std::call_once(st.once, [&] {
    int n = 0;
    CUDA_CHECK(cudaGetDeviceCount(&n));
    MCPP_CHECK_HINT(ordinal >= 0 && ordinal < n, "set CUDA_VISIBLE_DEVICES or the local rank",
                    "CUDA device {} requested, {} visible", ordinal, n);
    CUDA_CHECK(cudaSetDevice(ordinal));
    st.ordinal = ordinal;
    cudaStream_t s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    st.stream.handle = s;
    CUDA_CHECK(cudaDeviceGetDefaultMemPool(&st.pool, ordinal));
    // Keep freed memory in the pool (a caching allocator) instead of returning it to
    // the driver at every synchronisation.
    uint64_t keep = UINT64_MAX;
    CUDA_CHECK(cudaMemPoolSetAttribute(st.pool, cudaMemPoolAttrReleaseThreshold, &keep));
    set_device_allocator(Device::CUDA, DeviceAllocator{device_alloc, device_free});
  });
  if (st.ordinal >= 0) CUDA_CHECK(cudaSetDevice(st.ordinal));  // this thread too
}

std::string pci_bus_id() {
  init_device();
  char id[32] = {};
  CUDA_CHECK(cudaDeviceGetPCIBusId(id, int(sizeof id), state().ordinal));
  return id;
}

Stream& default_stream() {
  init_device();
  return state().stream;
}

Stream new_stream() {
  init_device();
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return Stream{Device::CUDA, s};
}

void synchronize(const Stream& s) {
  CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(s.handle)));
}

void set_alloc_stream(const Stream& s) {
  t_alloc_stream = static_cast<cudaStream_t>(s.handle);
  t_alloc_stream_set = true;
}

MemoryStats memory_stats() {
  DeviceState& st = state();
  MemoryStats m;
  {
    std::lock_guard<std::mutex> lk(st.mu);
    m.in_use = st.in_use;
    m.peak = st.peak;
  }
  size_t total = 0;
  CUDA_CHECK(cudaMemGetInfo(&m.device_free, &total));
  if (st.pool) {
    uint64_t v = 0;
    CUDA_CHECK(cudaMemPoolGetAttribute(st.pool, cudaMemPoolAttrReservedMemCurrent, &v));
    m.reserved = v;
    CUDA_CHECK(cudaMemPoolGetAttribute(st.pool, cudaMemPoolAttrReservedMemHigh, &v));
    m.reserved_peak = v;
  }
  return m;
}

void reset_peak_memory() {
  DeviceState& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  st.peak = st.in_use;
  if (st.pool) {
    uint64_t zero = 0;
    CUDA_CHECK(cudaMemPoolSetAttribute(st.pool, cudaMemPoolAttrReservedMemHigh, &zero));
  }
}

void trim_memory_pool() {
  DeviceState& st = state();
  if (!st.pool) return;
  CUDA_CHECK(cudaDeviceSynchronize());
  CUDA_CHECK(cudaMemPoolTrimTo(st.pool, 0));
}

void* workspace(size_t bytes, const Stream& s) {
  DeviceState& st = state();
  std::lock_guard<std::mutex> lk(st.mu);
  DeviceState::Ws& w = st.ws[s.handle];
  if (bytes > w.bytes) {
    auto cs = static_cast<cudaStream_t>(s.handle);
    if (w.p) CUDA_CHECK(cudaFreeAsync(w.p, cs));
    CUDA_CHECK(cudaMallocAsync(&w.p, bytes, st.pool, cs));
    w.bytes = bytes;
  }
  return w.p;
}

bool pdl_enabled() {
  // Programmatic dependent launch needs sm_90 (griddepcontrol); MCPP_DECODE_PDL=0 turns it
  // off (documented in docs/environment.md).
  static const bool on = [] {
    const char* e = std::getenv("MCPP_DECODE_PDL");
    if (e && e[0] == '0') return false;
    int dev = 0, major = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    CUDA_CHECK(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev));
    return major >= 9;
  }();
  return on;
}

bool pdl_for_stream(cudaStream_t cs) {
  if (!pdl_enabled()) return false;
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  CUDA_CHECK(cudaStreamIsCapturing(cs, &st));
  return st == cudaStreamCaptureStatusNone;
}

}  // namespace mcpp::ops::cuda
