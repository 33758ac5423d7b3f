// parse_args: argparse forms, choices, types, unknown flags, implemented vs known flags.
#include <set>

#include "test_util.h"

namespace parse_test {

using namespace mcpp;
using namespace mcpp::training;
using namespace mcpp::training::test;

TEST(FlagTable, HasEveryMegatronFlagOnceAndOurFlagsApart) {
  EXPECT_EQ(megatron_flag_table().size(), 838u);
  std::set<std::string> spellings;
  size_t n = 0;
  for (auto table : {megatron_flag_table(), mcpp_flag_table()})
    for (const auto& r : table) {
      std::string flags = r.flags;
      size_t start = 0;
      while (start < flags.size()) {
        size_t end = flags.find(' ', start);
        if (end == std::string::npos) end = flags.size();
        spellings.insert(flags.substr(start, end - start));
        ++n;
        start = end + 1;
      }
    }
  EXPECT_EQ(spellings.size(), n)
      << "a spelling appears twice (our flags must not shadow Megatron's)";
  for (const auto& r : mcpp_flag_table()) EXPECT_EQ(flag_support(r.dest), FlagSupport::Ours);
}

TEST(FlagTable, BriefsImplementedDestsAreImplemented) {
  for (const char* d : {"num_layers",
                        "hidden_size",
                        "ffn_hidden_size",
                        "num_attention_heads",
                        "kv_channels",
                        "group_query_attention",
                        "num_query_groups",
                        "seq_length",
                        "max_position_embeddings",
                        "position_embedding_type",
                        "rotary_base",
                        "rotary_percent",
                        "make_vocab_size_divisible_by",
                        "normalization",
                        "layernorm_epsilon",
                        "swiglu",
                        "untie_embeddings_and_output_weights",
                        "add_bias_linear",
                        "hidden_dropout",
                        "attention_dropout",
                        "init_method_std",
                        "micro_batch_size",
                        "global_batch_size",
                        "train_iters",
                        "train_samples",
                        "lr",
                        "min_lr",
                        "lr_decay_style",
                        "lr_decay_iters",
                        "lr_decay_samples",
                        "lr_warmup_iters",
                        "lr_warmup_samples",
                        "lr_warmup_fraction",
                        "lr_warmup_init",
                        "lr_wsd_decay_style",
                        "lr_wsd_decay_iters",
                        "lr_wsd_decay_samples",
                        "weight_decay",
                        "start_weight_decay",
                        "end_weight_decay",
                        "weight_decay_incr_style",
                        "adam_beta1",
                        "adam_beta2",
                        "adam_eps",
                        "clip_grad",
                        "optimizer",
                        "seed",
                        "mock_data",
                        "tokenizer_type",
                        "vocab_size",
                        "vocab_file",
                        "merge_file",
                        "tokenizer_model",
                        "data_path",
                        "split",
                        "eval_interval",
                        "eval_iters",
                        "log_interval",
                        "tensor_model_parallel_size",
                        "pipeline_model_parallel_size",
                        "context_parallel_size",
                        "expert_model_parallel_size",
                        "use_cpu_initialization",
                        "bf16",
                        "fp16",
                        "grad_reduce_in_bf16",
                        "save",
                        "load",
                        "save_interval",
                        "exit_interval",
                        "exit_duration_in_mins",
                        "no_load_optim",
                        "no_load_rng",
                        "no_save_optim",
                        "no_save_rng",
                        "finetune",
                        "eod_mask_loss",
                        "reset_position_ids",
                        "reset_attention_mask",
                        "log_throughput",
                        "timing_log_level"}) {
    EXPECT_EQ(flag_support(d), FlagSupport::Implemented) << d;
  }
  EXPECT_EQ(flag_support("use_flash_attn"), FlagSupport::ByDesign);
  EXPECT_EQ(flag_support("fp8"), FlagSupport::Implemented);
  EXPECT_EQ(flag_support("exp_avg_dtype"), FlagSupport::Implemented);
  EXPECT_EQ(flag_support("megatron_fsdp_main_params_dtype"), FlagSupport::NotImplemented);
  // The checkpoint flags of Megatron's example scripts.
  for (const char* d : {"padded_vocab_size", "save_retain_interval", "pretrained_checkpoint",
                        "exit_on_missing_checkpoint"})
    EXPECT_EQ(flag_support(d), FlagSupport::Implemented) << d;
  EXPECT_EQ(flag_support("ckpt_assume_constant_structure"), FlagSupport::ByDesign);
  EXPECT_EQ(flag_support("auto_detect_ckpt_format"), FlagSupport::ByDesign);
  EXPECT_EQ(flag_support("check_for_nan_in_loss_and_grad"), FlagSupport::ByDesign);
  // Multi-latent attention and interleaved RoPE are implemented; --trust-remote-code has no
  // code to trust here.
  for (const char* d : {"multi_latent_attention", "q_lora_rank", "kv_lora_rank", "qk_head_dim",
                        "qk_pos_emb_head_dim", "v_head_dim", "rotary_scaling_factor", "mscale",
                        "mscale_all_dim", "rotary_interleaved"})
    EXPECT_EQ(flag_support(d), FlagSupport::Implemented) << d;
  EXPECT_EQ(flag_support("trust_remote_code"), FlagSupport::ByDesign);
  EXPECT_EQ(flag_support("cache_mla_latents"), FlagSupport::NotImplemented);
  // Fully parallel checkpoints: the switches are bound; the exchange algorithm and the
  // deprecated spelling of the save switch are accepted by design.
  EXPECT_EQ(flag_support("ckpt_fully_parallel_load"), FlagSupport::Implemented);
  EXPECT_EQ(flag_support("ckpt_fully_parallel_save"), FlagSupport::Implemented);
  EXPECT_EQ(flag_support("ckpt_fully_parallel_load_exchange_algo"), FlagSupport::ByDesign);
  EXPECT_EQ(flag_support("ckpt_fully_parallel_save_deprecated"), FlagSupport::ByDesign);
  EXPECT_EQ(flag_support("ckpt_fully_parallel_load_process_group"), FlagSupport::Implemented);
  EXPECT_EQ(flag_support("ckpt_fully_parallel_save_process_group"), FlagSupport::NotImplemented);
}

TEST(Parse, SpaceAndEqualsForms) {
  Args a = parse_args({"--hidden-size", "768", "--num-layers=12", "--lr=6e-4", "--min-lr", "6e-5"});
  EXPECT_EQ(a.hidden_size, 768);
  EXPECT_EQ(a.num_layers, 12);
  EXPECT_DOUBLE_EQ(a.lr, 6e-4);
  EXPECT_DOUBLE_EQ(a.min_lr, 6e-5);
  EXPECT_TRUE(a.was_given("hidden_size"));
  EXPECT_FALSE(a.was_given("seq_length"));
}

TEST(Parse, NargsStarAndPlus) {
  Args a = parse_args({"--data-path", "0.7", "a", "0.3", "b", "--seed", "7"});
  EXPECT_EQ(a.data_path, (std::vector<std::string>{"0.7", "a", "0.3", "b"}));
  EXPECT_EQ(a.seed, 7);
  EXPECT_EQ(a.given.at("data_path"), "['0.7', 'a', '0.3', 'b']");
  Args b = parse_args({"--data-path", "--seed", "7"});  // nargs '*': zero values are fine
  EXPECT_TRUE(b.data_path.empty());
  expect_error(
      [] {
        parse_args({"--hierarchical-context-parallel-sizes", "--seed", "1"});
      },
      {"--hierarchical-context-parallel-sizes needs at least one value"});
  expect_error(
      [] {
        parse_args({"--rampup-batch-size", "16", "16"});
      },
      {"--rampup-batch-size needs exactly 3 values, got 2"});
}

TEST(Parse, StoreTrueStoreFalseAndTheirSpellings) {
  Args a = parse_args({"--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
                       "--group-query-attention", "--bf16", "--no-load-optim"});
  EXPECT_TRUE(a.swiglu);
  EXPECT_FALSE(a.add_bias_linear);
  EXPECT_TRUE(a.untie_embeddings_and_output_weights);
  EXPECT_TRUE(a.group_query_attention);
  EXPECT_TRUE(a.bf16);
  EXPECT_TRUE(a.no_load_optim);
  EXPECT_TRUE(parse_args({}).add_bias_linear);
  expect_error([] { parse_args({"--swiglu=1"}); }, {"--swiglu takes no value"});
  // A --no-X / --disable-X pair of a by-design store_false flag.
  Args b = parse_args({"--no-manual-gc-eval"});
  Args c = parse_args({"--disable-manual-gc-eval"});
  EXPECT_EQ(b.given.at("manual_gc_eval"), "False");
  EXPECT_EQ(c.given.at("manual_gc_eval"), "False");
}

TEST(Parse, ChoicesAreValidated) {
  expect_error(
      [] {
        parse_args({"--lr-decay-style", "cosin"});
      },
      {"--lr-decay-style: 'cosin' is not one of constant, linear, cosine, "
       "inverse-square-root, WSD",
       "did you mean 'cosine'?"});
  expect_error(
      [] {
        parse_args({"--normalization", "rmsnorm"});
      },
      {"'rmsnorm' is not one of LayerNorm, RMSNorm"});
  expect_error([] { parse_args({"--timing-log-level", "3"}); }, {"'3' is not one of 0, 1, 2"});
  EXPECT_EQ(parse_args({"--lr-decay-style", "WSD"}).lr_decay_style, "WSD");
  EXPECT_EQ(parse_args({"--timing-log-level", "2"}).timing_log_level, 2);
}

TEST(Parse, TypedConversionErrorsNameTheFlag) {
  expect_error(
      [] {
        parse_args({"--hidden-size", "12.5"});
      },
      {"--hidden-size expects an integer, got '12.5'"});
  expect_error([] { parse_args({"--lr", "fast"}); }, {"--lr expects a number, got 'fast'"});
  expect_error([] { parse_args({"--seed="}); }, {"--seed expects an integer, got ''"});
  EXPECT_EQ(parse_args({"--train-iters", "1_000"}).train_iters, 1000);  // Python int()
  EXPECT_DOUBLE_EQ(parse_args({"--adam-eps", "1E-8"}).adam_eps, 1e-8);
  EXPECT_EQ(parse_args({"--hidden-size", "-5"}).hidden_size, -5);  // value, validated later
}

TEST(Parse, UnknownFlagSuggestsTheClosest) {
  expect_error(
      [] {
        parse_args({"--hiden-size", "8"});
      },
      {"unknown flag --hiden-size; did you mean --hidden-size?"});
  expect_error([] { parse_args({"--num-layer=2"}); },
               {"unknown flag --num-layer; did you mean --num-layers?"});
  expect_error([] { parse_args({"-lr", "1"}); }, {"unknown flag -lr; did you mean --lr?"});
  try {
    parse_args({"--completely-unrelated-thing-xyzzy"});
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).find("did you mean"), std::string::npos) << e.what();
  }
}

