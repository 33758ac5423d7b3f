// The op profiler of device.h: CUDA events around each dispatched op, summed per name, and
// an NVTX range per op so that `nsys profile` shows the catalogue names on its timeline.
// Off by default; the trainer turns it on for the --profile window (training/profiler.h),
// bench_gpu_train for its profiled step. NVTX is the CUDA toolkit's header-only nvtx3: with
// no tool attached, a push/pop is a call through a null function pointer.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <map>
#include <mutex>

#include "ops/cuda/device.h"

namespace mcpp::ops::cuda {

namespace {

struct Record {
  std::string name;
  cudaEvent_t start, stop;
};

struct Profiler {
  std::mutex mu;
  bool on = false;
  std::vector<Record> records;  // events of this collection period, in call order
  size_t used = 0;              // records[0, used) hold this period's calls
};

Profiler& profiler() {
  static Profiler* p = new Profiler;  // outlives static destructors that may dispatch
  return *p;
}

thread_local int depth = 0;  // nested dispatches are counted in the outermost op

cudaStream_t handle(const Stream& s) { return static_cast<cudaStream_t>(s.handle); }

}  // namespace

void set_op_profiling(bool on) {
  Profiler& p = profiler();
  std::lock_guard<std::mutex> lk(p.mu);
  p.on = on;
}

bool op_profiling() { return profiler().on; }

OpScope::OpScope(const char* name, const Stream& s, const Tensor* shape_of) {
  Profiler& p = profiler();
  if (!p.on) return;
  s_ = &s;
  if (depth++ > 0) return;  // nested: s_ set, slot_ < 0
  std::lock_guard<std::mutex> lk(p.mu);
  if (p.used == p.records.size()) {
    Record r{std::string(), nullptr, nullptr};
    CUDA_CHECK(cudaEventCreate(&r.start));
    CUDA_CHECK(cudaEventCreate(&r.stop));
    p.records.push_back(r);
  }
  slot_ = int(p.used++);
  std::string& n = p.records[size_t(slot_)].name;
  n = name;
  if (shape_of && shape_of->defined()) {
    n += " [";
    for (int i = 0; i < shape_of->dim(); ++i)
      n += (i ? "x" : "") + std::to_string(shape_of->size(i));
    n += "]";
  }
  nvtxRangePushA(n.c_str());
  CUDA_CHECK(cudaEventRecord(p.records[size_t(slot_)].start, handle(s)));
}

OpScope::~OpScope() {
  if (!s_) return;  // profiling was off when the op began
  --depth;
  if (slot_ < 0) return;
  Profiler& p = profiler();
  std::lock_guard<std::mutex> lk(p.mu);
  cudaEventRecord(p.records[size_t(slot_)].stop, handle(*s_));
  nvtxRangePop();
}

void nvtx_push(const std::string& name) { nvtxRangePushA(name.c_str()); }
void nvtx_pop() { nvtxRangePop(); }

void cuda_profiler_capture(bool on) {
  // cudaErrorProfilerDisabled etc. only mean that no profiler is attached: not an error.
  const cudaError_t e = on ? cudaProfilerStart() : cudaProfilerStop();
  if (e != cudaSuccess) (void)cudaGetLastError();
}

std::vector<OpTime> op_profile_collect() {
  Profiler& p = profiler();
  CUDA_CHECK(cudaDeviceSynchronize());
  std::lock_guard<std::mutex> lk(p.mu);
  std::map<std::string, OpTime> by_name;
  for (size_t i = 0; i < p.used; ++i) {
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, p.records[i].start, p.records[i].stop));
    OpTime& t = by_name[p.records[i].name];
    t.name = p.records[i].name, ++t.calls, t.ms += ms;
  }
  p.used = 0;
  std::vector<OpTime> out;
  for (auto& [k, v] : by_name) out.push_back(v);
  std::sort(out.begin(), out.end(), [](const OpTime& a, const OpTime& b) { return a.ms > b.ms; });
  return out;
}

}  // namespace mcpp::ops::cuda
