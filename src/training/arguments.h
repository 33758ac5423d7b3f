// Megatron-LM command-line flags -> Args, and Megatron's validate_args() with clear errors.
//
// Every flag of Megatron-LM's pretrain_gpt.py is known (flag_table.inc, generated from the
// parser by scripts/gen_flag_table.py). A flag falls in one of three classes:
//   implemented  its value lands in a typed field of Args below (field name = Megatron dest);
//   by design    accepted, because megatron.cpp always behaves the way the flag asks (the
//                reason is printed at start-up by describe_by_design_flags);
//   known only   accepted when its value equals Megatron's default, an error otherwise
//                ("... is a Megatron-LM flag that megatron.cpp does not implement yet").
// Unknown flags are errors that name the closest known ones. megatron.cpp's own flags
// (--device, --threads) live in a separate small table and are marked as ours in --help.
//
// Life of an Args: parse_args(argv) -> validate_args(args, world_size) (fills Megatron's
// derived defaults) -> print_args(args). Fields documented "set by validate_args" hold 0 or
// are empty before that call.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "optim/lr_scheduler.h"

namespace mcpp::training {

// ---- the flag table ---------------------------------------------------------------------
enum class FlagAction { Store, StoreTrue, StoreFalse, BooleanOptional };

// One flag of the parser, as Megatron's argparse declares it. Strings are never null.
struct FlagRow {
  const char* group;
  const char* flags;  // every spelling, space-separated: "--no-x --disable-x"
  const char* dest;   // Megatron's attribute name (args.<dest>)
  FlagAction action;
  const char* type;     // "int", "float", "str", "" (argparse default: str), or a helper's name
  const char* nargs;    // "" (one value, or none for store_true/false), "+", "*", "3"
  const char* choices;  // '|'-separated, "" when free
  const char* dflt;     // Python str() of the default: "None", "False", "1e-05", "[]", ...
};

std::span<const FlagRow> megatron_flag_table();  // 838 rows from flag_table.inc
std::span<const FlagRow> mcpp_flag_table();      // megatron.cpp's own flags

// How megatron.cpp treats a dest of either table.
enum class FlagSupport { Implemented, ByDesign, NotImplemented, Ours };
FlagSupport flag_support(const std::string& dest);

// ---- parsed arguments -------------------------------------------------------------------
struct Args {
  // Model shape. 0 = not given; validate_args requires or derives them.
  int64_t num_layers = 0;
  int64_t hidden_size = 0;
  int64_t ffn_hidden_size = 0;  // derived: 4h, or int(4h*2/3/64)*64 with --swiglu
  int64_t num_attention_heads = 0;
  int64_t kv_channels = 0;  // derived: h / heads
  bool group_query_attention = false;
  int64_t num_query_groups = 1;  // validate_args: = heads unless --group-query-attention
  int64_t seq_length = 0;
  int64_t max_position_embeddings = 0;
  std::string position_embedding_type = "learned_absolute";  // learned_absolute|rope|yarn
  bool use_rotary_position_embeddings = false;               // deprecated alias of rope
  // --softmax-type vanilla|off-by-one|learnable: attention sinks (validate_attention_sink.cpp)
  std::string softmax_type = "vanilla";
  int64_t rotary_base = 10000;
  double rotary_percent = 1.0;
  bool use_rope_scaling = false;  // Llama 3.x RoPE scaling (ops/rope_math.h)
  double rope_scaling_factor = 8.0;
  // Its other three values: Megatron's constants, no flags; --use-checkpoint-args takes a
  // checkpoint's own (one converted from a Hugging Face config.json may carry others).
  double rope_low_freq_factor = 1.0, rope_high_freq_factor = 4.0;
  int64_t rope_original_max_positions = 8192;
  // Linear position interpolation: RoPE's positions divided by it (ops/rope_math.h). The
  // flag parses an integer, as Megatron's; a double here because --use-checkpoint-args may
  // take a checkpoint's fractional one (converted from a Hugging Face rope_type "linear").
  std::optional<double> rotary_seq_len_interpolation_factor;
  // --rope-type: the RoPE of multi-latent attention, "rope" or "yarn" (MLA's default when
  // not given); standard attention takes only "rope" (validate_rope.cpp).
  std::optional<std::string> rope_type;
  bool rotary_interleaved = false;  // RoPE on pairs (2i, 2i + 1) (ops/rope_interleave.h)
  // ---- sliding-window attention (validate_window.cpp; docs/model.md). --window-size "L,R"
  // or "(L,R)"; --window-attn-skip-freq N or a list expression (which layers slide).
  std::optional<std::string> window_size;
  std::optional<std::string> window_attn_skip_freq;
  // --no-rope-freq (validate_rope.cpp): N (every N-th layer without RoPE) or a list with one
  // 0/1 per layer, 1 = no RoPE; no_rope_pattern: derived, one entry per layer (empty: none).
  std::optional<std::string> no_rope_freq;
  std::vector<int64_t> no_rope_pattern;
  // Set by validate_window: the window's left extent L (-1: no window; R is always 0 under
  // the causal mask) and, per layer, 1 where the layer is a window layer.
  int64_t window_left = -1;
  std::vector<int64_t> window_layer_pattern;
  // Multi-latent attention (validate_mla.cpp; model/mla_attention.h). q_lora_rank unset:
  // the query is projected from the hidden state directly.
  bool multi_latent_attention = false;
  std::optional<int64_t> q_lora_rank;
  int64_t kv_lora_rank = 32, qk_head_dim = 128, qk_pos_emb_head_dim = 64, v_head_dim = 128;
  // YaRN: MLA's (--rope-type yarn) or standard attention's (--position-embedding-type yarn).
  double rotary_scaling_factor = 1.0, mscale = 1.0, mscale_all_dim = 0.0;
  // Standard attention's YaRN only (None: Megatron's 4096, 32, 1 and True).
  std::optional<int64_t> yarn_original_max_position_embeddings;
  std::optional<double> yarn_beta_fast, yarn_beta_slow;
  std::optional<bool> yarn_correction_range_round_to_int;
  int64_t make_vocab_size_divisible_by = 128;
  std::string normalization = "LayerNorm";  // LayerNorm | RMSNorm
  double layernorm_epsilon = 1e-5;          // --norm-epsilon
  bool swiglu = false;
  bool squared_relu = false;  // --squared-relu: the MLP's activation relu(x)^2 (not gated)
  bool quick_geglu = false;   // --quick-geglu: quick_gelu(x) = x sigmoid(1.702 x), gated
  // GELU's form (memory_plan.cpp: TransformerConfig::gelu_erf): Megatron's bias_gelu fusion
  // computes the tanh form, its unfused MLP torch's exact F.gelu; --openai-gelu: tanh always.
  bool bias_gelu_fusion = true;  // --no-bias-gelu-fusion sets false
  bool openai_gelu = false;      // --openai-gelu
  double glu_linear_offset = 0.0;  // --glu-linear-offset: act(gate) * (up + offset)
  std::optional<double> activation_func_clamp_value;  // --activation-func-clamp-value
  bool untie_embeddings_and_output_weights = false;
  bool add_bias_linear = true;  // --disable-bias-linear sets false
  bool add_qkv_bias = false;    // validate_args: True under add_bias_linear, as Megatron's
  double hidden_dropout = 0.1;
  double attention_dropout = 0.1;
  double init_method_std = 0.02;
  std::optional<double> embedding_init_method_std;  // --embedding-init-method-std

