// Shared helpers for tests/training.
#pragma once
#include <gtest/gtest.h>

#include <functional>
#include <initializer_list>
#include <string>
#include <vector>

#include "base/error.h"
#include "training/arguments.h"

namespace mcpp::training::test {

// A small, valid training command line (NullTokenizer + mock data).
inline std::vector<std::string> base_argv() {
  return {"--num-layers",
          "2",
          "--hidden-size",
          "64",
          "--num-attention-heads",
          "4",
          "--seq-length",
          "32",
          "--max-position-embeddings",
          "32",
          "--micro-batch-size",
          "2",
          "--lr",
          "1e-3",
          "--train-iters",
          "10",
          "--mock-data",
          "--tokenizer-type",
          "NullTokenizer",
          "--vocab-size",
          "100"};
}

inline std::vector<std::string> with(std::vector<std::string> v,
                                     std::initializer_list<std::string> more) {
  v.insert(v.end(), more.begin(), more.end());
  return v;
}

// Removes a flag and its value(s) up to the next flag.
inline std::vector<std::string> without(std::vector<std::string> v, const std::string& flag) {
  std::vector<std::string> out;
  for (size_t i = 0; i < v.size(); ++i) {
    if (v[i] == flag) {
      while (i + 1 < v.size() && v[i + 1].rfind("--", 0) != 0) ++i;
      continue;
    }
    out.push_back(v[i]);
  }
  return out;
}

inline Args parse_and_validate(const std::vector<std::string>& argv, int world = 1) {
  Args a = parse_args(argv);
  validate_args(a, world);
  return a;
}

// Runs f, expects an mcpp::Error whose what() contains every needle.
inline void expect_error(const std::function<void()>& f,
                         std::initializer_list<std::string> needles) {
  try {
    f();
    ADD_FAILURE() << "expected an mcpp::Error containing '" << *needles.begin() << "'";
  } catch (const Error& e) {
    const std::string w = e.what();
    for (const auto& n : needles)
      EXPECT_NE(w.find(n), std::string::npos) << "missing '" << n << "' in:\n" << w;
    EXPECT_FALSE(e.hint().empty()) << "error without a HINT:\n" << w;
  }
}

}  // namespace mcpp::training::test
