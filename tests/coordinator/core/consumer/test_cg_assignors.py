"""The server-side assignors as pure functions: completeness, balance, stickiness, determinism."""
from hypothesis import given, settings
from hypothesis import strategies as st

from coordinator.core.consumer.assignors import MemberSubscription, range_assign, uniform


def tids(n):
    return [bytes([i]) * 16 for i in range(n)]


def owners(result):
    out = {}
    for mid, a in result.items():
        for tid, ps in a.items():
            for p in ps:
                assert (tid, p) not in out, f"{tid.hex()[:4]}/{p} given to {out[(tid, p)]} and {mid}"
                out[(tid, p)] = mid
    return out


def count(result, mid):
    return sum(len(ps) for ps in result[mid].values())


def check_complete(members, topics, result):
    """Every partition of a subscribed topic goes to exactly one member subscribed to it."""
    assert set(result) == set(members)
    own = owners(result)
    wanted = {(t, p) for m in members.values() for t in m.topic_ids if t in topics for p in range(topics[t])}
    assert set(own) == wanted
    for (t, _), mid in own.items():
        assert t in members[mid].topic_ids


homogeneous = st.tuples(
    st.integers(1, 30),  # members
    st.lists(st.integers(1, 40), min_size=1, max_size=4),  # partitions per topic
)


@settings(max_examples=150, deadline=None)
@given(homogeneous)
def test_uniform_homogeneous_is_complete_and_balanced_within_one(spec):
    n, sizes = spec
    topics = dict(zip(tids(len(sizes)), sizes, strict=True))
    members = {f"m{i:02d}": MemberSubscription(frozenset(topics)) for i in range(n)}
    result = uniform(members, topics, {})
    check_complete(members, topics, result)
    counts = [count(result, m) for m in members]
    assert max(counts) - min(counts) <= 1
    assert uniform(members, topics, {}) == result  # deterministic


@settings(max_examples=150, deadline=None)
@given(homogeneous, st.data())
def test_uniform_is_sticky_when_one_member_joins(spec, data):
    n, sizes = spec
    topics = dict(zip(tids(len(sizes)), sizes, strict=True))
    members = {f"m{i:02d}": MemberSubscription(frozenset(topics)) for i in range(n)}
    before = uniform(members, topics, {})
    newcomer = data.draw(st.sampled_from(["a-first", "z-last", "m05x"]))
    members[newcomer] = MemberSubscription(frozenset(topics))
    after = uniform(members, topics, before)
    check_complete(members, topics, after)
    counts = [count(after, m) for m in members]
    assert max(counts) - min(counts) <= 1
    own_before, own_after = owners(before), owners(after)
    moved = {tp for tp in own_after if own_before.get(tp) != own_after[tp]}
    # every partition that moved went to the newcomer, and it got no more than its share
    assert all(own_after[tp] == newcomer for tp in moved)
    assert len(moved) == count(after, newcomer)


@settings(max_examples=150, deadline=None)
@given(homogeneous, st.data())
def test_uniform_is_sticky_when_one_member_leaves(spec, data):
    n, sizes = spec
    if n < 2:
        n = 2
    topics = dict(zip(tids(len(sizes)), sizes, strict=True))
    members = {f"m{i:02d}": MemberSubscription(frozenset(topics)) for i in range(n)}
    before = uniform(members, topics, {})
    leaver = data.draw(st.sampled_from(sorted(members)))
    del members[leaver]
    current = {m: a for m, a in before.items() if m != leaver}
    after = uniform(members, topics, current)
    check_complete(members, topics, after)
    counts = [count(after, m) for m in members]
    assert max(counts) - min(counts) <= 1
    own_before, own_after = owners(before), owners(after)
    moved = {tp for tp in own_after if own_before.get(tp) != own_after[tp]}
    assert all(own_before[tp] == leaver for tp in moved)  # only the leaver's partitions moved


@settings(max_examples=150, deadline=None)
@given(st.integers(1, 12), st.lists(st.integers(1, 20), min_size=1, max_size=5), st.data())
def test_uniform_heterogeneous_is_complete_and_only_assigns_subscribed(n, sizes, data):
    all_topics = tids(len(sizes))
    topics = dict(zip(all_topics, sizes, strict=True))
    members = {}
    for i in range(n):
        subs = data.draw(st.sets(st.sampled_from(all_topics), min_size=1))
        members[f"m{i:02d}"] = MemberSubscription(frozenset(subs))
    result = uniform(members, topics, {})
    check_complete(members, topics, result)
    # re-running from its own output moves nothing (stable)
    assert uniform(members, topics, result) == result
    # no member could take a partition from one with two more: locally balanced
    for giver in members:
        for tid in result[giver]:
            for taker in members:
                if tid in members[taker].topic_ids:
                    assert count(result, taker) >= count(result, giver) - 1


def test_uniform_heterogeneous_example():
    t1, t2 = tids(2)
    topics = {t1: 3, t2: 3}
    members = {"a": MemberSubscription(frozenset({t1})), "b": MemberSubscription(frozenset({t1, t2})),
               "c": MemberSubscription(frozenset({t2}))}
    result = uniform(members, topics, {})
    check_complete(members, topics, result)
    assert sorted(count(result, m) for m in members) == [2, 2, 2]


def test_uniform_drops_partitions_of_topics_gone_or_shrunk():
    t1, t2 = tids(2)
    members = {"a": MemberSubscription(frozenset({t1})), "b": MemberSubscription(frozenset({t1}))}
    before = {"a": {t1: frozenset({0, 1, 5}), t2: frozenset({0})}, "b": {t1: frozenset({2, 3})}}
    result = uniform(members, {t1: 4}, before)
    check_complete(members, {t1: 4}, result)
    assert result["b"] == {t1: frozenset({2, 3})} and result["a"] == {t1: frozenset({0, 1})}


def test_range_is_contiguous_and_co_partitioned():
    t1, t2 = tids(2)
    topics = {t1: 7, t2: 7}
    members = {m: MemberSubscription(frozenset(topics)) for m in ("b", "a", "c")}
    result = range_assign(members, topics, {})
    check_complete(members, topics, result)
    assert result["a"] == {t1: frozenset({0, 1, 2}), t2: frozenset({0, 1, 2})}
    assert result["b"] == {t1: frozenset({3, 4}), t2: frozenset({3, 4})}
    assert result["c"] == {t1: frozenset({5, 6}), t2: frozenset({5, 6})}


def test_range_orders_static_members_by_instance_id_before_dynamic_ones():
    (t1,) = tids(1)
    members = {"zzz": MemberSubscription(frozenset({t1}), instance_id="i0"),
               "aaa": MemberSubscription(frozenset({t1})),
               "bbb": MemberSubscription(frozenset({t1}), instance_id="i1")}
    result = range_assign(members, {t1: 6}, {})
    assert result == {"zzz": {t1: frozenset({0, 1})}, "bbb": {t1: frozenset({2, 3})},
                      "aaa": {t1: frozenset({4, 5})}}


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 10), st.lists(st.integers(1, 20), min_size=1, max_size=4), st.data())
def test_range_is_complete(n, sizes, data):
    all_topics = tids(len(sizes))
    topics = dict(zip(all_topics, sizes, strict=True))
    members = {f"m{i}": MemberSubscription(frozenset(data.draw(st.sets(st.sampled_from(all_topics)))))
               for i in range(n)}
    check_complete(members, topics, range_assign(members, topics, {}))
