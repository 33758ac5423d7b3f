// ops/graph.h in a build without CUDA: nothing is ever captured, so the callers keep
// running their work eagerly; host buffers are ordinary memory, copies and fences plain.
// The CUDA build compiles ops/cuda/decode_graph.cpp.
#include "ops/graph.h"

#ifndef MCPP_HAVE_CUDA
#include <cstdlib>
#include <new>

#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::ops {

StreamGraph::~StreamGraph() = default;
bool StreamGraph::begin_capture(Stream&) { return false; }
bool StreamGraph::end_capture(Stream&) { return false; }
void StreamGraph::replay(Stream&) {
  MCPP_FAIL("StreamGraph::replay: this build has no CUDA backend, so nothing was captured");
}

PinnedHost::PinnedHost(size_t bytes) : p_(std::malloc(bytes ? bytes : 1)) {
  if (!p_) throw std::bad_alloc();
}
PinnedHost::~PinnedHost() { std::free(p_); }
PinnedHost& PinnedHost::operator=(PinnedHost&& o) noexcept {
  std::swap(p_, o.p_);
  return *this;
}

void copy_to_host_async(const Tensor& src, Tensor& dst, Stream& s) { copy(src, dst, s); }

StreamFence::~StreamFence() = default;
void StreamFence::record(Stream&) {}
void StreamFence::wait() {}

StreamFork::StreamFork(Stream& main, int) : main_(&main) {}
StreamFork::~StreamFork() = default;
Stream& StreamFork::side(int) { return *main_; }
void StreamFork::join() {}

SideStream::SideStream(Stream& main, bool) : main_(&main) {}
SideStream::~SideStream() = default;
Stream& SideStream::stream() { return *main_; }
void SideStream::join() {}

}  // namespace mcpp::ops
#endif
