#include "data/cp_split.h"

#include <cstring>

#include "base/error.h"

namespace mcpp::data {
namespace {

Tensor split_rows(const Tensor& t, int64_t cp, int64_t r) {
  const int64_t B = t.size(0), S = t.size(1), C = S / (2 * cp);
  Tensor out = Tensor::empty({B, 2 * C}, t.dtype());
  const size_t es = dtype_size(t.dtype()), n = size_t(C) * es;
  const auto* src = static_cast<const char*>(t.raw());
  auto* dst = static_cast<char*>(out.raw());
  for (int64_t b = 0; b < B; ++b) {
    std::memcpy(dst + size_t(b * 2 * C) * es, src + size_t(b * S + r * C) * es, n);
    std::memcpy(dst + size_t(b * 2 * C + C) * es, src + size_t(b * S + (2 * cp - 1 - r) * C) * es,
                n);
  }
  return out;
}

}  // namespace

model::MicroBatch split_for_context_parallel(const model::MicroBatch& mb, int64_t cp_size,
                                             int64_t cp_rank) {
  if (cp_size == 1) return mb;
  MCPP_CHECK(cp_rank >= 0 && cp_rank < cp_size, "context-parallel rank {} outside [0, {})",
             cp_rank, cp_size);
  for (const Tensor* t : {&mb.tokens, &mb.labels, &mb.loss_mask})
    MCPP_CHECK_HINT(t->dim() == 2 && t->size(1) % (2 * cp_size) == 0 &&
                        t->device() == Device::CPU,
                    "choose --seq-length as a multiple of 2 x --context-parallel-size",
                    "context-parallel split: {} is not [B, S] on the CPU with S divisible by "
                    "2 x {}",
                    t->str(), cp_size);
  model::MicroBatch out;
  out.tokens = split_rows(mb.tokens, cp_size, cp_rank);
  out.labels = split_rows(mb.labels, cp_size, cp_rank);
  out.loss_mask = split_rows(mb.loss_mask, cp_size, cp_rank);
  // Document masking: positions and document starts are global values, cut alike.
  if (mb.position_ids.defined()) out.position_ids = split_rows(mb.position_ids, cp_size, cp_rank);
  if (mb.key_start.defined()) out.key_start = split_rows(mb.key_start, cp_size, cp_rank);
  return out;
}

}  // namespace mcpp::data
