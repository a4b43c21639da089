"""JoinGroup / SyncGroup / Heartbeat / LeaveGroup: flows, error codes, version-specific shapes."""
import pytest

from protocol import errors as E
from tests.coordinator.core.test_group_harness import HB, JOIN, Harness, sub

P = (("range", sub("t")),)


def stable_two(h, **kw):
    mids, gen = h.form_group("g", 2, **kw)
    return mids[0], mids[1], gen


# ---- joining ---------------------------------------------------------------------------------------

def test_v4_member_id_required_dance():
    h = Harness()
    t = h.join("g", version=4, client_id="app")
    r = h.reply(t)
    assert r.error_code == E.MEMBER_ID_REQUIRED
    assert r.member_id.startswith("app-") and r.generation_id == -1
    assert h.group("g").pending_members == {r.member_id}
    t2 = h.join("g", r.member_id, version=4)
    r2 = h.reply(t2)
    assert r2.error_code == E.NONE and r2.generation_id == 1
    assert r2.leader == r.member_id and [m.member_id for m in r2.members] == [r.member_id]
    assert r2.protocol_name == "range"
    assert not h.group("g").pending_members


@pytest.mark.parametrize("version", [0, 1, 2, 3])
def test_old_versions_get_a_member_id_directly(version):
    h = Harness()
    t = h.join("g", version=version, session=5_000, client_id="old")
    r = h.reply(t)
    assert r.error_code == E.NONE and r.member_id.startswith("old-") and r.generation_id == 1
    m = h.group("g").members[r.member_id]
    if version == 0:
        assert m.rebalance_timeout_ms == 5_000  # v0 has no rebalance timeout: the session timeout
    else:
        assert m.rebalance_timeout_ms == 30_000


def test_response_shapes_by_version():
    h = Harness()
    mid, _ = h.join_dynamic("g", version=9)
    # v3: no protocol type field; v7+: protocol type and name; v9: skip_assignment (False normally)
    r3 = h.reply(h.join("g", mid, version=3))
    r7 = h.reply(h.join("g", mid, version=7))
    r9 = h.reply(h.join("g", mid, version=9))
    for r in (r3, r7, r9):
        assert r.error_code == E.NONE
    assert r3.protocol_type is None and r3.protocol_name == "range"
    assert r7.protocol_type == "consumer" and r7.protocol_name == "range"
    assert r9.protocol_type == "consumer" and r9.skip_assignment is False
    # error shapes: protocol name is null from v7, empty string before
    e6 = h.reply(h.join("g", "nobody", version=6))
    e7 = h.reply(h.join("g", "nobody", version=7))
    assert e6.error_code == e7.error_code == E.UNKNOWN_MEMBER_ID
    assert e6.protocol_name == "" and e7.protocol_name is None and e7.protocol_type is None
    assert e7.member_id == "nobody" and e7.generation_id == -1


def test_group_instance_id_only_shown_from_v5():
    h = Harness()
    t = h.join("g", instance="i1", version=5)
    r = h.reply(t)
    assert r.members[0].group_instance_id == "i1"
    h2 = Harness()
    mid, t = h2.join_dynamic("g", version=4)
    assert h2.reply(t).members[0].group_instance_id is None


def test_invalid_group_id_for_group_apis():
    h = Harness()
    assert h.reply(h.join("")).error_code == E.INVALID_GROUP_ID
    assert h.reply(h.sync("", 1, "m")).error_code == E.INVALID_GROUP_ID
    assert h.heartbeat("", 1, "m").error_code == E.INVALID_GROUP_ID
    assert h.leave("", "m").error_code == E.INVALID_GROUP_ID
    assert h.leave("", "m", version=1).error_code == E.INVALID_GROUP_ID
    assert h.offset_delete("", {"t": [0]}).error_code == E.INVALID_GROUP_ID
    # commits, fetches and describes accept the empty group id (as Kafka, for compatibility)
    assert h.commit("", {("t", 0): 5}).topics[0].partitions[0].error_code == E.NONE
    assert h.fetch("", {"t": [0]}) == (E.NONE, {("t", 0): (5, "")})
    assert h.describe("")[0].group_state == "Empty"
    # and the heartbeat to "" still says INVALID_GROUP_ID although a group "" now exists
    assert h.heartbeat("", 0, "m").error_code == E.INVALID_GROUP_ID


