#include "checkpoint/megatron/megatron_import.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <memory>
#include <set>
#include <tuple>

#include "base/error.h"
#include "base/log.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/megatron/torch_pickle.h"
#include "model/gpt_model.h"
#include "parallel/pipeline/layout.h"

namespace mcpp::checkpoint::megatron {

namespace fs = std::filesystem;
using K = Value::Kind;

const char* layout_name(Layout l) { return l == Layout::Legacy ? "legacy (torch)" : "torch_dist"; }

namespace {

const char* kLegacyFile = "model_optim_rng.pt";

// mp_rank_TT, mp_rank_TT_PPP, mp_rank_TT_PPP_EEE (Megatron's get_checkpoint_name)
struct RankDir {
  int64_t tp = 0, pp = 0, ep = -1;
  std::string path;
};
std::vector<RankDir> rank_dirs(const std::string& iter_dir) {
  static const std::regex re(R"(mp_rank_(\d{2,4})(?:_(\d{3,4}))?(?:_(\d{3,4}))?)");
  std::vector<RankDir> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(iter_dir, ec)) {
    std::smatch m;
    const std::string n = e.path().filename().string();
    if (!e.is_directory(ec) || !std::regex_match(n, m, re)) continue;
    RankDir r;
    r.tp = std::stoll(m[1]);
    r.pp = m[2].matched ? std::stoll(m[2]) : 0;
    r.ep = m[3].matched ? std::stoll(m[3]) : -1;
    r.path = (e.path() / kLegacyFile).string();
    out.push_back(r);
  }
  std::sort(out.begin(), out.end(),
            [](auto& a, auto& b) { return std::tie(a.pp, a.tp) < std::tie(b.pp, b.tp); });
  return out;
}

bool is_dist_dir(const std::string& d) {
  return fs::is_regular_file(fs::path(d) / ".metadata") &&
         fs::is_regular_file(fs::path(d) / "metadata.json");
}

std::optional<Detected> detect_iter_dir(const std::string& d, const std::string& iteration) {
  if (is_dist_dir(d)) {
    Detected r{Layout::TorchDist, d, iteration, {}};
    for (const auto& e : fs::directory_iterator(d))
      if (e.path().extension() == ".distcp") r.files.push_back(e.path().string());
    std::sort(r.files.begin(), r.files.end());
    return r;
  }
  auto ranks = rank_dirs(d);
  if (ranks.empty()) return std::nullopt;
  Detected r{Layout::Legacy, d, iteration, {}};
  for (auto& x : ranks) r.files.push_back(x.path);
  return r;
}

}  // namespace

const Value* arg(const Value& a, const char* k) {
  const Value* v = a.get(k);
  return v && !v->is(K::None) ? v : nullptr;
}

std::optional<Detected> detect(const std::string& dir, std::optional<int64_t> iteration) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) return std::nullopt;
  const std::string base = fs::path(dir).filename().string();
  if (!iteration && (base.rfind("iter_", 0) == 0 || base == "release"))
    if (auto r = detect_iter_dir(dir, base == "release" ? "release" : base.substr(5))) return r;
  std::string it;
  if (iteration) {
    it = std::to_string(*iteration);
  } else {
    const fs::path tracker = fs::path(dir) / kTrackerFile;
    if (!fs::is_regular_file(tracker, ec)) return std::nullopt;
    std::ifstream f(tracker);
    std::getline(f, it);
    it.erase(std::remove_if(it.begin(), it.end(), ::isspace), it.end());
    if (it.size() > 20) return std::nullopt;
  }
  const bool release = it == "release";
  if (!release && (it.empty() || !std::all_of(it.begin(), it.end(), ::isdigit))) return std::nullopt;
  const std::string iter_dir =
      (fs::path(dir) / (release ? "release" : iteration_dir_name(std::stoll(it)))).string();
  if (!fs::is_directory(iter_dir, ec)) return std::nullopt;
  if (fs::exists(fs::path(iter_dir) / kMetadataFile) && !is_dist_dir(iter_dir))
    return std::nullopt;  // a megatron.cpp checkpoint
  return detect_iter_dir(iter_dir, release ? "release" : std::to_string(std::stoll(it)));
}

