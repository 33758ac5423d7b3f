// NullTokenizer ids are int32 and its EOD id is --vocab-size itself (issue 23 B.3): a size at
// or above 2^31 - 1 wrapped the ids silently; it is an error naming the flag.
#include <gtest/gtest.h>

#include <climits>

#include "base/error.h"
#include "data/tokenizers/tokenizer.h"

namespace null_tokenizer_limits_test {

using namespace mcpp;

TEST(NullTokenizerLimits, VocabularyBeyondInt32IsAnError) {
  for (int64_t v : {int64_t(INT32_MAX), int64_t(3000000000), int64_t(1) << 40}) {
    try {
      data::NullTokenizer t(v);
      FAIL() << v;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("--vocab-size"), std::string::npos) << e.what();
    }
  }
  data::NullTokenizer t(INT32_MAX - 1);
  EXPECT_EQ(t.eod(), INT32_MAX - 1);
  std::vector<int32_t> ids;
  t.encode("5 7", ids);
  EXPECT_EQ(ids, (std::vector<int32_t>{5, 7}));
}

}  // namespace null_tokenizer_limits_test
