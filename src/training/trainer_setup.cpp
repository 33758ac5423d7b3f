// Trainer::Trainer: from the flags to a rank ready to train, as Megatron's pretrain()
// set-up (initialize_megatron, setup_model_and_optimizer, build the datasets): the device
// and process groups, the tokenizer, the model (after the memory plan says it fits), the
// gradient buckets and the optimizer, the LR schedule, a checkpoint to resume from, and the
// datasets (trainer_datasets.cpp).
#include <omp.h>

#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <csignal>
#include <tuple>

#include "base/log.h"
#include "checkpoint/training_checkpoint.h"
#include "data/dataset_builder.h"
#include "data/tokenizers/tokenizer.h"
#include "ops/attention_backend.h"
#include "model/moe/moe_layer.h"
#include "training/fim_setup.h"
#include "training/forward_backward.h"
#include "training/profiler.h"
#include "ops/ops.h"
#include "optim/distributed_optimizer.h"
#include "optim/grads.h"
#include "parallel/pipeline/executor.h"
#include "parallel/pipeline/layout.h"
#include "checkpoint/megatron/megatron_train.h"
#include "training/muon_setup.h"
#include "training/trainer_state.h"
#include "training/validate_compat.h"
#include "optim/fp8_param_gather.h"
#include "training/validate_fp8.h"
#ifdef MCPP_HAVE_CUDA
#include "ops/cuda/device.h"
#endif