void refuse_megatron_checkpoint(const std::string& dir, std::optional<int64_t> iteration) {
  std::optional<Detected> d;
  try {
    d = detect(dir, iteration);
  } catch (const std::exception&) {
    return;  // unreadable: the megatron.cpp reader gives its own error
  }
  if (!d) return;
  throw Error(fmt::format("{} is a Megatron-LM checkpoint ({} layout, iteration {}), not a "
                          "megatron.cpp checkpoint",
                          dir, layout_name(d->layout), d->iteration),
              fmt::format("convert it once: megatron convert --from-megatron {} --save OUT, then "
                          "--load OUT (docs/from-megatron.md)",
                          dir));
}

model::TransformerConfig config_from_args(const Value& a, const std::string& what,
                                          std::vector<std::string>& notes) {
  MCPP_CHECK(a.is(K::Object) && a.s == "argparse.Namespace",
             "{}: 'args' is a {}, expected Megatron's argparse.Namespace", what, a.describe());
  auto i64 = [&](const char* k, std::optional<int64_t> dflt = {}) -> int64_t {
    const Value* v = arg(a, k);
    if (!v) {
      MCPP_CHECK_HINT(dflt.has_value(), "the checkpoint was not written by Megatron-LM's "
                                        "pretrain_gpt.py, or by a version too old to read",
                      "{}: args lack '{}'", what, k);
      return *dflt;
    }
    MCPP_CHECK(v->is(K::Int) && v->i >= 0 && v->i < (int64_t(1) << 31),
               "{}: args.{} is {} (expected a non-negative integer below 2^31)", what, k,
               v->is(K::Int) ? std::to_string(v->i) : v->describe());
    return v->i;
  };
  auto f64 = [&](const char* k, double dflt) -> double {
    const Value* v = arg(a, k);
    if (!v) return dflt;
    MCPP_CHECK(v->is(K::Float) || v->is(K::Int), "{}: args.{} is a {}", what, k, v->describe());
    return v->is(K::Float) ? v->f : double(v->i);
  };
  auto flag = [&](const char* k, bool dflt) -> bool {
    const Value* v = arg(a, k);
    if (!v) return dflt;
    MCPP_CHECK(v->is(K::Bool), "{}: args.{} is a {}, expected a bool", what, k, v->describe());
    return v->b;
  };
  auto str = [&](const char* k, const std::string& dflt) -> std::string {
    const Value* v = arg(a, k);
    if (!v) return dflt;
    MCPP_CHECK(v->is(K::Str), "{}: args.{} is a {}, expected a string", what, k, v->describe());
    return v->s;
  };
  auto unsupported = [&](bool bad, const std::string& feature) {
    MCPP_CHECK_HINT(!bad, "megatron.cpp imports dense GPT and Llama models (docs/from-megatron.md)",
                    "{}: the checkpoint uses {}, which the import does not map", what, feature);
  };
  unsupported(arg(a, "num_experts") != nullptr && i64("num_experts") > 0, "mixture of experts");
  unsupported(flag("multi_latent_attention", false), "multi-latent attention");
  unsupported(arg(a, "mtp_num_layers") != nullptr && i64("mtp_num_layers") > 0,
              "multi-token prediction layers");
  const std::string norm = str("normalization", "LayerNorm");
  unsupported(norm != "LayerNorm" && norm != "RMSNorm", "--normalization " + norm);
  const std::string pos = str("position_embedding_type", "learned_absolute");
  unsupported(pos != "learned_absolute" && pos != "rope" && pos != "yarn" && pos != "none",
              "--position-embedding-type " + pos);

  model::TransformerConfig c;
  c.num_layers = i64("num_layers");
  c.hidden_size = i64("hidden_size");
  c.num_attention_heads = i64("num_attention_heads");
  MCPP_CHECK(c.num_layers > 0 && c.hidden_size > 0 && c.num_attention_heads > 0,
             "{}: args give num_layers {}, hidden_size {}, num_attention_heads {}", what,
             c.num_layers, c.hidden_size, c.num_attention_heads);
  c.ffn_hidden_size = i64("ffn_hidden_size", 4 * c.hidden_size);
  c.num_query_groups = flag("group_query_attention", false)
                           ? i64("num_query_groups", c.num_attention_heads)
                           : c.num_attention_heads;
  c.kv_channels = i64("kv_channels", c.hidden_size / c.num_attention_heads);
  c.seq_length = i64("seq_length", 0);
  c.max_position_embeddings = i64("max_position_embeddings", c.seq_length);
  c.padded_vocab_size = i64("padded_vocab_size");
  c.rmsnorm = norm == "RMSNorm";
  c.norm_epsilon = f64("norm_epsilon", f64("layernorm_epsilon", 1e-5));
  c.zero_centered_gamma = flag("apply_layernorm_1p", false);
  c.swiglu = flag("swiglu", false);
  c.squared_relu = flag("squared_relu", false);  // activation_func = squared_relu
  // --quick-geglu (core_transformer_config_from_args: squared_relu wins over it, swiglu is
  // asserted against) and the gated units' offset and clamp (None: none).
  c.quick_geglu = flag("quick_geglu", false) && !c.squared_relu;
  // GELU's form (training/validate_activation.cpp, gelu_is_exact): the bias_gelu fusion's tanh
  // form with biases, --openai-gelu's tanh form, else torch's exact F.gelu.
  c.gelu_erf = !c.swiglu && !c.squared_relu && !c.quick_geglu && !flag("openai_gelu", false) &&
               !(flag("bias_gelu_fusion", true) && flag("add_bias_linear", true));
  c.glu_linear_offset = f64("glu_linear_offset", 0.0);
  if (arg(a, "activation_func_clamp_value"))
    c.activation_func_clamp_value = f64("activation_func_clamp_value", 0.0);
  // --softmax-type: attention sinks (learnable: core_attention.softmax_offset per layer).
  c.softmax_type = model::softmax_type_of(str("softmax_type", "vanilla"));
  // --qk-layernorm: self_attention.q_layernorm / k_layernorm weights (and biases, with
  // --normalization LayerNorm), decayed with --apply-wd-to-qk-layernorm.
  c.qk_layernorm = flag("qk_layernorm", false);
  c.qk_l2_norm = flag("qk_l2_norm", false);  // Megatron's L2Norm (it wins over qk_layernorm)
  if (c.qk_l2_norm) c.qk_layernorm = false;
  c.qk_layernorm_weight_decay = c.qk_layernorm && flag("apply_wd_to_qk_layernorm", false);
  MCPP_CHECK_HINT(!(c.swiglu && c.squared_relu), "the checkpoint's args are inconsistent",
                  "{}: args.swiglu and args.squared_relu are both set (Megatron asserts "
                  "against it)",
                  what);
  MCPP_CHECK_HINT(!(c.quick_geglu && c.swiglu), "the checkpoint's args are inconsistent",
                  "{}: args.quick_geglu and args.swiglu are both set (Megatron asserts against "
                  "it)",
                  what);
  c.check_activation();  // the offset and clamp where Megatron's config takes them
  c.rope = pos == "rope" || pos == "yarn";
  c.no_positions = pos == "none";
  if (const Value* w = arg(a, "window_size")) {  // sliding-window attention: (L, R), L -1 none
    MCPP_CHECK((w->is(K::Tuple) || w->is(K::List)) && w->items.size() == 2 &&
                   w->items[0]->is(K::Int) && w->items[0]->i >= -1,
               "{}: args.window_size is {}, expected a pair of integers (L >= -1, R)", what,
               w->describe());
    if (w->items[0]->i >= 0) {
      c.window_left = w->items[0]->i;
      c.window_pattern.assign(size_t(c.num_layers), 1);
      if (const Value* f = arg(a, "window_attn_skip_freq")) {  // is_layer_window_attention
        MCPP_CHECK((f->is(K::Int) && f->i >= 1) ||
                       (f->is(K::List) && int64_t(f->items.size()) == c.num_layers),
                   "{}: args.window_attn_skip_freq is {}, expected N >= 1 or one entry per "
                   "layer",
                   what, f->describe());
        for (int64_t l = 0; l < c.num_layers; ++l) {
          const Value* e = f->is(K::Int) ? nullptr : f->items[size_t(l)].get();
          MCPP_CHECK(!e || e->is(K::Int) || e->is(K::Bool),
                     "{}: args.window_attn_skip_freq holds a {}", what, e ? e->describe() : "");
          c.window_pattern[size_t(l)] = e ? int64_t(e->is(K::Int) ? e->i != 0 : e->b)
                                          : int64_t((l + 1) % f->i != 0);
        }
      }
    }
  }
  if (flag("use_mup", false)) import_mup(c, a, what);  // megatron_import_config.cpp
  import_no_rope(c, a, what);                          // megatron_import_config.cpp
  c.rotary_base = f64("rotary_base", 10000);
  c.rotary_interleaved = c.rope && flag("rotary_interleaved", false);  // the same weights
  c.rotary_percent = pos == "yarn" ? 1.0 : f64("rotary_percent", 1.0);
  if (pos == "yarn") import_yarn(c, a, what, notes);
  // Llama 3.x RoPE scaling: Megatron applies it only to a RoPE model (the other three values
  // are its constants, TransformerConfig's defaults).
  c.rope_scaling = pos == "rope" && flag("use_rope_scaling", false);
  c.rope_scaling_factor = f64("rope_scaling_factor", 8.0);
  if (flag("use_rope_scaling", false) && !c.rope)
    notes.push_back(
        "args.use_rope_scaling is set but the model has no RoPE (Megatron ignores "
        "it there): imported without scaling");
  MCPP_CHECK(!c.rope_scaling || (std::isfinite(c.rope_scaling_factor) && c.rope_scaling_factor > 0),
             "{}: args.rope_scaling_factor {} is not a positive number", what,
             c.rope_scaling_factor);
  // Linear position interpolation (None: off), likewise for RoPE models only.
  const double interp = f64("rotary_seq_len_interpolation_factor", 1.0);
  if (pos == "rope") c.seq_len_interpolation_factor = interp;
  if (!c.rope && interp != 1.0)
    notes.push_back(
        "args.rotary_seq_len_interpolation_factor is set but the model has no RoPE (Megatron "
        "ignores it there): imported without interpolation");
  MCPP_CHECK(std::isfinite(c.seq_len_interpolation_factor) && c.seq_len_interpolation_factor > 0,
             "{}: args.rotary_seq_len_interpolation_factor {} is not a positive number", what,
             c.seq_len_interpolation_factor);
  c.tie_embeddings = !flag("untie_embeddings_and_output_weights", false);
  c.add_bias_linear = flag("add_bias_linear", true);
  c.add_qkv_bias = flag("add_qkv_bias", false);  // linear_qkv.bias with add_bias_linear False
  c.hidden_dropout = f64("hidden_dropout", 0.1);
  c.attention_dropout = f64("attention_dropout", 0.1);
  c.init_method_std = f64("init_method_std", 0.02);
  c.seed = uint64_t(i64("seed", 1234));
  MCPP_CHECK(c.num_query_groups > 0 && c.num_attention_heads % c.num_query_groups == 0 &&
                 c.kv_channels > 0 && c.padded_vocab_size > 0 && c.ffn_hidden_size > 0 &&
                 std::isfinite(c.norm_epsilon) && c.norm_epsilon > 0 && c.rotary_base > 0,
             "{}: args describe no valid model (heads {}, query groups {}, kv_channels {}, "
             "vocab {}, ffn {}, eps {})",
             what, c.num_attention_heads, c.num_query_groups, c.kv_channels, c.padded_vocab_size,
             c.ffn_hidden_size, c.norm_epsilon);
  return c;
}

