// choose_attention_backend: see attention_backend.h. No CUDA header here: the CPU build
// compiles this file and its unit test (tests/ops/test_attention_backend.cpp).
#include "ops/attention_backend.h"

#include <fmt/format.h>

#include <cstdlib>

#ifdef MCPP_HAVE_CUDA
namespace mcpp::ops::cuda {
bool cudnn_attention_enabled();  // ops/cuda/cudnn_attention.h (no CUDA headers needed here)
}
#endif

namespace mcpp::ops {

bool cudnn_attention_takes(DType dt, int64_t head_dim) {
  return (dt == DType::BF16 || dt == DType::F16) && head_dim > 0 && head_dim % 8 == 0 &&
         head_dim <= 128;
}

bool flash_attention_takes(DType dt, int64_t head_dim) {
  return (dt == DType::BF16 || dt == DType::F16) && (head_dim == 64 || head_dim == 128);
}

AttentionBackendChoice choose_attention_backend(const AttentionBackendQuery& q) {
  using B = AttentionBackend;
  if (q.device == Device::CPU)
    return {B::Cpu, fmt::format("CPU backend (tiled flash attention in {})", dtype_name(q.dtype))};
  const bool drop = q.dropout_p > 0;
  if (q.fallback_forced)
    return {B::CudaCore, "CUDA-core fallback: MCPP_ATTENTION_FALLBACK is set"};
  if (q.dtype != DType::BF16 && q.dtype != DType::F16)
    return {B::CudaCore, fmt::format("CUDA-core fallback: {} activations (the tensor-core "
                                     "kernels take bf16/f16)",
                                     dtype_name(q.dtype))};
  if (!drop && q.cudnn_available && cudnn_attention_takes(q.dtype, q.head_dim))
    return {B::Cudnn, "cuDNN fused attention"};
  if (flash_attention_takes(q.dtype, q.head_dim)) {
    if (drop)
      return {B::Flash, fmt::format("own flash kernel with dropout {} (cuDNN cannot draw the "
                                    "global-index mask)",
                                    q.dropout_p)};
    return {B::Flash,
            q.cudnn_available ? std::string("own flash kernel")
                              : std::string("own flash kernel (cuDNN not available)")};
  }
  std::string why = fmt::format("head dim {} unsupported by the flash kernel (64, 128)", q.head_dim);
  if (drop && cudnn_attention_takes(q.dtype, q.head_dim))
    why += ", and cuDNN cannot draw the dropout mask";
  else if (!drop && !q.cudnn_available)
    why += ", and cuDNN is not available";
  else if (!drop)
    why += " nor by cuDNN (multiples of 8 up to 128)";
  return {B::CudaCore, "CUDA-core fallback: " + why};
}

AttentionBackendQuery attention_backend_query(Device device, DType dtype, int64_t head_dim,
                                              double dropout_p) {
  AttentionBackendQuery q;
  q.device = device, q.dtype = dtype, q.head_dim = head_dim, q.dropout_p = dropout_p;
  static const bool forced = std::getenv("MCPP_ATTENTION_FALLBACK") != nullptr;
  q.fallback_forced = forced;
#ifdef MCPP_HAVE_CUDA
  if (device == Device::CUDA) q.cudnn_available = cuda::cudnn_attention_enabled();
#endif
  return q;
}

std::string describe_attention_backend(Device device, DType dtype, int64_t head_dim,
                                       double dropout_p, int64_t num_layers) {
  const AttentionBackendChoice c =
      choose_attention_backend(attention_backend_query(device, dtype, head_dim, dropout_p));
  return fmt::format("attention (all {} layers, head dim {}, dropout {}): {}{}", num_layers,
                     head_dim, dropout_p, c.reason,
                     c.slow() ? " -- several times slower than the tensor-core kernels" : "");
}

}  // namespace mcpp::ops
