"""KIP-848 consumer groups served by the group coordinator (the facade the runtime calls), with
the manual clock: ConsumerGroupHeartbeat/Describe through ``handle``, records replayed by a fresh
coordinator, the shared timers, classic and consumer groups on one group id, offsets with member
epochs, ListGroups/DescribeGroups/DeleteGroups/OffsetDelete for consumer groups, topics changed."""
from __future__ import annotations

import uuid

from coordinator.core.consumer import StaticTopics
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.versions import CONSUMER_GROUP_DESCRIBE, CONSUMER_GROUP_HEARTBEAT, api_versions_response
from protocol import errors as E
from protocol import messages as m
from tests.coordinator.core.test_group_harness import (
    COMMIT,
    DEFAULT_PROTOCOLS,
    DELETE,
    DESCRIBE,
    FETCH,
    JOIN,
    LIST,
    ODELETE,
    Harness,
)

CGHB, CGD = CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE
T = uuid.UUID(int=7).bytes
U = uuid.UUID(int=8).bytes


def harness(**kw):
    settings = dict(group_consumer_session_timeout_ms=3000, group_consumer_min_session_timeout_ms=1000,
                    group_consumer_heartbeat_interval_ms=500, group_consumer_min_heartbeat_interval_ms=100)
    settings.update(kw)
    h = Harness(**settings)
    h.topics = StaticTopics({"t": (T, 4), "u": (U, 2)})
    h.gc.set_topics(h.topics)
    return h


def join(h, gid="g", mid="", topics=("t",), epoch=0, **kw):
    return h.call(CGHB, 1 if mid else 0, m.ConsumerGroupHeartbeatRequest(
        group_id=gid, member_id=mid, member_epoch=epoch, rebalance_timeout_ms=5000,
        subscribed_topic_names=list(topics), topic_partitions=[], **kw))


def beat(h, gid, mid, epoch, owned):
    return h.call(CGHB, 1, m.ConsumerGroupHeartbeatRequest(
        group_id=gid, member_id=mid, member_epoch=epoch,
        topic_partitions=[m.ConsumerGroupHeartbeatRequestTopicPartitions(topic_id=tid, partitions=sorted(ps))
                          for tid, ps in owned.items()]))


def owned_of(resp):
    if resp.assignment is None:
        return None
    return {tp.topic_id: set(tp.partitions) for tp in resp.assignment.topic_partitions}


def converge(h, gid, members: dict):
    """Heartbeat every member (mid -> [epoch, owned]) until nothing changes."""
    for _ in range(20):
        moved = False
        for mid, st in members.items():
            r = beat(h, gid, mid, st[0], st[1])
            assert r.error_code == 0, r
            new = owned_of(r)
            if r.member_epoch != st[0] or (new is not None and new != st[1]):
                moved = True
            st[0] = r.member_epoch
            if new is not None:
                st[1] = new
        if not moved:
            return members
    raise AssertionError("did not converge")


def test_apis_and_the_group_version_feature_are_advertised():
    r = api_versions_response()
    keys = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
    assert keys[CGHB] == (0, 1) and keys[CGD] == (0, 0)
    assert [(f.name, f.min_version_level, f.max_version_level) for f in r.finalized_features] == [
        ("group.version", 1, 1)]
    assert [(f.name, f.min_version, f.max_version) for f in r.supported_features] == [("group.version", 0, 1)]
    assert r.finalized_features_epoch >= 0
    m.ApiVersionsResponse.decode(r.encode(3), 3)


def test_heartbeat_writes_records_answers_with_them_and_a_fresh_coordinator_replays_them():
    h = harness()
    a = join(h)
    assert a.error_code == 0 and a.member_epoch == 2 and a.heartbeat_interval_ms == 500
    assert owned_of(a) == {T: {0, 1, 2, 3}}
    # the answer came out of the same Result as its records (the runtime sends it once durable)
    res = h.results[-1]
    assert res.writes and all(w[0] == h.gc.shard_for("g") for w in res.writes)
    b = join(h)
    assert b.error_code == 0
    st = converge(h, "g", {a.member_id: [a.member_epoch, owned_of(a)], b.member_id: [b.member_epoch, {}]})
    owned = [st[mid][1] for mid in st]
    assert sorted(len(o.get(T, ())) for o in owned) == [2, 2]
    assert not owned[0][T] & owned[1][T]
    # replay: a fresh coordinator fed every write has the same group, members and epochs
    fresh = GroupCoordinator(h.config.group_config())
    fresh.set_topics(h.topics)
    for sid, k, v in h.writes:
        fresh.replay(sid, k, v)
    fresh.loaded(h.now, h.wall)
    old = h.gc.describe_group("g")
    new = fresh.describe_group("g")
    assert new["type"] == "consumer" and new["state"] == "Stable"
    assert new["group_epoch"] == old["group_epoch"] and new["members"] == old["members"]
    assert {mm["member_id"]: mm["member_epoch"] for mm in new["members"]} == {mid: st[mid][0] for mid in st}


