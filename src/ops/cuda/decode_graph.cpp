// ops/graph.h on CUDA. StreamGraph: stream capture in relaxed mode (the caching
// allocator's cudaMallocAsync is allowed; what the work allocates and frees inside the
// capture becomes the graph's own memory), instantiated once, launched on the same stream.
// PinnedHost: cudaHostAlloc, or malloc where it fails (a CUDA build on a machine without a
// GPU). StreamFence: an event without timing.
#include <cuda_runtime.h>

#include <algorithm>
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

namespace {
// The process's side streams and an event each (created once, on first use): a fork
// records `forked` on main, a join each side's `done`. One host thread forks at a time.
struct SidePool {
  Stream sides[StreamFork::kMaxSides];
  cudaEvent_t done[StreamFork::kMaxSides] = {};
  cudaEvent_t forked = nullptr;
  int made = 0;
};
SidePool& side_pool(int n) {
  static SidePool* p = new SidePool;  // never destroyed: streams may be used at exit
  if (!p->forked) CUDA_CHECK(cudaEventCreateWithFlags(&p->forked, cudaEventDisableTiming));
  for (; p->made < n; ++p->made) {
    p->sides[p->made] = cuda::new_stream();
    CUDA_CHECK(cudaEventCreateWithFlags(&p->done[p->made], cudaEventDisableTiming));
  }
  return *p;
}
}  // namespace

StreamFork::StreamFork(Stream& main, int n) : main_(&main) {
  if (main.device != Device::CUDA || n <= 1) return;
  n_ = std::min(n, kMaxSides);
  SidePool& p = side_pool(n_);
  CUDA_CHECK(cudaEventRecord(p.forked, static_cast<cudaStream_t>(main.handle)));
  for (int i = 0; i < n_; ++i)
    CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(p.sides[i].handle), p.forked, 0));
  joined_ = false;
}

StreamFork::~StreamFork() {
  if (!joined_) {  // errors ignored: a destructor may run while an exception unwinds
    SidePool& p = side_pool(n_);
    for (int i = 0; i < n_; ++i) {
      (void)cudaEventRecord(p.done[i], static_cast<cudaStream_t>(p.sides[i].handle));
      (void)cudaStreamWaitEvent(static_cast<cudaStream_t>(main_->handle), p.done[i], 0);
    }
  }
}

Stream& StreamFork::side(int i) {
  if (n_ <= 1 || joined_) return *main_;
  return side_pool(n_).sides[((i % n_) + n_) % n_];
}

void StreamFork::join() {
  if (joined_) return;
  SidePool& p = side_pool(n_);
  for (int i = 0; i < n_; ++i) {
    CUDA_CHECK(cudaEventRecord(p.done[i], static_cast<cudaStream_t>(p.sides[i].handle)));
    CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(main_->handle), p.done[i], 0));
  }
  joined_ = true;
}

namespace {
// SideStream's stream and events (created once, on first use).
struct SidePair {
  Stream side;
  cudaEvent_t forked = nullptr, done = nullptr;
};
SidePair& side_pair() {
  static SidePair* p = [] {
    auto* q = new SidePair;  // never destroyed: the stream may be used at exit
    q->side = cuda::new_stream();
    CUDA_CHECK(cudaEventCreateWithFlags(&q->forked, cudaEventDisableTiming));
    CUDA_CHECK(cudaEventCreateWithFlags(&q->done, cudaEventDisableTiming));
    return q;
  }();
  return *p;
}
}  // namespace

SideStream::SideStream(Stream& main, bool on) : main_(&main) {
  if (!on || main.device != Device::CUDA) return;
  SidePair& p = side_pair();
  CUDA_CHECK(cudaEventRecord(p.forked, static_cast<cudaStream_t>(main.handle)));
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(p.side.handle), p.forked, 0));
  joined_ = false;
}

SideStream::~SideStream() {
  if (joined_) return;  // errors ignored: a destructor may run while an exception unwinds
  SidePair& p = side_pair();
  (void)cudaEventRecord(p.done, static_cast<cudaStream_t>(p.side.handle));
  (void)cudaStreamWaitEvent(static_cast<cudaStream_t>(main_->handle), p.done, 0);
}

Stream& SideStream::stream() { return joined_ ? *main_ : side_pair().side; }

void SideStream::join() {
  if (joined_) return;
  SidePair& p = side_pair();
  CUDA_CHECK(cudaEventRecord(p.done, static_cast<cudaStream_t>(p.side.handle)));
  CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(main_->handle), p.done, 0));
  joined_ = true;
}

}  // namespace mcpp::ops
