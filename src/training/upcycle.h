// --moe-use-upcycling: a dense checkpoint (--load) converted into the MoE model's first
// checkpoint (--save, iteration 1) as Megatron-LM's upcycling does (upcycle.cpp).
#pragma once
#include "comm/communicator.h"
#include "model/config.h"
#include "training/arguments.h"

namespace mcpp::training {

// Collective over `world`: rank 0 reads the dense checkpoint in --load, builds the whole
// MoE model of rank_cfg's architecture (every layer and expert, on the host) from it and
// saves it in --save as iteration 1; an error on rank 0 is raised on every rank. The
// caller then loads --save (without optimizer or RNG state).
void upcycle_dense_checkpoint(const Args& a, const model::TransformerConfig& rank_cfg,
                              comm::Communicator& world);

}  // namespace mcpp::training