def test_session_timeout_fences_through_the_shared_timers_and_the_recorder_says_why():
    h = harness()
    a = join(h)
    b = join(h)
    st = converge(h, "g", {a.member_id: [a.member_epoch, owned_of(a)], b.member_id: [b.member_epoch, {}]})
    # only a keeps heartbeating: b's session (3 s) expires, a gets everything
    for _ in range(8):
        h.advance(500)
        r = beat(h, "g", a.member_id, st[a.member_id][0], st[a.member_id][1])
        st[a.member_id][0] = r.member_epoch
        if owned_of(r) is not None:
            st[a.member_id][1] = owned_of(r)
    d = h.gc.describe_group("g")
    assert [mm["member_id"] for mm in d["members"]] == [a.member_id]
    assert st[a.member_id][1] == {T: {0, 1, 2, 3}}
    reasons = [e["reason"] for e in h.gc.group_history("g")]
    assert any("joined" in r for r in reasons)
    assert any(f"member {b.member_id} session expired" in r for r in reasons)
    assert h.gc.stats["consumer_heartbeats"] >= 10


def test_consumer_group_describe_and_a_classic_id():
    h = harness()
    a = join(h)
    r = h.call(CGD, 0, m.ConsumerGroupDescribeRequest(group_ids=["g", "nope"], include_authorized_operations=True))
    g, nope = r.groups
    assert (g.error_code, g.group_state, g.assignor_name) == (0, "Stable", "uniform")
    assert [(mm.member_id, mm.member_epoch) for mm in g.members] == [(a.member_id, 2)]
    assert g.members[0].assignment.topic_partitions[0].topic_name == "t"
    assert nope.error_code == E.GROUP_ID_NOT_FOUND
    # a classic group id: not a consumer group
    h.call(COMMIT, 8, m.OffsetCommitRequest(group_id="simple", generation_id_or_member_epoch=-1, topics=[
        m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(0, 5)])]))
    joined = h.call(JOIN, 5, m.JoinGroupRequest(group_id="classic", member_id="", protocol_type="consumer",
                                                session_timeout_ms=10000, rebalance_timeout_ms=10000, protocols=[
                                                    m.JoinGroupRequestProtocol(n, meta)
                                                    for n, meta in DEFAULT_PROTOCOLS]))
    assert joined.error_code == E.MEMBER_ID_REQUIRED
    r = h.call(CGD, 0, m.ConsumerGroupDescribeRequest(group_ids=["simple"]))
    assert r.groups[0].error_code == E.GROUP_ID_NOT_FOUND and "not a consumer group" in r.groups[0].error_message


