#include "inference/kv_cache.h"

#include "base/error.h"
#include "ops/ops.h"

namespace mcpp::inference {

KVCache::KVCache(const model::TransformerConfig& cfg, int64_t max_seq, int64_t batch, Device device)
    : max_seq_(max_seq), batch_(batch), lengths_(size_t(std::max<int64_t>(batch, 0)), 0) {
  MCPP_CHECK(max_seq > 0 && batch > 0, "KVCache: max_seq={} and batch={} must be positive", max_seq,
             batch);
  const Shape shape{batch, max_seq, cfg.local_groups(), cfg.kv_channels};
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    k_.push_back(Tensor::empty(shape, cfg.dtype, device));
    v_.push_back(Tensor::empty(shape, cfg.dtype, device));
  }
}

int64_t KVCache::length() const {
  for (int64_t len : lengths_)
    MCPP_CHECK(len == lengths_[0], "KVCache: the sequences hold different lengths ({} and {})",
               lengths_[0], len);
  return lengths_[0];
}

void KVCache::advance(int64_t first, int64_t count, int64_t n) {
  MCPP_CHECK(first >= 0 && count >= 0 && first + count <= batch_,
             "KVCache: slots [{}, {}) outside a batch of {}", first, first + count, batch_);
  for (int64_t b = first; b < first + count; ++b) {
    int64_t& len = lengths_[size_t(b)];
    MCPP_CHECK(n >= 0 && len + n <= max_seq_, "KVCache: slot {}: {} + {} positions exceed {}", b,
               len, n, max_seq_);
    len += n;
  }
}

void KVCache::move_slot(int64_t from, int64_t to) {
  MCPP_CHECK(from >= 0 && from < batch_ && to >= 0 && to < batch_,
             "KVCache::move_slot({}, {}) outside a batch of {}", from, to, batch_);
  if (from == to) return;
  const int64_t len = lengths_[size_t(from)];
  if (len > 0) {
    for (auto* vec : {&k_, &v_})
      for (Tensor& t : *vec) {
        // A slot's rows [0, len) are one contiguous block.
        const int64_t row = t.numel() / (batch_ * max_seq_);
        Tensor flat = t.view({batch_ * max_seq_, row});
        Tensor dst = flat.narrow(to * max_seq_, len);
        ops::copy(flat.narrow(from * max_seq_, len), dst, ops::default_stream(t.device()));
      }
  }
  lengths_[size_t(to)] = len;
  lengths_[size_t(from)] = 0;
}

void KVCache::reset_slot(int64_t slot) {
  MCPP_CHECK(slot >= 0 && slot < batch_, "KVCache::reset_slot({}) outside a batch of {}", slot,
             batch_);
  lengths_[size_t(slot)] = 0;
}

void KVCache::reset() { std::fill(lengths_.begin(), lengths_.end(), 0); }

size_t KVCache::bytes() const {
  size_t b = 0;
  for (size_t i = 0; i < k_.size(); ++i) b += k_[i].nbytes() + v_[i].nbytes();
  return b;
}

}  // namespace mcpp::inference
