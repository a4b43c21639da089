"""The group state machine with a manual clock and scripted broker responses (no sockets, no sleeps)."""

from __future__ import annotations

import pytest

from client import errors as cerr
from client.coordinator import (
    BOOTSTRAP,
    COORDINATOR,
    LEAVER,
    GroupFailed,
    MemberState,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
)
from client.types import OffsetAndMetadata
from protocol import errors as E
from protocol import messages as m
from protocol.consumer import decode_assignment
from tests.client.harness import (
    Harness,
    decode_join_subscription,
    member_meta,
    metadata_response,
    subscription_blob,
    tp,
    tps,
)


class H:
    """Stand-in reply handle."""

    def __init__(self, name="h"):
        self.name = name

    def __repr__(self):
        return self.name


# -- discovery ---------------------------------------------------------------------------------------


def test_nothing_happens_before_subscribe():
    h = Harness().tick(1)
    assert h.connects == [] and h.sends == []


def test_bootstrap_find_coordinator_and_connect():
    h = Harness()
    h.call("subscribe", ["t"])
    assert [(c.conn, c.host, c.port) for c in h.connects] == [(BOOTSTRAP, "b1", 9092)]
    h.connected(BOOTSTRAP)
    s = h.take(m.FindCoordinatorRequest)
    assert s.version == m.FindCoordinatorRequest.MAX_VERSION
    assert s.request.coordinator_keys == ["g"] and s.request.key_type == 0
    h.respond(
        s,
        m.FindCoordinatorResponse(
            coordinators=[m.FindCoordinatorResponseCoordinator(key="g", node_id=3, host="c3", port=9999)]
        ),
    )
    assert [(c.conn, c.host, c.port) for c in h.connects] == [(COORDINATOR, "c3", 9999)]
    assert h.core.coordinator == (3, "c3", 9999)


def test_find_coordinator_old_version_uses_key_field():
    versions = dict(Harness().versions)
    versions[m.FindCoordinatorRequest.API_KEY] = 2
    h = Harness(versions=versions)
    h.call("subscribe", ["t"]).connected(BOOTSTRAP)
    s = h.take(m.FindCoordinatorRequest)
    assert s.version == 2 and s.request.key == "g"
    h.respond(s, m.FindCoordinatorResponse(node_id=1, host="c1", port=1))
    assert h.core.coordinator == (1, "c1", 1)


def test_bootstrap_rotates_on_connect_failure_with_backoff():
    h = Harness()
    h.call("subscribe", ["t"])
    assert h.connects[-1].host == "b1"
    h.connects.clear()
    h.disconnected(BOOTSTRAP, "refused")
    assert h.connects == []  # reconnect backoff first
    h.tick(2.0)
    assert [(c.host, c.port) for c in h.connects] == [("b2", 9093)]


@pytest.mark.parametrize(
    "code", [E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS, E.NOT_COORDINATOR]
)
def test_find_coordinator_retries_with_backoff(code):
    h = Harness()
    h.call("subscribe", ["t"]).connected(BOOTSTRAP)
    s = h.take(m.FindCoordinatorRequest)
    h.respond(
        s,
        m.FindCoordinatorResponse(
            coordinators=[m.FindCoordinatorResponseCoordinator(key="g", error_code=code)]
        ),
    )
    assert h.pending(m.FindCoordinatorRequest) == []
    h.tick(0.05)
    assert h.pending(m.FindCoordinatorRequest) == []  # 100 ms backoff (+-20%)
    h.tick(0.1)
    assert len(h.pending(m.FindCoordinatorRequest)) == 1


def test_find_coordinator_backoff_grows_and_resets():
    h = Harness()
    h.call("subscribe", ["t"]).connected(BOOTSTRAP)
    delays = []
    for _ in range(6):
        s = h.take(m.FindCoordinatorRequest)
        h.respond(
            s,
            m.FindCoordinatorResponse(
                coordinators=[
                    m.FindCoordinatorResponseCoordinator(key="g", error_code=E.COORDINATOR_NOT_AVAILABLE)
                ]
            ),
        )
        start = h.now
        while not h.pending(m.FindCoordinatorRequest):
            h.tick(0.01)
        delays.append(h.now - start)
    assert delays[0] < 0.15 and 0.7 < delays[-1] < 1.25  # 100 ms doubling, capped at 1 s (+-20%)


@pytest.mark.parametrize("code", [E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE])
def test_heartbeat_not_coordinator_rediscovers(code):
    h = Harness().stable_member(parts=[tp("t", 0)])
    h.tick(3.0)
    hb = h.take(m.HeartbeatRequest)
    h.respond(hb, m.HeartbeatResponse(error_code=code))
    assert h.core.coordinator is None
    assert any(d.conn == COORDINATOR for d in h.disconnects)
    h.tick(0)
    h.find_coordinator(host="c2")
    assert h.core.state is MemberState.STABLE and h.core.owned == tps("t", 0)  # membership kept
    h.tick(3.0)
    assert h.pending(m.HeartbeatRequest)


def test_coordinator_connection_loss_rediscovers_and_keeps_membership():
    h = Harness().stable_member(parts=[tp("t", 0)])
    h.disconnected(COORDINATOR, "reset by peer")
    assert h.core.coordinator is None
    h.tick(0)
    h.find_coordinator()
    assert h.core.state is MemberState.STABLE and h.core.generation == 1


def test_connection_loss_during_join_rejoins():
    h = Harness()
    h.call("subscribe", ["t"])
    h.find_coordinator()
    h.take(m.JoinGroupRequest)
    h.disconnected(COORDINATOR)
    assert h.core.state is MemberState.PREPARING_REBALANCE and h.core.rejoin_needed  # as Kafka
    h.tick(1.0)
    h.find_coordinator()
    h.tick(1.0)
    assert h.pending(m.JoinGroupRequest)


def test_session_timeout_without_heartbeat_response_marks_coordinator_dead():
    h = Harness().stable_member()
    h.tick(3.0)
    h.take(m.HeartbeatRequest)  # never answered
    h.tick(7.5)
    assert h.core.coordinator is None  # 10 s session without a response


# -- join / sync ---------------------------------------------------------------------------------------


def test_join_request_fields_and_subscription_blob():
    h = Harness(
        session_timeout_ms=6000,
        max_poll_interval_ms=60000,
        client_rack="r1",
        partition_assignment_strategy="range,roundrobin",
    )
    h.call("subscribe", ["b", "a"])
    h.find_coordinator()
    s = h.take(m.JoinGroupRequest)
    r = s.request
    assert (r.group_id, r.session_timeout_ms, r.rebalance_timeout_ms, r.member_id, r.protocol_type) == (
        "g",
        6000,
        60000,
        "",
        "consumer",
    )
    assert [p.name for p in r.protocols] == ["range", "roundrobin"]
    version, sub = decode_join_subscription(s)
    assert version == 3 and sub.topics == ["a", "b"] and sub.rack_id == "r1" and sub.generation_id == -1
    assert sub.owned_partitions == []
    assert s.timeout >= 65.0  # rebalance timeout + 5 s


def test_member_id_required_then_join():
    h = Harness()
    h.call("subscribe", ["t"])
    h.find_coordinator()
    s = h.take(m.JoinGroupRequest)
    h.respond(s, h.join_response(member="minted-1", error=E.MEMBER_ID_REQUIRED, generation=-1))
    s2 = h.take(m.JoinGroupRequest)  # at once, no backoff
    assert s2.request.member_id == "minted-1"


def test_follower_join_sync_stable():
    h = Harness()
    h.call("subscribe", ["t"])
    h.find_coordinator()
    h.answer_join(member="m2", generation=4, leader="m1")
    sync = h.take(m.SyncGroupRequest)
    assert (
        sync.request.assignments == [] and sync.request.generation_id == 4 and sync.request.member_id == "m2"
    )
    assert h.core.state is MemberState.COMPLETING_REBALANCE
    h.respond(
        sync,
        m.SyncGroupResponse(
            assignment=__import__("tests.client.harness", fromlist=["x"]).assignment_blob(
                [tp("t", 1), tp("t", 3)]
            )
        ),
    )
    assert h.core.state is MemberState.STABLE and h.core.stable
    [ev] = h.take_events(PartitionsAssigned)
    assert ev.added == tps("t", 1, 3) and ev.assignment == tps("t", 1, 3) and ev.generation == 4
    snap = h.core.snapshot()
    assert snap.generation == 4 and snap.member_id == "m2" and not snap.leader


