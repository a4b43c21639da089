"""ListGroups, DescribeGroups, DeleteGroups, failed shards, shutdown, operator views."""
import pytest

from coordinator.core import records
from protocol import errors as E
from protocol.messages import (
    DescribeGroupsRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    LeaveGroupRequest,
    ListGroupsRequest,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetDeleteRequest,
    OffsetFetchRequest,
    OffsetFetchRequestGroup,
    OffsetFetchRequestTopic,
    OffsetFetchRequestTopics,
    SyncGroupRequest,
)
from tests.coordinator.core.test_group_harness import DESCRIBE, FETCH, Harness, sub


def test_list_groups_with_filters_and_versions():
    h = Harness()
    h.form_group("stable", 1)
    h.commit("simple", {("t", 0): 1})
    h.join_dynamic("rebal", protocols=(("range", sub("t")),))
    h.join("rebal", h.group("rebal").leader_id)  # stays CompletingRebalance
    r = h.list_groups(version=5)
    assert r.error_code == E.NONE
    got = {g.group_id: (g.group_state, g.protocol_type, g.group_type) for g in r.groups}
    assert got == {"stable": ("Stable", "consumer", "classic"), "simple": ("Empty", "", "classic"),
                   "rebal": ("CompletingRebalance", "consumer", "classic")}
    assert {g.group_id for g in h.list_groups(states=["stable", "EMPTY"]).groups} == {"stable", "simple"}
    assert {g.group_id for g in h.list_groups(states=["Dead"]).groups} == set()
    assert {g.group_id for g in h.list_groups(types=["Classic"]).groups} == {"stable", "simple", "rebal"}
    assert h.list_groups(types=["consumer"]).groups == []
    for v in range(6):
        r = h.list_groups(version=v)
        assert len(r.groups) == 3
        assert all(g.group_state == ("" if v < 4 else g.group_state) for g in r.groups)


def test_describe_groups_batched_and_unknown_is_dead():
    h = Harness(offsets_partitions=10)
    mids, gen = h.form_group("g", 2)
    ds = h.describe("g", "nope", "")
    assert [d.group_id for d in ds] == ["g", "nope", ""]
    g, nope, empty = ds
    assert g.error_code == E.NONE and g.group_state == "Stable" and g.protocol_type == "consumer"
    assert g.protocol_data == "range"
    assert {m.member_id for m in g.members} == set(mids)
    for m in g.members:
        assert m.member_assignment == m.member_id.encode() and m.member_metadata == sub("t")
        assert m.client_host == "/10.0.0.1" and m.client_id.startswith("c")
    assert (nope.error_code, nope.group_state, nope.members) == (E.NONE, "Dead", [])
    assert empty.group_state == "Dead"
    # not Stable: members without metadata, with their last assignment (as Kafka)
    h.join("g", mids[0], protocols=(("range", sub("t", "u")),))
    (d,) = h.describe("g")
    assert d.group_state == "PreparingRebalance" and all(m.member_metadata == b"" for m in d.members)
    assert all(m.member_assignment == m.member_id.encode() for m in d.members)
    assert d.protocol_data == ""  # the protocol is named for a Stable group only, as Kafka
    h.join("g", mids[1], protocols=(("range", sub("t", "u")),))
    (d,) = h.describe("g")
    assert (d.group_state, d.protocol_type, d.protocol_data) == ("CompletingRebalance", "consumer", "")


