// --fp8-param-gather (docs/fp8.md, "FP8 parameters"): the weights of the FP8 linear layers
// (QKV, projection, fc1, fc2 of every layer in FP8) kept as FP8 by the distributed
// optimizer (optim/fp8_param_gather.h), which casts its fp32 main-parameter shard with the
// weight's scale after each step and all-gathers the FP8 bytes; the layer
// (model/fp8/fp8_linear.h) then reads this FP8 weight in every GEMM instead of casting its
// bf16 weight (once per step, not once per micro-batch).
//
// The FP8 weights of one ParamStore, by weight name, are attached to that store by the
// optimizer and looked up by each Fp8Linear (a layer with no FP8 weight attached casts its
// own weight, as without the flag).
#pragma once
#include <map>
#include <string>

#include "model/module.h"
#include "model/params.h"

namespace mcpp::model {

struct Fp8ParamWeight {
  Tensor q;          // [out, in] FP8E4M3: fp8(w * scale), every rank's blocks gathered (fprop)
  Tensor qt;         // [in, out] its exact transpose (dgrad; CUDA)
  Tensor scale_inv;  // [1] f32: 1 / scale, the GEMM's dequantisation factor
  Tensor deq;        // CPU emulation: q's values * scale_inv in the model dtype, [out, in]
  // [1] f32, delayed scaling: the amax of this rank's part of the main parameters at the
  // cast (0 without a part); the layer's training forwards record it into the weight's
  // amax history as they would record their own weight's amax, and the step's amax
  // reduction over TP x DP makes it the whole weight's.
  Tensor amax;
};

class Fp8ParamWeights {
 public:
  Fp8ParamWeight& add(const std::string& weight) { return w_[weight]; }
  const Fp8ParamWeight* find(const std::string& weight) const {
    auto it = w_.find(weight);
    return it == w_.end() ? nullptr : &it->second;
  }
  Fp8ParamWeight& at(const std::string& weight) { return w_.at(weight); }

 private:
  std::map<std::string, Fp8ParamWeight> w_;
};

// Attaches `w` to `store` (nullptr detaches); the caller keeps `w` alive while attached.
void attach_fp8_param_weights(const ParamStore* store, const Fp8ParamWeights* w);
// The FP8 weight named `weight` attached to `store`, or nullptr.
const Fp8ParamWeight* find_fp8_param_weight(const ParamStore* store, const std::string& weight);
// Whether parameter p is the weight of an FP8 linear layer under c.fp8 (a layer in FP8:
// not one of --first-last-layers-bf16's).
bool is_fp8_weight(const TransformerConfig& c, const ParamInfo& p);

}  // namespace mcpp::model
