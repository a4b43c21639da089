"""__consumer_offsets-format records: keys, values, versions, tombstones, unknown types."""
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.config import Config
from coordinator.core import records
from coordinator.core.coordinator import GroupCoordinator
from protocol.messages import (
    GroupMetadataKey,
    GroupMetadataValue,
    GroupMetadataValueMemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
)


def generated_key(type_: int, obj) -> bytes:
    return struct.pack(">h", type_) + obj.encode(type_)


def generated_value(version: int, obj) -> bytes:
    return struct.pack(">h", version) + obj.encode(version)


@given(group=st.text(max_size=30), topic=st.text(min_size=1, max_size=30),
       partition=st.integers(0, 2**31 - 1), offset=st.integers(-1, 2**63 - 1),
       epoch=st.integers(-1, 2**31 - 1), meta=st.text(max_size=50), ts=st.integers(0, 2**62))
def test_fast_encoders_match_the_generated_codec(group, topic, partition, offset, epoch, meta, ts):
    key = records.offset_commit_key(group, topic, partition)
    assert key == generated_key(1, OffsetCommitKey(group, topic, partition))
    v3 = records.offset_commit_value(offset, epoch, meta, ts)
    assert v3 == generated_value(3, OffsetCommitValue(offset, epoch, meta, ts))
    v1 = records.offset_commit_value(offset, epoch, meta, ts, ts + 5)
    assert v1 == generated_value(1, OffsetCommitValue(offset, -1, meta, ts, ts + 5))
    rtype, k = records.decode_key(key)
    assert rtype == records.OFFSET_COMMIT and (k.group, k.topic, k.partition) == (group, topic, partition)
    d3 = records.decode_value(rtype, v3)
    fields = ("offset", "leader_epoch", "metadata", "commit_timestamp", "expire_timestamp")
    assert tuple(getattr(d3, f) for f in fields) == (offset, epoch, meta, ts, -1)
    d1 = records.decode_value(rtype, v1)
    assert tuple(getattr(d1, f) for f in fields) == (offset, -1, meta, ts, ts + 5)


def test_value_versions():
    assert records.offset_commit_value(1, 2, "", 3)[:2] == b"\x00\x03"
    assert records.offset_commit_value(1, 2, "", 3, 9)[:2] == b"\x00\x01"
    gm = GroupMetadataValue("consumer", 3, "range", "m1", 123, [
        GroupMetadataValueMemberMetadata("m1", "i1", "c", "/h", 300, 100, b"s", b"a")])
    raw = records.group_metadata_value(gm)
    assert raw[:2] == b"\x00\x03"
    assert records.decode_value(records.GROUP_METADATA, raw) == gm
    assert records.group_metadata_key("g") == generated_key(2, GroupMetadataKey("g"))
    assert records.decode_key(records.group_metadata_key("g")) == (2, GroupMetadataKey("g"))


def test_generic_encode_helpers_and_tombstones():
    assert records.encode_key(OffsetCommitKey("g", "t", 1)) == records.offset_commit_key("g", "t", 1)
    assert records.encode_key(GroupMetadataKey("g")) == records.group_metadata_key("g")
    assert records.encode_value(None) is None
    assert records.decode_value(records.OFFSET_COMMIT, None) is None
    assert records.decode_value(records.GROUP_METADATA, None) is None
    v = OffsetCommitValue(5, 1, "m", 10)
    assert records.decode_value(1, records.encode_value(v)) == v
    with pytest.raises(records.RecordError):
        records.encode_key(v)
    with pytest.raises(records.RecordError):
        records.encode_value(GroupMetadataKey("g"))


def test_version_zero_offset_key_is_read():
    raw = generated_key(0, OffsetCommitKey("g", "t", 3))
    assert records.decode_key(raw) == (0, OffsetCommitKey("g", "t", 3))
    old_value = generated_value(0, OffsetCommitValue(7, -1, "x", 11))
    assert records.decode_value(0, old_value).offset == 7