def test_describe_shows_each_members_last_assignment_while_the_group_rebalances():
    """compatibility.md, formerly KD-2. Kafka describes a group that is not Stable with
    ClassicGroupMember.describeNoMetadata: no metadata, but the member's assignment, which is the
    one it last synced with until the next SyncGroup, empty for a member that joined since, and
    empty for everyone once a rebalance interrupts CompletingRebalance."""
    h = Harness()
    (a, b), gen = h.form_group("g", 2)

    def shown():
        (d,) = h.describe("g")
        if d.group_state != "Stable":
            assert all(m.member_metadata == b"" for m in d.members)
        return d.group_state, {m.member_id: m.member_assignment for m in d.members}

    c, _ = h.join_dynamic("g", client_id="c2")  # joins during the rebalance it starts
    assert shown() == ("PreparingRebalance", {a: a.encode(), b: b.encode(), c: b""})
    h.join("g", a)
    h.join("g", b)
    assert shown() == ("CompletingRebalance", {a: a.encode(), b: b.encode(), c: b""})
    # a member joins before the leader's SyncGroup: the assignments are reset (as Kafka's
    # resetAndPropagateAssignmentWithError), so the group shows none while it rebalances again
    d, _ = h.join_dynamic("g", client_id="c3")
    assert shown() == ("PreparingRebalance", {a: b"", b: b"", c: b"", d: b""})
    for mid in (a, b, c):
        h.join("g", mid)
    g = h.group("g")
    assert g.state == "CompletingRebalance"
    new = {mid: f"new-{mid}".encode() for mid in (a, b, c, d)}
    h.sync("g", g.generation, g.leader_id, new)
    assert shown() == ("Stable", new)
    (desc,) = h.describe("g")
    assert all(m.member_metadata == sub("t") for m in desc.members)
    h.leave("g", a, b, c, d)
    assert shown() == ("Empty", {})


def test_a_group_created_by_a_member_id_required_join_is_empty_not_dead():
    """Kafka creates the group before answering MEMBER_ID_REQUIRED: it exists, Empty, with no
    protocol type, until its pending member joins, or until it is cleaned up as an Empty group
    with no offsets."""
    h = Harness()
    pid = h.reply(h.join("fresh", session=1_000)).member_id
    assert h.group("fresh").pending_members == {pid}
    listed = {g.group_id: (g.group_state, g.protocol_type) for g in h.list_groups().groups}
    assert listed == {"fresh": ("Empty", "")}
    (d,) = h.describe("fresh")
    assert (d.error_code, d.group_state, d.protocol_type, d.members) == (E.NONE, "Empty", "", [])
    assert h.fetch("fresh", {"t": [0]}) == (E.NONE, {("t", 0): (-1, "")})
    h.advance(1_000)  # the pending member never came back: still an Empty group
    assert not h.group("fresh").pending_members
    (d,) = h.describe("fresh")
    assert d.group_state == "Empty"


def test_describe_versions_instance_id_and_authorized_operations():
    h = Harness()
    h.join("g", instance="i1")
    for v in range(6):
        resp = h.call(DESCRIBE, v, DescribeGroupsRequest(groups=["g"], include_authorized_operations=v >= 3))
        (d,) = resp.groups
        assert d.members[0].group_instance_id == ("i1" if v >= 4 else None)
        ops = (1 << 3) | (1 << 6) | (1 << 8) | (1 << 10) | (1 << 11)  # READ DELETE DESCRIBE *_CONFIGS
        assert d.authorized_operations == (-2147483648 if v < 3 else ops)


def test_delete_groups():
    h = Harness(offsets_partitions=8)
    mids, gen = h.form_group("busy", 1)
    h.commit("done", {("t", 0): 1, ("t", 1): 2, ("u", 0): 3})
    n = len(h.writes)
    res = h.delete_groups("busy", "done", "missing")
    assert res == {"busy": E.NON_EMPTY_GROUP, "done": E.NONE, "missing": E.GROUP_ID_NOT_FOUND}
    written = [(records.decode_key(k)[0], v) for _, k, v in h.writes[n:]]
    assert written == [(1, None)] * 3 + [(2, None)]  # offset tombstones, then the group tombstone
    assert h.group("done") is None and h.fetch("done", None)[1] == {}
    assert h.delete_groups("done") == {"done": E.GROUP_ID_NOT_FOUND}
    for v in (0, 1):
        assert h.delete_groups("missing", version=v) == {"missing": E.GROUP_ID_NOT_FOUND}


