"""Reading a record's timestamp out of a Fetch response's records (v2 record batches).

herd stores no records; two places read one record's time from the data cluster: ``herd groups
describe --data-bootstrap-server`` (admin) and the daemon's lag in seconds when its log-end history
cannot answer (coordinator/ops). Both send one Fetch at the committed offset (``time_fetch``) and
read the times from its response (``fetched_times``). Pure: no I/O.
"""
from __future__ import annotations

import struct

from protocol import errors as E
from protocol import messages as m

__all__ = ["record_time", "time_fetch", "fetched_times", "FETCH_PARTITION_BYTES", "FETCH_MAX_BYTES",
           "FETCH_MAX_VERSION"]

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


def time_fetch(offsets: dict[tuple[str, int], int]):
    """``build(version)`` of one Fetch (no wait, read-uncommitted) of the batch holding the record
    at each ``(topic, partition): offset``, in ``offsets``' order; send it at v4+ (record batches),
    up to ``FETCH_MAX_VERSION`` (topic names)."""
    topics: dict[str, list] = {}
    for (t, p), off in offsets.items():
        topics.setdefault(t, []).append(m.FetchRequestFetchPartition(
            partition=p, current_leader_epoch=-1, fetch_offset=off, last_fetched_epoch=-1,
            log_start_offset=-1, partition_max_bytes=FETCH_PARTITION_BYTES))

    def build(v):
        return m.FetchRequest(replica_id=-1, max_wait_ms=0, min_bytes=0, max_bytes=FETCH_MAX_BYTES,
                              isolation_level=0, session_id=0, session_epoch=-1, rack_id="",
                              forgotten_topics_data=[],
                              topics=[m.FetchRequestFetchTopic(topic=t, partitions=ps) for t, ps in topics.items()])

    return build


def fetched_times(resp, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int | None]:
    """The record times a Fetch response of ``time_fetch(offsets)`` holds: ``{tp: ms or None}`` for
    each partition of ``offsets`` answered without error and with records."""
    out: dict = {}
    for rt in resp.responses:
        for rp in rt.partitions:
            tp = (rt.topic, rp.partition_index)
            if tp in offsets and rp.error_code == E.NONE and rp.records:
                out[tp] = record_time(bytes(rp.records), offsets[tp])
    return out