def test_leader_fetches_metadata_assigns_and_syncs():
    h = Harness(partition_assignment_strategy="range")
    h.call("subscribe", ["t"])
    h.find_coordinator()
    members = [
        member_meta("m1", subscription_blob(["t"])),
        member_meta("m2", subscription_blob(["t", "u"])),
        member_meta("m3", subscription_blob(["t"], version=0)),
    ]
    h.answer_join(member="m1", generation=2, leader="m1", members=members)
    md = h.take(m.MetadataRequest)
    assert sorted(t.name for t in md.request.topics) == ["t", "u"]
    h.respond(md, metadata_response({"t": 10, "u": 2}))
    sync = h.take(m.SyncGroupRequest)
    got = {}
    for a in sync.request.assignments:
        version, asg = decode_assignment(a.assignment)
        assert version == 0  # the lowest subscription version in the group
        got[a.member_id] = sorted((x.topic, p) for x in asg.assigned_partitions for p in x.partitions)
    assert got["m1"] == [("t", p) for p in range(0, 4)]
    assert got["m2"] == [("t", p) for p in range(4, 7)] + [("u", 0), ("u", 1)]
    assert got["m3"] == [("t", p) for p in range(7, 10)]


def test_leader_ignores_missing_topics():
    h = Harness(partition_assignment_strategy="range")
    h.call("subscribe", ["t", "missing"])
    h.find_coordinator()
    h.answer_join(member="m1", members=[member_meta("m1", subscription_blob(["t", "missing"]))])
    md = h.take(m.MetadataRequest)
    h.respond(
        md,
        m.MetadataResponse(
            topics=[
                m.MetadataResponseTopic(
                    name="t", partitions=[m.MetadataResponsePartition(partition_index=0)]
                ),
                m.MetadataResponseTopic(name="missing", error_code=E.UNKNOWN_TOPIC_OR_PARTITION),
            ]
        ),
    )
    sync = h.take(m.SyncGroupRequest)
    [a] = sync.request.assignments
    _, asg = decode_assignment(a.assignment)
    assert [(x.topic, x.partitions) for x in asg.assigned_partitions] == [("t", [0])]


def test_leader_rejoins_when_partition_count_changes():
    h = Harness(partition_assignment_strategy="range", metadata_max_age_ms=60000)
    h.call("subscribe", ["t"])
    h.find_coordinator()
    h.answer_join(member="m1", members=[member_meta("m1", subscription_blob(["t"]))])
    h.respond(h.take(m.MetadataRequest), metadata_response({"t": 2}))
    h.answer_sync([tp("t", 0), tp("t", 1)])
    assert h.core.stable
    h.live(59)
    assert h.pending(m.MetadataRequest) == []
    h.live(2)
    md = h.take(m.MetadataRequest)
    h.respond(md, metadata_response({"t": 3}))
    assert h.core.rejoin_needed


@pytest.mark.parametrize("code,reset_member", [(E.UNKNOWN_MEMBER_ID, True), (E.ILLEGAL_GENERATION, False)])
def test_heartbeat_fenced_generation_loses_partitions_and_rejoins(code, reset_member):
    h = Harness().stable_member(parts=[tp("t", 0), tp("t", 1)], member="m7", generation=3)
    h.take_events()
    h.tick(3.0)
    h.respond(h.take(m.HeartbeatRequest), m.HeartbeatResponse(error_code=code))
    [lost] = h.take_events(PartitionsLost)
    assert lost.partitions == tps("t", 0, 1)
    assert h.core.generation == -1 and h.core.owned == frozenset()
    join = h.take(m.JoinGroupRequest)  # rejoins at once; nothing to revoke
    assert join.request.member_id == ("" if reset_member else "m7")


def test_heartbeat_rebalance_in_progress_eager_revokes_before_rejoin():
    h = Harness(partition_assignment_strategy="range").stable_member(parts=[tp("t", 0)])
    h.take_events()
    h.tick(3.0)
    h.respond(h.take(m.HeartbeatRequest), m.HeartbeatResponse(error_code=E.REBALANCE_IN_PROGRESS))
    [rev] = h.take_events(PartitionsRevoked)
    assert rev.partitions == tps("t", 0)
    assert h.pending(m.JoinGroupRequest) == []  # waits for the user's callback
    assert not h.core.stable
    h.tick(3.0)
    assert h.pending(m.HeartbeatRequest)  # still heartbeating meanwhile
    h.call("ack", rev.seq)
    join = h.take(m.JoinGroupRequest)
    _, sub = decode_join_subscription(join)
    assert sub.owned_partitions == [] and h.core.owned == frozenset()


def test_stale_ack_is_ignored():
    h = Harness().stable_member(parts=[tp("t", 0)])
    h.call("ack", 12345)
    assert h.core.owned == tps("t", 0)


def test_heartbeat_rebalance_in_progress_ignored_while_completing():
    h = Harness()
    h.call("subscribe", ["t"])
    h.find_coordinator()
    h.answer_join(member="m2", leader="m1")
    h.tick(3.0)
    h.respond(h.take(m.HeartbeatRequest), m.HeartbeatResponse(error_code=E.REBALANCE_IN_PROGRESS))
    assert not h.core.rejoin_needed


@pytest.mark.parametrize("code", [E.REBALANCE_IN_PROGRESS, E.INVALID_REQUEST, E.UNKNOWN_SERVER_ERROR])
def test_sync_errors_rejoin(code):
    h = Harness()
    h.call("subscribe", ["t"])
    h.find_coordinator()
    h.answer_join(member="m2", leader="m1", generation=5)
    h.answer_sync([], error=code)
    assert h.core.state is not MemberState.STABLE and h.core.member_id == "m2"
    h.tick(1.5)
    join = h.take(m.JoinGroupRequest)
    assert join.request.member_id == "m2"


@pytest.mark.parametrize("code", [E.UNKNOWN_MEMBER_ID, E.ILLEGAL_GENERATION])
def test_sync_fenced_resets_generation(code):
    h = Harness()
    h.call("subscribe", ["t"])
    h.find_coordinator()
    h.answer_join(member="m2", leader="m1", generation=5)
    h.answer_sync([], error=code)
    assert h.core.generation == -1
    assert h.take(m.JoinGroupRequest)


@pytest.mark.parametrize("code", [E.REBALANCE_IN_PROGRESS, E.UNKNOWN_MEMBER_ID, E.ILLEGAL_GENERATION])
def test_join_errors_rejoin_immediately(code):
    h = Harness()
    h.call("subscribe", ["t"])
    h.find_coordinator()
    s = h.take(m.JoinGroupRequest)
    h.respond(s, h.join_response(error=code, member=""))
    assert h.take(m.JoinGroupRequest)


def test_join_coordinator_load_in_progress_backs_off():
    h = Harness().first_join_fails(E.COORDINATOR_LOAD_IN_PROGRESS)
    assert h.pending(m.JoinGroupRequest) == []
    h.tick(0.2)
    assert h.take(m.JoinGroupRequest)


@pytest.mark.parametrize("code", [E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE])
def test_join_not_coordinator_rediscovers(code):
    h = Harness().first_join_fails(code)
    assert h.core.coordinator is None
    h.tick(0.01)
    h.find_coordinator(host="c9")
    h.tick(1.0)
    assert h.take(m.JoinGroupRequest).conn == COORDINATOR


@pytest.mark.parametrize(
    "code,exc",
    [
        (E.FENCED_INSTANCE_ID, cerr.FencedInstanceIdError),
        (E.GROUP_AUTHORIZATION_FAILED, cerr.GroupAuthorizationError),
        (E.INVALID_GROUP_ID, cerr.InvalidGroupIdError),
        (E.UNSUPPORTED_VERSION, cerr.UnsupportedVersionError),
    ],
)
def test_join_fatal_errors(code, exc):
    h = Harness().first_join_fails(code)
    [ev] = h.take_events(GroupFailed)
    assert isinstance(ev.error, exc) and isinstance(h.core.snapshot().error, exc)
    h.tick(5.0)
    assert h.pending(m.JoinGroupRequest) == []
    h.call("commit", {tp("t", 0): OffsetAndMetadata(1)}, H(), h.now + 5)
    [r] = h.take_replies()
    assert isinstance(r.error, exc)


def test_heartbeat_fenced_instance_is_fatal():
    h = Harness(group_instance_id="i1").stable_member(parts=[tp("t", 0)])
    h.take_events()
    h.tick(3.0)
    h.respond(h.take(m.HeartbeatRequest), m.HeartbeatResponse(error_code=E.FENCED_INSTANCE_ID))
    evs = h.take_events()
    assert [type(e) for e in evs] == [PartitionsLost, GroupFailed]
    assert isinstance(evs[1].error, cerr.FencedInstanceIdError)


def test_static_membership_needs_join_v5():
    versions = dict(Harness().versions)
    versions[m.JoinGroupRequest.API_KEY] = 4
    h = Harness(versions=versions, group_instance_id="i1")
    h.call("subscribe", ["t"])
    h.find_coordinator()
    [ev] = h.take_events(GroupFailed)
    assert isinstance(ev.error, cerr.UnsupportedVersionError)


def test_missing_api_is_fatal():
    versions = dict(Harness().versions)
    del versions[m.SyncGroupRequest.API_KEY]
    h = Harness(versions=versions)
    h.call("subscribe", ["t"])
    h.find_coordinator()
    [ev] = h.take_events(GroupFailed)
    assert "SyncGroup" in str(ev.error)


