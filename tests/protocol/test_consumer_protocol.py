"""The embedded consumer protocol (subscription / assignment blobs, int16 version prefix)."""
import struct

import pytest

from protocol import consumer as cp
from protocol.wire import ProtocolError
from tools import construct_codec as cc

SUB_FULL = dict(topics=["orders", "payments"], user_data=b"\x00\x01ud",
                owned_partitions=[cp.SubscriptionTopicPartitions(topic="orders", partitions=[0, 3])],
                generation_id=7, rack_id="rack-a")
ASG_FULL = dict(assigned_partitions=[cp.TopicPartitions(topic="orders", partitions=[0, 1, 2]),
                                     cp.TopicPartitions(topic="payments", partitions=[])],
                user_data=b"sticky")


def _expected_sub(v):
    exp = dict(SUB_FULL)
    if v < 1:
        exp["owned_partitions"] = []
    if v < 2:
        exp["generation_id"] = -1
    if v < 3:
        exp["rack_id"] = None
    return cp.Subscription(**exp)


@pytest.mark.parametrize("v", [0, 1, 2, 3])
def test_subscription_round_trip(v):
    blob = cp.encode_subscription(cp.Subscription(**SUB_FULL), v)
    assert blob[:2] == struct.pack(">h", v)
    version, sub = cp.decode_subscription(blob)
    assert version == v
    assert sub == _expected_sub(v)
    assert cp.encode_subscription(sub, v) == blob
    # the independent codec reads the blob the same way
    cver, cval = cc.parse_versioned("ConsumerProtocolSubscription", blob)
    assert cver == v
    assert cval == cc.project("ConsumerProtocolSubscription", v, _plain(sub))


@pytest.mark.parametrize("v", [0, 1, 2, 3])
def test_assignment_round_trip(v):
    blob = cp.encode_assignment(cp.Assignment(**ASG_FULL), v)
    version, asg = cp.decode_assignment(blob)
    assert version == v
    assert asg == cp.Assignment(**ASG_FULL)
    assert cp.encode_assignment(asg, v) == blob
    assert cc.parse_versioned("ConsumerProtocolAssignment", blob)[1] == _plain(asg)


def test_default_version_is_the_newest():
    assert cp.encode_subscription(cp.Subscription(topics=["t"]))[:2] == b"\x00\x03"
    assert cp.encode_assignment(cp.Assignment())[:2] == b"\x00\x03"


def test_java_client_subscription_bytes():
    # v1 as the Java client writes it: topics ["t1"], null user data, no owned partitions
    blob = b"\x00\x01" + b"\x00\x00\x00\x01\x00\x02t1" + b"\xff\xff\xff\xff" + b"\x00\x00\x00\x00"
    version, sub = cp.decode_subscription(blob)
    assert version == 1
    assert sub.topics == ["t1"] and sub.user_data is None and sub.owned_partitions == []
    assert sub.generation_id == -1 and sub.rack_id is None
    assert cp.encode_subscription(sub, 1) == blob


@pytest.mark.parametrize("future", [4, 5, 32767])
def test_newer_subscription_with_trailing_fields_reads_with_our_newest_schema(future):
    v3 = cp.encode_subscription(cp.Subscription(**SUB_FULL), 3)
    blob = struct.pack(">h", future) + v3[2:] + b"\x00\x00\x00\x2a" + b"\x00\x06future"
    version, sub = cp.decode_subscription(blob)
    assert version == future
    assert sub == cp.Subscription(**SUB_FULL)
    assert cc.parse_versioned("ConsumerProtocolSubscription", blob) == (future, _plain(sub))


def test_newer_assignment_with_trailing_fields_reads_with_our_newest_schema():
    v3 = cp.encode_assignment(cp.Assignment(**ASG_FULL), 3)
    blob = b"\x00\x04" + v3[2:] + b"\x01\x02\x03"
    version, asg = cp.decode_assignment(blob)
    assert version == 4
    assert asg == cp.Assignment(**ASG_FULL)


def test_empty_assignment_blob_is_an_empty_assignment():
    version, asg = cp.decode_assignment(b"")
    assert asg.assigned_partitions == []
    assert asg.user_data is None
    assert asg == cp.Assignment()


def test_minimal_assignment_blob():
    blob = b"\x00\x00" + b"\x00\x00\x00\x00" + b"\xff\xff\xff\xff"
    assert cp.decode_assignment(blob) == (0, cp.Assignment())
    assert cp.encode_assignment(cp.Assignment(), 0) == blob


@pytest.mark.parametrize("blob", [None, b"\x00", b"\x00\x01", b"\xff\xff\x00\x00\x00\x00",
                                  b"\x00\x00\x00\x00\x00\x01"])
def test_malformed_subscriptions(blob):
    with pytest.raises(ProtocolError):
        cp.decode_subscription(blob)


@pytest.mark.parametrize("blob", [None, b"\x00", b"\x00\x00", b"\xff\xfe\x00\x00\x00\x00\xff\xff\xff\xff",
                                  b"\x00\x00\x00\x00\x00\x01\x00"])
def test_malformed_assignments(blob):
    with pytest.raises(ProtocolError):
        cp.decode_assignment(blob)


def test_every_truncation_of_a_blob_raises():
    blob = cp.encode_subscription(cp.Subscription(**SUB_FULL), 3)
    for cut in range(len(blob)):
        with pytest.raises(ProtocolError):
            cp.decode_subscription(blob[:cut])
    blob = cp.encode_assignment(cp.Assignment(**ASG_FULL), 3)
    for cut in range(1, len(blob)):  # cut 0 is the empty blob: an empty assignment
        with pytest.raises(ProtocolError):
            cp.decode_assignment(blob[:cut])


def test_aiokafka_blobs_interoperate():
    """aiokafka (an unmodified third-party client) writes and reads v0 blobs."""
    proto = pytest.importorskip("aiokafka.coordinator.protocol")
    meta = proto.ConsumerProtocolMemberMetadata(0, ["a", "b"], b"ud").encode()
    assert cp.decode_subscription(meta) == (0, cp.Subscription(topics=["a", "b"], user_data=b"ud"))
    blob = cp.encode_assignment(cp.Assignment(**ASG_FULL), 0)
    asg = proto.ConsumerProtocolMemberAssignment.decode(blob)
    assert asg.version == 0
    assert [(topic, list(parts)) for topic, parts in asg.assignment] == [
        ("orders", [0, 1, 2]), ("payments", [])]
    assert asg.user_data == b"sticky"


def _plain(obj):
    out = {n: getattr(obj, n) for n in obj.FIELDS}
    for k, x in out.items():
        if isinstance(x, list) and x and hasattr(x[0], "FIELDS"):
            out[k] = [_plain(e) for e in x]
    return out
