"""Unmodified third-party clients form classic consumer groups against the real herd daemon.

Each member runs as a child process (member.py) so it can be SIGKILLed; it prints its assignment,
generation and rebalance callbacks as JSON lines, and the test judges the group from those.

Client notes:
- kafka-python 3.x runs with default version negotiation (no api_version pin) and its default
  assignors (range, roundrobin); herd picks the protocol by vote.
- aiokafka 0.14.0 runs with ONE assignor: with two it sends one JoinGroup per assignor without
  reusing the member id (seen in our captures), which is a client quirk, not a herd behaviour.
- confluent-kafka uses the classic protocol (group.protocol=classic is its default).
"""
from __future__ import annotations

import time

import pytest

from tests.conformance.harness import (
    SESSION_MS,
    all_partitions,
    converged,
    create_topic,
    wait_converged,
    wait_until,
)

pytestmark = pytest.mark.conformance

CLIENTS = ["kafka-python", "aiokafka", "confluent"]
JOIN_TIMEOUT = 30.0
# A SIGKILLed member is noticed when its session expires; the survivors then rejoin on their next
# heartbeat (500 ms) and the rebalance completes once all have rejoined.
KILL_MARGIN = 6.0


@pytest.mark.parametrize("client", CLIENTS)
def test_five_members_converge_survive_leave_and_sigkill(herd, members, client):
    """5 members split a 10-partition topic exactly once; a clean leave and a SIGKILL rebalance."""
    topic, group = "orders", f"lifecycle-{client}"
    create_topic(herd.bootstrap, topic, 10)
    expected = all_partitions(topic, 10)
    # Default assignors for kafka-python and confluent, one for aiokafka (see module docstring).
    ms = [members.start(client, herd.bootstrap, group, [topic], f"{client}-{i}") for i in range(5)]

    gen1 = wait_converged(ms, expected, JOIN_TIMEOUT)
    assert all(len(m.partitions()) == 2 for m in ms), [m.describe() for m in ms]

    # Clean leave: the member closes its consumer, which sends LeaveGroup. The rest must rebalance
    # at once, not after the leaver's session timeout.
    leaver, ms = ms[0], ms[1:]
    t0 = time.monotonic()
    assert leaver.stop() == 0, leaver.stderr_tail()
    gen2 = wait_converged(ms, expected, JOIN_TIMEOUT)
    leave_s = time.monotonic() - t0
    assert gen2 > gen1
    assert leave_s < SESSION_MS / 1000, (
        f"rebalance after LeaveGroup took {leave_s:.1f}s: herd waited for the session timeout")

    # SIGKILL: no LeaveGroup; herd expires the member after session.timeout.ms and rebalances.
    victim, ms = ms[0], ms[1:]
    t0 = time.monotonic()
    victim.kill()
    gen3 = wait_converged(ms, expected, SESSION_MS / 1000 + KILL_MARGIN)
    kill_s = time.monotonic() - t0
    assert gen3 > gen2
    assert kill_s > SESSION_MS / 1000 * 0.5, f"group rebalanced {kill_s:.1f}s after the kill"
    # Each survivor got a fair share, and herd's view agrees: exactly the survivors are members.
    assert sorted(len(m.partitions()) for m in ms) == [3, 3, 4]
    described = describe_group(herd.bootstrap, group)
    assert described["group_state"] == "Stable"
    assert sorted(mm["member_id"] for mm in described["members"]) == sorted(
        m.state()["member_id"] for m in ms)


def test_mixed_kafka_python_and_confluent_range_group(herd, members):
    """kafka-python (RangePartitionAssignor) and confluent (range) members share one group."""
    topic, group = "mixed", "mixed-range"
    create_topic(herd.bootstrap, topic, 10)
    expected = all_partitions(topic, 10)
    ms = [members.start("kafka-python", herd.bootstrap, group, [topic], f"kp-{i}", assignor="range")
          for i in range(3)]
    ms += [members.start("confluent", herd.bootstrap, group, [topic], f"ck-{i}", assignor="range")
           for i in range(2)]
    wait_converged(ms, expected, JOIN_TIMEOUT)
    # The range assignor gives each member one contiguous block of 2 partitions.
    for m in ms:
        ps = sorted(p for _, p in m.partitions())
        assert len(ps) == 2 and ps[1] == ps[0] + 1, m.describe()
    described = describe_group(herd.bootstrap, group)
    assert (described["protocol_type"], described["protocol_data"]) == ("consumer", "range")
    assert sorted(mm["client_id"] for mm in described["members"]) == sorted(m.name for m in ms)

    # And the mixed group still rebalances when a member of either kind leaves.
    ms[0].stop()
    ms[-1].stop()
    wait_converged(ms[1:-1], expected, JOIN_TIMEOUT)
    for m in ms[1:-1]:
        ps = sorted(p for _, p in m.partitions())
        assert ps == list(range(ps[0], ps[0] + len(ps))) and len(ps) in (3, 4), m.describe()


def _ownership_intervals(member, end_time):
    """{partition: [(start, end)]} from a member's assigned/revoked/lost callbacks."""
    owned: dict = {}
    out: dict = {}
    for ev in member.snapshot():
        if ev["ev"] == "assigned":
            for tp in map(tuple, ev["partitions"]):
                assert tp not in owned, f"{member.name} assigned {tp} twice: {ev}"
                owned[tp] = ev["t"]
        elif ev["ev"] in ("revoked", "lost"):
            for tp in map(tuple, ev["partitions"]):
                assert tp in owned, f"{member.name} revoked {tp} it did not own: {ev}"
                out.setdefault(tp, []).append((owned.pop(tp), ev["t"]))
        elif ev["ev"] == "closed":
            end_time = ev["t"]
    for tp, start in owned.items():
        out.setdefault(tp, []).append((start, end_time))
    return out


