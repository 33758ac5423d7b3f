// cuDNN fused attention through the backend graph API (cudnn_graph.h); see
// cudnn_attention.h for the contract. cuDNN recognises scaled-dot-product attention as a
// pattern of primitive operations (two matmuls around a scale, a causal mask, a softmax
// that also writes its row statistics) and runs it as one flash-attention kernel; the
// backward is the matching pattern of the FlashAttention-2 gradient. The graphs below
// spell those patterns out operation by operation:
//
//   forward   S = (Q K^T) * scale;  S = row >= col ? S : -inf;  M = rowmax S;
//             E = exp(S - M);  Z = rowsum E;  Stats = M + log Z;  O = (E / Z) V
//   backward  D = rowsum(dO * O);  P = exp(mask(Q K^T * scale) - Stats);  dV = P^T dO;
//             dS = P * (dO V^T - D) * scale;  dK = dS^T Q;  dQ = dS K
//
// Layout: Q of head h = g*QPG + j sits at qkv[s, b, g, j, :], K at qkv[s, b, g, QPG, :],
// V at qkv[s, b, g, QPG+1, :] (QPG = NH/NG). With batch index b' = b*NG + g every offset is
// affine, so cuDNN sees Q [B*NG, QPG, S, HD] and K, V [B*NG, 1, S, HD] with strides into
// qkv (no copies), i.e. grouped-query attention with one key/value head per "batch"; out
// [S, B, NH*HD] is O [B*NG, QPG, S, HD] and lse [B, NH, S] is Stats [B*NG, QPG, S, 1].
#include "ops/cuda/cudnn_attention.h"

#include <array>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <tuple>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "ops/attention_backend.h"
#include "ops/cuda/device.h"
#include "tensor/tensor.h"

#if defined(MCPP_HAVE_CUDNN)
#include <cudnn_graph.h>
#endif