def test_unknown_record_types_are_reported_not_decoded():
    for rtype in range(3, 16):  # KIP-848 consumer groups, share groups, streams groups
        raw = struct.pack(">h", rtype) + b"\x00\x01g" + b"junk"
        assert records.decode_key(raw) == (rtype, None)
        with pytest.raises(records.RecordError):
            records.decode_value(rtype, b"\x00\x00")


def test_malformed_records_raise_one_error_type():
    for bad in (b"", b"\x00", b"\x00\x01\x00\x05ab", b"\x00\x02\xff"):
        with pytest.raises(records.RecordError):
            records.decode_key(bad)
    for bad in (b"\x00", b"\x00\x03\x00", b"\xff\xff"):
        with pytest.raises(records.RecordError):
            records.decode_value(1, bad)
    with pytest.raises(records.RecordError):
        records.decode_value(2, b"\x00\x03\x00\x01")


def test_newer_value_versions_are_read_with_the_newest_schema():
    v4 = generated_value(4, OffsetCommitValue(9, 2, "m", 100))
    assert records.decode_value(1, v4).offset == 9
    future = b"\x00\x07" + v4[2:]  # a v7 from a future Kafka: read as v4 (tagged fields only)
    assert records.decode_value(1, future).offset == 9


def test_replay_skips_unknown_types_cleanly():
    gc = GroupCoordinator(Config(offsets_partitions=3).group_config())
    for rtype in range(9, 16):  # share and streams group records: not herd's
        gc.replay(0, struct.pack(">h", rtype) + b"\x00\x03abc", b"\x00\x00whatever")
    assert gc.skipped_records == 7
    assert gc.list_groups() == []
    # KIP-848 consumer group records (types 3-8) are herd's now: damage in one is an error
    for rtype in range(3, 9):
        with pytest.raises(records.RecordError):
            gc.replay(0, struct.pack(">h", rtype) + b"\x00\x03abc", b"\x00\x00whatever")
    with pytest.raises(records.RecordError):
        gc.replay(0, b"\x00\x01\x00", None)


@given(group=st.text(max_size=40), topic=st.text(min_size=1, max_size=40), partition=st.integers(0, 2**31 - 1),
       offset=st.integers(-1, 2**63 - 1), epoch=st.integers(-1, 2**31 - 1), meta=st.text(max_size=60),
       ts=st.integers(0, 2**62), expire=st.sampled_from([-1, 1_800_000_000_000]))
def test_fast_offset_decode_agrees_with_the_generic_decoder(group, topic, partition, offset, epoch, meta, ts, expire):
    from coordinator.core import records as r
    key = r.offset_commit_key(group, topic, partition)
    value = r.offset_commit_value(offset, epoch, meta, ts, expire)
    rtype, k = r.decode_key(key)
    v = r.decode_value(rtype, value)
    plain = r.plain_offset_commit(key, value)
    # the in-memory readers agree with the generic decoder (v1 has no leader epoch)
    fields = (v.offset, v.leader_epoch, v.metadata, v.commit_timestamp, v.expire_timestamp)
    assert r.offset_value_fields(value) == fields == (offset, epoch if expire == -1 else -1, meta, ts, expire)
    assert r.offset_value_times(value) == (ts, expire)
    if expire != -1:
        assert plain is None  # a v1 value takes the generic path
        return
    prefix, part = plain
    assert (r.decode_offset_key_prefix(prefix), part) == ((k.group, k.topic), k.partition)
    assert prefix == r.offset_key_prefix(group, topic)
    assert r.plain_offset_commit(key, None) is None
    assert r.plain_offset_commit(key, value + b"x") is None
    assert r.plain_offset_commit(key, value[:-1]) is None
    assert r.decode_offset_key_prefix(prefix + b"x") is None
    assert r.decode_offset_key_prefix(prefix[:-1]) is None


