// Included once, by ops/cuda/cudnn_attention.cpp, inside its anonymous namespace (after the
// cuDNN headers and with MCPP_HAVE_CUDNN): the cuDNN backend API plumbing (errors,
// descriptors, a graph builder) and the two attention graphs, forward and backward, that
// cudnn_attention.cpp turns into execution plans. Kept apart so the plan cache, the chunked
// backward and the dispatch read on their own.
#pragma once

// ---- backend API plumbing ------------------------------------------------------------
struct CudnnError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string last_error() {
  char buf[1024] = {0};
  cudnnGetLastErrorString(buf, sizeof buf);
  return buf;
}

void ck(cudnnStatus_t st, const char* what) {
  if (st != CUDNN_STATUS_SUCCESS) {
    std::string le = last_error();
    throw CudnnError(fmt::format("{} -> {}{}{}", what, cudnnGetErrorString(st),
                                 le.empty() ? "" : ": ", le));
  }
}
#define MCPP_CUDNN(expr) ck((expr), #expr)

// One backend descriptor, destroyed with the object.
class Desc {
 public:
  explicit Desc(cudnnBackendDescriptorType_t type) {
    MCPP_CUDNN(cudnnBackendCreateDescriptor(type, &d_));
  }
  ~Desc() {
    if (d_) cudnnBackendDestroyDescriptor(d_);
  }
  Desc(const Desc&) = delete;
  Desc& operator=(const Desc&) = delete;
  cudnnBackendDescriptor_t get() const { return d_; }
  void set(cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, int64_t count,
           const void* v) {
    ck(cudnnBackendSetAttribute(d_, n, t, count, v), "cudnnBackendSetAttribute");
  }
  template <typename V>
  void set1(cudnnBackendAttributeName_t n, cudnnBackendAttributeType_t t, V v) {
    set(n, t, 1, &v);
  }
  void finalize(const char* what) { ck(cudnnBackendFinalize(d_), what); }

 private:
  cudnnBackendDescriptor_t d_ = nullptr;
};
using DescPtr = std::shared_ptr<Desc>;
using Dims = std::array<int64_t, 4>;
using Raw = cudnnBackendDescriptor_t;

Dims packed(const Dims& d) { return {d[1] * d[2] * d[3], d[2] * d[3], d[3], 1}; }

// Fixed unique ids of the tensors that cross the API (the variant pack maps them to
// pointers); virtual tensors are numbered from kFirstVirtual.
enum Uid : int64_t {
  kQ = 1, kK, kV, kO, kStats, kScale, kNegInf, kOne, kDO, kDQ, kDK, kDV, kSoftmaxSum, kDQAccum,
  kFirstVirtual = 100
};

// Builds an operation graph; owns every descriptor it creates.
class Graph {
 public:
  explicit Graph(cudnnDataType_t io) : io_(io) {}
  cudnnDataType_t io() const { return io_; }

  Raw tensor(int64_t uid, const Dims& dims, const Dims& strides, cudnnDataType_t dt,
             bool is_virtual = false, bool by_value = false) {
    auto t = make(CUDNN_BACKEND_TENSOR_DESCRIPTOR);
    t->set1(CUDNN_ATTR_TENSOR_DATA_TYPE, CUDNN_TYPE_DATA_TYPE, dt);
    t->set(CUDNN_ATTR_TENSOR_DIMENSIONS, CUDNN_TYPE_INT64, 4, dims.data());
    t->set(CUDNN_ATTR_TENSOR_STRIDES, CUDNN_TYPE_INT64, 4, strides.data());
    t->set1(CUDNN_ATTR_TENSOR_UNIQUE_ID, CUDNN_TYPE_INT64, uid);
    t->set1(CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT, CUDNN_TYPE_INT64, int64_t(16));
    t->set1(CUDNN_ATTR_TENSOR_IS_VIRTUAL, CUDNN_TYPE_BOOLEAN, is_virtual);
    if (by_value) t->set1(CUDNN_ATTR_TENSOR_IS_BY_VALUE, CUDNN_TYPE_BOOLEAN, true);
    t->finalize("tensor descriptor");
    return t->get();
  }
  Raw virt(const Dims& dims, const Dims& strides, cudnnDataType_t dt = CUDNN_DATA_FLOAT) {
    return tensor(next_uid_++, dims, strides, dt, true);
  }
  Raw scalar(int64_t uid) {
    const Dims one{1, 1, 1, 1};
    return tensor(uid, one, one, CUDNN_DATA_FLOAT, false, true);
  }