# -- heartbeat timing ----------------------------------------------------------------------------------


def test_heartbeats_every_interval_one_in_flight():
    h = Harness(heartbeat_interval_ms=1000, session_timeout_ms=10000).stable_member()
    assert h.pending(m.HeartbeatRequest) == []
    h.tick(0.99)
    assert h.pending(m.HeartbeatRequest) == []
    h.tick(0.02)
    hb = h.take(m.HeartbeatRequest)
    assert (hb.request.generation_id, hb.request.member_id) == (1, "m1")
    h.tick(5.0)
    assert h.pending(m.HeartbeatRequest) == []  # one in flight at a time
    h.respond(hb, m.HeartbeatResponse())
    hb2 = h.take(m.HeartbeatRequest)  # an interval after the last send: long past
    h.respond(hb2, m.HeartbeatResponse())
    h.tick(0.99)
    assert h.pending(m.HeartbeatRequest) == []
    h.tick(0.02)
    assert len(h.pending(m.HeartbeatRequest)) == 1


def test_failed_heartbeat_retries_after_backoff():
    h = Harness(heartbeat_interval_ms=1000, retry_backoff_ms=100).stable_member()
    h.tick(1.0)
    hb = h.take(m.HeartbeatRequest)
    h.respond(hb, ConnectionError("boom"))
    h.tick(0.05)
    assert h.pending(m.HeartbeatRequest) == []
    h.tick(0.06)
    assert h.pending(m.HeartbeatRequest)


def test_next_deadline_tracks_heartbeat():
    h = Harness(heartbeat_interval_ms=2000).stable_member()
    assert h.core.next_deadline() == pytest.approx(h.now + 2.0)


# -- max.poll.interval -----------------------------------------------------------------------------------


def test_poll_timeout_leaves_group_and_next_poll_rejoins():
    h = Harness(max_poll_interval_ms=30000, heartbeat_interval_ms=3000, session_timeout_ms=10000)
    h.stable_member(parts=[tp("t", 0)], member="m1")
    h.take_events()
    for _ in range(9):  # heartbeat fine for 27 s, but no poll
        h.tick(3.0)
        for hb in list(h.pending(m.HeartbeatRequest)):
            h.sends.remove(hb)
            h.respond(hb, m.HeartbeatResponse())
    assert h.core.state is MemberState.STABLE
    h.tick(3.5)
    leave = h.take(m.LeaveGroupRequest)
    assert leave.request.members[0].member_id == "m1"
    assert h.core.state is MemberState.UNJOINED and h.core.member_id == ""
    [lost] = h.take_events(PartitionsLost)
    assert lost.partitions == tps("t", 0)
    h.tick(10.0)
    assert h.pending(m.JoinGroupRequest) == []  # waits for the next poll
    h.call("poll")
    assert h.take(m.JoinGroupRequest)


def test_poll_resets_the_poll_timer():
    h = Harness(max_poll_interval_ms=10000, heartbeat_interval_ms=1000, session_timeout_ms=6000)
    h.stable_member(parts=[tp("t", 0)])
    for _ in range(30):
        h.now += 1.0
        h.call("poll")
        for hb in list(h.pending(m.HeartbeatRequest)):
            h.sends.remove(hb)
            h.respond(hb, m.HeartbeatResponse())
    assert h.core.stable and h.pending(m.LeaveGroupRequest) == []


def test_static_member_poll_timeout_sends_no_leave():
    h = Harness(
        max_poll_interval_ms=5000,
        heartbeat_interval_ms=1000,
        session_timeout_ms=6000,
        group_instance_id="inst-1",
    ).stable_member(parts=[tp("t", 0)])
    h.tick(5.5)
    assert h.pending(m.LeaveGroupRequest) == []
    assert h.core.state is MemberState.UNJOINED


# -- cooperative -----------------------------------------------------------------------------------------


def test_cooperative_owned_partitions_travel_in_subscription():
    h = Harness(partition_assignment_strategy="cooperative-sticky")
    assert h.core.protocol == "cooperative"
    h.stable_member(parts=[tp("t", 0), tp("t", 1)], generation=3)
    h.tick(3.0)
    h.respond(h.take(m.HeartbeatRequest), m.HeartbeatResponse(error_code=E.REBALANCE_IN_PROGRESS))
    assert h.take_events(PartitionsRevoked) == []  # nothing revoked up front
    join = h.take(m.JoinGroupRequest)
    version, sub = decode_join_subscription(join)
    assert [(x.topic, x.partitions) for x in sub.owned_partitions] == [("t", [0, 1])]
    assert sub.generation_id == 3
    assert sub.user_data == (3).to_bytes(4, "big")  # CooperativeStickyAssignor user data


def test_cooperative_revokes_only_what_moved_then_rejoins():
    h = Harness(partition_assignment_strategy="cooperative-sticky")
    h.stable_member(parts=[tp("t", 0), tp("t", 1), tp("t", 2)], generation=1)
    h.take_events()
    h.tick(3.0)
    h.respond(h.take(m.HeartbeatRequest), m.HeartbeatResponse(error_code=E.REBALANCE_IN_PROGRESS))
    h.answer_join(member="m1", generation=2, leader="m0")
    h.answer_sync([tp("t", 0), tp("t", 1), tp("t", 5)])
    rev, asg = h.take_events()
    assert isinstance(rev, PartitionsRevoked) and rev.partitions == tps("t", 2)
    assert isinstance(asg, PartitionsAssigned) and asg.added == tps("t", 5)
    assert asg.assignment == tps("t", 0, 1, 5) and h.core.owned == tps("t", 0, 1, 5)
    assert h.pending(m.JoinGroupRequest) == [] and not h.core.stable
    h.call("ack", rev.seq)
    join = h.take(m.JoinGroupRequest)  # the follow-up rebalance
    _, sub = decode_join_subscription(join)
    assert sorted(p for x in sub.owned_partitions for p in x.partitions) == [0, 1, 5]


def test_cooperative_subscription_change_revokes_dropped_topics_first():
    h = Harness(partition_assignment_strategy="cooperative-sticky")
    h.stable_member(topics=["a", "b"], parts=[tp("a", 0), tp("b", 0)])
    h.take_events()
    h.call("subscribe", ["a"])
    [rev] = h.take_events(PartitionsRevoked)
    assert rev.partitions == tps("b", 0) and h.pending(m.JoinGroupRequest) == []
    h.call("ack", rev.seq)
    assert h.core.owned == tps("a", 0)
    _, sub = decode_join_subscription(h.take(m.JoinGroupRequest))
    assert sub.topics == ["a"]


def test_cooperative_leader_withholds_partitions_owned_by_others():
    h = Harness(partition_assignment_strategy="cooperative-sticky")
    h.call("subscribe", ["t"])
    h.find_coordinator()
    # m1 (leader) is new; m2 owns all 4 partitions at generation 1.
    members = [
        member_meta("m1", subscription_blob(["t"])),
        member_meta("m2", subscription_blob(["t"], owned=[("t", p) for p in range(4)], generation=1)),
    ]
    h.answer_join(member="m1", generation=2, leader="m1", members=members, protocol="cooperative-sticky")
    h.respond(h.take(m.MetadataRequest), metadata_response({"t": 4}))
    sync = h.take(m.SyncGroupRequest)
    got = {}
    for a in sync.request.assignments:
        _, asg = decode_assignment(a.assignment)
        got[a.member_id] = sorted(p for x in asg.assigned_partitions for p in x.partitions)
    assert got == {"m1": [], "m2": [0, 1]}  # 2 and 3 move: revoked first, assigned next round


# -- leave / close -----------------------------------------------------------------------------------------


def test_close_dynamic_member_sends_leave_and_waits():
    h = Harness().stable_member(parts=[tp("t", 0)], member="m1")
    handle = H("close")
    h.call("close", handle, h.now + 5, True)
    leave = h.take(m.LeaveGroupRequest)
    assert leave.request.members[0].member_id == "m1" and leave.request.members[0].group_instance_id is None
    assert h.take_replies() == [] and not h.stopped
    h.respond(leave, m.LeaveGroupResponse())
    assert [r.handle for r in h.take_replies()] == [handle] and h.stopped


def test_close_leave_v2_uses_member_id_field():
    versions = dict(Harness().versions)
    versions[m.LeaveGroupRequest.API_KEY] = 2
    h = Harness(versions=versions).stable_member(member="m1")
    h.call("close", H(), h.now + 5, True)
    leave = h.take(m.LeaveGroupRequest)
    assert leave.version == 2 and leave.request.member_id == "m1"


def test_close_gives_up_waiting_for_leave_at_deadline():
    h = Harness().stable_member(member="m1")
    h.call("close", H(), h.now + 2, True)
    h.take(m.LeaveGroupRequest)
    h.tick(1.0)
    assert not h.stopped
    h.tick(1.5)
    assert h.stopped