  // Batch and training length.
  int64_t micro_batch_size = 0;
  int64_t global_batch_size = 0;  // derived: mbs * DP
  // --decrease-batch-size-if-needed: a global batch that MBS x DP does not divide is rounded
  // down to a multiple (Megatron's running global batch size; fewer DP ranks after a
  // failure keep training); the samples it lacks, counted as skipped at every step.
  bool decrease_batch_size_if_needed = false;
  int64_t batch_size_deficit = 0;  // derived
  int64_t train_iters = 0;        // derived from train_samples // gbs when sample-based
  std::optional<int64_t> train_samples;
  bool skip_train = false;

  // Optimizer and LR / WD schedule (megatron.md §2.3).
  std::string optimizer = "adam";
  double lr = 0.0;  // required for training
  double min_lr = 0.0;
  std::string lr_decay_style = "linear";
  std::optional<int64_t> lr_decay_iters;    // derived: train_iters (iteration-based)
  std::optional<int64_t> lr_decay_samples;  // derived: train_samples (sample-based)
  int64_t lr_warmup_iters = 0;
  int64_t lr_warmup_samples = 0;
  std::optional<double> lr_warmup_fraction;
  double lr_warmup_init = 0.0;
  std::string lr_wsd_decay_style = "exponential";
  std::optional<int64_t> lr_wsd_decay_iters;
  std::optional<int64_t> lr_wsd_decay_samples;
  double weight_decay = 0.01;
  std::optional<double> start_weight_decay;  // derived: weight_decay for the constant style
  std::optional<double> end_weight_decay;
  std::string weight_decay_incr_style = "constant";
  double adam_beta1 = 0.9;
  double adam_beta2 = 0.999;
  double adam_eps = 1e-8;
  bool init_method_xavier_uniform = false;   // every Normal-initialised weight: Xavier uniform
  bool perform_initialization = true;        // --no-initialization: parameters start at zero
  double sgd_momentum = 0.9;                 // --optimizer sgd
  double lion_beta1 = 0.95, lion_beta2 = 0.98;  // --optimizer lion
  // --optimizer muon (optim/muon.h): Megatron's flags and defaults.
  double muon_momentum = 0.9;
  bool muon_split_qkv = true;  // --muon-no-split-qkv
  bool muon_nesterov = false;
  std::string muon_scale_mode = "spectral";
  std::string muon_fp32_matmul_prec = "medium";
  std::string muon_coefficient_type = "quintic";
  int64_t muon_num_ns_steps = 5;
  std::string muon_tp_mode = "duplicated";
  bool muon_use_syrk = false;
  double muon_extra_scale_factor = 1.0;
  std::string muon_scalar_optimizer = "adam";
  // --use-precision-aware-optimizer (TransformerEngine's FusedAdam state dtypes): the Adam
  // moments in fp32 or bf16; main grads and main params fp32 (validate_optimizer.cpp).
  bool use_precision_aware_optimizer = false;
  std::string exp_avg_dtype = "fp32", exp_avg_sq_dtype = "fp32";
  std::string main_grads_dtype = "fp32", main_params_dtype = "fp32";
  double clip_grad = 1.0;
  bool override_opt_param_scheduler = false;
  bool use_checkpoint_opt_param_scheduler = false;
  int64_t seed = 1234;

