"""Differential tests: herd's generated codec against the independent construct codec
(``tools/construct_codec.py``, built from SCHEMA and the spec's encoding rules) for every
(message, version):

* bytes from the generated encoder parse with the construct codec to the same field values;
* bytes built by the construct codec are identical to the generated encoder's, decode with the
  generated decoder to the same values, and re-encode to identical bytes.
"""
from hypothesis import given, settings
from hypothesis import strategies as st

from tools import construct_codec as cc


def check_both_ways(kit, name, v, value):
    expected = cc.project(name, v, value)
    herd_bytes = kit.to_obj(name, value).encode(v)
    assert cc.parse(name, v, herd_bytes) == expected, "construct reads herd's bytes differently"
    construct_bytes = cc.build_bytes(name, v, value)
    assert construct_bytes == herd_bytes, "the two encoders disagree"
    back, end = kit.cls(name).decode_from(construct_bytes, 0, v)
    assert end == len(construct_bytes)
    assert kit.to_plain(back) == expected, "herd reads construct's bytes differently"
    assert back.encode(v) == construct_bytes


def test_differential_rich(kit, msg_version):
    name, v = msg_version
    check_both_ways(kit, name, v, kit.rich(name, v))


def test_differential_sparse(kit, msg_version):
    name, v = msg_version
    check_both_ways(kit, name, v, kit.sparse(name, v))


@settings(settings.get_profile("herd-protocol-light"))
@given(data=st.data())
def test_differential_generated(kit, msg_version, data):
    name, v = msg_version
    check_both_ways(kit, name, v, data.draw(kit.strategy(name, v), label="value"))


def test_compiled_construct_agrees(kit, msg_version):
    """The construct-compiled codec (the benchmark's baseline) parses and builds like the
    interpreted one, on well-formed input."""
    name, v = msg_version
    value = cc.project(name, v, kit.rich(name, v))
    data = cc.build_bytes(name, v, value)
    comp = cc.compiled(name, v)
    assert comp.parse(data) == value
    assert comp.build(value) == data


def test_oracle_writes_kafkas_null_struct_marker():
    """The oracle follows Kafka: a null non-tagged nullable struct is int8 -1 even in flexible
    versions (Kafka's NullableStructMessage test schema; e.g. DescribeTopicPartitionsRequest.Cursor)."""
    value = cc.defaults("ConsumerGroupHeartbeatResponse")
    assert value["assignment"] is None
    # throttle(4) error(2) error_message(null) member_id(null) epoch(4) interval(4) marker, tags
    value.update(member_id=None, error_message=None)
    java = cc.build_bytes("ConsumerGroupHeartbeatResponse", 0, value)
    assert java == bytes(6) + b"\x00\x00" + bytes(8) + b"\xff" + b"\x00"
    assert cc.parse("ConsumerGroupHeartbeatResponse", 0, java)["assignment"] is None


def test_null_struct_marker_is_int8_minus_one():
    from protocol.messages import ConsumerGroupHeartbeatResponse as R
    java = bytes(6) + b"\x00\x00" + bytes(8) + b"\xff" + b"\x00"
    assert R(assignment=None, member_id=None).encode(0) == java
    assert R.decode(java, 0).assignment is None


def test_json_null_default_of_a_struct_is_an_empty_struct():
    from protocol.messages import ConsumerGroupMemberMetadataValue as V
    from protocol.messages import ConsumerGroupMemberMetadataValueClassicMemberMetadata as Classic
    assert V().classic_member_metadata == Classic()
    # a null ClassicMemberMetadata is written explicitly: 1 tagged field, tag 0, size 1, marker 0
    assert V(classic_member_metadata=None).encode(0).endswith(b"\x01\x00\x01\x00")