def every_request(group_id, member="m"):
    """One request per API aimed at ``group_id`` (version, request)."""
    return {
        11: (5, JoinGroupRequest(group_id=group_id, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                                 member_id=member, protocol_type="consumer",
                                 protocols=[JoinGroupRequestProtocol("range", b"")])),
        14: (3, SyncGroupRequest(group_id=group_id, generation_id=1, member_id=member)),
        12: (3, HeartbeatRequest(group_id=group_id, generation_id=1, member_id=member)),
        13: (1, LeaveGroupRequest(group_id=group_id, member_id=member)),
        8: (8, OffsetCommitRequest(group_id=group_id, topics=[
            OffsetCommitRequestTopic("t", [OffsetCommitRequestPartition(0, 1)])])),
        9: (7, OffsetFetchRequest(group_id=group_id, topics=[OffsetFetchRequestTopic("t", [0])])),
        15: (5, DescribeGroupsRequest(groups=[group_id])),
        47: (0, OffsetDeleteRequest(group_id=group_id)),
    }


def error_of(api, resp):
    if api == 8:
        return resp.topics[0].partitions[0].error_code
    if api == 15:
        return resp.groups[0].error_code
    return resp.error_code


def test_a_failed_shard_answers_coordinator_not_available_and_others_keep_working():
    h = Harness(offsets_partitions=8)
    mids, gen = h.form_group("g", 2)
    other = next(f"o{i}" for i in range(100) if h.gc.shard_for(f"o{i}") != h.gc.shard_for("g"))
    h.form_group(other, 1)
    parked = h.join("g", mids[0])  # parked JoinGroup in the shard that fails
    res = h.absorb(h.gc.fail_shard(h.gc.shard_for("g")))
    assert [tok for tok, _ in res.replies] == [parked]
    assert h.reply(parked).error_code == E.COORDINATOR_NOT_AVAILABLE
    assert h.gc.failed_shards == [h.gc.shard_for("g")]
    for api, (v, req) in every_request("g").items():
        assert error_of(api, h.call(api, v, req)) == E.COORDINATOR_NOT_AVAILABLE, api
    r = h.call(FETCH, 8, OffsetFetchRequest(groups=[OffsetFetchRequestGroup("g"),
                                                    OffsetFetchRequestGroup(other)]))
    assert [gr.error_code for gr in r.groups] == [E.COORDINATOR_NOT_AVAILABLE, E.NONE]
    assert h.delete_groups("g", other)["g"] == E.COORDINATOR_NOT_AVAILABLE
    # as Kafka: one partition that cannot answer fails the listing
    assert h.list_groups().error_code == E.COORDINATOR_NOT_AVAILABLE
    # v0-1 OffsetFetch has no top-level error: the partitions carry it
    r = h.call(FETCH, 1, OffsetFetchRequest(group_id="g", topics=[OffsetFetchRequestTopic("t", [0, 1])]))
    assert [p.error_code for p in r.topics[0].partitions] == [E.COORDINATOR_NOT_AVAILABLE] * 2
    # the other shard is unaffected, and the failed shard's timers never fire
    assert h.heartbeat(other, h.group(other).generation, h.group(other).leader_id).error_code == E.NONE
    h.advance(100_000)
    assert h.group("g").state == "PreparingRebalance"


def test_failure_replies_replace_replies_with_valid_errors():
    h = Harness()
    mids, gen = h.form_group("g", 2)
    g = h.group("g")
    for m in mids:
        h.join("g", m)
    follower = next(m for m in mids if m != g.leader_id)
    h.sync("g", g.generation, follower)
    res = h.gc.handle(14, 5, SyncGroupRequest(group_id="g", generation_id=g.generation, member_id=g.leader_id,
                                               protocol_type="consumer", protocol_name="range"), "tok", h.now, h.wall)
    assert res.writes and len(res.replies) == 2
    failed = res.failure_replies()
    assert [t for t, _ in failed] == [t for t, _ in res.replies]
    assert all(r.error_code == E.COORDINATOR_NOT_AVAILABLE for _, r in failed)
    for _, r in failed:
        for v in range(6):
            type(r).decode(r.encode(v), v)
    commit = OffsetCommitRequest(group_id="x",
                                 topics=[OffsetCommitRequestTopic("t", [OffsetCommitRequestPartition(0, 1)])])
    res = h.gc.handle(8, 8, commit, "c", h.now, h.wall)
    (_, r), = res.failure_replies()
    assert r.topics[0].partitions[0].error_code == E.COORDINATOR_NOT_AVAILABLE



