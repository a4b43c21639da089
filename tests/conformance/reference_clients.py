"""The reference clients for the conformance tests (pytest -m reference): Kafka's own Java client
and its kafka-consumer-groups tool (one JVM for the whole session, herd.ref.Driver), franz-go (one
process per member) and herd's thin client, each seen through the same small interface as
tests/conformance/harness.py's Member (state(), partitions(), alive(), describe(), stop()), so
``converged``/``wait_converged`` work on mixed groups."""
from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from pathlib import Path

from tests.conformance.harness import HEARTBEAT_MS, MAX_POLL_MS, SESSION_MS, Member, wait_until
from tools.reference import classpath, franz_member, java


class JavaDriver:
    """One JVM running herd.ref.Driver: many KafkaConsumers on threads, and the tool in process."""

    def __init__(self, log_dir: Path):
        self.log_dir = Path(log_dir)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log4j = self.log_dir / "log4j2.properties"
        log4j.write_text(
            "status = error\nappender.f.type = File\nappender.f.name = f\n"
            f"appender.f.fileName = {self.log_dir / 'java-client.log'}\n"
            "appender.f.layout.type = PatternLayout\nappender.f.layout.pattern = [%d] %p %t %m (%c)%n\n"
            "rootLogger.level = INFO\nrootLogger.appenderRef.f.ref = f\n")
        self._stderr = open(self.log_dir / "driver.stderr", "ab")
        self.proc = subprocess.Popen(
            [java(), "-Xmx384m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
             f"-Dlog4j2.configurationFile={log4j}", "-cp", classpath(with_driver=True), "herd.ref.Driver"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, bufsize=1)
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        self.wait_event(lambda e: e["ev"] == "ready", 60, "the Java driver to start")

    def _read(self) -> None:
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            with self._cond:
                self.events.append(ev)
                self._cond.notify_all()

    def send(self, **cmd) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def wait_event(self, pred, timeout: float, what: str, start: int = 0) -> dict:
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for ev in self.events[start:]:
                    if pred(ev):
                        return ev
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(f"timed out after {timeout}s waiting for {what}; "
                                         f"driver alive={self.proc.poll() is None}")
                self._cond.wait(min(left, 0.5))

    def mark(self) -> int:
        with self._lock:
            return len(self.events)

    def events_of(self, member_id: str) -> list[dict]:
        with self._lock:
            return [e for e in self.events if e.get("id") == member_id]

    def tool(self, *args: str, timeout: float = 60) -> tuple[int, str, str]:
        """kafka-consumer-groups (ConsumerGroupCommand) with these arguments: (exit code, out, err)."""
        tag = f"tool-{time.monotonic_ns()}"
        start = self.mark()
        self.send(cmd="tool", args=list(args), tag=tag)
        ev = self.wait_event(lambda e: e["ev"] == "tool" and e.get("tag") == tag, timeout,
                             f"kafka-consumer-groups {' '.join(args)}", start)
        return ev["code"], ev["out"], ev["err"]

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send(cmd="exit")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait(10)
        self._stderr.close()


class JavaMember:
    """One KafkaConsumer inside the session's JVM."""

    _n = 0

    def __init__(self, driver: JavaDriver, bootstrap: str, group: str, topics: list[str], name: str, *,
                 assignor: str | None = None, instance_id: str | None = None, session_ms: int = SESSION_MS,
                 heartbeat_ms: int = HEARTBEAT_MS, max_poll_ms: int = MAX_POLL_MS, **extra: str):
        JavaMember._n += 1
        self.driver = driver
        self.name = name
        self.id = f"{name}-{JavaMember._n}"
        self.client = "java"
        props = {"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": session_ms,
                 "heartbeat.interval.ms": heartbeat_ms, "max.poll.interval.ms": max_poll_ms}
        if assignor:
            props["partition.assignment.strategy"] = ASSIGNORS[assignor]
        if instance_id:
            props["group.instance.id"] = instance_id
        props.update(extra)
        if str(props.get("group.protocol", "")).lower() == "consumer":
            # KIP-848: the server owns these; the client refuses them
            for k in ("session.timeout.ms", "heartbeat.interval.ms", "partition.assignment.strategy"):
                props.pop(k, None)
        driver.send(cmd="start", id=self.id, topics=topics, props={k: str(v) for k, v in props.items()})

    def snapshot(self) -> list[dict]:
        return self.driver.events_of(self.id)

    def state(self) -> dict | None:
        for ev in reversed(self.snapshot()):
            if ev["ev"] == "state":
                return ev
        return None

    def partitions(self) -> set[tuple[str, int]]:
        st = self.state()
        return {tuple(p) for p in st["partitions"]} if st else set()

    def alive(self) -> bool:
        return not any(e["ev"] == "closed" for e in self.snapshot())

    def errors(self) -> list[dict]:
        return [e for e in self.snapshot() if e["ev"] == "error"]

    def describe(self) -> str:
        st = self.state()
        return (f"{self.name}(java, alive={self.alive()}): {sorted(p for _, p in self.partitions())} "
                f"gen={st and st['generation']} errors={self.errors()}")

    def stderr_tail(self, n: int = 3000) -> str:
        return ""

    def command(self, cmd: str, reply: str, timeout: float = 30, **kw) -> dict:
        start = self.driver.mark()
        self.driver.send(cmd=cmd, id=self.id, **kw)
        return self.driver.wait_event(lambda e: e.get("id") == self.id and e["ev"] == reply, timeout,
                                      f"{self.name}: {cmd} -> {reply}", start)

    def commit(self, offsets: list[tuple[str, int, int, str]]) -> dict:
        return self.command("commit", "committed", offsets=[list(o) for o in offsets])

    def committed(self, partitions) -> dict:
        return self.command("committed", "offsets", partitions=[list(p) for p in partitions])

    def stall(self, ms: int) -> None:
        self.driver.send(cmd="stall", id=self.id, ms=ms)

    def stop(self, timeout: float = 30) -> None:
        if self.alive():
            self.command("close", "closed", timeout)


ASSIGNORS = {
    "range": "org.apache.kafka.clients.consumer.RangeAssignor",
    "roundrobin": "org.apache.kafka.clients.consumer.RoundRobinAssignor",
    "sticky": "org.apache.kafka.clients.consumer.StickyAssignor",
    "cooperative-sticky": "org.apache.kafka.clients.consumer.CooperativeStickyAssignor",
}


class FranzMember(Member):
    """A franz-go member (tests/conformance/go), same JSON lines as member.py."""

    def __init__(self, tmp_path: Path, bootstrap: str, group: str, topics: list[str], name: str, *,
                 assignor: str | None = None, instance_id: str | None = None, session_ms: int = SESSION_MS,
                 heartbeat_ms: int = HEARTBEAT_MS, max_poll_ms: int = MAX_POLL_MS):
        self.name = name
        self.client = "franz-go"
        cfg = dict(bootstrap=bootstrap, group=group, topics=topics, name=name, assignor=assignor or "",
                   instance_id=instance_id or "", session_ms=session_ms, heartbeat_ms=heartbeat_ms,
                   max_poll_ms=max_poll_ms)
        self.stderr_path = tmp_path / f"franz-{name}.stderr"
        self._stderr = open(self.stderr_path, "ab")
        self.proc = subprocess.Popen([franz_member(), json.dumps(cfg)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self._stderr, env=dict(os.environ))
        self.events: list[dict] = []
        self._lock = threading.Lock()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def command(self, reply: str, timeout: float = 20, **cmd) -> dict:
        start = len(self.snapshot())
        self.proc.stdin.write((json.dumps(cmd) + "\n").encode())
        self.proc.stdin.flush()
        return wait_until(lambda: next((e for e in self.snapshot()[start:] if e["ev"] == reply), None),
                          timeout, f"{self.name}: {cmd['cmd']} -> {reply}")


class HerdMember:
    """herd's thin client (client.GroupConsumer) polled on a thread of this process."""

    def __init__(self, bootstrap: str, group: str, topics: list[str], name: str, *, assignor: str | None = None,
                 session_ms: int = SESSION_MS, heartbeat_ms: int = HEARTBEAT_MS, max_poll_ms: int = MAX_POLL_MS):
        from client import GroupConsumer

        self.name = name
        self.client = "herd"
        kw = dict(session_timeout_ms=session_ms, heartbeat_interval_ms=heartbeat_ms,
                  max_poll_interval_ms=max_poll_ms, client_id=f"herd-{name}")
        if assignor:
            kw["partition_assignment_strategy"] = [assignor]
        self.consumer = GroupConsumer(bootstrap, group, **kw)
        self.consumer.subscribe(topics)
        self._stop = threading.Event()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.consumer.poll(0.05)
        finally:
            self.consumer.close(timeout_s=10)
            self._closed.set()

    def state(self) -> dict | None:
        s = self.consumer.group_state()
        if s["generation"] < 1 or not s["stable"]:
            return None
        return {"generation": s["generation"], "member_id": s["member_id"],
                "partitions": [[tp.topic, tp.partition] for tp in s["assignment"]]}

    def partitions(self) -> set[tuple[str, int]]:
        st = self.state()
        return {tuple(p) for p in st["partitions"]} if st else set()

    def alive(self) -> bool:
        return not self._closed.is_set()

    def describe(self) -> str:
        return f"{self.name}(herd): {self.consumer.group_state()}"

    def stderr_tail(self, n: int = 3000) -> str:
        return ""

    def stop(self, timeout: float = 20) -> None:
        self._stop.set()
        self._thread.join(timeout)
