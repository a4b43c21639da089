"""Replay round trip: a Result's writes fed into a fresh coordinator rebuild the same groups/offsets."""
from coordinator.clock import ManualClock
from coordinator.core import records
from coordinator.core.coordinator import GroupCoordinator
from protocol import errors as E
from tests.coordinator.core.test_group_harness import Harness, sub


def durable_view(gc: GroupCoordinator) -> dict:
    """What the log must preserve: Stable/Empty groups and every offset."""
    view = {}
    for shard in gc.shards:
        for gid, g in shard.classic.groups.items():
            assert g.state in ("Stable", "Empty"), (gid, g.state)
            members = tuple(
                (m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
                 m.session_timeout_ms, m.metadata(g.protocol_name), m.assignment)
                for m in g.members.values())
            offsets = {(t, p): records.offset_value_fields(v)
                       for t, parts in shard.offsets.committed.get(gid, {}).items() for p, v in parts.items()}
            if g.generation == 0 and not offsets:
                continue  # never written: e.g. a group that only handed out a KIP-394 member id
            view[gid] = {
                "shard": shard.shard_id, "state": g.state, "generation": g.generation,
                "protocol_type": g.protocol_type, "protocol": g.protocol_name,
                "leader": g.leader_id if g.members else None, "members": members,
                "state_ts": g.state_wall_ms if g.state == "Empty" and g.protocol_type else None,
                "subscribed": g.subscribed_topics, "offsets": offsets,
            }
    return view


def replayed(h: Harness) -> GroupCoordinator:
    fresh = GroupCoordinator(h.config.group_config())
    for shard_id, key, value in h.writes:
        fresh.replay(shard_id, key, value)
    return fresh


def test_replay_round_trip():
    h = Harness(offsets_partitions=6)
    # a stable dynamic group with commits (v3 values) and a per-offset expiry (v1 value)
    mids, gen = h.form_group("dyn", 3, protocols=(("range", sub("a", "b")),))
    h.commit("dyn", {("a", 0): 10, ("a", 1): 11, ("b", 0): 12}, generation=gen, member_id=mids[0],
             metadata="m1")
    h.commit("dyn", {("a", 0): 13}, generation=gen, member_id=mids[1])  # overwrite
    h.commit("dyn", {("c", 0): 1}, version=3, generation=gen, member_id=mids[0], retention=86_400_000)
    # a static group whose member restarted without a rebalance
    t = h.join("stat", instance="i1")
    sid = h.reply(t).member_id
    h.sync("stat", 1, sid, {sid: b"A"}, instance="i1")
    h.reply(h.join("stat", instance="i1"))  # replaced: new member id persisted
    # a group that became Empty (with its offsets kept)
    emids, egen = h.form_group("gone-empty", 2)
    h.commit("gone-empty", {("x", 0): 7}, generation=egen, member_id=emids[0])
    h.advance(10)
    h.leave("gone-empty", *emids)
    assert h.state("gone-empty") == "Empty"
    # a simple group and a deleted group, and a deleted offset
    h.commit("simple", {("s", 3): 30})
    h.commit("deleted", {("d", 0): 1})
    assert h.delete_groups("deleted") == {"deleted": E.NONE}
    h.commit("simple", {("s", 4): 40})
    assert h.offset_delete("simple", {"s": [4]}).error_code == E.NONE
    # a group that rebalanced a few generations (records overwrite)
    ab = (("range", sub("a", "b")),)
    for _ in range(2):
        h.join("dyn", h.group("dyn").leader_id, protocols=ab)
        for m in mids:
            if h.group("dyn").members[m].join is None:
                h.join("dyn", m, protocols=ab)
        g = h.group("dyn")
        h.sync("dyn", g.generation, g.leader_id, {m: b"gen%d" % g.generation for m in mids})
    assert h.state("dyn") == "Stable"

    fresh = replayed(h)
    live, back = durable_view(h.gc), durable_view(fresh)
    assert back == live
    assert set(back) == {"dyn", "stat", "gone-empty", "simple"}
    assert back["dyn"]["generation"] == gen + 2 and back["dyn"]["subscribed"] == {"a", "b"}
    assert back["dyn"]["offsets"][("c", 0)][4] != -1  # the explicit expiry survived


def test_replayed_groups_serve_members_and_expire_them_after_loading():
    h = Harness(offsets_partitions=3)
    mids, gen = h.form_group("g", 2, session=5_000)
    fresh = replayed(h)
    fresh.loaded(h.now, h.wall)
    from protocol.messages import HeartbeatRequest
    hb = HeartbeatRequest(group_id="g", generation_id=gen, member_id=mids[0])
    assert fresh.heartbeat(3, hb, h.now + 4_000) == E.NONE
    # mids[1] never heartbeats after the restart: expired 5000 ms after loading
    res = fresh.on_timers(h.now + 5_000, h.wall + 5_000)
    assert res.writes == []
    g = fresh._shard("g").classic.groups["g"]
    assert set(g.members) == {mids[0]} and g.state == "PreparingRebalance"


def test_replay_of_a_group_over_the_size_limit_rebalances_on_load():
    h = Harness(offsets_partitions=2)
    mids, gen = h.form_group("g", 3)
    small = GroupCoordinator(h.config.replace(group_max_size=2).group_config())
    for w in h.writes:
        small.replay(*w)
    small.loaded(0, ManualClock().wall_ms())
    g = small._shard("g").classic.groups["g"]
    assert g.state == "PreparingRebalance" and g.rebalance.reason == "over_capacity"


def test_replay_routes_records_from_another_partition_count():
    h = Harness(offsets_partitions=4)
    h.commit("g", {("t", 0): 1})
    other = GroupCoordinator(h.config.replace(offsets_partitions=7).group_config())
    for shard_id, key, value in h.writes:
        other.replay(shard_id, key, value)
    assert other.group_offsets("g") == {"t": {0: other.group_offsets("g")["t"][0]}}
    assert other.misplaced_records == (1 if h.gc.shard_for("g") != other.shard_for("g") else 0)
