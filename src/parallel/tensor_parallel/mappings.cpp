// Region transitions (see mappings.h). The last-dim gather/scatter reuse the dim-0
// collectives through a transpose: the columns of y [rows, TP*n] are the rows of
// y^T [TP*n, rows], which is exactly an all-gather of the ranks' x^T [n, rows].
#include "parallel/tensor_parallel/mappings.h"

#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::parallel {

namespace {

Tensor as_2d(const Tensor& t) {
  const int64_t n = t.size(t.dim() - 1);
  return t.view({t.numel() / n, n});
}

void check_rows(const Tensor& full, const Tensor& part, int tp, const char* what) {
  MCPP_CHECK(full.dim() >= 1 && part.dim() == full.dim() && full.size(0) == part.size(0) * tp &&
                 full.numel() == part.numel() * tp,
             "{}: expected [{}*n, ...] and [n, ...] with the same trailing dims, got {} and {}",
             what, tp, full.str(), part.str());
}

}  // namespace

void copy_to_tp_backward(Tensor& dx, comm::Communicator& tp, Stream& s) {
  if (tp.size() > 1) tp.all_reduce(dx, comm::ReduceOp::Sum, s);
}

void reduce_from_tp(Tensor& x, comm::Communicator& tp, Stream& s) {
  if (tp.size() > 1) tp.all_reduce(x, comm::ReduceOp::Sum, s);
}

void max_from_tp(Tensor& x, comm::Communicator& tp, Stream& s) {
  if (tp.size() > 1) tp.all_reduce(x, comm::ReduceOp::Max, s);
}

void gather_from_tp(const Tensor& x, Tensor& y, comm::Communicator& tp, Stream& s) {
  const int P = tp.size();
  Tensor x2 = as_2d(x), y2 = as_2d(y);
  const int64_t rows = x2.size(0), n = x2.size(1);
  MCPP_CHECK(y2.size(0) == rows && y2.size(1) == n * P,
             "gather_from_tp: x {} and y {} are not [rows, n] and [rows, {}*n]", x.str(), y.str(),
             P);
  if (P == 1) {
    ops::copy(x, y, s);
    return;
  }
  Tensor xt = Tensor::empty({n, rows}, x.dtype(), x.device());
  Tensor yt = Tensor::empty({P * n, rows}, x.dtype(), x.device());
  ops::transpose(x2, xt, s);
  tp.all_gather(xt, yt, s);
  ops::transpose(yt, y2, s);
}

void scatter_to_tp(const Tensor& x, Tensor& y, comm::Communicator& tp, Stream& s) {
  const int P = tp.size();
  Tensor x2 = as_2d(x), y2 = as_2d(y);
  const int64_t rows = y2.size(0), n = y2.size(1);
  MCPP_CHECK(x2.size(0) == rows && x2.size(1) == n * P,
             "scatter_to_tp: x {} and y {} are not [rows, {}*n] and [rows, n]", x.str(), y.str(),
             P);
  if (P == 1) {
    ops::copy(x, y, s);
    return;
  }
  Tensor xt = Tensor::empty({P * n, rows}, x.dtype(), x.device());
  ops::transpose(x2, xt, s);
  ops::transpose(xt.narrow(tp.rank() * n, n), y2, s);
}

void gather_from_tp_backward(const Tensor& dy, Tensor& dx, comm::Communicator& tp, Stream& s) {
  scatter_to_tp(dy, dx, tp, s);
}

void scatter_to_tp_backward(const Tensor& dy, Tensor& dx, comm::Communicator& tp, Stream& s) {
  gather_from_tp(dy, dx, tp, s);
}

void gather_from_sp(const Tensor& x, Tensor& y, comm::Communicator& tp, Stream& s) {
  check_rows(y, x, tp.size(), "gather_from_sp");
  if (tp.size() == 1) ops::copy(x, y, s);
  else tp.all_gather(x, y, s);
}

void reduce_scatter_to_sp(const Tensor& x, Tensor& y, comm::Communicator& tp, Stream& s) {
  check_rows(x, y, tp.size(), "reduce_scatter_to_sp");
  if (tp.size() == 1) ops::copy(x, y, s);
  else tp.reduce_scatter(x, y, s);
}

void gather_from_sp_backward(const Tensor& dy, Tensor& dx, comm::Communicator& tp, Stream& s) {
  reduce_scatter_to_sp(dy, dx, tp, s);
}

void reduce_scatter_to_sp_backward(const Tensor& dy, Tensor& dx, comm::Communicator& tp,
                                   Stream& s) {
  gather_from_sp(dy, dx, tp, s);
}

}  // namespace mcpp::parallel