namespace mcpp::ops::cuda {

namespace {

std::mutex g_mu;  // guards the stats, the plan cache and the handle's stream
CudnnAttentionStats g_stats;

bool env_is(const char* name, const char* value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::strcmp(v, value) == 0;
}

std::string shape_str(const FlashArgs& a) {
  std::string kv = a.d.kv_rows() != a.d.S ? fmt::format(" S_kv={}", a.d.kv_rows()) : "";
  return fmt::format("{} S={}{} B={} NH={} NG={} HD={}", dtype_name(a.dtype), a.d.S, kv, a.d.B,
                     a.d.NH, a.d.NG, a.d.HD);
}

}  // namespace

bool cudnn_attention_applies(DType dt, int64_t head_dim, double dropout_p) {
  return dropout_p == 0.0 && cudnn_attention_takes(dt, head_dim);
}

CudnnAttentionStats cudnn_attention_stats() {
  std::lock_guard<std::mutex> lk(g_mu);
  return g_stats;
}

#if !defined(MCPP_HAVE_CUDNN)

bool cudnn_attention_built() { return false; }
std::string cudnn_attention_status() {
  return "no cuDNN in this build (the own flash kernel runs)";
}
bool cudnn_attention_enabled() {
  static const bool once = [] {
    log::info(
        "attention: this build has no cuDNN, the own flash-attention kernel runs. HINT: "
        "configure with -DMCPP_CUDNN_ROOT=<cuDNN folder> (scripts/gpu-check.sh finds PyTorch's)");
    return false;
  }();
  return once;
}
bool cudnn_attention_forward(const FlashArgs&, void*, float*, cudaStream_t) { return false; }
bool cudnn_attention_backward(const FlashArgs&, const void*, const void*, const float*, void*,
                              cudaStream_t, int) {
  return false;
}
int64_t set_cudnn_attention_bwd_workspace_cap(int64_t) { return 0; }
bool cudnn_block_forward(const FlashArgs&, const void*, bool, void*, float*, cudaStream_t) {
  return false;
}
bool cudnn_block_backward(const FlashArgs&, const void*, bool, const void*, const void*,
                          const float*, void*, void*, cudaStream_t) {
  return false;
}
bool cudnn_block_supported(const FlashArgs&, bool) { return false; }

#else  // MCPP_HAVE_CUDNN

namespace {

#include "ops/cuda/cudnn_graph.h"

// ---- plans ---------------------------------------------------------------------------
struct Plan {
  std::vector<DescPtr> owned;  // the graph's descriptors, alive as long as the plan
  DescPtr plan;
  int64_t workspace = 0, engine = -1;
  bool softmax_sum_buffer = false, dq_accum = false;
  bool noted_nondeterministic = false;  // the engine carries cuDNN's NONDETERMINISTIC note
  std::string variant;
};

struct Key {
  bool backward, deterministic;
  DType dtype;
  int64_t S, B, NH, NG, HD;
  int64_t b_mem;  // the batch of the memory layout (B, or more for a batch chunk)
  bool causal = true;  // false: a context-parallel block against an earlier key chunk
  int64_t ng_mem = 0;  // the groups of the memory layout (NG, or more for a group chunk)
  int64_t S_kv = 0, lse_ld = 0;  // a rectangular block's key rows and lse row stride
  auto tie() const {
    return std::tie(backward, deterministic, dtype, S, B, NH, NG, HD, b_mem, causal, ng_mem,
                    S_kv, lse_ld);
  }
  bool operator<(const Key& o) const { return tie() < o.tie(); }
};

struct State {
  bool enabled = false;
  bool deterministic = true;
  std::string status;
  cudnnHandle_t handle = nullptr;
  std::map<Key, std::shared_ptr<Plan>> plans;  // nullptr: cuDNN rejected the shape
};

std::string version_str(size_t v) {
  return fmt::format("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100);
}

State& state() {
  static State* st = [] {
    auto* s = new State;
    s->deterministic = !env_is("MCPP_ATTENTION_DETERMINISTIC", "0");
    const size_t v = cudnnGetVersion();
    int dev = 0;
    cudaDeviceProp prop{};
    if (env_is("MCPP_ATTENTION_CUDNN", "0")) {
      s->status = "cuDNN attention disabled by MCPP_ATTENTION_CUDNN=0";
    } else if (std::getenv("MCPP_ATTENTION_FALLBACK") != nullptr) {
      s->status = "MCPP_ATTENTION_FALLBACK forces the CUDA-core kernel";
    } else if (v < 90000) {
      s->status = fmt::format("cuDNN {} is older than 9.0", version_str(v));
    } else if (cudaGetDevice(&dev) != cudaSuccess ||
               cudaGetDeviceProperties(&prop, dev) != cudaSuccess || prop.major < 8) {
      s->status = fmt::format("device compute capability {}.{} < 8.0", prop.major, prop.minor);
    } else if (cudnnStatus_t cs = cudnnCreate(&s->handle); cs != CUDNN_STATUS_SUCCESS) {
      s->status = fmt::format("cudnnCreate failed: {} {}", cudnnGetErrorString(cs), last_error());
      s->handle = nullptr;
    } else {
      s->enabled = true;
      s->status = fmt::format("cuDNN {} fused SDPA through the graph API ({} backward)",
                              version_str(v),
                              s->deterministic ? "deterministic" : "atomic, nondeterministic");
    }
    if (s->enabled)
      log::info("attention: {}; shapes cuDNN rejects fall back to the own flash kernel",
                s->status);
    else
      log::info("attention: not using cuDNN ({}); the own flash-attention kernel runs. HINT: "
                "MCPP_ATTENTION_CUDNN=0 silences this, a cuDNN >= 9 folder in "
                "-DMCPP_CUDNN_ROOT enables it", s->status);
    return s;
  }();
  return *st;
}

bool nondeterministic(Raw cfg) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  Raw e = engine.get();
  int64_t n = 0;
  MCPP_CUDNN(cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE,
                                      CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e));
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  int64_t count = 0;
  MCPP_CUDNN(cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_NUMERICAL_NOTE,
                                      CUDNN_TYPE_NUMERICAL_NOTE, CUDNN_NUMERICAL_NOTE_TYPE_COUNT,
                                      &count, notes));
  for (int64_t i = 0; i < count; ++i)
    if (notes[i] == CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC) return true;
  return false;
}

