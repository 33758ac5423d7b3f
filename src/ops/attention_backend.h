// Which kernel runs a training attention call (ops::attention_forward/backward), and why:
// a pure function of the call's kind, so the choice can be logged at start-up (a user sees
// a slow path before the first step) and unit-tested on the CPU. The CUDA dispatch
// (ops/cuda/attention.cu) routes by this same function, so the log line cannot disagree
// with what runs.
//
// Order on CUDA: (1) cuDNN's fused attention for bf16/f16, head dim a multiple of 8 up to
// 128, no attention dropout (cuDNN's dropout draws its own Philox stream and cannot draw
// our global-index mask); (2) the own tensor-core flash kernel for bf16/f16, head dim 64
// or 128, with or without dropout (in-kernel mask at global (b, h, q, k) coordinates);
// (3) the CUDA-core kernel for the rest (f32, other head dims), several times slower.
// When cuDNN rejects a shape at run time, (1) falls back to (2) or (3) with a warning.
//
// --attention-backend (Megatron's AttnBackend) picks one path instead of that order:
// `fused` = (1) cuDNN, `flash` = (2) the own flash kernel, `unfused` and `local` = (3) the
// CUDA-core kernel, `auto` = the order above (the default, identical to no flag). A request
// the call cannot honour (fused with dropout, flash with head dim 96, any non-auto value on
// the CPU backend, which has one kernel) is an error naming the flag, never a silent
// substitution. MCPP_ATTENTION_FALLBACK and MCPP_ATTENTION_CUDNN=0 stay as environment
// overrides for benchmarks and bisecting (docs/environment.md); they act like `unfused` and
// "cuDNN not available" under `auto`, and conflict with an explicit `fused` / `flash`.
#pragma once
#include <cstdint>
#include <cstdlib>
#include <string>

#include "tensor/tensor.h"

namespace mcpp::ops {

enum class AttentionBackend { Cpu, Cudnn, Flash, CudaCore };

// What --attention-backend asks for (Megatron's AttnBackend names).
enum class AttentionRequest { Auto, Fused, Flash, Unfused, Local };
// "auto", "fused", "flash", "unfused", "local" (also Megatron's "AttnBackend.flash" form);
// anything else is an error naming --attention-backend.
AttentionRequest parse_attention_request(const std::string& name);
const char* attention_request_name(AttentionRequest r);
// The request of this process (set once at start-up from --attention-backend, before the
// first attention call; Auto until then). The CUDA dispatch reads it on every call.
void set_attention_request(AttentionRequest r);
AttentionRequest attention_request();

struct AttentionBackendQuery {
  Device device = Device::CPU;
  DType dtype = DType::F32;
  int64_t head_dim = 0;
  double dropout_p = 0;
  bool cudnn_available = false;  // built with cuDNN, start-up probe passed, not disabled
  bool fallback_forced = false;  // MCPP_ATTENTION_FALLBACK set: the CUDA-core kernel
  AttentionRequest request = AttentionRequest::Auto;  // --attention-backend
};

struct AttentionBackendChoice {
  AttentionBackend backend = AttentionBackend::Cpu;
  std::string reason;  // one clause: what runs and why
  bool slow() const { return backend == AttentionBackend::CudaCore; }
};

// The shapes each tensor-core path takes (dtype, head dim); dropout is decided by
// choose_attention_backend.
bool cudnn_attention_takes(DType dt, int64_t head_dim);
// The CUDA-core kernel's head dims (32, 64, 128).
bool cuda_core_attention_takes(int64_t head_dim);
bool flash_attention_takes(DType dt, int64_t head_dim);

// The device memory of the own flash kernel's attention-dropout keep bits, from forward to
// backward (the model's layers) or between the backward's dK/dV and dQ kernels: a bit per
// causal score, each row's key tiles up to its own (flash_attention_dropout.cuh, FaMaskBuf),
// B * NH * 256 * nt * (nt + 1) bytes for B sequences of NH local heads, nt = ceil(S / 64)
// (about B NH S^2 / 16); used when S_global and k_offset are multiples of 8 (else 0 and
// every kernel draws).
inline int64_t flash_dropout_mask_bytes(int64_t B, int64_t NH, int64_t S) {
  const int64_t nt = (S + 63) / 64;
  return B * NH * 256 * nt * (nt + 1);
}

// The own flash backward's dS hand-over: its dK/dV kernel writes dS (2 bytes a causal score,
// whole 64 x 64 tiles: B * NH * 4096 * nt * (nt + 1) bytes, about B NH S^2) and its dQ
// kernel computes dQ = dS K from it instead of recomputing the scores, in chunks of
// sequences whose dS fits MCPP_ATTENTION_BWD_WORKSPACE_MB (ops/types.h), as cuDNN's dP
// workspace; where one sequence alone does not fit (or MCPP_FLASH_DQ_FROM_DS=0), the dQ
// kernel recomputes dS and no buffer is held.
inline int64_t flash_ds_bytes(int64_t B, int64_t NH, int64_t S) {
  const int64_t nt = (S + 63) / 64;
  return B * NH * 4096 * nt * (nt + 1);
}
inline bool flash_attention_ds_enabled() {
  const char* e = std::getenv("MCPP_FLASH_DQ_FROM_DS");
  return !(e && std::string(e) == "0");
}

// Throws mcpp::Error (naming --attention-backend, with a HINT) when q.request cannot be
// honoured for this call.
AttentionBackendChoice choose_attention_backend(const AttentionBackendQuery& q);

// The query of this process for a model's attention: cuDNN's start-up probe,
// MCPP_ATTENTION_FALLBACK and attention_request() read at run time (CUDA builds); then one
// log line such as
// "attention (all 12 layers): own flash kernel with dropout (...)". window_layers (of
// --window-size) and documents (--reset-attention-mask) add which layers take the
// document-mask path instead.
AttentionBackendQuery attention_backend_query(Device device, DType dtype, int64_t head_dim,
                                              double dropout_p);
std::string describe_attention_backend(Device device, DType dtype, int64_t head_dim,
                                       double dropout_p, int64_t num_layers,
                                       int64_t window_layers = 0, bool documents = false);
// That line's tail for the window layers and documents ("" for neither).
std::string masked_layers(Device device, int64_t num_layers, int64_t window_layers,
                          bool documents);

}  // namespace mcpp::ops
