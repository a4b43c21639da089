"""Reading a record's timestamp out of a Fetch response's records (v2 record batches).

herd stores no records; two places read one record's time from the data cluster: ``herd groups
describe --data-bootstrap-server`` (admin) and the daemon's lag in seconds when its log-end history
cannot answer (coordinator/ops). Both send one Fetch at the committed offset and hand the bytes
here. Pure: no I/O.
"""
from __future__ import annotations

import struct

__all__ = ["record_time", "FETCH_PARTITION_BYTES", "FETCH_MAX_BYTES", "FETCH_MAX_VERSION"]

FETCH_PARTITION_BYTES = 64 * 1024  # a batch header is 61 bytes; a larger batch may come back cut
FETCH_MAX_BYTES = 4 * 1024 * 1024
FETCH_MAX_VERSION = 12  # v4+ (record batches) by topic name: topic ids replace the names from v13
_BATCH = struct.Struct(">qiiBIhiqq")  # base offset .. max timestamp: the first 43 bytes of a v2 batch
_RECORDS_AT = 61  # the records of a v2 batch start here


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    """A zigzag varint (Kafka's records) at ``pos``: ``(value, next position)``."""
    shift = raw = 0
    while True:
        b = buf[pos]
        pos += 1
        raw |= (b & 0x7F) << shift
        if not b & 0x80:
            return (raw >> 1) ^ -(raw & 1), pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def record_time(records: bytes, offset: int) -> int | None:
    """The timestamp of the record at ``offset`` in Fetch's ``records`` (v2 batches): LogAppendTime
    batches give their append time; an uncompressed batch the record's own timestamp; a compressed
    one its first record's (herd does not decompress: at most the batch's time span early). None
    when no data batch holds ``offset``."""
    pos, n = 0, len(records)
    try:
        while pos + _BATCH.size <= n:
            base, length, _, magic, _, attrs, last_delta, base_ts, max_ts = _BATCH.unpack_from(records, pos)
            end = pos + 12 + length
            if magic != 2:
                return None
            if base + last_delta < offset or attrs & 0x20:  # before it, or a transaction marker
                pos = end
                continue
            if attrs & 0x08:  # LogAppendTime: every record of the batch has the append time
                return max_ts
            if attrs & 0x07 == 0 and offset > base and end <= n:
                p = pos + _RECORDS_AT
                while p < end:
                    size, q = _varint(records, p)
                    ts_delta, r = _varint(records, q + 1)  # after the record's attributes byte
                    off_delta, _ = _varint(records, r)
                    if base + off_delta >= offset:
                        return base_ts + ts_delta
                    p = q + size
            return base_ts
    except (IndexError, ValueError, struct.error):
        return None
    return None
