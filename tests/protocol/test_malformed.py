"""Malformed input raises ProtocolError and only ProtocolError; impossible values raise EncodeError.

Decoding is hostile-input code: every truncation, byte flip, huge count or bad tagged-field size
must end in ``ProtocolError`` (never struct.error, IndexError, UnicodeDecodeError, MemoryError),
and must not allocate in proportion to a claimed length.
"""
import random
import struct
import tracemalloc
import zlib

import pytest

from protocol import messages as m
from protocol.wire import EncodeError, ProtocolError
from tools import construct_codec as cc

ALLOC_LIMIT = 1 << 20  # bytes a decode of a < 4 KiB input may allocate at its peak


def _decode_outcome(cls, data, v):
    """Decode; return the object or the ProtocolError. Anything else propagates (test fails)."""
    try:
        return cls.decode(data, v)
    except ProtocolError as exc:
        return exc


def _seed(name, v):
    return zlib.crc32(f"{name}/{v}".encode())


# ------------------------------------------------------------------------------------------------
# truncation and random corruption, every (message, version)
# ------------------------------------------------------------------------------------------------

def test_every_truncation_raises_protocol_error(kit, msg_version):
    name, v = msg_version
    cls = kit.cls(name)
    data = kit.to_obj(name, kit.rich(name, v)).encode(v)
    assert cls.decode(data, v) is not None
    for cut in range(len(data)):
        with pytest.raises(ProtocolError):
            cls.decode(data[:cut], v)
        # decode_from at an offset sees the same truncation
        with pytest.raises(ProtocolError):
            cls.decode_from(b"\x00\x00\x00" + data[:cut], 3, v)


def test_random_byte_flips_raise_only_protocol_error(kit, msg_version):
    name, v = msg_version
    cls = kit.cls(name)
    data = kit.to_obj(name, kit.rich(name, v)).encode(v)
    rnd = random.Random(_seed(name, v))
    for _ in range(60):
        if data:
            buf = bytearray(data)
            for _ in range(rnd.randint(1, 3)):
                buf[rnd.randrange(len(buf))] ^= rnd.randint(1, 255)
        else:  # a message with no fields at this version: any input decodes (trailing bytes ignored)
            buf = bytearray(rnd.randbytes(rnd.randrange(8)))
        if rnd.random() < 0.3:  # and sometimes also cut or extend
            buf = buf[: rnd.randrange(len(buf) + 1)] if rnd.random() < 0.5 else buf + bytes(rnd.randrange(8))
        out = _decode_outcome(cls, bytes(buf), v)
        if isinstance(out, ProtocolError):
            continue
        # whatever decoded is a value the encoder accepts (or refuses with EncodeError, e.g. a
        # duplicated unknown tag), and that decodes again
        try:
            again = out.encode(v)
        except EncodeError:
            continue
        assert cls.decode(again, v) is not None


def test_length_overwrites_are_bounded(kit, msg_version):
    """Overwrite every offset of an encoding with the largest int32 count/length and the largest
    5-byte unsigned varint: each decode fails with ProtocolError (or decodes) without allocating
    anything like the claimed size."""
    name, v = msg_version
    cls = kit.cls(name)
    data = kit.to_obj(name, kit.rich(name, v, unknown=False, n=1)).encode(v)
    # the int32 patch also puts an int16 length of 0x7fff at each offset
    patches = (b"\x7f\xff\xff\xff", b"\xff\xff\xff\xff\x0f")
    tracemalloc.start()
    try:
        for i in range(len(data)):
            for patch in patches:
                buf = data[:i] + patch + data[i + len(patch):]
                tracemalloc.reset_peak()
                base = tracemalloc.get_traced_memory()[0]
                _decode_outcome(cls, buf, v)
                peak = tracemalloc.get_traced_memory()[1] - base
                assert peak < ALLOC_LIMIT, f"offset {i} patch {patch.hex()}: {peak} bytes"
    finally:
        tracemalloc.stop()


def test_construct_codec_also_rejects_truncations(kit):
    """The oracle is only useful if it is strict too (spot check on a few rich messages)."""
    for name, v in [("JoinGroupRequest", 9), ("OffsetCommitRequest", 8), ("ApiVersionsResponse", 3),
                    ("FetchResponse", 16), ("GroupMetadataValue", 4)]:
        data = cc.build_bytes(name, v, kit.rich(name, v))
        for cut in range(len(data)):
            with pytest.raises(cc.KafkaConstructError):
                cc.parse(name, v, data[:cut])


# ------------------------------------------------------------------------------------------------
# hostile counts and lengths
# ------------------------------------------------------------------------------------------------

