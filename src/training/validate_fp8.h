// The FP8 flags (--fp8-format, --fp8-recipe, --fp8-amax-*, --fp8-margin, --no-fp8-wgrad,
// --first-last-layers-bf16, --num-layers-at-{start,end}-in-bf16, --fp8-param-gather): their
// checks, the model's Fp8Config, and the start-up check of the device. docs/fp8.md.
#pragma once
#include "model/fp8/fp8_config.h"
#include "tensor/tensor.h"
#include "training/arguments.h"

namespace mcpp::training {

// Called by validate_args: every combination the FP8 flags allow, with a HINT otherwise.
void validate_fp8(const Args& a);
// The model's FP8 settings (format None when --fp8-format is not given).
model::Fp8Config fp8_config(const Args& a);
// Start-up: FP8 on `dev` is possible (the CPU emulates it; a GPU needs FP8 tensor cores,
// compute capability 8.9 or newer, and --bf16).
void check_fp8_device(const Args& a, Device dev, bool query_gpu = true);

}  // namespace mcpp::training
