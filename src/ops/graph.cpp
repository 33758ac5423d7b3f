// StreamGraph (ops/graph.h) in a build without CUDA: nothing is ever captured, so the
// callers keep running their work eagerly. The CUDA build compiles ops/cuda/decode_graph.cpp.
#include "ops/graph.h"

#ifndef MCPP_HAVE_CUDA
#include "base/error.h"

namespace mcpp::ops {

StreamGraph::~StreamGraph() = default;
bool StreamGraph::begin_capture(Stream&) { return false; }
bool StreamGraph::end_capture(Stream&) { return false; }
void StreamGraph::replay(Stream&) {
  MCPP_FAIL("StreamGraph::replay: this build has no CUDA backend, so nothing was captured");
}

}  // namespace mcpp::ops
#endif