  // Data and tokenizer.
  bool mock_data = false;
  std::string tokenizer_type = "GPT2BPETokenizer";  // pretrain_gpt.py's args_defaults
  std::optional<int64_t> vocab_size;
  std::optional<std::string> vocab_file, merge_file, tokenizer_model;
  // --tokenizer-hf-no-include-special-tokens (data::TokenizerArgs::include_special_tokens).
  bool tokenizer_hf_no_include_special_tokens = false;
  // --null-tokenizer-eod-id / --null-tokenizer-pad-id (data::NullTokenizer).
  std::optional<int64_t> null_tokenizer_eod_id;
  int64_t null_tokenizer_pad_id = -1;
  std::optional<std::string> tiktoken_pattern;  // --tiktoken-pattern v1|v2 (TikTokenizer)
  int64_t tiktoken_num_special_tokens = 1000;   // --tiktoken-num-special-tokens
  std::vector<std::string> special_tokens;      // --tokenizer-special-tokens
  int64_t vocab_extra_ids = 0;                  // --vocab-extra-ids (SentencePieceTokenizer)
  std::vector<std::string> data_path;  // "prefix" or "w1 p1 w2 p2 ..." (nargs *)
  // Each split from its own blend (Megatron's blend_per_split), as --data-path's words.
  std::vector<std::string> train_data_path, valid_data_path, test_data_path;
  std::optional<std::string> data_args_path;            // a file of --data-path words
  std::optional<std::string> per_split_data_args_path;  // JSON {"train", "valid", "test"}
  std::optional<std::string> data_cache_path;
  // --mid-level-dataset-surplus: each blended component builds ceil(weight x samples) x
  // (1 + surplus) samples (data::BuildArgs::mid_level_dataset_surplus).
  double mid_level_dataset_surplus = 0.005;
  std::optional<std::string> nccl_communicator_config_path;
  std::optional<std::string> split;  // derived: "969, 30, 1" when --data-path is given
  bool eod_mask_loss = false;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  // Fill-in-the-middle (data/fim.h; checked by validate_fim.cpp; token strings resolved
  // against the tokenizer when the datasets are built).
  bool fim_data = false;
  double fim_rate = 0.5, fim_spm_rate = 0.5;
  std::optional<std::string> fim_split_sample;  // a token: documents cut into fragments at it
  std::optional<double> fim_fragment_rate;      // FIM rate of each fragment
  std::optional<std::string> fim_no_prefix;     // no FIM for a document whose text starts so
  std::string fim_prefix_token = "<fim_prefix>", fim_middle_token = "<fim_middle>";
  std::string fim_suffix_token = "<fim_suffix>", fim_pad_token = "<fim_pad>";
  std::string fim_eod_token = "<|endoftext|>";

