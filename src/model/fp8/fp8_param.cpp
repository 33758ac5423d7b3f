#include "model/fp8/fp8_param.h"

#include <string>
#include <unordered_map>

#include "model/fp8/fp8_linear.h"

namespace mcpp::model {

namespace {

// One entry per ParamStore with --fp8-param-gather (a process trains one model; tests may
// build several): the layers find their FP8 weight here at each GEMM.
std::unordered_map<const ParamStore*, const Fp8ParamWeights*>& attached() {
  static std::unordered_map<const ParamStore*, const Fp8ParamWeights*> m;
  return m;
}

}  // namespace

void attach_fp8_param_weights(const ParamStore* store, const Fp8ParamWeights* w) {
  if (w)
    attached()[store] = w;
  else
    attached().erase(store);
}

const Fp8ParamWeight* find_fp8_param_weight(const ParamStore* store, const std::string& weight) {
  if (!store) return nullptr;
  auto it = attached().find(store);
  return it == attached().end() ? nullptr : it->second->find(weight);
}

bool is_fp8_weight(const TransformerConfig& c, const ParamInfo& p) {
  if (p.layer < 0 || p.expert >= 0 || !c.fp8.layer_in_fp8(p.layer, c.num_layers)) return false;
  // The layer's FP8 linears (fp8_linear_prefixes), its shared experts' aside: they cast
  // their own weights.
  for (const std::string& prefix : fp8_linear_prefixes(c, p.layer))
    if (prefix.find(".shared_experts.") == std::string::npos && p.name == prefix + ".weight")
      return true;
  return false;
}

}  // namespace mcpp::model
