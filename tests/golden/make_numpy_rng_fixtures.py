#!/usr/bin/env python3
"""Writes tests/golden/numpy_rng_fixtures.json: outputs of NumPy's RandomState (MT19937,
legacy shuffle) and default_rng (PCG64 + SeedSequence, Generator.integers) that
src/base/numpy_rng.cpp must reproduce bit for bit. Needs only Debian's python3-numpy."""
import json
import os

import numpy as np

out = {"numpy_version": np.__version__, "mt_raw": [], "shuffle": [], "pcg_raw": [], "integers": []}
for seed in [0, 1, 5489, 1234, 2**32 - 1]:
    rs = np.random.RandomState(seed)
    out["mt_raw"].append({"seed": seed, "u32": [int(v) for v in rs.randint(0, 2**32, size=16, dtype=np.uint32)]})
for seed in [0, 1, 1234, 2**31 + 7]:
    for n, dt in [(1, np.int32), (2, np.int32), (10, np.int32), (1000, np.int32), (777, np.uint32), (70000, np.int32)]:
        rs = np.random.RandomState(seed)
        a = np.arange(n, dtype=dt)
        rs.shuffle(a)
        b = np.arange(n // 2 + 1, dtype=np.uint32)  # a second shuffle on the same state
        rs.shuffle(b)
        out["shuffle"].append({"seed": seed, "n": n, "first": [int(v) for v in a[:50]],
                               "sum_i_times_v": int(np.sum(np.arange(n, dtype=np.int64) * a.astype(np.int64))),
                               "second_first": [int(v) for v in b[:20]]})
for seed in [0, 1, 12345, 2**40 + 3]:
    g = np.random.default_rng(seed)
    out["pcg_raw"].append({"seed": seed, "u64": [str(int(v)) for v in g.bit_generator.random_raw(8)]})
for seed, low, high, size in [(0, 1, 4096, 100000), (3, 0, 10, 50), (7, -5, 2**31 - 1, 50)]:
    g = np.random.default_rng(seed)
    v = g.integers(low=low, high=high, size=size, dtype=np.int32)
    out["integers"].append({"seed": seed, "low": low, "high": high, "size": size,
                            "first": [int(x) for x in v[:40]], "last": [int(x) for x in v[-10:]],
                            "sum": int(v.astype(np.int64).sum())})
path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "numpy_rng_fixtures.json")
with open(path, "w") as f:
    json.dump(out, f, indent=1)
print("wrote", path)
