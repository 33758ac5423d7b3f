#!/usr/bin/env python3
"""Independent Python re-implementation of Megatron-Core's GPT data path (split book-ends,
GPTDataset document/sample/shuffle indices with numpy.random.RandomState, sample reading,
BlendedDataset greedy blending, MockGPTLowLevelDataset with default_rng), written from the
algorithm description in shared/reference/megatron.md section 3. Writes two small datasets
under tests/golden/gptdata/ and tests/golden/gpt_dataset_fixtures.json, which the C++ tests
in tests/data/test_gpt_dataset.cpp must reproduce. Needs only python3-numpy."""
import json
import math
import os
import re
import struct

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "gptdata")
MOD = (1 << 61) - 1


def checksum(a):
    a = [int(x) for x in np.asarray(a).reshape(-1)]
    s = 0
    for i, v in enumerate(a):
        s = (s * 1000003 + (v & 0xFFFFFFFFFFFF) + i) % MOD
    return s


class Indexed:
    def __init__(self, prefix, seqs=None, dtype=np.uint16):
        self.path = prefix
        if seqs is not None:
            lens = [len(s) for s in seqs]
            with open(prefix + ".bin", "wb") as f:
                for s in seqs:
                    f.write(np.array(s, dtype=dtype).tobytes())
            ptr = np.zeros(len(lens), dtype=np.int64)
            ptr[1:] = np.cumsum(np.array(lens[:-1], dtype=np.int64) * np.dtype(dtype).itemsize)
            with open(prefix + ".idx", "wb") as f:
                f.write(b"MMIDIDX\x00\x00" + struct.pack("<QBQQ", 1, 8, len(lens), len(lens) + 1))
                f.write(np.array(lens, dtype=np.int32).tobytes())
                f.write(ptr.tobytes())
                f.write(np.arange(len(lens) + 1, dtype=np.int64).tobytes())  # one sequence per document
        self.seqs = [np.array(s, dtype=np.int64) for s in seqs]
        self.sequence_lengths = np.array([len(s) for s in seqs], dtype=np.int32)

    def get(self, i, offset=0, length=None):
        s = self.seqs[i]
        if length is None:
            length = len(s) - offset
        return s[offset:offset + length]


class Mock:
    def __init__(self, vocab, eod):
        self.path = "mock"
        rng = np.random.default_rng(seed=0)
        self.sequence_lengths = rng.integers(low=1, high=4096, size=100000, dtype=np.int32)
        self.vocab, self.eod = vocab, eod

    def get(self, i, offset=0, length=None):
        n = int(self.sequence_lengths[i])
        s = np.concatenate([(np.arange(n - 1) + 1) % self.vocab, [self.eod]]).astype(np.int64)
        if length is None:
            length = n - offset
        return s[offset:offset + length]


def split_matrix(split):
    v = [float(x) for x in re.findall(r"[.0-9]+", split)]
    v = v + [0.0] * (3 - len(v))
    v = (np.array(v, dtype=np.float64) / np.sum(np.array(v, dtype=np.float64))).tolist()
    ends = [0.0]
    for w in v:
        ends.append(ends[-1] + w)
    return [None if ends[i + 1] <= ends[i] else (ends[i], ends[i + 1]) for i in range(3)]