def test_an_empty_classic_group_gives_way_to_a_consumer_group_and_back():
    h = harness()
    # offsets-only commits make a "simple" classic group
    h.call(COMMIT, 8, m.OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=-1, topics=[
        m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(0, 42)])]))
    assert h.gc.describe_group("g")["type"] == "classic"
    a = join(h)
    assert a.error_code == 0
    assert h.gc.describe_group("g")["type"] == "consumer"
    # its offsets stayed, and the member reads them with its epoch
    f = h.call(FETCH, 9, m.OffsetFetchRequest(groups=[m.OffsetFetchRequestGroup(
        group_id="g", member_id=a.member_id, member_epoch=a.member_epoch,
        topics=[m.OffsetFetchRequestTopics("t", [0])])]))
    assert f.groups[0].error_code == 0 and f.groups[0].topics[0].partitions[0].committed_offset == 42
    # a classic JoinGroup while it has members: INCONSISTENT_GROUP_PROTOCOL
    jr = m.JoinGroupRequest(group_id="g", member_id="", protocol_type="consumer", session_timeout_ms=10000,
                            rebalance_timeout_ms=10000,
                            protocols=[m.JoinGroupRequestProtocol(n, meta) for n, meta in DEFAULT_PROTOCOLS])
    assert h.call(JOIN, 5, jr).error_code == E.INCONSISTENT_GROUP_PROTOCOL
    # the member leaves: the Empty consumer group gives way to a classic one
    left = h.call(CGHB, 1, m.ConsumerGroupHeartbeatRequest(group_id="g", member_id=a.member_id, member_epoch=-1))
    assert left.error_code == 0 and left.member_epoch == -1
    assert h.call(JOIN, 5, jr).error_code == E.MEMBER_ID_REQUIRED
    d = h.gc.describe_group("g")
    assert d["type"] == "classic"
    # a consumer member for a classic group with members: GROUP_ID_NOT_FOUND
    mid = h.replies[max(h.replies, key=lambda t: t[2])].member_id
    jr.member_id = mid
    assert h.call(JOIN, 5, jr).error_code == 0  # the classic member is in (Empty -> rebalance)
    r = join(h)
    assert r.error_code == E.GROUP_ID_NOT_FOUND and "not a consumer group" in r.error_message
    # replay keeps the types apart
    fresh = GroupCoordinator(h.config.group_config())
    for sid, k, v in h.writes:
        fresh.replay(sid, k, v)
    fresh.loaded(h.now, h.wall)
    assert fresh.describe_group("g")["type"] == "classic"
    assert fresh.group_offsets("g")["t"][0]["offset"] == 42


def test_offset_commit_and_fetch_with_member_epochs():
    h = harness()
    a = join(h)

    def commit(epoch, mid=a.member_id, version=9):
        r = h.call(COMMIT, version, m.OffsetCommitRequest(
            group_id="g", generation_id_or_member_epoch=epoch, member_id=mid, topics=[
                m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(1, 7)])]))
        return r.topics[0].partitions[0].error_code

    assert commit(a.member_epoch) == 0
    assert commit(a.member_epoch + 1) == E.STALE_MEMBER_EPOCH
    assert commit(a.member_epoch, mid="ghost") == E.UNKNOWN_MEMBER_ID
    assert commit(a.member_epoch, version=8) == E.UNSUPPORTED_VERSION

    def fetch(mid, epoch):
        r = h.call(FETCH, 9, m.OffsetFetchRequest(groups=[m.OffsetFetchRequestGroup(
            group_id="g", member_id=mid, member_epoch=epoch, topics=[m.OffsetFetchRequestTopics("t", [1])])]))
        g = r.groups[0]
        return g.error_code, (g.topics[0].partitions[0].committed_offset if g.topics else None)

    assert fetch(a.member_id, a.member_epoch) == (0, 7)
    assert fetch(a.member_id, a.member_epoch + 5) == (E.STALE_MEMBER_EPOCH, None)
    assert fetch("ghost", 1) == (E.UNKNOWN_MEMBER_ID, None)
    assert fetch(None, -1) == (0, 7)  # an admin's fetch


