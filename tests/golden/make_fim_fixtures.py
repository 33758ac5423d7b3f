#!/usr/bin/env python3
"""Writes tests/golden/fim/tokenizer.json (a tiny byte-level tokenizer with the FIM tokens)
and tests/golden/fim/fixtures.json: fill-in-the-middle transforms that src/data/fim.cpp must
reproduce token for token, computed here by an independent re-implementation of the layout
of Megatron's GPTFIMDataset with NumPy's RandomState seeded per sample as megatron.cpp seeds
it: RandomState([seed, split, index % 2**32, index // 2**32]). Also raw draws of
RandomState(key array).binomial / random_sample / randint for src/base/numpy_rng.cpp.
Needs only Debian's python3-numpy (run: python3 tests/golden/make_fim_fixtures.py)."""
import json
import os

import numpy as np

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fim")

# ---- the tokenizer: byte b is token b; added special tokens from 256 on -----------------
SPECIALS = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>", "<fim_pad>", "<file_sep>",
            "<|endoftext|>"]
ID = {t: 256 + i for i, t in enumerate(SPECIALS)}
PREFIX, MIDDLE, SUFFIX, PAD, SEP, EOD = (ID[t] for t in SPECIALS)


def byte_to_unicode():
    """GPT-2's printable alphabet for the 256 bytes."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


def write_tokenizer():
    b2u = byte_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    # One added token a line, the FIM ones first: tests/cli/fim_data.sh drops them with grep.
    lines = ["{", '  "version": "1.0",', '  "added_tokens": [']
    for t in SPECIALS:
        comma = "," if t != SPECIALS[-1] else ""
        lines.append('    {"id": %d, "content": "%s", "single_word": false, "lstrip": false, '
                     '"rstrip": false, "normalized": false, "special": true}%s' % (ID[t], t, comma))
    lines += ["  ],", '  "normalizer": null,',
              '  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, '
              '"trim_offsets": true, "use_regex": true},',
              '  "post_processor": null,',
              '  "decoder": {"type": "ByteLevel", "add_prefix_space": false, '
              '"trim_offsets": true, "use_regex": true},',
              '  "model": {"type": "BPE", "dropout": null, "unk_token": null, '
              '"continuing_subword_prefix": null, "end_of_word_suffix": null, '
              '"fuse_unk": false, "byte_fallback": false, "vocab": '
              + json.dumps(vocab, ensure_ascii=False, sort_keys=False) + ', "merges": []}',
              "}"]
    with open(os.path.join(HERE, "tokenizer.json"), "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")


def text_to_ids(text):
    return list(text.encode("utf-8"))


def ids_to_text(ids):  # special tokens removed, bytes decoded as Python does
    return bytes(i for i in ids if i < 256).decode("utf-8", errors="replace")


# ---- the transform, written from Megatron's description -----------------------------------
class Fim:
    def __init__(self, rng, c):
        self.rng, self.c = rng, c

    def permute(self, seg, rate):
        c = self.c
        if not self.rng.binomial(1, rate):
            return list(seg)
        text = ids_to_text(seg)
        if c["no_prefix"] is not None and text.startswith(c["no_prefix"]):
            return list(seg)
        lo, hi = sorted(self.rng.randint(low=0, high=len(text) + 1, size=2))
        p, m, s = text_to_ids(text[:lo]), text_to_ids(text[lo:hi]), text_to_ids(text[hi:])
        if self.rng.binomial(1, c["spm_rate"]):
            return [PREFIX, SUFFIX] + s + [MIDDLE] + p + m
        return [PREFIX] + p + [SUFFIX] + s + [MIDDLE] + m

    def document(self, doc):
        c = self.c
        sep = c["split_sample"]
        if sep is None or sep not in doc:
            return self.permute(doc, c["rate"])
        if not self.rng.binomial(1, c["rate"]):
            return list(doc)
        out, start = [], 0
        for i, t in enumerate(doc):
            if t == sep:
                if i > start:
                    out += self.permute(doc[start:i], c["fragment_rate"]) + [sep]
                start = i + 1
        return out + self.permute(doc[start:], c["fragment_rate"])

    def sample(self, sample):
        out, start = [], 0
        for i, t in enumerate(sample):
            if t == EOD:
                if i > start:
                    out += self.document(sample[start:i]) + [EOD]
                start = i + 1
        out += self.document(sample[start:])
        return (out + [PAD] * len(sample))[:len(sample)]


def rng_for(seed, split, index):
    return np.random.RandomState([seed, split, index % 2**32, index // 2**32])


WORDS = ["def", "f", "(x):", "return", "x", "+", "1", "\n", " ", "    ", "é", "名前", "😀", "#"]


def make_sample(r, n):
    ids = []
    while len(ids) < n:
        k = r.randint(0, 20)
        if k == 0:
            ids.append(EOD)
        elif k == 1:
            ids.append(SEP)
        elif k == 2:
            ids.append(int(r.randint(0x80, 0x100)))  # a stray byte: invalid UTF-8
        else:
            ids += text_to_ids(WORDS[r.randint(0, len(WORDS))])
    return ids[:n]


def main():
    os.makedirs(HERE, exist_ok=True)
    write_tokenizer()
    r = np.random.RandomState(7)
    configs = [
        dict(rate=0.5, spm_rate=0.5, split_sample=None, fragment_rate=None, no_prefix=None),
        dict(rate=1.0, spm_rate=0.0, split_sample=None, fragment_rate=None, no_prefix=None),
        dict(rate=1.0, spm_rate=1.0, split_sample=None, fragment_rate=None, no_prefix=None),
        dict(rate=0.9, spm_rate=0.3, split_sample=SEP, fragment_rate=0.7, no_prefix=None),
        dict(rate=1.0, spm_rate=0.5, split_sample=SEP, fragment_rate=1.0, no_prefix="def"),
        dict(rate=0.0, spm_rate=0.5, split_sample=None, fragment_rate=None, no_prefix=None),
    ]
    cases = []
    for ci, c in enumerate(configs):
        for k in range(12):
            n = int(r.randint(1, 80))
            sample = make_sample(r, n)
            seed, split, index = (1234 if k % 4 else 42), k % 3, [k, 2**32 + k][k % 2]
            out = Fim(rng_for(seed, split, index), c).sample(sample)
            cases.append(dict(config=ci, seed=seed, split=split, index=index, sample=sample,
                              expected=[int(v) for v in out]))
    rng = []
    for key in ([1], [1234, 0, 5, 0], [42, 2, 7, 1], list(range(700))):
        rs = np.random.RandomState(key)
        e = dict(key=key, u32=[int(v) for v in rs.randint(0, 2**32, size=4, dtype=np.uint32)])
        e["sample"] = [float(rs.random_sample()) for _ in range(3)]
        e["binomial"] = [[p, [int(rs.binomial(1, p)) for _ in range(40)]]
                         for p in (0.0, 0.1, 0.5, 0.7, 0.999, 1.0)]
        e["binomial_n"] = [[n, p, [int(rs.binomial(n, p)) for _ in range(10)]]
                           for n, p in ((5, 0.3), (40, 0.6), (2, 0.5))]
        e["randint"] = [[h, [int(v) for v in rs.randint(0, h + 1, size=2)]]
                        for h in (0, 1, 7, 1000, 2**33)]
        rng.append(e)
    with open(os.path.join(HERE, "fixtures.json"), "w") as f:
        json.dump(dict(numpy_version=np.__version__, tokens=ID, configs=configs, cases=cases,
                       rng=rng), f)
        f.write("\n")


if __name__ == "__main__":
    main()