std::map<std::string, std::string> recorded_args(const Value& a) {
  static const char* keys[] = {
      "bf16", "fp16", "tokenizer_type", "vocab_file", "merge_file", "tokenizer_model",
      "vocab_size", "make_vocab_size_divisible_by", "lr", "min_lr", "weight_decay",
      "adam_beta1", "adam_beta2", "adam_eps", "clip_grad", "micro_batch_size",
      "global_batch_size", "train_iters", "train_samples", "seed"};
  std::map<std::string, std::string> out;
  for (const char* k : keys) {
    const Value* v = arg(a, k);
    if (!v) continue;
    if (v->is(K::Bool)) out[k] = v->b ? "True" : "False";
    else if (v->is(K::Int)) out[k] = std::to_string(v->i);
    else if (v->is(K::Float)) out[k] = fmt::format("{}", v->f);
    else if (v->is(K::Str)) out[k] = v->s;
  }
  return out;
}

Split split_of(const std::string& n, bool swiglu) {
  if (n == "embedding.word_embeddings.weight" || n == "output_layer.weight" ||
      n.ends_with("linear_qkv.weight") || n.ends_with("linear_qkv.bias") ||
      n.ends_with("core_attention.softmax_offset"))  // the sinks: one a head
    return Split::Rows;
  if (n.ends_with("linear_fc1.weight") || n.ends_with("linear_fc1.bias"))
    return swiglu ? Split::SwigluRows : Split::Rows;
  if (n.ends_with("linear_proj.weight") || n.ends_with("linear_fc2.weight")) return Split::Cols;
  return Split::Replicated;
}

