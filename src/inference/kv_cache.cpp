#include "inference/kv_cache.h"

#include "base/error.h"

namespace mcpp::inference {

KVCache::KVCache(const model::TransformerConfig& cfg, int64_t max_seq, int64_t batch, Device device)
    : max_seq_(max_seq), batch_(batch) {
  MCPP_CHECK(max_seq > 0 && batch > 0, "KVCache: max_seq={} and batch={} must be positive", max_seq,
             batch);
  const Shape shape{max_seq, batch, cfg.local_groups(), cfg.kv_channels};
  for (int64_t l = 0; l < cfg.num_layers; ++l) {
    k_.push_back(Tensor::empty(shape, cfg.dtype, device));
    v_.push_back(Tensor::empty(shape, cfg.dtype, device));
  }
}

void KVCache::advance(int64_t n) {
  MCPP_CHECK(n >= 0 && length_ + n <= max_seq_, "KVCache: {} + {} positions exceed {}", length_, n,
             max_seq_);
  length_ += n;
}

size_t KVCache::bytes() const {
  size_t b = 0;
  for (size_t i = 0; i < k_.size(); ++i) b += k_[i].nbytes() + v_[i].nbytes();
  return b;
}

}  // namespace mcpp::inference
