"""herd paused with SIGSTOP for 15 s under groups of unmodified clients (issue 25): herd gives its
members back the time it was away, so it expires nobody for its own pause; a member killed during
the pause alone is removed, one session timeout after herd came back.

Each member runs as its own process (member.py); session 10 s, heartbeat 1 s. What the clients do
on their side during the pause differs:

- kafka-python (like the Java consumer) keeps its member id when it hears nothing for a session
  timeout: it only looks the coordinator up again. Nothing is revoked, the generation stays.
- librdkafka (confluent-kafka) enforces the session on its own side: after session.timeout.ms
  without a successful heartbeat answer it declares its partitions lost, drops its member id and
  joins again as a new member when herd answers (its log says SESSTMOUT). herd cannot undo what the
  client did while herd was stopped; it removes the given-up member ids at once
  (``member_rejoined_as_new``) so the group is whole again as soon as it can be.
"""
from __future__ import annotations

import json
import os
import signal
import time
from datetime import datetime

import pytest

from tests.conformance.harness import all_partitions, create_topic, wait_converged

pytestmark = [pytest.mark.conformance, pytest.mark.slow]

SESSION_MS = 10_000
HEARTBEAT_MS = 1_000
PAUSE = 15.0
KILL_AFTER = 5.0  # into the pause


def herd_records(herd) -> list[dict]:
    out = []
    for line in herd.logs().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def events(records, name) -> list[dict]:
    return [r for r in records if r.get("event") == name]


def pauses(records) -> list[dict]:
    """herd's ``loop.stall`` lines for the SIGSTOPs (a loaded machine adds short ``busy`` ones: the
    loop ran, or waited for a CPU, over the threshold; they are not what the test paused)."""
    return [r for r in events(records, "loop.stall") if r["stall_ms"] >= PAUSE * 1000]


def at(record) -> float:
    return datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00")).timestamp()