  // Evaluation and logging.
  std::optional<int64_t> eval_interval;
  int64_t eval_iters = 100;
  // --eval-global-batch-size (derived: --global-batch-size when not given): the samples of
  // one evaluation iteration; --eval-micro-batch-size (must equal --micro-batch-size for
  // now); --start-eval-at-iter: no periodic evaluation before that iteration.
  std::optional<int64_t> eval_global_batch_size, eval_micro_batch_size, start_eval_at_iter;
  int64_t eval_num_microbatches = 0;  // derived: eval global batch / (micro-batch x DP)
  // --full-validation: every evaluation reads the validation set's epoch (Megatron's full
  // validation sampler: one sample a micro-batch, DP rank r reading samples r, r + DP, ...,
  // cyclically, for ceil(N / DP) iterations); --multiple-validation-sets (needs it): each
  // prefix of --valid-data-path is its own set with its own loss, named by
  // --validation-set-names or by its index (data/validation_sets.h, trainer.cpp).
  bool full_validation = false, multiple_validation_sets = false;
  std::vector<std::string> validation_set_names;
  int64_t log_interval = 100;
  bool log_throughput = false;
  // --log-progress: lines appended to <--save>/progress.txt at the start of the job and at
  // every checkpoint save (training/progress_log.h).
  bool log_progress = false;
  int64_t timing_log_level = 0;
  // --log-straggler: every rank's time, GPU readings and throughput at each log line, their
  // minimum and maximum printed with the rank (training/straggler.h).
  bool log_straggler = false;
  int64_t straggler_ctrlr_port = 65535;
  int64_t straggler_minmax_count = 1;
  bool disable_straggler_on_startup = false;
  std::optional<int64_t> logging_level;  // Python logging level: 10 debug, 20 info, ...
  // --profile: per-op GPU time (and NVTX ranges, cudaProfilerStart/Stop) over Megatron's
  // window, the steps after profile_step_start completed iterations up to profile_step_end
  // (training/profiler.h). Needs --device cuda.
  bool profile = false;
  int64_t profile_step_start = 10;
  int64_t profile_step_end = 12;
  std::vector<int64_t> profile_ranks = {0};  // global ranks that profile
  // Iterations whose global batch is consumed without a step (Megatron's skip of bad data).
  std::vector<int64_t> iterations_to_skip;

  // Which attention kernel runs on the GPU (ops/attention_backend.h): auto, fused (cuDNN),
  // flash (own kernel), unfused / local (CUDA-core kernel).
  std::string attention_backend = "auto";

  // Parallelism. world_size, data_parallel_size and num_microbatches are set by validate_args.
  int64_t tensor_model_parallel_size = 1;
  int64_t pipeline_model_parallel_size = 1;
  std::optional<int64_t> decoder_first_pipeline_num_layers;    // uneven first stage
  std::optional<int64_t> decoder_last_pipeline_num_layers;     // uneven last stage
  // "Et*3|(tt|)*2tmL": every stage's layers (parallel/pipeline/layout.h); sets the
  // virtual stages
  std::optional<std::string> pipeline_model_parallel_layout;
  std::optional<int64_t> num_layers_per_virtual_pipeline_stage;  // interleaved schedule
  std::optional<int64_t> num_virtual_stages_per_pipeline_rank;   // interleaved schedule
  std::optional<int64_t> microbatch_group_size_per_vp_stage;     // default: PP
  int64_t virtual_pipeline_model_parallel_size = 1;  // derived: model chunks per rank
  int64_t context_parallel_size = 1;         // --context-parallel-size (validate_cp.cpp)
  int64_t expert_model_parallel_size = 1;    // 1 only for now
  bool sequence_parallel = false;            // --sequence-parallel (off at TP 1, as Megatron)
  bool use_tp_pp_dp_mapping = false;         // order tp-cp-ep-pp-dp instead of tp-cp-ep-dp-pp
  bool use_distributed_optimizer = false;    // ZeRO-1: optimizer state sharded over DP
  int64_t num_distributed_optimizer_instances = 1;  // each holds the whole state, DP*CP/N ranks
  bool overlap_grad_reduce = false;          // bucket reductions start during backward
  bool overlap_param_gather = false;         // dist-opt param all-gathers wait in forward
  std::optional<int64_t> ddp_bucket_size;    // elements per gradient bucket
  bool grad_reduce_in_bf16 = false;          // DP collectives carry bf16 (needs --bf16)
  int64_t world_size = 0;
  int64_t data_parallel_size = 0;
  int64_t num_microbatches = 0;

  // Activation recomputation.
  std::optional<std::string> recompute_granularity;  // full | selective
  std::optional<std::string> recompute_method;       // uniform | block (full only)
  std::optional<int64_t> recompute_num_layers;       // layers per group (uniform) / recomputed (block)
  bool recompute_activations = false;                // = --recompute-granularity selective
  // --recompute-modules: what selective recomputation re-runs (Megatron's names; empty:
  // Megatron's default, core_attn). validate_args fills the default and checks the names.
  std::vector<std::string> recompute_modules;
  bool moe_layer_recompute = false;  // = selective with moe in --recompute-modules (deprecated)