int64_t engine_index(Raw cfg) {
  Desc engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR);
  Raw e = engine.get();
  int64_t n = 0, idx = -1;
  if (cudnnBackendGetAttribute(cfg, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1,
                               &n, &e) != CUDNN_STATUS_SUCCESS)
    return -1;
  cudnnBackendGetAttribute(e, CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &idx);
  return idx;
}

// Finalizes the graph and the first engine configuration (heuristics order) that cuDNN
// accepts. Throws CudnnError with the reasons when none does.
void make_plan(Graph& g, cudnnHandle_t handle, bool deterministic, Plan& out) {
  auto og = std::make_shared<Desc>(CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR);
  og->set(CUDNN_ATTR_OPERATIONGRAPH_OPS, CUDNN_TYPE_BACKEND_DESCRIPTOR, int64_t(g.ops().size()),
          g.ops().data());
  og->set1(CUDNN_ATTR_OPERATIONGRAPH_HANDLE, CUDNN_TYPE_HANDLE, handle);
  og->finalize("operation graph (cuDNN does not recognise the attention pattern)");
  g.owned().push_back(og);
  std::string reasons;
  for (cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    Desc heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR);
    Raw ogr = og->get();
    heur.set1(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH, CUDNN_TYPE_BACKEND_DESCRIPTOR, ogr);
    heur.set1(CUDNN_ATTR_ENGINEHEUR_MODE, CUDNN_TYPE_HEUR_MODE, mode);
    try {
      heur.finalize("engine heuristics");
    } catch (const CudnnError& e) {
      reasons += std::string(" [") + e.what() + "]";
      continue;
    }
    int64_t n = 0;
    MCPP_CUDNN(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                        CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &n, nullptr));
    std::vector<DescPtr> cfgs;
    std::vector<Raw> raw;
    for (int64_t i = 0; i < n; ++i) {
      cfgs.push_back(std::make_shared<Desc>(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR));
      raw.push_back(cfgs.back()->get());
    }
    int64_t got = 0;
    if (n > 0)
      MCPP_CUDNN(cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS,
                                          CUDNN_TYPE_BACKEND_DESCRIPTOR, n, &got, raw.data()));
    if (got == 0) reasons += " [no engine configuration for this graph]";
    // Deterministic graphs prefer engines without cuDNN's NONDETERMINISTIC note; should
    // every engine carry it, the first is taken and the plan says so (the structure of the
    // graph, not the note, selects cuDNN's ordered dQ path; tests check the bits).
    for (int pass = 0; pass < (deterministic ? 2 : 1); ++pass) {
      int skipped = 0;
      for (int64_t i = 0; i < got; ++i) {
        try {
          const bool noted = nondeterministic(raw[i]);
          if (deterministic && pass == 0 && noted) {
            ++skipped;
            continue;
          }
          auto plan = std::make_shared<Desc>(CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR);
          plan->set1(CUDNN_ATTR_EXECUTION_PLAN_HANDLE, CUDNN_TYPE_HANDLE, handle);
          plan->set1(CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG, CUDNN_TYPE_BACKEND_DESCRIPTOR,
                     raw[i]);
          plan->finalize("execution plan");
          int64_t ws = 0, cnt = 0;
          MCPP_CUDNN(cudnnBackendGetAttribute(plan->get(),
                                              CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                              CUDNN_TYPE_INT64, 1, &cnt, &ws));
          out.engine = engine_index(raw[i]);
          out.workspace = ws;
          out.noted_nondeterministic = noted;
          out.plan = plan;
          g.owned().push_back(cfgs[i]);
          out.owned = std::move(g.owned());
          return;
        } catch (const CudnnError& e) {
          if (reasons.size() < 800) reasons += std::string(" [") + e.what() + "]";
        }
      }
      if (skipped == 0) break;
    }
  }
  throw CudnnError("no engine configuration finalizes:" + reasons);
}

