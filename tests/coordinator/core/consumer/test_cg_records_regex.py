"""Consumer-group records (bytes round trip, tombstones, damage) and the regex subset."""
import pytest

from coordinator.core.consumer import records as cr
from coordinator.core.consumer.group import Member
from coordinator.core.consumer.regex import InvalidRegex, compile_subscription, matching
from coordinator.core.records import RecordError
from coordinator.core.records import decode_key as classic_decode_key

T1, T2 = b"\x01" * 16, b"\x02" * 16


def test_every_record_type_round_trips():
    m = Member("m1")
    m.instance_id, m.rack_id, m.client_id, m.client_host = "i", "r", "cid", "/1.2.3.4"
    m.subscribed_topic_names, m.subscribed_topic_regex = ("a", "b"), "x.*"
    m.rebalance_timeout_ms, m.server_assignor = 30000, "range"
    cases = [
        (cr.group_epoch_key("g"), cr.group_epoch_value(7), cr.GROUP_EPOCH, None, {"epoch": 7}),
        (cr.partition_metadata_key("g"), cr.partition_metadata_value({"a": (T1, 3)}), cr.PARTITION_METADATA,
         None, {"topics": [{"topic_id": T1, "topic_name": "a", "num_partitions": 3, "partition_metadata": []}]}),
        (cr.member_metadata_key("g", "m1"), cr.member_metadata_value(m), cr.MEMBER_METADATA, "m1",
         {"instance_id": "i", "rack_id": "r", "client_id": "cid", "client_host": "/1.2.3.4",
          "subscribed_topic_names": ["a", "b"], "subscribed_topic_regex": "x.*", "rebalance_timeout_ms": 30000,
          "server_assignor": "range"}),
        (cr.target_metadata_key("g"), cr.target_metadata_value(6), cr.TARGET_METADATA, None,
         {"assignment_epoch": 6}),
        (cr.target_member_key("g", "m1"), cr.target_member_value({T2: frozenset({3, 1}), T1: frozenset({0})}),
         cr.TARGET_MEMBER, "m1",
         {"topic_partitions": [{"topic_id": T1, "partitions": [0]}, {"topic_id": T2, "partitions": [1, 3]}]}),
        (cr.current_assignment_key("g", "m1"),
         cr.current_assignment_value(5, 4, 1, {T1: frozenset({0})}, {T2: frozenset({2})}), cr.CURRENT_ASSIGNMENT,
         "m1", {"member_epoch": 5, "previous_member_epoch": 4, "state": 1,
                "assigned_partitions": [{"topic_id": T1, "partitions": [0]}],
                "partitions_pending_revocation": [{"topic_id": T2, "partitions": [2]}]}),
    ]
    for key, value, rtype, mid, fields in cases:
        assert cr.is_consumer_record(key)
        got_type, gid, got_mid, v = cr.decode(key, value)
        assert (got_type, gid, got_mid) == (rtype, "g", mid)
        got = v.to_dict()
        got.pop("classic_member_metadata", None)  # tagged, never written by herd
        assert got == fields
        assert cr.decode(key, None) == (rtype, "g", mid, None)
        # the key starts with Kafka's record type, and the classic decoder skips it
        assert key[:2] == rtype.to_bytes(2, "big")
        assert classic_decode_key(key) == (rtype, None)


def test_damaged_records_raise_record_error():
    key = cr.current_assignment_key("g", "m")
    value = cr.current_assignment_value(1, 0, 0, {T1: frozenset({0})}, {})
    for bad_key, bad_value in [(key[:5], value), (key, value[:7]), (key, b"\x00"), (b"\x00\x63\x00", value),
                               (b"", value), (key, b"\xff\xff" + value[2:])]:
        with pytest.raises(RecordError):
            cr.decode(bad_key, bad_value)


@pytest.mark.parametrize("pattern,names,expected", [
    ("orders-.*", ["orders-1", "orders-", "xorders-1"], {"orders-1", "orders-"}),
    (r"t\d+", ["t1", "t12", "t1a"], {"t1", "t12"}),
    ("(?i)ORDERS", ["orders", "Orders"], {"orders", "Orders"}),
    ("a|b", ["a", "b", "ab"], {"a", "b"}),
    ("(?:eu|us)\\.orders", ["eu.orders", "us.orders", "euXorders"], {"eu.orders", "us.orders"}),
    ("[a-c]{2,3}", ["ab", "abc", "abcd", "ad"], {"ab", "abc"}),
])
def test_accepted_patterns_match_whole_names(pattern, names, expected):
    assert matching(pattern, names) == expected


@pytest.mark.parametrize("pattern", [
    "(a)\\1", "(?P<x>a)(?P=x)", "a(?=b)", "a(?!b)", "(?<=a)b", "(?<!a)b", "(?>a)", "a*+", "(a)?(?(1)b|c)",
    "(a+)+", "(a*)*b", "(a|aa)*", "(?:a|a){0,300}b", ".*a.*b.*c.*d", "\\pL", "[[:alpha:]]", "a\\z",
    "(unclosed", "*", "a" * 2000,
])
def test_rejected_patterns(pattern):
    with pytest.raises(InvalidRegex):
        compile_subscription(pattern)
