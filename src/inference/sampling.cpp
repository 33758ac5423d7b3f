// Sampling; see sampling.h. Probabilities are formed in double from the f32 logits.
#include "inference/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "base/error.h"
#include "base/philox.h"

namespace mcpp::inference {

void validate(const SamplingParams& p) {
  if (p.greedy) return;
  MCPP_CHECK_HINT(p.temperature > 0 && p.temperature <= 100,
                  "use 0 < --temperature <= 100, or --greedy for argmax decoding",
                  "--temperature {} is out of range (0, 100]", p.temperature);
  MCPP_CHECK_HINT(p.top_k >= 0 && p.top_k <= 1000, "use 0 (off) <= --top-k <= 1000",
                  "--top-k {} is out of range [0, 1000]", p.top_k);
  MCPP_CHECK_HINT(p.top_p >= 0 && p.top_p <= 1, "use 0 (off) <= --top-p <= 1",
                  "--top-p {} is out of range [0, 1]", p.top_p);
  MCPP_CHECK_HINT(!(p.top_k > 0 && p.top_p > 0), "give either --top-k or --top-p",
                  "--top-k {} and --top-p {} cannot be used together (as in Megatron)", p.top_k,
                  p.top_p);
}

int64_t argmax(std::span<const float> logits, int64_t vocab_size) {
  MCPP_CHECK(vocab_size > 0 && vocab_size <= int64_t(logits.size()),
             "argmax: vocab_size {} outside (0, {}]", vocab_size, logits.size());
  int64_t best = 0;
  for (int64_t i = 1; i < vocab_size; ++i)
    if (logits[size_t(i)] > logits[size_t(best)]) best = i;
  return best;
}

int64_t sample(std::span<const float> logits, int64_t vocab_size, const SamplingParams& p,
               uint64_t seq, uint64_t step) {
  if (p.is_greedy()) return argmax(logits, vocab_size);
  const int64_t V = vocab_size;
  MCPP_CHECK(V > 0 && V <= int64_t(logits.size()), "sample: vocab_size {} outside (0, {}]", V,
             logits.size());
  // Unnormalised probabilities of every id at the temperature.
  const double mx = *std::max_element(logits.begin(), logits.begin() + V);
  const double inv_t = 1.0 / p.temperature;
  std::vector<double> e(static_cast<size_t>(V));
  double total = 0;
  for (int64_t v = 0; v < V; ++v)
    total += e[size_t(v)] = std::exp((double(logits[size_t(v)]) - mx) * inv_t);
  // Candidates: every id in id order for plain sampling, the k best for top-k, the nucleus
  // for top-p, most likely first. Ties keep the lower id first, so the order, and the
  // sample, are deterministic.
  std::vector<int32_t> idx(static_cast<size_t>(V));
  std::iota(idx.begin(), idx.end(), 0);
  auto by_logit = [&](int32_t a, int32_t b) {
    return logits[size_t(a)] > logits[size_t(b)] ||
           (logits[size_t(a)] == logits[size_t(b)] && a < b);
  };
  int64_t n = V;
  double sum = total;
  if (p.top_k > 0 && p.top_k < V) {
    n = p.top_k;
    std::partial_sort(idx.begin(), idx.begin() + n, idx.end(), by_logit);
    sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += e[size_t(idx[size_t(i)])];
  } else if (p.top_p > 0) {
    // Smallest prefix of the descending order whose probability reaches top_p (the most
    // likely token always stays). Sort only as far as needed: the m best, m growing 4x.
    for (int64_t m = std::min<int64_t>(V, 256), sorted = 0;; m = std::min(V, 4 * m)) {
      std::partial_sort(idx.begin() + sorted, idx.begin() + m, idx.end(), by_logit);
      sorted = m;
      double cum = 0;
      int64_t keep = 0;
      while (keep < m && (keep == 0 || cum < p.top_p * total))
        cum += e[size_t(idx[size_t(keep++)])];
      if (cum >= p.top_p * total || m == V) {
        n = keep, sum = cum;
        break;
      }
    }
  }
  // Inverse CDF with a 53-bit uniform from two Philox lanes.
  const uint64_t hi = Philox::u32(p.seed, seq, 2 * step),
                 lo = Philox::u32(p.seed, seq, 2 * step + 1);
  const double u = double((hi << 21) ^ (lo >> 11)) * (1.0 / 9007199254740992.0) * sum;
  double cum = 0;
  for (int64_t i = 0; i < n; ++i) {
    cum += e[size_t(idx[size_t(i)])];
    if (u < cum) return idx[size_t(i)];
  }
  return idx[size_t(n - 1)];
}

}  // namespace mcpp::inference