  // y = mode(x[, b[, t]]); for BINARY_SELECT y = t ? x : b.
  void pointwise(cudnnPointwiseMode_t mode, Raw x, Raw b, Raw y, Raw t = nullptr,
                 cudnnDataType_t prec = CUDNN_DATA_FLOAT, int64_t axis = -1) {
    auto pw = make(CUDNN_BACKEND_POINTWISE_DESCRIPTOR);
    pw->set1(CUDNN_ATTR_POINTWISE_MODE, CUDNN_TYPE_POINTWISE_MODE, mode);
    pw->set1(CUDNN_ATTR_POINTWISE_MATH_PREC, CUDNN_TYPE_DATA_TYPE, prec);
    if (axis >= 0) pw->set1(CUDNN_ATTR_POINTWISE_AXIS, CUDNN_TYPE_INT64, axis);
    pw->finalize("pointwise descriptor");
    auto op = make(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
    op->set1(CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR, CUDNN_TYPE_BACKEND_DESCRIPTOR,
             pw->get());
    op->set1(CUDNN_ATTR_OPERATION_POINTWISE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x);
    if (b) op->set1(CUDNN_ATTR_OPERATION_POINTWISE_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b);
    op->set1(CUDNN_ATTR_OPERATION_POINTWISE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y);
    if (t) op->set1(CUDNN_ATTR_OPERATION_POINTWISE_TDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, t);
    op->finalize("pointwise operation");
    ops_.push_back(op->get());
  }
  void reduction(cudnnReduceTensorOp_t mode, Raw x, Raw y) {
    auto rd = make(CUDNN_BACKEND_REDUCTION_DESCRIPTOR);
    rd->set1(CUDNN_ATTR_REDUCTION_OPERATOR, CUDNN_TYPE_REDUCTION_OPERATOR_TYPE, mode);
    rd->set1(CUDNN_ATTR_REDUCTION_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT);
    rd->finalize("reduction descriptor");
    auto op = make(CUDNN_BACKEND_OPERATION_REDUCTION_DESCRIPTOR);
    op->set1(CUDNN_ATTR_OPERATION_REDUCTION_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x);
    op->set1(CUDNN_ATTR_OPERATION_REDUCTION_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y);
    op->set1(CUDNN_ATTR_OPERATION_REDUCTION_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, rd->get());
    op->finalize("reduction operation");
    ops_.push_back(op->get());
  }
  // c[.., M, N] = a[.., M, K] b[.., K, N], batch dims broadcast (GQA: b has fewer heads).
  void matmul(Raw a, Raw b, Raw c) {
    auto md = make(CUDNN_BACKEND_MATMUL_DESCRIPTOR);
    md->set1(CUDNN_ATTR_MATMUL_COMP_TYPE, CUDNN_TYPE_DATA_TYPE, CUDNN_DATA_FLOAT);
    md->finalize("matmul descriptor");
    auto op = make(CUDNN_BACKEND_OPERATION_MATMUL_DESCRIPTOR);
    op->set1(CUDNN_ATTR_OPERATION_MATMUL_ADESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, a);
    op->set1(CUDNN_ATTR_OPERATION_MATMUL_BDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, b);
    op->set1(CUDNN_ATTR_OPERATION_MATMUL_CDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, c);
    op->set1(CUDNN_ATTR_OPERATION_MATMUL_DESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, md->get());
    op->finalize("matmul operation");
    ops_.push_back(op->get());
  }
  // y: x's elements under y's dims/strides (a transposed view).
  void reshape(Raw x, Raw y) {
    auto op = make(CUDNN_BACKEND_OPERATION_RESHAPE_DESCRIPTOR);
    op->set1(CUDNN_ATTR_OPERATION_RESHAPE_XDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, x);
    op->set1(CUDNN_ATTR_OPERATION_RESHAPE_YDESC, CUDNN_TYPE_BACKEND_DESCRIPTOR, y);
    op->finalize("reshape operation");
    ops_.push_back(op->get());
  }
  // The causal mask of Megatron (top-left aligned, query row q sees keys 0..q).
  Raw causal(Raw s, const Dims& sd) {
    const Dims ss = packed(sd);
    Raw row = virt(sd, ss, CUDNN_DATA_INT32), col = virt(sd, ss, CUDNN_DATA_INT32);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, row, nullptr, CUDNN_DATA_INT32, 2);
    pointwise(CUDNN_POINTWISE_GEN_INDEX, s, nullptr, col, nullptr, CUDNN_DATA_INT32, 3);
    Raw keep = virt(sd, ss, CUDNN_DATA_BOOLEAN);
    pointwise(CUDNN_POINTWISE_CMP_GE, row, col, keep, nullptr, CUDNN_DATA_BOOLEAN);
    Raw out = virt(sd, ss);
    pointwise(CUDNN_POINTWISE_BINARY_SELECT, s, scalar_neg_inf(), out, keep);
    return out;
  }
  Raw scalar_neg_inf() {
    if (!neg_inf_) neg_inf_ = scalar(kNegInf);
    return neg_inf_;
  }