// The cached plan for `k`, built on first use; nullptr when cuDNN rejects the shape.
std::shared_ptr<Plan> plan_for(State& st, const Key& k, const FlashArgs& a) {
  auto it = st.plans.find(k);
  if (it != st.plans.end()) return it->second;
  const cudnnDataType_t io = a.dtype == DType::BF16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_HALF;
  const Layout L(a.d, k.b_mem, k.ng_mem);
  std::shared_ptr<Plan> plan;
  std::string why;
  const int nvariants = k.backward ? int(std::size(kBwdVariants)) : 1;
  for (int vi = 0; vi < nvariants && !plan; ++vi) {
    try {
      Graph g(io);
      auto p = std::make_shared<Plan>();
      if (k.backward) {
        const BwdVariant& v = kBwdVariants[vi];
        build_backward(g, L, v, k.deterministic, k.causal);
        p->softmax_sum_buffer = v.softmax_sum_buffer, p->dq_accum = !k.deterministic;
        p->variant = v.name;
      } else {
        build_forward(g, L, k.causal);
        p->variant = k.causal ? "forward" : "forward, no mask";
      }
      make_plan(g, st.handle, k.deterministic, *p);
      plan = p;
    } catch (const CudnnError& e) {
      why += (why.empty() ? "" : " | ") + std::string(e.what());
    }
  }
  const char* dir = k.backward ? "backward" : "forward";
  if (plan) {
    log::info("attention: cuDNN {} plan for {}{}: engine {}{}, workspace {:.1f} MB, graph: {}",
              dir, shape_str(a), k.causal ? "" : " (non-causal block)", plan->engine,
              plan->noted_nondeterministic ? " (noted nondeterministic)" : "",
              plan->workspace / 1048576.0, plan->variant);
    ++g_stats.plans;
  } else {
    const bool rect = k.S_kv != k.S || k.lse_ld != k.S;
    log::warn("attention: cuDNN rejected the {} graph for {} ({}); {}. HINT: "
              "CUDNN_LOGLEVEL_DBG=2 CUDNN_LOGDEST_DBG=stderr prints cuDNN's reasons; "
              "MCPP_ATTENTION_CUDNN=0 turns cuDNN off",
              dir, shape_str(a), why,
              rect ? "the context-parallel ring runs square chunk blocks instead"
                   : "the own flash kernel runs for this shape");
    ++g_stats.rejected;
  }
  st.plans.emplace(k, plan);
  return plan;
}

void execute(State& st, const Plan& p, const std::vector<int64_t>& uids,
             const std::vector<void*>& ptrs, cudaStream_t cs) {
  Tensor ws;  // cuDNN's workspace, stream-ordered like every temporary
  if (p.workspace > 0) ws = Tensor::empty({p.workspace}, DType::U8, Device::CUDA);
  void* wsp = p.workspace > 0 ? ws.raw() : nullptr;
  Desc vp(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR);
  vp.set(CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, int64_t(uids.size()), uids.data());
  vp.set(CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, int64_t(ptrs.size()),
         ptrs.data());
  vp.set1(CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, wsp);
  vp.finalize("variant pack");
  MCPP_CUDNN(cudnnSetStream(st.handle, cs));
  MCPP_CUDNN(cudnnBackendExecute(st.handle, p.plan->get(), vp.get()));
}

}  // namespace

bool cudnn_attention_built() { return true; }

bool cudnn_attention_enabled() { return state().enabled; }

std::string cudnn_attention_status() { return state().status; }

