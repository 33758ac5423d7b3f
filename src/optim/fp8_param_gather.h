// --fp8-param-gather (Megatron's, through Transformer Engine's FP8 parameters; docs/fp8.md
// "FP8 parameters"): the distributed optimizer's parameter all-gather moves the weights
// of the FP8 linear layers as FP8 bytes (1 byte a parameter; bf16's half), and those bytes
// are what the layers' GEMMs read (model/fp8/fp8_param.h).
//
// After each optimizer step (and once at start-up, after any checkpoint is loaded), each
// DP rank casts ITS shard of the fp32 main parameters of every FP8 weight to E4M3 with the
// weight's agreed scale:
//   delayed:    the weight's delayed scale (its fp8_scale buffer, column 1; the same on
//               every rank); the amax of this rank's part is handed to the layer
//               (Fp8ParamWeight::amax), whose training forwards record it into the
//               weight's amax history as they record their own weight's amax without the
//               flag; the step's amax reduction over TP x DP makes it the amax of the
//               whole parameter (Transformer Engine measures it at its master-weight cast).
//   tensorwise: scale = fp8_max / amax, the amax of the whole parameter: the shards'
//               amaxes max-reduced over the DP group (and over TP, as the layer's own
//               weight cast does: every rank uses the serial run's scale).
// Then, bucket by bucket (the gradient buckets, whose rank-r block rank r owns), every
// rank's block is all-gathered in two parts: the FP8 weights' elements as FP8 bytes, the
// other parameters' (norms, biases, embeddings, layers kept in bf16) in the model dtype.
// A rank's part is its block's elements of that kind in flat order (no padding: the ranks'
// counts differ, the embedding sitting in one rank's block, so the gather is a batch of
// point-to-point transfers); the FP8 buffer then holds the bucket's FP8 weights back to
// back, and each FP8 weight is a view of it; the other elements are unpacked into the flat
// parameters. A bucket without FP8 weights is all-gathered in place as without the flag.
// The column-wise copy dgrad reads is the exact transpose of the gathered bytes (same
// scale), made once per gather.
//
// The model's own (bf16 / f32) copy of an FP8 weight is then current only in this rank's
// block: every reader of model weights takes them elsewhere (checkpoints from the gathered
// fp32 main parameters: DistributedAdamW::full_main_params). --overlap-param-gather: the
// gathers run asynchronously; wait(layer) completes and unpacks the buckets of a layer.
#pragma once
#include <vector>

#include "comm/communicator.h"
#include "model/fp8/fp8_param.h"
#include "optim/optimizer.h"
#include "parallel/data_parallel/grad_buffer.h"

namespace mcpp::optim {

// q = fp8(x * scale[0]) as E4M3 bytes (q: FP8E4M3, x's numel), scale_inv[0] = 1 / scale[0];
// amax (when given) = max(amax, max|x|). x: main parameters (f32; f64 on the CPU), any
// length. CUDA: the cast kernel of ops::fp8_cast_transpose; CPU: the same bytes, from
// ops::fp8_round of x * scale in x's dtype (the emulation's arithmetic).
void fp8_param_cast(const Tensor& x, const Tensor& scale, Tensor& q, Tensor* amax,
                    Tensor& scale_inv, Stream& st);
// CPU: y = the values of E4M3 bytes q times scale_inv[0], in y's dtype (f32 / f64): what
// ops::fp8_quantize of the cast tensor gives.
void fp8_param_dequantize(const Tensor& q, const Tensor& scale_inv, Tensor& y);

class Fp8ParamGather {
 public:
  // tp: the tensor-parallel group (tensorwise scaling: a weight's amax over its TP
  // shards), null at TP 1. Attaches the FP8 weights to `ps` (the layers then read them).
  Fp8ParamGather(model::ParamStore& ps, parallel::DataParallelGrads& grads,
                 const model::TransformerConfig& c, comm::Communicator* tp);
  ~Fp8ParamGather();
  Fp8ParamGather(const Fp8ParamGather&) = delete;
  Fp8ParamGather& operator=(const Fp8ParamGather&) = delete;

  // Casts this rank's main parameters `main` (laid out as the gradient shard) of the FP8
  // weights and starts every bucket's gathers (completed here unless `async`). from_flat:
  // the other parameters' updated values of this rank's blocks are in the flat parameters
  // (16-bit models: the step wrote them there), else in `main`.
  void cast_and_gather(const Tensor& main, bool from_flat, bool async);
  void wait(int layer);  // the buckets holding layer's parameters: complete and unpacked
  void wait_all();

  // Elements of the FP8 weights on this rank (local shapes), and of all parameters.
  int64_t fp8_elements() const { return fp8_elements_; }
  // Bytes the all-gathers of one cast_and_gather write (their gathered outputs, as the
  // communicators count them): FP8, model dtype; and what gathering every bucket whole in
  // the model dtype (without the flag) writes.
  int64_t gathered_fp8_bytes() const { return fp8_bytes_; }
  int64_t gathered_other_bytes() const { return other_bytes_; }
  // Of those, the bytes of this rank's own chunks (written in place, never received).
  int64_t own_bytes() const { return own_bytes_; }
  int64_t plain_bytes() const { return plain_bytes_; }

 private:
  struct Piece {      // a parameter's part of one rank's block
    size_t param = 0;
    int64_t flat = 0;    // offset in the flat parameters
    int64_t len = 0;
    int64_t packed = 0;  // offset in its rank's packed chunk
    int64_t shard = -1;  // this rank's pieces: offset in the main-parameter shard
  };
  struct Bucket {
    comm::Communicator* group = nullptr;
    int64_t begin = 0, len = 0, block = 0, shard_offset = 0;  // the gradient bucket's
    std::vector<size_t> fp8_params;              // its FP8 weights
    std::vector<std::vector<Piece>> fp8, other;  // per rank of the group
    std::vector<int64_t> off_f, off_o;  // rank q's chunk: [off[q], off[q + 1])
    int64_t F = 0, O = 0;               // the bucket's FP8 / other elements
    Tensor recv_f, recv_o;              // every rank's chunk (the FP8 weights are views of recv_f)
    Tensor plain_in, plain_out;  // a bucket without FP8 weights: gathered whole, in place
    std::vector<comm::Work> works;
    bool pending = false;
    std::vector<int> layers;
  };
  void cast_weights(const Tensor& main);
  void finish(size_t b);

  model::ParamStore& ps_;
  model::TransformerConfig cfg_;
  comm::Communicator* tp_ = nullptr;
  comm::Communicator* dp_ = nullptr;  // the FP8 weights' bucket group
  model::Fp8ParamWeights weights_;
  std::vector<size_t> fp8_params_;    // registry indices
  std::vector<int> fp8_index_;        // registry index -> position in fp8_params_, or -1
  std::vector<Bucket> buckets_;
  Tensor amax_, scale_;                // tensorwise: [P] each
  Tensor dummy_x_, dummy_q_;           // scale_inv of a weight with no piece on this rank
  int64_t fp8_elements_ = 0, fp8_bytes_ = 0, other_bytes_ = 0, own_bytes_ = 0, plain_bytes_ = 0;
};

}  // namespace mcpp::optim
