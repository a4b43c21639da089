"""Assignors: Kafka's documented examples, balance and stickiness properties, wire formats, registry."""

from __future__ import annotations

import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from client.assignors import (
    Assignor,
    CooperativeStickyAssignor,
    MemberSubscription,
    RangeAssignor,
    RoundRobinAssignor,
    StickyAssignor,
    create_assignor,
    decode_generation_user_data,
    decode_sticky_user_data,
    encode_generation_user_data,
    encode_sticky_user_data,
    register_assignor,
    registered_assignors,
)
from client.types import TopicPartition as TP

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def subs(*members, topics=("t",), **kw):
    return {mid: MemberSubscription(member_id=mid, topics=list(topics), **kw) for mid in members}


def parts(assignment, member):
    return sorted(tp.partition for tp in assignment[member])


# -- the examples in Kafka's documentation -----------------------------------------------------------


def test_range_docs_example():
    a = RangeAssignor().assign({"t": 10}, subs("c1", "c2", "c3"))
    assert [parts(a, c) for c in ("c1", "c2", "c3")] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]


def test_roundrobin_docs_example():
    a = RoundRobinAssignor().assign({"t": 10}, subs("c1", "c2", "c3"))
    assert [parts(a, c) for c in ("c1", "c2", "c3")] == [[0, 3, 6, 9], [1, 4, 7], [2, 5, 8]]


def _sticky_sub(member, owned, generation=1, topics=("t",)):
    return MemberSubscription(
        member_id=member, topics=list(topics), user_data=encode_sticky_user_data(owned, generation)
    )


def test_sticky_docs_example_consumer_dies():
    # [0-3], [4-6], [7-9]; the third consumer dies: the others keep everything and share its partitions.
    s = {
        "c1": _sticky_sub("c1", [TP("t", p) for p in range(0, 4)]),
        "c2": _sticky_sub("c2", [TP("t", p) for p in range(4, 7)]),
    }
    a = StickyAssignor().assign({"t": 10}, s)
    assert parts(a, "c1") == [0, 1, 2, 3, 7]
    assert parts(a, "c2") == [4, 5, 6, 8, 9]


def test_cooperative_sticky_docs_example_consumer_dies():
    s = {
        "c1": MemberSubscription(
            "c1", ["t"], owned_partitions=[TP("t", p) for p in range(4)], generation_id=1
        ),
        "c2": MemberSubscription(
            "c2", ["t"], owned_partitions=[TP("t", p) for p in range(4, 7)], generation_id=1
        ),
    }
    a = CooperativeStickyAssignor().assign({"t": 10}, s)
    assert parts(a, "c1") == [0, 1, 2, 3, 7] and parts(a, "c2") == [4, 5, 6, 8, 9]


def test_sticky_javadoc_example_1():
    # Four topics of 2 partitions over C0, C1, C2; C1 leaves: C0 and C2 keep everything they had.
    topics = ["t0", "t1", "t2", "t3"]
    counts = {t: 2 for t in topics}
    c0 = [TP("t0", 0), TP("t1", 1), TP("t3", 0)]
    c2 = [TP("t1", 0), TP("t2", 1)]
    s = {"C0": _sticky_sub("C0", c0, topics=topics), "C2": _sticky_sub("C2", c2, topics=topics)}
    a = StickyAssignor().assign(counts, s)
    assert set(c0) <= set(a["C0"]) and set(c2) <= set(a["C2"])
    assert sorted(a["C0"] + a["C2"]) == sorted(TP(t, p) for t in topics for p in range(2))
    assert {len(a["C0"]), len(a["C2"])} == {4}


