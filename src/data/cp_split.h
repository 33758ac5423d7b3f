// The context-parallel split of a micro-batch (Megatron's get_batch_on_this_cp_rank): the
// sequence in 2*CP equal chunks, CP rank r keeping chunks r and 2CP-1-r, in that order.
// The pairing balances causal attention (an early chunk sees few keys, a late one many).
// Tokens, labels and the loss mask are cut alike, and the document-masking fields when
// present; positions otherwise follow from the chunk ids (model::Dims::cp_chunk_start).
#pragma once
#include <cstdint>

#include "model/module.h"

namespace mcpp::data {

// tokens, labels, loss_mask (position_ids, key_start) [B, S] -> [B, S/CP]. cp_size 1: `mb`.
model::MicroBatch split_for_context_parallel(const model::MicroBatch& mb, int64_t cp_size,
                                             int64_t cp_rank);

}  // namespace mcpp::data
