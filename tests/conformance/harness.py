"""Helpers for the conformance tests: group members as child processes, topic creation, waits."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from tests.support.daemon import REPO

MEMBER_SCRIPT = Path(__file__).with_name("member.py")

# Short but legal timeouts (herd's default group.min.session.timeout.ms is 6000, as Kafka's).
SESSION_MS = 6000
HEARTBEAT_MS = 500
MAX_POLL_MS = 10000  # also the rebalance timeout the clients send


# Warnings about the host, not about what a client sent: a stalled event loop (or a stopped
# process, a wall-clock step) or a slow GC pause on a loaded CI machine, a missing C CRC32C. Every
# other warning or error the daemon logs while a third-party client talks to it fails the test.
HOST_EVENTS = frozenset({"loop.lag", "loop.stall", "clock.wall_step", "gc.pause", "log.crc32c_slow"})
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


class Member:
    """A member.py child process and the JSON events it printed."""

    def __init__(self, tmp_path: Path, client: str, bootstrap: str, group: str, topics: list[str],
                 name: str, *, assignor: str | None = None, instance_id: str | None = None,
                 session_ms: int = SESSION_MS, heartbeat_ms: int = HEARTBEAT_MS,
                 max_poll_ms: int = MAX_POLL_MS):
        self.name = name
        self.client = client
        cfg = dict(client=client, bootstrap=bootstrap, group=group, topics=topics, name=name,
                   assignor=assignor, instance_id=instance_id, session_ms=session_ms,
                   heartbeat_ms=heartbeat_ms, max_poll_ms=max_poll_ms)
        self.stderr_path = tmp_path / f"member-{name}.stderr"
        self._stderr = open(self.stderr_path, "ab")
        env = dict(os.environ)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            [sys.executable, str(MEMBER_SCRIPT), json.dumps(cfg)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self._stderr, cwd=str(REPO), env=env)
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                self.events.append(ev)

    # -- views ---------------------------------------------------------------------------------
    def snapshot(self) -> list[dict]:
        with self._lock:
            return list(self.events)

    def state(self) -> dict | None:
        """The last full-assignment report: {"partitions", "generation", "member_id", "t"}."""
        for ev in reversed(self.snapshot()):
            if ev["ev"] == "state":
                return ev
        return None

    def partitions(self) -> set[tuple[str, int]]:
        st = self.state()
        return {tuple(p) for p in st["partitions"]} if st else set()

    def alive(self) -> bool:
        return self.proc.poll() is None

    def describe(self) -> str:
        st = self.state()
        return (f"{self.name}({self.client}, alive={self.alive()}): "
                f"{sorted(p for _, p in self.partitions())} gen={st and st['generation']}")

    def stderr_tail(self, n: int = 3000) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-n:]
        except OSError:
            return ""

    # -- control -------------------------------------------------------------------------------
    def stop(self, timeout: float = 20.0) -> int | None:
        """SIGTERM: the member closes its consumer (LeaveGroup for dynamic members) and exits."""
        if self.alive():
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self._reader.join(5)
        return self.proc.returncode

    def kill(self) -> None:
        if self.alive():
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def cleanup(self) -> None:
        self.kill()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass
        self._stderr.close()


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