def test_sticky_javadoc_example_2_unequal_subscriptions():
    counts = {"t0": 1, "t1": 2, "t2": 3}
    s = {
        "C0": MemberSubscription("C0", ["t0"]),
        "C1": MemberSubscription("C1", ["t0", "t1"]),
        "C2": MemberSubscription("C2", ["t0", "t1", "t2"]),
    }
    a = StickyAssignor().assign(counts, s)
    assert sorted(a["C0"]) == [TP("t0", 0)]
    assert sorted(a["C1"]) == [TP("t1", 0), TP("t1", 1)]
    assert sorted(a["C2"]) == [TP("t2", 0), TP("t2", 1), TP("t2", 2)]
    # C0 leaves: C1 gets t0p0, the rest stays put (5 assignments preserved).
    s2 = {
        "C1": _sticky_sub("C1", a["C1"], topics=["t0", "t1"]),
        "C2": _sticky_sub("C2", a["C2"], topics=["t0", "t1", "t2"]),
    }
    b = StickyAssignor().assign(counts, s2)
    assert sorted(b["C1"]) == [TP("t0", 0), TP("t1", 0), TP("t1", 1)]
    assert sorted(b["C2"]) == [TP("t2", 0), TP("t2", 1), TP("t2", 2)]


def test_range_sorts_static_members_by_instance_id():
    s = {
        "m-b": MemberSubscription("m-b", ["t"], group_instance_id="i1"),
        "m-a": MemberSubscription("m-a", ["t"], group_instance_id="i2"),
    }
    a = RangeAssignor().assign({"t": 4}, s)
    assert parts(a, "m-b") == [0, 1] and parts(a, "m-a") == [2, 3]


def test_roundrobin_skips_unsubscribed_members():
    s = {"a": MemberSubscription("a", ["t", "u"]), "b": MemberSubscription("b", ["t"])}
    a = RoundRobinAssignor().assign({"t": 2, "u": 2}, s)
    assert sorted(a["a"]) == [TP("t", 0), TP("u", 0), TP("u", 1)] and sorted(a["b"]) == [TP("t", 1)]


def test_missing_topics_and_empty_groups():
    for cls in (RangeAssignor, RoundRobinAssignor, StickyAssignor, CooperativeStickyAssignor):
        assert cls().assign({}, subs("a", "b")) == {"a": [], "b": []}
        assert cls().assign({"t": 3}, {}) == {}


def test_sticky_highest_generation_wins_a_contested_partition():
    s = {
        "a": _sticky_sub("a", [TP("t", 0), TP("t", 1)], generation=5),
        "b": _sticky_sub("b", [TP("t", 0), TP("t", 2)], generation=4),
    }
    a = StickyAssignor().assign({"t": 4}, s)
    assert TP("t", 0) in a["a"] and TP("t", 1) in a["a"] and TP("t", 2) in a["b"]


# -- properties ---------------------------------------------------------------------------------------


@st.composite
def groups(draw, same_topics=True):
    n_topics = draw(st.integers(1, 3))
    counts = {f"t{i}": draw(st.integers(0, 12)) for i in range(n_topics)}
    n_members = draw(st.integers(1, 6))
    members = [f"m{i:02d}" for i in range(n_members)]
    if same_topics:
        topics = {mm: sorted(counts) for mm in members}
    else:
        topics = {mm: sorted(draw(st.sets(st.sampled_from(sorted(counts)), min_size=1))) for mm in members}
    return counts, topics


def check_valid(counts, topics, result):
    seen = [tp for ps in result.values() for tp in ps]
    assert len(seen) == len(set(seen)), "a partition assigned twice"
    for member, ps in result.items():
        assert all(tp.topic in topics[member] for tp in ps), "assigned an unsubscribed topic"
    wanted = {TP(t, p) for member in topics for t in topics[member] for p in range(counts[t])}
    return wanted, set(seen)


def check_balanced(topics, result):
    """Kafka's definition: no member with 2+ fewer partitions could take one of a bigger member's."""
    for a in result:
        for b in result:
            if len(result[a]) < len(result[b]) - 1:
                assert not any(tp.topic in topics[a] for tp in result[b]), (a, b, result)


