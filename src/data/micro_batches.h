// Micro-batch assembly, as Megatron's pretraining sampler (MegatronPretrainingSampler) and
// get_batch: the global batch of an iteration is samples [consumed, consumed + GBS) of a
// dataset (modulo its size), cut into chunks of MBS x DP samples, one per micro-batch;
// DP rank r takes the r-th MBS samples of each chunk. So changing DP (or the number of
// micro-batches) never changes what is learned (ARCHITECTURE.md, data order).
#pragma once
#include <cstdint>
#include <span>
#include <vector>

#include "data/gpt_dataset.h"
#include "model/gpt_model.h"

namespace mcpp::data {

struct BatchShape {
  int64_t micro_batch_size = 1;  // --micro-batch-size
  int64_t seq_length = 0;        // --seq-length
  int64_t num_microbatches = 1;  // GBS / (MBS x DP)
  int64_t dp_size = 1, dp_rank = 0;
  int64_t cp_size = 1, cp_rank = 0;  // context parallelism: this rank's two chunks (cp_split.h)
  bool reset_position_ids = false, reset_attention_mask = false;  // MicroBatch's optional fields
  // --mtp-num-layers: under context parallelism each micro-batch carries the depths' rolled
  // batches and the whole sequence's token counts (MicroBatch::mtp).
  int64_t mtp_depths = 0;
};

// This rank's micro-batches of one global batch.
struct LocalBatch {
  std::vector<model::MicroBatch> micro_batches;  // tokens, labels [MBS, S/CP] i64; loss_mask f32
  std::vector<int64_t> sample_offsets;           // each one's first sample in the global batch
  double loss_tokens = 0;                        // sum of this rank's loss masks
};

// The micro-batch j of this rank at consumed-sample offset `consumed`, its first sample's
// offset in the global batch in `sample_offset`. `scratch` is reused between calls.
model::MicroBatch load_micro_batch(const GPTSampleSource& ds, const BatchShape& b, int64_t consumed,
                                   int64_t j, int64_t& sample_offset, GPTSample& scratch);
// A micro-batch of the given samples (b.micro_batch_size is not read): the full-validation
// sampler's one-sample micro-batches.
model::MicroBatch load_samples(const GPTSampleSource& ds, const BatchShape& b,
                               std::span<const int64_t> samples, GPTSample& scratch);
// All num_microbatches of them.
LocalBatch load_local_batch(const GPTSampleSource& ds, const BatchShape& b, int64_t consumed,
                            GPTSample& scratch);

}  // namespace mcpp::data