@pytest.mark.parametrize("version", range(10))
def test_failure_replies_refuse_read_only_answers_instead_of_showing_state_that_never_became_durable(version):
    """An OffsetFetch, DescribeGroups or ListGroups answer waits for its shards' pending writes; if
    they fail, what it read (a commit that never reached the disk) must not be sent."""
    h = Harness()
    h.form_group("g", 2)
    commit = OffsetCommitRequest(group_id="x", topics=[OffsetCommitRequestTopic("t", [
        OffsetCommitRequestPartition(0, 42), OffsetCommitRequestPartition(1, 43)])])
    assert h.gc.handle(8, 8, commit, "c", h.now, h.wall).writes
    if version >= 8:
        fetch = OffsetFetchRequest(groups=[
            OffsetFetchRequestGroup("x", topics=[OffsetFetchRequestTopics("t", [0, 1])])])
    else:
        fetch = OffsetFetchRequest(group_id="x", topics=[OffsetFetchRequestTopic("t", [0, 1])])
    res = h.gc.handle(FETCH, version, fetch, "f", h.now, h.wall)
    assert res.shards  # it waits for x's shard
    (_, ok), = res.replies
    (_, r), = res.failure_replies()
    type(r).decode(r.encode(version), version)
    if version >= 8:
        assert 42 in [p.committed_offset for p in ok.groups[0].topics[0].partitions]
        assert [(g.group_id, g.error_code, g.topics) for g in r.groups] == [("x", E.COORDINATOR_NOT_AVAILABLE, [])]
    else:
        assert [p.committed_offset for p in ok.topics[0].partitions] == [42, 43]
        assert [(p.committed_offset, p.error_code) for p in r.topics[0].partitions] == [
            (-1, E.COORDINATOR_NOT_AVAILABLE)] * 2
        if version >= 2:
            assert r.error_code == E.COORDINATOR_NOT_AVAILABLE
    if version <= 5:
        described = h.gc.handle(15, version, DescribeGroupsRequest(groups=["g", "x"]), "d", h.now, h.wall)
        (_, r), = described.failure_replies()
        assert [(g.group_id, g.error_code, g.members) for g in r.groups] == [
            ("g", E.COORDINATOR_NOT_AVAILABLE, []), ("x", E.COORDINATOR_NOT_AVAILABLE, [])]
        type(r).decode(r.encode(version), version)
        listed = h.gc.handle(16, min(version, 5), ListGroupsRequest(), "l", h.now, h.wall)
        (_, r), = listed.failure_replies()
        assert r.error_code == E.COORDINATOR_NOT_AVAILABLE and r.groups == []


def test_shutdown_answers_parked_requests_with_not_coordinator():
    h = Harness()
    mids, gen = h.form_group("g", 2)
    g = h.group("g")
    tj = h.join("g", mids[0])
    other = next(m for m in mids if m != mids[0])
    res = h.absorb(h.gc.shutdown())
    assert [t for t, _ in res.replies] == [tj]
    assert h.reply(tj).error_code == E.NOT_COORDINATOR
    assert h.heartbeat("g", gen, other).error_code == E.NOT_COORDINATOR
    assert h.reply(h.join("g", other)).error_code == E.NOT_COORDINATOR
    assert h.gc.next_deadline() is None
    assert g.members  # nothing was forgotten: state is simply no longer served