def _parked_in_a_rebalance():
    """A stable member told to rejoin, its JoinGroup sent and not answered (parked)."""
    h = Harness(partition_assignment_strategy="range").stable_member(parts=[tp("t", 0)], member="m1")
    h.tick(3.0)
    h.respond(h.take(m.HeartbeatRequest), m.HeartbeatResponse(error_code=E.REBALANCE_IN_PROGRESS))
    [rev] = h.take_events(PartitionsRevoked)
    h.call("ack", rev.seq)
    return h, h.take(m.JoinGroupRequest)


def test_close_while_a_join_is_parked_leaves_over_a_second_connection():
    # The coordinator answers a connection's requests in order: a LeaveGroup behind the parked
    # JoinGroup would wait for the whole rebalance (Java's close waits so, up to its timeout).
    h, join = _parked_in_a_rebalance()
    handle = H("close")
    h.call("close", handle, h.now + 10, True)
    assert h.pending(m.LeaveGroupRequest) == []
    [conn] = h.connects
    assert (conn.conn, conn.host, conn.port) == (LEAVER, "c1", 9092)
    h.connected(LEAVER)
    leave = h.take(m.LeaveGroupRequest, LEAVER)
    assert leave.request.members[0].member_id == "m1"
    assert h.take_replies() == [] and not h.stopped
    h.respond(leave, m.LeaveGroupResponse())
    assert [r.handle for r in h.take_replies()] == [handle] and h.stopped
    h.respond(join, h.join_response(error=E.UNKNOWN_MEMBER_ID))  # the parked join's late answer
    assert h.take_replies() == [] and h.sends == []


def test_close_while_a_join_is_parked_gives_up_when_the_second_connection_fails():
    h, _join = _parked_in_a_rebalance()
    handle = H("close")
    h.call("close", handle, h.now + 10, True)
    h.connects.clear()
    h.disconnected(LEAVER, "connect failed: ECONNREFUSED")
    assert [r.handle for r in h.take_replies()] == [handle] and h.stopped
    assert h.connects == []  # no retry of the coordinator either


def test_close_while_a_join_is_parked_still_ends_at_its_deadline():
    h, _join = _parked_in_a_rebalance()
    h.call("close", H(), h.now + 2, True)
    h.tick(1.0)
    assert not h.stopped
    h.tick(1.5)
    assert h.stopped


def test_close_static_member_sends_no_leave():
    h = Harness(group_instance_id="inst-1").stable_member(parts=[tp("t", 0)])
    handle = H()
    h.call("close", handle, h.now + 5, True)
    assert h.pending(m.LeaveGroupRequest) == []
    assert [r.handle for r in h.take_replies()] == [handle] and h.stopped


def test_static_member_sends_instance_id():
    h = Harness(group_instance_id="inst-1")
    h.call("subscribe", ["t"])
    h.find_coordinator()
    join = h.take(m.JoinGroupRequest)
    assert join.request.group_instance_id == "inst-1"
    h.respond(join, h.join_response(member="m1", leader="m0"))
    assert h.take(m.SyncGroupRequest).request.group_instance_id == "inst-1"


def test_unsubscribe_leaves_without_lost_event():
    h = Harness().stable_member(parts=[tp("t", 0)], member="m1")
    h.take_events()
    h.call("unsubscribe")
    assert h.take(m.LeaveGroupRequest)
    assert h.take_events() == [] and h.core.owned == frozenset() and h.core.generation == -1
    h.tick(10)
    assert h.pending(m.JoinGroupRequest) == []


# -- offsets -----------------------------------------------------------------------------------------------


def test_commit_as_member_carries_generation():
    h = Harness(group_instance_id="i1").stable_member(parts=[tp("t", 0)], member="m1", generation=7)
    handle = H()
    h.call("commit", {tp("t", 0): OffsetAndMetadata(42, "md")}, handle, h.now + 10)
    s = h.take(m.OffsetCommitRequest)
    r = s.request
    assert (r.group_id, r.generation_id_or_member_epoch, r.member_id, r.group_instance_id) == (
        "g",
        7,
        "m1",
        "i1",
    )
    [t] = r.topics
    assert (
        t.name == "t"
        and t.partitions[0].committed_offset == 42
        and t.partitions[0].committed_metadata == "md"
    )
    h.respond(
        s,
        m.OffsetCommitResponse(
            topics=[
                m.OffsetCommitResponseTopic(
                    name="t", partitions=[m.OffsetCommitResponsePartition(partition_index=0)]
                )
            ]
        ),
    )
    [reply] = h.take_replies()
    assert reply.handle is handle and reply.error is None


def test_standalone_commit_without_subscription():
    h = Harness()
    handle = H()
    h.call("commit", {tp("t", 3): OffsetAndMetadata(5)}, handle, h.now + 10)
    h.find_coordinator()
    s = h.take(m.OffsetCommitRequest)
    assert s.request.generation_id_or_member_epoch == -1 and s.request.member_id == ""


@pytest.mark.parametrize(
    "code,exc,rejoin,reset",
    [
        (E.REBALANCE_IN_PROGRESS, cerr.RebalanceInProgressError, True, False),
        (E.UNKNOWN_MEMBER_ID, cerr.CommitFailedError, False, True),
        (E.ILLEGAL_GENERATION, cerr.CommitFailedError, False, True),
        (E.OFFSET_METADATA_TOO_LARGE, cerr.OffsetMetadataTooLargeError, False, False),
        (E.GROUP_AUTHORIZATION_FAILED, cerr.GroupAuthorizationError, False, False),
        (E.FENCED_INSTANCE_ID, cerr.FencedInstanceIdError, False, False),
    ],
)
def test_commit_error_mapping(code, exc, rejoin, reset):
    h = Harness().stable_member(parts=[tp("t", 0)], generation=3)
    h.call("commit", {tp("t", 0): OffsetAndMetadata(1)}, H(), h.now + 10)
    h.respond(
        h.take(m.OffsetCommitRequest),
        m.OffsetCommitResponse(
            topics=[
                m.OffsetCommitResponseTopic(
                    name="t", partitions=[m.OffsetCommitResponsePartition(partition_index=0, error_code=code)]
                )
            ]
        ),
    )
    [reply] = h.take_replies()
    assert isinstance(reply.error, exc)
    assert h.core.rejoin_needed == rejoin
    assert (h.core.generation == -1) == reset
    assert (h.core.error is not None) == (code == E.FENCED_INSTANCE_ID)


@pytest.mark.parametrize(
    "code", [E.COORDINATOR_LOAD_IN_PROGRESS, E.NOT_COORDINATOR, E.UNKNOWN_TOPIC_OR_PARTITION]
)
def test_commit_retriable_errors_retry(code):
    h = Harness().stable_member(parts=[tp("t", 0)])
    handle = H()
    h.call("commit", {tp("t", 0): OffsetAndMetadata(1)}, handle, h.now + 10)
    h.respond(
        h.take(m.OffsetCommitRequest),
        m.OffsetCommitResponse(
            topics=[
                m.OffsetCommitResponseTopic(
                    name="t", partitions=[m.OffsetCommitResponsePartition(partition_index=0, error_code=code)]
                )
            ]
        ),
    )
    assert h.take_replies() == []
    if h.core.coordinator is None:
        h.tick(0.01)
        h.find_coordinator()
    h.tick(1.0)
    s = h.take(m.OffsetCommitRequest)
    h.respond(
        s,
        m.OffsetCommitResponse(
            topics=[
                m.OffsetCommitResponseTopic(
                    name="t", partitions=[m.OffsetCommitResponsePartition(partition_index=0)]
                )
            ]
        ),
    )
    [reply] = h.take_replies()
    assert reply.handle is handle and reply.error is None


def test_commit_times_out_when_coordinator_unreachable():
    h = Harness()
    handle = H()
    deadline = h.now + 3
    h.call("commit", {tp("t", 0): OffsetAndMetadata(1)}, handle, deadline)
    for _ in range(40):
        h.tick(0.1)
        h.connects.clear()
        replies = h.take_replies()
        if replies:
            break
        h.disconnected(BOOTSTRAP, "refused") if h.core._conns[BOOTSTRAP].state == "connecting" else None
    else:
        pytest.fail("no reply")
    # the reply is the timeout, for this commit, and not before its deadline
    [reply] = replies
    assert reply.handle is handle
    assert isinstance(reply.error, cerr.KafkaTimeoutError) and "commit timed out" in str(reply.error)
    assert h.now >= deadline - 1e-9


def test_commit_during_rebalance_is_rejected():
    h = Harness()
    h.call("subscribe", ["t"])
    h.find_coordinator()
    h.take(m.JoinGroupRequest)
    h.call("commit", {tp("t", 0): OffsetAndMetadata(1)}, H(), h.now + 10)
    [reply] = h.take_replies()
    assert isinstance(reply.error, cerr.RebalanceInProgressError)


