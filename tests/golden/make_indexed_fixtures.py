#!/usr/bin/env python3
"""Independent writer of Megatron MMIDIDX files (written from the format description in
megatron/core/datasets/indexed_dataset.py: header, int32 lengths, int64 byte pointers,
int64 document indices). Writes tests/golden/indexed/{u16,i32}.{bin,idx}, which
src/data/indexed_dataset.cpp's builder must reproduce byte for byte."""
import os
import struct

import numpy as np

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "indexed")
CODES = {np.uint16: 8, np.int32: 4}


def write(prefix, dtype, documents):
    """documents: list of documents, each a list of sequences (lists of ids)."""
    lengths, doc_idx = [], [0]
    with open(prefix + ".bin", "wb") as f:
        for doc in documents:
            for seq in doc:
                f.write(np.array(seq, dtype=dtype).tobytes(order="C"))
                lengths.append(len(seq))
            doc_idx.append(len(lengths))
    itemsize = np.dtype(dtype).itemsize
    pointers = np.concatenate([[0], np.cumsum(np.array(lengths, dtype=np.int64) * itemsize)[:-1]]) \
        if lengths else np.zeros(0, dtype=np.int64)
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", CODES[dtype]))
        f.write(struct.pack("<Q", len(lengths)))
        f.write(struct.pack("<Q", len(doc_idx)))
        f.write(np.array(lengths, dtype=np.int32).tobytes(order="C"))
        f.write(np.array(pointers, dtype=np.int64).tobytes(order="C"))
        f.write(np.array(doc_idx, dtype=np.int64).tobytes(order="C"))


os.makedirs(HERE, exist_ok=True)
write(os.path.join(HERE, "u16"), np.uint16,
      [[[15496, 995, 50256]], [[1, 2]], [[]], [[7, 8, 9, 10, 11, 65499]]])
write(os.path.join(HERE, "i32"), np.int32,
      [[[100000, 5], [128000, 1, 2]], [[3]], [[70000, 70001, 70002, 128001]]])
print("wrote", HERE)
