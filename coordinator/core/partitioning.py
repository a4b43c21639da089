"""Which offsets partition (shard) owns a group: Kafka's ``Utils.abs(groupId.hashCode()) % n``.

``String.hashCode`` runs over UTF-16 code units (a character outside the BMP counts as its two
surrogates) with int32 wrap-around; Kafka's ``Utils.abs`` maps Integer.MIN_VALUE to 0 (unlike
``Math.abs``, which would leave it negative). Never Python's ``hash()``: it is salted per process.
"""
from __future__ import annotations

import struct
from functools import lru_cache

__all__ = ["java_string_hash", "kafka_abs", "shard_for"]

_MASK = 0xFFFFFFFF
INT32_MIN = -(2**31)


def java_string_hash(s: str) -> int:
    """Java's ``String.hashCode()`` of ``s`` as a signed int32."""
    h = 0
    if s.isascii():
        for c in s.encode("ascii"):
            h = (31 * h + c) & _MASK
    else:
        units = s.encode("utf-16-be", "surrogatepass")
        for (c,) in struct.iter_unpack(">H", units):
            h = (31 * h + c) & _MASK
    return h - 0x1_0000_0000 if h & 0x8000_0000 else h


def kafka_abs(n: int) -> int:
    """Kafka's ``Utils.abs``: absolute value, except Integer.MIN_VALUE maps to 0."""
    return 0 if n == INT32_MIN else abs(n)


@lru_cache(maxsize=65536)
def _shard(group_id: str, n: int) -> int:
    return kafka_abs(java_string_hash(group_id)) % n


def shard_for(group_id: str, n: int) -> int:
    """The offsets partition in ``[0, n)`` that owns ``group_id`` (Kafka-identical)."""
    if n <= 0:
        raise ValueError("the number of partitions must be positive")
    return _shard(group_id, n)
