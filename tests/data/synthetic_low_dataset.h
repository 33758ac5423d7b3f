// The data tests' stand-in for a .bin/.idx pair: a LowLevelDataset of the given sequence
// lengths whose token k of sequence s is 1000 s + k, so a sample's tokens tell where they
// came from.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "data/gpt_dataset.h"

namespace mcpp::data::synthetic {

class Low : public LowLevelDataset {
 public:
  explicit Low(std::vector<int32_t> l) : l_(std::move(l)) {}
  int64_t num_sequences() const override { return int64_t(l_.size()); }
  int32_t sequence_length(int64_t s) const override { return l_[s]; }
  int64_t read(int64_t s, int64_t off, int64_t len, int64_t* out) const override {
    if (len < 0) len = l_[s] - off;
    for (int64_t k = 0; k < len; ++k) out[k] = 1000 * s + off + k;
    return len;
  }
  std::string path() const override { return "low"; }

 private:
  std::vector<int32_t> l_;
};

}  // namespace mcpp::data::synthetic
