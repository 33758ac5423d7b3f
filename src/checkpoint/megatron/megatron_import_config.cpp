// The parts of config_from_args (megatron_import.cpp) that read a feature's own args: YaRN
// and muP.
#include <cmath>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "base/error.h"
#include "checkpoint/megatron/megatron_import.h"
#include "checkpoint/megatron/torch_pickle.h"

namespace mcpp::checkpoint::megatron {

using K = Value::Kind;

namespace {
// args.<k> as a number (an int or a float), dflt when absent or None.
double arg_number(const Value& a, const char* k, double dflt, const std::string& what) {
  const Value* v = arg(a, k);
  if (!v) return dflt;
  MCPP_CHECK(v->is(K::Float) || v->is(K::Int), "{}: args.{} is a {}", what, k, v->describe());
  return v->is(K::Float) ? v->f : double(v->i);
}
}  // namespace

// --position-embedding-type yarn: Megatron's YarnRotaryEmbedding settings from the args its
// _apply_yarn_config_from_args reads (None: its defaults). It rotates the whole head and
// takes neither Llama 3.x scaling nor position interpolation, so those are imported off.
void import_yarn(model::TransformerConfig& c, const Value& a, const std::string& what,
                 std::vector<std::string>& notes) {
  auto number = [&](const char* k, double dflt) { return arg_number(a, k, dflt, what); };
  auto& y = c.yarn;
  y.on = true, y.factor = number("rotary_scaling_factor", 1.0);
  y.original_max_positions = int64_t(number("yarn_original_max_position_embeddings", 4096));
  y.beta_fast = number("yarn_beta_fast", 32), y.beta_slow = number("yarn_beta_slow", 1);
  const Value* r = arg(a, "yarn_correction_range_round_to_int");
  MCPP_CHECK(!r || r->is(K::Bool), "{}: args.yarn_correction_range_round_to_int is a {}", what,
             r ? r->describe() : "");
  y.round_to_int = !r || r->b;
  y.mscale = number("mscale", 1.0), y.mscale_all_dim = number("mscale_all_dim", 0.0);
  MCPP_CHECK(std::isfinite(y.factor) && y.factor > 0 && y.original_max_positions > 0 &&
                 std::isfinite(y.beta_fast) && y.beta_fast > 0 && std::isfinite(y.beta_slow) &&
                 y.beta_slow > 0 && std::isfinite(y.mscale) && std::isfinite(y.mscale_all_dim),
             "{}: args give an invalid YaRN (rotary_scaling_factor {}, "
             "yarn_original_max_position_embeddings {}, yarn_beta_fast {}, yarn_beta_slow {}, "
             "mscale {}, mscale_all_dim {})",
             what, y.factor, y.original_max_positions, y.beta_fast, y.beta_slow, y.mscale,
             y.mscale_all_dim);
  const Value* p = arg(a, "rotary_percent");
  if (p && !(p->is(K::Float) && p->f == 1.0) && !(p->is(K::Int) && p->i == 1))
    notes.push_back(
        "args.rotary_percent is below 1 but YaRN rotates the whole head (Megatron's "
        "YarnRotaryEmbedding builds its frequencies over kv_channels): imported as 1");
  for (const char* k : {"use_rope_scaling", "rotary_seq_len_interpolation_factor"}) {
    const Value* v = arg(a, k);
    if (v && !(v->is(K::Bool) && !v->b))
      notes.push_back(fmt::format("args.{} is set but the model's RoPE is YaRN (Megatron "
                                  "ignores it there): imported without it",
                                  k));
  }
}

// --use-mup: Megatron's TransformerConfig.__post_init__ derives the width multiplier and the
// output multiplier from args (the output multiplier left at 1 becomes 1 / width); a None
// base hidden size is the model's own.
void import_mup(model::TransformerConfig& c, const Value& a, const std::string& what) {
  auto number = [&](const char* k, double dflt) { return arg_number(a, k, dflt, what); };
  auto& m = c.mup;
  m.on = true;
  const Value* b = arg(a, "mup_base_hidden_size");
  m.base_hidden_size = b && b->is(K::Int) ? b->i : c.hidden_size;
  MCPP_CHECK(m.base_hidden_size > 0, "{}: args.mup_base_hidden_size is {}", what,
             m.base_hidden_size);
  m.width_mult = double(c.hidden_size) / double(m.base_hidden_size);
  m.embedding_mult = number("mup_embedding_mult", 1.0);
  const double out = number("mup_output_mult", 1.0);
  m.output_mult = out == 1.0 && m.width_mult != 1.0 ? 1.0 / m.width_mult : out;
  const Value* hd = arg(a, "mup_base_head_dim");
  if (hd) m.base_head_dim = number("mup_base_head_dim", 0);
  m.attn_scale_power = number("mup_attn_scale_power", 1.0);
}

void import_no_rope(model::TransformerConfig& c, const Value& a, const std::string& what) {
  const Value* f = arg(a, "no_rope_freq");
  if (!f || (f->is(K::Int) && f->i == 0)) return;
  MCPP_CHECK((f->is(K::Int) && f->i >= 1 && c.num_layers % f->i == 0) ||
                 (f->is(K::List) && int64_t(f->items.size()) == c.num_layers),
             "{}: args.no_rope_freq is {}, expected N dividing the {} layers or one entry per "
             "layer",
             what, f->describe(), c.num_layers);
  c.no_rope_pattern.assign(size_t(c.num_layers), 0);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const Value* e = f->is(K::Int) ? nullptr : f->items[size_t(l)].get();
    MCPP_CHECK(!e || e->is(K::Int) || e->is(K::Bool), "{}: args.no_rope_freq holds a {}", what,
               e ? e->describe() : "");
    c.no_rope_pattern[size_t(l)] =
        e ? int64_t(e->is(K::Int) ? e->i != 0 : e->b) : int64_t((l + 1) % f->i == 0);
  }
}

}  // namespace mcpp::checkpoint::megatron
