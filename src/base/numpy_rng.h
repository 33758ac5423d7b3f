// Bit-exact re-implementations of the two NumPy random generators that Megatron's
// data pipeline depends on:
//
//  * NumpyRandomState: numpy.random.RandomState(seed) — MT19937 seeded with
//    init_genrand(seed), and the legacy RandomState.shuffle of a 1-D array
//    (Fisher-Yates from the last element down, each draw a masked-rejection
//    `random_interval`). GPTDataset builds its document and shuffle indices with it.
//    Also RandomState(list of uint32) (init_by_array), random_sample() and the legacy
//    binomial (inversion algorithm only), which the fill-in-the-middle transform draws.
//  * NumpyGenerator: numpy.random.default_rng(seed) — PCG64 (XSL-RR 128/64) seeded
//    through SeedSequence(seed), with Generator.integers for int32 (Lemire's
//    bounded draws on 32-bit outputs). MockGPTLowLevelDataset draws its sequence
//    lengths with it.
//
// Both are checked against fixtures written by tests/golden/make_numpy_rng_fixtures.py.
#pragma once
#include <array>
#include <cstdint>
#include <span>
#include <utility>

namespace mcpp {

class NumpyRandomState {
 public:
  explicit NumpyRandomState(uint32_t seed);
  // RandomState([k0, k1, ...]): MT19937's init_by_array over the key words.
  explicit NumpyRandomState(std::span<const uint32_t> key);

  uint32_t next_u32();
  // NumPy's legacy 64-bit draw: two 32-bit outputs, the first in the high half.
  uint64_t next_u64() {
    uint64_t hi = next_u32();
    return (hi << 32) | next_u32();
  }
  // Uniform integer in [0, max] by masked rejection (numpy `random_interval`); also each
  // value of RandomState.randint(0, max + 1, size=k) (its masked bounded draws).
  uint64_t random_interval(uint64_t max);

  // RandomState.random_sample(): 53 random bits from two 32-bit outputs, in [0, 1).
  double random_sample();
  // RandomState.binomial(n, p) where n * min(p, 1 - p) <= 30 (numpy's inversion algorithm;
  // its BTPE branch for larger means is not implemented and is an error). Every call draws,
  // p == 0 and n == 0 included, as RandomState's does.
  int64_t binomial(int64_t n, double p);
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