namespace {
// One attention call on cuDNN: queries from a.qkv, keys and values from kv (the same
// tensor for self-attention), causal or not; see cudnn_attention.h.
bool sdpa_forward(const FlashArgs& a, const void* kv, bool causal, void* out, float* lse,
                  cudaStream_t cs) {
  State& st = state();
  if (!st.enabled || !cudnn_attention_applies(a.dtype, a.d.HD, 0.0)) return false;
  std::lock_guard<std::mutex> lk(g_mu);
  MCPP_CHECK(!causal || a.d.kv_rows() == a.d.S,
             "attention_block_forward: a causal block of {} query and {} key rows", a.d.S,
             a.d.kv_rows());
  Key k{false, false, a.dtype, a.d.S, a.d.B, a.d.NH, a.d.NG, a.d.HD, a.d.B};
  k.causal = causal, k.ng_mem = a.d.NG, k.S_kv = a.d.kv_rows(), k.lse_ld = a.d.lse_stride();
  std::shared_ptr<Plan> p = plan_for(st, k, a);
  if (!p) return false;
  const size_t es = 2;  // bf16 / f16
  const int64_t QPG = a.d.NH / a.d.NG;
  char* base = static_cast<char*>(const_cast<void*>(a.qkv));
  char* kvb = static_cast<char*>(const_cast<void*>(kv));
  float scale = float(a.softmax_scale), neg_inf = std::numeric_limits<float>::lowest();
  std::vector<int64_t> uids{kQ, kK, kV, kO, kStats, kScale};
  std::vector<void*> ptrs{base, kvb + QPG * a.d.HD * es, kvb + (QPG + 1) * a.d.HD * es, out, lse,
                          &scale};
  if (causal) uids.push_back(kNegInf), ptrs.push_back(&neg_inf);  // only the mask uses it
  try {
    execute(st, *p, uids, ptrs, cs);
  } catch (const CudnnError& e) {
    MCPP_FAIL("attention_forward: cuDNN execution failed for {}: {}", shape_str(a), e.what());
  }
  ++g_stats.forward_calls;
  return true;
}
}  // namespace

bool cudnn_attention_forward(const FlashArgs& a, void* out, float* lse, cudaStream_t cs) {
  return sdpa_forward(a, a.qkv, true, out, lse, cs);
}

bool cudnn_block_forward(const FlashArgs& a, const void* kv, bool causal, void* out, float* lse,
                         cudaStream_t cs) {
  return sdpa_forward(a, kv, causal, out, lse, cs);
}

// The deterministic backward keeps dP for every (sequence, head) in cuDNN's workspace,
// B*NH*S*S*2 bytes (1.5 GB for GPT-2 124M at micro-batch 64, 4.3 GB for the Llama-style
// 1B at 16, 64 GiB for one sequence of the 1B at 32K): when that exceeds a cap (default
// 8 GB, MCPP_ATTENTION_BWD_WORKSPACE_MB) the batch runs in chunks of sequences whose
// workspace fits it, and a sequence that alone is over the cap in chunks of whole
// key/value groups (ops/types.h's attention_bwd_chunking), each chunk its own cuDNN call
// on strided views of the same tensors. Chunks cost speed (8 sequence chunks: 38-46%
// slower backward at the four benchmark shapes), so the default cap only stops extreme
// cases. Each (sequence, group) -- a K/V head with its query heads -- is computed alone
// by the same per-head math either way, so the result does not depend on the chunking
// (tests/cp/test_cp_gpu.cpp checks the bits).
namespace {
std::atomic<int64_t> g_bwd_cap{attention_bwd_workspace_cap_from_env()};

AttentionBwdChunk backward_chunk(const AttentionDims& d, bool deterministic) {
  if (!deterministic) return {d.B, d.NG};
  return attention_bwd_chunking(d.B, d.NH, d.NG, d.S, g_bwd_cap.load(), d.kv_rows());
}

// The memory plan predicts this workspace from ops/types.h's formula; a cuDNN that asks for
// more than predicted makes the plan (and its fit check) optimistic: say so once, naming
// the linked version. cuDNN 9.19 adds a few hundred bytes of its own to the dP buffer
// (256 at the GPT-2 124M shape); the plan's stated accuracy is a few MiB, so up to 1 MiB
// over the formula is not worth a warning. dc: the dims of one call.
void check_planned_workspace(const AttentionDims& dc, int64_t workspace) {
  static std::atomic<bool> warned{false};
  const int64_t planned =
      cudnn_attention_bwd_call_workspace_bytes(dc.B, dc.NH, dc.NG, dc.S, dc.HD, dc.kv_rows());
  constexpr int64_t kSlack = int64_t(1) << 20;
  if (workspace <= planned + kSlack || warned.exchange(true)) return;
  log::warn("attention: cuDNN {} asks for {} bytes of workspace for the deterministic backward "
            "of {} sequences (S {}, S_kv {}, {} heads, {} groups, head dim {}); the memory plan "
            "assumed {}. HINT: the start-up memory line and `megatron plan` underestimate this "
            "run by the difference; please report it with this line",
            version_str(cudnnGetVersion()), workspace, dc.B, dc.S, dc.kv_rows(), dc.NH, dc.NG,
            dc.HD, planned);
}

}  // namespace

