#!/usr/bin/env python3
"""YaRN's RoPE frequencies and concentration factor, written out from the formulas of
Megatron-LM's YarnRotaryEmbedding (and Hugging Face's rope type "yarn", the same numbers)
with Python's math module only, in double precision. Writes the C++ constants that
tests/ops_attention/test_rope_yarn.cpp checks ops::yarn_inv_freq and
ops::yarn_concentration against:

    python3 tests/golden/yarn/make_yarn_fixtures.py > tests/golden/yarn/yarn_fixtures.h
"""
import math


def corr_dim(rot, dim, base, L):
    # The rotary pair whose wavelength turns `rot` times over the original context L.
    return dim * math.log(L / (rot * 2 * math.pi)) / (2 * math.log(base))


def inv_freqs(dim, base, factor, L, beta_fast, beta_slow, round_to_int):
    low, high = corr_dim(beta_fast, dim, base, L), corr_dim(beta_slow, dim, base, L)
    if round_to_int:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    out = []
    for i in range(dim // 2):
        extra = 1.0 / base ** (2 * i / dim)
        inter = 1.0 / (factor * base ** (2 * i / dim))
        ramp = min(max((i - low) / (high - low), 0.0), 1.0)
        keep = 1.0 - ramp  # 1 where the pair extrapolates
        out.append(inter * (1 - keep) + extra * keep)
    return low, high, out


def get_mscale(scale, m):
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


CASES = [
    # name, dim, base, factor, L, beta_fast, beta_slow, round_to_int
    ("qwen", 128, 1e6, 4.0, 32768, 32.0, 1.0, True),
    ("unrounded", 64, 10000.0, 8.0, 2048, 16.0, 2.0, False),
]
print("// Written by make_yarn_fixtures.py (beside this file); do not edit.")
print("#pragma once\n\nnamespace yarn_fixtures {\n")
print("struct Case {\n  const char* name;\n  int dim;\n  double base, factor;\n  int L;\n"
      "  double beta_fast, beta_slow;\n  bool round_to_int;\n  const double* inv_freq;\n};\n")
names = []
for name, dim, base, factor, L, bf, bs, rnd in CASES:
    low, high, f = inv_freqs(dim, base, factor, L, bf, bs, rnd)
    print(f"// low {low!r}, high {high!r}")
    print(f"const double k_{name}[{dim // 2}] = {{")
    print(",\n".join("    " + repr(x) for x in f) + "};\n")
    names.append(f'    {{"{name}", {dim}, {base!r}, {factor!r}, {L}, {bf!r}, {bs!r}, '
                 f'{"true" if rnd else "false"}, k_{name}}}')
print("const Case kCases[] = {\n" + ",\n".join(names) + "};\n")
print("// {factor, mscale, mscale_all_dim, concentration}")
print("const double kConcentration[][4] = {")
rows = []
for factor, m, mall in [(4.0, 1.0, 0.0), (40.0, 0.707, 0.707), (40.0, 1.0, 0.707), (0.5, 1.0, 0.0)]:
    rows.append(f"    {{{factor!r}, {m!r}, {mall!r}, "
                f"{get_mscale(factor, m) / get_mscale(factor, mall)!r}}}")
print(",\n".join(rows) + "};\n")
print("}  // namespace yarn_fixtures")
