// Element types and their conversions. bf16/f16/fp8 are stored as raw bits;
// conversions from float round to nearest even and keep NaN, Inf and subnormals.
#pragma once
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace mcpp {

enum class DType : uint8_t { F32, F64, BF16, F16, FP8E4M3, FP8E5M2, I32, I64, U8, U16 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);        // "f32", "bf16", ...
DType dtype_from_name(std::string_view name);  // throws mcpp::Error on an unknown name
bool dtype_is_float(DType t);

template <typename T> constexpr DType dtype_of();
template <> constexpr DType dtype_of<float>() { return DType::F32; }
template <> constexpr DType dtype_of<double>() { return DType::F64; }
template <> constexpr DType dtype_of<int32_t>() { return DType::I32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::I64; }
template <> constexpr DType dtype_of<uint8_t>() { return DType::U8; }
template <> constexpr DType dtype_of<uint16_t>() { return DType::U16; }

inline uint32_t float_bits(float f) { uint32_t u; std::memcpy(&u, &f, 4); return u; }
inline float bits_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

// bfloat16: the top 16 bits of an IEEE float, rounded to nearest even.
inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x0040u);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
inline float bf16_to_float(uint16_t h) { return bits_float(uint32_t(h) << 16); }

// IEEE binary16.
uint16_t float_to_f16(float f);
float f16_to_float(uint16_t h);

}  // namespace mcpp
