// Megatron's --pipeline-model-parallel-layout (megatron/core/transformer/
// pipeline_parallel_layer_layout.py): the layers of every pipeline stage spelled out.
//
//   "Et*3|(tt|)*2,tmL"   stages "Ettt" "tt" "tt" "tmL"
//
// Symbols: E the embedding, t a transformer (decoder) layer, m a multi-token prediction
// layer, L the loss (output layer); `|` ends a stage; `x*N` repeats the symbol before it
// (`|*2` is two boundaries), `(...)*N` a group (groups may nest here; Megatron's regex
// expansion does not nest); commas are cosmetic and removed first, as Megatron does.
//
// Mapping: stage i of the flattened list runs on pipeline rank i % PP as its model chunk
// i / PP, so a layout of PP x V stages sets V virtual stages per rank (Megatron's
// PipelineParallelLayerLayout.__init__), and the decoder layers are numbered in stage
// order (get_layer_offset sums the earlier stages' t).
//
// Placement (megatron.cpp): the embedding lives on rank 0's chunk 0, the output layer and
// the MTP layers on the last rank's last chunk, so E must open stage 0 and the last stage
// must end with the m's and L; Megatron's other placements (a standalone MTP stage) are
// refused as not implemented. A stage may hold no t at all ("E|tt|tL"): its chunk passes
// the activation through (or holds only the embedding / the head).
#pragma once
#include <optional>
#include <string>
#include <vector>

namespace mcpp::parallel::pipeline {

// The stages of a layout string, expanded ("(t|)*2L" -> "t" "t" "L"); syntax errors only.
std::vector<std::string> expand_layout(const std::string& text);

struct LayerLayout {
  int pp = 1, vpp = 1;
  std::vector<std::string> stages;       // expanded, flattened: stage i = rank i % pp, chunk i / pp
  std::vector<std::vector<int>> layers;  // decoder layer ids of [rank * vpp + chunk]
  const std::string& stage(int rank, int chunk) const {
    return stages[size_t(chunk) * size_t(pp) + size_t(rank)];
  }
};

// The layout checked against the model (Megatron's validate_layer_layout, plus the
// placements megatron.cpp implements); errors name --pipeline-model-parallel-layout.
LayerLayout parse_layout(const std::string& text, int pp, int num_layers, int mtp_num_layers);

// One line per pipeline rank, one column per chunk: "rank 0: E t0-t2 | t6" (for `megatron
// plan` and the start-up log; Megatron's pretty_repr names the types, here the layer ids).
std::vector<std::string> describe_layout(const LayerLayout& l);

// How a run cuts its decoder layers over (rank, chunk): the layout when given, else
// assign_layers (schedule.h) with the uneven first/last stage counts.
struct LayerSplit {
  std::optional<int> first, last;     // --decoder-first/last-pipeline-num-layers
  std::optional<std::string> layout;  // --pipeline-model-parallel-layout
  int mtp_num_layers = 0;             // the layout's m count must match it
};
// result[rank * vpp + chunk]; with a layout, vpp must be the layout's.
std::vector<std::vector<int>> stage_layers(int num_layers, int pp, int vpp,
                                           const LayerSplit& split);

}  // namespace mcpp::parallel::pipeline