int64_t set_cudnn_attention_bwd_workspace_cap(int64_t bytes) { return g_bwd_cap.exchange(bytes); }

namespace {
// dQ (=) into dq's query slots, dK and dV (=) into dkv's key/value slots (dq may be dkv).
bool sdpa_backward(const FlashArgs& a, const void* kv, bool causal, const void* dout,
                   const void* out, const float* lse, void* dq, void* dkv, cudaStream_t cs,
                   int deterministic) {
  State& st = state();
  if (!st.enabled || !cudnn_attention_applies(a.dtype, a.d.HD, 0.0)) return false;
  std::lock_guard<std::mutex> lk(g_mu);
  const bool det = deterministic < 0 ? st.deterministic : deterministic != 0;
  const AttentionBwdChunk c = backward_chunk(a.d, det);
  const int64_t QPG = a.d.NH / a.d.NG;
  FlashArgs ac = a;  // one call: c.seqs sequences of c.groups groups
  ac.d.B = c.seqs, ac.d.NG = c.groups, ac.d.NH = c.groups * QPG;
  MCPP_CHECK(!causal || a.d.kv_rows() == a.d.S,
             "attention_block_backward: a causal block of {} query and {} key rows", a.d.S,
             a.d.kv_rows());
  Key k{true, det, a.dtype, a.d.S, ac.d.B, ac.d.NH, ac.d.NG, a.d.HD, a.d.B};
  k.causal = causal, k.ng_mem = a.d.NG, k.S_kv = a.d.kv_rows(), k.lse_ld = a.d.lse_stride();
  std::shared_ptr<Plan> p = plan_for(st, k, ac);
  if (!p) return false;
  if (det) check_planned_workspace(ac.d, p->workspace);
  const size_t es = 2;
  const int64_t koff = QPG * a.d.HD * es, voff = koff + a.d.HD * es;
  const int64_t W = a.d.qkv_width(), OW = a.d.NH * a.d.HD, gstride = (QPG + 2) * a.d.HD;
  float scale = float(a.softmax_scale), neg_inf = std::numeric_limits<float>::lowest(), one = 1.f;
  // Buffers the graph keeps outside cuDNN's workspace: D [Bc*NHc*S] f32 and, on the atomic
  // path, the f32 dQ accumulator (zeroed: cuDNN adds into it).
  Tensor extra;
  const int64_t rows = ac.d.B * ac.d.NH * a.d.S, sum_bytes = (rows * 4 + 255) / 256 * 256;
  const int64_t acc_bytes = p->dq_accum ? rows * a.d.HD * 4 : 0;
  if (p->softmax_sum_buffer || p->dq_accum)
    extra = Tensor::empty({sum_bytes + acc_bytes}, DType::U8, Device::CUDA);
  for (int64_t b0 = 0; b0 < a.d.B; b0 += c.seqs) {
    for (int64_t g0 = 0; g0 < a.d.NG; g0 += c.groups) {
      // Sequence b0 starts b0 rows of the batch into each [S, B, ...] tensor; group g0 is
      // g0 * (QPG + 2) heads into a qkv row and g0 * QPG heads into an out row.
      const int64_t in_off = (b0 * W + g0 * gstride) * int64_t(es);
      const int64_t o_off = (b0 * OW + g0 * QPG * a.d.HD) * int64_t(es);
      char* base = static_cast<char*>(const_cast<void*>(a.qkv)) + in_off;
      char* kvb = static_cast<char*>(const_cast<void*>(kv)) + in_off;
      char* dqb = static_cast<char*>(dq) + in_off;
      char* dkvb = static_cast<char*>(dkv) + in_off;
      char* o = static_cast<char*>(const_cast<void*>(out)) + o_off;
      char* dO = static_cast<char*>(const_cast<void*>(dout)) + o_off;
      float* l = const_cast<float*>(lse) + (b0 * a.d.NH + g0 * QPG) * a.d.lse_stride();
      std::vector<int64_t> uids{kQ, kK, kV, kO, kDO, kStats, kDQ, kDK, kDV, kScale, kOne};
      std::vector<void*> ptrs{base, kvb + koff, kvb + voff, o, dO, l, dqb, dkvb + koff,
                              dkvb + voff, &scale, &one};
      if (causal) uids.push_back(kNegInf), ptrs.push_back(&neg_inf);  // only the mask uses it
      if (extra.defined()) {
        char* e = static_cast<char*>(extra.raw());
        if (p->softmax_sum_buffer) uids.push_back(kSoftmaxSum), ptrs.push_back(e);
        if (p->dq_accum) {
          CUDA_CHECK(cudaMemsetAsync(e + sum_bytes, 0, size_t(acc_bytes), cs));
          uids.push_back(kDQAccum), ptrs.push_back(e + sum_bytes);
        }
      }
      try {
        execute(st, *p, uids, ptrs, cs);
      } catch (const CudnnError& e) {
        MCPP_FAIL("attention_backward: cuDNN execution failed for {}: {}", shape_str(a),
                  e.what());
      }
    }
  }
  ++g_stats.backward_calls;
  return true;
}
}  // namespace