  const std::vector<Raw>& ops() const { return ops_; }
  std::vector<DescPtr>& owned() { return owned_; }

 private:
  DescPtr make(cudnnBackendDescriptorType_t type) {
    owned_.push_back(std::make_shared<Desc>(type));
    return owned_.back();
  }
  cudnnDataType_t io_;
  int64_t next_uid_ = kFirstVirtual;
  Raw neg_inf_ = nullptr;
  std::vector<Raw> ops_;
  std::vector<DescPtr> owned_;
};

// The tensors of one attention call as cuDNN sees them (file comment).
struct Layout {
  int64_t Bp, QPG, S, Skv, HD;
  Dims q_dims, q_strides;    // Q, dQ (into qkv / dqkv)
  Dims kt_dims, kt_strides;  // K^T and V^T (backend matmuls take the transposed operand)
  Dims kv_dims, kv_strides;  // K, V, dK, dV
  Dims o_dims, o_strides;    // O, dO
  Dims stat_dims, stat_strides;  // Stats [.., S, 1], rows d.lse_stride() apart
  Dims s_dims;               // scores [.., S, Skv]
  Dims kvh_dims;             // dK, dV per query head [.., QPG, Skv, HD] (GQA's head sum)
  // d.B sequences of d.NG groups in a batch of `b_mem` (>= d.B) sequences of `ng_mem`
  // (>= d.NG) groups in memory: the row stride is that of the whole batch (a chunk of the
  // backward, see sdpa_backward). The group stride does not depend on either, so a chunk of
  // groups of one sequence is again [d.NG, QPG, S, HD] at a pointer offset. A rectangular
  // context-parallel block has Skv = d.kv_rows() key/value rows (the same row stride).
  Layout(const AttentionDims& d, int64_t b_mem, int64_t ng_mem) {
    QPG = d.NH / d.NG, Bp = d.B * d.NG, S = d.S, Skv = d.kv_rows(), HD = d.HD;
    const int64_t gstride = (QPG + 2) * HD, srow = b_mem * ng_mem * gstride;
    const int64_t ld = d.lse_stride();
    q_dims = {Bp, QPG, S, HD}, q_strides = {gstride, HD, srow, 1};
    kt_dims = {Bp, 1, HD, Skv}, kt_strides = {gstride, HD, 1, srow};
    kv_dims = {Bp, 1, Skv, HD}, kv_strides = {gstride, HD, srow, 1};
    o_dims = {Bp, QPG, S, HD}, o_strides = {QPG * HD, HD, b_mem * ng_mem * QPG * HD, 1};
    stat_dims = {Bp, QPG, S, 1}, stat_strides = {QPG * ld, ld, 1, 1};
    s_dims = {Bp, QPG, S, Skv};
    kvh_dims = {Bp, QPG, Skv, HD};
  }
  // The scores' transpose [.., Skv, S] as a view of the packed [.., S, Skv].
  Dims st_dims() const { return {Bp, QPG, Skv, S}; }
  Dims s_transposed() const { return {QPG * S * Skv, S * Skv, 1, Skv}; }
};

// causal false: no mask (a context-parallel block against an earlier key chunk).
void build_forward(Graph& g, const Layout& L, bool causal = true) {
  const cudnnDataType_t io = g.io();
  Raw Q = g.tensor(kQ, L.q_dims, L.q_strides, io);
  Raw KT = g.tensor(kK, L.kt_dims, L.kt_strides, io);
  Raw V = g.tensor(kV, L.kv_dims, L.kv_strides, io);
  Raw O = g.tensor(kO, L.o_dims, L.o_strides, io);
  Raw stats = g.tensor(kStats, L.stat_dims, L.stat_strides, CUDNN_DATA_FLOAT);
  Raw scale = g.scalar(kScale);
  const Dims sd = L.s_dims, ss = packed(sd), rd = L.stat_dims, rs = packed(rd);
  Raw s = g.virt(sd, ss);
  g.matmul(Q, KT, s);
  Raw s_scaled = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, s_scaled);
  Raw s_masked = causal ? g.causal(s_scaled, sd) : s_scaled;
  Raw mx = g.virt(rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_MAX, s_masked, mx);
  Raw centred = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, s_masked, mx, centred);
  Raw e = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, centred, nullptr, e);
  Raw z = g.virt(rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, e, z);
  Raw logz = g.virt(rd, rs);
  g.pointwise(CUDNN_POINTWISE_LOG, z, nullptr, logz);
  g.pointwise(CUDNN_POINTWISE_ADD, mx, logz, stats);
  Raw p = g.virt(sd, ss, io);  // the second matmul takes P in the I/O type
  g.pointwise(CUDNN_POINTWISE_DIV, e, z, p);
  g.matmul(p, V, O);
}

