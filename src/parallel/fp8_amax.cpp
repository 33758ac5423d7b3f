#include "parallel/fp8_amax.h"

#include "comm/communicator.h"
#include "model/fp8/fp8_linear.h"
#include "ops/ops.h"

namespace mcpp::parallel {

void fp8_reduce_amaxes_and_update_scales(model::GPTModel& model, const ParallelState& ps,
                                         Stream& s) {
  const model::TransformerConfig& c = model.config();
  if (!c.fp8.delayed()) return;
  const std::vector<Tensor> hist = model::fp8_histories(model.params());
  if (hist.empty()) return;
  const int64_t K = hist[0].size(1);
  // Row 0 of every history into one buffer: one all-reduce per group.
  Tensor flat = Tensor::empty({int64_t(hist.size()) * K}, DType::F32, hist[0].device());
  for (size_t i = 0; i < hist.size(); ++i) {
    Tensor dst = flat.narrow(int64_t(i) * K, K);
    ops::copy(hist[i].narrow(0, 1).view({K}), dst, s);
  }
  if (ps.tp().size() > 1) ps.tp().all_reduce(flat, comm::ReduceOp::Max, s);
  if (ps.dp_cp().size() > 1) ps.dp_cp().all_reduce(flat, comm::ReduceOp::Max, s);
  for (size_t i = 0; i < hist.size(); ++i) {
    Tensor dst = hist[i].narrow(0, 1).view({K});
    ops::copy(flat.narrow(int64_t(i) * K, K), dst, s);
  }
  model::fp8_update_scales(c, model.params(), s);
}

}  // namespace mcpp::parallel
