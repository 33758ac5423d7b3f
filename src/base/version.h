// megatron.cpp's version, recorded in checkpoints and printed by the tools.
#pragma once

namespace mcpp {

inline constexpr const char* kVersion = "0.1.0-dev";

}  // namespace mcpp