// Graph shapes that cuDNN versions have recognised for the backward pattern: whether the
// row sum D = rowsum(dO * O) is a buffer we provide (newer releases) or virtual, and
// whether the causal mask goes before or after subtracting Stats.
struct BwdVariant {
  bool softmax_sum_buffer;
  bool mask_after_stats;
  const char* name;
};
constexpr BwdVariant kBwdVariants[] = {{true, true, "D buffered, mask after Stats"},
                                       {false, false, "D virtual, mask before Stats"}};

void build_backward(Graph& g, const Layout& L, const BwdVariant& v, bool deterministic,
                    bool causal = true) {
  const cudnnDataType_t io = g.io();
  Raw Q = g.tensor(kQ, L.q_dims, L.q_strides, io);
  Raw KT = g.tensor(kK, L.kt_dims, L.kt_strides, io);
  Raw VT = g.tensor(kV, L.kt_dims, L.kt_strides, io);
  Raw O = g.tensor(kO, L.o_dims, L.o_strides, io);
  Raw dO = g.tensor(kDO, L.o_dims, L.o_strides, io);
  Raw stats = g.tensor(kStats, L.stat_dims, L.stat_strides, CUDNN_DATA_FLOAT);
  Raw dQ = g.tensor(kDQ, L.q_dims, L.q_strides, io);
  Raw dK = g.tensor(kDK, L.kv_dims, L.kv_strides, io);
  Raw dV = g.tensor(kDV, L.kv_dims, L.kv_strides, io);
  Raw scale = g.scalar(kScale), one = g.scalar(kOne);
  const Dims sd = L.s_dims, ss = packed(sd), rd = L.stat_dims, rs = packed(rd);
  const Dims hd_dims = L.q_dims, hd_packed = packed(hd_dims);

  // D = rowsum(dO * O)
  Raw dOO = g.virt(hd_dims, hd_packed);
  g.pointwise(CUDNN_POINTWISE_MUL, dO, O, dOO);
  Raw dsum = g.virt(rd, rs);
  g.reduction(CUDNN_REDUCE_TENSOR_ADD, dOO, dsum);
  Raw D = v.softmax_sum_buffer ? g.tensor(kSoftmaxSum, rd, rs, CUDNN_DATA_FLOAT) : g.virt(rd, rs);
  g.pointwise(CUDNN_POINTWISE_MUL, dsum, one, D);  // (x 1/(1-p) of dropout: 1 here)

  // P = exp(mask(Q K^T * scale) - Stats)
  Raw s = g.virt(sd, ss);
  g.matmul(Q, KT, s);
  Raw s_scaled = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, s, scale, s_scaled);
  Raw pre = !causal || v.mask_after_stats ? s_scaled : g.causal(s_scaled, sd);
  Raw centred = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, pre, stats, centred);
  Raw post = causal && v.mask_after_stats ? g.causal(centred, sd) : centred;
  Raw P = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_EXP, post, nullptr, P);

  // dV = P^T dO (summed over the query heads of a group under GQA)
  Raw PT = g.virt(L.st_dims(), L.s_transposed(), io);
  g.reshape(P, PT);
  auto head_sum = [&](Raw a, Raw b, Raw out) {
    if (L.QPG == 1) return g.matmul(a, b, out);
    Raw full = g.virt(L.kvh_dims, packed(L.kvh_dims), io);
    g.matmul(a, b, full);
    g.reduction(CUDNN_REDUCE_TENSOR_ADD, full, out);
  };
  head_sum(PT, dO, dV);

  // dS = P * (dO V^T - D) * scale
  Raw dP = g.virt(sd, ss);
  g.matmul(dO, VT, dP);
  Raw dP1 = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, dP, one, dP1);  // (dropout mask: none)
  Raw dP2 = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_SUB, dP1, D, dP2);
  Raw dP3 = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, dP2, P, dP3);
  Raw dS = g.virt(sd, ss);
  g.pointwise(CUDNN_POINTWISE_MUL, dP3, scale, dS);

  // dK = dS^T Q (summed over the group's query heads), dQ = dS K
  Raw dST = g.virt(L.st_dims(), L.s_transposed(), io);
  g.reshape(dS, dST);
  head_sum(dST, Q, dK);
  Raw K = g.virt(L.kv_dims, L.kv_strides);  // (virtual, so f32 like cuDNN's frontend makes it)
  g.reshape(KT, K);
  if (deterministic) {
    g.matmul(dS, K, dQ);  // no f32 accumulator: cuDNN's ordered dP-workspace path
  } else {
    Raw acc = g.tensor(kDQAccum, L.q_dims, packed(L.q_dims), CUDNN_DATA_FLOAT);
    g.matmul(dS, K, acc);
    g.pointwise(CUDNN_POINTWISE_IDENTITY, acc, nullptr, dQ);
  }
}
