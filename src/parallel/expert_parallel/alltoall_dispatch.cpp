#include "parallel/expert_parallel/alltoall_dispatch.h"

#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::parallel::expert_parallel {
namespace {

// An i64 tensor with v on s's device (the counts exchange and the sort indices).
Tensor i64_on(const std::vector<int64_t>& v, Stream& s) {
  Tensor h = Tensor::from(v, {int64_t(v.size())});
  if (s.device == Device::CPU) return h;
  Tensor d = Tensor::empty(h.shape(), DType::I64, s.device);
  ops::copy(h, d, s);
  return d;
}

std::vector<int64_t> to_host_i64(const Tensor& t, Stream& s) {
  Tensor h = t;
  if (t.device() != Device::CPU) {
    h = Tensor::empty(t.shape(), DType::I64);
    ops::copy(t, h, s);  // device -> host synchronises: the split sizes are needed here
  }
  const int64_t* p = h.data<int64_t>();
  return std::vector<int64_t>(p, p + h.numel());
}

Shape rows_shape(const Tensor& like, int64_t rows) {
  Shape sh = like.shape();
  sh[0] = rows;
  return sh;
}

void check_rows(const Tensor& t, int64_t rows, const char* what) {
  MCPP_CHECK(t.dim() >= 1 && t.size(0) == rows,
             "all-to-all token dispatch: {} {} must have {} rows (the plan's)", what, t.str(), rows);
}

// Source-major (the exchange's order) -> expert-major rows, or back.
void resort(const Tensor& x, Tensor& y, const Tensor& index, Stream& s) {
  if (x.size(0) == 0) return;
  ops::gather_rows(x, index, y, s);
}

// Rows in global-expert order, to the ranks owning the experts, re-sorted by local expert.
void to_experts(const Tensor& x, Tensor& y, const AlltoallPlan& p, comm::Communicator* group,
                Stream& s) {
  check_rows(x, p.rows_in, "input");
  check_rows(y, p.rows_out, "output");
  if (p.ep == 1) {
    if (x.raw() != y.raw() && x.numel() > 0) ops::copy(x, y, s);
    return;
  }
  if (p.local_experts == 1) return group->all_to_allv(x, p.input_splits, y, p.output_splits, s);
  Tensor tmp = Tensor::empty(rows_shape(y, p.rows_out), y.dtype(), y.device());
  group->all_to_allv(x, p.input_splits, tmp, p.output_splits, s);
  resort(tmp, y, p.sort_index, s);
}

// The adjoint (and inverse) of to_experts: un-sort, then every row back to its source.
void to_sources(const Tensor& y, Tensor& x, const AlltoallPlan& p, comm::Communicator* group,
                Stream& s) {
  check_rows(y, p.rows_out, "input");
  check_rows(x, p.rows_in, "output");
  if (p.ep == 1) {
    if (x.raw() != y.raw() && y.numel() > 0) ops::copy(y, x, s);
    return;
  }
  if (p.local_experts == 1) return group->all_to_allv(y, p.output_splits, x, p.input_splits, s);
  Tensor tmp = Tensor::empty(rows_shape(y, p.rows_out), y.dtype(), y.device());
  resort(y, tmp, p.unsort_index, s);
  group->all_to_allv(tmp, p.output_splits, x, p.input_splits, s);
}

}  // namespace

AlltoallPlan plan_alltoall(std::span<const int64_t> counts, comm::Communicator* group, Stream& s) {
  AlltoallPlan p;
  p.ep = group ? group->size() : 1;
  p.rank = group ? group->rank() : 0;
  const int64_t E = int64_t(counts.size());
  MCPP_CHECK(E % p.ep == 0, "all-to-all token dispatch: {} experts over {} EP ranks", E, p.ep);
  const int64_t El = E / p.ep;
  p.local_experts = El;
  for (int64_t c : counts) {
    MCPP_CHECK(c >= 0, "all-to-all token dispatch: negative row count {}", c);
    p.rows_in += c;
  }
  p.input_splits.assign(size_t(p.ep), 0);
  for (int64_t e = 0; e < E; ++e) p.input_splits[size_t(e / El)] += counts[size_t(e)];

  // Step 1: every rank learns how many rows each source sends to each of its experts.
  if (p.ep == 1) {
    p.recv_counts.assign(counts.begin(), counts.end());
  } else {
    Tensor mine = i64_on(std::vector<int64_t>(counts.begin(), counts.end()), s);
    Tensor theirs = Tensor::empty({E}, DType::I64, s.device);
    group->all_to_all(mine, theirs, s);  // block j (rank j's experts) goes to rank j
    p.recv_counts = to_host_i64(theirs, s);
  }
  p.output_splits.assign(size_t(p.ep), 0);
  p.tokens_per_local_expert.assign(size_t(El), 0);
  for (int src = 0; src < p.ep; ++src)
    for (int64_t j = 0; j < El; ++j) {
      const int64_t c = p.recv_counts[size_t(src * El + j)];
      p.output_splits[size_t(src)] += c;
      p.tokens_per_local_expert[size_t(j)] += c;
    }
  for (int64_t c : p.output_splits) p.rows_out += c;

  // Step 4's permutation: [source][local expert] -> [local expert][source].
  if (p.ep > 1 && El > 1) {
    std::vector<int64_t> start(size_t(p.ep * El));  // source-major offset of each block
    int64_t o = 0;
    for (int64_t b = 0; b < p.ep * El; ++b) start[size_t(b)] = o, o += p.recv_counts[size_t(b)];
    std::vector<int64_t> sort, unsort(size_t(p.rows_out));
    sort.reserve(size_t(p.rows_out));
    for (int64_t j = 0; j < El; ++j)
      for (int src = 0; src < p.ep; ++src) {
        const int64_t b = src * El + j;
        for (int64_t i = 0; i < p.recv_counts[size_t(b)]; ++i) {
          unsort[size_t(start[size_t(b)] + i)] = int64_t(sort.size());
          sort.push_back(start[size_t(b)] + i);
        }
      }
    p.sort_index = i64_on(sort, s);
    p.unsort_index = i64_on(unsort, s);
  }
  return p;
}

void dispatch_alltoall(const Tensor& xp, Tensor& y, const AlltoallPlan& p,
                       comm::Communicator* group, Stream& s) {
  to_experts(xp, y, p, group, s);
}

void dispatch_alltoall_backward(const Tensor& dy, Tensor& dxp, const AlltoallPlan& p,
                                comm::Communicator* group, Stream& s) {
  to_sources(dy, dxp, p, group, s);
}

void combine_alltoall(const Tensor& y, Tensor& yp, const AlltoallPlan& p,
                      comm::Communicator* group, Stream& s) {
  to_sources(y, yp, p, group, s);
}

void combine_alltoall_backward(const Tensor& dyp, Tensor& dy, const AlltoallPlan& p,
                               comm::Communicator* group, Stream& s) {
  to_experts(dyp, dy, p, group, s);
}

}  // namespace mcpp::parallel::expert_parallel