@pytest.mark.parametrize("session", [99, 1_800_001])
def test_invalid_session_timeout(session):
    h = Harness()
    r = h.reply(h.join("g", session=session))
    assert r.error_code == E.INVALID_SESSION_TIMEOUT
    assert h.group("g") is None


def test_inconsistent_group_protocol():
    h = Harness()
    assert h.reply(h.join("g", ptype="")).error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert h.reply(h.join("g", protocols=())).error_code == E.INCONSISTENT_GROUP_PROTOCOL
    a, b, gen = stable_two(h)
    assert h.reply(h.join("g", ptype="connect")).error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert h.reply(h.join("g", protocols=(("sticky", b""),))).error_code == E.INCONSISTENT_GROUP_PROTOCOL
    # a known member too
    assert h.reply(h.join("g", a, protocols=(("sticky", b""),))).error_code == E.INCONSISTENT_GROUP_PROTOCOL
    assert h.state("g") == "Stable"


def test_unknown_member_id_on_join():
    h = Harness()
    assert h.reply(h.join("nogroup", "someone")).error_code == E.UNKNOWN_MEMBER_ID
    assert h.group("nogroup") is None
    stable_two(h)
    assert h.reply(h.join("g", "someone")).error_code == E.UNKNOWN_MEMBER_ID


def test_group_max_size_reached():
    h = Harness(group_max_size=2)
    a, b, gen = stable_two(h)
    r = h.reply(h.join("g"))  # checked before the KIP-394 dance, as Kafka
    assert r.error_code == E.GROUP_MAX_SIZE_REACHED and r.member_id == ""
    assert not h.group("g").pending_members
    assert h.state("g") == "Stable" and len(h.group("g").members) == 2
    # existing members are still accepted
    assert h.reply(h.join("g", b)).error_code == E.NONE


def test_group_max_size_in_preparing_rebalance_kicks_the_last_rejoiner():
    h = Harness(group_max_size=2)
    a, b, gen = stable_two(h)
    h.join("g", a, protocols=(("range", sub("t", "u")),))  # metadata change: PreparingRebalance
    assert h.state("g") == "PreparingRebalance"
    mid = h.reply(h.join("g")).member_id  # pending new member
    r = h.reply(h.join("g", mid))
    assert r is None  # 1 awaiting < 2: accepted and parked
    # b was not awaiting and now two members await: b is removed
    rb = h.reply(h.join("g", b))
    assert rb.error_code == E.GROUP_MAX_SIZE_REACHED
    assert set(h.group("g").members) == {a, mid}
    assert h.state("g") == "CompletingRebalance"  # everyone left has joined: completes at once


def test_a_pending_member_refused_for_group_max_size_is_forgotten_at_once():
    """Kafka's join removes a refused member id from the group, pending (KIP-394) ones included
    (``group.remove``): the client resets its id, so a kept pending id would only hold the join
    phase until that id's session timeout."""
    h = Harness(group_max_size=2)
    a, b, gen = stable_two(h)
    ta = h.join("g", a, protocols=(("range", sub("t", "u")),))  # PreparingRebalance, 1 awaiting
    pid = h.reply(h.join("g")).member_id  # 1 < 2 awaiting: a pending member
    tb = h.join("g", b)  # 2 awaiting: everyone but the pending member has rejoined
    assert h.state("g") == "PreparingRebalance"
    r = h.reply(h.join("g", pid))  # 2 awaiting: the pending member is refused
    assert r.error_code == E.GROUP_MAX_SIZE_REACHED and r.member_id == ""
    assert pid not in h.group("g").pending_members
    assert h.state("g") == "CompletingRebalance"  # nothing left to wait for
    assert h.reply(ta).generation_id == h.reply(tb).generation_id == gen + 1


# ---- join completion ------------------------------------------------------------------------------