def test_commit_while_awaiting_revoke_ack_uses_current_generation():
    h = Harness(partition_assignment_strategy="range").stable_member(parts=[tp("t", 0)], generation=4)
    h.tick(3.0)
    h.respond(h.take(m.HeartbeatRequest), m.HeartbeatResponse(error_code=E.REBALANCE_IN_PROGRESS))
    [rev] = h.take_events(PartitionsRevoked)
    h.call("commit", {tp("t", 0): OffsetAndMetadata(9)}, H(), h.now + 10)
    assert h.take(m.OffsetCommitRequest).request.generation_id_or_member_epoch == 4


@pytest.mark.parametrize("version", [5, 7, 8, 9])
def test_fetch_committed(version):
    versions = dict(Harness().versions)
    versions[m.OffsetFetchRequest.API_KEY] = version
    h = Harness(versions=versions)
    handle = H()
    h.call("fetch_committed", [tp("t", 0), tp("t", 1), tp("u", 0)], handle, h.now + 10)
    h.find_coordinator()
    s = h.take(m.OffsetFetchRequest)
    parts = [m.OffsetFetchResponsePartitions if version >= 8 else m.OffsetFetchResponsePartition][0]
    topic_cls = m.OffsetFetchResponseTopics if version >= 8 else m.OffsetFetchResponseTopic
    topics = [
        topic_cls(
            name="t",
            partitions=[
                parts(partition_index=0, committed_offset=10, metadata="x"),
                parts(partition_index=1, committed_offset=-1),
            ],
        ),
        topic_cls(name="u", partitions=[parts(partition_index=0, error_code=E.UNKNOWN_TOPIC_OR_PARTITION)]),
    ]
    if version >= 8:
        assert s.request.groups[0].group_id == "g"
        resp = m.OffsetFetchResponse(groups=[m.OffsetFetchResponseGroup(group_id="g", topics=topics)])
    else:
        assert s.request.group_id == "g" and sorted(t.name for t in s.request.topics) == ["t", "u"]
        resp = m.OffsetFetchResponse(topics=topics)
    h.respond(s, resp)
    [reply] = h.take_replies()
    assert reply.value == {tp("t", 0): OffsetAndMetadata(10, "x", -1), tp("t", 1): None, tp("u", 0): None}


def test_fetch_committed_load_in_progress_retries():
    h = Harness()
    h.call("fetch_committed", [tp("t", 0)], H(), h.now + 10)
    h.find_coordinator()
    h.respond(
        h.take(m.OffsetFetchRequest),
        m.OffsetFetchResponse(
            groups=[m.OffsetFetchResponseGroup(group_id="g", error_code=E.COORDINATOR_LOAD_IN_PROGRESS)]
        ),
    )
    assert h.take_replies() == []
    h.tick(1.0)
    assert h.take(m.OffsetFetchRequest)


def test_a_commit_that_cannot_go_out_before_the_close_deadline_times_out_then():
    """No coordinator reachable: close waits for it up to its deadline, for the pending commit."""
    h = Harness()
    handle, closing = H(), H("c")
    h.call("commit", {tp("t", 0): OffsetAndMetadata(1)}, handle, h.now + 10)
    h.call("close", closing, h.now + 1, True)
    assert h.take_replies() == [] and not h.stopped
    h.tick(1.0)
    replies = {r.handle: r.error for r in h.take_replies()}
    assert isinstance(replies[handle], cerr.KafkaTimeoutError) and replies[closing] is None
    assert h.stopped and h.pending(m.OffsetCommitRequest) == []


def test_abandon_answers_everything():
    h = Harness().stable_member(parts=[tp("t", 0)])
    a, b = H("a"), H("b")
    h.call("commit", {tp("t", 0): OffsetAndMetadata(1)}, a, h.now + 10)
    h.call("fetch_committed", [tp("t", 0)], b, h.now + 10)
    boom = RuntimeError("gone")
    replies = h.core.abandon(boom)
    assert {r.handle for r in replies} == {a, b} and all(r.error is boom for r in replies)


# -- the network side drives a rebalance on its own; polls only feed the poll timer -------------------


def _no_poll(h):
    """Fail if anything calls ``core.poll``: only ``note_poll`` (the shared poll timestamp) is used."""

    def fail(now):
        raise AssertionError("core.poll called")

    h.core.poll = fail
    return h


def _answer_heartbeats(h, error=0):
    for hb in list(h.pending(m.HeartbeatRequest)):
        h.sends.remove(hb)
        h.respond(hb, m.HeartbeatResponse(error_code=error))


@pytest.mark.parametrize("owned", [(), (0, 1)])
def test_heartbeat_rebalance_is_rejoined_without_a_poll(owned):
    h = Harness(partition_assignment_strategy="range").stable_member(parts=[tp("t", p) for p in owned])
    _no_poll(h)
    h.take_events()
    h.tick(3.0)
    _answer_heartbeats(h, E.REBALANCE_IN_PROGRESS)
    if owned:  # eager: the user's on_partitions_revoked runs first; its ack is all that is needed
        [rev] = h.take_events(PartitionsRevoked)
        assert h.pending(m.JoinGroupRequest) == []
        h.call("ack", rev.seq)
    join = h.take(m.JoinGroupRequest)  # sent at once, by the network side
    h.respond(join, h.join_response(member="m1", generation=2, leader="other"))
    h.answer_sync([tp("t", 2)])  # SyncGroup followed the JoinGroup answer at once
    assert h.core.state is MemberState.STABLE and h.core.generation == 2 and h.core.stable
    [asg] = h.take_events(PartitionsAssigned)
    assert asg.assignment == tps("t", 2)


def test_failed_join_retries_without_a_poll():
    h = Harness().stable_member(parts=[])
    _no_poll(h)
    h.tick(3.0)
    _answer_heartbeats(h, E.REBALANCE_IN_PROGRESS)
    h.respond(h.take(m.JoinGroupRequest), h.join_response(error=E.COORDINATOR_LOAD_IN_PROGRESS))
    assert h.pending(m.JoinGroupRequest) == []
    assert h.core.next_deadline() <= h.now + 1.0  # the backoff is a deadline of the core
    h.tick(1.0)
    assert h.take(m.JoinGroupRequest)


def test_leader_rejoins_on_a_metadata_change_without_a_poll():
    h = Harness(metadata_max_age_ms=5000, partition_assignment_strategy="range")
    _no_poll(h)
    h.call("subscribe", ["t"])
    h.find_coordinator()
    h.answer_join(member="m1", leader="m1", members=[member_meta("m1", subscription_blob(["t"]))])
    h.respond(h.take(m.MetadataRequest), metadata_response({"t": 2}))
    h.answer_sync([tp("t", 0), tp("t", 1)])
    h.take_events()
    h.tick(5.0)
    h.respond(h.take(m.MetadataRequest), metadata_response({"t": 3}))
    [rev] = h.take_events(PartitionsRevoked)
    h.call("ack", rev.seq)
    assert h.take(m.JoinGroupRequest)


def test_note_poll_keeps_the_member_in_the_group():
    h = Harness(max_poll_interval_ms=10000, heartbeat_interval_ms=1000, session_timeout_ms=6000)
    h.stable_member(parts=[tp("t", 0)])
    _no_poll(h)
    for _ in range(30):  # 30 s, polled (quietly) every second
        h.now += 1.0
        h.core.note_poll(h.now)
        h.tick()
        _answer_heartbeats(h)
    assert h.core.stable and h.pending(m.LeaveGroupRequest) == []
    h.core.note_poll(h.now - 5.0)  # an older timestamp (another thread's) never moves the timer back
    assert h.core.heartbeat.last_poll == h.now


def test_poll_timeout_expires_with_quiet_polls_and_the_next_poll_rejoins():
    h = Harness(max_poll_interval_ms=10000, heartbeat_interval_ms=1000, session_timeout_ms=6000)
    h.stable_member(parts=[tp("t", 0)], member="m1")
    h.take_events()
    h.core.note_poll(h.now)
    assert h.core.next_deadline() <= h.now + 10.0  # the poll deadline is a deadline of the core
    for _ in range(10):  # then the user stops polling
        h.tick(1.0)
        _answer_heartbeats(h)
    assert h.core.state is MemberState.STABLE
    h.tick(0.5)
    assert h.take(m.LeaveGroupRequest).request.members[0].member_id == "m1"
    [lost] = h.take_events(PartitionsLost)
    assert lost.partitions == tps("t", 0)
    assert not h.core.stable
    h.core.note_poll(h.now + 1.0)  # a quiet poll only restarts the timer...
    h.tick(1.0)
    assert h.pending(m.JoinGroupRequest) == []
    h.call("poll")  # ...the poll that found the group unstable rejoins
    assert h.take(m.JoinGroupRequest)


# ---- commit order and zombie commits (review findings) ------------------------------------------

def _commit_response(code=0, partitions=(0,)):
    return m.OffsetCommitResponse(topics=[m.OffsetCommitResponseTopic(
        name="t", partitions=[m.OffsetCommitResponsePartition(partition_index=p, error_code=code)
                              for p in partitions])])