def test_list_describe_delete_and_offset_delete_for_consumer_groups():
    h = harness()
    a = join(h, gid="cg")
    jr = m.JoinGroupRequest(group_id="cl", member_id="", protocol_type="consumer", session_timeout_ms=10000,
                            rebalance_timeout_ms=10000,
                            protocols=[m.JoinGroupRequestProtocol(n, meta) for n, meta in DEFAULT_PROTOCOLS])
    h.call(JOIN, 5, jr)
    h.call(COMMIT, 8, m.OffsetCommitRequest(group_id="cl", generation_id_or_member_epoch=-1, topics=[
        m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(0, 1)])]))

    def listed(types=None, version=5):
        r = h.call(LIST, version, m.ListGroupsRequest(types_filter=types or []))
        return sorted((g.group_id, g.protocol_type, g.group_state, g.group_type) for g in r.groups)

    assert listed() == [("cg", "consumer", "Stable", "consumer"), ("cl", "", "Empty", "classic")]
    assert listed(["consumer"]) == [("cg", "consumer", "Stable", "consumer")]
    assert listed(["Classic"]) == [("cl", "", "Empty", "classic")]
    assert listed(version=4) == [("cg", "consumer", "Stable", ""), ("cl", "", "Empty", "")]
    # DescribeGroups (v0-5) for a consumer group answers as for a group it does not know: Dead
    r = h.call(DESCRIBE, 5, m.DescribeGroupsRequest(groups=["cg"]))
    assert (r.groups[0].error_code, r.groups[0].group_state, r.groups[0].members) == (0, "Dead", [])
    # offsets of a consumer group: a subscribed topic is refused, another is deleted
    assert h.call(COMMIT, 9, m.OffsetCommitRequest(
        group_id="cg", generation_id_or_member_epoch=a.member_epoch, member_id=a.member_id, topics=[
            m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(0, 3)]),
            m.OffsetCommitRequestTopic("u", [m.OffsetCommitRequestPartition(0, 4)])])).topics[0].partitions[0] \
        .error_code == 0
    r = h.call(ODELETE, 0, m.OffsetDeleteRequest(group_id="cg", topics=[
        m.OffsetDeleteRequestTopic("t", [m.OffsetDeleteRequestPartition(0)]),
        m.OffsetDeleteRequestTopic("u", [m.OffsetDeleteRequestPartition(0)])]))
    assert r.error_code == 0
    assert [(t.name, t.partitions[0].error_code) for t in r.topics] == [("t", E.GROUP_SUBSCRIBED_TO_TOPIC), ("u", 0)]
    assert set(h.gc.group_offsets("cg")) == {"t"}
    # DeleteGroups: NON_EMPTY_GROUP while it has members, then gone with its offsets
    assert h.call(DELETE, 2, m.DeleteGroupsRequest(groups_names=["cg"])).results[0].error_code == E.NON_EMPTY_GROUP
    h.call(CGHB, 1, m.ConsumerGroupHeartbeatRequest(group_id="cg", member_id=a.member_id, member_epoch=-1))
    assert h.call(DELETE, 2, m.DeleteGroupsRequest(groups_names=["cg"])).results[0].error_code == 0
    assert h.gc.describe_group("cg") is None and h.gc.group_offsets("cg") == {}
    fresh = GroupCoordinator(h.config.group_config())
    for sid, k, v in h.writes:
        fresh.replay(sid, k, v)
    fresh.loaded(h.now, h.wall)
    assert fresh.describe_group("cg") is None and fresh.group_offsets("cg") == {}


def test_a_topic_growing_bumps_the_epoch_and_the_member_gets_the_new_partitions():
    h = harness()
    a = join(h)
    epoch = h.gc.describe_group("g")["group_epoch"]
    h.topics.topics["t"] = (T, 6)
    h.absorb(h.gc.topics_changed(h.now, h.wall))
    assert h.gc.describe_group("g")["group_epoch"] == epoch + 1
    r = beat(h, "g", a.member_id, a.member_epoch, owned_of(a))
    assert owned_of(r) == {T: set(range(6))}
    assert "subscribed topic metadata changed" in h.gc.group_history("g")[-1]["reason"]


def test_consumer_group_offsets_expire_by_commit_time_except_subscribed_topics_and_the_empty_group_goes():
    h = harness(offsets_retention_minutes=1, offsets_retention_check_interval_ms=10_000)
    a = join(h)
    r = h.call(COMMIT, 9, m.OffsetCommitRequest(
        group_id="g", generation_id_or_member_epoch=a.member_epoch, member_id=a.member_id, topics=[
            m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(0, 3)]),
            m.OffsetCommitRequestTopic("u", [m.OffsetCommitRequestPartition(0, 4)])]))
    assert all(p.error_code == 0 for t in r.topics for p in t.partitions)
    # the member keeps heartbeating for two minutes: u (not subscribed) expires, t stays
    st = {a.member_id: [a.member_epoch, owned_of(a)]}
    for _ in range(240):
        h.advance(500)
        beat(h, "g", a.member_id, st[a.member_id][0], st[a.member_id][1])
    assert set(h.gc.group_offsets("g")) == {"t"}
    # it leaves: once t's offset is past retention too, the Empty group is deleted
    h.call(CGHB, 1, m.ConsumerGroupHeartbeatRequest(group_id="g", member_id=a.member_id, member_epoch=-1))
    h.advance(20_000)
    assert h.gc.group_offsets("g") == {} and h.gc.describe_group("g") is None
    assert h.gc.stats["groups_expired"] == 1