def pause_herd(herd, seconds: float, kill=None) -> tuple[float, float]:
    """SIGSTOP herd for ``seconds`` (SIGKILL member ``kill`` KILL_AFTER into it), SIGCONT. -> the
    CLOCK_MONOTONIC times of stop and resume (the members stamp their events with the same clock)."""
    os.kill(herd.proc.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    try:
        if kill is not None:
            time.sleep(KILL_AFTER)
            kill.kill()
        time.sleep(max(0.0, seconds - (time.monotonic() - stopped)))
    finally:
        os.kill(herd.proc.pid, signal.SIGCONT)
    return stopped, time.monotonic()


def start_group(herd, members, client, topic, group):
    create_topic(herd.bootstrap, topic, 6)
    ms = [members.start(client, herd.bootstrap, group, [topic], f"{client[:2]}{i}", session_ms=SESSION_MS,
                        heartbeat_ms=HEARTBEAT_MS, max_poll_ms=30_000) for i in range(3)]
    gen = wait_converged(ms, all_partitions(topic, 6), 60)
    return ms, gen


def changes_since(m, n: int) -> list[dict]:
    return [e for e in m.snapshot()[n:] if e["ev"] in ("revoked", "lost", "assigned")]


def test_kafka_python_members_keep_everything_and_a_member_killed_in_the_pause_alone_is_removed(herd, members):
    topic = "stall-kp"
    ms, gen = start_group(herd, members, "kafka-python", topic, "stall-kp")
    before = {m.name: (m.state()["member_id"], m.state()["generation"], m.partitions()) for m in ms}
    seen = {m.name: len(m.snapshot()) for m in ms}

    pause_herd(herd, PAUSE)
    time.sleep(SESSION_MS / 1000 + 2)  # past every deadline herd's pause would have broken
    for m in ms:
        assert m.alive(), m.stderr_tail()
        assert (m.state()["member_id"], m.state()["generation"], m.partitions()) == before[m.name]
        assert changes_since(m, seen[m.name]) == [], m.name  # nothing revoked, lost or reassigned
    recs = herd_records(herd)
    (stall,) = pauses(recs)
    assert PAUSE * 1000 <= stall["stall_ms"] < PAUSE * 1000 + 2_000
    # a SIGSTOP: the loop thread neither ran nor waited for a CPU, so (all but the few ms it ran
    # around the pause) the whole gap is given back
    assert stall["kind"] == "loop" and stall["running_or_runnable_ms"] < 500
    assert stall["given_back_ms"] == stall["stall_ms"] - stall["running_or_runnable_ms"]
    assert events(recs, "member_expired") == [] and events(recs, "member_rejoined_as_new") == []

    victim, live = ms[2], ms[:2]
    formed = len(events(recs, "rebalance_completed"))
    pause_herd(herd, PAUSE, kill=victim)
    gen2 = wait_converged(live, all_partitions(topic, 6), 40)
    recs = herd_records(herd)
    why = (events(recs, "rebalance_completed"), events(recs, "member_expired"),
           [m.snapshot()[seen[m.name]:] for m in live], [m.stderr_tail(3000) for m in live])
    assert [m.state()["member_id"] for m in live] == [before[m.name][0] for m in live], why
    stall2 = pauses(recs)[-1]
    expired = events(recs, "member_expired")
    assert len(expired) == 1, why
    expired = expired[0]
    assert expired["member_id"] == before[victim.name][0] and expired["why"] == "session_expired", why
    # one session timeout after herd came back, less the time since its last heartbeat (<= 1 s)
    assert SESSION_MS / 1000 - 2 <= at(expired) - at(stall2) <= SESSION_MS / 1000 + 1, why
    # herd's one rebalance: the victim's expiry. A kafka-python member may add one of its own (its
    # leader rejoining during Stable, or new metadata: Kafka answers both with a rebalance too); any
    # other reason would be herd's doing. (CI once saw gen + 2 here, its cause not recorded then:
    # `why` shows herd's rebalances and the members' events if it comes back.)
    after = events(recs, "rebalance_completed")[formed:]
    assert after and after[0]["reason"] == "session_expired" and after[0]["generation"] == gen + 1, why
    assert all(r["reason"] in ("leader_rejoin", "metadata_changed") for r in after[1:]), why
    assert gen2 == gen + len(after), why


def test_confluent_members_are_whole_again_at_resume_and_a_member_killed_in_the_pause_alone_is_removed(
        herd, members):
    topic = "stall-ck"
    ms, gen = start_group(herd, members, "confluent", topic, "stall-ck")
    before = {m.name: m.state()["member_id"] for m in ms}
    seen = {m.name: len(m.snapshot()) for m in ms}
    victim, live = ms[2], ms[:2]

    stopped, resumed = pause_herd(herd, PAUSE, kill=victim)
    wait_converged(live, all_partitions(topic, 6), 40)
    recs = herd_records(herd)
    (stall,) = pauses(recs)
    assert PAUSE * 1000 <= stall["stall_ms"] < PAUSE * 1000 + 2_000
    # librdkafka gave its session up on its own while herd was stopped (SESSTMOUT): its partitions
    # were lost before herd came back, and nothing was taken from it after
    for m in live:
        lost = [e for e in changes_since(m, seen[m.name]) if e["ev"] in ("lost", "revoked")]
        assert lost and all(stopped + SESSION_MS / 1000 - 2 < e["t"] < resumed for e in lost), (m.name, lost)
    # herd: the live clients' old ids are removed as they join again, the killed one expires alone,
    # one session timeout after herd came back
    rejoined = events(recs, "member_rejoined_as_new")
    assert sorted(r["member_id"] for r in rejoined) == sorted(before[m.name] for m in live)
    assert all(at(r) - at(stall) < 2 for r in rejoined)
    (expired,) = events(recs, "member_expired")
    assert expired["member_id"] == before[victim.name] and expired["why"] == "session_expired"
    assert SESSION_MS / 1000 - 2 <= at(expired) - at(stall) <= SESSION_MS / 1000 + 1
    completed = [r for r in events(recs, "rebalance_completed") if at(r) >= at(stall)]
    assert completed and completed[-1]["members"] == 2
    assert completed[0]["stall"]["when"] == "after" and completed[0]["stall"]["stall_ms"] == stall["stall_ms"]