namespace mcpp::training {

std::unique_ptr<data::Tokenizer> build_tokenizer(const Args& a) {
  data::TokenizerArgs t;
  t.type = a.tokenizer_type, t.vocab_size = a.vocab_size;
  t.vocab_file = a.vocab_file.value_or(""), t.merge_file = a.merge_file.value_or("");
  t.tokenizer_model = a.tokenizer_model.value_or("");
  t.tiktoken_pattern = a.tiktoken_pattern.value_or("");
  t.tiktoken_num_special_tokens = a.tiktoken_num_special_tokens;
  t.special_tokens = a.special_tokens, t.vocab_extra_ids = a.vocab_extra_ids;
  t.include_special_tokens = !a.tokenizer_hf_no_include_special_tokens;
  t.null_eod_id = a.null_tokenizer_eod_id, t.null_pad_id = a.null_tokenizer_pad_id;
  return data::make_tokenizer(t);
}

namespace {

// --device: cpu, cuda, or auto (CUDA when this build has it and a GPU is visible).
Device resolve_device(const Args& a) {
  if (a.device == "cpu") return Device::CPU;
#ifdef MCPP_HAVE_CUDA
  if (a.device == "cuda") return Device::CUDA;
  return ops::cuda::device_available() ? Device::CUDA : Device::CPU;
#else
  MCPP_CHECK_HINT(a.device != "cuda",
                  "rebuild where nvcc is found (CMake prints 'megatron.cpp: CUDA: yes'), or "
                  "train with --device cpu",
                  "--device cuda: this build has no CUDA backend");
  return Device::CPU;
#endif
}

// The model's dtype: --bf16 / --fp16 (GPU only), else fp32.
DType model_dtype(const Args& a) { return a.bf16 ? DType::BF16 : a.fp16 ? DType::F16 : DType::F32; }

std::atomic<bool> g_exit_signal{false};
extern "C" void on_exit_signal(int) { g_exit_signal.store(true); }

}  // namespace

void install_exit_signal_handler(int signum) { std::signal(signum, on_exit_signal); }
bool exit_signal_received() { return g_exit_signal.load(); }

// The device, the world and its process groups, the tokenizer (the padded vocabulary).
void Trainer::State::setup_parallel() {
  auto& s = *this;
  Args& a = s.args;
  s.device = resolve_device(a);
  s.world = comm::init({.backend = a.fake_process_group ? comm::Backend::Fake
                                                        : comm::Backend::Auto,
                        .timeout = std::chrono::minutes(a.distributed_timeout_minutes),
                        .device = s.device,
                        .nccl_configs = a.nccl_communicator_config_path
                                            ? comm::read_nccl_config(*a.nccl_communicator_config_path)
                                            : comm::NcclConfigs{}});
  // The checkpoint the run starts from: --load's, else --pretrained-checkpoint's.
  s.load_source = resolve_load_source(a);
  if (!a.perform_initialization && !s.load_source)
    log::warn("--no-initialization without a checkpoint to load: every parameter starts at "
              "zero");
  if (a.moe_use_upcycling) {  // validate_moe.cpp checked the flags; here the folders
    MCPP_CHECK_HINT(s.load_source && !s.load_source->finetune,
                    "point --load at the dense model's checkpoint",
                    "--moe-use-upcycling: --load {} holds no checkpoint to upcycle", *a.load);
    MCPP_CHECK_HINT(!checkpoint::latest_iteration(*a.save),
                    "upcycle only in the first run; resume later runs from --save without "
                    "--moe-use-upcycling",
                    "--moe-use-upcycling: --save {} holds a checkpoint already (the upcycling "
                    "destination must be new, as in Megatron-LM)",
                    *a.save);
  }
  if (a.use_checkpoint_args) apply_checkpoint_args(a, s.load_source);  // before validation
  s.tokenizer_files = apply_checkpoint_tokenizer(a, s.load_source);    // files it carries
  validate_args(a, s.world->size());
  if (a.nccl_communicator_config_path && s.world->device() != Device::CUDA)
    log::warn("--nccl-communicator-config-path: this run has no NCCL groups ({} on {}); the "
              "file was read and checked but applies to GPU runs only",
              s.world->backend(), s.device == Device::CUDA ? "cuda" : "cpu");
  if (a.logging_level)  // Python's logging levels
    log::set_level(*a.logging_level <= 10   ? log::Level::Debug
                   : *a.logging_level <= 20 ? log::Level::Info
                   : *a.logging_level <= 30 ? log::Level::Warn
                                            : log::Level::Error);
  check_trainer_support(a, s.device);  // the same list `megatron plan` checks
  parallel::ParallelSizes sizes;
  sizes.tp = int(a.tensor_model_parallel_size), sizes.pp = int(a.pipeline_model_parallel_size);
  sizes.tp_pp_dp_mapping = a.use_tp_pp_dp_mapping;
  sizes.cp = int(a.context_parallel_size);  // context parallel
  if (const auto& h = a.hierarchical_context_parallel_sizes; h && h->size() == 2)
    sizes.cp_a2a = int((*h)[0]);
  if (a.hierarchical_context_parallel_sizes &&
      std::find(a.cp_comm_type.begin(), a.cp_comm_type.end(), "a2a+p2p") == a.cp_comm_type.end())
    log::info("--hierarchical-context-parallel-sizes: no layer uses --cp-comm-type a2a+p2p, "
              "the only exchange its groups shape");
  // With MTP layers the last stage holds a copy of the word embedding (they read it): the
  // embedding group spans the first and last stages as for a tied output weight.
  sizes.untie_embeddings =
      a.untie_embeddings_and_output_weights && a.mtp_num_layers.value_or(0) == 0;
  // Expert parallelism: Megatron's expert rank grid, EP folded over the attention ranks
  // (validate_moe checked ETP x EP divides TP x CP x DP).
  sizes.ep = int(a.expert_model_parallel_size);
  sizes.etp = int(a.expert_tensor_parallel_size.value_or(a.tensor_model_parallel_size));
  sizes.dist_opt_instances = int(a.num_distributed_optimizer_instances);
  s.ps = std::make_unique<parallel::ParallelState>(*s.world, sizes);
  if (a.fake_process_group)
    log::info("> --fake-process-group: this process plays world rank {} of {} (tensor {}, "
              "pipeline {}, context {}, data {}, expert {}); no collective exchanges data and "
              "receives give zeros (comm/fake), so memory and compute are the rank's, the "
              "communication time none of it",
              s.world->rank(), s.world->size(), s.ps->tp_rank(), s.ps->pp_rank(),
              s.ps->cp_rank(), s.ps->dp_rank(), s.ps->ep_rank());
  if (a.threads > 0) {
    omp_set_num_threads(int(a.threads));
  }
  // BLAS runs between OpenMP regions: give it the same cores.
  openblas_set_num_threads(omp_get_max_threads());

  s.tok = build_tokenizer(a);
  const int64_t vocab = s.tok->vocab_size();
  resolve_padded_vocab_size(a, vocab);  // --padded-vocab-size, or the tokenizer's padded
  print_args(a);
  for (const auto& line : describe_by_design_flags(a)) log::info("{}", line);
  log::info("{}",
            padded_vocab_message(vocab, *a.padded_vocab_size, a.was_given("padded_vocab_size")));
  if (const auto steps = step_batch_schedule(a)) {
    s.batches = std::make_unique<data::NumMicroBatchesCalculator>(
        a.micro_batch_size, a.data_parallel_size, *steps);
    log::info("> using step batch size schedule: {}", *a.step_batch_size_schedule);
    for (const auto& [threshold, bs] : steps->steps)
      log::info("  >= {} tokens ({} samples) -> batch_size={}, num_microbatches={}",
                threshold * a.seq_length, threshold, bs,
                bs / (a.micro_batch_size * a.data_parallel_size));
  } else if (const auto r = batch_rampup(a)) {
    s.batches = std::make_unique<data::NumMicroBatchesCalculator>(
        a.global_batch_size, a.micro_batch_size, a.data_parallel_size, r);
    log::info("will use batch size rampup starting from global batch size {} to global batch "
              "size {} with batch size increments {} over {} samples.",
              r->start, a.global_batch_size, r->increment, r->samples);
  } else {
    s.batches = std::make_unique<data::NumMicroBatchesCalculator>(
        a.global_batch_size, a.micro_batch_size, a.data_parallel_size, std::nullopt);
    log::info("setting number of microbatches to constant {}", a.num_microbatches);
  }
  log::info("CPU threads: {} (OpenMP), BLAS {}", omp_get_max_threads(), openblas_get_num_threads());

  s.log = std::make_unique<TrainingLog>(a, s.device, s.world->world(), *s.ps);
}

// The pipeline schedule, the memory check, the model.
void Trainer::State::build_model() {
  auto& s = *this;
  const Args& a = s.args;
  s.model_cfg = model_config(a, s.device, model_dtype(a));
  log::info("> device: {}{}, parameters and activations {}{}", s.device == Device::CUDA ? "cuda" : "cpu",
            s.world->device() == Device::CUDA ? " (one GPU per rank, NCCL groups)" : "",
            dtype_name(s.model_cfg.dtype),
            s.model_cfg.dtype == DType::F32 ? "" : ", fp32 main params and main grads");
  check_profile_args(a, s.device, s.world->world().size());  // before the model is built
  ops::set_attention_request(ops::parse_attention_request(a.attention_backend));
  const model::TransformerConfig& mc = s.model_cfg;
  log::info("> {}", ops::describe_attention_backend(
                        mc.device, mc.dtype, mc.kv_channels, mc.attention_dropout, mc.num_layers,
                        mc.num_window_layers(), a.reset_attention_mask));
  s.model_cfg.tp_rank = s.ps->tp_rank();
  s.model_cfg.cp_rank = s.ps->cp_rank();  // context parallel
  if (s.model_cfg.moe.ep_size > 1) s.model_cfg.moe.ep_rank = s.ps->ep_rank();  // its experts
  if (s.model_cfg.moe.etp_size > 0) s.model_cfg.moe.etp_rank = s.ps->coords().etp;  // ETP != TP
  const int64_t dp = a.data_parallel_size;
  // The distributed optimizer splits every bucket into DP equal blocks: align each
  // parameter to a multiple of DP (and of 64 elements, as Megatron pads param starts).
  const int pp = int(a.pipeline_model_parallel_size), vpp = int(a.virtual_pipeline_model_parallel_size);
  const model::PipelinePart part = pipeline_part(a, s.ps->pp_rank());
  if (pp > 1) {
    namespace pl = parallel::pipeline;
    const int stage = s.ps->pp_rank();
    // Megatron's schedule: 1F1B, interleaved with virtual stages.
    s.schedule_kind = training::schedule_kind(a);
    s.schedule = pl::build_schedule(s.schedule_kind, pp, vpp, int(a.num_microbatches),
                                    int(a.microbatch_group_size_per_vp_stage.value_or(0)));
    s.built_schedule_microbatches = a.num_microbatches;
    // Evaluation: forward only, over its own micro-batches (--eval-global-batch-size).
    s.forward_only =
        a.eval_num_microbatches == a.num_microbatches
            ? pl::forward_only(s.schedule)[size_t(stage)]
            : pl::forward_only(pl::build_schedule(
                  s.schedule_kind, pp, vpp, int(a.eval_num_microbatches),
                  int(a.microbatch_group_size_per_vp_stage.value_or(0))))[size_t(stage)];
    // Every micro-batch count of a ramp-up must make a schedule (the interleaved one needs
    // multiples of the group size): checked now, not at the step that reaches it.
    std::vector<int64_t> batches;
    if (const auto r = batch_rampup(a))
      for (int64_t b = r->start; b < a.global_batch_size; b += r->increment) batches.push_back(b);
    if (const auto steps = step_batch_schedule(a))
      for (const auto& st : steps->steps)
        if (st.second % (a.micro_batch_size * a.data_parallel_size) == 0)
          batches.push_back(st.second);  // the others: check_from's error when reached
    for (int64_t b : batches)
      (void)pl::build_schedule(s.schedule_kind, pp, vpp,
                               int(b / (a.micro_batch_size * a.data_parallel_size)),
                               int(a.microbatch_group_size_per_vp_stage.value_or(0)));
    s.pp_grads = s.world->split(s.ps->layout().groups(parallel::Group::PP), "pp-grad");
    MCPP_CHECK(s.pp_grads && s.pp_grads->rank() == stage && s.ps->pp().rank() == stage,
               "pipeline group ranks do not follow the pipeline stages");
    std::string chunks;
    for (const auto& ch : part.chunks)
      chunks += ch.empty() ? std::string(" []") : fmt::format(" [{}-{}]", ch.front(), ch.back());
    log::info("> pipeline: {} stages x {} model chunks, {} schedule, {} micro-batches; stage 0 "
              "layers{}",
              pp, vpp, pl::to_string(s.schedule_kind), a.num_microbatches, chunks);
    if (a.pipeline_model_parallel_layout) {
      const auto l = pl::parse_layout(*a.pipeline_model_parallel_layout, pp, int(a.num_layers),
                                      int(a.mtp_num_layers.value_or(0)));
      log::info("> --pipeline-model-parallel-layout {}:", *a.pipeline_model_parallel_layout);
      for (const auto& line : pl::describe_layout(l)) log::info(">   {}", line);
    }
  }
  // The memory plan against what this rank can get, before anything large is allocated: a
  // config that cannot fit fails here with the plan's numbers and what to change, not as an
  // out-of-memory error in the first backward (GPU) or the kernel's OOM killer ending the
  // job without a word (CPU). The plan leaves out only a few MiB (cuBLASLt's workspace),
  // so the check never stops a run that would fit.
  if (s.device == Device::CPU) {
    // The host's available memory, shared by this job's ranks on the host.
    const int64_t avail = host_memory_available();
    const int local = host_local_ranks();
    if (avail >= 0) {
      const std::string advice =
          memory_fit_advice(a, s.model_cfg, s.ps->pp_rank(), avail / local);
      MCPP_CHECK(advice.empty(), "{} (this host: {:.0f} MiB available for {} rank(s) of this job)",
                 advice, double(avail) / 1048576.0, local);
    }
  }
#ifdef MCPP_HAVE_CUDA
  if (s.device == Device::CUDA) {
    const auto ms = ops::cuda::memory_stats();
    const std::string advice = memory_fit_advice(a, s.model_cfg, s.ps->pp_rank(),
                                                 int64_t(ms.device_free + ms.reserved));
    MCPP_CHECK(advice.empty(), "{} (this GPU: {:.0f} MiB free, {:.0f} MiB held by this run)",
               advice, double(ms.device_free) / 1048576.0, double(ms.reserved) / 1048576.0);
  }
#endif
  s.model = std::make_unique<model::GPTModel>(s.model_cfg, &s.ps->tp(), part);
  if (s.model_cfg.cp_size > 1)  // context parallel (and its levels for a2a+p2p layers)
    s.model->set_cp_comm(&s.ps->cp(), &s.ps->cp_a2a(), &s.ps->cp_p2p());
  if (s.model_cfg.moe.ep_size > 1 || s.model_cfg.moe.etp_size > 0) {  // every MoE layer's EP group
    int moe_layers = 0;
    for (auto* l : s.model->stage().moe_layers())  // the MTP depths' too
      l->set_expert_parallel_group(&s.ps->ep()),
          l->set_expert_tensor_parallel_group(&s.ps->group(parallel::Group::ExpertTP)),
          ++moe_layers;
    log::info("> expert parallel: EP {} (this rank {}, experts {}-{} of {}), expert tensor "
              "parallel {}, expert data parallel {}, {} dispatcher, {} MoE layers on this rank",
              s.ps->layout().ep(), s.ps->ep_rank(), s.model_cfg.moe.first_expert(),
              s.model_cfg.moe.first_expert() + s.model_cfg.moe.local_experts() - 1,
              s.model_cfg.moe.num_experts, s.ps->layout().etp(), s.ps->layout().edp(),
              s.args.moe_token_dispatcher_type == "flex"
                  ? "flex (megatron.cpp's all-to-all exchange)"
                  : s.model_cfg.moe.alltoall ? "alltoall" : "allgather",
              moe_layers);
  }
  // global_aux_loss: its counts summed over the DP x CP group (routing.h).
  if (s.model_cfg.moe.coeff(model::TransformerConfig::Moe::Balance::GlobalAuxLoss) > 0)
    for (auto* l : s.model->stage().moe_layers()) l->set_global_aux_group(&data_cp_group(*s.ps));
  log::info("> initialized tensor model parallel with size {}, pipeline model parallel with "
            "size {}, data parallel with size {}{}{}",
            a.tensor_model_parallel_size, pp, dp, a.sequence_parallel ? ", sequence parallel" : "",
            a.use_distributed_optimizer ? ", distributed optimizer" : "");
  if (a.context_parallel_size > 1) {
    // The exchange of each layer's attention, run-length grouped (per-layer types allowed).
    std::string kinds;
    for (size_t i = 0; i < a.cp_comm_type.size();) {
      size_t j = i;
      while (j < a.cp_comm_type.size() && a.cp_comm_type[j] == a.cp_comm_type[i]) ++j;
      kinds += fmt::format("{}{} ({} layer{})", kinds.empty() ? "" : ", ", a.cp_comm_type[i],
                           j - i, j - i == 1 ? "" : "s");
      i = j;
    }
    const auto& h = a.hierarchical_context_parallel_sizes;
    log::info("> context parallel with size {} (this rank {}): {}{}", a.context_parallel_size,
              s.ps->cp_rank(), kinds,
              h && h->size() == 2
                  ? fmt::format("; a2a+p2p: all-to-all groups of {}, a ring of {}", (*h)[0],
                                (*h)[1])
                  : std::string());
  }
  log::info(" > number of parameters on (tensor, pipeline) model parallel rank ({}, {}): {}",
            s.ps->tp_rank(), s.ps->pp_rank(), s.model->params().total_numel());
  if (a.recompute_granularity)
    log::info("> activation recomputation: {}{}", *a.recompute_granularity,
              *a.recompute_granularity == "full"
                  ? fmt::format(", method {}, {} layers", *a.recompute_method, *a.recompute_num_layers)
                  : std::string(", the attention core"));
  if (a.keep_mlp_activations > 0) {
    int kept = 0, layers = 0;
    for (const auto& ch : s.model->part().chunks) {
      for (bool k : model::keeps_mlp_activation(s.model_cfg, int(ch.size()))) kept += k;
      layers += int(ch.size());
    }
    log::info(
        "> MLP activations kept for backward, not recomputed (--keep-mlp-activations {}): "
        "{} of this rank's {} layers",
        a.keep_mlp_activations, kept, layers);
  }
  s.fwd_bwd = std::make_unique<ForwardBackward>(ForwardBackward{*s.model, *s.ps});
  s.fwd_bwd->timer = [&s](std::string_view n, bool start) { s.log->section(n, start, 2); };
  s.fwd_bwd->pp_grads = s.pp_grads.get();
  s.fwd_bwd->train_actions = pp > 1 ? &s.schedule[size_t(s.ps->pp_rank())] : nullptr;
  s.fwd_bwd->eval_actions = &s.forward_only;
  s.fwd_bwd->micro_batch_size = a.micro_batch_size;
}

// The data-parallel gradient buckets, the optimizer, and each parameter's part in the
// gradient reductions (from the registry).
void Trainer::State::build_optimizer() {
  auto& s = *this;
  const Args& a = s.args;
  const int64_t dp = a.data_parallel_size;
  auto& P = s.model->params();
  {
    std::vector<parallel::ParamSpan> spans;
    for (size_t i = 0; i < P.infos().size(); ++i) {
      const auto& p = P.infos()[i];
      const int64_t next = i + 1 < P.infos().size() ? P.infos()[i + 1].offset : P.total_numel();
      spans.push_back({p.offset, next - p.offset, p.layer, p.expert >= 0});
    }
    // Expert parallelism: expert gradients over the expert-data-parallel group (at EP 1
    // it is the DP group: one set of buckets, as for a dense model).
    // ETP != TP changes it too (ETP 1 at TP 2: the TP ranks' whole experts are EDP replicas).
    const bool expert_groups = s.ps->layout().ep() > 1 || s.ps->layout().etp() != s.ps->layout().tp();
    comm::Communicator* expert_dp = expert_groups ? &s.ps->expert_dp() : nullptr;
    // Megatron's default bucket: max(40M, 1M * DP) parameters (only with overlap).
    const int64_t bucket = a.ddp_bucket_size.value_or(
        a.overlap_grad_reduce ? std::max<int64_t>(40000000, 1000000 * dp) : P.total_numel());
    // --num-distributed-optimizer-instances N > 1: reduce-scattered within this rank's
    // instance (DP x CP / N ranks), the shard then all-reduced across the instances.
    const bool instances = a.num_distributed_optimizer_instances > 1;
    s.dp_grads = std::make_unique<parallel::DataParallelGrads>(
        // Over DP x CP: each CP rank's gradients are those of its part of the sequences.
        P.flat_grads(), std::move(spans),
        instances ? s.ps->intra_dp_cp() : data_cp_group(*s.ps), bucket, a.overlap_grad_reduce,
        a.use_distributed_optimizer, a.grad_reduce_in_bf16, expert_dp,
        instances ? &s.ps->inter_dist_opt() : nullptr);
    const auto& g = *s.dp_grads;
    log::info(
        "> gradient buckets: {} (--ddp-bucket-size {}), {} in {}{}{}{}", g.buckets().size(),
        bucket, a.use_distributed_optimizer ? "reduce-scatter" : "all-reduce",
        dtype_name(g.reduce_dtype()),
        instances ? fmt::format(" over {} ranks, then all-reduce of the shard across {} "
                                "distributed-optimizer instances",
                                g.dp().size(), a.num_distributed_optimizer_instances)
                  : std::string(),
        g.staging_bytes() > 0
            ? fmt::format(" (--grad-reduce-in-bf16: {} bytes of bf16 staging)", g.staging_bytes())
            : std::string(),
        a.overlap_grad_reduce ? ", overlapped with backward" : "");
    if (a.overlap_grad_reduce)
      s.model->set_grad_ready_hook([g = s.dp_grads.get(), dev = s.device](int layer) {
        g->layer_ready(layer, ops::default_stream(dev));
      });
    s.fwd_bwd->dp_grads = s.dp_grads.get();
  }
  optim::OptimizerConfig ocfg{a.adam_beta1, a.adam_beta2, a.adam_eps};
  // --optimizer muon: Muon for the matrices, --muon-scalar-optimizer for the rest.
  const bool muon = a.optimizer == "muon" || a.optimizer == "adaptive_muon";
  const std::string rule = muon ? a.muon_scalar_optimizer : a.optimizer;
  ocfg.rule = rule == "sgd"    ? optim::UpdateRule::Sgd
              : rule == "lion" ? optim::UpdateRule::Lion
                               : optim::UpdateRule::Adam;
  ocfg.sgd_momentum = a.sgd_momentum;
  ocfg.lion_beta1 = a.lion_beta1, ocfg.lion_beta2 = a.lion_beta2;
  // --use-precision-aware-optimizer: the moments' dtypes (validate_optimizer.cpp).
  auto moment_dtype = [&](const std::string& d) {
    return a.use_precision_aware_optimizer && d == "bf16" ? DType::BF16 : DType::F32;
  };
  ocfg.exp_avg_dtype = moment_dtype(a.exp_avg_dtype);
  ocfg.exp_avg_sq_dtype = moment_dtype(a.exp_avg_sq_dtype);
  // A bf16 moving average whose decay is under half a bf16 step (2^-9) never decays.
  for (auto [dt, beta, flag, moment] :
       {std::tuple{ocfg.exp_avg_dtype, a.adam_beta1, "--adam-beta1", "exp_avg"},
        std::tuple{ocfg.exp_avg_sq_dtype, a.adam_beta2, "--adam-beta2", "exp_avg_sq"}})
    if (dt == DType::BF16 && ocfg.rule == optim::UpdateRule::Adam && 1 - beta < 0x1p-9)
      log::warn("{} {} with a bf16 {}: {} * m rounds back to m in bf16, so the moment cannot "
                "decay (recipes with bf16 moments use --adam-beta2 0.95; docs/optimizer.md)",
                flag, beta, moment, beta);
  // --optimizer muon / adaptive_muon (muon_setup.cpp), whichever optimizer holds the state.
  auto enable_muon = [&](optim::Optimizer& o) {
    if (muon) enable_muon_from_args(o, a, s.model_cfg, *s.ps, P);
  };
  if (a.use_distributed_optimizer) {
    auto dist = std::make_unique<optim::DistributedAdamW>(P, ocfg, *s.dp_grads, a.overlap_param_gather);
    enable_muon(*dist);
    // ---- --fp8-param-gather: the FP8 weights all-gathered as FP8 (optim/fp8_param_gather.h)
    if (a.fp8_param_gather)
      dist->enable_fp8_param_gather(s.model_cfg, s.ps->tp().size() > 1 ? &s.ps->tp() : nullptr);
    s.opt = std::move(dist);
    // The main params apart from the model's (none for f32/f64 models, the lower halves
    // for split bf16 ones) + the moments (in their dtypes), against the same state held for
    // the whole buffer.
    const int64_t moment_bytes =
        int64_t(dtype_size(ocfg.exp_avg_dtype)) +
        (ocfg.rule == optim::UpdateRule::Adam || a.optimizer == "adaptive_muon"
             ? int64_t(dtype_size(ocfg.exp_avg_sq_dtype))
             : 0);
    const int64_t main_bytes =
        optim::Optimizer::main_param_bytes(P.flat_params().dtype(), a.fp8_param_gather);
    const int64_t full = (main_bytes + moment_bytes) * P.total_numel();
    log::info("> distributed optimizer: {} bytes of optimizer state on this rank, {:.3f} of the "
              "{} bytes an unsharded optimizer holds{}",
              s.opt->state_bytes(), double(s.opt->state_bytes()) / double(full), full,
              a.num_distributed_optimizer_instances > 1
                  ? fmt::format(" ({} instances of {} ranks, each holding the whole state)",
                                a.num_distributed_optimizer_instances, s.dp_grads->dp().size())
                  : std::string());
  } else {
    auto adam = std::make_unique<optim::AdamW>(P, ocfg);
    enable_muon(*adam);
    s.opt = std::move(adam);
  }
  // --overlap-param-gather: the forward waits for each layer's gathered parameters.
  if (a.overlap_param_gather)
    s.model->set_params_needed_hook([o = s.opt.get()](int layer) { o->wait_params(layer); });
  s.grad_params = optim::grad_params(P, *s.ps);  // collective over the embedding group
  s.norm_group = &parallel::grad_norm_group(*s.ps, s.world->world(), s.opt->state_sharded());
  // Expert parallelism: the expert parameters' squares summed over ETP x EP (x PP) -- for
  // the grad norm only when the optimizer holds whole gradients: its shards (dense over
  // DP, experts over EDP) are all distinct over the sharded norm group already.
  if (s.ps->layout().ep() > 1 || s.ps->layout().etp() != s.ps->layout().tp()) {
    s.expert_mp_group = &s.ps->group(a.pipeline_model_parallel_size > 1 ? parallel::Group::TP_EP_PP
                                                                         : parallel::Group::TP_EP);
    if (!s.opt->state_sharded()) s.expert_norm_group = s.expert_mp_group;
  }
  // The memory plan before the first step allocates any activation, per pipeline stage;
  // the allocated weights, gradients and optimizer state must agree with it.
  s.plan = plan_stage_memory(a, s.model_cfg, s.ps->pp_rank());
  const int64_t have = int64_t(P.flat_params().nbytes() + P.flat_grads().nbytes()) +
                       s.dp_grads->staging_bytes() + s.dp_grads->shard_bytes() +
                       s.opt->state_bytes();
  s.log->memory_plan(s.plan, have);
}

// The validation sets (State::valid_sets): with --multiple-validation-sets each prefix of
// --valid-data-path (built alone: `sets`), or --data-path's validation split as the one
// set, each named; --full-validation sizes each evaluation to the set's epoch, which every
// DP rank must have a sample of (Megatron's sampler fails on a rank without one).
void Trainer::State::build_validation_sets(
    std::vector<std::shared_ptr<data::GPTSampleSource>> sets) {
  auto& s = *this;
  const Args& a = s.args;
  s.valid_sets.clear();
  if (a.multiple_validation_sets && sets.empty() && s.datasets[1])
    sets.push_back(s.datasets[1]);  // --data-path's validation split: one set, as in Megatron
  if (a.multiple_validation_sets) {
    const auto& names = a.validation_set_names;
    MCPP_CHECK_HINT(names.empty() || names.size() == sets.size(),
                    "give one name per validation prefix",
                    "--validation-set-names gives {} names for {} validation sets",
                    a.validation_set_names.size(), sets.size());
    for (size_t k = 0; k < sets.size(); ++k)
      s.valid_sets.push_back({sets[k], "-" + (names.empty() ? std::to_string(k) : names[k])});
  } else if (s.datasets[1]) {
    s.valid_sets.push_back({s.datasets[1], ""});
  }
  for (auto& v : s.valid_sets) {
    if (a.full_validation) {
      const int64_t n = v.ds->size(), dp = a.data_parallel_size;
      MCPP_CHECK_HINT(n >= dp, "give a larger validation set, or fewer data-parallel ranks",
                      "--full-validation: validation set{} has {} samples, fewer than the {} "
                      "data-parallel ranks that each read one",
                      v.suffix, n, dp);
      v.iters = (n + dp - 1) / dp;
    }
    if (a.multiple_validation_sets || a.full_validation)
      log::info("    validation{}: {}{}", v.suffix, v.ds->describe(),
                a.full_validation
                    ? fmt::format(" | full validation: {} iterations of {} one-sample "
                                  "micro-batches", v.iters, a.eval_num_microbatches)
                    : std::string());
  }
}

Trainer::Trainer(Args args) : s_(std::make_unique<State>()) {
  auto& s = *s_;
  s.args = std::move(args);
  const Args& a = s.args;
  s.setup_parallel();
  if (a.log_progress)  // "Starting job", as Megatron writes it after initialisation
    s.progress = std::make_unique<ProgressLog>(*a.save, s.world->world().size(),
                                               s.world->world().rank() == 0);
  s.build_model();
  s.build_optimizer();
  if (a.fp16) {
    optim::LossScalerConfig lc;
    lc.loss_scale = a.loss_scale.value_or(0.0), lc.initial_scale = a.initial_loss_scale;
    lc.min_scale = a.min_loss_scale, lc.window = int64_t(a.loss_scale_window);
    lc.hysteresis = a.hysteresis;
    s.scaler = std::make_unique<optim::LossScaler>(lc);
    log::info("> fp16 loss scaling: {}", s.scaler->dynamic()
                                           ? fmt::format("dynamic, initial scale {}, window {}, "
                                                         "hysteresis {}, min {}",
                                                         lc.initial_scale, lc.window,
                                                         lc.hysteresis, lc.min_scale)
                                           : fmt::format("constant {}", lc.loss_scale));
  }
  s.sched = std::make_unique<optim::OptimizerParamScheduler>(lr_scheduler_config(a));
  if (a.save) checkpoint::check_save_dir_writable(*a.save);  // fail at start-up, not at the first save
  // --ckpt-format torch: every parameter of this stage has a place in the legacy layout
  if (a.save && a.ckpt_format == "torch")
    checkpoint::megatron::check_legacy_trainable(s.legacy_options(), *s.ps, s.model->params());
  if (s.load_source) s.load();
  // --step-batch-size-schedule: every batch size this run reaches divides into micro-batches
  // (Megatron finds out at the step that reaches it).
  if (a.step_batch_size_schedule && !a.skip_train)
    s.batches->check_from(s.consumed_train,
                          a.train_samples.value_or(data::samples_for_iters(
                              a.train_iters, *step_batch_schedule(a))));
  s.flops_at_job_start = s.flops_so_far;
  if (a.fp8_param_gather) {
    // ---- --fp8-param-gather: the first FP8 weights, from the start-up (or loaded) main
    // parameters; the bytes one parameter all-gather moves (tests/fp8 check them).
    auto& dist = dynamic_cast<optim::DistributedAdamW&>(*s.opt);
    comm::Communicator& dp = s.dp_grads->dp();  // the instance's group: it gathers
    auto arrived = [&dp] {  // what the DP group counts gathered or received
      return dp.stats().bytes[size_t(comm::OpKind::AllGather)] +
             dp.stats().bytes[size_t(comm::OpKind::Recv)];
    };
    const uint64_t before = arrived();
    dist.refresh_fp8_params();
    const uint64_t moved = arrived() - before;
    const optim::Fp8ParamGather& g = *dist.fp8_param_gather();
    log::info("> --fp8-param-gather: {} FP8 weight elements on this rank; a parameter "
              "all-gather writes {} bytes of FP8 and {} bytes of {} ({} counted by the DP "
              "group, {} this rank's own; {} bytes without the flag)",
              g.fp8_elements(), g.gathered_fp8_bytes(), g.gathered_other_bytes(),
              dtype_name(s.model->params().flat_params().dtype()), moved, g.own_bytes(),
              g.plain_bytes());
  }
  if (a.async_save) {
    MCPP_CHECK_HINT(a.save, "add --save DIR", "--async-save needs --save");
    s.async_saver = std::make_unique<checkpoint::AsyncSaver>();
  }
  if (a.exit_signal_handler) install_exit_signal_handler(*signal_number(a.exit_signal));
  s.build_datasets();
}

Trainer::~Trainer() = default;

}  // namespace mcpp::training