def test_offset_commit_with_an_older_member_epoch_is_accepted_for_partitions_still_held_since():
    """Kafka 4.4: an OffsetCommit at an older member epoch is accepted for a partition still assigned
    to (or pending revocation from) that member, which it got at or before that epoch; anything
    else is STALE_MEMBER_EPOCH, partition by partition (issue 33 item 10)."""
    h = harness()
    a = join(h)
    first = a.member_epoch
    assert owned_of(a) == {T: {0, 1, 2, 3}}
    b = join(h, mid="", topics=("t",))
    st = converge(h, "g", {a.member_id: [a.member_epoch, owned_of(a)], b.member_id: [b.member_epoch, {}]})
    a_epoch, a_owned = st[a.member_id]
    b_epoch, b_owned = st[b.member_id]
    assert a_epoch > first and len(a_owned[T]) == 2 and len(b_owned[T]) == 2

    def commit(mid, epoch, partitions):
        r = h.call(COMMIT, 9, m.OffsetCommitRequest(
            group_id="g", generation_id_or_member_epoch=epoch, member_id=mid, topics=[
                m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(p, 100 + p) for p in partitions])]))
        return {p.partition_index: p.error_code for p in r.topics[0].partitions}

    kept, lost = sorted(a_owned[T]), sorted(b_owned[T])
    # a commits at its first epoch (a commit in flight when the rebalance moved it on): its kept
    # partitions (held since that epoch) are accepted, the ones now b's are not
    got = commit(a.member_id, first, kept + lost)
    assert got == {**{p: E.NONE for p in kept}, **{p: E.STALE_MEMBER_EPOCH for p in lost}}
    # b got its partitions at its current epoch: an older epoch is refused for them
    assert set(commit(b.member_id, b_epoch - 1, lost).values()) == {E.STALE_MEMBER_EPOCH}
    assert set(commit(b.member_id, b_epoch, lost).values()) == {E.NONE}
    assert set(commit(a.member_id, a_epoch + 1, kept).values()) == {E.STALE_MEMBER_EPOCH}  # newer: refused
    fetched = h.call(FETCH, 9, m.OffsetFetchRequest(groups=[m.OffsetFetchRequestGroup(
        group_id="g", member_id=None, member_epoch=-1, topics=[m.OffsetFetchRequestTopics("t", [0, 1, 2, 3])])]))
    assert {p.partition_index: p.committed_offset for p in fetched.groups[0].topics[0].partitions} == \
        {p: 100 + p for p in range(4)}


def test_the_assignment_interval_setting_reaches_the_consumer_groups():
    """group_consumer_assignment_interval_ms: a join within the interval after the group's last
    assignor run waits for the next run (Assigning, nothing assigned yet); a heartbeat after the
    interval runs it and the members converge."""
    h = harness(group_consumer_assignment_interval_ms=1000)
    a = join(h)
    assert owned_of(a) == {T: {0, 1, 2, 3}}
    b = join(h)
    assert b.error_code == 0 and b.member_epoch == a.member_epoch and owned_of(b) == {}
    assert h.gc.describe_group("g")["state"] == "Assigning"
    h.advance(1000)
    st = converge(h, "g", {a.member_id: [a.member_epoch, owned_of(a)], b.member_id: [b.member_epoch, {}]})
    assert sorted(len(st[mid][1].get(T, ())) for mid in st) == [2, 2]
    assert h.gc.describe_group("g")["state"] == "Stable"


def test_a_consumer_group_describe_of_many_groups_is_described_in_slices(monkeypatch):
    """ConsumerGroupDescribe of more groups than DESCRIBE_SLICE_MEMBERS members (and groups):
    described over loop turns, answered once, every group in the order asked."""
    from coordinator.core import coordinator as core

    h = harness()
    members = {gid: join(h, gid).member_id for gid in ("a", "b", "c", "d")}
    monkeypatch.setattr(core, "DESCRIBE_SLICE_MEMBERS", 3)
    asked = ["a", "nope", "b", "c", "d"]
    h.hold_later = True
    token = h.send(CGD, 0, m.ConsumerGroupDescribeRequest(group_ids=asked))
    assert h.reply(token) is None  # a (2) and nope (1): the budget of 3
    assert h.run_later() == 2  # b and c, then d and the answer
    r = h.reply(token)
    assert [g.group_id for g in r.groups] == asked
    assert [g.error_code for g in r.groups] == [0, E.GROUP_ID_NOT_FOUND, 0, 0, 0]
    assert [[mm.member_id for mm in g.members] for g in r.groups] == [
        [members["a"]], [], [members["b"]], [members["c"]], [members["d"]]]
