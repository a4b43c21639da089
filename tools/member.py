"""One group member of an unmodified third-party client, as a child process: the program, and
:class:`Member`, the handle the conformance tests and the benchmarks (bench.fuzz_daemon) start it with.

    python tools/member.py '<json config>'

Config keys: client ("kafka-python" | "aiokafka" | "confluent"), bootstrap, group, topics,
assignor (optional: "range" | "roundrobin" | "cooperative-sticky"; default: the client's own
default), session_ms, heartbeat_ms, max_poll_ms, instance_id (optional, static membership), name.

It joins, then prints JSON lines on stdout (flushed) until it is told to stop:

    {"ev": "start", ...}
    {"ev": "assigned"|"revoked"|"lost", "t": <CLOCK_MONOTONIC>, "partitions": [[topic, p], ...]}
        from the client's rebalance callbacks (for cooperative protocols: the increment)
    {"ev": "state", "t": ..., "partitions": [...], "generation": g, "member_id": "..."}
        whenever the full assignment, the generation or the member id changes
    {"ev": "closed", "t": ...}

SIGTERM closes the consumer cleanly (a dynamic member sends LeaveGroup; a static member does not,
as the clients implement KIP-345) and exits 0. SIGKILL is the crash case. The member also exits if
its stdin is closed (the test process died), so no orphan outlives a test run.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
MEMBER_SCRIPT = Path(__file__).resolve()

# Short but legal timeouts (herd's default group.min.session.timeout.ms is 6000, as Kafka's).
SESSION_MS = 6000
HEARTBEAT_MS = 500
MAX_POLL_MS = 10000  # also the rebalance timeout the clients send

STOP = threading.Event()


def emit(ev: str, **fields) -> None:
    fields = {"ev": ev, "t": time.monotonic(), **fields}
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def tps(partitions) -> list:
    return sorted([tp.topic, tp.partition] for tp in partitions)


def _watch_stdin() -> None:
    try:
        while sys.stdin.read(1):
            pass
    except (OSError, ValueError):
        pass
    os._exit(3)  # the parent is gone


class StateReporter:
    def __init__(self) -> None:
        self.last = None

    def report(self, partitions, generation, member_id, **extra) -> None:
        now = (tps(partitions), generation, member_id, tuple(sorted(extra.items())))
        if now != self.last:
            self.last = now
            emit("state", partitions=now[0], generation=generation, member_id=member_id, **extra)


def run_kafka_python(cfg: dict) -> None:
    from kafka import KafkaConsumer
    from kafka.consumer.subscription_state import ConsumerRebalanceListener
    from kafka.coordinator.assignors.cooperative_sticky import CooperativeStickyAssignor
    from kafka.coordinator.assignors.range import RangePartitionAssignor
    from kafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    kwargs = {}
    assignor = cfg.get("assignor")
    if assignor:
        kwargs["partition_assignment_strategy"] = [{
            "range": RangePartitionAssignor,
            "roundrobin": RoundRobinPartitionAssignor,
            "cooperative-sticky": CooperativeStickyAssignor,
        }[assignor]]
    if cfg.get("instance_id"):
        kwargs["group_instance_id"] = cfg["instance_id"]

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            emit("revoked", partitions=tps(revoked))

        def on_partitions_assigned(self, assigned):
            emit("assigned", partitions=tps(assigned))

        def on_partitions_lost(self, lost):
            emit("lost", partitions=tps(lost))

    consumer = KafkaConsumer(
        bootstrap_servers=cfg["bootstrap"], group_id=cfg["group"], client_id=cfg["name"],
        session_timeout_ms=cfg["session_ms"], heartbeat_interval_ms=cfg["heartbeat_ms"],
        max_poll_interval_ms=cfg["max_poll_ms"], enable_auto_commit=False,
        auto_offset_reset="earliest", fetch_max_wait_ms=100, **kwargs)
    consumer.subscribe(cfg["topics"], listener=Listener())
    emit("start", client="kafka-python", pid=os.getpid())
    reporter = StateReporter()
    try:
        while not STOP.is_set():
            # Back-to-back polls: kafka-python 3.0.12 strands a leader whose metadata-triggered
            # rejoin completes between two poll() calls (see test_offsets.py).
            consumer.poll(timeout_ms=100)
            gen = consumer._coordinator._generation  # client internals: the only place it lives
            reporter.report(consumer.assignment(), gen.generation_id, gen.member_id,
                            leader=consumer._coordinator._is_leader)
    finally:
        consumer.close()
        emit("closed")


def run_aiokafka(cfg: dict) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener
    from aiokafka.coordinator.assignors.range import RangePartitionAssignor
    from aiokafka.coordinator.assignors.roundrobin import RoundRobinPartitionAssignor

    kwargs = {}
    assignor = cfg.get("assignor")
    if assignor:  # one assignor only: see the module docstring of test_conformance.py
        kwargs["partition_assignment_strategy"] = (
            {"range": RangePartitionAssignor, "roundrobin": RoundRobinPartitionAssignor}[assignor],)
    if cfg.get("instance_id"):
        kwargs["group_instance_id"] = cfg["instance_id"]

    class Listener(ConsumerRebalanceListener):
        def on_partitions_revoked(self, revoked):
            emit("revoked", partitions=tps(revoked))

        def on_partitions_assigned(self, assigned):
            emit("assigned", partitions=tps(assigned))

    async def main():
        consumer = AIOKafkaConsumer(
            bootstrap_servers=cfg["bootstrap"], group_id=cfg["group"], client_id=cfg["name"],
            session_timeout_ms=cfg["session_ms"], heartbeat_interval_ms=cfg["heartbeat_ms"],
            max_poll_interval_ms=cfg["max_poll_ms"], rebalance_timeout_ms=cfg["max_poll_ms"],
            enable_auto_commit=False, auto_offset_reset="earliest", fetch_max_wait_ms=100, **kwargs)
        await consumer.start()
        consumer.subscribe(cfg["topics"], listener=Listener())
        emit("start", client="aiokafka", pid=os.getpid())
        reporter = StateReporter()
        try:
            while not STOP.is_set():
                await consumer.getmany(timeout_ms=100)
                coord = consumer._coordinator  # client internals: the only place it lives
                reporter.report(consumer.assignment(), coord.generation, coord.member_id)
        finally:
            await consumer.stop()
            emit("closed")

    asyncio.run(main())


def confluent_generation(consumer):
    """(generation, member_id) from librdkafka's serialized ConsumerGroupMetadata.

    Layout (rd_kafka_consumer_group_metadata_write): b"CGMDv2:", generation_id as a native
    (little-endian here) int32, then group_id and member_id as NUL-terminated strings.
    """
    raw = consumer.consumer_group_metadata()
    if not raw.startswith(b"CGMDv2:"):
        return None, None
    gen = int.from_bytes(raw[7:11], sys.byteorder, signed=True)
    parts = raw[11:].split(b"\x00")
    member_id = parts[1].decode(errors="replace") if len(parts) > 1 else None
    return gen, member_id


def run_confluent(cfg: dict) -> None:
    from confluent_kafka import Consumer

    conf = {
        "bootstrap.servers": cfg["bootstrap"], "group.id": cfg["group"], "client.id": cfg["name"],
        "session.timeout.ms": cfg["session_ms"], "heartbeat.interval.ms": cfg["heartbeat_ms"],
        "max.poll.interval.ms": cfg["max_poll_ms"], "enable.auto.commit": False,
        "auto.offset.reset": "earliest", "fetch.wait.max.ms": 100,
        "topic.metadata.refresh.interval.ms": 2000, "log_level": 3,
    }
    if cfg.get("assignor"):
        conf["partition.assignment.strategy"] = cfg["assignor"]
    if cfg.get("instance_id"):
        conf["group.instance.id"] = cfg["instance_id"]
    if os.environ.get("HERD_TEST_RDKAFKA_DEBUG"):  # e.g. "cgrp,protocol" when investigating
        conf.update({"debug": os.environ["HERD_TEST_RDKAFKA_DEBUG"], "log_level": 7})
    consumer = Consumer(conf)

    def on_assign(c, partitions):
        emit("assigned", partitions=tps(partitions))

    def on_revoke(c, partitions):
        emit("revoked", partitions=tps(partitions))

    def on_lost(c, partitions):
        emit("lost", partitions=tps(partitions))

    consumer.subscribe(cfg["topics"], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
    emit("start", client="confluent", pid=os.getpid())
    reporter = StateReporter()
    try:
        while not STOP.is_set():
            consumer.poll(0.1)
            gen, member_id = confluent_generation(consumer)
            reporter.report(consumer.assignment(), gen, member_id)
    finally:
        consumer.close()
        emit("closed")


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


def main() -> None:
    cfg = json.loads(sys.argv[1])
    signal.signal(signal.SIGTERM, lambda *_: STOP.set())
    threading.Thread(target=_watch_stdin, daemon=True).start()
    {"kafka-python": run_kafka_python, "aiokafka": run_aiokafka, "confluent": run_confluent}[
        cfg["client"]](cfg)


if __name__ == "__main__":
    main()
