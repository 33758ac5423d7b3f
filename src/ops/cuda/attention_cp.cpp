// Context-parallel attention blocks on the GPU: not implemented yet. The entry points of
// the catalogue's `context parallel` section fail with the flag to change, so a CUDA
// build links and a GPU run with --context-parallel-size > 1 stops with a clear error
// (validate_cp.cpp already refuses --device cuda with CP; this is the backstop).
#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {
namespace {
[[noreturn]] void not_yet(const char* op) {
  ::mcpp::fail_at(__FILE__, __LINE__,
                  fmt::format("{}: context-parallel attention is not implemented on the GPU yet",
                              op),
                  "train with --device cpu, or drop --context-parallel-size");
}
}  // namespace

void attention_block_forward(const Tensor&, const Tensor&, const AttentionDims&, bool, double,
                             double, DropoutKey, Tensor&, Tensor&, Stream&) {
  not_yet("attention_block_forward");
}
void attention_block_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const AttentionDims&, bool, double, double,
                              DropoutKey, Tensor&, Tensor&, Stream&) {
  not_yet("attention_block_backward");
}
void attention_lse_merge(const Tensor&, const Tensor&, const AttentionDims&, Tensor&, Tensor&,
                         Stream&) {
  not_yet("attention_lse_merge");
}

}  // namespace mcpp::ops::cuda