def _offset_of(send, partition=0):
    return next(p.committed_offset for p in send.request.topics[0].partitions if p.partition_index == partition)


def test_a_failed_commit_is_not_retried_after_a_later_commit_of_its_partition():
    """commit 10 fails retriably, commit 20 lands: 10 must not be re-sent (the offset would go back)."""
    h = Harness().stable_member(parts=[tp("t", 0)], generation=3)
    c10, c20 = H(), H()
    h.call("commit", {tp("t", 0): OffsetAndMetadata(10)}, c10, h.now + 60)
    h.respond(h.take(m.OffsetCommitRequest), _commit_response(E.COORDINATOR_LOAD_IN_PROGRESS))
    assert h.take_replies() == []  # waiting to retry
    h.call("commit", {tp("t", 0): OffsetAndMetadata(20)}, c20, h.now + 60)
    s20 = h.take(m.OffsetCommitRequest)
    assert _offset_of(s20) == 20
    h.respond(s20, _commit_response())
    h.tick(2.0)
    assert h.pending(m.OffsetCommitRequest) == []
    replies = {r.handle: r for r in h.take_replies()}
    assert replies[c20].error is None
    assert isinstance(replies[c10].error, cerr.RetriableCommitFailedError)


def test_commits_in_flight_together_the_older_is_not_retried_after_a_disconnect():
    h = Harness().stable_member(parts=tps("t", 0, 1), generation=3)
    a, b = H(), H()
    h.call("commit", {tp("t", 0): OffsetAndMetadata(10), tp("t", 1): OffsetAndMetadata(5)}, a, h.now + 60)
    h.call("commit", {tp("t", 0): OffsetAndMetadata(20)}, b, h.now + 60)
    assert len(h.pending(m.OffsetCommitRequest)) == 2
    h.disconnected(COORDINATOR, "reset")
    [ra] = h.take_replies()
    assert ra.handle is a and isinstance(ra.error, cerr.RetriableCommitFailedError)
    h.tick(0.01)
    h.find_coordinator()
    h.tick(2.0)
    [s] = h.pending(m.OffsetCommitRequest)
    assert _offset_of(s) == 20 and len(s.request.topics[0].partitions) == 1


def test_a_failed_commit_with_no_later_commit_of_its_partitions_is_retried():
    h = Harness().stable_member(parts=tps("t", 0, 1), generation=3)
    a, b = H(), H()
    h.call("commit", {tp("t", 0): OffsetAndMetadata(10)}, a, h.now + 60)
    h.respond(h.take(m.OffsetCommitRequest), _commit_response(E.COORDINATOR_LOAD_IN_PROGRESS))
    h.call("commit", {tp("t", 1): OffsetAndMetadata(7)}, b, h.now + 60)  # another partition
    h.respond(h.take(m.OffsetCommitRequest), _commit_response(partitions=(1,)))
    h.tick(2.0)
    retry = h.take(m.OffsetCommitRequest)
    assert _offset_of(retry) == 10
    h.respond(retry, _commit_response())
    assert {r.handle: r.error for r in h.take_replies()} == {a: None, b: None}


def test_a_member_that_lost_its_partitions_cannot_commit_under_the_next_generation():
    """Kicked out (heartbeat UNKNOWN_MEMBER_ID), the core rejoins on its own; a commit made from the
    user's old view (epoch 0) fails with CommitFailedError and nothing is sent, while one made
    after the loss was seen (the epoch the PartitionsLost event carries) goes out."""
    h = Harness().stable_member(parts=[tp("t", 0)], generation=2)
    h.tick(3.0)
    h.respond(h.take(m.HeartbeatRequest), m.HeartbeatResponse(error_code=E.UNKNOWN_MEMBER_ID))
    [lost] = h.take_events(PartitionsLost)
    assert lost.epoch == 1 == h.core.epoch
    h.answer_join(member="m1-new", generation=3, leader="other")
    h.answer_sync([tp("t", 1)])
    assigned = h.take_events(PartitionsAssigned)[-1]  # (the first assignment's event is there too)
    assert assigned.generation == 3 and assigned.epoch == 1
    zombie = H()
    h.call("commit", {tp("t", 0): OffsetAndMetadata(100)}, zombie, h.now + 10, epoch=0)
    assert h.pending(m.OffsetCommitRequest) == []
    [r] = h.take_replies()
    assert r.handle is zombie and isinstance(r.error, cerr.CommitFailedError)
    h.call("commit", {tp("t", 1): OffsetAndMetadata(5)}, H(), h.now + 10, epoch=lost.epoch)
    s = h.take(m.OffsetCommitRequest)
    assert (s.request.generation_id_or_member_epoch, s.request.member_id) == (3, "m1-new")


def test_a_retry_pending_across_a_loss_is_not_sent_under_the_new_generation():
    h = Harness().stable_member(parts=tps("t", 0, 1), generation=3)
    a, b = H(), H()
    h.call("commit", {tp("t", 0): OffsetAndMetadata(100)}, a, h.now + 60, epoch=0)
    h.respond(h.take(m.OffsetCommitRequest), _commit_response(E.COORDINATOR_LOAD_IN_PROGRESS))
    h.call("commit", {tp("t", 1): OffsetAndMetadata(7)}, b, h.now + 60, epoch=0)
    h.respond(h.take(m.OffsetCommitRequest), _commit_response(E.UNKNOWN_MEMBER_ID, partitions=(1,)))
    assert h.core.generation == -1 and h.core.epoch == 1  # kicked out: partitions lost
    h.answer_join(member="m1-new", generation=5, leader="other")
    h.answer_sync([tp("t", 0)])
    h.tick(2.0)
    assert h.pending(m.OffsetCommitRequest) == []
    replies = {r.handle: r.error for r in h.take_replies()}
    assert isinstance(replies[a], cerr.CommitFailedError) and isinstance(replies[b], cerr.CommitFailedError)


def test_subscribing_long_after_construction_does_not_leave_for_a_stale_poll_timer():
    h = Harness(max_poll_interval_ms=4000)
    h.tick(10.0)  # constructed, then idle longer than max.poll.interval.ms
    h.call("subscribe", ["t"])
    h.find_coordinator()
    h.answer_join(member="m1", generation=1, leader="other")
    assert h.pending(m.LeaveGroupRequest) == []
    h.answer_sync([tp("t", 0)])
    assert h.core.state is MemberState.STABLE and h.core.generation == 1


@pytest.mark.parametrize("code", [E.UNKNOWN_SERVER_ERROR, E.INVALID_REQUEST])
def test_an_unexpected_join_error_rejoins_after_a_backoff_instead_of_failing_for_good(code):
    from client.coordinator import JoinError
    h = Harness().first_join_fails(code)
    assert h.take_events(GroupFailed) == [] and h.core.error is None
    [ev] = h.take_events(JoinError)  # for the user's poll to raise, once
    assert ev.error.code == code
    assert h.pending(m.JoinGroupRequest) == []  # backoff first
    h.tick(1.5)
    h.answer_join(member="m1", generation=1, leader="other")
    h.answer_sync([tp("t", 0)])
    assert h.core.state is MemberState.STABLE


def test_a_commit_with_no_time_left_is_still_sent_once_when_the_coordinator_is_ready():
    """As Kafka's commitSync(Duration.ZERO) / close(0): sent once; only waiting is bounded."""
    h = Harness().stable_member(parts=[tp("t", 0)], generation=3)
    handle = H()
    h.call("commit", {tp("t", 0): OffsetAndMetadata(42)}, handle, h.now)
    s = h.take(m.OffsetCommitRequest)
    assert _offset_of(s) == 42
    h.respond(s, _commit_response(E.COORDINATOR_LOAD_IN_PROGRESS))  # no retry: no time left
    [r] = h.take_replies()
    assert r.handle is handle and isinstance(r.error, cerr.CoordinatorLoadInProgressError)
    assert h.pending(m.OffsetCommitRequest) == []


def test_a_commit_with_no_time_left_and_no_coordinator_times_out_unsent():
    h = Harness()
    handle = H()
    h.call("commit", {tp("t", 0): OffsetAndMetadata(1)}, handle, h.now)
    [r] = h.take_replies()
    assert isinstance(r.error, cerr.KafkaTimeoutError) and h.pending(m.OffsetCommitRequest) == []


# ---- a failed rebalance step keeps the member rebalancing (Kafka's requestRejoin) ---------------


def _cooperative_member_rejoining():
    """A cooperative member stable at generation 3 with t-0 and t-1, told to rejoin: its JoinGroup
    is in flight. (A commit it made before is not in the way.)"""
    h = Harness(partition_assignment_strategy="cooperative-sticky")
    h.stable_member(parts=[tp("t", 0), tp("t", 1)], member="m1", generation=3)
    h.take_events()
    h.tick(3.0)
    h.respond(h.take(m.HeartbeatRequest), m.HeartbeatResponse(error_code=E.REBALANCE_IN_PROGRESS))
    return h, h.take(m.JoinGroupRequest)


