#include "training/mtp_step.h"

#include <algorithm>

#include "parallel/host_collectives.h"
#include "training/forward_backward.h"

namespace mcpp::training {

std::vector<std::pair<std::string, double>> mtp_finish_global_batch(
    model::GPTModel& m, const parallel::ParallelState& ps) {
  const int64_t D = m.config().mtp_num_layers;
  if (D == 0) return {};
  model::MtpStats& st = m.mtp_stats();
  std::vector<double> v(size_t(D), 0.0);
  for (size_t k = 0; k < size_t(D) && k < st.losses.size(); ++k) {
    const size_t M = st.losses[k].size();
    for (size_t j = 0; j < M; ++j) {
      const double n = st.tokens[k][j];
      if (n > 0) v[k] += st.losses[k][j].value() / n;  // an empty mask counts 0 (Megatron)
    }
    if (M > 0) v[k] /= double(M);
    st.losses[k].clear(), st.tokens[k].clear();  // the next global batch starts counting
  }
  // The last stage holds the depths: summed over the pipeline, so that whichever rank prints
  // the log line has them, then averaged over DP.
  if (ps.layout().pp() > 1) parallel::sum_over(ps.pp(), v);
  parallel::sum_over(data_cp_group(ps), v);
  std::vector<std::pair<std::string, double>> out;
  for (size_t k = 0; k < size_t(D); ++k)
    out.push_back({"mtp_" + std::to_string(k + 1) + " loss", v[k] / double(ps.layout().dp())});
  return out;
}

}  // namespace mcpp::training
