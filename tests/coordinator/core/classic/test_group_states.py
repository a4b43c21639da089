"""The Group object: the transition table, protocol selection, leader election."""
import itertools

import pytest

from coordinator.core.classic.group import (
    COMPLETING_REBALANCE,
    DEAD,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    STATES,
    VALID_PREVIOUS,
    Group,
    IllegalStateTransition,
    Member,
    Parked,
)


def member(mid, protocols=(("range", b"r"),), iid=None, rt=1000):
    return Member(mid, iid, "c", "/h", rt, 500, "consumer", list(protocols), hb_key=("hb", "g", mid))


def group_in(state: str) -> Group:
    g = Group("g")
    path = {EMPTY: [], PREPARING_REBALANCE: [PREPARING_REBALANCE],
            COMPLETING_REBALANCE: [PREPARING_REBALANCE, COMPLETING_REBALANCE],
            STABLE: [PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE], DEAD: [DEAD]}[state]
    for s in path:
        g.transition_to(s, 0)
    return g


@pytest.mark.parametrize("source,target", list(itertools.product(STATES, STATES)))
def test_transition_table_is_enforced(source, target):
    g = group_in(source)
    if source in VALID_PREVIOUS[target]:
        g.transition_to(target, 42)
        assert g.state == target and g.previous_state == source and g.state_wall_ms == 42
    else:
        with pytest.raises(IllegalStateTransition):
            g.transition_to(target, 42)
        assert g.state == source


def test_the_table_is_kafkas():
    assert VALID_PREVIOUS[PREPARING_REBALANCE] == {STABLE, COMPLETING_REBALANCE, EMPTY}
    assert VALID_PREVIOUS[COMPLETING_REBALANCE] == {PREPARING_REBALANCE}
    assert VALID_PREVIOUS[STABLE] == {COMPLETING_REBALANCE}
    assert VALID_PREVIOUS[EMPTY] == {PREPARING_REBALANCE}
    assert VALID_PREVIOUS[DEAD] == set(STATES)


def test_a_group_cannot_start_mid_rebalance():
    with pytest.raises(ValueError):
        Group("g", state=PREPARING_REBALANCE)


def test_protocol_vote_picks_the_most_popular_common_protocol():
    g = group_in(PREPARING_REBALANCE)
    g.add(member("a", [("roundrobin", b""), ("range", b"")]))
    g.add(member("b", [("range", b""), ("roundrobin", b"")]))
    g.add(member("c", [("range", b""), ("roundrobin", b""), ("sticky", b"")]))
    assert g.candidate_protocols() == {"range", "roundrobin"}
    assert g.select_protocol() == "range"  # two votes to one


def test_protocol_vote_tie_is_deterministic():
    g = group_in(PREPARING_REBALANCE)
    g.add(member("a", [("x", b""), ("y", b"")]))
    g.add(member("b", [("y", b""), ("x", b"")]))
    assert g.select_protocol() == "x"  # first voted for in member order


def test_supports_protocols():
    g = Group("g")
    assert g.supports_protocols("consumer", ["range"])
    assert not g.supports_protocols("", ["range"])
    assert not g.supports_protocols("consumer", [])
    g.transition_to(PREPARING_REBALANCE, 0)
    g.add(member("a", [("range", b""), ("rr", b"")]))
    assert g.supports_protocols("consumer", ["rr", "zzz"])
    assert not g.supports_protocols("consumer", ["zzz"])
    assert not g.supports_protocols("connect", ["range"])


def test_leader_reelection_on_remove_and_on_join_completion():
    g = group_in(PREPARING_REBALANCE)
    for mid in "abc":
        g.add(member(mid))
    assert g.leader_id == "a"
    g.remove("a")
    assert g.leader_id == "b"
    # at the end of a join phase the leader must be a member that rejoined
    g.set_join(g.members["c"], Parked("t", 5, 0))
    assert g.maybe_elect_new_joined_leader()
    assert g.leader_id == "c"
    g.take_join(g.members["c"])
    assert not g.maybe_elect_new_joined_leader()
    g.remove("b")
    g.remove("c")
    assert g.leader_id is None


def test_awaiting_counter_and_all_joined():
    g = group_in(PREPARING_REBALANCE)
    a, b = member("a"), member("b")
    g.add(a)
    g.add(b)
    assert not g.has_all_members_joined()
    assert g.set_join(a, Parked("t1", 5, 0)) is None
    old = g.set_join(a, Parked("t2", 5, 0))
    assert old.token == "t1" and g.num_awaiting_join == 1
    g.set_join(b, Parked("t3", 5, 0))
    assert g.has_all_members_joined()
    g.pending_members.add("p")
    assert not g.has_all_members_joined()
    g.remove("b")
    assert g.num_awaiting_join == 1


def test_rebalance_timeout_is_the_max_of_members():
    g = group_in(PREPARING_REBALANCE)
    g.add(member("a", rt=100))
    g.add(member("b", rt=700))
    assert g.rebalance_timeout_ms() == 700


def test_static_member_bookkeeping():
    g = group_in(PREPARING_REBALANCE)
    g.add(member("a", iid="i1"))
    with pytest.raises(RuntimeError):
        g.add(member("b", iid="i1"))
    g.pending_sync.add("a")
    old, new = g.replace_static_member("i1", "a", "a2", ("hb", "g", "a2"))
    assert g.static_members == {"i1": "a2"} and g.leader_id == "a2" and "a2" in g.pending_sync
    assert g.validate_member("a", "i1") != 0 and g.validate_member("a2", "i1") == 0
    g.remove("a2")
    assert g.static_members == {}
