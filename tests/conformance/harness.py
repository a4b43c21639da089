"""Helpers for the conformance tests: group members as child processes, topic creation, waits."""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from tools.member import HEARTBEAT_MS, MAX_POLL_MS, SESSION_MS, Member  # noqa: F401 (the tests' names)

# Warnings about the host, not about what a client sent: a stalled event loop or a slow GC pause
# on a loaded CI machine, a missing C CRC32C. Every other warning or error the daemon logs while a
# third-party client talks to it fails the test.
HOST_EVENTS = frozenset({"loop.lag", "gc.pause", "log.crc32c_slow"})
# Every test daemon starts on a new data directory, which herd announces as a warning.
START_EVENTS = frozenset({"log.new_data_dir"})


def herd_warnings(herd) -> list[dict]:
    """The daemon's warning/error log records (JSON lines), host conditions left out."""
    out = []
    for line in herd.logs().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("level") in ("warning", "error", "critical") and rec.get("event") not in HOST_EVENTS | START_EVENTS:
            out.append(rec)
    return out


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    """CreateTopics through confluent's AdminClient (herd auto-creates with 1 partition otherwise)."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    futures = admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=10)
    futures[name].result(timeout=15)
    md = admin.list_topics(name, timeout=10)
    assert len(md.topics[name].partitions) == partitions, md.topics[name].partitions


def wait_until(predicate: Callable[[], object], timeout: float, what: str | Callable[[], str],
               interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            msg = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout}s waiting for {msg}")
        time.sleep(interval)


class Members:
    """Every member a test starts; all are killed at teardown."""

    def __init__(self, tmp_path: Path):
        self.tmp_path = tmp_path
        self.all: list[Member] = []

    def start(self, *args, **kwargs) -> Member:
        m = Member(self.tmp_path, *args, **kwargs)
        self.all.append(m)
        return m

    def cleanup(self) -> None:
        for m in self.all:
            m.cleanup()


def all_partitions(topic: str, n: int) -> set[tuple[str, int]]:
    return {(topic, p) for p in range(n)}


def converged(members: Iterable[Member], expected: set[tuple[str, int]]) -> bool:
    """Every member reports the same generation and together they own each partition exactly once."""
    members = list(members)
    states = [m.state() for m in members]
    if any(st is None or st["generation"] is None or st["generation"] < 1 for st in states):
        return False
    if len({st["generation"] for st in states}) != 1:
        return False
    owned = [tuple(p) for st in states for p in st["partitions"]]
    return len(owned) == len(set(owned)) and set(owned) == expected


def wait_converged(members: Iterable[Member], expected: set[tuple[str, int]], timeout: float) -> int:
    """Wait until the group converged and stays so for a moment; returns the generation."""
    members = list(members)

    def stable() -> bool:
        if not converged(members, expected):
            return False
        gen = members[0].state()["generation"]
        time.sleep(0.3)
        return converged(members, expected) and members[0].state()["generation"] == gen

    def why() -> str:
        lines = "\n  ".join(m.describe() for m in members)
        tails = "\n".join(f"--- {m.name} stderr:\n{m.stderr_tail(1500)}" for m in members
                          if not m.alive() or m.state() is None)
        return f"a complete assignment of {len(expected)} partitions:\n  {lines}\n{tails}"

    wait_until(stable, timeout, why)
    return members[0].state()["generation"]
