"""The rebalance flight recorder: per group, the last N rebalances with why, who was waited for
and how long, and each phase's duration; plus one log line per completed rebalance."""
import pytest

from coordinator.core import offsets
from coordinator.core import shard as shard_module
from coordinator.core.classic import groups as classic
from tests.coordinator.core.test_group_harness import Harness, sub


class RecordingLog:
    def __init__(self):
        self.events = []

    def info(self, event, **kw):
        self.events.append((event, kw))

    debug = warning = error = info


@pytest.fixture
def logs(monkeypatch):
    rec = RecordingLog()
    for module in (shard_module, classic, offsets):  # the shard's modules share the "herd.group" logger
        monkeypatch.setattr(module, "log", rec)
    return rec


def test_a_rebalance_with_a_slow_and_a_missing_member(logs):
    h = Harness(rebalance_history_size=5)
    mids, gen = h.form_group("g", 3, rebalance=10_000, session=60_000)
    g = h.group("g")
    leader = g.leader_id
    slow, missing = [m for m in mids if m != leader]
    logs.events.clear()
    start_wall = h.clock.wall_ms()
    h.join("g", leader, rebalance=10_000, session=60_000, reason="topic metadata changed", version=8)
    h.advance(2_000)
    h.join("g", slow, rebalance=10_000, session=60_000)
    h.advance(8_000)  # the rebalance timeout: `missing` never came back
    assert h.state("g") == "CompletingRebalance"
    h.advance(300)
    h.sync("g", gen + 1, slow)  # the follower syncs first and waits
    h.advance(200)
    h.sync("g", gen + 1, leader, {leader: b"L", slow: b"S"})
    (entry,) = [e for e in h.gc.group_history("g") if e["previous_generation"] == gen]
    assert entry["reason"] == "leader_rejoin"
    assert entry["client_reason"] == "topic metadata changed"
    assert entry["trigger"]["member_id"] == leader and entry["trigger"]["client_host"] == "/10.0.0.1"
    assert entry["outcome"] == "stable" and entry["generation"] == gen + 1
    assert entry["protocol"] == "range" and entry["members"] == 2 and not entry["initial"]
    assert entry["phases"] == {"preparing_ms": 10_000, "completing_ms": 500}
    assert entry["duration_ms"] == 10_500
    assert entry["started_wall_ms"] == start_wall and entry["ended_wall_ms"] == start_wall + 10_500
    awaited = {a["member_id"]: (a["rejoined_after_ms"], a["outcome"]) for a in entry["awaited"]}
    assert awaited == {leader: (0, "rejoined"), slow: (2_000, "rejoined"), missing: (None, "missed_rejoin")}
    assert entry["slowest_member"] == {"member_id": slow, "rejoined_after_ms": 2_000}
    assert entry["removed"] == [{"member_id": missing, "why": "missed_rejoin", "after_ms": 10_000}]
    assert {s["member_id"]: s["synced_after_ms"] for s in entry["sync"]} == {leader: 500, slow: 300}
    # exactly one log line, for the completed rebalance
    ((event, kw),) = logs.events
    assert event == "rebalance_completed"
    assert kw["group_id"] == "g" and kw["generation"] == gen + 1 and kw["members"] == 2
    assert kw["reason"] == "leader_rejoin" and kw["duration_ms"] == 10_500


def test_late_follower_syncs_are_recorded_after_stable():
    h = Harness()
    mids, gen = h.form_group("g", 2)
    g = h.group("g")
    for m in mids:
        h.join("g", m)
    follower = next(m for m in mids if m != g.leader_id)
    h.sync("g", g.generation, g.leader_id, {})
    h.advance(700)
    h.sync("g", g.generation, follower)
    last = h.gc.group_history("g")[-1]
    assert {s["member_id"]: s["synced_after_ms"] for s in last["sync"]}[follower] == 700


def test_reasons_and_the_initial_rebalance(logs):
    h = Harness(initial_rebalance_delay_ms=1_000)
    a, _ = h.join_dynamic("g", client_id="first", host="/1.1.1.1")
    h.advance(400)
    b, _ = h.join_dynamic("g", client_id="second", host="/2.2.2.2")
    h.advance(2_000)
    g = h.group("g")
    h.sync("g", 1, g.leader_id, {})
    (first,) = h.gc.group_history("g")
    assert first["reason"] == "initial" and first["initial"]
    assert first["trigger"]["client_id"] == "first"
    joined = [(j["client_id"], j["joined_after_ms"]) for j in first["joined"]]
    assert joined == [("first", 0), ("second", 400)]
    assert first["awaited"] == []
    assert first["phases"]["preparing_ms"] == 2_000  # the delay was extended once by the second member
    h.leave("g", b)
    assert h.gc.group_history("g")[-1]["reason"] == "member_left"
    assert h.gc.group_history("g")[-1]["outcome"] == "in_progress"
    h.join("g", a)
    h.sync("g", 2, a, {})
    c, _ = h.join_dynamic("g", client_id="third", host="/3.3.3.3")
    rec = h.gc.group_history("g")[-1]
    assert rec["reason"] == "member_joined" and rec["trigger"]["client_id"] == "third"
    assert "third" in rec["detail"] and "/3.3.3.3" in rec["detail"]
    h.leave("g", a, c)
    assert h.gc.group_history("g")[-1]["outcome"] == "empty"
    reasons = [e["reason"] for e in h.gc.group_history("g")]
    # the last rebalance (started by "third") ended with everybody gone: outcome "empty"
    assert reasons == ["initial", "member_left", "member_joined"]
    assert [(kw["reason"], kw["outcome"]) for ev, kw in logs.events if ev == "rebalance_completed"] == [
        ("initial", "stable"), ("member_left", "stable"), ("member_joined", "empty")]


def test_a_restarted_rebalance_is_recorded_as_restarted():
    h = Harness()
    mids, gen = h.form_group("g", 2)
    for m in mids:
        h.join("g", m)
    assert h.state("g") == "CompletingRebalance"
    h.join_dynamic("g")
    hist = h.gc.group_history("g")
    assert hist[-2]["outcome"] == "restarted" and hist[-1]["outcome"] == "in_progress"


def test_history_is_bounded():
    h = Harness(rebalance_history_size=3)
    mids, gen = h.form_group("g", 1)
    for _ in range(6):
        h.join("g", mids[0])
        g = h.group("g")
        h.sync("g", g.generation, mids[0], {})
    assert len(h.group("g").history) == 3
    assert [e["generation"] for e in h.gc.group_history("g")] == [5, 6, 7]


def test_no_log_lines_for_heartbeats_and_commits(logs):
    h = Harness()
    mids, gen = h.form_group("g", 1)
    logs.events.clear()
    for i in range(20):
        h.heartbeat("g", gen, mids[0])
        h.commit("g", {("t", 0): i}, generation=gen, member_id=mids[0])
    h.join("g", mids[0], protocols=(("range", sub("t")),))  # a leader rejoin: one more rebalance
    h.sync("g", gen + 1, mids[0], {})
    assert [ev for ev, _ in logs.events] == ["rebalance_completed"]