def test_join_completes_as_soon_as_every_member_rejoined():
    h = Harness()
    a, b, gen = stable_two(h)
    c, tc = h.join_dynamic("g")
    assert h.state("g") == "PreparingRebalance" and h.reply(tc) is None
    assert h.heartbeat("g", gen, a).error_code == E.REBALANCE_IN_PROGRESS
    ta = h.join("g", a)
    assert h.state("g") == "PreparingRebalance"
    tb = h.join("g", b)  # the last one: no timer needed
    assert h.state("g") == "CompletingRebalance"
    for t in (ta, tb, tc):
        assert h.reply(t).generation_id == gen + 1
    leader = h.group("g").leader_id
    assert leader == a
    assert len(h.reply(ta).members) == 3 and h.reply(tb).members == [] and h.reply(tc).members == []
    assert {h.reply(t).leader for t in (ta, tb, tc)} == {a}


def test_follower_sync_before_and_after_the_leader():
    h = Harness()
    c1, t1 = h.join_dynamic("g", client_id="c1")
    gen = h.reply(t1).generation_id
    # second member: the group rebalances, both rejoin
    c2, t2 = h.join_dynamic("g", client_id="c2")
    h.join("g", c1)
    gen = h.group("g").generation
    leader = h.group("g").leader_id
    follower = c2 if leader == c1 else c1
    early = h.sync("g", gen, follower)
    assert h.reply(early) is None  # parked until the leader's assignment arrives
    assert h.heartbeat("g", gen, follower).error_code == E.NONE  # heartbeats work meanwhile
    lt = h.sync("g", gen, leader, {leader: b"L", follower: b"F"})
    assert h.reply(lt).assignment == b"L"
    assert h.reply(early).assignment == b"F"
    assert h.state("g") == "Stable"
    # a GroupMetadata record was written with the assignment, before the replies
    result = next(r for r in h.results if r.replies and r.replies[0][0] == lt)
    assert len(result.writes) == 1 and result.writes[0][1][:2] == b"\x00\x02"
    assert {tok for tok, _ in result.replies} == {lt, early}
    # a late follower sync (after the leader's) gets the stored assignment at once
    late = h.sync("g", gen, follower)
    assert h.reply(late).assignment == b"F" and h.reply(late).error_code == E.NONE


def test_leader_assignment_missing_members_get_empty_bytes():
    h = Harness()
    a, b, gen = stable_two(h)
    h.join("g", a)
    h.join("g", b)
    gen = h.group("g").generation
    leader = h.group("g").leader_id
    other = b if leader == a else a
    h.sync("g", gen, leader, {leader: b"x"})
    assert h.reply(h.sync("g", gen, other)).assignment == b""


def test_sync_errors():
    h = Harness()
    assert h.reply(h.sync("nogroup", 1, "m")).error_code == E.UNKNOWN_MEMBER_ID
    h.commit("simple", {("t", 0): 1})  # an Empty group
    assert h.reply(h.sync("simple", 0, "m")).error_code == E.UNKNOWN_MEMBER_ID
    a, b, gen = stable_two(h)
    assert h.reply(h.sync("g", gen, "stranger")).error_code == E.UNKNOWN_MEMBER_ID
    assert h.reply(h.sync("g", gen + 7, a)).error_code == E.ILLEGAL_GENERATION
    # v5 requires protocol type and name; they must match the group's
    r = h.reply(h.sync("g", gen, a, version=5, ptype="consumer", pname="roundrobin"))
    assert r.error_code == E.INCONSISTENT_GROUP_PROTOCOL
    r = h.reply(h.sync("g", gen, a, version=5, ptype="connect"))
    assert r.error_code == E.INCONSISTENT_GROUP_PROTOCOL
    ok = h.reply(h.sync("g", gen, a, version=5))
    assert ok.error_code == E.NONE and ok.protocol_type == "consumer" and ok.protocol_name == "range"
    from protocol.messages import SyncGroupRequest
    r = h.call(14, 5, SyncGroupRequest(group_id="g", generation_id=gen, member_id=a))
    assert r.error_code == E.INCONSISTENT_GROUP_PROTOCOL  # null protocol type/name at v5
    # during PreparingRebalance
    h.join("g", a)
    assert h.reply(h.sync("g", gen, b)).error_code == E.REBALANCE_IN_PROGRESS