class GPT:
    def __init__(self, low, indices, num_samples, split, S, seed, X=1, mock=False, eod=None, pad=-1,
                 eod_mask_loss=False, reset_position_ids=False):
        self.low, self.S, self.X, self.pad, self.eod = low, S, X, pad, eod
        self.eod_mask_loss, self.reset_position_ids = eod_mask_loss, reset_position_ids
        if mock and num_samples is None:
            num_samples = len(indices)
        self.mock, self.num_samples = mock, num_samples
        tpe = int(np.sum(low.sequence_lengths[indices]))
        epochs = 1
        if num_samples is not None:
            t = tpe
            while t < num_samples * S + X:
                epochs += 1
                t += tpe
        sep = False
        if epochs > 1:
            sans = ((epochs - 1) * tpe - X) // S
            per = (tpe - X) // S
            sep = (num_samples - sans) < int(0.80 * per)
        rs = np.random.RandomState(seed)

        def doc_index(n_ep):
            d = np.tile(indices, n_ep).astype(np.int32)
            rs.shuffle(d)
            return d

        if sep:
            first = doc_index(epochs - 1)
            self.document_index = np.concatenate([first, doc_index(1)])
        else:
            self.document_index = doc_index(epochs)
        total = (epochs * tpe - X) // S
        sample = [(0, 0)]
        pos, off = 0, 0
        while len(sample) <= total:
            need = S + X
            while need:
                dl = int(low.sequence_lengths[self.document_index[pos]]) - off
                need -= dl
                if need <= 0:
                    off += need + dl - X
                    need = 0
                elif pos == len(self.document_index) - 1:
                    off = int(low.sequence_lengths[self.document_index[pos]]) - X
                    break
                else:
                    pos += 1
                    off = 0
            sample.append((pos, off))
        self.sample_index = np.array(sample, dtype=np.int64)
        n_first = sans if sep else total
        a = np.arange(n_first, dtype=np.uint32)
        rs.shuffle(a)
        if n_first < total:
            b = np.arange(n_first, total, dtype=np.uint32)
            rs.shuffle(b)
            a = np.concatenate([a, b])
        self.shuffle_index = a
        self.epochs, self.separate = epochs, sep

    def __len__(self):
        return self.num_samples if self.mock else len(self.sample_index) - 1

    def text(self, i):
        j = int(self.shuffle_index[i])
        (db, ob), (de, oe) = self.sample_index[j], self.sample_index[j + 1]
        parts = []
        for k in range(db, de + 1):
            seq = int(self.document_index[k])
            off = ob if k == db else 0
            ln = (oe - off + self.X) if k == de else None
            parts.append(self.low.get(seq, off, ln))
        t = np.concatenate(parts)
        if len(t) < self.S + self.X:
            t = np.concatenate([t, [self.pad] * (self.S + self.X - len(t))])
        return t.astype(np.int64)

    def sample(self, i):
        t = self.text(i)
        tokens, labels = t[:-1].copy(), t[1:].copy()
        loss = np.ones(self.S, dtype=np.float32)
        if self.eod_mask_loss:
            loss[tokens == self.eod] = 0
        pos = np.arange(self.S)
        if self.reset_position_ids:
            prev = 0
            for e in np.nonzero(tokens == self.eod)[0]:
                pos[e + 1:] -= e + 1 - prev
                prev = e + 1
        loss[labels == self.pad] = 0
        tokens[tokens == self.pad] = 0
        labels[labels == self.pad] = 0
        return tokens, labels, loss, pos


class Blended:
    def __init__(self, datasets, weights, size):
        if size is not None:
            w = np.array(weights, dtype=np.float64)
            w = w / np.sum(w)
            cnt = [0] * len(datasets)
            self.di, self.dsi = [], []
            for s in range(size):
                x = max(float(s), 1.0)
                errs = [w[k] * x - cnt[k] for k in range(len(datasets))]
                d = int(np.argmax(errs))
                self.di.append(d)
                self.dsi.append(cnt[d])
                cnt[d] += 1
        else:
            sizes = [int(x) for x in weights]
            w = [x / sum(sizes) for x in sizes]
            cnt = [0.0] * len(sizes)
            live = [k for k in range(len(sizes)) if sizes[k] > 0]
            self.di, self.dsi = [], []
            s = 0
            while live:
                x = max(float(s), 1.0)
                best, be = 0, -math.inf
                for k in live:
                    e = w[k] * x - cnt[k]
                    if e > be:
                        best, be = k, e
                self.di.append(best)
                self.dsi.append(int(cnt[best]))
                cnt[best] += 1
                if sizes[best] - int(cnt[best]) == 0:
                    live.remove(best)
                s += 1
        self.datasets = datasets

    def __len__(self):
        return len(self.di)

    def text(self, i):
        return self.datasets[self.di[i]].text(self.dsi[i])


def build(lows, weights, split, S, seed, sizes, surplus=0.005, mock=False, **kw):
    matrix = split_matrix(split)

    def splits(low, sz):
        out = []
        n = float(len(low.sequence_lengths))
        for i in range(3):
            if matrix[i] is None:
                out.append(None)
                continue
            beg, end = int(round(matrix[i][0] * n)), int(round(matrix[i][1] * n))
            out.append(GPT(low, np.arange(beg, end, dtype=np.int32), sz[i], i, S, seed, mock=mock, **kw))
        return out

    if len(lows) == 1 and weights is None:
        return splits(lows[0], sizes)
    if weights is not None:
        w = (np.array(weights, dtype=np.float64) / np.sum(np.array(weights, dtype=np.float64))).tolist()
        tgt = [[int(math.ceil(t * x)) if t is not None else None for t in sizes] for x in w]
        buf = [[int(math.ceil(math.ceil(t * x) * (1 + surplus))) if t is not None else None for t in sizes] for x in w]
    else:
        buf = [[None] * 3 for _ in lows]
    per = [splits(low, buf[k]) for k, low in enumerate(lows)]
    out = []
    for i in range(3):
        if matrix[i] is None:
            out.append(None)
            continue
        ds = [per[k][i] for k in range(len(lows))]
        if weights is not None:
            out.append(Blended(ds, w, sum(tgt[k][i] for k in range(len(lows)))))
        else:
            lens = [len(d) for d in ds]
            out.append(Blended(ds, lens, min(sizes[i], sum(lens)) if sizes[i] is not None else None))
    return out


