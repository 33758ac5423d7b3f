#!/usr/bin/env python3
"""An independent reader of TensorBoard event files (standard library only): decodes the
TFRecord framing, checks both masked CRC-32C of every record (a bitwise CRC, not the
writer's table), and parses the Event / Summary protobuf by hand.

usage: read_tfevents.py FILE  -> JSON {"file_version": ..., "records": N,
                                       "scalars": {tag: [[step, value, wall_time], ...]}}
Exits 1 on a bad CRC, a truncated record or an unexpected field."""
import json
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(data):
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def varint(buf, i):
    shift = result = 0
    while True:
        b = buf[i]
        i += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, i
        shift += 7


def fields(buf):
    """Yields (field number, wire type, value) of a protobuf message."""
    i = 0
    while i < len(buf):
        key, i = varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = varint(buf, i)
        elif wire == 1:
            v = buf[i:i + 8]
            i += 8
        elif wire == 2:
            n, i = varint(buf, i)
            v = buf[i:i + n]
            i += n
        elif wire == 5:
            v = buf[i:i + 4]
            i += 4
        else:
            raise ValueError(f"wire type {wire}")
        yield num, wire, v


def main():
    data = open(sys.argv[1], "rb").read()
    i, out = 0, {"file_version": None, "records": 0, "scalars": {}}
    while i < len(data):
        if i + 12 > len(data):
            sys.exit(f"truncated record header at byte {i}")
        header = data[i:i + 8]
        (length,) = struct.unpack("<Q", header)
        (hcrc,) = struct.unpack("<I", data[i + 8:i + 12])
        if hcrc != masked(header):
            sys.exit(f"bad length CRC at byte {i}")
        body = data[i + 12:i + 12 + length]
        (bcrc,) = struct.unpack("<I", data[i + 12 + length:i + 16 + length])
        if len(body) != length or bcrc != masked(body):
            sys.exit(f"bad data CRC at byte {i}")
        i += 16 + length
        out["records"] += 1
        wall, step, summary = 0.0, 0, None
        for num, wire, v in fields(body):
            if num == 1 and wire == 1:
                (wall,) = struct.unpack("<d", v)
            elif num == 2 and wire == 0:
                step = v
            elif num == 3 and wire == 2:
                out["file_version"] = v.decode()
            elif num == 5 and wire == 2:
                summary = v
            else:
                sys.exit(f"unexpected Event field {num}")
        if summary is None:
            continue
        for num, wire, value in fields(summary):
            assert num == 1 and wire == 2, "Summary holds values only"
            tag, simple = None, None
            for n2, w2, v2 in fields(value):
                if n2 == 1:
                    tag = v2.decode()
                elif n2 == 2 and w2 == 5:
                    (simple,) = struct.unpack("<f", v2)
                else:
                    sys.exit(f"unexpected Value field {n2}")
            out["scalars"].setdefault(tag, []).append([step, simple, wall])
    print(json.dumps(out))


main()
