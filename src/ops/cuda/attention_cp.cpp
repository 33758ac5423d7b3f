// Per-token RoPE (document masking, --reset-position-ids) on the GPU: not implemented yet.
// The catalogue entry fails with the flag to change, so a CUDA build links and a GPU run
// stops with a clear error (validate_cp.cpp already refuses --device cuda with the flag;
// this is the backstop). The context-parallel blocks and merge are in attention.cu.
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

void rope_positions(const Tensor&, const AttentionDims&, int64_t, double, const Tensor&, bool,
                    Tensor&, Stream&) {
  not_yet("rope_positions (--reset-position-ids)");
}

}  // namespace mcpp::ops::cuda
