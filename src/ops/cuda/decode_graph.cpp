// ops/graph.h on CUDA. StreamGraph: stream capture in relaxed mode (the caching
// allocator's cudaMallocAsync is allowed; what the work allocates and frees inside the
// capture becomes the graph's own memory), instantiated once, launched on the same stream.
// PinnedHost: cudaHostAlloc, or malloc where it fails (a CUDA build on a machine without a
// GPU). StreamFence: an event without timing.
#include <cuda_runtime.h>

#include <cstdlib>
#include <new>
#include <utility>

#include "ops/cuda/device.h"
#include "ops/graph.h"
#include "ops/ops.h"

namespace mcpp::ops {

StreamGraph::~StreamGraph() {
  // Errors ignored: this may run at exit, after the runtime is gone.
  if (exec_) (void)cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) (void)cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  (void)cudaGetLastError();
}

bool StreamGraph::begin_capture(Stream& s) {
  if (s.device != Device::CUDA || exec_) return false;
  auto cs = static_cast<cudaStream_t>(s.handle);
  if (cudaStreamBeginCapture(cs, cudaStreamCaptureModeRelaxed) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  return true;
}

bool StreamGraph::end_capture(Stream& s) {
  auto cs = static_cast<cudaStream_t>(s.handle);
  cudaGraph_t g = nullptr;
  cudaError_t e = cudaStreamEndCapture(cs, &g);
  if (e != cudaSuccess || !g) {
    (void)cudaGetLastError();
    if (g) (void)cudaGraphDestroy(g);
    return false;
  }
  cudaGraphExec_t x = nullptr;
  if (cudaGraphInstantiate(&x, g, 0) != cudaSuccess) {
    (void)cudaGetLastError();
    (void)cudaGraphDestroy(g);
    return false;
  }
  graph_ = g, exec_ = x;
  return true;
}

void StreamGraph::replay(Stream& s) {
  MCPP_CHECK(exec_, "StreamGraph::replay: nothing was captured");
  CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_),
                             static_cast<cudaStream_t>(s.handle)));
}

PinnedHost::PinnedHost(size_t bytes) {
  if (bytes == 0) bytes = 1;
  if (cudaHostAlloc(&p_, bytes, cudaHostAllocDefault) == cudaSuccess) {
    pinned_ = true;
    return;
  }
  (void)cudaGetLastError();
  p_ = std::malloc(bytes);
  if (!p_) throw std::bad_alloc();
}

PinnedHost::~PinnedHost() {
  if (!p_) return;
  if (pinned_)
    (void)cudaFreeHost(p_), (void)cudaGetLastError();  // (may run after the runtime is gone)
  else
    std::free(p_);
}

PinnedHost& PinnedHost::operator=(PinnedHost&& o) noexcept {
  std::swap(p_, o.p_);
  std::swap(pinned_, o.pinned_);
  return *this;
}

void copy_to_host_async(const Tensor& src, Tensor& dst, Stream& s) {
  if (s.device != Device::CUDA || src.device() != Device::CUDA || dst.device() != Device::CPU ||
      src.dtype() != dst.dtype()) {
    copy(src, dst, s);
    return;
  }
  MCPP_CHECK(src.numel() == dst.numel(), "copy_to_host_async: {} -> {}: element counts differ",
             src.str(), dst.str());
  CUDA_CHECK(cudaMemcpyAsync(dst.raw(), src.raw(), src.nbytes(), cudaMemcpyDeviceToHost,
                             static_cast<cudaStream_t>(s.handle)));
}

StreamFence::~StreamFence() {
  if (event_) (void)cudaEventDestroy(static_cast<cudaEvent_t>(event_)), (void)cudaGetLastError();
}

void StreamFence::record(Stream& s) {
  recorded_ = false;
  if (s.device != Device::CUDA) return;
  if (!event_) {
    cudaEvent_t e = nullptr;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    event_ = e;
  }
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(s.handle)));
  recorded_ = true;
}

void StreamFence::wait() {
  if (recorded_) CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event_)));
  recorded_ = false;
}

}  // namespace mcpp::ops