def describe(ds, picks):
    if ds is None:
        return None
    d = {"size": len(ds), "samples": {str(i): [int(x) for x in ds.text(i)] for i in picks(len(ds))}}
    if isinstance(ds, GPT):
        d.update({"epochs": ds.epochs, "separate_final_epoch": bool(ds.separate),
                  "document_index_len": len(ds.document_index),
                  "document_index_head": [int(x) for x in ds.document_index[:40]],
                  "document_index_sum": checksum(ds.document_index),
                  "sample_index_sum": checksum(ds.sample_index),
                  "shuffle_index_head": [int(x) for x in ds.shuffle_index[:40]],
                  "shuffle_index_sum": checksum(ds.shuffle_index)})
        if ds.eod is not None:
            tok, lab, loss, pos = ds.sample(0)
            d["sample0"] = {"tokens": tok.tolist(), "labels": lab.tolist(),
                            "loss_mask": loss.tolist(), "position_ids": pos.tolist()}
    else:
        d["dataset_index_head"] = ds.di[:60]
        d["dataset_sample_index_head"] = ds.dsi[:60]
        d["dataset_index_sum"] = checksum(ds.di)
    return d


def picks(n):
    return sorted(set([0, 1, 2, n // 2, n - 1] + [int(x) for x in np.linspace(0, n - 1, 7)]))


os.makedirs(OUT, exist_ok=True)
g = np.random.RandomState(2024)
EOD = 50256
seqs_a = [list(g.randint(0, 50000, size=int(n))) + [EOD] for n in g.randint(0, 60, size=300)]
seqs_b = [list(g.randint(0, 50000, size=int(n))) for n in g.randint(0, 40, size=120)]  # some empty
A = Indexed(os.path.join(OUT, "A"), seqs_a)
B = Indexed(os.path.join(OUT, "B"), seqs_b)

cases = [
    dict(name="single_default", lows=["A"], weights=None, split="90,8,2", S=16, seed=1234, sizes=[500, 40, 5]),
    dict(name="multi_epoch", lows=["A"], weights=None, split="98,2,0", S=32, seed=7, sizes=[2000, None, None]),
    dict(name="separate_final", lows=["A"], weights=None, split="1", S=8, seed=99, sizes=[1430, None, None]),
    dict(name="masks", lows=["A"], weights=None, split="90,10", S=64, seed=3, sizes=[50, 10, None],
         kw=dict(eod=EOD, eod_mask_loss=True, reset_position_ids=True)),
    dict(name="blend_weighted", lows=["A", "B"], weights=[0.3, 0.7], split="90,10,0", S=16, seed=5, sizes=[300, 20, None]),
    dict(name="blend_unweighted", lows=["A", "B"], weights=None, split="80,20,0", S=16, seed=11, sizes=[100, 10000, None]),
    dict(name="mock", lows=["mock"], weights=None, split="1,1,1", S=2048, seed=1234, sizes=[100, 20, 10], mock=True,
         kw=dict(eod=EOD)),
]
fixtures = {"mock_lengths_head": [int(x) for x in Mock(50257, EOD).sequence_lengths[:20]],
            "mock_lengths_sum": int(np.sum(Mock(50257, EOD).sequence_lengths.astype(np.int64))), "cases": []}
for c in cases:
    lows = [{"A": A, "B": B}[n] if n != "mock" else Mock(50257, EOD) for n in c["lows"]]
    sets = build(lows, c["weights"], c["split"], c["S"], c["seed"], c["sizes"], mock=c.get("mock", False),
                 **c.get("kw", {}))
    fixtures["cases"].append({k: v for k, v in c.items() if k not in ("kw",)} | {"kw": c.get("kw", {}),
                             "splits": [describe(d, picks) for d in sets]})
    print(c["name"], [None if d is None else len(d) for d in sets],
          [None if not isinstance(d, GPT) else (d.epochs, d.separate) for d in sets])
with open(os.path.join(HERE, "gpt_dataset_fixtures.json"), "w") as f:
    json.dump(fixtures, f)