TEST(Parse, MissingValueAndStrayTokens) {
  expect_error([] { parse_args({"--hidden-size"}); }, {"--hidden-size needs a value"});
  expect_error(
      [] {
        parse_args({"--hidden-size", "--num-layers", "2"});
      },
      {"--hidden-size needs a value"});
  expect_error([] { parse_args({"--num-layers", "2", "3"}); }, {"unexpected argument '3'"});
  expect_error([] { parse_args({"train.py"}); }, {"unexpected argument 'train.py'"});
}

TEST(Parse, RepeatedFlagLastWins) {
  Args a = parse_args({"--hidden-size", "64", "--hidden-size", "128", "--swiglu"});
  EXPECT_EQ(a.hidden_size, 128);
  EXPECT_EQ(a.given.at("hidden_size"), "128");
}

TEST(Parse, NotImplementedFlagWithNonDefaultValueIsAnError) {
  expect_error(
      [] {
        parse_args({"--megatron-fsdp-main-params-dtype", "bf16"});
      },
      {"--megatron-fsdp-main-params-dtype is a Megatron-LM flag that megatron.cpp does not "
       "implement yet",
       "given bf16", "default is fp32"});
  expect_error([] { parse_args({"--tp-comm-overlap"}); },
               {"--tp-comm-overlap is a Megatron-LM flag that megatron.cpp does not implement"});
  // Several at once are all named.
  expect_error(
      [] {
        parse_args({"--overlap-param-gather-with-optimizer-step",
                    "--megatron-fsdp-main-params-dtype", "bf16"});
      },
      {"--overlap-param-gather-with-optimizer-step is a",
       "--megatron-fsdp-main-params-dtype is a"});
  // The same flags with Megatron's default values ask for nothing new: accepted.
  EXPECT_NO_THROW(
      parse_args({"--ckpt-format", "torch_dist", "--fp8-recipe", "delayed", "--hysteresis", "2",
                  "--initial-loss-scale", "4.294967296e9", "--loss-scale-window", "1000"}));
}