  // Precision and initialisation.
  bool bf16 = false, fp16 = false;
  // fp16 loss scaling (Megatron's grad scaler): --loss-scale gives a constant scale, else
  // the dynamic scale starts at --initial-loss-scale, halves after --hysteresis overflows
  // (never below --min-loss-scale) and doubles after --loss-scale-window clean steps.
  std::optional<double> loss_scale;
  double initial_loss_scale = 4294967296.0;  // 2^32
  double min_loss_scale = 1.0;
  double loss_scale_window = 1000;           // a float in Megatron's parser
  int64_t hysteresis = 2;
  bool use_cpu_initialization = false;

  // Checkpointing and exit.
  std::optional<std::string> save, load;
  std::optional<int64_t> save_interval;
  std::optional<int64_t> exit_interval;
  std::optional<int64_t> exit_duration_in_mins;
  // Every N iterations (and before the first), every data-parallel replica's weights must
  // hash the same (training/weight_hash.h), else an error on every rank.
  std::optional<int64_t> check_weight_hash_across_dp_replicas_interval;
  bool no_load_optim = false, no_load_rng = false;
  bool no_save_optim = false, no_save_rng = false;
  bool finetune = false;
  std::optional<int64_t> ckpt_step;        // --ckpt-step: load this iteration, not the latest
  // --override-ckpt-iteration N: the loaded run continues as iteration N, its data from
  // N x global batch samples on (Megatron's rewind of the data loader); not with --finetune.
  std::optional<int64_t> override_ckpt_iteration;
  // --log-energy: the iteration line's "energy per GPU (J/iter/GPU)" and "power per GPU
  // (W/GPU)", from NVML's energy counter (CUDA only; training/training_log.cpp).
  bool log_energy = false;
  bool async_save = false;                 // --async-save: write on a background thread
  bool exit_signal_handler = false;        // --exit-signal-handler: the signal -> save, exit 0
  std::string exit_signal = "SIGTERM";     // --exit-signal: its name (Python's signal.Signals)
  int64_t distributed_timeout_minutes = 10;
  // --fake-process-group: this process plays rank RANK of WORLD_SIZE (comm/fake), no
  // exchange; for measuring one rank's memory and compute. No checkpoint is read or written.
  bool fake_process_group = false;
  // --save-retain-interval N: after each save the checkpoint saved before it is deleted
  // unless its iteration is a multiple of N (checkpoint::SaveOptions::retain_interval).
  std::optional<int64_t> save_retain_interval;
  // --pretrained-checkpoint DIR: loaded as --finetune when --load holds no checkpoint.
  std::optional<std::string> pretrained_checkpoint;
  bool exit_on_missing_checkpoint = false;  // --load holding no checkpoint is an error
  // --dist-ckpt-strictness: parameters and buffers on one side only when loading
  // (checkpoint/strictness.h; return_unexpected / return_all are refused by validation).
  std::string dist_ckpt_strictness = "assume_ok_unexpected";
  // --ckpt-fully-parallel-load: the DP x CP replicas of a shard split its reading and
  // exchange it. --no-ckpt-fully-parallel-save: DP rank 0 writes the whole model shard
  // (by default the replicas share the writing, as Megatron).
  bool ckpt_fully_parallel_load = false;
  bool ckpt_fully_parallel_save = true;
  // The group that shares the load: "dp" (DP x CP) or "ep_dp" (expert DP).
  std::string ckpt_fully_parallel_load_process_group = "dp";
  // --ckpt-format: "torch_dist" (the default) saves megatron.cpp's own sharded format, "torch"
  // Megatron-LM's legacy layout (validate_ckpt_format.cpp; docs/checkpoint.md).
  std::string ckpt_format = "torch_dist";
  // Non-persistent checkpoints (Megatron's --non-persistent-*): every N iterations a
  // checkpoint into --non-persistent-global-ckpt-dir (default <save>/non_persistent) that
  // replaces the one before it; --load resumes from it when it is at least as new as
  // --load's own (validate_ckpt_format.cpp, trainer_checkpoint_args.cpp; docs/checkpoint.md).
  // Only "global" is implemented; "local" and "in_memory" are refused.
  // --ckpt-convert-format F --ckpt-convert-save DIR (Megatron's checkpoint conversion): the
  // run loads --load, saves it in format F to DIR/F and exits without training; validation
  // turns them into --ckpt-format F --save DIR/F (validate_ckpt_format.cpp).
  std::optional<std::string> ckpt_convert_format;
  std::optional<std::string> ckpt_convert_save;
  std::optional<int64_t> non_persistent_save_interval;
  std::optional<std::string> non_persistent_ckpt_type;
  std::optional<std::string> non_persistent_global_ckpt_dir;
  // Where the non-persistent checkpoints are written and looked for (empty without a type;
  // `root` is --save for writing and --load for reading).
  std::string non_persistent_dir(const std::string& root) const;

