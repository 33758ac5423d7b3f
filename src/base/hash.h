// A fast 64-bit hash of bytes: XXH3-64 when built with xxHash (MCPP_HAVE_XXHASH), else
// FNV-1a 64 (slower, same role). Not cryptographic: it tells copies apart that should be
// equal (checkpoint shard checksums, the weight-hash check across data-parallel replicas).
#pragma once
#include <cstddef>
#include <cstdint>

namespace mcpp {

const char* hash64_algorithm();  // "xxh3-64" or "fnv1a-64"
uint64_t hash64(const void* data, size_t n);

}  // namespace mcpp
