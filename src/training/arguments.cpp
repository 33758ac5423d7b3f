// Megatron-LM flags: table, parser, implemented/by-design lists, validation, print_args.
// Semantics follow Python's argparse as Megatron configures it (allow_abbrev=False) and
// megatron/training/arguments.py's validate_args; see docs/flags.md.
#include "training/arguments.h"

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <set>
#include <string_view>
#include <unordered_map>

#include "base/error.h"
#include "base/log.h"
#include "data/gpt_dataset.h"
#include "parallel/pipeline/schedule.h"

namespace mcpp::training {
namespace {

constexpr FlagRow kMegatronFlags[] = {
#include "training/flag_table.inc"
};

// megatron.cpp's own flags: not Megatron-LM's, so they are listed apart and marked as ours.
constexpr FlagRow kOurFlags[] = {
    {"megatron.cpp", "--device", "device", FlagAction::Store, "str", "", "auto|cpu|cuda", "auto"},
    {"megatron.cpp", "--threads", "threads", FlagAction::Store, "int", "", "", "0"},
    {"megatron.cpp", "--pipeline-schedule", "pipeline_schedule", FlagAction::Store, "str", "",
     "1f1b|gpipe", "1f1b"},
    {"megatron.cpp", "--keep-mlp-activations", "keep_mlp_activations", FlagAction::Store, "int", "",
     "", "0"},
};

const char* const kFlagsDoc = "docs/flags.md";

// ---- small helpers ----------------------------------------------------------------------

std::vector<std::string> split_on(std::string_view s, char sep) {
  std::vector<std::string> out;
  if (s.empty()) return out;
  size_t start = 0;
  while (true) {
    size_t p = s.find(sep, start);
    if (p == std::string_view::npos) {
      out.emplace_back(s.substr(start));
      break;
    }
    out.emplace_back(s.substr(start, p - start));
    start = p + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& v, const char* sep) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? sep : "") + v[i];
  return s;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

// The candidates closest to `word` (at most 3), when close enough to be a plausible typo.
std::vector<std::string> closest(const std::string& word, const std::vector<std::string>& cands) {
  size_t best = SIZE_MAX;
  std::vector<std::string> out;
  for (const auto& c : cands) {
    size_t d = edit_distance(word, c);
    if (d < best) best = d, out.clear();
    if (d == best && out.size() < 3) out.push_back(c);
  }
  const size_t limit = std::max<size_t>(2, word.size() / 3);
  if (best > limit) out.clear();
  return out;
}

bool looks_like_number(const std::string& s) {
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  std::strtod(s.c_str(), &end);
  return end == s.c_str() + s.size();
}

bool is_flag_token(const std::string& s) {
  return s.size() >= 2 && s[0] == '-' && !looks_like_number(s);
}

std::optional<int64_t> to_int(std::string s) {
  std::erase(s, '_');  // Python's int() accepts 1_000
  std::string_view v = s;
  while (!v.empty() && v.front() == ' ') v.remove_prefix(1);
  while (!v.empty() && v.back() == ' ') v.remove_suffix(1);
  if (!v.empty() && v.front() == '+') v.remove_prefix(1);
  int64_t out = 0;
  auto [p, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (v.empty() || ec != std::errc() || p != v.data() + v.size()) return std::nullopt;
  return out;
}

std::optional<double> to_float(const std::string& s) {
  if (s.empty() || std::isspace(static_cast<unsigned char>(s.front()))) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (end != s.c_str() + s.size() || errno == ERANGE) return std::nullopt;
  return v;
}

bool is_int_type(const FlagRow& r) { return std::string_view(r.type) == "int"; }
bool is_float_type(const FlagRow& r) { return std::string_view(r.type) == "float"; }
bool is_bool_action(const FlagRow& r) { return r.action != FlagAction::Store; }
bool is_list(const FlagRow& r) { return r.nargs[0] != '\0'; }

// Choice as the user types it: Megatron's enum choices print as "AttnBackend.flash".
std::string choice_name(const FlagRow& r, const std::string& c) {
  if (std::string_view(r.type) == "enum_type_handler") {
    auto p = c.rfind('.');
    if (p != std::string::npos) return c.substr(p + 1);
  }
  return c;
}

// A default as the user would type it: "<AttnBackend.auto: 5>" -> "auto".
std::string default_name(const FlagRow& r) {
  std::string d = r.dflt;
  if (d.size() > 2 && d.front() == '<' && d.back() == '>') {
    auto colon = d.find(':');
    auto dot = d.rfind('.', colon);
    if (colon != std::string::npos && dot != std::string::npos)
      return d.substr(dot + 1, colon - dot - 1);
  }
  std::replace(d.begin(), d.end(), '"', '\'');
  return d;
}

// Python's str() of one parsed token of this flag's type.
std::string scalar_str(const FlagRow& r, const std::string& tok) {
  if (is_int_type(r))
    if (auto v = to_int(tok)) return std::to_string(*v);
  if (is_float_type(r))
    if (auto v = to_float(tok)) return python_float(*v);
  return tok;
}

std::string list_str(const FlagRow& r, const std::vector<std::string>& toks) {
  std::vector<std::string> items;
  for (const auto& t : toks) {
    std::string s = scalar_str(r, t);
    items.push_back(is_int_type(r) || is_float_type(r) ? s : "'" + s + "'");
  }
  return "[" + join(items, ", ") + "]";
}

// ---- what the command line said ---------------------------------------------------------

struct Given {
  const FlagRow* row = nullptr;
  std::string spelling;             // as typed, without "=value"
  std::vector<std::string> tokens;  // Store: the values; bool actions: none
  bool flag_value = false;          // bool actions: the value stored
  std::string str() const {
    if (is_bool_action(*row)) return flag_value ? "True" : "False";
    if (is_list(*row)) return list_str(*row, tokens);
    return scalar_str(*row, tokens.at(0));
  }
};

// Same value as Megatron's default? Numbers compare as numbers ("1e-5" == "1e-05").
bool equals_default(const Given& g) {
  const FlagRow& r = *g.row;
  const std::string d = default_name(r);
  if (!is_bool_action(r) && !is_list(r) && d != "None") {
    if (is_int_type(r) || is_float_type(r)) {
      auto a = to_float(g.tokens.at(0)), b = to_float(d);
      return a && b && *a == *b;
    }
  }
  if (is_bool_action(r) && d == "None") return false;
  return g.str() == d;
}

// ---- typed fields: the list of implemented dests -----------------------------------------

int64_t get_int(const Given& g) { return *to_int(g.tokens.at(0)); }
double get_float(const Given& g) { return *to_float(g.tokens.at(0)); }

void assign(int64_t& f, const Given& g) { f = get_int(g); }
void assign(double& f, const Given& g) { f = get_float(g); }
void assign(bool& f, const Given& g) { f = g.flag_value; }
void assign(std::string& f, const Given& g) { f = g.tokens.at(0); }
void assign(std::optional<int64_t>& f, const Given& g) { f = get_int(g); }
void assign(std::optional<double>& f, const Given& g) { f = get_float(g); }
void assign(std::optional<std::string>& f, const Given& g) { f = g.tokens.at(0); }
void assign(std::vector<std::string>& f, const Given& g) { f = g.tokens; }
void assign(std::vector<int64_t>& f, const Given& g) {
  f.clear();
  for (const auto& t : g.tokens) f.push_back(*to_int(t));
}

std::string show(int64_t v) { return std::to_string(v); }
std::string show(double v) { return python_float(v); }
std::string show(bool v) { return v ? "True" : "False"; }
std::string show(const std::string& v) { return v; }
template <typename T>
std::string show(const std::optional<T>& v) {
  return v ? show(*v) : "None";
}
std::string show(const std::vector<std::string>& v) {
  if (v.empty()) return "None";
  std::vector<std::string> q;
  for (const auto& s : v) q.push_back("'" + s + "'");
  return "[" + join(q, ", ") + "]";
}

std::string show(const std::vector<int64_t>& v) {
  std::vector<std::string> q;
  for (int64_t x : v) q.push_back(std::to_string(x));
  return "[" + join(q, ", ") + "]";
}

template <auto M>
void set_field(Args& a, const Given& g) {
  assign(a.*M, g);
}
template <auto M>
std::string show_field(const Args& a) {
  return show(a.*M);
}

struct Binding {
  const char* dest;
  void (*set)(Args&, const Given&);  // null: derived, shown by print_args but not a flag here
  std::string (*show)(const Args&);
};

#define MCPP_FLAG(name) \
  Binding { #name, &set_field < &Args::name>, &show_field < &Args::name> }
#define MCPP_DERIVED(name) \
  Binding { #name, nullptr, &show_field < &Args::name> }

// THE list of implemented dests: a flag of Megatron's table is implemented iff it is here.
// Add a line when a feature lands (and a field to Args, and a test).
const Binding kBindings[] = {
    // model shape
    MCPP_FLAG(num_layers),
    MCPP_FLAG(hidden_size),
    MCPP_FLAG(ffn_hidden_size),
    MCPP_FLAG(num_attention_heads),
    MCPP_FLAG(kv_channels),
    MCPP_FLAG(group_query_attention),
    MCPP_FLAG(num_query_groups),
    MCPP_FLAG(seq_length),
    MCPP_FLAG(max_position_embeddings),
    MCPP_FLAG(position_embedding_type),
    MCPP_FLAG(use_rotary_position_embeddings),
    MCPP_FLAG(rotary_base),
    MCPP_FLAG(rotary_percent),
    MCPP_FLAG(make_vocab_size_divisible_by),
    MCPP_FLAG(normalization),
    MCPP_FLAG(layernorm_epsilon),
    MCPP_FLAG(swiglu),
    MCPP_FLAG(untie_embeddings_and_output_weights),
    MCPP_FLAG(add_bias_linear),
    MCPP_FLAG(hidden_dropout),
    MCPP_FLAG(attention_dropout),
    MCPP_FLAG(init_method_std),
    // batch and length
    MCPP_FLAG(micro_batch_size),
    MCPP_FLAG(global_batch_size),
    MCPP_FLAG(train_iters),
    MCPP_FLAG(train_samples),
    MCPP_FLAG(skip_train),
    // optimizer and schedules
    MCPP_FLAG(optimizer),
    MCPP_FLAG(lr),
    MCPP_FLAG(min_lr),
    MCPP_FLAG(lr_decay_style),
    MCPP_FLAG(lr_decay_iters),
    MCPP_FLAG(lr_decay_samples),
    MCPP_FLAG(lr_warmup_iters),
    MCPP_FLAG(lr_warmup_samples),
    MCPP_FLAG(lr_warmup_fraction),
    MCPP_FLAG(lr_warmup_init),
    MCPP_FLAG(lr_wsd_decay_style),
    MCPP_FLAG(lr_wsd_decay_iters),
    MCPP_FLAG(lr_wsd_decay_samples),
    MCPP_FLAG(weight_decay),
    MCPP_FLAG(start_weight_decay),
    MCPP_FLAG(end_weight_decay),
    MCPP_FLAG(weight_decay_incr_style),
    MCPP_FLAG(adam_beta1),
    MCPP_FLAG(adam_beta2),
    MCPP_FLAG(adam_eps),
    MCPP_FLAG(clip_grad),
    MCPP_FLAG(override_opt_param_scheduler),
    MCPP_FLAG(use_checkpoint_opt_param_scheduler),
    MCPP_FLAG(seed),
    // data and tokenizer
    MCPP_FLAG(mock_data),
    MCPP_FLAG(tokenizer_type),
    MCPP_FLAG(vocab_size),
    MCPP_FLAG(vocab_file),
    MCPP_FLAG(merge_file),
    MCPP_FLAG(tokenizer_model),
    MCPP_FLAG(tiktoken_pattern),
    MCPP_FLAG(tiktoken_num_special_tokens),
    MCPP_FLAG(special_tokens),
    MCPP_FLAG(vocab_extra_ids),
    MCPP_FLAG(data_path),
    MCPP_FLAG(data_cache_path),
    MCPP_FLAG(nccl_communicator_config_path),
    MCPP_FLAG(split),
    MCPP_FLAG(eod_mask_loss),
    MCPP_FLAG(reset_position_ids),
    MCPP_FLAG(reset_attention_mask),
    // evaluation and logging
    MCPP_FLAG(eval_interval),
    MCPP_FLAG(eval_iters),
    MCPP_FLAG(log_interval),
    MCPP_FLAG(log_throughput),
    MCPP_FLAG(timing_log_level),
    MCPP_FLAG(logging_level),
    MCPP_FLAG(profile),
    MCPP_FLAG(profile_step_start),
    MCPP_FLAG(profile_step_end),
    MCPP_FLAG(profile_ranks),
    MCPP_FLAG(attention_backend),
    // parallelism (CP, EP: size 1 only, checked in validate_args)
    MCPP_FLAG(tensor_model_parallel_size),
    MCPP_FLAG(pipeline_model_parallel_size),
    MCPP_FLAG(context_parallel_size),
    MCPP_FLAG(expert_model_parallel_size),
    MCPP_FLAG(sequence_parallel),
    MCPP_FLAG(use_tp_pp_dp_mapping),
    MCPP_FLAG(decoder_first_pipeline_num_layers),
    MCPP_FLAG(decoder_last_pipeline_num_layers),
    MCPP_FLAG(num_layers_per_virtual_pipeline_stage),
    MCPP_FLAG(num_virtual_stages_per_pipeline_rank),
    MCPP_FLAG(microbatch_group_size_per_vp_stage),
    MCPP_FLAG(recompute_granularity),
    MCPP_FLAG(recompute_method),
    MCPP_FLAG(recompute_num_layers),
    MCPP_FLAG(recompute_activations),
    MCPP_FLAG(use_distributed_optimizer),
    MCPP_FLAG(overlap_grad_reduce),
    MCPP_FLAG(overlap_param_gather),
    MCPP_FLAG(ddp_bucket_size),
    MCPP_FLAG(grad_reduce_in_bf16),
    // precision and initialisation
    MCPP_FLAG(bf16),
    MCPP_FLAG(fp16),
    MCPP_FLAG(loss_scale),
    MCPP_FLAG(initial_loss_scale),
    MCPP_FLAG(min_loss_scale),
    MCPP_FLAG(loss_scale_window),
    MCPP_FLAG(hysteresis),
    MCPP_FLAG(use_cpu_initialization),
    // checkpointing and exit
    MCPP_FLAG(save),
    MCPP_FLAG(load),
    MCPP_FLAG(save_interval),
    MCPP_FLAG(exit_interval),
    MCPP_FLAG(exit_duration_in_mins),
    MCPP_FLAG(no_load_optim),
    MCPP_FLAG(no_load_rng),
    MCPP_FLAG(no_save_optim),
    MCPP_FLAG(no_save_rng),
    MCPP_FLAG(finetune),
    MCPP_FLAG(ckpt_step),
    MCPP_FLAG(async_save),
    MCPP_FLAG(exit_signal_handler),
    MCPP_FLAG(distributed_timeout_minutes),
    // megatron.cpp's own flags
    MCPP_FLAG(device),
    MCPP_FLAG(threads),
    MCPP_FLAG(pipeline_schedule),
    MCPP_FLAG(keep_mlp_activations),
    // derived values print_args shows (as Megatron's args namespace holds them)
    MCPP_DERIVED(world_size),
    MCPP_DERIVED(data_parallel_size),
    MCPP_DERIVED(padded_vocab_size),
    MCPP_DERIVED(virtual_pipeline_model_parallel_size),
};

#undef MCPP_FLAG
#undef MCPP_DERIVED

// Flags whose request megatron.cpp always satisfies. `values` lists the accepted values
// (Python str() form, '|'-separated); empty accepts any.
struct ByDesign {
  const char* dest;
  const char* values;
  const char* reason;
};

const ByDesign kByDesign[] = {
    {"use_flash_attn", "",
     "attention always runs as one fused blockwise (flash) kernel; nothing to switch on"},
    {"deterministic_mode", "",
     "training is bitwise deterministic by default (GEMM tuning keeps only candidates equal to "
     "cuBLASLt's first pick, cuDNN's attention backward runs its deterministic path); "
     "MCPP_ATTENTION_DETERMINISTIC=0 is the opt-out (docs/environment.md)"},
    {"transformer_impl", "local|transformer_engine",
     "megatron.cpp has one Transformer implementation of its own; Transformer Engine is not "
     "needed"},
    {"masked_softmax_fusion", "",
     "the causal mask and softmax are always fused inside the attention kernel"},
    {"attention_softmax_in_fp32", "", "the attention kernel always computes its softmax in fp32"},
    {"bias_gelu_fusion", "", "kernel fusion is megatron.cpp's choice and does not change results"},
    {"bias_swiglu_fusion", "",
     "kernel fusion is megatron.cpp's choice and does not change results"},
    {"bias_dropout_fusion", "",
     "kernel fusion is megatron.cpp's choice and does not change results"},
    {"apply_rope_fusion", "", "kernel fusion is megatron.cpp's choice and does not change results"},
    {"no_persist_layer_norm", "",
     "norms use megatron.cpp's own kernels; Apex's persistent LayerNorm does not exist here"},
    {"gradient_accumulation_fusion", "",
     "weight gradients always accumulate into fp32 gradient buffers; fusing that into the GEMM "
     "is a kernel detail"},
    {"accumulate_allreduce_grads_in_fp32", "",
     "gradients are always accumulated in fp32 buffers, and reduced in fp32 unless "
     "--grad-reduce-in-bf16 is given"},
    {"cross_entropy_loss_fusion", "",
     "the vocab-parallel cross-entropy is one op of megatron.cpp's catalogue already"},
    {"cross_entropy_fusion_impl", "", "the vocab-parallel cross-entropy has one implementation"},
    {"distributed_backend", "nccl|gloo",
     "the communication backend follows --device: NCCL for GPU tensors, MPI for CPU tensors"},
    {"num_workers", "",
     "the data loader reads memory-mapped .bin files in the trainer process; there are no "
     "Python DataLoader workers"},
    {"dataloader_type", "single",
     "the pretraining sampler (consumed-samples offset, mbs*DP slices) is the only loader"},
    {"deprecated_use_mcore_models", "",
     "megatron.cpp has only Megatron-Core models, with Megatron-Core parameter names"},
    {"manual_gc", "", "C++ has no garbage collector to schedule"},
    {"manual_gc_interval", "", "C++ has no garbage collector to schedule"},
    {"manual_gc_eval", "", "C++ has no garbage collector to schedule"},
    {"disable_jit_fuser", "", "there is no TorchScript JIT: kernels are compiled ahead of time"},
    {"enable_one_logger", "False", "megatron.cpp never sends telemetry to OneLogger"},
};

// ---- lookup -----------------------------------------------------------------------------

struct Spelling {
  const FlagRow* row;
  bool ours;
};

const std::unordered_map<std::string, Spelling>& spellings() {
  static const auto* m = [] {
    auto* m = new std::unordered_map<std::string, Spelling>;
    for (const auto& r : kMegatronFlags)
      for (const auto& s : split_on(r.flags, ' ')) (*m)[s] = {&r, false};
    for (const auto& r : kOurFlags)
      for (const auto& s : split_on(r.flags, ' ')) (*m)[s] = {&r, true};
    return m;
  }();
  return *m;
}

const Binding* find_binding(const std::string& dest) {
  for (const auto& b : kBindings)
    if (dest == b.dest) return &b;
  return nullptr;
}

const ByDesign* find_by_design(const std::string& dest) {
  for (const auto& b : kByDesign)
    if (dest == b.dest) return &b;
  return nullptr;
}

const FlagRow* row_of(const std::string& dest) {
  for (const auto& r : kOurFlags)
    if (dest == r.dest) return &r;
  for (const auto& r : kMegatronFlags)
    if (dest == r.dest) return &r;
  return nullptr;
}

std::string first_spelling(const FlagRow& r) { return split_on(r.flags, ' ').at(0); }

std::string flag_name(const std::string& dest) {
  const FlagRow* r = row_of(dest);
  return r ? first_spelling(*r) : "--" + dest;
}

[[noreturn]] void unknown_flag(const std::string& name) {
  std::vector<std::string> all;
  for (const auto& [s, _] : spellings()) all.push_back(s);
  std::sort(all.begin(), all.end());
  std::string probe = name;
  if (probe.size() > 1 && probe[1] != '-') probe = "-" + probe;  // "-lr" -> "--lr"
  auto near = closest(probe, all);
  std::string what = "unknown flag " + name;
  if (!near.empty()) what += "; did you mean " + join(near, " or ") + "?";
  throw Error(what, fmt::format("`megatron train --help` lists the flags megatron.cpp "
                                "implements; {} explains the rest",
                                kFlagsDoc));
}

// Converts and checks one value token of `row` (type and choices), as argparse does.
void check_value(const FlagRow& row, const std::string& spelling, const std::string& tok) {
  if (is_int_type(row) && !to_int(tok))
    throw Error(fmt::format("{} expects an integer, got '{}'", spelling, tok),
                fmt::format("write a whole number, e.g. {} 8", spelling));
  if (is_float_type(row) && !to_float(tok))
    throw Error(fmt::format("{} expects a number, got '{}'", spelling, tok),
                fmt::format("write a decimal number, e.g. {} 1e-4", spelling));
  // Python's float() takes "nan" and "inf"; no flag of ours means anything by them, and a
  // NaN passes every later `x >= 0` check the wrong way (--lr nan "is negative").
  if (is_float_type(row) && !std::isfinite(*to_float(tok)))
    throw Error(fmt::format("{} expects a finite number, got '{}'", spelling, tok),
                fmt::format("write a decimal number, e.g. {} 1e-4", spelling));
  if (!row.choices[0]) return;
  std::vector<std::string> names;
  bool numeric = true;
  for (const auto& c : split_on(row.choices, '|')) {
    names.push_back(choice_name(row, c));
    numeric = numeric && to_int(c).has_value();
  }
  // Enum choices printed as numbers (--exit-signal) are converted from names by Megatron.
  if (numeric && std::string_view(row.type) == "enum_type_handler") return;
  const std::string v = scalar_str(row, tok);
  if (std::find(names.begin(), names.end(), v) != names.end()) return;
  auto near = closest(v, names);
  throw Error(
      fmt::format("{}: '{}' is not one of {}", spelling, tok, join(names, ", ")),
      near.empty() ? "pick one of the listed values" : fmt::format("did you mean '{}'?", near[0]));
}

}  // namespace

// ---- public: tables ---------------------------------------------------------------------

std::span<const FlagRow> megatron_flag_table() { return kMegatronFlags; }
std::span<const FlagRow> mcpp_flag_table() { return kOurFlags; }

FlagSupport flag_support(const std::string& dest) {
  for (const auto& r : kOurFlags)
    if (dest == r.dest) return FlagSupport::Ours;
  if (const Binding* b = find_binding(dest); b && b->set) return FlagSupport::Implemented;
  if (find_by_design(dest)) return FlagSupport::ByDesign;
  return FlagSupport::NotImplemented;
}

std::string python_float(double v) {
  std::string s = fmt::format("{}", v);
  if (s.find_first_of(".eni") == std::string::npos) s += ".0";  // 1 -> 1.0; not 1e-05/inf/nan
  return s;
}

// ---- public: parsing --------------------------------------------------------------------

Args parse_args(const std::vector<std::string>& argv) {
  Args args;
  std::map<std::string, Given> given;  // by dest; a repeated flag overwrites (last wins)
  const auto& index = spellings();

  for (size_t i = 0; i < argv.size();) {
    const std::string& tok = argv[i++];
    if (tok == "-h" || tok == "--help") {
      args.help = true;
      continue;
    }
    if (!is_flag_token(tok))
      throw Error(
          fmt::format("unexpected argument '{}': it follows no flag that takes a value", tok),
          "flags start with --; check the quoting of the previous flag's value, and "
          "that the previous flag takes a value at all");
    std::string name = tok;
    std::optional<std::string> inline_value;
    if (auto eq = tok.find('='); eq != std::string::npos) {
      name = tok.substr(0, eq);
      inline_value = tok.substr(eq + 1);
    }
    auto it = index.find(name);
    if (it == index.end()) unknown_flag(name);
    const FlagRow& row = *it->second.row;

    Given g;
    g.row = &row;
    g.spelling = name;
    if (is_bool_action(row)) {
      if (inline_value)
        throw Error(fmt::format("{} takes no value (got '{}')", name, *inline_value),
                    fmt::format("write {} alone", name));
      if (row.action == FlagAction::StoreTrue) g.flag_value = true;
      if (row.action == FlagAction::StoreFalse) g.flag_value = false;
      if (row.action == FlagAction::BooleanOptional)
        g.flag_value = name != first_spelling(row) ? false : true;  // --no-x is the 2nd spelling
    } else {
      const std::string nargs = row.nargs;
      if (inline_value) {
        g.tokens.push_back(*inline_value);
      } else if (nargs.empty()) {
        if (i >= argv.size() || is_flag_token(argv[i]))
          throw Error(fmt::format("{} needs a value", name),
                      fmt::format("write {} VALUE (Megatron's default is {})", name, row.dflt));
        g.tokens.push_back(argv[i++]);
      } else {
        while (i < argv.size() && !is_flag_token(argv[i])) g.tokens.push_back(argv[i++]);
      }
      if (nargs == "+" && g.tokens.empty())
        throw Error(fmt::format("{} needs at least one value", name),
                    fmt::format("write {} VALUE [VALUE ...]", name));
      if (auto n = to_int(nargs); n && static_cast<int64_t>(g.tokens.size()) != *n)
        throw Error(fmt::format("{} needs exactly {} values, got {}", name, *n, g.tokens.size()),
                    fmt::format("write {} followed by {} values", name, *n));
      for (const auto& t : g.tokens) check_value(row, name, t);
    }
    given[row.dest] = std::move(g);
  }

  std::vector<std::string> not_implemented;
  for (const auto& [dest, g] : given) {
    args.given[dest] = g.str();
    if (const Binding* b = find_binding(dest); b && b->set) {
      b->set(args, g);
      continue;
    }
    if (const ByDesign* d = find_by_design(dest)) {
      auto ok = split_on(d->values, '|');
      if (ok.empty() || equals_default(g) || std::count(ok.begin(), ok.end(), g.str())) continue;
      throw Error(
          fmt::format("{} {} is not supported by megatron.cpp (accepted: {}): {}", g.spelling,
                      g.str(), join(ok, ", "), d->reason),
          fmt::format("drop {} or give one of the accepted values; see {}", g.spelling, kFlagsDoc));
    }
    if (equals_default(g)) continue;  // harmless: asks for what Megatron does by default
    not_implemented.push_back(
        fmt::format("{} is a Megatron-LM flag that megatron.cpp does not implement yet (given {}, "
                    "Megatron's default is {})",
                    g.spelling, g.str(), g.row->dflt));
  }
  if (!not_implemented.empty())
    throw Error(join(not_implemented, "\n"),
                fmt::format("remove the flag(s) or set them to Megatron's default; {} lists "
                            "what megatron.cpp implements and how to ask for more",
                            kFlagsDoc));
  return args;
}

// ---- public: validation -----------------------------------------------------------------

namespace {

// Pipeline layout, schedule and activation recomputation, as Megatron's validate_args and
// TransformerConfig.__post_init__ check them -- here, before any process group exists.
void validate_pipeline(Args& a) {
  namespace pl = parallel::pipeline;
  const int64_t pp = a.pipeline_model_parallel_size;
  MCPP_CHECK_HINT(pp >= 1, "give --pipeline-model-parallel-size a value >= 1",
                  "--pipeline-model-parallel-size {} must be positive", pp);
  MCPP_CHECK_HINT(!(a.num_layers_per_virtual_pipeline_stage &&
                    a.num_virtual_stages_per_pipeline_rank),
                  "give one of the two",
                  "--num-layers-per-virtual-pipeline-stage and "
                  "--num-virtual-stages-per-pipeline-rank cannot be set at the same time");
  int64_t vpp = 1;
  if (a.num_layers_per_virtual_pipeline_stage) {
    MCPP_CHECK_HINT(!a.decoder_first_pipeline_num_layers && !a.decoder_last_pipeline_num_layers,
                    "use --num-virtual-stages-per-pipeline-rank with uneven first/last stages",
                    "--num-layers-per-virtual-pipeline-stage cannot be combined with "
                    "--decoder-first/last-pipeline-num-layers (as in Megatron)");
    vpp = pl::virtual_stages_from_layers_per_stage(
        int(a.num_layers), int(pp), int(*a.num_layers_per_virtual_pipeline_stage));
  } else if (a.num_virtual_stages_per_pipeline_rank) {
    vpp = *a.num_virtual_stages_per_pipeline_rank;
    MCPP_CHECK_HINT(vpp >= 1, "give --num-virtual-stages-per-pipeline-rank a value >= 1",
                    "--num-virtual-stages-per-pipeline-rank {} must be positive", vpp);
  }
  MCPP_CHECK_HINT(vpp == 1 || pp > 1,
                  "drop the virtual-stage flag, or raise --pipeline-model-parallel-size",
                  "the interleaved schedule (virtual stages) needs "
                  "--pipeline-model-parallel-size > 1, got {}",
                  pp);
  a.virtual_pipeline_model_parallel_size = vpp;
  // Layer partition (every stage's share divisible by its chunks) and schedule shape
  // (micro-batch groups), with the errors naming the flags.
  auto opt_int = [](const std::optional<int64_t>& v) {
    return v ? std::optional<int>(int(*v)) : std::nullopt;
  };
  const auto layers = pl::assign_layers(int(a.num_layers), int(pp), int(vpp),
                                        opt_int(a.decoder_first_pipeline_num_layers),
                                        opt_int(a.decoder_last_pipeline_num_layers));
  MCPP_CHECK_HINT(a.pipeline_schedule != "gpipe" || vpp == 1,
                  "drop --pipeline-schedule gpipe, or the virtual-stage flag",
                  "--pipeline-schedule gpipe runs one model chunk per rank; virtual stages "
                  "need the (interleaved) 1F1B schedule");
  if (a.microbatch_group_size_per_vp_stage)
    MCPP_CHECK_HINT(vpp > 1, "drop the flag, or use virtual stages",
                    "--microbatch-group-size-per-virtual-pipeline-stage applies to the "
                    "interleaved schedule only (no virtual stages given)");
  if (vpp > 1)
    pl::build_schedule(pl::ScheduleKind::Interleaved1F1B, int(pp), int(vpp),
                       int(a.num_microbatches),
                       int(a.microbatch_group_size_per_vp_stage.value_or(0)));

  // Recomputation.
  if (a.recompute_activations) {
    MCPP_CHECK_HINT(!a.recompute_granularity || *a.recompute_granularity == "selective",
                    "drop --recompute-activations (it means --recompute-granularity selective)",
                    "--recompute-activations contradicts --recompute-granularity {}",
                    *a.recompute_granularity);
    a.recompute_granularity = "selective";
  }
  const std::string gran = a.recompute_granularity.value_or("");
  size_t fewest = SIZE_MAX;  // layers of the smallest model chunk
  for (const auto& ch : layers) fewest = std::min(fewest, ch.size());
  if (gran == "full") {
    MCPP_CHECK_HINT(a.recompute_method.has_value(), "add --recompute-method uniform (or block)",
                    "--recompute-granularity full needs --recompute-method uniform|block");
    MCPP_CHECK_HINT(a.recompute_num_layers.has_value(), "add --recompute-num-layers 1",
                    "--recompute-granularity full needs --recompute-num-layers");
    const bool uniform = *a.recompute_method == "uniform";
    // uniform: groups of N layers over the whole model; block: the first N of each chunk.
    const int64_t most_rc = uniform ? a.num_layers : int64_t(fewest);
    MCPP_CHECK_HINT(*a.recompute_num_layers >= 1 && *a.recompute_num_layers <= most_rc,
                    fmt::format("give --recompute-num-layers between 1 and {} (the layers of "
                                "{})",
                                most_rc, uniform ? "the model" : "each model chunk"),
                    "--recompute-num-layers {} is outside [1, {} = {}] for --recompute-method {}",
                    *a.recompute_num_layers,
                    uniform ? "--num-layers" : "layers per model chunk", most_rc,
                    *a.recompute_method);
  } else if (gran == "selective") {
    MCPP_CHECK_HINT(!a.recompute_method, "drop --recompute-method",
                    "--recompute-method {} applies to --recompute-granularity full only",
                    *a.recompute_method);
    MCPP_CHECK_HINT(!a.recompute_num_layers, "drop --recompute-num-layers",
                    "--recompute-num-layers applies to --recompute-granularity full only");
  } else {
    MCPP_CHECK_HINT(!a.recompute_method && !a.recompute_num_layers,
                    "add --recompute-granularity full",
                    "--recompute-method/--recompute-num-layers given without "
                    "--recompute-granularity full");
  }
  // --keep-mlp-activations applies to the layers full recomputation leaves stored; asking
  // for it where every layer is recomputed (method uniform; block over whole chunks) would
  // keep nothing, so it is an error rather than a flag silently without effect.
  if (gran == "full" && a.keep_mlp_activations > 0) {
    size_t most = 0;  // layers of the largest model chunk
    for (const auto& ch : layers) most = std::max(most, ch.size());
    const bool all_recomputed =
        *a.recompute_method == "uniform" || *a.recompute_num_layers >= int64_t(most);
    MCPP_CHECK_HINT(!all_recomputed,
                    "drop --keep-mlp-activations, or use --recompute-method block with "
                    "--recompute-num-layers below the layers per model chunk",
                    "--keep-mlp-activations {} keeps nothing with --recompute-granularity full "
                    "--recompute-method {} --recompute-num-layers {}: every layer is "
                    "recomputed whole, activations included",
                    a.keep_mlp_activations, *a.recompute_method, *a.recompute_num_layers);
  }
}

}  // namespace

constexpr int64_t kMaxThreads = 4096;

void validate_args(Args& a, int world_size, bool training) {
  MCPP_CHECK_HINT(world_size >= 1, "launch at least one process", "world size {} is not positive",
                  world_size);
  a.world_size = world_size;

  // Features whose flag is implemented only for some values (for now).
  if (a.use_rotary_position_embeddings) a.position_embedding_type = "rope";
  MCPP_CHECK_HINT(
      a.position_embedding_type == "learned_absolute" || a.position_embedding_type == "rope",
      "use --position-embedding-type learned_absolute or rope",
      "--position-embedding-type {} is not implemented yet by megatron.cpp",
      a.position_embedding_type);
  MCPP_CHECK_HINT(a.optimizer == "adam", "use --optimizer adam (AdamW, Megatron's default)",
                  "--optimizer {} is not implemented yet by megatron.cpp", a.optimizer);
  MCPP_CHECK_HINT(a.context_parallel_size == 1, "drop --context-parallel-size for now",
                  "--context-parallel-size {}: context parallelism is not implemented yet; only "
                  "1 is supported now",
                  a.context_parallel_size);
  MCPP_CHECK_HINT(a.expert_model_parallel_size == 1, "drop --expert-model-parallel-size for now",
                  "--expert-model-parallel-size {}: expert parallelism is not implemented yet; "
                  "only 1 is supported now",
                  a.expert_model_parallel_size);
  {
    static const std::set<std::string> ok = {
        "GPT2BPETokenizer",     "SentencePieceTokenizer", "GPTSentencePieceTokenizer",
        "HuggingFaceTokenizer", "Llama2Tokenizer",        "TikTokenizer",
        "NullTokenizer"};
    MCPP_CHECK_HINT(ok.count(a.tokenizer_type),
                    "use GPT2BPETokenizer, SentencePieceTokenizer, GPTSentencePieceTokenizer, "
                    "HuggingFaceTokenizer, Llama2Tokenizer, TikTokenizer or NullTokenizer",
                    "--tokenizer-type {} is not implemented by megatron.cpp (GPT pretraining "
                    "tokenizers only)",
                    a.tokenizer_type);
  }

  // Required flags, all reported at once.
  {
    std::vector<std::string> missing;
    auto need = [&](bool ok, const char* flag) {
      if (!ok) missing.push_back(flag);
    };
    need(a.was_given("num_layers"), "--num-layers");
    need(a.was_given("hidden_size"), "--hidden-size");
    need(a.was_given("num_attention_heads"), "--num-attention-heads");
    need(a.was_given("max_position_embeddings"), "--max-position-embeddings");
    need(a.was_given("seq_length"), "--seq-length");
    need(a.was_given("micro_batch_size"), "--micro-batch-size");
    if (training) need(a.was_given("lr"), "--lr");
    MCPP_CHECK_HINT(missing.empty(),
                    "e.g. --num-layers 12 --hidden-size 768 --num-attention-heads 12 "
                    "--seq-length 1024 --max-position-embeddings 1024 --micro-batch-size 4 "
                    "--lr 6e-4",
                    "missing required flag(s): {}", join(missing, ", "));
  }

  // Sizes must be positive (non-negative where 0 means "none").
  auto positive = [&](int64_t v, const char* flag) {
    MCPP_CHECK_HINT(v > 0, fmt::format("give {} a value >= 1", flag), "{} {} must be positive",
                    flag, v);
  };
  auto non_negative = [&](int64_t v, const char* flag) {
    MCPP_CHECK_HINT(v >= 0, fmt::format("give {} a value >= 0", flag), "{} {} must not be negative",
                    flag, v);
  };
  positive(a.num_layers, "--num-layers");
  positive(a.hidden_size, "--hidden-size");
  positive(a.num_attention_heads, "--num-attention-heads");
  positive(a.seq_length, "--seq-length");
  positive(a.max_position_embeddings, "--max-position-embeddings");
  positive(a.micro_batch_size, "--micro-batch-size");
  positive(a.tensor_model_parallel_size, "--tensor-model-parallel-size");
  positive(a.make_vocab_size_divisible_by, "--make-vocab-size-divisible-by");
  positive(a.log_interval, "--log-interval");
  if (a.was_given("ffn_hidden_size")) positive(a.ffn_hidden_size, "--ffn-hidden-size");
  if (a.was_given("kv_channels")) positive(a.kv_channels, "--kv-channels");
  if (a.was_given("global_batch_size")) positive(a.global_batch_size, "--global-batch-size");
  if (a.group_query_attention) positive(a.num_query_groups, "--num-query-groups");
  if (a.train_samples) positive(*a.train_samples, "--train-samples");
  if (a.was_given("train_iters")) non_negative(a.train_iters, "--train-iters");
  if (a.vocab_size) positive(*a.vocab_size, "--vocab-size");
  if (a.eval_interval) positive(*a.eval_interval, "--eval-interval");
  if (a.save_interval) positive(*a.save_interval, "--save-interval");
  if (a.exit_interval) positive(*a.exit_interval, "--exit-interval");
  if (a.lr_decay_iters) positive(*a.lr_decay_iters, "--lr-decay-iters");
  if (a.lr_decay_samples) positive(*a.lr_decay_samples, "--lr-decay-samples");
  non_negative(a.eval_iters, "--eval-iters");
  non_negative(a.lr_warmup_iters, "--lr-warmup-iters");
  non_negative(a.lr_warmup_samples, "--lr-warmup-samples");
  non_negative(a.threads, "--threads");
  // One OpenMP thread per core is the most that helps; 100000 threads exhaust the process
  // (a crash inside the OpenMP runtime, not an error).
  MCPP_CHECK_HINT(a.threads <= kMaxThreads,
                  "give --threads at most the number of cores (0: OpenMP's default)",
                  "--threads {} is more than {}", a.threads, kMaxThreads);
  non_negative(a.keep_mlp_activations, "--keep-mlp-activations");
  positive(a.pipeline_model_parallel_size, "--pipeline-model-parallel-size");
  positive(a.context_parallel_size, "--context-parallel-size");
  positive(a.distributed_timeout_minutes, "--distributed-timeout-minutes");
  // Token ids are int32 on the device (NullTokenizer's EOD is --vocab-size itself).
  if (a.vocab_size)
    MCPP_CHECK_HINT(*a.vocab_size < INT32_MAX, "give --vocab-size below 2^31 - 1",
                    "--vocab-size {} does not fit the int32 token ids", *a.vocab_size);
  if (a.split) (void)data::parse_split(*a.split);  // the error names the bad weight

  // Parallel layout: world = TP * PP * CP * DP.
  const int64_t model_size =
      a.tensor_model_parallel_size * a.pipeline_model_parallel_size * a.context_parallel_size;
  MCPP_CHECK_HINT(
      world_size % model_size == 0,
      fmt::format("launch a multiple of {} processes, or change the parallel sizes", model_size),
      "world size ({}) is not divisible by --tensor-model-parallel-size {} x "
      "--pipeline-model-parallel-size {} x --context-parallel-size {} = {}",
      world_size, a.tensor_model_parallel_size, a.pipeline_model_parallel_size,
      a.context_parallel_size, model_size);
  a.data_parallel_size = world_size / model_size;

  MCPP_CHECK_HINT(!(a.bf16 && a.fp16), "give one of --bf16 and --fp16",
                  "--bf16 and --fp16 were both given");
  // The loss-scaling flags act on --fp16 only; other values than Megatron's defaults
  // would be silently ignored otherwise.
  const std::pair<const char*, bool> scaling[] = {
      {"loss_scale", a.loss_scale.has_value()},
      {"initial_loss_scale", a.initial_loss_scale != 4294967296.0},
      {"min_loss_scale", a.min_loss_scale != 1.0},
      {"loss_scale_window", a.loss_scale_window != 1000},
      {"hysteresis", a.hysteresis != 2}};
  for (auto [f, changed] : scaling)
    MCPP_CHECK_HINT(a.fp16 || !changed, "drop it, or train with --fp16",
                    "{} scales the loss of --fp16 training only (bf16 and fp32 need no loss "
                    "scaling)",
                    flag_name(f));

  // Attention shape (Megatron: kv_channels = h / heads; groups = heads unless GQA).
  if (!a.was_given("kv_channels")) {
    MCPP_CHECK_HINT(a.hidden_size % a.num_attention_heads == 0,
                    "choose --hidden-size as a multiple of --num-attention-heads, or give the "
                    "head dimension with --kv-channels",
                    "--hidden-size {} is not divisible by --num-attention-heads {}", a.hidden_size,
                    a.num_attention_heads);
    a.kv_channels = a.hidden_size / a.num_attention_heads;
  }
  if (!a.group_query_attention) a.num_query_groups = a.num_attention_heads;
  MCPP_CHECK_HINT(a.num_attention_heads % a.num_query_groups == 0,
                  "choose --num-query-groups as a divisor of --num-attention-heads",
                  "--num-attention-heads {} is not divisible by --num-query-groups {}",
                  a.num_attention_heads, a.num_query_groups);
  const int64_t tp = a.tensor_model_parallel_size;
  MCPP_CHECK_HINT(a.num_attention_heads % tp == 0,
                  "choose --tensor-model-parallel-size as a divisor of the head count",
                  "--num-attention-heads {} is not divisible by --tensor-model-parallel-size {}",
                  a.num_attention_heads, tp);
  MCPP_CHECK_HINT(a.num_query_groups % tp == 0,
                  "choose --tensor-model-parallel-size as a divisor of --num-query-groups "
                  "(each TP rank holds whole key/value groups)",
                  "--num-query-groups {} is not divisible by --tensor-model-parallel-size {}",
                  a.num_query_groups, tp);

  // Megatron: "--sequence-parallel requires TP > 1", silently switched off at TP 1.
  if (tp == 1) a.sequence_parallel = false;
  if (a.sequence_parallel)
    MCPP_CHECK_HINT(a.seq_length % tp == 0,
                    "choose --seq-length as a multiple of --tensor-model-parallel-size",
                    "--sequence-parallel splits --seq-length {} over --tensor-model-parallel-size "
                    "{}: not divisible",
                    a.seq_length, tp);
  MCPP_CHECK_HINT(!a.overlap_param_gather || a.use_distributed_optimizer,
                  "add --use-distributed-optimizer or drop --overlap-param-gather",
                  "--overlap-param-gather needs --use-distributed-optimizer (as in Megatron)");
  if (a.ddp_bucket_size)
    MCPP_CHECK_HINT(*a.ddp_bucket_size > 0, "give a positive number of elements",
                    "--ddp-bucket-size {} must be positive", *a.ddp_bucket_size);
  // Megatron's flag switches a bf16 run's gradient reduction from fp32 to bf16; without
  // --bf16 it would ask for nothing that happens, so it must not pass silently.
  MCPP_CHECK_HINT(!a.grad_reduce_in_bf16 || a.bf16,
                  a.fp16 ? "train with --bf16 instead of --fp16, or drop --grad-reduce-in-bf16"
                         : "add --bf16 (GPU training), or drop --grad-reduce-in-bf16",
                  "--grad-reduce-in-bf16 needs --bf16 (it reduces the gradients of bf16 "
                  "training in bf16); {} was given",
                  a.fp16 ? "--fp16" : "neither --bf16 nor --fp16");
  if (a.grad_reduce_in_bf16 && a.data_parallel_size == 1)
    log::info(
        "--grad-reduce-in-bf16 has no effect: the data-parallel size is 1, so no "
        "gradients are reduced over data-parallel ranks");

  // MLP width (Megatron: 4h, or int(4h*2/3 / 64)*64 = (h/24)*64 with SwiGLU).
  if (!a.was_given("ffn_hidden_size"))
    a.ffn_hidden_size = a.swiglu ? (a.hidden_size / 24) * 64 : 4 * a.hidden_size;
  MCPP_CHECK_HINT(a.ffn_hidden_size > 0, "give --ffn-hidden-size explicitly",
                  "derived --ffn-hidden-size is 0 for --hidden-size {}", a.hidden_size);

  MCPP_CHECK_HINT(a.seq_length <= a.max_position_embeddings,
                  fmt::format("raise --max-position-embeddings to at least {} (or shorten "
                              "--seq-length)",
                              a.seq_length),
                  "--seq-length {} is larger than --max-position-embeddings {}", a.seq_length,
                  a.max_position_embeddings);
  MCPP_CHECK_HINT(a.rotary_percent > 0.0 && a.rotary_percent <= 1.0,
                  "give --rotary-percent in (0, 1]; 1.0 rotates the whole head",
                  "--rotary-percent {} is outside (0, 1]", a.rotary_percent);
  MCPP_CHECK_HINT(a.hidden_dropout >= 0.0 && a.hidden_dropout < 1.0,
                  "give --hidden-dropout in [0, 1); 0 disables it",
                  "--hidden-dropout {} is outside [0, 1)", a.hidden_dropout);
  MCPP_CHECK_HINT(a.attention_dropout >= 0.0 && a.attention_dropout < 1.0,
                  "give --attention-dropout in [0, 1); 0 disables it",
                  "--attention-dropout {} is outside [0, 1)", a.attention_dropout);
  MCPP_CHECK_HINT(a.layernorm_epsilon > 0.0, "give --norm-epsilon > 0, e.g. 1e-5",
                  "--norm-epsilon {} must be positive", a.layernorm_epsilon);
  MCPP_CHECK_HINT(a.init_method_std > 0.0, "give --init-method-std > 0, e.g. 0.02",
                  "--init-method-std {} must be positive", a.init_method_std);

  // Batch: global = micro * DP * num_microbatches.
  const int64_t per_step = a.micro_batch_size * a.data_parallel_size;
  if (!a.was_given("global_batch_size")) a.global_batch_size = per_step;
  if (a.global_batch_size % per_step != 0) {
    const int64_t lo = a.global_batch_size / per_step * per_step;
    throw Error(
        fmt::format("--global-batch-size {} is not a multiple of --micro-batch-size {} x "
                    "data-parallel size {} = {}",
                    a.global_batch_size, a.micro_batch_size, a.data_parallel_size, per_step),
        fmt::format(
            "use a multiple of {}, e.g. {}", per_step,
            lo > 0 ? fmt::format("{} or {}", lo, lo + per_step) : std::to_string(per_step)));
  }
  a.num_microbatches = a.global_batch_size / per_step;

  validate_pipeline(a);

  // Tokenizer needs.
  if (a.tokenizer_type == "NullTokenizer")
    MCPP_CHECK_HINT(a.vocab_size.has_value(), "add --vocab-size N (e.g. --vocab-size 50257)",
                    "--tokenizer-type NullTokenizer needs --vocab-size");
  if (a.tokenizer_type == "GPT2BPETokenizer")
    MCPP_CHECK_HINT(a.vocab_file && a.merge_file,
                    "give --vocab-file gpt2-vocab.json --merge-file gpt2-merges.txt, or use "
                    "--tokenizer-type NullTokenizer --vocab-size N with --mock-data",
                    "--tokenizer-type GPT2BPETokenizer (pretrain_gpt.py's default) needs "
                    "--vocab-file and --merge-file");
  if (a.tokenizer_type != "NullTokenizer" && a.tokenizer_type != "GPT2BPETokenizer")
    MCPP_CHECK_HINT(a.tokenizer_model.has_value(),
                    "give --tokenizer-model PATH (the .model / tokenizer.json / tiktoken file)",
                    "--tokenizer-type {} needs --tokenizer-model", a.tokenizer_type);

  if (!a.data_path.empty() && !a.split) a.split = "969, 30, 1";  // Megatron's default, warned

  if (!training) return;

  // Training length and schedule (Megatron: iteration-based xor sample-based).
  const bool iters = a.was_given("train_iters");
  MCPP_CHECK_HINT(iters != a.train_samples.has_value(),
                  "give --train-iters N (optimizer steps) or --train-samples N (sequences)",
                  "give exactly one of --train-iters and --train-samples ({})",
                  iters ? "both were given" : "neither was given");
  MCPP_CHECK_HINT(!a.data_path.empty() || a.mock_data,
                  "give --data-path PREFIX (a Megatron .bin/.idx prefix) or --mock-data",
                  "no training data: neither --data-path nor --mock-data was given");
  if (iters) {
    MCPP_CHECK_HINT(!a.lr_decay_samples, "use --lr-decay-iters with --train-iters",
                    "--lr-decay-samples is for sample-based runs (--train-samples), but "
                    "--train-iters was given");
    MCPP_CHECK_HINT(a.lr_warmup_samples == 0, "use --lr-warmup-iters with --train-iters",
                    "--lr-warmup-samples is for sample-based runs, but --train-iters was given");
    MCPP_CHECK_HINT(!a.lr_wsd_decay_samples, "use --lr-wsd-decay-iters with --train-iters",
                    "--lr-wsd-decay-samples is for sample-based runs, but --train-iters was "
                    "given");
    MCPP_CHECK_HINT(!(a.lr_warmup_fraction && a.lr_warmup_iters != 0),
                    "drop one of them: the fraction is of the decay length",
                    "can only specify one of --lr-warmup-fraction ({}) and --lr-warmup-iters "
                    "({})",
                    a.lr_warmup_fraction.value_or(0), a.lr_warmup_iters);
    if (!a.lr_decay_iters) a.lr_decay_iters = a.train_iters;
    if (a.lr_decay_style == "WSD")
      MCPP_CHECK_HINT(a.lr_wsd_decay_iters.has_value(),
                      "add --lr-wsd-decay-iters N (length of the final decay phase)",
                      "--lr-decay-style WSD needs --lr-wsd-decay-iters");
  } else {
    MCPP_CHECK_HINT(!a.lr_decay_iters, "use --lr-decay-samples with --train-samples",
                    "--lr-decay-iters is for iteration-based runs, but --train-samples was "
                    "given");
    MCPP_CHECK_HINT(a.lr_warmup_iters == 0, "use --lr-warmup-samples with --train-samples",
                    "--lr-warmup-iters is for iteration-based runs, but --train-samples was "
                    "given");
    MCPP_CHECK_HINT(!a.lr_wsd_decay_iters, "use --lr-wsd-decay-samples with --train-samples",
                    "--lr-wsd-decay-iters is for iteration-based runs, but --train-samples was "
                    "given");
    MCPP_CHECK_HINT(!(a.lr_warmup_fraction && a.lr_warmup_samples != 0),
                    "drop one of them: the fraction is of the decay length",
                    "can only specify one of --lr-warmup-fraction ({}) and --lr-warmup-samples "
                    "({})",
                    a.lr_warmup_fraction.value_or(0), a.lr_warmup_samples);
    a.train_iters = *a.train_samples / a.global_batch_size;  // Megatron's update_train_iters
    if (!a.lr_decay_samples) a.lr_decay_samples = a.train_samples;
    if (a.lr_decay_style == "WSD")
      MCPP_CHECK_HINT(a.lr_wsd_decay_samples.has_value(),
                      "add --lr-wsd-decay-samples N (length of the final decay phase)",
                      "--lr-decay-style WSD needs --lr-wsd-decay-samples");
  }
  if (a.lr_warmup_fraction)
    MCPP_CHECK_HINT(*a.lr_warmup_fraction >= 0.0 && *a.lr_warmup_fraction < 1.0,
                    "give --lr-warmup-fraction in [0, 1), e.g. 0.01",
                    "--lr-warmup-fraction {} is outside [0, 1)", *a.lr_warmup_fraction);
  MCPP_CHECK_HINT(a.lr >= 0.0, "give --lr > 0", "--lr {} is negative", a.lr);
  // Far beyond any trainable value: every step would overflow to NaN and be skipped.
  MCPP_CHECK_HINT(a.lr <= 1e4, "give --lr a learning rate such as 3e-4",
                  "--lr {} is larger than 1e4: every update would overflow", a.lr);
  MCPP_CHECK_HINT(a.min_lr <= a.lr, "lower --min-lr to at most --lr",
                  "--min-lr {} is larger than --lr {}", a.min_lr, a.lr);
  MCPP_CHECK_HINT(a.lr_warmup_init <= a.lr, "lower --lr-warmup-init to at most --lr",
                  "--lr-warmup-init {} is larger than --lr {}", a.lr_warmup_init, a.lr);

  if (a.weight_decay_incr_style == "constant") {
    MCPP_CHECK_HINT(!a.start_weight_decay && !a.end_weight_decay,
                    "use --weight-decay alone, or pick --weight-decay-incr-style linear|cosine",
                    "--start-weight-decay/--end-weight-decay need a non-constant "
                    "--weight-decay-incr-style");
    a.start_weight_decay = a.end_weight_decay = a.weight_decay;
  } else {
    MCPP_CHECK_HINT(a.start_weight_decay && a.end_weight_decay,
                    "give both --start-weight-decay and --end-weight-decay",
                    "--weight-decay-incr-style {} needs --start-weight-decay and "
                    "--end-weight-decay",
                    a.weight_decay_incr_style);
  }
  MCPP_CHECK_HINT(a.weight_decay >= 0.0, "give --weight-decay >= 0",
                  "--weight-decay {} is negative", a.weight_decay);
  MCPP_CHECK_HINT(a.clip_grad >= 0.0, "give --clip-grad >= 0 (0 disables clipping)",
                  "--clip-grad {} is negative", a.clip_grad);
  MCPP_CHECK_HINT(
      a.adam_beta1 >= 0.0 && a.adam_beta1 < 1.0 && a.adam_beta2 >= 0.0 && a.adam_beta2 < 1.0,
      "give --adam-beta1/--adam-beta2 in [0, 1), e.g. 0.9 and 0.95",
      "--adam-beta1 {} / --adam-beta2 {} must lie in [0, 1)", a.adam_beta1, a.adam_beta2);
  MCPP_CHECK_HINT(a.adam_eps > 0.0, "give --adam-eps > 0, e.g. 1e-8",
                  "--adam-eps {} must be positive", a.adam_eps);

  // The schedule's own checks (warmup shorter than decay, WSD phase inside decay, ...).
  optim::OptimizerParamScheduler check(lr_scheduler_config(a));
  (void)check;
}

optim::SchedulerConfig lr_scheduler_config(const Args& a) {
  MCPP_CHECK_HINT(a.global_batch_size > 0 && (a.lr_decay_iters || a.lr_decay_samples),
                  "call validate_args first", "lr_scheduler_config: arguments not validated");
  optim::SchedulerConfig c;
  c.init_lr = a.lr_warmup_init;
  c.max_lr = a.lr;
  c.min_lr = a.min_lr;
  c.decay_style = optim::parse_lr_decay_style(a.lr_decay_style);
  c.wsd_decay_style = optim::parse_wsd_decay_style(a.lr_wsd_decay_style);
  c.wd_incr_style = optim::parse_wd_incr_style(a.weight_decay_incr_style);
  c.start_wd = a.start_weight_decay.value_or(a.weight_decay);
  c.end_wd = a.end_weight_decay.value_or(a.weight_decay);
  const int64_t gbs = a.global_batch_size;
  if (!a.sample_based()) {  // Megatron's get_optimizer_param_scheduler, iteration branch
    c.decay_steps = a.lr_decay_iters.value_or(a.train_iters) * gbs;
    c.wd_incr_steps = a.train_iters * gbs;
    if (a.lr_wsd_decay_iters) c.wsd_decay_steps = *a.lr_wsd_decay_iters * gbs;
    c.warmup_steps = a.lr_warmup_fraction
                         ? *a.lr_warmup_fraction * static_cast<double>(c.decay_steps)
                         : static_cast<double>(a.lr_warmup_iters * gbs);
  } else {  // sample branch
    c.decay_steps = a.lr_decay_samples.value_or(*a.train_samples);
    c.wd_incr_steps = *a.train_samples;
    c.wsd_decay_steps = a.lr_wsd_decay_samples;
    c.warmup_steps = a.lr_warmup_fraction
                         ? *a.lr_warmup_fraction * static_cast<double>(c.decay_steps)
                         : static_cast<double>(a.lr_warmup_samples);
  }
  return c;
}

// ---- public: vocabulary padding ---------------------------------------------------------

int64_t padded_vocab_size(int64_t orig, int64_t divisible_by, int64_t tp) {
  MCPP_CHECK_HINT(orig > 0, "check the tokenizer / --vocab-size",
                  "vocabulary size {} is not "
                  "positive",
                  orig);
  MCPP_CHECK_HINT(divisible_by > 0 && tp > 0, "give --make-vocab-size-divisible-by >= 1",
                  "cannot pad the vocabulary to a multiple of {} x TP {}", divisible_by, tp);
  const int64_t multiple = divisible_by * tp;
  return (orig + multiple - 1) / multiple * multiple;
}

std::string padded_vocab_message(int64_t orig, int64_t padded) {
  return fmt::format(" > padded vocab (size: {}) with {} dummy tokens (new size: {})", orig,
                     padded - orig, padded);
}

// ---- public: printing -------------------------------------------------------------------

std::string format_args(const Args& a) {
  std::map<std::string, std::string> values;  // dest -> Python str()
  for (const auto& r : kMegatronFlags) {
    auto it = a.given.find(r.dest);
    if (!values.count(r.dest)) values[r.dest] = it != a.given.end() ? it->second : r.dflt;
  }
  for (const auto& b : kBindings) {
    std::string v = b.show(a);
    const FlagRow* r = row_of(b.dest);
    // A required size not given (0) prints as Megatron's None.
    if (r && std::string_view(r->dflt) == "None" && !a.was_given(b.dest) &&
        (v == "0" || v == "0.0"))
      v = "None";
    values[b.dest] = v;
  }
  std::vector<std::string> lines;
  for (const auto& [name, v] : values) {
    const int dots = 48 - static_cast<int>(name.size());
    lines.push_back(fmt::format("  {} {} {}", name, std::string(std::max(dots, 0), '.'), v));
  }
  auto lower = [](std::string s) {
    for (auto& ch : s) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    return s;
  };
  std::stable_sort(lines.begin(), lines.end(),
                   [&](const std::string& x, const std::string& y) { return lower(x) < lower(y); });
  std::string out = "------------------------ arguments ------------------------\n";
  for (const auto& l : lines) out += l + "\n";
  out += "-------------------- end of arguments ---------------------";
  return out;
}

void print_args(const Args& a) { log::info("{}", format_args(a)); }

std::vector<std::string> describe_by_design_flags(const Args& a) {
  std::vector<std::string> out;
  for (const auto& d : kByDesign)
    if (auto it = a.given.find(d.dest); it != a.given.end())
      out.push_back(
          fmt::format("{} {}: accepted by design: {}", flag_name(d.dest), it->second, d.reason));
  return out;
}

std::string help_text() {
  std::string out =
      "usage: megatron train [flags]   (Megatron-LM pretrain_gpt.py flags)\n\n"
      "Implemented Megatron-LM flags:\n";
  auto line = [](const FlagRow& r) {
    std::string spell = join(split_on(r.flags, ' '), ", ");
    std::string meta;
    if (r.action == FlagAction::Store)
      meta = r.choices[0] ? " {" + join(split_on(r.choices, '|'), ",") + "}"
             : is_list(r) ? " VALUE [VALUE ...]"
                          : " " + std::string(is_int_type(r)     ? "N"
                                              : is_float_type(r) ? "X"
                                                                 : "S");
    if (is_bool_action(r)) return fmt::format("  {}\n", spell);  // a switch: no default shown
    return fmt::format("  {}{}  (default: {})\n", spell, meta, r.dflt);
  };
  std::string group;
  for (const auto& r : kMegatronFlags) {
    if (flag_support(r.dest) != FlagSupport::Implemented) continue;
    if (group != r.group) out += fmt::format(" [{}]\n", group = r.group);
    out += line(r);
  }
  out += "\nAccepted by design (megatron.cpp always behaves this way):\n";
  for (const auto& d : kByDesign) out += fmt::format("  {}: {}\n", flag_name(d.dest), d.reason);
  out += "\nmegatron.cpp's own flags (not Megatron-LM's):\n";
  for (const auto& r : kOurFlags) out += line(r);
  out += fmt::format(
      "\nEvery other Megatron-LM flag is accepted only with its default value; see {}.\n",
      kFlagsDoc);
  return out;
}

}  // namespace mcpp::training