HUGE = [
    # (message, version, bytes, what)
    ("OffsetCommitRequest", 0, b"\x00\x01g" + b"\x7f\xff\xff\xff", "int32 array count 0x7fffffff"),
    ("OffsetCommitRequest", 0, b"\x00\x01g" + b"\x80\x00\x00\x00", "int32 array count -2^31 (null)"),
    ("ConsumerProtocolAssignment", 0, b"\x00\x00\x00\x01\x00\x01t" + b"\x7f\xff\xff\xff",
     "[]int32 count 0x7fffffff"),
    ("ListGroupsRequest", 4, b"\xff\xff\xff\xff\x0f\x00", "compact array count 0xfffffffe"),
    ("ListGroupsRequest", 4, b"\xff\xff\xff\xff\x7f\x00", "uvarint over 32 bits"),
    ("ListGroupsRequest", 4, b"\xff\xff\xff\xff\xff\x01", "uvarint longer than 5 bytes"),
    ("ListGroupsRequest", 4, b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01", "11-byte uvarint"),
    ("HeartbeatRequest", 4, b"\xff\xff\xff\xff\x0f", "compact string length 0xfffffffe"),
    ("HeartbeatRequest", 4, b"\x81\x80\x02" + b"x" * 40, "compact string length 32768"),
    ("HeartbeatRequest", 0, b"\x7f\xff", "int16 string length 0x7fff, no data"),
    ("HeartbeatRequest", 0, b"\xff\xfe", "int16 string length -2 in a non-nullable string"),
    ("SaslAuthenticateRequest", 0, b"\x7f\xff\xff\xff", "int32 bytes length 0x7fffffff"),
    ("SaslAuthenticateRequest", 0, b"\xff\xff\xff\xff", "null in non-nullable bytes"),
    ("SaslAuthenticateRequest", 2, b"\xff\xff\xff\xff\x0f\x00", "compact bytes length 0xfffffffe"),
    ("HeartbeatRequest", 4, b"\x02g\x00\x00\x00\x01\x02m\x00" + b"\xff\xff\xff\xff\x0f",
     "tagged field count 0xffffffff"),
    ("HeartbeatRequest", 4, b"\x02g\x00\x00\x00\x01\x02m\x00" + b"\x01\x05\xff\xff\xff\xff\x0f",
     "tagged field size 0xffffffff"),
    ("ApiVersionsResponse", 3, b"\x00\x00\x01\x00\x00\x00\x00" + b"\xff\xff\xff\xff\x0f",
     "tagged count 0xffffffff where known tags exist"),
    ("ApiVersionsResponse", 3, b"\x00\x00\x01\x00\x00\x00\x00" + b"\x01\x00\xff\xff\xff\xff\x0f",
     "known tag with size 0xffffffff"),
    ("HeartbeatRequest", 0, b"\x00\x02\xc3\x28" + b"\x00\x00\x00\x01\x00\x00", "invalid UTF-8"),
    ("HeartbeatRequest", 4, b"", "empty body"),
]


@pytest.mark.parametrize("name,v,data,what", HUGE, ids=[h[3] for h in HUGE])
def test_hostile_lengths_raise_protocol_error_without_allocating(name, v, data, what):
    cls = getattr(m, name)
    tracemalloc.start()
    try:
        with pytest.raises(ProtocolError):
            cls.decode(data, v)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < ALLOC_LIMIT, f"{what}: peak allocation {peak} bytes"
    with pytest.raises(cc.KafkaConstructError):
        cc.parse(name, v, data)


def test_wrong_version_is_a_protocol_error():
    with pytest.raises(ProtocolError):
        m.HeartbeatRequest.decode(b"\x00" * 32, 99)
    with pytest.raises(ProtocolError):
        m.HeartbeatRequest.decode(b"\x00" * 32, -1)
    with pytest.raises(EncodeError):
        m.HeartbeatRequest(group_id="g", member_id="m").encode(99)


# ------------------------------------------------------------------------------------------------
# tagged fields
# ------------------------------------------------------------------------------------------------

def _api_versions_v3_with_epoch():
    r = m.ApiVersionsResponse(error_code=0, api_keys=[], throttle_time_ms=0, finalized_features_epoch=9)
    data = r.encode(3)
    section = b"\x01\x01\x08" + struct.pack(">q", 9)
    assert data.endswith(section)
    return data, len(data) - len(section)


def test_known_tagged_field_smaller_than_its_value():
    data, at = _api_versions_v3_with_epoch()
    bad = data[: at + 2] + b"\x04" + data[at + 3:]  # int64 in a 4-byte tagged field
    with pytest.raises(ProtocolError):
        m.ApiVersionsResponse.decode(bad, 3)
    with pytest.raises(cc.KafkaConstructError):
        cc.parse("ApiVersionsResponse", 3, bad)


def test_known_tagged_field_past_the_end():
    data, at = _api_versions_v3_with_epoch()
    bad = data[: at + 2] + b"\x40" + data[at + 3:]
    with pytest.raises(ProtocolError):
        m.ApiVersionsResponse.decode(bad, 3)


def test_tagged_count_larger_than_the_fields_present():
    data, at = _api_versions_v3_with_epoch()
    bad = data[:at] + b"\x02" + data[at + 1:]
    with pytest.raises(ProtocolError):
        m.ApiVersionsResponse.decode(bad, 3)


def _fetch_v12_with_nested_unknown_tag():
    epoch = m.FetchResponseEpochEndOffset(epoch=1, end_offset=2, unknown_tagged_fields=[(7, b"xy")])
    part = m.FetchResponsePartitionData(partition_index=0, records=b"", diverging_epoch=epoch)
    topic = m.FetchResponseFetchableTopicResponse(topic="t", partitions=[part])
    data = m.FetchResponse(responses=[topic]).encode(12)
    inner = struct.pack(">iq", 1, 2) + b"\x01\x07\x02xy"
    outer = b"\x00" + bytes([len(inner)]) + inner  # tag 0 (diverging_epoch), size
    at = data.index(outer)
    return data, at


def test_nested_tagged_field_overruns_the_enclosing_tagged_field():
    data, at = _fetch_v12_with_nested_unknown_tag()
    back = m.FetchResponse.decode(data, 12)
    assert back.responses[0].partitions[0].diverging_epoch.unknown_tagged_fields == [(7, b"xy")]
    inner_size_at = at + 2 + 12 + 2  # tag, size, epoch+offset, inner count, inner tag
    assert data[inner_size_at] == 2
    # the inner field claims 5 bytes: they exist in the buffer but lie outside the outer field
    bad = data[:inner_size_at] + b"\x05" + data[inner_size_at + 1:]
    with pytest.raises(ProtocolError):
        m.FetchResponse.decode(bad, 12)
    with pytest.raises(cc.KafkaConstructError):
        cc.parse("FetchResponse", 12, bad)
    # the outer field claims fewer bytes than its struct needs
    bad = data[: at + 1] + bytes([data[at + 1] - 3]) + data[at + 2:]
    with pytest.raises(ProtocolError):
        m.FetchResponse.decode(bad, 12)


def test_unknown_tag_in_array_element_past_the_end():
    req = m.JoinGroupRequest(group_id="g", session_timeout_ms=1, member_id="", protocol_type="consumer",
                             protocols=[m.JoinGroupRequestProtocol(name="range", metadata=b"md",
                                                                   unknown_tagged_fields=[(9, b"zz")])])
    data = req.encode(6)
    at = data.index(b"\x01\x09\x02zz")
    bad = data[: at + 2] + b"\x70" + data[at + 3:]
    with pytest.raises(ProtocolError):
        m.JoinGroupRequest.decode(bad, 6)


def test_unknown_tagged_fields_are_preserved_byte_identically():
    """Bytes written by the independent codec, with unknown tags (1- and multi-byte tags and sizes)
    at the top level, in array elements and between known tags, survive decode + encode."""
    big = bytes(range(256)) * 2
    cases = [
        ("JoinGroupRequest", 7, {
            "group_id": "g", "session_timeout_ms": 10, "rebalance_timeout_ms": 20, "member_id": "m",
            "group_instance_id": None, "protocol_type": "consumer",
            "protocols": [{"name": "range", "metadata": b"\x00\x03",
                           cc.UNKNOWN_TAGS: [(0, b""), (127, b"a"), (128, big)]}],
            cc.UNKNOWN_TAGS: [(5, b"five"), (100000, b"x" * 300), (0xFFFFFFFF, b"max")],
        }),
        ("ApiVersionsResponse", 3, {
            "error_code": 0, "api_keys": [{"api_key": 18, "min_version": 0, "max_version": 4,
                                           cc.UNKNOWN_TAGS: [(1, b"k")]}],
            "throttle_time_ms": 0, "finalized_features_epoch": 3, "zk_migration_ready": True,
            cc.UNKNOWN_TAGS: [(2000, b"after-known")],  # known tags 1 and 3 come before it
        }),
        ("ConsumerGroupHeartbeatRequest", 0, {
            "group_id": "g", "member_id": "m", "member_epoch": 0, "subscribed_topic_names": ["t"],
            cc.UNKNOWN_TAGS: [(4, b"\x00" * 200)],
        }),
    ]
    for name, v, value in cases:
        data = cc.build_bytes(name, v, value)
        cls = getattr(m, name)
        obj = cls.decode(data, v)
        assert obj.encode(v) == data, name
        assert cc.parse(name, v, obj.encode(v)) == cc.project(name, v, value)


def test_unsorted_unknown_tags_are_accepted_and_written_sorted():
    data = m.HeartbeatRequest(group_id="g", member_id="m").encode(4)[:-1]
    raw = data + b"\x02" + b"\x09\x01a" + b"\x03\x01b"  # tags 9 then 3
    obj = m.HeartbeatRequest.decode(raw, 4)
    assert sorted(obj.unknown_tagged_fields) == [(3, b"b"), (9, b"a")]
    assert obj.encode(4) == data + b"\x02" + b"\x03\x01b" + b"\x09\x01a"


def test_duplicate_unknown_tag_cannot_be_encoded():
    obj = m.HeartbeatRequest(group_id="g", member_id="m", unknown_tagged_fields=[(3, b"a"), (3, b"b")])
    with pytest.raises(EncodeError):
        obj.encode(4)


# ------------------------------------------------------------------------------------------------
# EncodeError: values a version cannot carry
# ------------------------------------------------------------------------------------------------

def _field(name, py, struct=None):
    return next(f for f in cc.struct_fields(struct or name) if f["py"] == py)


def test_non_ignorable_field_missing_from_the_version_raises():
    f = _field("JoinGroupRequest", "group_instance_id")
    assert f["versions"][0] == 5 and not f["ignorable"]
    req = m.JoinGroupRequest(group_id="g", session_timeout_ms=1, member_id="m", protocol_type="consumer",
                             group_instance_id="static-1")
    with pytest.raises(EncodeError):
        req.encode(4)
    assert m.JoinGroupRequest.decode(req.encode(5), 5).group_instance_id == "static-1"
    with pytest.raises(cc.KafkaConstructError):
        cc.build_bytes("JoinGroupRequest", 4, {"group_instance_id": "static-1"})


def test_ignorable_field_missing_from_the_version_is_dropped():
    f = _field("JoinGroupRequest", "reason")
    assert f["versions"][0] == 8 and f["ignorable"]
    kw = dict(group_id="g", session_timeout_ms=1, member_id="m", protocol_type="consumer")
    with_reason = m.JoinGroupRequest(reason="rolling restart", **kw).encode(7)
    assert with_reason == m.JoinGroupRequest(**kw).encode(7)
    assert m.JoinGroupRequest.decode(with_reason, 7).reason is None


def test_every_absent_field_follows_the_ignorable_rule(kit, msg_version):
    """For each top-level field the version lacks: a non-default value raises EncodeError unless
    the field is ignorable, in which case it is dropped (in both codecs)."""
    name, v = msg_version
    base = cc.project(name, v, kit.rich(name, v))
    expected = kit.to_obj(name, base).encode(v)
    for f in kit.fields(name):
        if cc.present_in(f, v):
            continue
        value = dict(base)
        value[f["py"]] = kit.rich_value(f)
        assert value[f["py"]] != cc.default_of(f)
        if f["ignorable"]:
            assert kit.to_obj(name, value).encode(v) == expected, f["py"]
            assert cc.build_bytes(name, v, value) == expected, f["py"]
        else:
            with pytest.raises(EncodeError):
                kit.to_obj(name, value).encode(v)
            with pytest.raises(cc.KafkaConstructError):
                cc.build_bytes(name, v, value)


@pytest.mark.parametrize("kwargs,v", [
    ({"group_id": None}, 5),
    ({"member_id": None}, 0),
    ({"protocol_type": None}, 6),
    ({"protocols": None}, 6),
    ({"protocols": [m.JoinGroupRequestProtocol(name=None)]}, 1),
    ({"protocols": [m.JoinGroupRequestProtocol(name="r", metadata=None)]}, 7),
    ({"session_timeout_ms": 1 << 31}, 3),
    ({"session_timeout_ms": "soon"}, 3),
    ({"group_id": "x" * 40000}, 6),
    ({"group_id": "x" * 40000}, 5),
    ({"group_instance_id": None, "unknown_tagged_fields": [(1, b"a"), (1, b"b")]}, 6),
])
def test_impossible_values_raise_encode_error(kwargs, v):
    base = dict(group_id="g", session_timeout_ms=1, member_id="m", protocol_type="consumer")
    base.update(kwargs)
    with pytest.raises(EncodeError):
        m.JoinGroupRequest(**base).encode(v)


def test_null_in_non_nullable_struct_raises_encode_error():
    part = m.FetchResponsePartitionData(partition_index=0, records=b"", diverging_epoch=None)
    with pytest.raises(EncodeError):
        m.FetchResponse(responses=[m.FetchResponseFetchableTopicResponse(partitions=[part])]).encode(12)