def test_parked_sync_gets_rebalance_in_progress_when_a_member_joins():
    h = Harness()
    a, b, gen = stable_two(h)
    h.join("g", a)
    h.join("g", b)
    gen = h.group("g").generation
    follower = b if h.group("g").leader_id == a else a
    parked = h.sync("g", gen, follower)
    assert h.reply(parked) is None
    h.join_dynamic("g")  # a new member arrives during CompletingRebalance
    assert h.reply(parked).error_code == E.REBALANCE_IN_PROGRESS
    assert h.state("g") == "PreparingRebalance"


def test_heartbeat_by_state():
    h = Harness(initial_rebalance_delay_ms=1000, auto_timers=True)
    mid, t = h.join_dynamic("g")
    assert h.state("g") == "PreparingRebalance"
    assert h.heartbeat("g", 0, mid).error_code == E.REBALANCE_IN_PROGRESS
    h.advance(1000)
    assert h.state("g") == "CompletingRebalance"
    assert h.heartbeat("g", 1, mid).error_code == E.NONE
    assert h.heartbeat("g", 0, mid).error_code == E.ILLEGAL_GENERATION
    assert h.heartbeat("g", 1, "who").error_code == E.UNKNOWN_MEMBER_ID
    assert h.heartbeat("nogroup", 1, mid).error_code == E.UNKNOWN_MEMBER_ID
    h.sync("g", 1, mid, {mid: b"a"})
    assert h.heartbeat("g", 1, mid).error_code == E.NONE
    h.leave("g", mid)
    assert h.state("g") == "Empty"
    assert h.heartbeat("g", 2, mid).error_code == E.UNKNOWN_MEMBER_ID
    for v in range(5):
        assert h.call(HB, v, __import__("protocol.messages", fromlist=["x"]).HeartbeatRequest(
            group_id="g", generation_id=2, member_id=mid)).error_code == E.UNKNOWN_MEMBER_ID


# ---- rejoin semantics -----------------------------------------------------------------------------

def test_leader_rejoin_in_stable_triggers_a_rebalance_follower_rejoin_does_not():
    h = Harness()
    a, b, gen = stable_two(h)
    leader = h.group("g").leader_id
    follower = b if leader == a else a
    r = h.reply(h.join("g", follower))  # same metadata: current generation, no rebalance
    assert r.error_code == E.NONE and r.generation_id == gen and r.members == [] and r.leader == leader
    assert h.state("g") == "Stable"
    t = h.join("g", leader)
    assert h.state("g") == "PreparingRebalance" and h.reply(t) is None
    assert h.group("g").history  # the previous rebalance is recorded
    assert h.group("g").rebalance.reason == "leader_rejoin"


def test_metadata_change_triggers_a_rebalance():
    h = Harness()
    a, b, gen = stable_two(h)
    follower = b if h.group("g").leader_id == a else a
    h.join("g", follower, protocols=(("range", sub("t", "new-topic")),))
    assert h.state("g") == "PreparingRebalance"
    assert h.group("g").rebalance.reason == "metadata_changed"


def test_join_retry_during_completing_rebalance_returns_current_generation():
    h = Harness()
    a, b, gen = stable_two(h)
    h.join("g", a)
    h.join("g", b)
    g = h.group("g")
    leader = g.leader_id
    r = h.reply(h.join("g", leader))
    assert r.generation_id == g.generation and len(r.members) == 2  # the leader gets the members again
    follower = b if leader == a else a
    r = h.reply(h.join("g", follower))
    assert r.generation_id == g.generation and r.members == []
    assert h.state("g") == "CompletingRebalance"
    # changed metadata in CompletingRebalance restarts the rebalance
    h.join("g", follower, protocols=(("range", sub("x")),))
    assert h.state("g") == "PreparingRebalance"


def test_a_superseded_parked_join_is_answered():
    h = Harness()
    a, b, gen = stable_two(h)
    t1 = h.join("g", a)
    t2 = h.join("g", a)  # the client retried (its first request timed out)
    assert h.reply(t1).error_code == E.REBALANCE_IN_PROGRESS
    assert h.reply(t2) is None


