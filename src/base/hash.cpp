#include "base/hash.h"

#ifdef MCPP_HAVE_XXHASH
#include <xxhash.h>
#endif

namespace mcpp {

const char* hash64_algorithm() {
#ifdef MCPP_HAVE_XXHASH
  return "xxh3-64";
#else
  return "fnv1a-64";
#endif
}

uint64_t hash64(const void* data, size_t n) {
#ifdef MCPP_HAVE_XXHASH
  return XXH3_64bits(data, n);
#else
  uint64_t h = 0xcbf29ce484222325ull;
  const auto* c = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < n; ++i) h = (h ^ c[i]) * 0x100000001b3ull;
  return h;
#endif
}

}  // namespace mcpp
