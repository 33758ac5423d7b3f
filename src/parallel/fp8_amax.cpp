#include "parallel/fp8_amax.h"

#include "comm/communicator.h"
#include "model/fp8/fp8_linear.h"
#include "ops/ops.h"

namespace mcpp::parallel {

namespace {

// Row 0 of every history in `hist` max-reduced over the groups, in one buffer (one
// all-reduce per group).
void reduce_row0(const std::vector<Tensor>& hist, std::initializer_list<comm::Communicator*> groups,
                 Stream& s) {
  if (hist.empty()) return;
  const int64_t K = hist[0].size(1);
  Tensor flat = Tensor::empty({int64_t(hist.size()) * K}, DType::F32, hist[0].device());
  for (size_t i = 0; i < hist.size(); ++i) {
    Tensor dst = flat.narrow(int64_t(i) * K, K);
    ops::copy(hist[i].narrow(0, 1).view({K}), dst, s);
  }
  for (comm::Communicator* g : groups)
    if (g && g->size() > 1) g->all_reduce(flat, comm::ReduceOp::Max, s);
  for (size_t i = 0; i < hist.size(); ++i) {
    Tensor dst = hist[i].narrow(0, 1).view({K});
    ops::copy(flat.narrow(int64_t(i) * K, K), dst, s);
  }
}

}  // namespace

void fp8_reduce_amaxes_and_update_scales(model::GPTModel& model, const ParallelState& ps,
                                         Stream& s) {
  const model::TransformerConfig& c = model.config();
  if (!c.fp8.delayed()) return;
  reduce_row0(model::fp8_histories(model.params(), false), {&ps.tp(), &ps.dp_cp()}, s);
  // The routed experts' GEMMs: over the ranks that hold the same expert (its ETP shards and
  // its expert-data-parallel replicas), each expert's amaxes apart from every other's.
  const std::vector<Tensor> experts = model::fp8_histories(model.params(), true);
  if (!experts.empty()) reduce_row0(experts, {&ps.group(Group::ExpertTP), &ps.expert_dp()}, s);
  model::fp8_update_scales(c, model.params(), s);
}

}  // namespace mcpp::parallel