def test_leader_leaves_and_a_new_leader_is_elected():
    h = Harness()
    mids, gen = h.form_group("g", 3)
    leader = h.group("g").leader_id
    others = [m for m in mids if m != leader]
    r = h.leave("g", leader)
    assert r.error_code == E.NONE and r.members[0].error_code == E.NONE
    assert h.state("g") == "PreparingRebalance"
    assert h.group("g").leader_id == others[0]
    ts = [h.join("g", m) for m in others]
    assert h.state("g") == "CompletingRebalance"
    assert {h.reply(t).leader for t in ts} == {others[0]}
    assert h.group("g").generation == gen + 1


def test_leader_that_misses_the_rejoin_is_replaced_by_a_member_that_rejoined():
    h = Harness()
    mids, gen = h.form_group("g", 3, rebalance=5_000)
    leader = h.group("g").leader_id
    others = [m for m in mids if m != leader]
    t = h.join("g", others[1], rebalance=5_000, protocols=(("range", sub("t", "u")),))  # metadata change
    assert h.state("g") == "PreparingRebalance"
    h.advance(5_000)  # the rebalance timeout: leader and other follower missed it
    assert h.state("g") == "CompletingRebalance"
    assert set(h.group("g").members) == {others[1]}
    assert h.reply(t).leader == others[1] and h.reply(t).generation_id == gen + 1


# ---- LeaveGroup ---------------------------------------------------------------------------------------

def test_leave_batched_v3_per_member_errors():
    h = Harness()
    mids, gen = h.form_group("g", 3)
    r = h.leave("g", mids[0], "nobody", (mids[1], "not-an-instance"), version=3)
    assert r.error_code == E.NONE
    assert [(m.member_id, m.error_code) for m in r.members] == [
        (mids[0], E.NONE), ("nobody", E.UNKNOWN_MEMBER_ID), (mids[1], E.UNKNOWN_MEMBER_ID)]
    assert set(h.group("g").members) == {mids[1], mids[2]}
    r = h.leave("g", mids[1], mids[2], version=5)
    assert all(m.error_code == E.NONE for m in r.members)
    assert h.state("g") == "Empty"


def test_leave_v0_to_2_reports_the_member_error_at_top_level():
    h = Harness()
    a, b, gen = stable_two(h)
    assert h.leave("g", "nobody", version=0).error_code == E.UNKNOWN_MEMBER_ID
    assert h.leave("g", a, version=2).error_code == E.NONE
    assert h.leave("nogroup", a, version=1).error_code == E.UNKNOWN_MEMBER_ID


def test_leave_unknown_group_v3():
    h = Harness()
    r = h.leave("nogroup", "a", "b", version=4)
    assert r.error_code == E.NONE and [m.error_code for m in r.members] == [E.UNKNOWN_MEMBER_ID] * 2


def test_pending_member_can_leave():
    h = Harness()
    a, b, gen = stable_two(h)
    pid = h.reply(h.join("g")).member_id
    assert pid in h.group("g").pending_members
    r = h.leave("g", pid)
    assert r.members[0].error_code == E.NONE
    assert pid not in h.group("g").pending_members
    assert h.state("g") == "Stable"  # a pending member is not a member: no rebalance


def test_leave_with_parked_join_answers_it():
    h = Harness()
    a, b, gen = stable_two(h)
    t = h.join("g", a)
    h.leave("g", a)
    assert h.reply(t).error_code == E.UNKNOWN_MEMBER_ID
    assert h.state("g") == "PreparingRebalance"
    h.join("g", b)
    assert h.state("g") == "CompletingRebalance"


def test_join_api_versions_all_answer():
    for v in range(10):
        h = Harness()
        mid, t = h.join_dynamic("g", version=v)
        assert h.reply(t).error_code == E.NONE, v
        assert h.reply(t).generation_id == 1


def test_unsupported_api_or_version_raises():
    h = Harness()
    with pytest.raises(ValueError):
        h.gc.handle(3, 0, None, "t", 0, 0)
    with pytest.raises(ValueError):
        h.gc.handle(JOIN, 10, None, "t", 0, 0)
