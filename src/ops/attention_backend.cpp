// choose_attention_backend: see attention_backend.h. No CUDA header here: the CPU build
// compiles this file and its unit test (tests/ops/test_attention_backend.cpp).
#include "ops/attention_backend.h"

#include <fmt/format.h>

#include <atomic>
#include <cstdlib>

#include "base/error.h"

#ifdef MCPP_HAVE_CUDA
namespace mcpp::ops::cuda {
bool cudnn_attention_enabled();  // ops/cuda/cudnn_attention.h (no CUDA headers needed here)
bool flash_attention_uses_wgmma();  // ops/cuda/flash_attention.h
}
#endif

namespace mcpp::ops {

// cuDNN 9's fused attention on Hopper: head dims that are multiples of 8 up to 256 (192 is
// DeepSeek's multi-latent attention, 128 + 64).
bool cudnn_attention_takes(DType dt, int64_t head_dim) {
  return (dt == DType::BF16 || dt == DType::F16) && head_dim > 0 && head_dim % 8 == 0 &&
         head_dim <= 256;
}

bool cuda_core_attention_takes(int64_t head_dim) {
  return head_dim == 32 || head_dim == 64 || head_dim == 128;
}

bool flash_attention_takes(DType dt, int64_t head_dim) {
  return (dt == DType::BF16 || dt == DType::F16) && (head_dim == 64 || head_dim == 128);
}

namespace {

std::atomic<AttentionRequest> g_request{AttentionRequest::Auto};

constexpr const char* kRequestHint =
    "give --attention-backend auto (the default) to let megatron.cpp pick the kernel each "
    "call can use; docs/cuda-backend.md lists what each backend takes";

// The CUDA-core kernel takes head dims 32, 64 and 128 only: any other choice of it is a
// start-up error naming the ways out, not a failure at the first step.
AttentionBackendChoice cuda_core_or_error(AttentionBackendChoice c, const AttentionBackendQuery& q) {
  if (cuda_core_attention_takes(q.head_dim)) return c;
  throw Error(fmt::format("attention with head dim {} has no CUDA kernel in this configuration: "
                          "{}; the CUDA-core kernel takes head dims 32, 64 and 128",
                          q.head_dim, c.reason),
              "train in bf16/fp16 with --attention-dropout 0 (cuDNN takes head dims that are "
              "multiples of 8 up to 256), or choose a head dim of 64 or 128");
}

// The order of attention_backend.h, for --attention-backend auto.
AttentionBackendChoice choose_auto(const AttentionBackendQuery& q) {
  using B = AttentionBackend;
  const bool drop = q.dropout_p > 0;
  if (q.fallback_forced)
    return cuda_core_or_error({B::CudaCore, "CUDA-core fallback: MCPP_ATTENTION_FALLBACK is set"},
                              q);
  if (q.dtype != DType::BF16 && q.dtype != DType::F16)
    return cuda_core_or_error({B::CudaCore, fmt::format("CUDA-core fallback: {} activations "
                                                        "(the tensor-core kernels take bf16/f16)",
                                                        dtype_name(q.dtype))},
                              q);
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
    why += " nor by cuDNN (multiples of 8 up to 256)";
  return cuda_core_or_error({B::CudaCore, "CUDA-core fallback: " + why}, q);
}

}  // namespace

AttentionRequest parse_attention_request(const std::string& name) {
  std::string n = name;
  if (auto dot = n.rfind('.'); dot != std::string::npos) n = n.substr(dot + 1);  // AttnBackend.x
  for (AttentionRequest r : {AttentionRequest::Auto, AttentionRequest::Fused,
                             AttentionRequest::Flash, AttentionRequest::Unfused,
                             AttentionRequest::Local})
    if (n == attention_request_name(r)) return r;
  throw Error(fmt::format("--attention-backend: '{}' is not one of flash, fused, unfused, local, "
                          "auto",
                          name),
              kRequestHint);
}

const char* attention_request_name(AttentionRequest r) {
  switch (r) {
    case AttentionRequest::Auto: return "auto";
    case AttentionRequest::Fused: return "fused";
    case AttentionRequest::Flash: return "flash";
    case AttentionRequest::Unfused: return "unfused";
    case AttentionRequest::Local: return "local";
  }
  return "auto";
}

void set_attention_request(AttentionRequest r) { g_request.store(r); }
AttentionRequest attention_request() { return g_request.load(); }

AttentionBackendChoice choose_attention_backend(const AttentionBackendQuery& q) {
  using B = AttentionBackend;
  using R = AttentionRequest;
  const char* req = attention_request_name(q.request);
  if (q.device == Device::CPU) {
    if (q.request != R::Auto)
      throw Error(fmt::format("--attention-backend {} selects one of the CUDA attention kernels, "
                              "but this run uses the CPU backend, which has one attention "
                              "kernel (tiled flash attention)",
                              req),
                  "drop --attention-backend (or give auto) on the CPU, or train with "
                  "--device cuda");
    return {B::Cpu, fmt::format("CPU backend (tiled flash attention in {})", dtype_name(q.dtype))};
  }
  if (q.request == R::Auto) return choose_auto(q);
  if (q.request == R::Unfused || q.request == R::Local)
    return cuda_core_or_error(
        {B::CudaCore, fmt::format("CUDA-core kernel (--attention-backend {})", req)}, q);
  // fused / flash: an explicit tensor-core path. Say exactly why it cannot run.
  const bool half = q.dtype == DType::BF16 || q.dtype == DType::F16;
  std::string why;
  if (q.fallback_forced)
    why = "MCPP_ATTENTION_FALLBACK is set in the environment (it forces the CUDA-core kernel)";
  else if (!half)
    why = fmt::format("the activations are {} (the tensor-core kernels take bf16/f16: give "
                      "--bf16 or --fp16)",
                      dtype_name(q.dtype));
  if (why.empty() && q.request == R::Fused) {
    if (q.dropout_p > 0)
      why = fmt::format("--attention-dropout {} is not 0 (cuDNN draws its own dropout mask, not "
                        "megatron.cpp's global-index mask)",
                        q.dropout_p);
    else if (!q.cudnn_available)
      why = "cuDNN is not available in this process (see the 'attention:' start-up line)";
    else if (!cudnn_attention_takes(q.dtype, q.head_dim))
      why = fmt::format("head dim {} is not a multiple of 8 up to 256", q.head_dim);
    else
      return {B::Cudnn, "cuDNN fused attention (--attention-backend fused)"};
  } else if (why.empty()) {
    if (!flash_attention_takes(q.dtype, q.head_dim))
      why = fmt::format("head dim {} is not one the flash kernel takes (64, 128)", q.head_dim);
    else
      return {B::Flash, q.dropout_p > 0
                            ? fmt::format("own flash kernel with dropout {} "
                                          "(--attention-backend flash)",
                                          q.dropout_p)
                            : std::string("own flash kernel (--attention-backend flash)")};
  }
  throw Error(fmt::format("--attention-backend {} ({}) cannot run this model's attention: {}", req,
                          q.request == R::Fused ? "cuDNN's fused attention" : "the own flash kernel",
                          why),
              kRequestHint);
}

AttentionBackendQuery attention_backend_query(Device device, DType dtype, int64_t head_dim,
                                              double dropout_p) {
  AttentionBackendQuery q;
  q.device = device, q.dtype = dtype, q.head_dim = head_dim, q.dropout_p = dropout_p;
  static const bool forced = std::getenv("MCPP_ATTENTION_FALLBACK") != nullptr;
  q.fallback_forced = forced;
  q.request = attention_request();
#ifdef MCPP_HAVE_CUDA
  if (device == Device::CUDA) q.cudnn_available = cuda::cudnn_attention_enabled();
#endif
  return q;
}

// Which layers take the document-mask path, and what it is on this device ("" for none).
std::string masked_layers(Device device, int64_t num_layers, int64_t window_layers,
                          bool documents) {
  if (window_layers == 0 && !documents) return "";
  const std::string who =
      documents ? fmt::format("all {} layers (--reset-attention-mask)", num_layers)
                : fmt::format("{} of the {} layers (--window-size)", window_layers, num_layers);
  if (device == Device::CPU)
    return fmt::format("; {}: the same kernel, the scores before each row's first key masked",
                       who);
  return fmt::format("; {}: the document-mask kernels instead (own mma.sync flash kernels "
                     "that skip the key tiles before each query tile's first key)",
                     who);
}

std::string describe_attention_backend(Device device, DType dtype, int64_t head_dim,
                                       double dropout_p, int64_t num_layers,
                                       int64_t window_layers, bool documents) {
  const AttentionBackendChoice c =
      choose_attention_backend(attention_backend_query(device, dtype, head_dim, dropout_p));
  std::string family;  // which of the own flash kernels' two families runs
#ifdef MCPP_HAVE_CUDA
  if (c.backend == AttentionBackend::Flash)
    family = cuda::flash_attention_uses_wgmma()
                 ? "; Hopper wgmma kernels"
                 : "; mma.sync kernels (the wgmma ones need an sm_90a build on a "
                   "compute-capability-9.0 GPU, and MCPP_FLASH_WGMMA not 0)";
#endif
  return fmt::format("attention (all {} layers, head dim {}, dropout {}): {}{}{}{}", num_layers,
                     head_dim, dropout_p, c.reason, family,
                     c.slow() ? " -- several times slower than the tensor-core kernels" : "",
                     masked_layers(device, num_layers, window_layers, documents));
}

}  // namespace mcpp::ops
