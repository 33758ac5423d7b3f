// A captured run of stream work, replayed with one launch: CUDA graphs, for generation's
// decode step, whose ~200 small kernels at one stream would otherwise cost more in launch
// gaps than in their own work (inference/generator.cpp captures one graph per batch size).
// And what lets the host queue the next step before the last one has finished (the
// serving engine's pipelined decode): page-locked host buffers, a device-to-host copy that
// does not wait, and a fence the host waits at later.
//
//   StreamGraph g;
//   if (g.begin_capture(s)) { ...ops on s...; g.end_capture(s); }   // records, runs nothing
//   if (g.ready()) g.replay(s);                                      // runs it again
//
// What is captured is fixed: the kernels, their arguments and every tensor's address. The
// inputs that change from one replay to the next must sit in device tensors that the ops
// read (copied there before replay), and no op may allocate memory that outlives the
// capture, synchronise the host, or read a device value on the host while capturing.
// begin_capture is false on a CPU stream and in a build without CUDA; end_capture is false
// when an op broke the capture (the error is cleared, nothing is kept).
#pragma once
#include "tensor/tensor.h"

namespace mcpp::ops {

class StreamGraph {
 public:
  StreamGraph() = default;
  ~StreamGraph();
  StreamGraph(const StreamGraph&) = delete;
  StreamGraph& operator=(const StreamGraph&) = delete;

  bool begin_capture(Stream& s);
  bool end_capture(Stream& s);
  bool ready() const { return exec_ != nullptr; }
  void replay(Stream& s);

 private:
  void* graph_ = nullptr;  // cudaGraph_t
  void* exec_ = nullptr;   // cudaGraphExec_t
};

// Host memory that a stream's copies read and write without the host waiting: page-locked
// (cudaHostAlloc) where a CUDA device is present -- a copy from ordinary memory may wait for
// the stream's earlier work, which would serialise a pipeline -- ordinary memory otherwise.
class PinnedHost {
 public:
  PinnedHost() = default;
  explicit PinnedHost(size_t bytes);
  ~PinnedHost();
  PinnedHost(PinnedHost&& o) noexcept : p_(o.p_), pinned_(o.pinned_) { o.p_ = nullptr; }
  PinnedHost& operator=(PinnedHost&& o) noexcept;
  PinnedHost(const PinnedHost&) = delete;
  PinnedHost& operator=(const PinnedHost&) = delete;
  void* data() const { return p_; }

 private:
  void* p_ = nullptr;
  bool pinned_ = false;
};

// src (on s's device) into dst (host, a PinnedHost's memory for the copy not to wait) in
// s's order, returning before the copy is done: read dst after a StreamFence recorded after
// it has passed. On a CPU stream, a plain copy.
void copy_to_host_async(const Tensor& src, Tensor& dst, Stream& s);

// A point in a stream's work that the host waits for later (a CUDA event). Recorded on a
// CPU stream, or never recorded, it has already passed.
class StreamFence {
 public:
  StreamFence() = default;
  ~StreamFence();
  StreamFence(const StreamFence&) = delete;
  StreamFence& operator=(const StreamFence&) = delete;
  void record(Stream& s);  // the work queued on s so far
  void wait();             // returns once that work is done

 private:
  void* event_ = nullptr;  // cudaEvent_t
  bool recorded_ = false;
};

// Independent ops side by side: up to kMaxSides side streams start from `main`'s work so
// far (fork, at construction) and `main` continues after all their work (join, at
// destruction or join()). Where one kernel leaves part of the GPU idle (the last wave of a
// small GEMM), the next one on another side stream fills it. Ops queued on side(i) must
// allocate nothing (their tensors are freed in main's order): GEMMs on caller-owned
// tensors, as the MoE experts' (model/moe/experts.cpp). The ops' results are the ones
// they give on one stream. On a CPU stream, or with n <= 1, side(i) is main itself.
class StreamFork {
 public:
  static constexpr int kMaxSides = 8;
  StreamFork(Stream& main, int n);
  ~StreamFork();
  StreamFork(const StreamFork&) = delete;
  StreamFork& operator=(const StreamFork&) = delete;
  int size() const { return n_; }
  Stream& side(int i);  // i taken modulo size()
  void join();

 private:
  Stream* main_;
  int n_ = 1;
  bool joined_ = true;
};

// One side stream beside `main` for a longer span of independent work -- the MoE layer's
// shared expert beside its router and routed experts (--moe-shared-expert-overlap): it
// starts from main's work so far (at construction, when `on`), and main continues after
// it at join() or destruction. A stream of its own, not one of StreamFork's, so the forks
// inside that span do not join it early. StreamFork's rules hold for the ops queued on it
// (they allocate nothing), and no collective runs on it (two streams would order one
// communicator's collectives differently on different ranks). One at a time per process.
// On a CPU stream, or with `on` false, stream() is main itself.
class SideStream {
 public:
  SideStream(Stream& main, bool on);
  ~SideStream();
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  Stream& stream();
  void join();

 private:
  Stream* main_;
  bool joined_ = true;
};

}  // namespace mcpp::ops
