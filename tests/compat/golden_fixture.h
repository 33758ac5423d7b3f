// The Megatron-LM files under tests/golden/megatron/ that the compat tests read.
#pragma once
#include <string>

namespace mcpp::compat_fixture {

inline std::string fixture(const std::string& name) {
  return std::string(MCPP_SOURCE_DIR) + "/tests/golden/megatron/" + name;
}

}  // namespace mcpp::compat_fixture