def _fail(h, send, how):
    if how == "dropped":
        h.disconnected(COORDINATOR, "reset by peer")
    elif isinstance(send.request, m.JoinGroupRequest):
        h.respond(send, h.join_response(error=how, member="m1"))
    else:
        h.respond(send, m.SyncGroupResponse(error_code=how))


@pytest.mark.parametrize(
    "step,how",
    [
        ("join", "dropped"),
        ("join", E.NOT_COORDINATOR),
        ("join", E.COORDINATOR_LOAD_IN_PROGRESS),
        ("sync", "dropped"),
        ("sync", E.COORDINATOR_NOT_AVAILABLE),
    ],
)
def test_a_rebalance_step_lost_keeps_the_member_rebalancing_and_commits_get_rebalance_in_progress(step, how):
    """The member keeps its generation and partitions, so a commit during the rebalance is
    RebalanceInProgressError (poll and commit again), not CommitFailedError (partitions gone)."""
    h, join = _cooperative_member_rejoining()
    send = join
    if step == "sync":
        h.respond(join, h.join_response(member="m1", generation=4, leader="m0"))
        send = h.take(m.SyncGroupRequest)
    _fail(h, send, how)
    expected = MemberState.PREPARING_REBALANCE if step == "join" else MemberState.COMPLETING_REBALANCE
    assert h.core.state is expected and h.core.rejoin_needed
    assert h.core.owned == tps("t", 0, 1) and h.core.generation == (3 if step == "join" else 4)
    assert h.take_events() == []  # nothing lost
    handle = H()
    h.call("commit", {tp("t", 0): OffsetAndMetadata(5)}, handle, h.now + 30, epoch=0)
    if h.core.coordinator is None:
        h.tick(0.01)
        h.find_coordinator()
    assert h.pending(m.OffsetCommitRequest) == []
    [r] = h.take_replies()
    assert r.handle is handle and isinstance(r.error, cerr.RebalanceInProgressError)
    # ...and the member joins again, as the owner of its partitions, then commits.
    h.tick(1.5)
    rejoin = h.take(m.JoinGroupRequest)
    _, sub = decode_join_subscription(rejoin)
    assert sorted(p for x in sub.owned_partitions for p in x.partitions) == [0, 1]
    assert rejoin.request.member_id == "m1"
    h.respond(rejoin, h.join_response(member="m1", generation=5, leader="m0"))
    h.answer_sync([tp("t", 0), tp("t", 1)])
    assert h.core.stable
    h.call("commit", {tp("t", 0): OffsetAndMetadata(5)}, H(), h.now + 30, epoch=0)
    assert h.take(m.OffsetCommitRequest).request.generation_id_or_member_epoch == 5


def test_a_failed_join_sends_one_join_at_a_time_even_when_a_rejoin_is_asked_meanwhile():
    h, join = _cooperative_member_rejoining()
    h.call("subscribe", ["t", "u"])  # a rejoin asked while the JoinGroup is in flight
    assert h.pending(m.JoinGroupRequest) == []
    h.respond(join, h.join_response(error=E.REBALANCE_IN_PROGRESS, member="m1"))
    [again] = h.pending(m.JoinGroupRequest)
    assert decode_join_subscription(again)[1].topics == ["t", "u"]


def test_a_commit_made_before_a_loss_fails_with_commit_failed_even_while_the_member_rejoins():
    """CommitFailedError stays the answer for a real loss: the heartbeat says the generation is gone,
    the member rejoins at once (PREPARING_REBALANCE), and a commit from the user's old view (epoch 0)
    must not be told to just retry after a poll."""
    h = Harness().stable_member(parts=[tp("t", 0)], generation=2)
    h.take_events()
    h.tick(3.0)
    h.respond(h.take(m.HeartbeatRequest), m.HeartbeatResponse(error_code=E.ILLEGAL_GENERATION))
    assert h.core.state is MemberState.PREPARING_REBALANCE  # rejoining already
    h.call("commit", {tp("t", 0): OffsetAndMetadata(9)}, H(), h.now + 10, epoch=0)
    [r] = h.take_replies()
    assert isinstance(r.error, cerr.CommitFailedError)
    h.call("commit", {tp("t", 0): OffsetAndMetadata(9)}, H(), h.now + 10, epoch=h.core.epoch)
    [r] = h.take_replies()
    assert isinstance(r.error, cerr.RebalanceInProgressError)  # the loss was seen: just rebalancing


# ---- join errors the group may outgrow: raised once, then the member joins again ----------------


@pytest.mark.parametrize(
    "code,exc",
    [
        (E.GROUP_MAX_SIZE_REACHED, cerr.GroupMaxSizeReachedError),
        (E.INCONSISTENT_GROUP_PROTOCOL, cerr.InconsistentGroupProtocolError),
        (E.INVALID_SESSION_TIMEOUT, cerr.InvalidSessionTimeoutError),
        (E.UNRELEASED_INSTANCE_ID, cerr.UnreleasedInstanceIdError),
    ],
)
def test_join_errors_the_group_may_outgrow_are_raised_once_and_the_member_joins_again(code, exc):
    """As Kafka's joinGroupIfNeeded: thrown from that poll, and the next poll joins again."""
    from client.coordinator import JoinError

    h = Harness()
    h.call("subscribe", ["t"])
    h.find_coordinator()
    h.respond(h.take(m.JoinGroupRequest), h.join_response(member="minted-1", error=E.MEMBER_ID_REQUIRED))
    h.respond(h.take(m.JoinGroupRequest), h.join_response(member="", error=code))
    assert h.take_events(GroupFailed) == [] and h.core.error is None
    [ev] = h.take_events(JoinError)
    assert isinstance(ev.error, exc)
    assert h.pending(m.JoinGroupRequest) == []  # after a backoff
    h.tick(1.5)
    join = h.take(m.JoinGroupRequest)
    # GROUP_MAX_SIZE_REACHED: the coordinator forgot the member; it joins as a new one.
    assert join.request.member_id == ("" if code == E.GROUP_MAX_SIZE_REACHED else "minted-1")
    h.respond(join, h.join_response(member="m9", generation=1, leader="other"))
    h.answer_sync([tp("t", 0)])
    assert h.core.stable and h.core.owned == tps("t", 0)
    h.call("commit", {tp("t", 0): OffsetAndMetadata(1)}, H(), h.now + 5)
    assert h.take(m.OffsetCommitRequest)


def test_a_sync_error_the_group_may_outgrow_is_raised_once_and_the_member_joins_again():
    from client.coordinator import JoinError

    h = Harness()
    h.call("subscribe", ["t"])
    h.find_coordinator()
    h.answer_join(member="m2", leader="m1", generation=5)
    h.answer_sync([], error=E.INCONSISTENT_GROUP_PROTOCOL)
    assert h.core.error is None and h.take_events(GroupFailed) == []
    [ev] = h.take_events(JoinError)
    assert isinstance(ev.error, cerr.InconsistentGroupProtocolError)
    h.tick(1.5)
    assert h.take(m.JoinGroupRequest).request.member_id == "m2"


# ---- a retry never goes out under a newer generation ---------------------------------------------


def test_a_retried_commit_is_not_sent_under_the_generation_of_a_rebalance_completed_meanwhile():
    """t-0's commit fails retriably at generation 3; before the retry, a cooperative
    rebalance completes at generation 4 and moves t-0 away. The retry must not write t-0's old
    offset under generation 4: it fails with CommitFailedError (Kafka's answer to a commit of a
    stale generation from a member that is not rebalancing)."""
    h = Harness(partition_assignment_strategy="cooperative-sticky")
    h.stable_member(parts=[tp("t", 0), tp("t", 1)], member="m1", generation=3)
    h.take_events()
    h.tick(3.0)
    hb = h.take(m.HeartbeatRequest)
    handle = H()
    h.call("commit", {tp("t", 0): OffsetAndMetadata(10)}, handle, h.now + 60, epoch=0)
    h.respond(h.take(m.OffsetCommitRequest), _commit_response(E.COORDINATOR_LOAD_IN_PROGRESS))
    h.respond(hb, m.HeartbeatResponse(error_code=E.REBALANCE_IN_PROGRESS))
    h.respond(h.take(m.JoinGroupRequest), h.join_response(member="m1", generation=4, leader="m0"))
    h.answer_sync([tp("t", 1)])
    [rev] = h.take_events(PartitionsRevoked)
    assert rev.partitions == tps("t", 0) and h.core.generation == 4 and h.core.epoch == 0
    h.tick(2.0)
    assert h.pending(m.OffsetCommitRequest) == []
    [r] = h.take_replies()
    assert r.handle is handle and isinstance(r.error, cerr.CommitFailedError)
    assert "generation 3 -> 4" in str(r.error)