bool cudnn_attention_backward(const FlashArgs& a, const void* dout, const void* out,
                              const float* lse, void* dqkv, cudaStream_t cs, int deterministic) {
  return sdpa_backward(a, a.qkv, true, dout, out, lse, dqkv, dqkv, cs, deterministic);
}

bool cudnn_block_backward(const FlashArgs& a, const void* kv, bool causal, const void* dout,
                          const void* out, const float* lse, void* dq, void* dkv,
                          cudaStream_t cs) {
  return sdpa_backward(a, kv, causal, dout, out, lse, dq, dkv, cs, -1);
}

bool cudnn_block_supported(const FlashArgs& a, bool causal) {
  State& st = state();
  if (!st.enabled || !cudnn_attention_applies(a.dtype, a.d.HD, 0.0)) return false;
  if (causal && a.d.kv_rows() != a.d.S) return false;
  std::lock_guard<std::mutex> lk(g_mu);
  Key f{false, false, a.dtype, a.d.S, a.d.B, a.d.NH, a.d.NG, a.d.HD, a.d.B};
  f.causal = causal, f.ng_mem = a.d.NG, f.S_kv = a.d.kv_rows(), f.lse_ld = a.d.lse_stride();
  if (!plan_for(st, f, a)) return false;
  // The backward's plan is that of one chunk of the call, as sdpa_backward builds it.
  const bool det = st.deterministic;
  const AttentionBwdChunk c = backward_chunk(a.d, det);
  FlashArgs ac = a;
  const int64_t QPG = a.d.NH / a.d.NG;
  ac.d.B = c.seqs, ac.d.NG = c.groups, ac.d.NH = c.groups * QPG;
  Key b{true, det, a.dtype, a.d.S, ac.d.B, ac.d.NH, ac.d.NG, a.d.HD, a.d.B};
  b.causal = causal, b.ng_mem = a.d.NG, b.S_kv = a.d.kv_rows(), b.lse_ld = a.d.lse_stride();
  return plan_for(st, b, ac) != nullptr;
}

#endif  // MCPP_HAVE_CUDNN

}  // namespace mcpp::ops::cuda
