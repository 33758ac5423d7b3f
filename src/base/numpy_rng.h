// Bit-exact re-implementations of the two NumPy random generators that Megatron's
// data pipeline depends on:
//
//  * NumpyRandomState: numpy.random.RandomState(seed) — MT19937 seeded with
//    init_genrand(seed), and the legacy RandomState.shuffle of a 1-D array
//    (Fisher-Yates from the last element down, each draw a masked-rejection
//    `random_interval`). GPTDataset builds its document and shuffle indices with it.
//  * NumpyGenerator: numpy.random.default_rng(seed) — PCG64 (XSL-RR 128/64) seeded
//    through SeedSequence(seed), with Generator.integers for int32 (Lemire's
//    bounded draws on 32-bit outputs). MockGPTLowLevelDataset draws its sequence
//    lengths with it.
//
// Both are checked against fixtures written by tests/golden/make_numpy_rng_fixtures.py.
#pragma once
#include <array>
#include <cstdint>
#include <utility>

namespace mcpp {

class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed);

  uint32_t next_u32();
  // NumPy's legacy 64-bit draw: two 32-bit outputs, the first in the high half.
  uint64_t next_u64() {
    uint64_t hi = next_u32();
    return (hi << 32) | next_u32();
  }
  // Uniform integer in [0, max] by masked rejection (numpy `random_interval`).
  uint64_t random_interval(uint64_t max);

  // RandomState.shuffle(x) for a 1-D array of n elements.
  template <typename T>
  void shuffle(T* data, int64_t n) {
    for (int64_t i = n - 1; i >= 1; --i) {
      int64_t j = int64_t(random_interval(uint64_t(i)));
      std::swap(data[i], data[j]);
    }
  }

 private:
  void reload();
  std::array<uint32_t, 624> mt_{};
  int pos_ = 624;
};

class NumpyGenerator {
 public:
  // numpy.random.default_rng(seed) for a non-negative integer seed < 2^64.
  explicit NumpyGenerator(uint64_t seed);

  uint64_t next_u64();
  // Generator's 32-bit draw: the low half of a 64-bit output, then its high half.
  uint32_t next_u32();
  // Generator.integers(low, high, dtype=int32) for one value in [low, high).
  int32_t integers_i32(int32_t low, int32_t high);

 private:
  unsigned __int128 state_ = 0, inc_ = 0;
  bool has_u32_ = false;
  uint32_t u32_ = 0;
};

}  // namespace mcpp
