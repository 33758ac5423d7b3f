// Context-parallel attention blocks and per-token RoPE (document masking) on the GPU: not
// implemented yet. The entry points of
// the catalogue's `context parallel` section fail with the flag to change, so a CUDA
// build links and a GPU run with --context-parallel-size > 1 stops with a clear error
// (validate_cp.cpp already refuses --device cuda with CP; this is the backstop).
#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::ops::cuda {
namespace {
[[noreturn]] void not_yet(const char* op) {
  ::mcpp::fail_at(__FILE__, __LINE__,
                  fmt::format("{} is not implemented on the GPU yet", op),
                  "train with --device cpu, or drop --context-parallel-size / "
                  "--reset-position-ids / --reset-attention-mask");
}
}  // namespace

void attention_block_forward(const Tensor&, const Tensor&, const AttentionDims&, bool, double,
                             double, DropoutKey, Tensor&, Tensor&, Stream&) {
  not_yet("attention_block_forward (context parallelism)");
}
void attention_block_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                              const Tensor&, const AttentionDims&, bool, double, double,
                              DropoutKey, Tensor&, Tensor&, Stream&) {
  not_yet("attention_block_backward (context parallelism)");
}
void attention_lse_merge(const Tensor&, const Tensor&, const AttentionDims&, Tensor&, Tensor&,
                         Stream&) {
  not_yet("attention_lse_merge (context parallelism)");
}

void rope_positions(const Tensor&, const AttentionDims&, int64_t, double, const Tensor&, bool,
                    Tensor&, Stream&) {
  not_yet("rope_positions (--reset-position-ids)");
}

}  // namespace mcpp::ops::cuda
