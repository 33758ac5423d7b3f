// A captured run of stream work, replayed with one launch: CUDA graphs, for generation's
// decode step, whose ~200 small kernels at one stream would otherwise cost more in launch
// gaps than in their own work (inference/generator.cpp captures one graph per batch size).
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

}  // namespace mcpp::ops
