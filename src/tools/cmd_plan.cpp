// `megatron plan`: what a pipeline-parallel run will do, without running it.
//
//   megatron plan --pipeline-model-parallel-size 4 --num-layers 16
//                 [--num-virtual-stages-per-pipeline-rank V |
//                 --num-layers-per-virtual-pipeline-stage K]
//                 [--decoder-first-pipeline-num-layers N] [--decoder-last-pipeline-num-layers N]
//                 --micro-batch-size 1 --global-batch-size 32
//                 [--world-size W | --data-parallel-size D] [--tensor-model-parallel-size T]
//
// prints the layers of every (pipeline rank, model chunk), every rank's action list
// (F<mb>[.<chunk>] / B..., with --show-p2p the transfers too), and the replay of that
// schedule under a cost model: step time, bubble fraction against theory, idle time and
// peak in-flight micro-batches (activations held) per rank.
//
// Given the model too (any of `megatron train`'s flags: a launch line with `train`
// replaced by `plan`, plus --world-size), it also prints the memory of every pipeline
// rank -- weights, gradients, optimizer state, activations per micro-batch, in flight,
// peak -- as `megatron train` will allocate it (training/memory_plan.h), before any GPU
// is touched: try recomputation settings and layouts for a model that must fit.
#include <algorithm>
#include <cstdio>
#include <map>
#include <optional>
#include <set>

#include "model/memory_estimate.h"
#include "ops/attention_backend.h"
#include "parallel/pipeline/layout.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/simulator.h"
#include "tools/commands.h"
#include "tools/flags.h"
#include "training/arguments.h"
#include "training/memory_plan.h"
#include "training/trainer.h"
#include "training/validate_compat.h"