std::string canonical_name(const std::string& key) {
  if (key.ends_with("._extra_state") || key.find("._extra_state/") != std::string::npos)
    return "";
  static const std::pair<const char*, const char*> te[] = {
      {"self_attention.linear_qkv.layer_norm_weight", "input_layernorm.weight"},
      {"self_attention.linear_qkv.layer_norm_bias", "input_layernorm.bias"},
      {"mlp.linear_fc1.layer_norm_weight", "pre_mlp_layernorm.weight"},
      {"mlp.linear_fc1.layer_norm_bias", "pre_mlp_layernorm.bias"}};
  for (auto [from, to] : te)
    if (key.ends_with(from)) return key.substr(0, key.size() - std::strlen(from)) + to;
  return key;
}

void check_against_model(Imported& im, const std::string& what) {
  const auto& c = im.config;
  if (c.tie_embeddings) im.tensors.erase("output_layer.weight");  // the last stage's copy
  model::GPTModel m(c);
  std::set<std::string> want;
  for (const auto& p : m.params().infos()) {
    want.insert(p.name);
    auto it = im.tensors.find(p.name);
    MCPP_CHECK_HINT(it != im.tensors.end(),
                    "the checkpoint's args and its tensors disagree, or a rank's file is missing",
                    "{}: no tensor for '{}' (shape {})", what, p.name, shape_str(p.global_shape));
    MCPP_CHECK(it->second.shape() == p.global_shape,
               "{}: '{}' has shape {} after merging the ranks, the args say {}", what, p.name,
               shape_str(it->second.shape()), shape_str(p.global_shape));
  }
  for (const auto& [k, _] : im.tensors)
    MCPP_CHECK_HINT(want.count(k), "megatron.cpp imports dense GPT and Llama models",
                    "{}: tensor '{}' has no counterpart in megatron.cpp's model", what, k);
}