def test_result_shards_tell_the_runtime_what_replies_depend_on():
    h = Harness(offsets_partitions=8)
    mids, gen = h.form_group("g", 1)
    sid = h.gc.shard_for("g")
    hb = HeartbeatRequest(group_id="g", generation_id=gen, member_id=mids[0])
    # a Heartbeat's whole answer is an error code: no writes, no shards it waits for
    assert h.gc.heartbeat(3, hb, h.now) == E.NONE
    with pytest.raises(ValueError, match="one entry point"):
        h.gc.handle(12, 3, hb, "hb", h.now, h.wall)
    fetch = OffsetFetchRequest(groups=[OffsetFetchRequestGroup("g"), OffsetFetchRequestGroup("zz")])
    res = h.gc.handle(9, 8, fetch, "f", h.now, h.wall)
    assert res.shards == {sid, h.gc.shard_for("zz")}


def test_operator_views():
    h = Harness()
    mids, gen = h.form_group("g", 2)
    h.commit("g", {("t", 0): 3}, generation=gen, member_id=mids[0])
    (row,) = [r for r in h.gc.list_groups() if r["group_id"] == "g"]
    assert row["state"] == "Stable" and row["members"] == 2 and row["generation"] == gen
    d = h.gc.describe_group("g")
    assert d["offsets"] == 1 and {m["member_id"] for m in d["members"]} == set(mids)
    assert d["subscribed_topics"] == ["t"]
    assert h.gc.describe_group("nope") is None and h.gc.group_history("nope") is None
    assert h.gc.group_offsets("g")["t"][0]["offset"] == 3
    stats = h.gc.snapshot_stats()
    assert stats["groups_by_state"]["Stable"] == 1 and stats["members"] == 2 and stats["offsets"] == 1
    assert stats["counters"]["offset_commits"] == 1


def test_a_describe_of_many_groups_is_described_in_slices_and_answered_once(monkeypatch):
    """DescribeGroups for many groups (``kafka-consumer-groups --describe --all-groups`` asks a
    coordinator for all of its groups at once) describes DESCRIBE_SLICE_MEMBERS members (and groups) a
    loop turn and answers once, with every group in the order asked; each group as it is in its
    slice's turn."""
    from coordinator.core import coordinator as core

    monkeypatch.setattr(core, "DESCRIBE_SLICE_MEMBERS", 7)
    h = Harness(offsets_partitions=10)
    formed = {f"g{i}": h.form_group(f"g{i}", 3)[0] for i in range(6)}
    asked = ["g0", "nope", "g1", "g2", "g3", "g4", "g5"]
    h.hold_later = True
    token = h.send(DESCRIBE, 5, DescribeGroupsRequest(groups=asked))
    assert h.reply(token) is None  # g0 (4), "nope" (1), g1 (4): over 7, the rest waits
    assert h.run_later(1) == 1 and h.reply(token) is None  # g2, g3
    (g5_leaver,) = formed["g5"][:1]
    h.hold_later = False
    h.leave("g5", g5_leaver)  # changes g5 before its slice describes it
    h.hold_later = True
    assert h.run_later() == 1  # g4 and g5, and the answer
    resp = h.reply(token)
    assert [g.group_id for g in resp.groups] == asked
    assert [g.group_state for g in resp.groups] == ["Stable", "Dead", "Stable", "Stable", "Stable", "Stable",
                                                    "PreparingRebalance"]
    for g in resp.groups[:-1]:
        if g.group_id != "nope":
            assert {m.member_id for m in g.members} == set(formed[g.group_id])
    assert {m.member_id for m in resp.groups[-1].members} == set(formed["g5"][1:])
    # the same request under the budget: answered at once, the same answer for the unchanged groups
    monkeypatch.setattr(core, "DESCRIBE_SLICE_MEMBERS", 10_000)
    token = h.send(DESCRIBE, 5, DescribeGroupsRequest(groups=asked[:-1]))
    assert [g.group_id for g in h.reply(token).groups] == asked[:-1]
    assert h.reply(token).groups == resp.groups[:-1]
