#include "tensor/dtype.h"

#include "base/error.h"

namespace mcpp {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64: case DType::I64: return 8;
    case DType::F32: case DType::I32: return 4;
    case DType::BF16: case DType::F16: case DType::U16: return 2;
    case DType::FP8E4M3: case DType::FP8E5M2: case DType::U8: return 1;
  }
  return 0;
}

static constexpr std::string_view kNames[] = {"f32", "f64", "bf16", "f16", "fp8_e4m3",
                                              "fp8_e5m2", "i32", "i64", "u8", "u16"};

std::string_view dtype_name(DType t) { return kNames[int(t)]; }

DType dtype_from_name(std::string_view name) {
  for (int i = 0; i < int(std::size(kNames)); ++i)
    if (kNames[i] == name) return DType(i);
  MCPP_FAIL("unknown dtype '{}'; expected one of f32 f64 bf16 f16 fp8_e4m3 fp8_e5m2 i32 i64 u8 u16",
            name);
}

bool dtype_is_float(DType t) {
  return t == DType::F32 || t == DType::F64 || t == DType::BF16 || t == DType::F16 ||
         t == DType::FP8E4M3 || t == DType::FP8E5M2;
}

uint16_t float_to_f16(float f) {
  uint32_t u = float_bits(f);
  uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00u;   // NaN (quiet)
  if (a >= 0x477ff000u) return sign | 0x7c00u;  // rounds to >= 65520: Inf
  if (a >= 0x38800000u) {                        // normal f16 (>= 2^-14)
    uint32_t mant_round = a + 0xfffu + ((a >> 13) & 1u);  // RNE at bit 13
    return sign | uint16_t((mant_round - 0x38000000u) >> 13);
  }
  // Subnormal f16 (or zero): value = m * 2^-24. Shift the implicit-one mantissa.
  if (a < 0x33000000u) return sign;  // below half of the smallest subnormal: +-0
  uint32_t e = a >> 23, m = (a & 0x7fffffu) | 0x800000u;
  int shift = 126 - int(e);  // value = m * 2^(e-150); the f16 lsb is 2^-24
  uint32_t q = m >> shift, rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return sign | uint16_t(q);
}

float f16_to_float(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu;
  if (e == 0x1f) return bits_float(sign | 0x7f800000u | (m << 13));
  if (e == 0) {
    if (m == 0) return bits_float(sign);
    float v = float(m) * (1.0f / 16777216.0f);  // m * 2^-24
    return sign ? -v : v;
  }
  return bits_float(sign | ((e + 112) << 23) | (m << 13));
}

}  // namespace mcpp