def _assert_never_owned_twice(ms, end_times):
    per_partition: dict = {}
    for m in ms:
        for tp, spans in _ownership_intervals(m, end_times[m.name]).items():
            per_partition.setdefault(tp, []).extend((s, e, m.name) for s, e in spans)
    for tp, spans in per_partition.items():
        spans.sort()
        for (s1, e1, n1), (s2, _e2, n2) in zip(spans, spans[1:], strict=False):
            assert s2 >= e1, f"{tp} owned by {n1} [{s1:.3f}, {e1:.3f}] and {n2} from {s2:.3f}"


def _revoked(member, since):
    return {tuple(p) for ev in member.snapshot() if ev["ev"] in ("revoked", "lost") and ev["t"] >= since
            for p in ev["partitions"]}


def test_confluent_cooperative_sticky_rebalances_incrementally(herd, members):
    """cooperative-sticky: joins and leaves move only the partitions that must move, and no
    partition is ever owned by two members at once (from the on_assign/on_revoke timeline)."""
    topic, group = "coop", "coop-sticky"
    create_topic(herd.bootstrap, topic, 12)
    expected = all_partitions(topic, 12)

    def start(i):
        return members.start("confluent", herd.bootstrap, group, [topic], f"coop-{i}",
                             assignor="cooperative-sticky")

    a, b = start(0), start(1)
    wait_converged([a, b], expected, JOIN_TIMEOUT)
    assert describe_group(herd.bootstrap, group)["protocol_data"] == "cooperative-sticky"
    before = {m.name: m.partitions() for m in (a, b)}

    # A third member joins: a and b each give up some partitions, keep the rest, and never have
    # a kept partition revoked (an eager rebalance would revoke everything first).
    t_join = time.monotonic()
    c = start(2)
    wait_converged([a, b, c], expected, JOIN_TIMEOUT)
    assert sorted(len(m.partitions()) for m in (a, b, c)) == [4, 4, 4]
    for m in (a, b):
        kept = before[m.name] & m.partitions()
        assert kept == m.partitions(), f"{m.name} gained partitions on a join: {m.describe()}"
        assert kept, m.describe()
        assert not (_revoked(m, t_join) & kept), f"{m.name} had kept partitions revoked"
        assert _revoked(m, t_join) == before[m.name] - kept

    # A clean leave: the survivors only gain partitions; nothing of theirs is revoked.
    before = {m.name: m.partitions() for m in (b, c)}
    t_leave = time.monotonic()
    assert a.stop() == 0, a.stderr_tail()
    wait_converged([b, c], expected, JOIN_TIMEOUT)
    for m in (b, c):
        assert before[m.name] <= m.partitions(), m.describe()
        assert not _revoked(m, t_leave), f"{m.name} had partitions revoked when a member left"

    now = time.monotonic()
    _assert_never_owned_twice([a, b, c], {"coop-0": now, "coop-1": now, "coop-2": now})


STATIC_CASES = [("kafka-python", "close"), ("aiokafka", "kill"), ("confluent", "close"),
                ("confluent", "kill")]


@pytest.mark.parametrize("client,how", STATIC_CASES, ids=[f"{c}-{h}" for c, h in STATIC_CASES])
def test_static_member_restarts_within_session_and_keeps_partitions(herd, members, client, how):
    """KIP-345: a static member that comes back (same group.instance.id) within the session
    timeout gets its partitions back with no new generation; the others see no rebalance."""
    topic, group = "static", f"static-{client}-{how}"
    create_topic(herd.bootstrap, topic, 6)
    expected = all_partitions(topic, 6)

    def start(i):
        return members.start(client, herd.bootstrap, group, [topic], f"static-{i}",
                             instance_id=f"instance-{i}", assignor="range")

    ms = [start(i) for i in range(3)]
    gen = wait_converged(ms, expected, JOIN_TIMEOUT)
    old = ms[1]
    old_partitions = old.partitions()
    t_restart = time.monotonic()
    if how == "close":  # static members send no LeaveGroup on close (KIP-345)
        assert old.stop() == 0, old.stderr_tail()
    else:
        old.kill()
    new = start(1)
    others = [ms[0], ms[2]]
    wait_until(lambda: converged([ms[0], new, ms[2]], expected), SESSION_MS / 1000,
               lambda: "the restarted static member to rejoin: "
                       + "; ".join(m.describe() for m in (ms[0], new, ms[2])))
    assert new.partitions() == old_partitions
    assert new.state()["generation"] == gen, "the static member's return started a new generation"
    # Stay put for longer than the old member's session timeout: herd must not expire the old
    # member id and rebalance.
    time.sleep(SESSION_MS / 1000 - (time.monotonic() - t_restart) + 1.5)
    for m in [*others, new]:
        assert m.state()["generation"] == gen, m.describe()
    for m in others:
        changes = [ev for ev in m.snapshot() if ev["t"] >= t_restart
                   and ev["ev"] in ("assigned", "revoked", "lost")]
        assert not changes, f"{m.name} saw a rebalance: {changes}"
    # herd's own view (DescribeGroups): still 3 members, the instance id now maps to the new
    # member id, and the old member id is gone.
    described = describe_group(herd.bootstrap, group)
    assert described["group_state"] == "Stable"
    by_instance = {mm["group_instance_id"]: mm["member_id"] for mm in described["members"]}
    assert by_instance == {f"instance-{i}": m.state()["member_id"]
                           for i, m in enumerate([ms[0], new, ms[2]])}
    assert old.state()["member_id"] not in by_instance.values()


def describe_group(bootstrap, group) -> dict:
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=10000)
    try:
        return admin.describe_groups([group])[group]
    finally:
        admin.close()
