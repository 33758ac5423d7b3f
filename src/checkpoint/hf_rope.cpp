#include "checkpoint/hf_rope.h"

#include <cmath>
#include <optional>
#include <vector>

#include "base/error.h"
#include "base/log.h"
#include "ops/rope_math.h"

namespace mcpp::checkpoint::hf_rope {

using json = nlohmann::json;

namespace {

constexpr const char* kCheck = "check config.json";

// The frequency change a config.json states: Llama 3.x scaling, linear interpolation or YaRN.
struct Scaling {
  bool llama3 = false;  // rope_type "llama3": the four values below
  double factor = 0, low = 0, high = 0;
  int64_t original = 0;
  double linear = 1;                    // rope_type "linear": the positions' divisor (factor)
  model::TransformerConfig::Yarn yarn;  // rope_type "yarn": yarn.on and its values
  bool operator==(const Scaling&) const = default;
};

double positive(const json& v, const std::string& type, const std::string& field) {
  MCPP_CHECK_HINT(v.is_number() && std::isfinite(v.get<double>()) && v.get<double>() > 0, kCheck,
                  "Hugging Face config.json ({}): '{}' is {}, expected a positive number", type,
                  field, v.dump());
  return v.get<double>();
}

int64_t positive_int(const json& v, const std::string& type, const std::string& field) {
  MCPP_CHECK_HINT(
      v.is_number_integer() && v.get<int64_t>() >= 1 && v.get<int64_t>() < (int64_t(1) << 31),
      kCheck, "Hugging Face config.json ({}): '{}' is {}, expected a positive integer", type, field,
      v.dump());
  return v.get<int64_t>();
}

bool given(const json& s, const char* k) { return s.contains(k) && !s[k].is_null(); }

// transformers' rope initialisers size the frequencies by head_dim * partial_rotary_factor
// (4.x read the factor at the top level, 5.x in the set), while the classes imported here
// (Llama, Mistral, Mixtral, Qwen2/3) rotate whole heads, as megatron.cpp's import does: any
// other value is an error naming the field, never a silently different model.
void check_whole_head(const json& j, const json& s, const std::string& type,
                      const std::string& field, const std::string& rt) {
  for (const auto& [where, v] : {std::pair{std::string("partial_rotary_factor"), &j},
                                 std::pair{field + ".partial_rotary_factor", &s}}) {
    if (!v->is_object() || !given(*v, "partial_rotary_factor")) continue;
    const json& p = (*v)["partial_rotary_factor"];
    MCPP_CHECK_HINT(p.is_number() && p.get<double>() == 1.0,
                    "the import rotates the whole head (--rotary-percent 1)",
                    "Hugging Face config.json ({}): '{}' is {} with rope_type '{}'", type, where,
                    p.dump(), rt);
  }
}

// Whether our concentration factor with (mscale, mscale_all_dim) is attention factor a, to
// rounding: the one test of every mscale pair below, so a kept pair always gives a.
bool concentration_is(double factor, double mscale, double mscale_all_dim, double a) {
  const double v = ops::yarn_concentration(factor, mscale, mscale_all_dim);
  return std::isfinite(v) && std::abs(v - a) <= 1e-12 * std::abs(a);
}

// rope_type "yarn" of set s (named `field`) into our Yarn, by the rules of transformers'
// _compute_yarn_parameters and standardize_rope_params (modeling_rope_utils.py), so that
// ops::yarn_inv_freq and ops::yarn_concentration give the numbers transformers computes.
// `max_positions` is the config's max_position_embeddings.
model::TransformerConfig::Yarn yarn_from_hf(const json& j, const json& s, const std::string& type,
                                            const std::string& field, int64_t max_positions) {
  auto name = [&](const char* k) { return field + "." + k; };
  model::TransformerConfig::Yarn y;
  y.on = true;
  MCPP_CHECK_HINT(given(s, "factor"), "check config.json: YaRN's scaling has a factor",
                  "Hugging Face config.json ({}): {} (rope_type 'yarn') lacks 'factor'", type,
                  field);
  y.factor = positive(s["factor"], type, name("factor"));
  // The original context: the set's, else max_position_embeddings. transformers 5 prefers a
  // top-level original_max_position_embeddings (Phi-3's place) where one object holds the
  // set; earlier releases, and 5's per-layer sets, ignore it: it must agree to be unambiguous.
  const bool own = given(s, "original_max_position_embeddings");
  y.original_max_positions = own ? positive_int(s["original_max_position_embeddings"], type,
                                                name("original_max_position_embeddings"))
                                 : max_positions;
  if (given(j, "original_max_position_embeddings")) {
    const int64_t top = positive_int(j["original_max_position_embeddings"], type,
                                     "original_max_position_embeddings");
    MCPP_CHECK_HINT(top == y.original_max_positions,
                    "check config.json: transformers releases differ in which of the two they "
                    "use",
                    "Hugging Face config.json ({}): 'original_max_position_embeddings' {} and "
                    "'{}' {} disagree",
                    type, top,
                    own ? name("original_max_position_embeddings") : "max_position_embeddings",
                    y.original_max_positions);
  }
  // beta_fast and beta_slow: absent, null or 0 is the default (transformers' `or`).
  auto beta = [&](const char* k, double dflt) {
    if (!given(s, k) || (s[k].is_number() && s[k].get<double>() == 0)) return dflt;
    return positive(s[k], type, name(k));
  };
  y.beta_fast = beta("beta_fast", 32), y.beta_slow = beta("beta_slow", 1);
  if (s.contains("truncate")) {  // absent: true; null would mean false to transformers
    MCPP_CHECK_HINT(s["truncate"].is_boolean(), kCheck,
                    "Hugging Face config.json ({}): '{}' is {}, expected true or false", type,
                    name("truncate"), s["truncate"].dump());
    y.round_to_int = s["truncate"].get<bool>();
    // transformers 5 reads truncate from rope_parameters' top level, never from a per-layer
    // set: it would truncate this set's range anyway, against what the file says.
    MCPP_CHECK_HINT(y.round_to_int || !field.starts_with("rope_parameters."),
                    "write rope_parameters as one object to turn truncation off",
                    "Hugging Face config.json ({}): {}.truncate is false, which transformers "
                    "ignores in a per-layer-type set",
                    type, field);
  }
  // The attention factor: attention_factor if given; else, where mscale and mscale_all_dim
  // are both non-zero, get_mscale(factor, mscale) / get_mscale(factor, mscale_all_dim);
  // else get_mscale(factor, 1). Ours is ops::yarn_concentration(factor, mscale, mscale_all_dim):
  // the file's own pair where it gives that number, else (1, 0), else mscale_all_dim 0 and
  // the mscale that gives it.
  auto number = [&](const char* k) -> std::optional<double> {
    if (!given(s, k)) return std::nullopt;
    MCPP_CHECK_HINT(s[k].is_number(), kCheck,
                    "Hugging Face config.json ({}): '{}' is {}, expected a number", type, name(k),
                    s[k].dump());
    return s[k].get<double>();
  };
  const std::optional<double> ms = number("mscale"), ms_all = number("mscale_all_dim");
  const bool both = ms && ms_all && *ms != 0 && *ms_all != 0;
  const bool af = given(s, "attention_factor");
  const double a = af     ? positive(s["attention_factor"], type, name("attention_factor"))
                   : both ? ops::yarn_concentration(y.factor, *ms, *ms_all)
                          : ops::yarn_concentration(y.factor, 1, 0);
  MCPP_CHECK_HINT(std::isfinite(a) && a > 0, kCheck,
                  "Hugging Face config.json ({}): {}.mscale {} and mscale_all_dim {} give the "
                  "attention factor {}, expected a positive number",
                  type, field, ms.value_or(1), ms_all.value_or(0), a);
  if (concentration_is(y.factor, ms.value_or(1), ms_all.value_or(0), a)) {
    y.mscale = ms.value_or(1), y.mscale_all_dim = ms_all.value_or(0);
  } else if (concentration_is(y.factor, 1, 0, a)) {
    y.mscale = 1, y.mscale_all_dim = 0;
  } else {  // only an explicit attention_factor gets here
    MCPP_CHECK_HINT(y.factor > 1, "YaRN's concentration factor is 1 at a factor of 1 or less",
                    "Hugging Face config.json ({}): '{}' is {} with factor {}", type,
                    name("attention_factor"), a, y.factor);
    y.mscale = (a - 1) / (0.1 * std::log(y.factor)), y.mscale_all_dim = 0;
    MCPP_CHECK_HINT(concentration_is(y.factor, y.mscale, 0, a), kCheck,
                    "Hugging Face config.json ({}): '{}' {} cannot be represented as --mscale "
                    "at factor {}",
                    type, name("attention_factor"), a, y.factor);
  }
  return y;
}

}  // namespace

void rope_from_hf(const json& j, const std::string& type, double dflt,
                  model::TransformerConfig& c) {
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
    theta = positive(j["rope_theta"], type, "rope_theta"), theta_given = true;
  if (sets.empty()) check_whole_head(j, json(), type, "rope_scaling", "default");
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
    check_whole_head(j, s, type, field, rt);
    MCPP_CHECK_HINT(rt == "default" || rt == "llama3" || rt == "linear" || rt == "yarn",
                    "megatron.cpp implements plain RoPE ('default'), Llama 3.x scaling "
                    "('llama3'), linear position interpolation ('linear') and YaRN ('yarn'); "
                    "dynamic, longrope and the others are not implemented",
                    "Hugging Face config.json ({}) has {}.rope_type '{}'", type, field, rt);
    std::optional<Scaling> here;
    if (rt == "linear") {  // inv_freq / factor: --rotary-seq-len-interpolation-factor
      MCPP_CHECK_HINT(given(s, "factor"), "check config.json: linear interpolation has a factor",
                      "Hugging Face config.json ({}): {} (rope_type 'linear') lacks 'factor'", type,
                      field);
      Scaling sc;
      sc.linear = positive(s["factor"], type, field + ".factor");
      here = sc;
    } else if (rt == "yarn") {  // --position-embedding-type yarn
      Scaling sc;
      sc.yarn = yarn_from_hf(j, s, type, field, c.max_position_embeddings);
      here = sc;
    } else if (rt == "llama3") {
      auto need = [&](const char* k) -> const json& {
        MCPP_CHECK_HINT(given(s, k),
                        "check config.json: Llama 3.x's scaling has factor, low_freq_factor, "
                        "high_freq_factor and original_max_position_embeddings",
                        "Hugging Face config.json ({}): {} (rope_type 'llama3') lacks '{}'", type,
                        field, k);
        return s[k];
      };
      Scaling sc;
      sc.llama3 = true;
      sc.factor = positive(need("factor"), type, field + ".factor");
      sc.low = positive(need("low_freq_factor"), type, field + ".low_freq_factor");
      sc.high = positive(need("high_freq_factor"), type, field + ".high_freq_factor");
      sc.original = positive_int(need("original_max_position_embeddings"), type,
                                 field + ".original_max_position_embeddings");
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
    const double t = positive(s["rope_theta"], type, field + ".rope_theta");
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
  c.yarn = scaling ? scaling->yarn : model::TransformerConfig::Yarn{};
  // transformers uses the factor as given, only warning where the contexts' ratio says
  // otherwise (releases before its PR #40320 used the ratio instead); so do we, once.
  const double ratio = double(c.max_position_embeddings) / double(c.yarn.original_max_positions);
  if (c.yarn.on && ratio != 1 && ratio != c.yarn.factor)
    log::warn(
        "Hugging Face config.json ({}): {}.factor {} is not max_position_embeddings / "
        "original_max_position_embeddings = {}; using the factor, as transformers does "
        "(releases before its PR #40320 used the ratio)",
        type, scaling_field, c.yarn.factor, ratio);
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
  // TransformerConfig::validate refuses these; a config that skipped it has no one rope type.
  MCPP_CHECK(!(c.yarn.on && (c.rope_scaling || linear)),
             "cannot write a Hugging Face config.json for this model: YaRN with Llama 3.x RoPE "
             "scaling or position interpolation");
  j["rope_theta"] = c.rotary_base;
  if (!c.rope_scaling && !linear && !c.yarn.on) {
    j["rope_scaling"] = nullptr;
    if (parameters)
      j["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", c.rotary_base}};
    return;
  }
  json s;
  if (c.yarn.on) {
    // attention_factor always, which every transformers release reads first; mscale and
    // mscale_all_dim only where transformers' own rule (both non-zero: their ratio, else
    // get_mscale(factor)) gives that number from them too, so no reader sees two answers.
    const auto& y = c.yarn;
    const double a = ops::yarn_concentration(y.factor, y.mscale, y.mscale_all_dim);
    s = {{"rope_type", "yarn"},
         {"factor", y.factor},
         {"original_max_position_embeddings", y.original_max_positions},
         {"beta_fast", y.beta_fast},
         {"beta_slow", y.beta_slow},
         {"truncate", y.round_to_int},
         {"attention_factor", a}};
    const bool both = y.mscale != 0 && y.mscale_all_dim != 0;
    if (both || concentration_is(y.factor, 1, 0, a))
      s["mscale"] = y.mscale, s["mscale_all_dim"] = y.mscale_all_dim;
  } else if (linear) {
    s = {{"rope_type", "linear"}, {"factor", c.seq_len_interpolation_factor}};
  } else {
    s = {{"rope_type", "llama3"},
         {"factor", c.rope_scaling_factor},
         {"low_freq_factor", c.rope_low_freq_factor},
         {"high_freq_factor", c.rope_high_freq_factor},
         {"original_max_position_embeddings", c.rope_original_max_positions}};
  }
  j["rope_scaling"] = s;
  s["rope_theta"] = c.rotary_base;
  j["rope_parameters"] = s;
}

}  // namespace mcpp::checkpoint::hf_rope