TEST(Parse, ByDesignFlagsAreAcceptedAndDescribed) {
  Args a = parse_args({"--use-flash-attn", "--no-masked-softmax-fusion", "--transformer-impl",
                       "local", "--deterministic-mode", "--num-workers", "8",
                       "--no-gradient-accumulation-fusion", "--distributed-backend", "gloo",
                       "--use-mcore-models", "--moe-permute-fusion", "--moe-router-fusion"});
  auto lines = describe_by_design_flags(a);
  EXPECT_EQ(lines.size(), 10u);
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  EXPECT_NE(all.find("--use-flash-attn True: accepted by design: attention always runs"),
            std::string::npos)
      << all;
  EXPECT_NE(all.find("--num-workers 8"), std::string::npos) << all;
  EXPECT_NE(all.find("--moe-permute-fusion True: accepted by design: the MoE permute"),
            std::string::npos)
      << all;
  expect_error(
      [] {
        parse_args({"--transformer-impl", "inference_optimized"});
      },
      {"--transformer-impl inference_optimized is not supported",
       "accepted: local, transformer_engine"});
  expect_error(
      [] {
        parse_args({"--attention-backend", "magic"});
      },
      {"'magic' is not one of flash, fused, unfused, local, auto"});
  EXPECT_TRUE(describe_by_design_flags(parse_args({})).empty());
  // The checkpoint and NaN-check switches of Megatron's example scripts.
  const auto ck = describe_by_design_flags(
      parse_args({"--ckpt-assume-constant-structure", "--no-check-for-nan-in-loss-and-grad",
                  "--auto-detect-ckpt-format"}));
  ASSERT_EQ(ck.size(), 3u);
  EXPECT_NE(ck[0].find("--ckpt-assume-constant-structure True: accepted by design: a save "
                       "has no planning"),
            std::string::npos)
      << ck[0];
  EXPECT_NE(ck[2].find("--no-check-for-nan-in-loss-and-grad False: accepted by design: a "
                       "non-finite loss or gradient norm never stops training"),
            std::string::npos)
      << ck[2];
  EXPECT_NE(ck[1].find("--auto-detect-ckpt-format True: accepted by design: --load always "
                       "detects what it holds"),
            std::string::npos)
      << ck[1];
  // Fully parallel checkpoints: the save is Megatron's default, the load a switch.
  const Args d = parse_args({});
  EXPECT_TRUE(d.ckpt_fully_parallel_save);
  EXPECT_FALSE(d.ckpt_fully_parallel_load);
  const Args fp = parse_args({"--ckpt-fully-parallel-load", "--no-ckpt-fully-parallel-save"});
  EXPECT_TRUE(fp.ckpt_fully_parallel_load);
  EXPECT_FALSE(fp.ckpt_fully_parallel_save);
  const auto ex = describe_by_design_flags(
      parse_args({"--ckpt-fully-parallel-save", "--ckpt-fully-parallel-load-exchange-algo",
                  "gather_object"}));
  ASSERT_EQ(ex.size(), 2u);
  EXPECT_NE(ex[0].find("--ckpt-fully-parallel-load-exchange-algo gather_object: accepted by "
                       "design: the exchange"),
            std::string::npos)
      << ex[0];
  EXPECT_NE(ex[1].find("--ckpt-fully-parallel-save True: accepted by design: deprecated in "
                       "Megatron too"),
            std::string::npos)
      << ex[1];
  EXPECT_TRUE(parse_args({"--ckpt-fully-parallel-save"}).ckpt_fully_parallel_save);
  expect_error([] { parse_args({"--ckpt-fully-parallel-load-exchange-algo", "rings"}); },
               {"'rings' is not one of broadcast, gather_rounds, gather_object"});
  EXPECT_EQ(parse_args({}).ckpt_fully_parallel_load_process_group, "dp");
  EXPECT_EQ(parse_args({"--ckpt-fully-parallel-load-process-group", "ep_dp"})
                .ckpt_fully_parallel_load_process_group,
            "ep_dp");
  expect_error([] { parse_args({"--ckpt-fully-parallel-save-process-group", "ep_dp"}); },
               {"--ckpt-fully-parallel-save-process-group is a Megatron-LM flag that "
                "megatron.cpp does not implement yet"});
}