namespace {

// TP shards (same shape each) -> the TP=1 tensor.
Tensor merge_tp(const std::vector<Tensor>& s, Split how, const std::string& name,
                const std::string& what) {
  const int64_t T = int64_t(s.size());
  for (const auto& t : s)
    MCPP_CHECK(t.defined() && t.shape() == s[0].shape(),
               "{}: '{}' is missing on a TP rank or its shards differ in shape", what, name);
  if (T == 1 || how == Split::Replicated) return s[0];
  const Shape& sh = s[0].shape();
  const int64_t rows = sh.empty() ? 1 : sh[0], cols = sh.size() > 1 ? s[0].numel() / rows : 1;
  MCPP_CHECK(how != Split::Cols || sh.size() == 2, "{}: '{}' should be a matrix", what, name);
  Shape out = sh;
  if (how == Split::Cols) out[1] *= T;
  else out[0] *= T;
  Tensor o = Tensor::empty(out, DType::F32);
  float* d = o.data<float>();
  for (int64_t r = 0; r < T; ++r) {
    const float* x = s[size_t(r)].data<float>();
    if (how == Split::Rows) {
      std::copy(x, x + rows * cols, d + r * rows * cols);
    } else if (how == Split::Cols) {
      for (int64_t i = 0; i < rows; ++i) std::copy(x + i * cols, x + (i + 1) * cols, d + (i * T + r) * cols);
    } else {  // [gate_r; up_r] -> gate rows at r*h, up rows at T*h + r*h
      MCPP_CHECK(rows % 2 == 0, "{}: SwiGLU '{}' has an odd row count", what, name);
      const int64_t h = rows / 2;
      std::copy(x, x + h * cols, d + r * h * cols);
      std::copy(x + h * cols, x + rows * cols, d + (T * h + r * h) * cols);
    }
  }
  return o;
}

// "decoder.layers.3.rest" -> (3, "rest"); -1 when no layer number.
int64_t layer_of(const std::string& k, std::string& rest) {
  static const std::string pre = "decoder.layers.";
  if (k.rfind(pre, 0) != 0) return -1;
  const size_t dot = k.find('.', pre.size());
  const std::string num = k.substr(pre.size(), dot == std::string::npos ? dot : dot - pre.size());
  if (num.empty() || num.size() > 6 || !std::all_of(num.begin(), num.end(), ::isdigit)) return -1;
  rest = dot == std::string::npos ? "" : k.substr(dot + 1);
  return std::stoll(num);
}

void read_legacy(const Detected& d, Imported& im) {
  auto ranks = rank_dirs(d.iter_dir);
  for (const auto& r : ranks)
    MCPP_CHECK_HINT(r.ep < 0, "megatron.cpp imports dense models only",
                    "{}: expert-parallel rank folders (mp_rank_TT_PPP_EEE)", d.iter_dir);
  // The args of the first rank give the layout and the model.
  auto first = std::make_unique<MappedFile>(ranks[0].path);
  auto tf = std::make_unique<TorchFile>(first->bytes(), ranks[0].path);
  MCPP_CHECK(tf->root()->is(K::Dict), "{}: the state dict is a {}, expected a dict",
             ranks[0].path, tf->root()->describe());
  const Value* args = tf->root()->get("args");
  MCPP_CHECK_HINT(args, "Megatron writes args unless --no-save-args... was patched in",
                  "{}: no 'args' in the state dict", ranks[0].path);
  im.config = config_from_args(*args, ranks[0].path, im.notes);
  im.args_given = recorded_args(*args);
  const int64_t T = std::max<int64_t>(1, args->get("tensor_model_parallel_size")
                                             ? args->get("tensor_model_parallel_size")->i : 1);
  const int64_t P = std::max<int64_t>(1, args->get("pipeline_model_parallel_size")
                                             ? args->get("pipeline_model_parallel_size")->i : 1);
  im.source_tp = T, im.source_pp = P;
  MCPP_CHECK_HINT(int64_t(ranks.size()) == T * P, "copy every mp_rank_* folder of the iteration",
                  "{}: {} rank folders, but args say TP {} x PP {}", d.iter_dir, ranks.size(), T,
                  P);
  const int64_t L = im.config.num_layers;
  // An uneven split's first and last stages (None: even).
  auto stage_layers = [&](const char* k) -> std::optional<int> {
    const Value* v = arg(*args, k);
    if (!v) return std::nullopt;
    MCPP_CHECK(v->is(K::Int) && v->i >= 1 && v->i <= L, "{}: args.{} is {}, expected 1 .. {}",
               ranks[0].path, k, v->is(K::Int) ? std::to_string(v->i) : v->describe(), L);
    return int(v->i);
  };
  parallel::pipeline::LayerSplit split;
  split.first = stage_layers("decoder_first_pipeline_num_layers");
  split.last = stage_layers("decoder_last_pipeline_num_layers");
  // Megatron records --pipeline-model-parallel-layout as given (a str), which numbers the
  // chunks' local layers as it placed them.
  if (const Value* v = arg(*args, "pipeline_model_parallel_layout")) {
    MCPP_CHECK(v->is(K::Str), "{}: args.pipeline_model_parallel_layout is {}, expected a str",
               ranks[0].path, v->describe());
    split.layout = v->s;
  }
  split.mtp_num_layers = int(im.config.mtp_num_layers);
  std::map<std::string, std::vector<Tensor>> shards;  // TP shards by megatron.cpp name
  // The optimizer state: imported when every rank file holds the non-distributed optimizer's.
  OptimizerShards opt;
  bool import_optim = d.load_optim;
  const Value* dist_opt = args->get("use_distributed_optimizer");
  const bool distributed = dist_opt && dist_opt->is(K::Bool) && dist_opt->b;
  for (size_t k = 0; k < ranks.size(); ++k) {
    const RankDir& r = ranks[k];
    MCPP_CHECK(r.tp < T && r.pp < P, "{}: rank folder outside TP {} x PP {}", r.path, T, P);
    if (k > 0) {
      tf.reset();
      first = std::make_unique<MappedFile>(r.path);
      tf = std::make_unique<TorchFile>(first->bytes(), r.path);
    }
    const Value& root = *tf->root();
    MCPP_CHECK(root.is(K::Dict), "{}: the state dict is a {}", r.path, root.describe());
    const bool has_opt = root.get("optimizer") != nullptr && !root.get("optimizer")->is(K::None);
    im.had_optimizer |= has_opt;
    import_optim &= has_opt;
    std::vector<RankParam> rank_params;  // this file's trainable parameters, in order
    // model, or model0..model{V-1} under virtual pipelining
    std::vector<const Value*> chunks;
    if (const Value* m = root.get("model")) chunks.push_back(m);
    for (int v = 0; root.get("model" + std::to_string(v)); ++v)
      chunks.push_back(root.get("model" + std::to_string(v)));
    MCPP_CHECK(!chunks.empty(), "{}: no 'model' in the state dict", r.path);
    const int64_t V = int64_t(chunks.size());
    // Megatron's get_transformer_layer_offset (even, --decoder-first/last-pipeline-num-layers
    // or the layout): the global layers of each of this rank's chunks.
    const auto layers = parallel::pipeline::stage_layers(int(L), int(P), int(V), split);
    for (int64_t v = 0; v < V; ++v) {
      const Value& sd = *chunks[size_t(v)];
      MCPP_CHECK(sd.is(K::Dict), "{}: model is a {}", r.path, sd.describe());
      MCPP_CHECK_HINT(!sd.get("language_model"),
                      "convert it to Megatron-Core names first with Megatron-LM's "
                      "tools/checkpoint/convert.py --saver mcore",
                      "{}: a pre-Megatron-Core (legacy GPTModel, 'language_model.encoder') "
                      "checkpoint; megatron.cpp reads Megatron-Core names",
                      r.path);
      for (const auto& [kv, tv] : sd.entries) {
        MCPP_CHECK(kv->is(K::Str), "{}: a model key is a {}", r.path, kv->describe());
        std::string name = canonical_name(kv->s);
        if (name.empty()) continue;
        std::string rest;
        const int64_t local = layer_of(name, rest);
        if (local >= 0) {  // chunk v of stage pp: its local layer `local`
          const std::vector<int>& ids = layers[size_t(r.pp * V + v)];
          MCPP_CHECK(local < int64_t(ids.size()), "{}: '{}' is beyond the chunk's {} layers",
                     r.path, kv->s, ids.size());
          name = model::layer_param_name(ids[size_t(local)], rest);
        }
        auto& vec = shards[name];
        vec.resize(size_t(T));
        MCPP_CHECK(!vec[size_t(r.tp)].defined() || (name == "embedding.word_embeddings.weight" ||
                                                    name == "output_layer.weight"),
                   "{}: '{}' appears twice for TP rank {}", r.path, name, r.tp);
        if (!vec[size_t(r.tp)].defined()) vec[size_t(r.tp)] = tf->tensor(*tv, DType::F32, kv->s);
        MCPP_CHECK(tv->is(K::Tensor), "{}: model entry '{}' is a {}", r.path, kv->s,
                   tv->describe());
        rank_params.push_back({kv->s, name, Shape(tv->shape.begin(), tv->shape.end()), tv->dtype});
      }
    }
    if (import_optim && !distributed)
      read_rank_optimizer(root, *tf, rank_params, r.tp, T, r.path,
                          im.config.qk_layernorm_weight_decay, opt);
    if (k == 0) read_scheduler(root, r.path, im.progress);
    if (import_optim && k == 0) {
      im.optimizer.emplace();
      read_scheduler(root, r.path, *im.optimizer);
    }
  }
  for (auto& [name, s] : shards)
    im.tensors[name] = merge_tp(s, split_of(name, im.config.gated_linear_unit()), name, d.iter_dir);
  if (!import_optim || distributed) {
    im.optimizer.reset();
    if (im.had_optimizer)
      im.optimizer_skipped =
          distributed ? fmt::format("{} was written with --use-distributed-optimizer: the Adam "
                                    "state is in the distrib_optim.pt files of its mp_rank_* "
                                    "folders, which the import does not read",
                                    d.iter_dir)
                      : fmt::format("{}: some rank files hold no optimizer state", d.iter_dir);
    return;
  }
  OptimizerState& os = *im.optimizer;
  os.step = *opt.step;
  os.grad_scaler = opt.grad_scaler;
  if (opt.betas_eps) os.beta1 = (*opt.betas_eps)[0], os.beta2 = (*opt.betas_eps)[1],
                     os.eps = (*opt.betas_eps)[2];
  const std::pair<std::map<std::string, std::vector<Tensor>>*, std::map<std::string, Tensor>*>
      parts[] = {{&opt.exp_avg, &os.exp_avg}, {&opt.exp_avg_sq, &os.exp_avg_sq},
                 {&opt.main_params, &os.main_params}};
  for (auto [from, to] : parts)
    for (auto& [name, s] : *from)
      (*to)[name] = merge_tp(s, split_of(name, im.config.gated_linear_unit()), name, d.iter_dir);
}

}  // namespace

