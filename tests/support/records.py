"""Record batches (magic 2) built by hand for tests that play a data cluster's Fetch answers."""
from __future__ import annotations

import struct


def zigzag(n: int) -> bytes:
    n = (n << 1) ^ (n >> 63)
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def batch(base: int, stamps: list[int], attributes: int = 0, magic: int = 2) -> bytes:
    """One record batch at ``base`` holding a one-byte record per timestamp (CreateTime unless
    ``attributes`` says otherwise: 0x08 LogAppendTime, 0x20 a control batch, 0x01-0x04 a codec,
    whose records are then not readable as such)."""
    records = bytearray()
    for i, ts in enumerate(stamps):
        body = b"\x00" + zigzag(ts - stamps[0]) + zigzag(i) + zigzag(-1) + zigzag(1) + b"x" + zigzag(0)
        records += zigzag(len(body)) + body
    tail = struct.pack(">hiqqqhii", attributes, len(stamps) - 1, stamps[0], max(stamps), -1, -1, -1,
                       len(stamps)) + records
    return struct.pack(">qiiBI", base, 4 + 1 + 4 + len(tail), 0, magic, 0) + tail
