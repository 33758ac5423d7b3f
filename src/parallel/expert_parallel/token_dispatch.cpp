#include "parallel/expert_parallel/token_dispatch.h"

#include "ops/ops.h"

namespace mcpp::parallel::expert_parallel {
namespace {

void copy_or_alias(const Tensor& x, Tensor& y, Stream& s) {
  if (x.raw() != y.raw()) ops::copy(x, y, s);
}

}  // namespace

void dispatch(const Tensor& x, Tensor& y, comm::Communicator* group, Stream& s) {
  if (!group || group->size() == 1) return copy_or_alias(x, y, s);
  group->all_gather(x, y, s);
}

void dispatch_backward(const Tensor& dy, Tensor& dx, comm::Communicator* group, Stream& s) {
  if (!group || group->size() == 1) return copy_or_alias(dy, dx, s);
  group->reduce_scatter(dy, dx, s);
}

void combine(const Tensor& y, Tensor& out, comm::Communicator* group, Stream& s) {
  if (!group || group->size() == 1) return copy_or_alias(y, out, s);
  group->reduce_scatter(y, out, s);
}

void combine_backward(const Tensor& dout, Tensor& dy, comm::Communicator* group, Stream& s) {
  if (!group || group->size() == 1) return copy_or_alias(dout, dy, s);
  group->all_gather(dout, dy, s);
}

}  // namespace mcpp::parallel::expert_parallel