@SETTINGS
@given(
    groups(same_topics=False),
    st.sampled_from([RangeAssignor, RoundRobinAssignor, StickyAssignor, CooperativeStickyAssignor]),
)
def test_fresh_assignment_is_complete(group, cls):
    counts, topics = group
    result = cls().assign(counts, {m: MemberSubscription(m, topics[m]) for m in topics})
    wanted, seen = check_valid(counts, topics, result)
    assert seen == wanted


@SETTINGS
@given(groups(same_topics=False), st.sampled_from([StickyAssignor, CooperativeStickyAssignor]))
def test_sticky_fresh_assignment_is_balanced(group, cls):
    counts, topics = group
    result = cls().assign(counts, {m: MemberSubscription(m, topics[m]) for m in topics})
    check_balanced(topics, result)


@SETTINGS
@given(groups(same_topics=True), st.data())
def test_sticky_reassignment_is_balanced_complete_and_sticky(group, data):
    counts, topics = group
    first = StickyAssignor().assign(counts, {m: MemberSubscription(m, topics[m]) for m in topics})
    # Some members leave, some join.
    stay = data.draw(st.sets(st.sampled_from(sorted(topics)))) if topics else set()
    joiners = [f"n{i}" for i in range(data.draw(st.integers(0, 3)))]
    if not stay and not joiners:
        joiners = ["n0"]
    common = next(iter(topics.values()))
    new_topics = {m: common for m in sorted(stay) + joiners}
    s = {
        m: (
            _sticky_sub(m, first[m], generation=1, topics=common)
            if m in stay
            else MemberSubscription(m, common)
        )
        for m in new_topics
    }
    second = StickyAssignor().assign(counts, s)
    wanted, seen = check_valid(counts, new_topics, second)
    assert seen == wanted
    sizes = [len(v) for v in second.values()]
    assert max(sizes) - min(sizes) <= 1
    quota = len(wanted) // len(new_topics)
    for m in stay:  # each survivor keeps min(what it had, the quota)
        kept = len(set(first[m]) & set(second[m]))
        assert kept >= min(len(first[m]), quota)


@SETTINGS
@given(groups(same_topics=False), st.data())
def test_sticky_general_reassignment_is_balanced(group, data):
    counts, topics = group
    first = StickyAssignor().assign(counts, {m: MemberSubscription(m, topics[m]) for m in topics})
    leaving = data.draw(st.sets(st.sampled_from(sorted(topics)), max_size=max(0, len(topics) - 1)))
    s = {m: _sticky_sub(m, first[m], generation=1, topics=topics[m]) for m in topics if m not in leaving}
    s["new"] = MemberSubscription("new", sorted(counts))
    new_topics = {m: s[m].topics for m in s}
    second = StickyAssignor().assign(counts, s)
    wanted, seen = check_valid(counts, new_topics, second)
    assert seen == wanted
    check_balanced(new_topics, second)


@SETTINGS
@given(groups(same_topics=True), st.data())
def test_cooperative_sticky_never_hands_over_an_owned_partition_directly(group, data):
    counts, topics = group
    first = CooperativeStickyAssignor().assign(counts, {m: MemberSubscription(m, topics[m]) for m in topics})
    stay = sorted(data.draw(st.sets(st.sampled_from(sorted(topics)), min_size=1)))
    joiners = [f"n{i}" for i in range(data.draw(st.integers(0, 3)))]
    common = next(iter(topics.values()))
    s = {m: MemberSubscription(m, common, owned_partitions=first[m], generation_id=1) for m in stay}
    s.update({m: MemberSubscription(m, common) for m in joiners})
    owner = {tp: m for m in stay for tp in first[m]}
    second = CooperativeStickyAssignor().assign(counts, s)
    new_topics = {m: common for m in s}
    check_valid(counts, new_topics, second)
    for m, ps in second.items():
        for tp in ps:
            assert owner.get(tp, m) == m, f"{tp} goes from {owner.get(tp)} to {m} in one round"
    # Second round (after the owners revoked what they lost): complete and balanced.
    s2 = {m: MemberSubscription(m, common, owned_partitions=second[m], generation_id=2) for m in s}
    third = CooperativeStickyAssignor().assign(counts, s2)
    wanted, seen = check_valid(counts, new_topics, third)
    assert seen == wanted
    sizes = [len(v) for v in third.values()]
    assert max(sizes) - min(sizes) <= 1


