// --optimizer muon / adaptive_muon from the command line: the Muon settings (optim/muon.h)
// and groups an optimizer needs, and the start-up line naming what Muon steps.
#pragma once
#include "model/params.h"
#include "model/config.h"
#include "optim/optimizer.h"
#include "parallel/parallel_state.h"
#include "training/arguments.h"

namespace mcpp::training {

// Enables Muon (adaptive with --optimizer adaptive_muon) on o with the --muon-* flags, the
// TP / expert-TP groups of ps, and logs which matrices of P it steps.
void enable_muon_from_args(optim::Optimizer& o, const Args& a, const model::TransformerConfig& m,
                           const parallel::ParallelState& ps, const model::ParamStore& P);

}  // namespace mcpp::training