def test_fast_offset_decode_refuses_what_it_does_not_know():
    from coordinator.core import records as r
    key = r.offset_commit_key("g", "t", 1)
    value = r.offset_commit_value(5, 1, "ab", 10)
    assert r.plain_offset_commit(key, value) == (key[:-4], 1)
    assert r.plain_offset_commit(r.group_metadata_key("g"), value) is None
    assert r.plain_offset_commit(b"\x00\x00" + key[2:], value) is None  # type 0: generic path
    assert r.plain_offset_commit(b"\x00\x01\x00", value) is None
    assert r.decode_offset_key_prefix(b"\x00\x01\x00\x01\xff\x00\x01t") is None  # not UTF-8
    assert r.decode_offset_key_prefix(b"\x00\x01\xff\xff\x00\x00") is None  # negative length
    assert r.plain_offset_commit(key, value[:16] + b"\xff\xfe" + value[18:]) is None  # metadata not UTF-8
    assert r.plain_offset_commit(key, value[:14] + b"\xff\xff" + value[16:]) is None  # negative length
    assert r.plain_offset_commit(key, generated_value(4, OffsetCommitValue(5, 1, "ab", 10))) is None
    assert r.plain_offset_commit(key, b"\x00\x03" + bytes(22)) is not None  # empty metadata, 24 bytes
    assert r.plain_offset_commit(key, b"\x00\x03" + bytes(21)) is None


def test_every_value_version_replays_to_the_same_memory():
    """Replay keeps a v3 value as it is and re-encodes any other version (v0-v2, v4) to the bytes
    herd would write, so the in-memory form is the same whatever wrote the log."""
    key = records.offset_commit_key("g", "t", 0)
    cases = [
        (generated_value(0, OffsetCommitValue(7, -1, "m", 11)), (7, -1, "m", 11, -1)),
        (generated_value(1, OffsetCommitValue(7, -1, "m", 11, 99)), (7, -1, "m", 11, 99)),
        (generated_value(2, OffsetCommitValue(7, -1, "m", 11)), (7, -1, "m", 11, -1)),
        (generated_value(3, OffsetCommitValue(7, 4, "m", 11)), (7, 4, "m", 11, -1)),
        (generated_value(4, OffsetCommitValue(7, 4, "m", 11)), (7, 4, "m", 11, -1)),
    ]
    for raw, fields in cases:
        gc = GroupCoordinator(Config(offsets_partitions=1).group_config())
        gc.replay(0, key, raw)
        stored = gc.shards[0].offsets.committed["g"]["t"][0]
        assert records.offset_value_fields(stored) == fields
        assert stored == records.offset_commit_value(*fields)
        assert gc.group_offsets("g")["t"][0]["offset"] == 7


@given(group=st.text(max_size=30), topic=st.text(max_size=30), partition=st.integers(-2**31, 2**31 - 1))
def test_the_remembered_key_prefix_is_the_generated_key(group, topic, partition):
    first = records.offset_key_prefix(group, topic)
    again = records.offset_key_prefix(group, topic)  # from the memo
    assert first == again
    assert first + records.pack_partition(partition) == generated_key(1, OffsetCommitKey(group, topic, partition))


def test_the_key_prefix_memo_is_bounded_and_refuses_what_a_record_cannot_hold(monkeypatch):
    monkeypatch.setattr(records, "_PREFIXES", {})
    monkeypatch.setattr(records, "_PREFIXES_MAX", 3)
    for i in range(10):
        assert records.offset_key_prefix(f"g{i}", "t") == generated_key(1, OffsetCommitKey(f"g{i}", "t", 0))[:-4]
        assert len(records._PREFIXES) <= 3
    with pytest.raises(records.RecordError):
        records.offset_key_prefix("g", "x" * 0x8000)
    with pytest.raises(records.RecordError):  # refused again: never remembered
        records.offset_key_prefix("g", "x" * 0x8000)
    assert ("g", "x" * 0x8000) not in records._PREFIXES