  // The model's vocabulary rows: --padded-vocab-size as given, else set once the tokenizer
  // is known (resolve_padded_vocab_size: the tokenizer's size padded to divisible_by x TP).
  std::optional<int64_t> padded_vocab_size;

  // megatron.cpp's own flags (mcpp_flag_table).
  std::string device = "auto";  // auto | cpu | cuda
  int64_t threads = 0;          // CPU threads; 0 = OpenMP's default
  // Pipeline schedule: 1f1b (Megatron's; interleaved with virtual stages) or gpipe (all
  // forwards, then all backwards: holds every micro-batch's activations).
  std::string pipeline_schedule = "1f1b";
  // MLP activations kept for backward instead of recomputed: by the first N layers of each
  // model chunk that full recomputation leaves stored (all of them when N >= the chunk's
  // layers); one [S*B, F/TP] activation per such layer and micro-batch in flight.
  int64_t keep_mlp_activations = 0;
  bool help = false;            // -h / --help was given

  // ---- FP8 (docs/fp8.md; checked and turned into model::Fp8Config by validate_fp8.cpp)
  std::optional<std::string> fp8;                 // --fp8-format e4m3 | hybrid
  std::string fp8_recipe = "delayed";             // tensorwise | delayed (| blockwise | mxfp8)
  int64_t fp8_margin = 0;
  int64_t fp8_amax_history_len = 1;
  std::string fp8_amax_compute_algo = "most_recent";  // most_recent | max
  bool fp8_wgrad = true;                          // --no-fp8-wgrad: false
  bool first_last_layers_bf16 = false;
  int64_t num_layers_at_start_in_bf16 = 1, num_layers_at_end_in_bf16 = 1;
  bool fp8_param_gather = false;

  // Every flag given on the command line: dest -> value as Python's str() shows it
  // ("True", "0.0001", "['0.7', 'a']"). Holds by-design flags' values too.
  std::map<std::string, std::string> given;

  // ---- observe: TensorBoard and timers (training/tensorboard.h, training_log.h)
  std::string timing_log_option = "minmax";      // max | minmax | all
  std::optional<std::string> tensorboard_dir;    // event files, written by the last rank
  int64_t tensorboard_log_interval = 1;          // iterations between per-iteration scalars
  int64_t tensorboard_queue_size = 1000;         // events queued before a write
  bool log_timers_to_tensorboard = false;        // "<timer>-time", "iteration-time"
  bool log_loss_scale_to_tensorboard = true;     // "loss-scale" (--no-log-loss-scale-...)
  bool log_validation_ppl_to_tensorboard = false;  // "lm loss validation ppl"
  bool log_memory_to_tensorboard = false;        // "mem-*-bytes" (CUDA allocator)
  std::optional<int64_t> log_memory_interval;    // the memory line every N iterations (CUDA)
  bool log_device_memory_used = false;           // ... with the device's used memory (NVML)
  bool log_world_size_to_tensorboard = false;    // "world-size"
  bool was_given(const std::string& dest) const { return given.count(dest) != 0; }
  // True when the LR schedule counts samples (--train-samples) rather than iterations.
  bool sample_based() const { return train_samples.has_value(); }

  // ---- compat: the flags of Megatron's example scripts
  // --rampup-batch-size START INCREMENT SAMPLES (data/num_microbatches.h); None: constant.
  std::optional<std::vector<int64_t>> rampup_batch_size;
  // --step-batch-size-schedule "THRESHOLD:BS ...": the global batch by consumed tokens
  // (data::StepBatchSchedule); global_batch_size becomes its last batch size.
  std::optional<std::string> step_batch_size_schedule;
  // --decoupled-lr / --decoupled-min-lr: the embedding and output layer's own max/min LR
  // (Megatron's decoupled parameter group); decoupled_min_lr defaults to --min-lr.
  std::optional<double> decoupled_lr, decoupled_min_lr;
  bool layernorm_zero_centered_gamma = false;  // --apply-layernorm-1p: weight stored as w - 1
  bool mmap_bin_files = true;                  // --no-mmap-bin-files: read .bin into memory
  bool log_params_norm = false;                // log line: " params norm: X |"
  bool log_num_zeros_in_grad = false;          // log line: " num zeros: X |"
  bool use_checkpoint_args = false;            // model shape from --load's checkpoint

