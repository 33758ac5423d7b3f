// Helpers shared by the MoE tests and drivers.
#pragma once
#include <vector>

#include "model/gpt_model.h"
#include "model/moe/moe_layer.h"

namespace mcpp::test {

// The MoE layers of the model's first (only) chunk, in layer order; dense layers skipped.
inline std::vector<model::moe::MoeLayer*> moe_layers(model::GPTModel& m) {
  std::vector<model::moe::MoeLayer*> out;
  auto& b = m.stage().block(0);
  for (int i = 0; i < b.size(); ++i)
    if (auto* l = dynamic_cast<model::moe::MoeLayer*>(&b.layer(i).mlp())) out.push_back(l);
  return out;
}

}  // namespace mcpp::test