def test_a_retried_commit_during_the_rebalance_that_followed_gets_rebalance_in_progress():
    h = Harness(partition_assignment_strategy="cooperative-sticky")
    h.stable_member(parts=[tp("t", 0)], member="m1", generation=3)
    h.tick(3.0)
    hb = h.take(m.HeartbeatRequest)
    handle = H()
    h.call("commit", {tp("t", 0): OffsetAndMetadata(10)}, handle, h.now + 60, epoch=0)
    h.respond(h.take(m.OffsetCommitRequest), _commit_response(E.COORDINATOR_LOAD_IN_PROGRESS))
    h.respond(hb, m.HeartbeatResponse(error_code=E.REBALANCE_IN_PROGRESS))
    h.take(m.JoinGroupRequest)  # parked
    h.tick(2.0)
    [r] = h.take_replies()
    assert r.handle is handle and isinstance(r.error, cerr.RebalanceInProgressError)


# ---- close sends pending commits first (Kafka's ConsumerCoordinator.close) ------------------------


def test_close_waits_for_a_commit_in_flight_then_leaves():
    h = Harness().stable_member(parts=[tp("t", 0)], member="m1", generation=3)
    commit, closing = H("commit"), H("close")
    h.call("commit", {tp("t", 0): OffsetAndMetadata(77)}, commit, h.now + 60)
    s = h.take(m.OffsetCommitRequest)
    h.call("close", closing, h.now + 5, True)
    assert h.pending(m.LeaveGroupRequest) == [] and h.take_replies() == []  # the commit first
    h.respond(s, _commit_response())
    [r] = h.take_replies()
    assert r.handle is commit and r.error is None
    leave = h.take(m.LeaveGroupRequest)
    assert not h.stopped
    h.respond(leave, m.LeaveGroupResponse())
    assert [r.handle for r in h.take_replies()] == [closing] and h.stopped


def test_close_retries_a_pending_commit_within_its_deadline():
    h = Harness().stable_member(parts=[tp("t", 0)], member="m1", generation=3)
    commit = H("commit")
    h.call("commit", {tp("t", 0): OffsetAndMetadata(77)}, commit, h.now + 60)
    h.respond(h.take(m.OffsetCommitRequest), _commit_response(E.COORDINATOR_LOAD_IN_PROGRESS))
    h.call("close", H("close"), h.now + 5, True)
    assert h.take_replies() == []
    h.tick(1.0)
    retry = h.take(m.OffsetCommitRequest)
    assert _offset_of(retry) == 77
    h.tick(3.0)
    assert not h.stopped and h.pending(m.HeartbeatRequest)  # still a member, heartbeating
    h.respond(retry, _commit_response())
    assert [(r.handle, r.error) for r in h.take_replies()] == [(commit, None)]
    h.respond(h.take(m.LeaveGroupRequest), m.LeaveGroupResponse())
    assert h.stopped


def test_close_finds_the_coordinator_again_for_a_pending_commit():
    h = Harness().stable_member(parts=[tp("t", 0)], member="m1", generation=3)
    commit = H("commit")
    h.call("commit", {tp("t", 0): OffsetAndMetadata(77)}, commit, h.now + 60)
    h.take(m.OffsetCommitRequest)
    h.disconnected(COORDINATOR, "reset by peer")
    h.call("close", H("close"), h.now + 5, True)
    h.tick(0.5)
    h.find_coordinator()
    h.tick(0.5)
    h.respond(h.take(m.OffsetCommitRequest), _commit_response())
    assert [(r.handle, r.error) for r in h.take_replies()] == [(commit, None)]
    h.respond(h.take(m.LeaveGroupRequest), m.LeaveGroupResponse())
    assert h.stopped


def test_close_at_its_deadline_fails_the_commit_in_flight_and_still_sends_leave():
    h = Harness().stable_member(parts=[tp("t", 0)], member="m1", generation=3)
    commit, closing = H("commit"), H("close")
    h.call("commit", {tp("t", 0): OffsetAndMetadata(77)}, commit, h.now + 60)
    h.take(m.OffsetCommitRequest)  # never answered
    h.call("close", closing, h.now + 2, True)
    h.tick(1.0)
    assert not h.stopped and h.pending(m.LeaveGroupRequest) == []
    h.tick(1.0)
    replies = {r.handle: r.error for r in h.take_replies()}
    assert isinstance(replies[commit], cerr.KafkaTimeoutError) and replies[closing] is None
    assert h.stopped and h.take(m.LeaveGroupRequest)  # best effort, not awaited


def test_a_stray_leave_answer_does_not_end_the_close_early():
    h = Harness(max_poll_interval_ms=5000).stable_member(parts=[tp("t", 0)], member="m1")
    h.tick(5.5)  # no poll: the member leaves (poll timeout)
    stray = h.take(m.LeaveGroupRequest)
    handle = H()
    h.call("fetch_committed", [tp("t", 0)], handle, h.now + 30)
    fetch = h.take(m.OffsetFetchRequest)
    h.call("close", H("close"), h.now + 5, True)
    h.respond(stray, m.LeaveGroupResponse())
    assert not h.stopped
    h.respond(fetch, m.OffsetFetchResponse(groups=[m.OffsetFetchResponseGroup(group_id="g", topics=[])]))
    assert [r.handle for r in h.take_replies()][0] is handle and h.stopped


def test_unreachable_brokers_are_warned_about_and_timed_in_the_snapshot(caplog):
    # A wrong port used to give an INFO line per attempt and nothing else: poll returned an empty
    # assignment forever. Now each address that cannot be reached gets a WARNING naming it and the
    # error (again every 10 s while it lasts), and the snapshot says since when no coordinator was
    # reached and why, which the user's poll turns into NoBrokersAvailableError.
    import logging

    h = Harness(broker_unreachable_timeout_ms=5000)
    caplog.set_level(logging.INFO, logger="herd.client")
    t0 = h.now
    h.call("subscribe", ["t"])
    assert h.core.snapshot().unreachable_since == t0 and h.core.snapshot().connect_failure == ""
    for _ in range(30):  # 15 s of refused connections, over both bootstrap servers
        if any(c.conn == BOOTSTRAP for c in h.connects):
            h.connects.clear()
            h.disconnected(BOOTSTRAP, "connect failed: ECONNREFUSED")
        h.tick(0.5)
    snap = h.core.snapshot()
    assert snap.unreachable_since == t0 and not snap.stable
    assert snap.connect_failure.startswith("cannot reach the bootstrap server b")
    assert snap.connect_failure.endswith(": connect failed: ECONNREFUSED")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    for addr in ("b1:9092", "b2:9093"):
        mine = [w for w in warnings if addr in w]
        assert mine[0].startswith(f"cannot reach the bootstrap server {addr}: connect failed: ECONNREFUSED; "
                                  "retrying") and "broker.unreachable.timeout.ms (5000)" in mine[0]
        assert 2 <= len(mine) <= 3, mine  # the first, then one per 10 s: not one per attempt
    # the broker comes back: reached, and the outage is over
    h.find_coordinator()
    snap = h.core.snapshot()
    assert snap.unreachable_since is None and snap.connect_failure == ""
    assert any(r.levelno == logging.INFO and r.getMessage().startswith("reached b") for r in caplog.records)
    # the coordinator connection drops (a restart): the outage starts then, with no failure yet
    h.now += 1
    h.disconnected(COORDINATOR, "closed by the broker")
    snap = h.core.snapshot()
    assert snap.unreachable_since == h.now and snap.connect_failure == ""


def test_an_unreachable_coordinator_is_warned_about_as_a_move_not_as_no_brokers(caplog):
    """A cluster node that died while it coordinated the group: the member's warning says it looks the
    coordinator up again (the group moves once the lease ends), not the bootstrap outage's
    NoBrokersAvailableError countdown (issue 33 item 4)."""
    import logging

    h = Harness()
    caplog.set_level(logging.INFO, logger="herd.client")
    h.call("subscribe", ["t"])
    h.find_coordinator()
    h.connects.clear()
    h.disconnected(COORDINATOR, "closed by the broker")
    for _ in range(40):
        if any(c.conn == COORDINATOR for c in h.connects):
            h.connects.clear()
            h.disconnected(COORDINATOR, "connect failed: ECONNREFUSED")
            break
        if h.pending(m.FindCoordinatorRequest):  # the bootstrap still names the dead node
            if any(c.conn == BOOTSTRAP for c in h.connects):
                h.connected(BOOTSTRAP)
            s = h.take(m.FindCoordinatorRequest, BOOTSTRAP)
            h.respond(s, m.FindCoordinatorResponse(node_id=1, host="c1", port=9092, coordinators=[
                m.FindCoordinatorResponseCoordinator(key=h.cfg.group_id, node_id=1, host="c1", port=9092)]))
        h.tick(0.25)
    else:
        pytest.fail("no new connection attempt to the coordinator")
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    mine = [w for w in warnings if w.startswith("cannot reach the group coordinator c1:9092")]
    assert mine and "finding the group's coordinator again" in mine[0] and "lease" in mine[0]
    assert not any("NoBrokersAvailableError" in w for w in warnings), warnings