  // ---- context parallel (validate_cp.cpp; docs/context-parallel.md)
  // --cp-comm-type: p2p (ring), a2a (heads scattered, sequence gathered) or all_gather;
  // one value for every layer, or one per layer (validate_cp expands it to num_layers).
  std::vector<std::string> cp_comm_type = {"p2p"};
  // --hierarchical-context-parallel-sizes A P: the CP group as A consecutive ranks that
  // exchange by all-to-all inside groups of P ranks that form a ring (a2a+p2p layers);
  // A x P = CP. Megatron's create_hierarchical_groups lays the levels out.
  std::optional<std::vector<int64_t>> hierarchical_context_parallel_sizes;
  // --calculate-per-token-loss: gradients of the global batch's summed token losses / its
  // masked tokens; default: the mean of per-micro-batch means (training/forward_backward.h).
  bool calculate_per_token_loss = false;

  // ---- multi-token prediction (model/mtp.h; checked by validate_mtp.cpp)
  std::optional<int64_t> mtp_num_layers;  // None: no MTP layers
  double mtp_loss_scaling_factor = 0.1;

  // ---- mixture of experts (docs/moe.md; checked by validate_moe.cpp)
  std::optional<int64_t> num_experts;              // None: a dense model
  bool moe_use_upcycling = false;                  // --load (dense) -> --save (MoE): upcycle.h
  int64_t moe_upcycling_granularity = 1;           // dense FFN / expert FFN
  std::string moe_layer_freq = "1";                // N (every N-th layer), or "([0]+[1]*3)"
  std::optional<int64_t> moe_ffn_hidden_size;      // default: --ffn-hidden-size
  int64_t moe_router_topk = 2;
  // Paired lists of one length (Megatron's): each type's coefficient, 0 switching it off.
  std::vector<std::string> moe_router_load_balancing_type = {"aux_loss"};
  std::vector<std::string> moe_aux_loss_coeff = {"0.0"};
  std::optional<double> moe_z_loss_coeff;
  std::string moe_router_score_function = "softmax";      // softmax | sigmoid | sqrtsoftplus
  bool moe_router_pre_softmax = false;
  std::optional<double> moe_router_topk_scaling_factor;
  bool moe_router_enable_expert_bias = false;             // sigmoid / sqrtsoftplus only
  double moe_router_bias_update_rate = 1e-3;
  bool moe_router_force_load_balancing = false;           // random logits (benchmarks)
  std::optional<double> moe_router_force_biased;          // + a random bias N(0, |std|)
  std::optional<double> moe_input_jitter_eps;             // router input x U(1-eps, 1+eps)
  std::optional<int64_t> moe_router_num_groups;
  std::optional<int64_t> moe_router_group_topk;
  std::optional<std::string> moe_router_dtype;            // fp32 | fp64
  std::string moe_token_dispatcher_type = "allgather";    // allgather | alltoall | flex
  // flex: deepep | hybridep | ncclep (the communication library Megatron's flex dispatcher
  // calls; here every backend runs the all-to-all dispatcher's exchange: validate_moe.cpp)
  std::string moe_flex_dispatcher_backend = "deepep";
  bool moe_enable_deepep = false;  // deprecated in Megatron: flex with the deepep backend
  std::optional<double> moe_expert_capacity_factor;       // None: dropless
  bool moe_pad_expert_input_to_capacity = false;
  std::string moe_token_drop_policy = "probs";            // probs | position
  bool moe_grouped_gemm = false;                          // accepted: always grouped
  std::optional<int64_t> moe_shared_expert_intermediate_size;
  bool moe_shared_expert_gate = false;
  bool moe_shared_expert_overlap = false;  // the shared expert on a side stream (CUDA)
  bool moe_apply_probs_on_input = false;   // top-1: probabilities on the experts' input
  std::optional<int64_t> expert_tensor_parallel_size;     // default: TP
  bool moe_per_layer_logging = false;
  bool moe_router_padding_for_fp8 = false;  // FP8: expert row counts padded to 16 (routing.h)
  // Set by validate_moe: 1 where layer i is a MoE layer (--moe-layer-freq), one per layer;
  // empty for a dense model. The aux-loss coefficients as numbers, one per load-balancing
  // type.
  std::vector<int64_t> moe_layer_pattern;
  std::vector<double> moe_aux_loss_coeff_values;
  // ---- muP (validate_mup.cpp; docs/model.md "muP"): Megatron's maximal update
  // parameterisation. mup_width_mult is derived (hidden / base hidden), as Megatron's
  // TransformerConfig does; giving it is an error.
  bool use_mup = false;
  double mup_width_mult = 1.0;
  std::optional<int64_t> mup_base_hidden_size;
  double mup_embedding_mult = 1.0;
  double mup_output_mult = 1.0;
  std::optional<double> mup_base_head_dim;
  double mup_attn_scale_power = 1.0;
  // ---- q/k layernorm (validate_qk_layernorm.cpp; ops::qk_norm_forward)
  bool qk_layernorm = false;
  // --qk-l2-norm (Megatron's L2Norm on queries and keys: RMS normalisation without weights;
  // Llama 4).
  bool qk_l2_norm = false;
  // --apply-wd-to-qk-layernorm: the q/k norm weights decay like the matrices (Qwen3-Next).
  // --no-weight-decay-cond-type apply_wd_to_qk_layernorm is its deprecated spelling.
  bool apply_wd_to_qk_layernorm = false;
  std::optional<std::string> no_weight_decay_cond_type;
  // --no-position-embedding (deprecated in Megatron): allowed with RoPE only, where there is
  // no learned position table to drop.
  bool add_position_embedding = true;
};

// Parses flags (argv without the program and subcommand names). Throws mcpp::Error for
// unknown flags (naming the closest known ones), missing or badly typed values, values
// outside `choices`, and known Megatron flags that megatron.cpp does not implement yet when
// their value differs from Megatron's default. Repeated flags: the last one wins.
Args parse_args(const std::vector<std::string>& argv);

// Megatron's validate_args: checks every combination and fills derived defaults
// (ffn_hidden_size, kv_channels, num_query_groups, global_batch_size, data_parallel_size,
// num_microbatches, train_iters, lr_decay_iters/samples, start/end_weight_decay, split).
// `training` = false skips what only training needs (--lr, --train-iters/--train-samples).
void validate_args(Args& args, int world_size, bool training = true);

// Megatron's vocabulary padding: the smallest multiple of divisible_by * TP that is
// >= orig_vocab_size. The message is Megatron's start-up line.
// Whether the MLP's GELU is the exact one (TransformerConfig::gelu_erf): a GELU MLP (no
// --swiglu, --squared-relu, --quick-geglu) without --openai-gelu and without Megatron's
// bias_gelu fusion, which needs biases (validate_activation.cpp).
bool gelu_is_exact(const Args& a);
int64_t padded_vocab_size(int64_t orig_vocab_size, int64_t divisible_by, int64_t tp);

// --exit-signal's value: a name of Python's signal.Signals on Linux ("SIGTERM", "SIGUSR1",
// ...) -> its number; nullopt for any other word.
std::optional<int> signal_number(const std::string& name);
// Sets and returns args.padded_vocab_size for a tokenizer of `tokenizer_vocab` ids:
// --padded-vocab-size as given (Megatron uses it as is; an error when it is smaller than
// the tokenizer's vocabulary), else padded_vocab_size(tokenizer_vocab, divisible_by, TP).
// validate_args has checked that a given size is positive and divisible by TP.
int64_t resolve_padded_vocab_size(Args& args, int64_t tokenizer_vocab);
// Megatron's start-up line " > padded vocab (size: V) with K dummy tokens (new size: Vp)";
// from_flag: the size came from --padded-vocab-size, which the line then names.
std::string padded_vocab_message(int64_t orig_vocab_size, int64_t padded, bool from_flag = false);

// Megatron's start-up block: "------------------------ arguments ------------------------",
// then "  name ..... value" for every dest (sorted, dots to column 48), then the end line.
std::string format_args(const Args& args);
void print_args(const Args& args);  // format_args through log::info (rank 0)

// One line per by-design flag that was given: "--use-flash-attn: <why it is satisfied>".
std::vector<std::string> describe_by_design_flags(const Args& args);

// `megatron train --help`: implemented, by-design and megatron.cpp's own flags.
std::string help_text();

// Scheduler settings in samples, as Megatron's get_optimizer_param_scheduler() builds them.
optim::SchedulerConfig lr_scheduler_config(const Args& args);

// The command-line spelling of a destination, e.g. "loss_scale" -> "--loss-scale".
std::string flag_name(const std::string& dest);

// Python's str() of a float ("1.0", "1e-05", "0.0001"): how print_args shows doubles.
std::string python_float(double v);
// Python's str() of a whole number as an int ("4"), of any other as a float ("2.5"): an int
// flag's value where a checkpoint may hold a fraction.
std::string python_int_or_float(double v);

}  // namespace mcpp::training