Imported read(const Detected& d) {
  Imported im;
  im.iteration = d.iteration;
  if (d.layout == Layout::Legacy) read_legacy(d, im);
  else read_torch_dist(d, im);
  check_against_model(im, d.iter_dir);
  check_optimizer(im, d.iter_dir);
  if (im.had_optimizer && !im.optimizer && im.optimizer_skipped.empty())
    im.optimizer_skipped = fmt::format("{} holds optimizer state under torch_dist's optimizer.* "
                                       "keys, which the import does not read",
                                       d.iter_dir);
  return im;
}

std::vector<std::string> describe(const Detected& d) {
  std::vector<std::string> out;
  out.push_back(fmt::format("Megatron-LM checkpoint, {} layout, iteration {} ({})",
                            layout_name(d.layout), d.iteration, d.iter_dir));
  Imported im;
  im.iteration = d.iteration;
  if (d.layout == Layout::Legacy) {
    std::string why;  // an optimizer state convert would refuse: said, the rest still described
    try {
      read_legacy(d, im);
    } catch (const Error& e) {
      Detected weights_only = d;
      weights_only.load_optim = false;
      im = Imported{};
      im.iteration = d.iteration;
      read_legacy(weights_only, im);  // a model problem throws again, as before
      why = e.summary();
    }
    out.push_back(fmt::format(
        "ranks      TP {} x PP {} ({} model_optim_rng.pt files){}", im.source_tp, im.source_pp,
        d.files.size(),
        im.optimizer ? fmt::format(", with Adam state (step {}, imported by convert)",
                                   im.optimizer->step)
        : !why.empty()     ? ", with optimizer state convert refuses: " + why
        : im.had_optimizer ? ", with optimizer state (not imported)"
                           : ""));
  } else {
    read_torch_dist(d, im);
    out.push_back(fmt::format("files      {} .distcp file(s){}", d.files.size(),
                              im.had_optimizer ? ", with optimizer state" : ""));
  }
  check_against_model(im, d.iter_dir);  // every tensor read and matched to the model
  const auto& c = im.config;
  out.push_back(fmt::format(
      "model      {} layers, hidden {}, heads {} (query groups {}), ffn {}, padded vocab {}, {}",
      c.num_layers, c.hidden_size, c.num_attention_heads, c.num_query_groups, c.ffn_hidden_size,
      c.padded_vocab_size,
      c.swiglu && c.rmsnorm && c.rope ? "Llama-style" : "GPT-style"));
  int64_t n = 0;
  for (const auto& [_, t] : im.tensors) n += t.numel();
  out.push_back(fmt::format("tensors    {} model tensors, {} parameters", im.tensors.size(), n));
  out.push_back("convert    megatron convert --from-megatron " + d.iter_dir + " --save OUT");
  return out;
}

}  // namespace mcpp::checkpoint::megatron
