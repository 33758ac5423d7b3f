#include "checkpoint/hf_rope.h"

#include <cmath>
#include <optional>
#include <vector>

#include "base/error.h"

namespace mcpp::checkpoint::hf_rope {

using json = nlohmann::json;

namespace {

// The frequency change a config.json states: Llama 3.x scaling, or linear interpolation.
struct Scaling {
  bool llama3 = false;  // rope_type "llama3": the four values below
  double factor = 0, low = 0, high = 0;
  int64_t original = 0;
  double linear = 1;  // rope_type "linear": the positions' divisor (factor)
  bool operator==(const Scaling&) const = default;
};

}  // namespace

void rope_from_hf(const json& j, const std::string& type, double dflt,
                  model::TransformerConfig& c) {
  constexpr const char* kCheck = "check config.json";
  auto positive = [&](const json& v, const std::string& field) {
    MCPP_CHECK_HINT(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0, kCheck,
                    "Hugging Face config.json ({}): '{}' is {}, expected a positive number", type,
                    field, v.dump());
    return v.get<double>();
  };
  // The sets of RoPE parameters, each with the field that holds it: rope_scaling (4.x) and
  // rope_parameters (5.x: one object, or one per layer type).
  std::vector<std::pair<std::string, json>> sets;
  if (const json rs = j.value("rope_scaling", json()); !rs.is_null())
    sets.emplace_back("rope_scaling", rs);
  if (const json rp = j.value("rope_parameters", json()); !rp.is_null()) {
    MCPP_CHECK_HINT(rp.is_object(), kCheck,
                    "Hugging Face config.json ({}): rope_parameters {} is not an object", type,
                    rp.dump());
    if (rp.contains("rope_type") || rp.contains("rope_theta"))
      sets.emplace_back("rope_parameters", rp);
    else
      for (const auto& [k, v] : rp.items()) sets.emplace_back("rope_parameters." + k, v);
  }
  double theta = dflt;
  bool theta_given = false;
  if (j.contains("rope_theta") && !j["rope_theta"].is_null())
    theta = positive(j["rope_theta"], "rope_theta"), theta_given = true;
  std::optional<Scaling> scaling;
  std::string scaling_field;  // the first set, which the others must agree with
  for (const auto& [field, s] : sets) {
    MCPP_CHECK_HINT(s.is_object(), kCheck, "Hugging Face config.json ({}): {} {} is not an object",
                    type, field, s.dump());
    // transformers before 4.43 wrote the rope type as "type".
    const json rt_json =
        s.contains("rope_type") ? s["rope_type"] : s.value("type", json("default"));
    MCPP_CHECK_HINT(rt_json.is_string(), kCheck,
                    "Hugging Face config.json ({}): {}.rope_type is {}, expected a string", type,
                    field, rt_json.dump());
    const std::string rt = rt_json.get<std::string>();
    MCPP_CHECK_HINT(rt == "default" || rt == "llama3" || rt == "linear",
                    "megatron.cpp implements plain RoPE ('default'), Llama 3.x scaling "
                    "('llama3') and linear position interpolation ('linear'); dynamic, yarn, "
                    "longrope and the others are not implemented",
                    "Hugging Face config.json ({}) has {}.rope_type '{}'", type, field, rt);
    std::optional<Scaling> here;
    if (rt == "linear") {  // inv_freq / factor: --rotary-seq-len-interpolation-factor
      MCPP_CHECK_HINT(s.contains("factor") && !s["factor"].is_null(),
                      "check config.json: linear interpolation has a factor",
                      "Hugging Face config.json ({}): {} (rope_type 'linear') lacks 'factor'", type,
                      field);
      Scaling sc;
      sc.linear = positive(s["factor"], field + ".factor");
      here = sc;
    } else if (rt == "llama3") {
      auto need = [&](const char* k) -> const json& {
        MCPP_CHECK_HINT(s.contains(k) && !s[k].is_null(),
                        "check config.json: Llama 3.x's scaling has factor, low_freq_factor, "
                        "high_freq_factor and original_max_position_embeddings",
                        "Hugging Face config.json ({}): {} (rope_type 'llama3') lacks '{}'", type,
                        field, k);
        return s[k];
      };
      Scaling sc;
      sc.llama3 = true;
      sc.factor = positive(need("factor"), field + ".factor");
      sc.low = positive(need("low_freq_factor"), field + ".low_freq_factor");
      sc.high = positive(need("high_freq_factor"), field + ".high_freq_factor");
      const json& om = need("original_max_position_embeddings");
      MCPP_CHECK_HINT(om.is_number_integer() && om.get<int64_t>() >= 1 &&
                          om.get<int64_t>() < (int64_t(1) << 31),
                      kCheck,
                      "Hugging Face config.json ({}): '{}.original_max_position_embeddings' is "
                      "{}, expected a positive integer",
                      type, field, om.dump());
      sc.original = om.get<int64_t>();
      MCPP_CHECK_HINT(sc.low < sc.high, kCheck,
                      "Hugging Face config.json ({}): {}.low_freq_factor {} is not below "
                      "high_freq_factor {}",
                      type, field, sc.low, sc.high);
      here = sc;
    }
    if (scaling_field.empty()) {
      scaling = here, scaling_field = field;
    } else {
      MCPP_CHECK_HINT(here == scaling, kCheck,
                      "Hugging Face config.json ({}): {} and {} disagree on the RoPE scaling", type,
                      scaling_field, field);
    }
    if (!s.contains("rope_theta")) continue;
    const double t = positive(s["rope_theta"], field + ".rope_theta");
    MCPP_CHECK_HINT(!theta_given || t == theta, kCheck,
                    "Hugging Face config.json ({}): rope theta {} and {} disagree", type, theta, t);
    theta = t, theta_given = true;
  }
  c.rotary_base = theta;
  c.rope_scaling = scaling && scaling->llama3;
  if (c.rope_scaling) {
    c.rope_scaling_factor = scaling->factor;
    c.rope_low_freq_factor = scaling->low, c.rope_high_freq_factor = scaling->high;
    c.rope_original_max_positions = scaling->original;
  }
  c.seq_len_interpolation_factor = scaling ? scaling->linear : 1.0;
}

void rope_to_hf(const model::TransformerConfig& c, bool parameters, json& j) {
  const bool linear = c.seq_len_interpolation_factor != 1.0;
  // Megatron applies both (Llama 3.x's rescaled frequencies, then the positions divided);
  // transformers computes one rope type per model, and neither llama3 nor linear is the other.
  MCPP_CHECK_HINT(!(c.rope_scaling && linear),
                  "Hugging Face's rope_scaling holds one rope type, and none of transformers' "
                  "applies both; keep this model in megatron.cpp's format (megatron generate "
                  "and serve load it), or export one trained with only one of the two",
                  "cannot write a Hugging Face config.json for this model: it has both Llama "
                  "3.x RoPE scaling (--use-rope-scaling, factor {}) and linear position "
                  "interpolation (--rotary-seq-len-interpolation-factor {})",
                  c.rope_scaling_factor, c.seq_len_interpolation_factor);
  j["rope_theta"] = c.rotary_base;
  if (!c.rope_scaling && !linear) {
    j["rope_scaling"] = nullptr;
    if (parameters)
      j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rotary_base}};
    return;
  }
  json s = linear ? json{{"rope_type", "linear"}, {"factor", c.seq_len_interpolation_factor}}
                  : json{{"rope_type", "llama3"},
                         {"factor", c.rope_scaling_factor},
                         {"low_freq_factor", c.rope_low_freq_factor},
                         {"high_freq_factor", c.rope_high_freq_factor},
                         {"original_max_position_embeddings", c.rope_original_max_positions}};
  j["rope_scaling"] = s;
  s["rope_theta"] = c.rotary_base;
  j["rope_parameters"] = s;
}

}  // namespace mcpp::checkpoint::hf_rope
