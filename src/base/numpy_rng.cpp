#include "base/numpy_rng.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "base/error.h"

namespace mcpp {

// ---- MT19937 (Matsumoto & Nishimura 1998), as NumPy's randomkit seeds it --------

NumpyRandomState::NumpyRandomState(uint32_t seed) {
  // init_genrand: NumPy's mt19937_seed for an integer seed.
  mt_[0] = seed;
  for (uint32_t i = 1; i < 624; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + i;
  pos_ = 624;
}

NumpyRandomState::NumpyRandomState(std::span<const uint32_t> key) : NumpyRandomState(19650218u) {
  MCPP_CHECK(!key.empty(), "RandomState: an empty seed array");
  // mt19937_init_by_array (Matsumoto & Nishimura's 2002 initialisation).
  const int n = 624, len = int(key.size());
  int i = 1, j = 0;
  for (int k = std::max(n, len); k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + uint32_t(j);
    if (++i >= n) mt_[0] = mt_[n - 1], i = 1;
    if (++j >= len) j = 0;
  }
  for (int k = n - 1; k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - uint32_t(i);
    if (++i >= n) mt_[0] = mt_[n - 1], i = 1;
  }
  mt_[0] = 0x80000000u;
  pos_ = 624;
}

double NumpyRandomState::random_sample() {
  const uint32_t a = next_u32() >> 5, b = next_u32() >> 6;
  return (a * 67108864.0 + b) / 9007199254740992.0;
}

int64_t NumpyRandomState::binomial(int64_t n, double p) {
  MCPP_CHECK(n >= 0 && p >= 0 && p <= 1, "binomial({}, {}): n < 0 or p outside [0, 1]", n, p);
  // legacy_random_binomial: p above one half draws the complement. Unlike Generator's
  // binomial, p == 0 and n == 0 still consume a draw.
  const bool flip = p > 0.5;
  const double pp = flip ? 1.0 - p : p;
  MCPP_CHECK(pp * double(n) <= 30.0, "binomial({}, {}): numpy's BTPE branch is not implemented",
             n, p);
  // random_binomial_inversion
  const double q = 1.0 - pp, qn = std::exp(double(n) * std::log(q)), np = double(n) * pp;
  const int64_t bound = std::min(n, int64_t(np + 10.0 * std::sqrt(np * q + 1)));
  int64_t x = 0;
  double px = qn, u = random_sample();
  while (u > px) {
    if (++x > bound) {
      x = 0, px = qn, u = random_sample();
    } else {
      u -= px;
      px = (double(n - x + 1) * pp * px) / (double(x) * q);
    }
  }
  return flip ? n - x : x;
}

void NumpyRandomState::reload() {
  constexpr uint32_t kUpper = 0x80000000u, kLower = 0x7fffffffu, kMatrixA = 0x9908b0dfu;
  for (int i = 0; i < 624; ++i) {
    uint32_t y = (mt_[i] & kUpper) | (mt_[(i + 1) % 624] & kLower);
    mt_[i] = mt_[(i + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? kMatrixA : 0u);
  }
  pos_ = 0;
}

uint32_t NumpyRandomState::next_u32() {
  if (pos_ >= 624) reload();
  uint32_t y = mt_[pos_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

uint64_t NumpyRandomState::random_interval(uint64_t max) {
  if (max == 0) return 0;
  uint64_t mask = max;
  mask |= mask >> 1, mask |= mask >> 2, mask |= mask >> 4;
  mask |= mask >> 8, mask |= mask >> 16, mask |= mask >> 32;
  uint64_t value;
  if (max <= 0xffffffffull) {
    while ((value = (next_u32() & mask)) > max) {
    }
  } else {
    while ((value = (next_u64() & mask)) > max) {
    }
  }
  return value;
}

// ---- SeedSequence + PCG64 ---------------------------------------------------------

namespace {

constexpr uint32_t kInitA = 0x43b0d7e5u, kMultA = 0x931e8875u;
constexpr uint32_t kInitB = 0x8b51f9ddu, kMultB = 0x58f38dedu;
constexpr uint32_t kMixMultL = 0xca01f9ddu, kMixMultR = 0x4973f715u;
constexpr int kPoolSize = 4;

uint32_t hashmix(uint32_t value, uint32_t& hash_const) {
  value ^= hash_const;
  hash_const *= kMultA;
  value *= hash_const;
  value ^= value >> 16;
  return value;
}

uint32_t mix(uint32_t x, uint32_t y) {
  uint32_t r = kMixMultL * x - kMixMultR * y;
  return r ^ (r >> 16);
}

// SeedSequence(entropy).generate_state(4, uint64) for an integer entropy.
std::array<uint64_t, 4> seed_sequence_state(uint64_t entropy) {
  std::vector<uint32_t> ent;
  if (entropy == 0) ent.push_back(0);
  for (uint64_t n = entropy; n > 0; n >>= 32) ent.push_back(uint32_t(n));
  std::array<uint32_t, kPoolSize> pool{};
  uint32_t hc = kInitA;
  for (int i = 0; i < kPoolSize; ++i) pool[i] = hashmix(i < int(ent.size()) ? ent[i] : 0u, hc);
  for (int s = 0; s < kPoolSize; ++s)
    for (int d = 0; d < kPoolSize; ++d)
      if (s != d) pool[d] = mix(pool[d], hashmix(pool[s], hc));
  for (size_t s = kPoolSize; s < ent.size(); ++s)
    for (int d = 0; d < kPoolSize; ++d) pool[d] = mix(pool[d], hashmix(ent[s], hc));
  uint32_t words[8];
  uint32_t hb = kInitB;
  for (int i = 0; i < 8; ++i) {
    uint32_t v = pool[i % kPoolSize];
    v ^= hb;
    hb *= kMultB;
    v *= hb;
    v ^= v >> 16;
    words[i] = v;
  }
  std::array<uint64_t, 4> out;
  for (int i = 0; i < 4; ++i) out[i] = uint64_t(words[2 * i]) | (uint64_t(words[2 * i + 1]) << 32);
  return out;
}

constexpr unsigned __int128 kPcgMult =
    (unsigned __int128)(2549297995355413924ull) << 64 | 4865540595714422341ull;

}  // namespace

NumpyGenerator::NumpyGenerator(uint64_t seed) {
  auto v = seed_sequence_state(seed);
  unsigned __int128 initstate = (unsigned __int128)v[0] << 64 | v[1];
  unsigned __int128 initseq = (unsigned __int128)v[2] << 64 | v[3];
  // pcg_setseq_128_srandom_r
  state_ = 0;
  inc_ = (initseq << 1) | 1u;
  state_ = state_ * kPcgMult + inc_;
  state_ += initstate;
  state_ = state_ * kPcgMult + inc_;
}

uint64_t NumpyGenerator::next_u64() {
  // XSL-RR output of the advanced state (pcg_setseq_128_xsl_rr_64_random_r).
  state_ = state_ * kPcgMult + inc_;
  uint64_t x = uint64_t(state_ >> 64) ^ uint64_t(state_);
  unsigned rot = unsigned(state_ >> 122);
  return (x >> rot) | (x << ((64 - rot) & 63));
}

uint32_t NumpyGenerator::next_u32() {
  if (has_u32_) {
    has_u32_ = false;
    return u32_;
  }
  uint64_t n = next_u64();
  has_u32_ = true;
  u32_ = uint32_t(n >> 32);
  return uint32_t(n);
}

int32_t NumpyGenerator::integers_i32(int32_t low, int32_t high) {
  MCPP_CHECK(high > low, "integers: high ({}) must exceed low ({})", high, low);
  uint32_t rng = uint32_t(int64_t(high) - 1 - low);
  if (rng == 0) return low;
  if (rng == 0xffffffffu) return int32_t(uint32_t(low) + next_u32());
  // Lemire's nearly-divisionless bounded draw (buffered_bounded_lemire_uint32).
  const uint32_t rng_excl = rng + 1;
  uint64_t m = uint64_t(next_u32()) * rng_excl;
  uint32_t leftover = uint32_t(m);
  if (leftover < rng_excl) {
    const uint32_t threshold = (0xffffffffu - rng) % rng_excl;
    while (leftover < threshold) {
      m = uint64_t(next_u32()) * rng_excl;
      leftover = uint32_t(m);
    }
  }
  return int32_t(uint32_t(low) + uint32_t(m >> 32));
}

}  // namespace mcpp
