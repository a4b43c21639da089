"""protocol.record_batch.record_time: the timestamp of the record at an offset in Fetch's records
(shared by `herd groups describe --data-bootstrap-server` and the daemon's lag in seconds)."""
from __future__ import annotations

from protocol.record_batch import record_time
from tests.support.records import batch

T = 1_700_000_000_000


def test_the_record_at_the_offset_in_an_uncompressed_batch():
    data = batch(10, [T + 1000 * i for i in range(5)]) + batch(15, [T + 9000, T + 9500])
    assert record_time(data, 10) == T
    assert record_time(data, 13) == T + 3000
    assert record_time(data, 16) == T + 9500  # in the second batch
    assert record_time(data, 5) == T  # before the first batch (deleted by retention): the first record there
    assert record_time(data, 17) is None  # past every batch


def test_log_append_time_compressed_and_control_batches():
    stamps = [T, T + 10, T + 20]
    assert record_time(batch(0, stamps, attributes=0x08), 1) == T + 20  # LogAppendTime: the batch's time
    assert record_time(batch(0, stamps, attributes=0x01), 2) == T  # gzip: not decompressed, the first record's
    marker = batch(0, [T - 5], attributes=0x20)  # a transaction marker holds no data record
    assert record_time(marker + batch(1, [T + 7]), 0) == T + 7


def test_what_cannot_be_read_is_none_never_an_exception():
    good = batch(0, [T, T + 1])
    assert record_time(batch(0, [T], magic=1), 0) is None  # an old message set
    assert record_time(b"", 0) is None
    assert record_time(good[:30], 0) is None  # shorter than a batch header
    assert record_time(good[:-3], 1) == T  # the batch cut short by partition_max_bytes: its base time
    assert record_time(good[:64] + b"\xff" * 20, 1) is None  # a varint that never ends
