// Megatron's validate_args (megatron/training/arguments.py), by area: each function checks
// one area's flags and fills its derived defaults, with errors that name the flag and end
// in a HINT. validate_args() runs them in an order where every check sees the defaults it
// depends on (the data-parallel size before the batch, the batch before the pipeline
// schedule). Parsing, the flag table and printing are arguments.cpp's.
#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "base/error.h"
#include "base/log.h"
#include "checkpoint/strictness.h"
#include "data/gpt_dataset.h"
#include "optim/lr_scheduler.h"
#include "parallel/pipeline/layout.h"
#include "parallel/pipeline/schedule.h"
#include "training/arguments.h"
#include "training/memory_plan.h"
#include "training/validate_compat.h"
#include "training/validate_fp8.h"
#include "training/validate_moe.h"
#include "training/validate_window.h"

namespace mcpp::training {

void validate_rope(const Args& a);  // validate_rope.cpp
void validate_mla(Args& a);         // validate_mla.cpp
void validate_mtp(const Args& a);   // validate_mtp.cpp
void validate_fim(const Args& a);   // fim_setup.cpp
void validate_optimizer_rule(Args& a);  // validate_optimizer.cpp
void validate_data_sources(Args& a, bool training);  // validate_data_sources.cpp
// --recompute-modules under selective recomputation (validate_recompute.cpp).
void validate_recompute_modules(Args& a);

namespace {

constexpr int64_t kMaxThreads = 4096;

std::string join(const std::vector<std::string>& v, const char* sep) {
  return fmt::format("{}", fmt::join(v, sep));
}

// What megatron.cpp does not implement yet (the flag exists, some values are errors),
// and the tokenizer types it has.
void validate_features(Args& a) {
  // Features whose flag is implemented only for some values (for now).
  if (a.use_rotary_position_embeddings) a.position_embedding_type = "rope";
  MCPP_CHECK_HINT(
      a.position_embedding_type == "learned_absolute" || a.position_embedding_type == "rope" ||
          a.position_embedding_type == "yarn" || a.position_embedding_type == "none",
      "use --position-embedding-type learned_absolute, rope, yarn or none",
      "--position-embedding-type {} is not implemented yet by megatron.cpp",
      a.position_embedding_type);
  // Megatron's rule: the deprecated switch is allowed with RoPE only (no learned table there).
  MCPP_CHECK_HINT(a.add_position_embedding || a.position_embedding_type == "rope",
                  "drop --no-position-embedding, or use --position-embedding-type rope",
                  "--no-position-embedding with --position-embedding-type {}: the switch is "
                  "deprecated in Megatron-LM and allowed only with rope",
                  a.position_embedding_type);
  validate_optimizer_rule(a);
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

}

// The flags Megatron's GPT pretraining cannot run without, all reported at once.
void validate_required(const Args& a, bool training) {
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

}

// Sizes and counts: positive where 0 means nothing, non-negative where 0 means "none",
// and the limits a process can hold.
void validate_sizes(const Args& a) {
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
  if (const auto& n = a.check_weight_hash_across_dp_replicas_interval)
    positive(*n, "--check-weight-hash-across-dp-replicas-interval");
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

}

// Model shape: attention heads and groups, the MLP width, positions, dropout, norms and
// initialisation (Megatron's TransformerConfig.__post_init__ checks).
void validate_model(Args& a) {
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
  // Megatron keeps the bias switches in sync: every linear's bias includes linear_qkv's, so
  // --add-qkv-bias without --disable-bias-linear changes nothing (and is no error).
  if (a.add_bias_linear) a.add_qkv_bias = true;
  MCPP_CHECK_HINT(a.num_attention_heads % a.num_query_groups == 0,
                  "choose --num-query-groups as a divisor of --num-attention-heads",
                  "--num-attention-heads {} is not divisible by --num-query-groups {}",
                  a.num_attention_heads, a.num_query_groups);
  // Megatron's core_transformer_config_from_args: `assert not args.swiglu` under
  // --squared-relu (squared ReLU replaces the gated SiLU; there is no gated squared ReLU).
  MCPP_CHECK_HINT(!(a.squared_relu && a.swiglu), "give one of --squared-relu and --swiglu",
                  "--squared-relu and --swiglu both choose the MLP's activation (squared ReLU is "
                  "not gated); Megatron-LM refuses them together");
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
  validate_rope(a);  // scaling, interpolation, --rope-type (validate_rope.cpp)
  validate_mla(a);   // multi-latent attention (validate_mla.cpp)
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
  const double surplus = a.mid_level_dataset_surplus;
  MCPP_CHECK_HINT(surplus >= 0.0 && std::isfinite(surplus),
                  "give --mid-level-dataset-surplus >= 0 (Megatron's default is 0.005)",
                  "--mid-level-dataset-surplus {} must be a non-negative number",
                  a.mid_level_dataset_surplus);
  if (const auto e = a.embedding_init_method_std)
    MCPP_CHECK_HINT(*e > 0.0 && std::isfinite(*e), "give --embedding-init-method-std > 0",
                    "--embedding-init-method-std {} must be positive", *e);

}

// Parallel layout: world = TP x PP x CP x DP, what TP splits (heads, groups, the sequence
// under SP), the data-parallel options, then the batch into micro-batches and the
// pipeline (validate_pipeline).
void validate_parallel_layout(Args& a, int world_size) {
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

}

void validate_tensor_parallel(Args& a) {
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

}

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
  if (a.pipeline_model_parallel_layout) {
    // Megatron: at most one of the three virtual-stage flags; the layout's stage count over
    // PP is the virtual pipeline size (its other checks: stage_layers below).
    MCPP_CHECK_HINT(!a.num_layers_per_virtual_pipeline_stage &&
                        !a.num_virtual_stages_per_pipeline_rank,
                    "drop the virtual-stage flag: the layout's stages / PP set it",
                    "--pipeline-model-parallel-layout cannot be combined with "
                    "--num-layers-per-virtual-pipeline-stage or "
                    "--num-virtual-stages-per-pipeline-rank (as in Megatron)");
    const auto stages = int64_t(pl::expand_layout(*a.pipeline_model_parallel_layout).size());
    if (pp > 1 && stages % pp == 0) vpp = stages / pp;  // else stage_layers' error names it
  } else if (a.num_layers_per_virtual_pipeline_stage) {
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
  const auto layers = stage_layers(a);
  MCPP_CHECK_HINT(a.pipeline_schedule != "gpipe" || vpp == 1,
                  "drop --pipeline-schedule gpipe, or the virtual-stage flag",
                  "--pipeline-schedule gpipe runs one model chunk per rank; virtual stages "
                  "need the (interleaved) 1F1B schedule");
  if (a.microbatch_group_size_per_vp_stage)
    MCPP_CHECK_HINT(vpp > 1, "drop the flag, or use virtual stages",
                    "--microbatch-group-size-per-virtual-pipeline-stage applies to the "
                    "interleaved schedule only (no virtual stages given)");
  if (vpp > 1) {
    pl::build_schedule(pl::ScheduleKind::Interleaved1F1B, int(pp), int(vpp),
                       int(a.num_microbatches),
                       int(a.microbatch_group_size_per_vp_stage.value_or(0)));
    // Evaluation's forward-only schedule, from its own micro-batch count.
    if (a.eval_num_microbatches != a.num_microbatches) try {
        pl::build_schedule(pl::ScheduleKind::Interleaved1F1B, int(pp), int(vpp),
                           int(a.eval_num_microbatches),
                           int(a.microbatch_group_size_per_vp_stage.value_or(0)));
      } catch (const Error& e) {
        throw Error(fmt::format("--eval-global-batch-size {}: {}", *a.eval_global_batch_size,
                                e.summary()),
                    e.hint());
      }
  }

  // Recomputation. --moe-layer-recompute: Megatron's deprecated spelling of
  // --recompute-granularity selective with moe added to the modules (an error with full).
  if (a.moe_layer_recompute) {
    MCPP_CHECK_HINT(a.recompute_granularity.value_or("selective") == "selective",
                    "drop --moe-layer-recompute, or use --recompute-granularity selective",
                    "--moe-layer-recompute with --recompute-granularity {}: Megatron refuses it "
                    "with full recomputation",
                    *a.recompute_granularity);
    a.recompute_granularity = "selective";
    if (a.recompute_modules.empty()) a.recompute_modules = {"core_attn"};
    if (std::find(a.recompute_modules.begin(), a.recompute_modules.end(), "moe") ==
        a.recompute_modules.end())
      a.recompute_modules.push_back("moe");
    static bool said = false;  // validate_args may run more than once (`megatron plan`)
    if (!std::exchange(said, true))
      log::info("--moe-layer-recompute is deprecated in Megatron-LM: it means "
                "--recompute-granularity selective --recompute-modules {}",
                fmt::format("{}", fmt::join(a.recompute_modules, " ")));
  }
  if (a.recompute_activations) {
    MCPP_CHECK_HINT(!a.recompute_granularity || *a.recompute_granularity == "selective",
                    "drop --recompute-activations (it means --recompute-granularity selective)",
                    "--recompute-activations contradicts --recompute-granularity {}",
                    *a.recompute_granularity);
    a.recompute_granularity = "selective";
  }
  const std::string gran = a.recompute_granularity.value_or("");
  // Megatron reads --recompute-modules only under selective granularity; here a value that
  // would change nothing is an error rather than silently ignored.
  MCPP_CHECK_HINT(gran == "selective" || a.recompute_modules.empty(),
                  "add --recompute-granularity selective (or --recompute-activations), or drop "
                  "--recompute-modules",
                  "--recompute-modules {} applies to --recompute-granularity selective only",
                  fmt::format("{}", fmt::join(a.recompute_modules, " ")));
  // Layers of the smallest model chunk; a layout's chunks without layers recompute nothing.
  size_t fewest = SIZE_MAX;
  for (const auto& ch : layers)
    if (!ch.empty()) fewest = std::min(fewest, ch.size());
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
    validate_recompute_modules(a);
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

// Precision: one of bf16/fp16, and the loss-scaling flags only where they act.
void validate_precision(const Args& a) {
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

}

// Data and tokenizer: what each tokenizer type needs, Megatron's default split.
void validate_data(Args& a) {
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
}

// Training length, learning-rate and weight-decay schedules, optimizer constants
// (training only: generation and conversion validate the model alone).
void validate_optimizer(Args& a) {
  // Training length and schedule (Megatron: iteration-based xor sample-based).
  const bool iters = a.was_given("train_iters");
  MCPP_CHECK_HINT(iters != a.train_samples.has_value(),
                  "give --train-iters N (optimizer steps) or --train-samples N (sequences)",
                  "give exactly one of --train-iters and --train-samples ({})",
                  iters ? "both were given" : "neither was given");
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
    // Megatron's update_train_iters, by the global batch as given (before any decrease)
    a.train_iters = *a.train_samples / (a.global_batch_size + a.batch_size_deficit);
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

}  // namespace

void validate_context_parallel(Args& a);  // validate_cp.cpp
void validate_distributed_optimizer_instances(const Args& a);  // validate_distopt.cpp
void validate_observe(const Args& a);  // validate_observe.cpp: TensorBoard and timer flags
void validate_qk_layernorm(Args& a);  // ---- q/k layernorm (validate_qk_layernorm.cpp)
void validate_mup(Args& a);           // ---- muP (validate_mup.cpp)
void validate_no_rope(Args& a);       // ---- --no-rope-freq (validate_rope.cpp)
void validate_ckpt_format(Args& a);  // --ckpt-format, conversion (validate_ckpt_format.cpp)
void validate_batch(Args& a);  // batch sizes, schedules, evaluation's (validate_batch.cpp)
void validate_attention_sink(const Args& a);  // --softmax-type (validate_attention_sink.cpp)
// --quick-geglu, --glu-linear-offset, --activation-func-clamp-value (validate_activation.cpp)
void validate_activation(const Args& a);

void validate_args(Args& a, int world_size, bool training) {
  MCPP_CHECK_HINT(world_size >= 1, "launch at least one process", "world size {} is not positive",
                  world_size);
  a.world_size = world_size;
  validate_features(a);
  validate_required(a, training);
  validate_sizes(a);
  validate_parallel_layout(a, world_size);
  validate_precision(a);
  validate_model(a);
  validate_tensor_parallel(a);
  validate_context_parallel(a);
  validate_moe(a);  // mixture of experts (validate_moe.cpp)
  validate_activation(a);  // the MLP's activation (validate_activation.cpp)
  validate_mtp(a);  // multi-token prediction (validate_mtp.cpp)
  validate_window(a);  // sliding-window attention (validate_window.cpp)
  validate_attention_sink(a);  // --softmax-type
  validate_distributed_optimizer_instances(a);
  validate_batch(a);
  validate_pipeline(a);
  validate_data(a);
  validate_data_sources(a, training);
  validate_fim(a);  // fill-in-the-middle (fim_setup.cpp)
  if (training) validate_optimizer(a);
  validate_compat(a, training);  // the example scripts' flags (validate_compat.cpp)
  validate_observe(a);
  validate_fp8(a);  // ---- FP8 (validate_fp8.cpp)
  validate_qk_layernorm(a);  // ---- q/k layernorm
  validate_mup(a);           // ---- muP (validate_mup.cpp)
  validate_no_rope(a);       // ---- --no-rope-freq (validate_rope.cpp)
  validate_ckpt_format(a);   // after validate_pipeline (virtual stages) and validate_moe
  // --dist-ckpt-strictness: return_unexpected / return_all refused (checkpoint/strictness.h).
  checkpoint::parse_strictness(a.dist_ckpt_strictness);
}

}  // namespace mcpp::training
