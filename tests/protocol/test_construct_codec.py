"""The construct codec's public API (used by tools/logdump for __consumer_offsets records)."""
import struct

import pytest

from protocol import messages as m
from tools import construct_codec as cc


def test_record_types_follow_the_key_schema_versions():
    types = cc.record_types()
    assert types[0] == types[1] == ("OffsetCommitKey", "OffsetCommitValue")
    assert types[2] == ("GroupMetadataKey", "GroupMetadataValue")
    assert types[3] == ("ConsumerGroupMetadataKey", "ConsumerGroupMetadataValue")
    assert types[8] == ("ConsumerGroupCurrentMemberAssignmentKey",
                        "ConsumerGroupCurrentMemberAssignmentValue")
    assert set(types) == set(range(9))


def test_offset_commit_record_as_the_java_coordinator_writes_it():
    key = m.OffsetCommitKey(group="g", topic="orders", partition=3)
    value = m.OffsetCommitValue(offset=1234, leader_epoch=5, metadata="", commit_timestamp=1_700_000_000_000)
    key_bytes = struct.pack(">h", 1) + key.encode(1)
    value_bytes = struct.pack(">h", 3) + value.encode(3)
    rec = cc.parse_offsets_record(key_bytes, value_bytes)
    assert rec["type"] == 1 and rec["key_schema"] == "OffsetCommitKey"
    assert rec["key"] == {"group": "g", "topic": "orders", "partition": 3}
    assert rec["value_version"] == 3
    assert rec["value"]["offset"] == 1234 and rec["value"]["leader_epoch"] == 5
    assert rec["value"]["expire_timestamp"] == -1  # v1 only: its default


def test_tombstone_and_unknown_types():
    key_bytes = struct.pack(">h", 2) + m.GroupMetadataKey(group="g").encode(2)
    assert cc.parse_offsets_record(key_bytes, None)["value"] is None
    share = cc.parse_offsets_record(b"\x00\x09raw", b"\x00\x00v")  # ShareGroup* types are not ours
    assert share["key_schema"] is None and share["key"] == b"raw" and share["value"] == b"\x00\x00v"
    with pytest.raises(cc.KafkaConstructError):
        cc.parse_offsets_record(b"\x00", None)


def test_group_metadata_value_newer_than_the_schema():
    value = m.GroupMetadataValue(protocol_type="consumer", generation=3, protocol="range", leader="a",
                                 current_state_timestamp=5, members=[])
    newest = m.GroupMetadataValue.MAX_VERSION
    blob = struct.pack(">h", newest + 1) + value.encode(newest) + b"\x00\x07future"
    version, parsed = cc.parse_versioned("GroupMetadataValue", blob)
    assert version == newest + 1
    assert parsed == cc.project("GroupMetadataValue", newest, parsed)
    assert parsed["leader"] == "a" and parsed["generation"] == 3


def test_build_fills_missing_keys_with_defaults_and_checks_versions():
    data = cc.build_bytes("HeartbeatRequest", 4, {"group_id": "g", "member_id": "m"})
    assert data == m.HeartbeatRequest(group_id="g", member_id="m").encode(4)
    with pytest.raises(cc.KafkaConstructError):
        cc.build_bytes("HeartbeatRequest", 9, {})
    with pytest.raises(cc.KafkaConstructError):
        cc.build_bytes("HeartbeatRequest", 0, {"group_instance_id": "static"})  # v3+ only
    with pytest.raises(cc.KafkaConstructError):
        cc.build_bytes("HeartbeatRequest", 4, {"group_id": None})
    with pytest.raises(cc.KafkaConstructError):
        cc.parse("HeartbeatRequest", 4, data + b"\x00")  # exact by default
    assert cc.parse("HeartbeatRequest", 4, data + b"\x00", exact=False)["group_id"] == "g"


def test_defaults():
    d = cc.defaults("JoinGroupRequest")
    assert d["rebalance_timeout_ms"] == -1 and d["group_instance_id"] is None and d["protocols"] == []
    assert cc.defaults("ConsumerProtocolSubscription")["generation_id"] == -1
    assert cc.defaults("FetchResponse", "FetchResponseEpochEndOffset") == {"epoch": -1, "end_offset": -1}


def test_compiled_is_cached_and_equivalent():
    assert cc.compiled("HeartbeatRequest", 4) is cc.compiled("HeartbeatRequest", 4)
    data = m.HeartbeatRequest(group_id="g", generation_id=1, member_id="m").encode(4)
    assert cc.compiled("HeartbeatRequest", 4).parse(data) == cc.parse("HeartbeatRequest", 4, data)