TEST(Parse, OurOwnFlagsAndHelp) {
  Args a = parse_args({"--device", "cpu", "--threads", "4", "--keep-mlp-activations", "3"});
  EXPECT_EQ(a.device, "cpu");
  EXPECT_EQ(a.threads, 4);
  EXPECT_EQ(a.keep_mlp_activations, 3);
  expect_error([] { parse_args({"--device", "tpu"}); }, {"'tpu' is not one of auto, cpu, cuda"});
  EXPECT_TRUE(parse_args({"--help"}).help);
  EXPECT_TRUE(parse_args({"-h"}).help);
  std::string h = help_text();
  EXPECT_NE(h.find("--hidden-size N  (default: None)"), std::string::npos);
  EXPECT_NE(h.find("--lr-decay-style {constant,linear,cosine,inverse-square-root,WSD}"),
            std::string::npos);
  EXPECT_NE(h.find("megatron.cpp's own flags"), std::string::npos);
  EXPECT_NE(h.find("--device {auto,cpu,cuda}"), std::string::npos);
  EXPECT_NE(h.find("--keep-mlp-activations N  (default: 0)"), std::string::npos);
  EXPECT_NE(h.find("--exp-avg-dtype"), std::string::npos);  // implemented: listed
  EXPECT_EQ(h.find("--megatron-fsdp-main-params-dtype"), std::string::npos);
}

