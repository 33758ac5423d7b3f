// StreamGraph (ops/graph.h) on CUDA: stream capture in relaxed mode (the caching
// allocator's cudaMallocAsync is allowed; what the work allocates and frees inside the
// capture becomes the graph's own memory), instantiated once, launched on the same stream.
#include <cuda_runtime.h>

#include "ops/cuda/device.h"
#include "ops/graph.h"

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

}  // namespace mcpp::ops