namespace mcpp::tools {
namespace {

namespace pl = parallel::pipeline;

std::string layer_range(const std::vector<int>& ids) {
  if (ids.empty()) return "[]";
  if (ids.size() == 1) return fmt::format("[{}]", ids.front());
  return fmt::format("[{}-{}]", ids.front(), ids.back());  // a chunk's layers are contiguous
}

double parse_double(const Flags& f, const std::string& name, double def) {
  if (!f.has(name)) return def;
  try {
    size_t used = 0;
    double v = std::stod(f.get(name), &used);
    if (used == f.get(name).size() && v >= 0) return v;
  } catch (...) {
  }
  throw Error(fmt::format("{} expects a non-negative number, got '{}'", name, f.get(name)));
}

// Flags only `megatron plan` has (with their value count); with a model, everything else
// is `megatron train`'s.
const std::map<std::string, int> kPlanOnly = {
    {"--world-size", 1},   {"--data-parallel-size", 1}, {"--schedule", 1},  {"--forward-cost", 1},
    {"--backward-cost", 1}, {"--p2p-cost", 1},          {"--show-p2p", 0}, {"--help", 0},
    {"--device-memory-gib", 1}};

std::string mib(int64_t bytes) { return fmt::format("{:.2f}", double(bytes) / 1048576.0); }

// The memory table of every pipeline rank for the model `train_args` describe.
// device_gib > 0: then whether each rank fits in that much device memory, and if not
// what to change (training::memory_fit_advice).
// Where `megatron train` would run this line: --device, else a GPU for --bf16/--fp16.
bool plans_gpu(const training::Args& a) {
  return a.device == "cuda" || (a.device == "auto" && (a.bf16 || a.fp16));
}

// The model's flags parsed and validated as `megatron train` validates them. A launch
// line (it has --lr or a training length) is validated for training and meets the
// trainer's own list of what it cannot do yet (training::check_trainer_support): the plan
// rejects exactly what training would, with the same message.
training::Args plan_training_args(std::vector<std::string> train_args, int world) {
  // --vocab-size alone sizes the vocabulary (no tokenizer files needed to plan).
  auto given = [&](const char* flag) {
    return std::find(train_args.begin(), train_args.end(), flag) != train_args.end();
  };
  if (given("--vocab-size") && !given("--tokenizer-type"))
    train_args.insert(train_args.end(), {"--tokenizer-type", "NullTokenizer"});
  training::Args a = training::parse_args(train_args);
  // The attention kernel the plan counts for (its dropout mask, its workspace) is the one
  // `megatron train` would pick: the same --attention-backend request.
  ops::set_attention_request(ops::parse_attention_request(a.attention_backend));
  const bool launch = given("--lr") || given("--train-iters") || given("--train-samples");
  training::validate_args(a, world, /*training=*/launch);
  // The GPU's own capabilities (FP8) are checked when the run starts on it: a plan may be
  // made on a machine without the GPU it plans for.
  training::check_trainer_support(a, plans_gpu(a) ? Device::CUDA : Device::CPU,
                                  /*query_gpu=*/false);
  return a;
}

// One transformer layer's saved activations per micro-batch (a middle pipeline stage's
// layer: no embedding, no head), and beside it Megatron's own estimate:
// theoretical_memory_usage.py's compute_activation_memory, s*b*h*(18 + 4*ffn/h)/t bytes per
// layer (Korthikanti et al. 2022, Table 2: 34*s*b*h/t for ffn = 4h), which Megatron reports
// only for sequence parallelism with selective recomputation (16-bit activations).
void print_layer_activations(const training::Args& a, const model::TransformerConfig& cfg) {
  model::PipelinePart one;
  one.chunks = {{0}}, one.first_stage = false, one.last_stage = false;
  const int64_t ours = model::saved_activation_bytes(cfg, one, 0, a.micro_batch_size, a.seq_length);
  const double s = double(a.seq_length), b = double(a.micro_batch_size), h = double(a.hidden_size);
  const double t = double(a.tensor_model_parallel_size);
  const double megatron = s * b * h * (18.0 + 4.0 * double(a.ffn_hidden_size) / h) / t;
  const bool applies =
      a.sequence_parallel && a.recompute_granularity.value_or("") == "selective";
  std::printf("activations per transformer layer and micro-batch: %s MiB (megatron.cpp, saved); "
              "Megatron's theoretical estimate s*b*h*(18 + 4*ffn/h)/t = %s MiB%s (ratio %.2f)\n",
              mib(ours).c_str(), mib(int64_t(megatron)).c_str(),
              applies ? "" : " (Megatron's formula assumes --sequence-parallel and "
                             "--recompute-granularity selective)",
              double(ours) / megatron);
}

void print_memory(std::vector<std::string> train_args, int world, int pp, double device_gib) {
  training::Args a = plan_training_args(std::move(train_args), world);
  // The tokenizer's size as training sees it: NullTokenizer (no files) adds its EOD id to
  // --vocab-size; another tokenizer given --vocab-size is planned without its files.
  const int64_t vocab = a.vocab_size && a.tokenizer_type != "NullTokenizer"
                            ? *a.vocab_size
                            : training::build_tokenizer(a)->vocab_size();
  training::resolve_padded_vocab_size(a, vocab);  // --padded-vocab-size, checked as by train
  // Where and in which dtype: --bf16/--fp16 train on GPUs; fp32 on --device cuda or the CPU.
  const bool gpu = plans_gpu(a);
  const DType dt = a.bf16 ? DType::BF16 : a.fp16 ? DType::F16 : DType::F32;
  const auto cfg = training::model_config(a, gpu ? Device::CUDA : Device::CPU, dt);
  const std::string keep =
      a.keep_mlp_activations > 0
          ? fmt::format("; MLP activations kept by the first {} layers of each chunk",
                        a.keep_mlp_activations)
          : std::string();
  // Context parallelism: each CP rank holds seq_length / CP tokens of every sequence.
  const std::string cp =
      a.context_parallel_size > 1
          ? fmt::format(", CP rank 0 of {} ({} of the {} tokens)", a.context_parallel_size,
                        a.seq_length / a.context_parallel_size, a.seq_length)
          : std::string();
  // Expert parallelism: EP rank 0 holds E / EP of the experts.
  const std::string ep =
      a.num_experts && a.expert_model_parallel_size > 1
          ? fmt::format(", EP rank 0 of {} ({} of the {} experts per MoE layer)",
                        a.expert_model_parallel_size, *a.num_experts / a.expert_model_parallel_size,
                        *a.num_experts)
          : std::string();
  std::printf(
      "\nmemory per pipeline rank (MiB; TP rank 0 of %lld, DP rank 0 of %lld%s%s; %s on %s; "
      "recompute %s%s; micro-batch %lld x %lld tokens)\n",
      (long long)a.tensor_model_parallel_size, (long long)a.data_parallel_size, cp.c_str(),
      ep.c_str(),
      std::string(dtype_name(dt)).c_str(), gpu ? "GPU" : "CPU",
      a.recompute_granularity.value_or("none").c_str(), keep.c_str(), (long long)a.micro_batch_size,
      (long long)cfg.seq_cp());
  std::printf("  %-5s %-13s %-14s %-14s %-16s %-9s %-14s %s\n", "rank", "parameters",
              "weights+grads", "optimizer", "act/micro-batch", "in flight", "activations",
              "total");
  for (int s = 0; s < pp; ++s) {
    const auto m = training::plan_stage_memory(a, cfg, s);
    std::printf("  %-5d %-13lld %-14s %-14s %-16s %-9d %-14s %s\n", s, (long long)m.parameters,
                mib(m.weights + m.grads).c_str(), mib(m.optimizer).c_str(),
                mib(m.per_microbatch).c_str(), m.in_flight, mib(m.activations()).c_str(),
                mib(m.total()).c_str());
  }
  print_layer_activations(a, cfg);
  const auto m0 = training::plan_stage_memory(a, cfg, 0);
  std::string includes;  // what the total holds besides weights, optimizer and activations
  if (m0.attention_workspace > 0)
    includes += fmt::format("; total includes {} MiB of cuDNN's attention-backward workspace",
                            mib(m0.attention_workspace));
  if (m0.cp_exchange > 0)
    includes += fmt::format("; total includes {} MiB of context-parallel exchange buffers",
                            mib(m0.cp_exchange));
  std::printf("(`megatron train` prints the same per rank at start-up: \"Theoretical memory "
              "footprints\"; activations include %s MiB of shared scratch%s)\n",
              mib(m0.scratch).c_str(), includes.c_str());
  if (device_gib > 0) {
    const auto budget = int64_t(device_gib * 1073741824.0);
    for (int s = 0; s < pp; ++s) {
      const std::string advice = training::memory_fit_advice(a, cfg, s, budget);
      if (advice.empty())
        std::printf("  rank %d fits in %.1f GiB by the plan\n", s, device_gib);
      else
        std::printf("  rank %d: %s\n", s, advice.c_str());
    }
  }
}

int run_plan(const std::vector<std::string>& all_args) {
  // With model flags the arguments split: plan's own flags and the layout flags it shares
  // with `megatron train` go to plan; everything but plan's own goes to train's parser.
  bool with_model = false;
  for (const auto& t : all_args) with_model |= t == "--hidden-size";
  std::vector<std::string> args, train_args;
  if (!with_model) {
    args = all_args;
  } else {
    static const std::set<std::string> shared = {
        "--pipeline-model-parallel-size", "--num-layers", "--num-layers-per-virtual-pipeline-stage",
        "--num-virtual-stages-per-pipeline-rank",
        "--microbatch-group-size-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers",
        "--decoder-last-pipeline-num-layers", "--pipeline-model-parallel-layout",
        "--mtp-num-layers", "--micro-batch-size", "--global-batch-size",
        "--tensor-model-parallel-size", "--context-parallel-size"};
    for (size_t i = 0; i < all_args.size(); ++i) {
      const std::string& t = all_args[i];
      if (auto it = kPlanOnly.find(t); it != kPlanOnly.end()) {
        args.push_back(t);
        if (it->second && i + 1 < all_args.size()) args.push_back(all_args[++i]);
        continue;
      }
      train_args.push_back(t);
      if (shared.count(t)) {
        args.push_back(t);
        if (i + 1 < all_args.size()) args.push_back(all_args[i + 1]), train_args.push_back(all_args[++i]);
      }
    }
  }
  Flags f;
  f.add("--pipeline-model-parallel-size", Flags::Value, "pipeline stages PP (default 1)")
      .add("--num-layers", Flags::Value, "transformer layers")
      .add("--num-layers-per-virtual-pipeline-stage", Flags::Value,
           "layers per model chunk (interleaved schedule)")
      .add("--num-virtual-stages-per-pipeline-rank", Flags::Value,
           "model chunks per rank V (interleaved schedule)")
      .add("--microbatch-group-size-per-virtual-pipeline-stage", Flags::Value,
           "micro-batches per group (default PP)")
      .add("--decoder-first-pipeline-num-layers", Flags::Value, "layers of the first stage")
      .add("--decoder-last-pipeline-num-layers", Flags::Value, "layers of the last stage")
      .add("--pipeline-model-parallel-layout", Flags::Value,
           "every stage's layers, e.g. \"Et*3|(tt|)*2tmL\" (sets V = stages / PP)")
      .add("--mtp-num-layers", Flags::Value, "MTP layers (the layout's m; default 0)")
      .add("--micro-batch-size", Flags::Value, "samples per micro-batch (default 1)")
      .add("--global-batch-size", Flags::Value, "samples per step (default micro x DP)")
      .add("--world-size", Flags::Value, "ranks; DP = world / (TP x PP x CP)")
      .add("--data-parallel-size", Flags::Value, "DP (instead of --world-size)")
      .add("--tensor-model-parallel-size", Flags::Value, "TP (default 1)")
      .add("--context-parallel-size", Flags::Value, "CP (default 1)")
      .add("--schedule", Flags::Value,
           "gpipe | 1f1b | interleaved (default: interleaved "
           "with virtual stages, else 1f1b)")
      .add("--forward-cost", Flags::Value, "time of one stage's forward (default 1)")
      .add("--backward-cost", Flags::Value, "time of one stage's backward (default 2)")
      .add("--p2p-cost", Flags::Value, "time of one transfer (default 0)")
      .add("--show-p2p", Flags::Switch, "list sends and receives too")
      .add("--device-memory-gib", Flags::Value,
           "with model flags: whether each rank fits in this much GPU memory, and what to "
           "change if not")
      .add("--help", Flags::Switch, "this text");
  f.parse(args, "plan");
  if (f.has("--help") || !f.has("--num-layers")) {
    std::printf(
        "usage: megatron plan --num-layers L --pipeline-model-parallel-size PP [flags]\n"
        "       (add the model flags of `megatron train`, e.g. --hidden-size, --seq-length,\n"
        "       --vocab-size, --bf16, --recompute-granularity ..., to get every pipeline\n"
        "       rank's memory as megatron train will allocate it)\n\n%s",
        f.help().c_str());
    return f.has("--help") ? 0 : 1;
  }
  const double device_gib = f.get_double("--device-memory-gib", 0.0);
  MCPP_CHECK_HINT(!f.has("--device-memory-gib") || (device_gib > 0 && with_model),
                  "give a positive size in GiB, with the model flags (--hidden-size, ...)",
                  "--device-memory-gib {} needs a positive number and the model's flags",
                  f.get("--device-memory-gib"));
  // With a model, the launch line first meets `megatron train`'s checks (same errors).
  if (with_model) {
    const int64_t w = f.has("--world-size")
                          ? f.get_int("--world-size", 1)
                          : f.get_int("--tensor-model-parallel-size", 1) *
                                f.get_int("--pipeline-model-parallel-size", 1) *
                                f.get_int("--context-parallel-size", 1) *
                                f.get_int("--data-parallel-size", 1);
    (void)plan_training_args(train_args, int(std::max<int64_t>(1, w)));
  }
  const int pp = int(f.get_int("--pipeline-model-parallel-size", 1));
  const int num_layers = int(f.get_int("--num-layers", 0));
  const int tp = int(f.get_int("--tensor-model-parallel-size", 1));
  const int cp = int(f.get_int("--context-parallel-size", 1));
  MCPP_CHECK_HINT(pp >= 1 && tp >= 1 && cp >= 1, "give sizes of 1 or more",
                  "parallel sizes must be >= 1 (TP {}, PP {}, CP {})", tp, pp, cp);
  MCPP_CHECK_HINT(!(f.has("--num-layers-per-virtual-pipeline-stage") &&
                    f.has("--num-virtual-stages-per-pipeline-rank")),
                  "give only one of the two",
                  "--num-layers-per-virtual-pipeline-stage and "
                  "--num-virtual-stages-per-pipeline-rank are mutually exclusive");
  int vpp = 1;
  std::optional<std::string> layout;
  if (f.has("--pipeline-model-parallel-layout")) {
    layout = f.get("--pipeline-model-parallel-layout");
    MCPP_CHECK_HINT(!f.has("--num-layers-per-virtual-pipeline-stage") &&
                        !f.has("--num-virtual-stages-per-pipeline-rank"),
                    "drop the virtual-stage flag: the layout's stages / PP set it",
                    "--pipeline-model-parallel-layout cannot be combined with "
                    "--num-layers-per-virtual-pipeline-stage or "
                    "--num-virtual-stages-per-pipeline-rank (as in Megatron)");
    const int stages = int(pl::expand_layout(*layout).size());
    if (pp > 1 && stages % pp == 0) vpp = stages / pp;  // else stage_layers' error names it
  }
  if (f.has("--num-virtual-stages-per-pipeline-rank"))
    vpp = int(f.get_int("--num-virtual-stages-per-pipeline-rank", 1));
  if (f.has("--num-layers-per-virtual-pipeline-stage"))
    vpp = pl::virtual_stages_from_layers_per_stage(
        num_layers, pp, int(f.get_int("--num-layers-per-virtual-pipeline-stage", 1)));

  int dp = 1;
  if (f.has("--data-parallel-size")) dp = int(f.get_int("--data-parallel-size", 1));
  if (f.has("--world-size")) {
    const int world = int(f.get_int("--world-size", 1)), mp = tp * pp * cp;
    MCPP_CHECK_HINT(world >= mp && world % mp == 0,
                    "use a world size that is a multiple of TP x PP x CP",
                    "--world-size {} is not divisible by --tensor-model-parallel-size {} x "
                    "--pipeline-model-parallel-size {} x --context-parallel-size {} = {}",
                    world, tp, pp, cp, mp);
    MCPP_CHECK_HINT(!f.has("--data-parallel-size") || dp == world / mp,
                    "drop --data-parallel-size or make it agree",
                    "--data-parallel-size {} disagrees with --world-size {} / (TP x PP x CP = {})",
                    dp, world, mp);
    dp = world / mp;
  }
  const int64_t mbs = f.get_int("--micro-batch-size", 1);
  const int64_t gbs = f.get_int("--global-batch-size", mbs * dp);
  const int m = pl::num_microbatches(gbs, mbs, dp);

  auto first = f.get_opt_int("--decoder-first-pipeline-num-layers");
  auto last = f.get_opt_int("--decoder-last-pipeline-num-layers");
  pl::LayerSplit split;
  if (first) split.first = int(*first);
  if (last) split.last = int(*last);
  split.layout = layout;
  split.mtp_num_layers = int(f.get_int("--mtp-num-layers", 0));
  const auto layers = pl::stage_layers(num_layers, pp, vpp, split);

  const std::string sched_name = f.get("--schedule", vpp > 1 ? "interleaved" : "1f1b");
  pl::ScheduleKind kind;
  if (sched_name == "gpipe")
    kind = pl::ScheduleKind::AllForwardAllBackward;
  else if (sched_name == "1f1b")
    kind = pl::ScheduleKind::OneFOneB;
  else if (sched_name == "interleaved")
    kind = pl::ScheduleKind::Interleaved1F1B;
  else
    throw Error(fmt::format("--schedule: unknown schedule '{}'", sched_name),
                "choose gpipe, 1f1b or interleaved");
  const int g = int(f.get_int("--microbatch-group-size-per-virtual-pipeline-stage", 0));
  const auto sched = pl::build_schedule(kind, pp, vpp, m, g);

  // Cost of a chunk: its layers over the layers of an even stage (num_layers / PP).
  pl::CostModel cost;
  cost.forward = parse_double(f, "--forward-cost", 1.0);
  cost.backward = parse_double(f, "--backward-cost", 2.0);
  cost.p2p = parse_double(f, "--p2p-cost", 0.0);
  cost.scale.assign(pp, std::vector<double>(vpp, 0.0));
  bool uniform = true;
  for (int s = 0; s < pp; ++s)
    for (int c = 0; c < vpp; ++c) {
      cost.scale[s][c] = double(layers[size_t(s) * vpp + c].size()) * pp / num_layers;
      uniform &= layers[size_t(s) * vpp + c].size() == layers[0].size();
    }
  const auto sim = pl::simulate(sched, cost, pl::P2PSemantics::Rendezvous);

  const int group = kind == pl::ScheduleKind::Interleaved1F1B ? (g ? g : pp) : 0;
  std::printf("pipeline plan: %s, PP %d, V %d, TP %d, CP %d, DP %d\n", pl::to_string(kind).c_str(),
              pp, vpp, tp, cp, dp);
  std::printf("micro-batches: %d = global batch %lld / (micro batch %lld x DP %d)%s\n", m,
              (long long)gbs, (long long)mbs, dp,
              group ? fmt::format(", group size {}", group).c_str() : "");
  std::printf("\nlayers (%d, global ids; rank: chunk 0, chunk 1, ...)\n", num_layers);
  for (int s = 0; s < pp; ++s) {
    std::string line;
    int n = 0;
    for (int c = 0; c < vpp; ++c) {
      line += " " + layer_range(layers[size_t(s) * vpp + c]);
      n += int(layers[size_t(s) * vpp + c].size());
    }
    std::printf("  rank %-3d%s  (%d layers)\n", s, line.c_str(), n);
  }
  if (layout) {  // where E, m and L sit, and the chunks without layers
    std::printf("\n--pipeline-model-parallel-layout %s (rank: chunk 0 | chunk 1 | ...)\n",
                layout->c_str());
    for (const auto& row :
         pl::describe_layout(pl::parse_layout(*layout, pp, num_layers, split.mtp_num_layers)))
      std::printf("  %s\n", row.c_str());
  }
  std::printf("\nschedule (F<mb>%s forward, B backward%s)\n", vpp > 1 ? ".<chunk>" : "",
              f.has("--show-p2p") ? "; >a/<a send/recv activation, >g/<g gradient, [..] one "
                                    "batched exchange"
                                  : "");
  for (int s = 0; s < pp; ++s)
    std::printf("  rank %-3d warm-up %-3d %s\n", s, pl::warmup_microbatches(kind, pp, s, vpp, m, g),
                pl::format_actions(sched[s], f.has("--show-p2p")).c_str());
  if (!sim.ok) {
    for (auto& p : sim.problems) std::fprintf(stderr, "plan: %s\n", p.c_str());
    throw Error("the schedule does not replay cleanly (see above)",
                "this is a bug in megatron.cpp's schedule builder; please report it");
  }
  std::printf("\nreplay: forward %g, backward %g per even stage of layers, p2p %g\n", cost.forward,
              cost.backward, cost.p2p);
  double ideal = 0;  // the busiest rank's compute: the step time without a bubble
  for (auto& st : sim.stages) ideal = std::max(ideal, st.busy);
  std::printf("step time %.4g (busiest rank's compute %.4g), bubble %.2f%%", sim.makespan, ideal,
              100.0 * sim.bubble_fraction);
  if (uniform && cost.p2p == 0) {
    const double v = kind == pl::ScheduleKind::Interleaved1F1B ? vpp : 1;
    std::printf(" (theory (p-1)/(%sm+p-1) = %.2f%%)", v > 1 ? "v*" : "",
                100.0 * (pp - 1) / (v * m + pp - 1));
  }
  std::printf("\n  rank  busy        idle        idle%%   peak in-flight (promised)\n");
  for (int s = 0; s < pp; ++s) {
    const auto& st = sim.stages[s];
    std::printf("  %-5d %-11.4g %-11.4g %-7.2f %d (%d)\n", s, st.busy, st.idle,
                100.0 * st.idle / sim.makespan, st.peak_in_flight,
                pl::promised_in_flight(kind, pp, s, vpp, m, g));
  }
  if (with_model) {
    MCPP_CHECK_HINT(kind != pl::ScheduleKind::AllForwardAllBackward || vpp == 1,
                    "drop --schedule gpipe", "GPipe runs one model chunk per rank");
    if (kind == pl::ScheduleKind::AllForwardAllBackward) {
      train_args.push_back("--pipeline-schedule");
      train_args.push_back("gpipe");
    }
    print_memory(train_args, tp * pp * cp * dp, pp, device_gib);
  }
  return 0;
}

Registrar register_plan{"plan", run_plan};

}  // namespace
}  // namespace mcpp::tools