// The switches of Megatron-LM's own test and example scripts that ask for what megatron.cpp
// always does: accepted, each with its reason at start-up; the values that ask for more are
// refused by name.
TEST(Parse, ScriptSwitchesAcceptedByDesign) {
  const Args a = parse_args({"--use-persistent-ckpt-worker", "--async-strategy", "mcore",
                             "--dist-ckpt-optim-fully-reshardable", "--verify-integrity",
                             "--apply-query-key-layer-scaling", "--te-rng-tracker",
                             "--rerun-mode", "disabled", "--disable-gloo-process-groups",
                             "--no-use-tokenizer-model-from-checkpoint-args",
                             "--enable-experimental"});
  const auto lines = describe_by_design_flags(a);
  ASSERT_EQ(lines.size(), 10u);
  std::string all;
  for (const auto& l : lines) all += l + "\n";
  for (const char* want :
       {"--use-persistent-ckpt-worker True: accepted by design: --async-save writes from a "
        "background thread",
        "--async-strategy mcore: accepted by design", "--dist-ckpt-optim-fully-reshardable True",
        "--verify-integrity True: accepted by design: every shard file's checksum",
        "--apply-query-key-layer-scaling True: accepted by design: the attention kernels",
        "--te-rng-tracker True: accepted by design: dropout masks",
        "--rerun-mode disabled: accepted by design: there is no rerun state machine",
        "--disable-gloo-process-groups False: accepted by design: megatron.cpp creates no Gloo",
        "--no-use-tokenizer-model-from-checkpoint-args False: accepted by design: the tokenizer "
        "always comes from the command line",
        "--enable-experimental True: accepted by design"})
    EXPECT_NE(all.find(want), std::string::npos) << want << "\n" << all;
  for (const char* d : {"use_persistent_ckpt_worker", "async_strategy",
                        "dist_ckpt_optim_fully_reshardable", "verify_integrity",
                        "apply_query_key_layer_scaling", "te_rng_tracker", "rerun_mode",
                        "use_gloo_process_groups", "use_tokenizer_model_from_checkpoint_args",
                        "enable_experimental"})
    EXPECT_EQ(flag_support(d), FlagSupport::ByDesign) << d;
  expect_error([] { parse_args({"--rerun-mode", "report_stats"}); },
               {"--rerun-mode report_stats is not supported by megatron.cpp (accepted: "
                "disabled, validate_results)"});
  for (const char* d : {"apply_wd_to_qk_layernorm", "no_weight_decay_cond_type",
                        "add_position_embedding"})
    EXPECT_EQ(flag_support(d), FlagSupport::Implemented) << d;
}

}  // namespace parse_test
