"""Kafka's own Java client (kafka-clients 4.4.0, KafkaConsumer with its ConsumerCoordinator) against
herd: the classic group protocol in every assignor, leaves, static membership, max.poll.interval.ms,
groups mixed with herd's thin client and confluent-kafka, and group.protocol=consumer (KIP-848),
which today's herd does not serve."""
from __future__ import annotations

import time
import uuid

import pytest

from protocol import messages as m
from tests.conformance.harness import (
    all_partitions,
    create_topic,
    herd_warnings,
    wait_converged,
    wait_until,
)
from tests.conformance.reference_clients import HerdMember, JavaMember
from tools.rawclient import RawClient

pytestmark = [pytest.mark.reference, pytest.mark.conformance]


def names(prefix: str) -> tuple[str, str]:
    tag = uuid.uuid4().hex[:6]
    return f"{prefix}-g-{tag}", f"{prefix}-t-{tag}"


def raw_offsets(herd, group: str) -> dict:
    with RawClient(herd.address) as c:
        r = c.call(m.OffsetFetchRequest(group_id=group, topics=None), 7)
    return {(t.name, p.partition_index): (p.committed_offset, p.metadata) for t in r.topics for p in t.partitions}


def test_join_commit_fetch(herd, java_driver):
    group, topic = names("java-commit")
    create_topic(herd.bootstrap, topic, 3)
    a = JavaMember(java_driver, herd.bootstrap, group, [topic], "a")
    wait_converged([a], all_partitions(topic, 3), 60)
    got = a.commit([(topic, 0, 5, "first"), (topic, 1, 7, ""), (topic, 2, 11, "x" * 100)])
    assert got["error"] is None, got
    committed = a.committed([(topic, 0), (topic, 1), (topic, 2)])["offsets"]
    assert sorted(map(tuple, committed)) == [(topic, 0, 5, "first"), (topic, 1, 7, ""), (topic, 2, 11, "x" * 100)]
    assert raw_offsets(herd, group) == {(topic, 0): (5, "first"), (topic, 1): (7, ""), (topic, 2): (11, "x" * 100)}
    a.stop()
    assert herd_warnings(herd) == []


def test_five_members_one_leaves_rest_rebalance_before_its_session_expires(herd, java_driver):
    group, topic = names("java-five")
    create_topic(herd.bootstrap, topic, 10)
    session_ms = 30000
    ms = [JavaMember(java_driver, herd.bootstrap, group, [topic], f"m{i}", session_ms=session_ms) for i in range(5)]
    gen = wait_converged(ms, all_partitions(topic, 10), 60)
    assert all(len(x.partitions()) == 2 for x in ms)
    t0 = time.monotonic()
    ms[2].stop()  # close(): LeaveGroup
    rest = ms[:2] + ms[3:]
    gen2 = wait_converged(rest, all_partitions(topic, 10), session_ms / 1000)
    assert time.monotonic() - t0 < session_ms / 2000, "the rebalance waited for the session timeout"
    assert gen2 > gen
    assert sorted(len(x.partitions()) for x in rest) == [2, 2, 3, 3]


def ownership_timeline(members) -> list[tuple[float, str, str, list]]:
    evs = [(e["t"], x.name, e["ev"], e["partitions"]) for x in members for e in x.snapshot()
           if e["ev"] in ("assigned", "revoked", "lost")]
    return sorted(evs)


@pytest.mark.parametrize("assignor", ["range", "roundrobin", "sticky", "cooperative-sticky"])
def test_assignors(herd, java_driver, assignor):
    group, topic = names(f"java-{assignor}")
    create_topic(herd.bootstrap, topic, 6)
    ms = []
    for i in range(3):
        ms.append(JavaMember(java_driver, herd.bootstrap, group, [topic], f"{assignor}-{i}", assignor=assignor))
        wait_converged(ms, all_partitions(topic, 6), 60)
    assert sorted(len(x.partitions()) for x in ms) == [2, 2, 2]
    ms[0].stop()
    wait_converged(ms[1:], all_partitions(topic, 6), 60)
    assert sorted(len(x.partitions()) for x in ms[1:]) == [3, 3]
    if assignor == "cooperative-sticky":
        # Incremental: from the callbacks' own clock (one JVM), no partition is ever owned by two
        # members, and a member that held partitions never drops to zero while it stays.
        owner: dict[tuple, str] = {}
        held: dict[str, set] = {x.name: set() for x in ms}
        for _, who, ev, parts in ownership_timeline(ms):
            for p in map(tuple, parts):
                if ev == "assigned":
                    assert p not in owner, f"{p} assigned to {who} while {owner[p]} owns it"
                    owner[p] = who
                    held[who].add(p)
                else:
                    assert owner.get(p) == who
                    del owner[p]
                    held[who].discard(p)
            if who != ms[0].name and ev == "revoked":
                assert held[who], f"{who} dropped to zero partitions"
        assert not any(e["ev"] == "lost" for x in ms for e in x.snapshot())
    elif assignor in ("range", "roundrobin", "sticky"):
        # Eager: every rebalance revokes everything first.
        assert any(e["ev"] == "revoked" and len(e["partitions"]) == 2 for e in ms[1].snapshot())