# -- wire formats -------------------------------------------------------------------------------------


def test_sticky_user_data_v1_bytes_as_java_writes_them():
    data = encode_sticky_user_data([TP("t", 2), TP("t", 0), TP("ab", 1)], 7)
    expected = (
        struct.pack(">i", 2)
        + struct.pack(">h", 2)
        + b"ab"
        + struct.pack(">i", 1)
        + struct.pack(">i", 1)
        + struct.pack(">h", 1)
        + b"t"
        + struct.pack(">i", 2)
        + struct.pack(">ii", 0, 2)
        + struct.pack(">i", 7)
    )
    assert data == expected
    assert decode_sticky_user_data(data) == ([TP("ab", 1), TP("t", 0), TP("t", 2)], 7)


def test_sticky_user_data_v0_has_no_generation():
    v0 = encode_sticky_user_data([TP("t", 1)], None)
    assert decode_sticky_user_data(v0) == ([TP("t", 1)], None)


@pytest.mark.parametrize("junk", [b"", b"\x00", b"\xff\xff\xff\xff", b"\x00\x00\x00\x05\x00", None])
def test_sticky_user_data_garbage_reads_as_nothing(junk):
    assert decode_sticky_user_data(junk) == ([], None)


def test_cooperative_user_data_is_int32_generation():
    assert encode_generation_user_data(5) == b"\x00\x00\x00\x05"
    assert decode_generation_user_data(b"\x00\x00\x00\x05") == 5
    assert decode_generation_user_data(b"\x01") == -1
    assert decode_generation_user_data(None) is None


def test_sticky_subscription_user_data_follows_assignment():
    a = StickyAssignor()
    assert a.subscription_user_data(["t"]) is None
    a.on_assignment([TP("t", 1)], None, 4)
    assert decode_sticky_user_data(a.subscription_user_data(["t"])) == ([TP("t", 1)], 4)


@SETTINGS
@given(
    st.lists(st.tuples(st.text(min_size=1, max_size=5), st.integers(0, 1000)), unique=True),
    st.one_of(st.none(), st.integers(-1, 2**31 - 1)),
)
def test_sticky_user_data_roundtrip(pairs, generation):
    tps = [TP(t, p) for t, p in pairs]
    got, gen = decode_sticky_user_data(encode_sticky_user_data(tps, generation))
    assert sorted(got) == sorted(tps) and gen == generation


# -- registry -------------------------------------------------------------------------------------------


def test_registry_has_kafka_names():
    assert {"range", "roundrobin", "sticky", "cooperative-sticky"} <= set(registered_assignors())
    assert isinstance(create_assignor("cooperative-sticky"), CooperativeStickyAssignor)
    assert create_assignor("sticky") is not create_assignor("sticky")  # fresh state per consumer
    with pytest.raises(ValueError):
        create_assignor("nope")


def test_custom_assignor_registers_and_runs():
    class Everything(Assignor):
        name = "everything-to-first"

        def assign(self, partitions_per_topic, subscriptions):
            first = sorted(subscriptions)[0]
            return {
                m: (
                    [TP(t, p) for t, n in partitions_per_topic.items() for p in range(n)]
                    if m == first
                    else []
                )
                for m in subscriptions
            }

    register_assignor(Everything)
    a = create_assignor("everything-to-first")
    assert a.assign({"t": 2}, subs("x", "y")) == {"x": [TP("t", 0), TP("t", 1)], "y": []}
    inst = Everything()
    assert create_assignor(inst) is inst
