#include "data/micro_batches.h"

#include <algorithm>

#include "base/error.h"
#include "data/cp_split.h"

namespace mcpp::data {

model::MicroBatch load_micro_batch(const GPTSampleSource& ds, const BatchShape& b, int64_t consumed,
                                   int64_t j, int64_t& sample_offset, GPTSample& scratch) {
  const int64_t mbs = b.micro_batch_size;
  sample_offset = j * mbs * b.dp_size + b.dp_rank * mbs;
  std::vector<int64_t> idx(static_cast<size_t>(mbs));
  for (int64_t i = 0; i < mbs; ++i) idx[size_t(i)] = (consumed + sample_offset + i) % ds.size();
  return load_samples(ds, b, idx, scratch);
}

model::MicroBatch load_samples(const GPTSampleSource& ds, const BatchShape& b,
                               std::span<const int64_t> samples, GPTSample& scratch) {
  const int64_t mbs = int64_t(samples.size()), S = b.seq_length;
  model::MicroBatch mb;
  mb.tokens = Tensor::empty({mbs, S}, DType::I64);
  mb.labels = Tensor::empty({mbs, S}, DType::I64);
  mb.loss_mask = Tensor::empty({mbs, S}, DType::F32);
  if (b.reset_position_ids) mb.position_ids = Tensor::empty({mbs, S}, DType::I64);
  if (b.reset_attention_mask) mb.key_start = Tensor::empty({mbs, S}, DType::I64);
  for (int64_t i = 0; i < mbs; ++i) {
    ds.get(samples[size_t(i)], scratch);
    MCPP_CHECK(int64_t(scratch.tokens.size()) == S, "dataset returned {} tokens, expected {}",
               scratch.tokens.size(), S);
    std::copy(scratch.tokens.begin(), scratch.tokens.end(), mb.tokens.data<int64_t>() + i * S);
    std::copy(scratch.labels.begin(), scratch.labels.end(), mb.labels.data<int64_t>() + i * S);
    std::copy(scratch.loss_mask.begin(), scratch.loss_mask.end(),
              mb.loss_mask.data<float>() + i * S);
    if (b.reset_position_ids)
      std::copy(scratch.position_ids.begin(), scratch.position_ids.end(),
                mb.position_ids.data<int64_t>() + i * S);
    if (b.reset_attention_mask) {
      MCPP_CHECK(int64_t(scratch.doc_start.size()) == S,
                 "--reset-attention-mask: the dataset gave no document starts");
      std::copy(scratch.doc_start.begin(), scratch.doc_start.end(),
                mb.key_start.data<int64_t>() + i * S);
    }
  }
  model::MicroBatch out = split_for_context_parallel(mb, b.cp_size, b.cp_rank);
  if (b.mtp_depths > 0 && b.cp_size > 1) {
    // Multi-token prediction: the roll crosses the CP ranks' chunks, so it happens here, on
    // the whole sequence, before the cut; the token counts are the whole sequence's.
    auto tokens = [](const Tensor& mask) {
      double n = 0;
      for (int64_t i = 0; i < mask.numel(); ++i) n += mask.data<float>()[i];
      return n;
    };
    out.mtp_tokens.push_back(tokens(mb.loss_mask));
    for (int64_t k = 1; k <= b.mtp_depths; ++k) {
      const model::MicroBatch r = model::mtp_rolled(mb, k);
      out.mtp_tokens.push_back(tokens(r.loss_mask));
      out.mtp.push_back(split_for_context_parallel(r, b.cp_size, b.cp_rank));
    }
  }
  return out;
}

LocalBatch load_local_batch(const GPTSampleSource& ds, const BatchShape& b, int64_t consumed,
                            GPTSample& scratch) {
  LocalBatch out;
  out.micro_batches.resize(size_t(b.num_microbatches));
  out.sample_offsets.resize(size_t(b.num_microbatches));
  for (int64_t j = 0; j < b.num_microbatches; ++j) {
    out.micro_batches[j] = load_micro_batch(ds, b, consumed, j, out.sample_offsets[j], scratch);
    const float* m = out.micro_batches[j].loss_mask.data<float>();
    for (int64_t i = 0; i < out.micro_batches[j].loss_mask.numel(); ++i) out.loss_tokens += m[i];
  }
  return out;
}

}  // namespace mcpp::data