def test_static_membership_restart_keeps_partitions_without_rebalance(herd, java_driver):
    group, topic = names("java-static")
    create_topic(herd.bootstrap, topic, 4)
    a = JavaMember(java_driver, herd.bootstrap, group, [topic], "sa", instance_id="inst-a", session_ms=30000)
    b = JavaMember(java_driver, herd.bootstrap, group, [topic], "sb", instance_id="inst-b", session_ms=30000)
    gen = wait_converged([a, b], all_partitions(topic, 4), 60)
    before = a.partitions()
    a.stop()  # a static member's close() sends no LeaveGroup
    a2 = JavaMember(java_driver, herd.bootstrap, group, [topic], "sa2", instance_id="inst-a", session_ms=30000)
    wait_until(lambda: a2.state() is not None, 30, "the restarted static member's assignment")
    assert a2.partitions() == before
    assert a2.state()["generation"] == gen
    assert b.state()["generation"] == gen, "the other member rebalanced"
    assert a2.state()["member_id"] != a.state()["member_id"]


def test_member_past_max_poll_interval_leaves_and_rejoins(herd, java_driver):
    group, topic = names("java-maxpoll")
    create_topic(herd.bootstrap, topic, 4)
    a = JavaMember(java_driver, herd.bootstrap, group, [topic], "slow", max_poll_ms=3000, session_ms=10000)
    b = JavaMember(java_driver, herd.bootstrap, group, [topic], "fast", max_poll_ms=3000, session_ms=10000)
    gen = wait_converged([a, b], all_partitions(topic, 4), 60)
    a.stall(6000)
    # the heartbeat thread sees poll() late and leaves the group; b takes everything meanwhile
    wait_until(lambda: b.state() and b.state()["generation"] > gen and len(b.partitions()) == 4, 20,
               lambda: f"b owning all 4: {b.describe()}")
    wait_until(lambda: any(e["ev"] == "stalled" for e in a.snapshot()), 20, "the stall's end")
    gen3 = wait_converged([a, b], all_partitions(topic, 4), 60)
    assert gen3 >= gen + 2
    assert any(e["ev"] in ("lost", "revoked") for e in a.snapshot())


def test_mixed_java_herd_confluent(herd, java_driver, members):
    group, topic = names("java-mixed")
    create_topic(herd.bootstrap, topic, 6)
    j = JavaMember(java_driver, herd.bootstrap, group, [topic], "java", assignor="range")
    h = HerdMember(herd.bootstrap, group, [topic], "herd", assignor="range")
    try:
        c = members.start("confluent", herd.bootstrap, group, [topic], "confluent", assignor="range")
        wait_converged([j, h, c], all_partitions(topic, 6), 60)
        assert sorted(len(x.partitions()) for x in (j, h, c)) == [2, 2, 2]
        j.stop()
        wait_converged([h, c], all_partitions(topic, 6), 60)
    finally:
        h.stop()
    assert herd_warnings(herd) == []


def test_group_protocol_consumer_converges_revokes_before_assigning_and_commits(tmp_path, java_driver):
    """KIP-848 (group.protocol=consumer) with Kafka's own Java client: three members converge on
    herd's server-side assignment, a fourth joins and one leaves with no partition ever owned by two
    members (the callbacks' clock, one JVM), and their commits read back."""
    from tools.daemon import Daemon

    with Daemon(tmp_path / "data", "--group-consumer-heartbeat-interval-ms", "300",
                "--group-consumer-min-heartbeat-interval-ms", "100") as herd:
        group, topic = names("java-848")
        create_topic(herd.bootstrap, topic, 6)
        ms = [JavaMember(java_driver, herd.bootstrap, group, [topic], f"k848-{i}", **{"group.protocol": "consumer"})
              for i in range(3)]
        wait_until(lambda: sorted(len(x.partitions()) for x in ms) == [2, 2, 2], 60,
                   lambda: f"three members with 2 partitions each: {[x.partitions() for x in ms]}")
        ms.append(JavaMember(java_driver, herd.bootstrap, group, [topic], "k848-3", **{"group.protocol": "consumer"}))
        wait_until(lambda: sorted(len(x.partitions()) for x in ms) == [1, 1, 2, 2], 60,
                   lambda: f"four members sharing 6 partitions: {[x.partitions() for x in ms]}")
        ms[0].stop()
        rest = ms[1:]
        wait_until(lambda: sorted(len(x.partitions()) for x in rest) == [2, 2, 2], 60,
                   lambda: f"three members again: {[x.partitions() for x in rest]}")
        owner: dict = {}
        for _, who, ev, parts in ownership_timeline(ms):
            for p in map(tuple, parts):
                if ev == "assigned":
                    assert p not in owner, f"{p} assigned to {who} while {owner[p]} owns it"
                    owner[p] = who
                else:
                    assert owner.get(p) == who, (p, who, owner.get(p))
                    del owner[p]
        assert not any(e["ev"] == "lost" for x in ms for e in x.snapshot())
        assert not any(x.errors() for x in ms), [x.errors() for x in ms]
        mine = sorted(p for _, p in rest[0].partitions())
        got = rest[0].commit([(topic, p, 10 + p, "k848") for p in mine])  # with its member epoch (OffsetCommit v9+)
        assert got["error"] is None, got
        assert raw_offsets(herd, group) == {(topic, p): (10 + p, "k848") for p in mine}
        for x in rest:
            x.stop()
        assert herd_warnings(herd) == []
