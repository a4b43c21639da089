"""Lag from a real data cluster: librdkafka's mock cluster and a real Apache Kafka broker hold the
records (produced with confluent-kafka), herd (a real daemon) holds the offsets, committed by a
member-less writer and by a real group that then empties. /metrics shows the exact offset lags of
both, the time lag present and growing while nothing is committed; the data cluster stopped: group
requests are still answered (heartbeats timed meanwhile), the source is down, the stale lag left out;
and it all comes back with the data cluster."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from protocol import messages as m
from tests.integration.test_metrics import parse
from tests.support.shared import require_shared
from tools import console_scenario as sc
from tools.daemon import REPO, Daemon
from tools.rawclient import RawClient

pytestmark = pytest.mark.integration

TOPIC = "orders"
INTERVAL_MS = 300  # refresh; stale after 2 * 300 + 1000 ms


class MockData:
    """librdkafka's mock cluster in its own process; stopped = SIGSTOP (a hung cluster)."""

    name = "mock"

    def __init__(self):
        pytest.importorskip("confluent_kafka")
        mock = require_shared("tools", "mock_cluster.py")  # ../shared: a fresh clone skips
        self.proc = subprocess.Popen([sys.executable, str(mock), "--topic", f"{TOPIC}:2", "--max-seconds", "600"],
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.bootstrap = self.proc.stdout.readline().strip()
        assert self.bootstrap.startswith("127.0.0.1:"), self.bootstrap

    def stop(self):
        os.kill(self.proc.pid, signal.SIGSTOP)

    def start(self):
        os.kill(self.proc.pid, signal.SIGCONT)

    def close(self):
        self.start()
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


class KafkaData:
    """A real Kafka broker (its own, not the reference tests' shared one: it is stopped and
    restarted here); stopped = a clean shutdown, then a restart on the same port and data."""

    name = "kafka"

    def __init__(self, work_dir):
        from confluent_kafka.admin import AdminClient, NewTopic

        from tools.kafka_broker import KafkaBroker

        self.broker = KafkaBroker(work_dir).start()
        self.bootstrap = self.broker.bootstrap
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(TOPIC, 2, 1)])[TOPIC].result(30)

    def stop(self):
        self.broker.stop()

    def start(self):
        self.broker.restart()

    def close(self):
        self.broker.stop()
        self.broker.kill()


@pytest.fixture(params=["mock", pytest.param("kafka", marks=[pytest.mark.reference, pytest.mark.slow])])
def data_cluster(request, tmp_path):
    data = MockData() if request.param == "mock" else KafkaData(tmp_path / "kafka")
    try:
        yield data
    finally:
        data.close()


def produce(bootstrap: str, per_partition: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "api.version.request.timeout.ms": 5000})
    for part in (0, 1):
        for i in range(per_partition):
            p.produce(TOPIC, value=f"r{i}".encode(), partition=part)
    assert p.flush(30) == 0


def lags(port: int) -> tuple[dict, dict, dict]:
    """(offset lags, time lags, every family) from /metrics, keyed (group, partition)."""
    fam = parse(sc.get(port, "/metrics")[2].decode())
    by = {}
    for name in ("herd_group_lag", "herd_group_lag_seconds"):
        by[name] = {(s[1]["group"], int(s[1]["partition"])): s[2] for s in fam.get(name, {}).get("samples", [])
                    if s[1]["topic"] == TOPIC}
    return by["herd_group_lag"], by["herd_group_lag_seconds"], fam


def until(what: str, pred, timeout: float = 30.0, every: float = 0.1):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def groups_cli(*args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
    r = subprocess.run([sys.executable, "-m", "herd_cli", "groups", *args], capture_output=True, text=True,
                       timeout=60, cwd=str(REPO), env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout


def log_ends(port: int, group: str) -> dict:
    detail = json.loads(sc.get(port, f"/api/group?id={group}")[2])
    return {p["partition"]: p["log_end"] for p in detail["partitions"] if p["topic"] == TOPIC}


class Heartbeats:
    """One member of group "live" over a raw connection; ``beat()`` times one Heartbeat."""

    def __init__(self, address):
        self.c = RawClient(address)
        # the session outlives the data cluster's restart (a JVM start on a loaded machine can take
        # longer than 30 s, and no heartbeat is sent meanwhile): these beats time herd, not a session
        j = self.c.call(m.JoinGroupRequest(group_id="live", session_timeout_ms=300_000, rebalance_timeout_ms=30000,
                                           member_id="", protocol_type="consumer",
                                           protocols=[m.JoinGroupRequestProtocol(name="range", metadata=b"")]), 1)
        assert j.error_code == 0, j
        self.member, self.generation = j.member_id, j.generation_id
        s = self.c.call(m.SyncGroupRequest(group_id="live", generation_id=j.generation_id, member_id=j.member_id,
                                           assignments=[m.SyncGroupRequestAssignment(member_id=j.member_id,
                                                                                     assignment=b"")]), 1)
        assert s.error_code == 0, s
        self.rtts: list[float] = []

    def beat(self) -> None:
        t0 = time.perf_counter()
        r = self.c.call(m.HeartbeatRequest(group_id="live", generation_id=self.generation, member_id=self.member), 1)
        self.rtts.append(time.perf_counter() - t0)
        assert r.error_code == 0, r

    def close(self):
        self.c.close()


def test_exact_lag_time_lag_stale_and_back(data_cluster, tmp_path):
    produce(data_cluster.bootstrap, 10)
    with Daemon(tmp_path / "herd", "--metrics-port", "0", "--topic", f"{TOPIC}:2",
                "--data-bootstrap-server", data_cluster.bootstrap,
                "--lag-refresh-interval-ms", str(INTERVAL_MS)) as d:
        port = sc.metrics_port(d)
        # a member-less writer, and a real group that commits and leaves (Empty)
        sc.commit_standalone(d.bootstrap, "audit", {(TOPIC, 0): 4, (TOPIC, 1): 10})
        reports = sc.member(d.bootstrap, "reports", "reports-1", topics=(TOPIC,))
        sc.poll_until([reports], lambda: sc.stable([reports], 2))
        from client import TopicPartition
        reports.commit({TopicPartition(TOPIC, 0): 7, TopicPartition(TOPIC, 1): 2})
        reports.close()
        until("the first log ends", lambda: log_ends(port, "audit") == {0: 10, 1: 10})
        produce(data_cluster.bootstrap, 10)
        until("the log ends after more records", lambda: log_ends(port, "audit") == {0: 20, 1: 20})

        offset_lag, time_lag, fam = lags(port)
        assert offset_lag == {("audit", 0): 16, ("audit", 1): 10, ("reports", 0): 13, ("reports", 1): 18}
        assert set(time_lag) == set(offset_lag) and all(v > 0 for v in time_lag.values())
        assert [s[2] for s in fam["herd_lag_source_up"]["samples"]] == [1]
        groups = json.loads(sc.get(port, "/api/groups")[2])["groups"]
        assert {g["group_id"]: g["state"] for g in groups}["reports"] == "Empty"
        time.sleep(1.2)  # nothing committed meanwhile: the time lag grows with the clock
        later_offsets, later, _ = lags(port)
        assert later_offsets == offset_lag
        assert all(later[k] >= time_lag[k] + 1.0 for k in time_lag), (time_lag, later)

        # herd groups describe: the data cluster's own log ends (the mock's malformed ApiVersions and
        # Metadata answers included), herd's commit ages and time lag through its HTTP port
        out = json.loads(groups_cli("describe", "audit", "--bootstrap-server", d.bootstrap, "--data-bootstrap-server",
                                    data_cluster.bootstrap, "--http", f"127.0.0.1:{port}", "--output", "json"))
        rows = {r["partition"]: r for r in out["groups"][0]["partitions"]}
        assert {p: (r["log_end_offset"], r["lag"]) for p, r in rows.items()} == {0: (20, 16), 1: (20, 10)}
        assert all(r["lag_seconds"] > 0 and r["commit_age_seconds"] >= 1.0 for r in rows.values()), rows
        # without herd's view: the data cluster's own answer, the age of the record at the committed offset
        # (produced a few seconds ago here), no commit age (Kafka's protocol carries no commit time)
        out = json.loads(groups_cli("describe", "audit", "--bootstrap-server", d.bootstrap, "--data-bootstrap-server",
                                    data_cluster.bootstrap, "--output", "json"))
        rows = {r["partition"]: r for r in out["groups"][0]["partitions"]}
        assert {p: r["lag"] for p, r in rows.items()} == {0: 16, 1: 10}
        assert all(0 < r["lag_seconds"] < 300 and r["commit_age_seconds"] is None for r in rows.values()), rows
        table = groups_cli("describe", "reports", "--bootstrap-server", d.bootstrap, "--http", f"127.0.0.1:{port}")
        head, *lines = table.splitlines()
        assert head.split()[3:9] == ["CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "LAG-SECONDS", "COMMIT-AGE",
                                     "CONSUMER-ID"]
        cells = [line.split() for line in lines if line.startswith("reports")]
        assert [c[3:6] for c in cells] == [["7", "20", "13"], ["2", "20", "18"]]  # herd's own log ends
        assert all(float(c[6]) > 0 and float(c[7]) >= 1.0 for c in cells), table

        beats = Heartbeats(d.address)
        try:
            beats.beat()
            data_cluster.stop()

            def stale():
                beats.beat()  # group requests go on being answered meanwhile
                offsets, seconds, fam = lags(port)
                up = [s[2] for s in fam["herd_lag_source_up"]["samples"]]
                stale_n = {s[1]["state"]: s[2] for s in fam["herd_lag_partitions"]["samples"]}["stale"]
                last[:] = [up, offsets, seconds, stale_n]
                return up == [0] and not offsets and not seconds and stale_n == 2

            last: list = []
            try:
                until("the lag to go stale", stale, timeout=30)
            except AssertionError:
                status = json.loads(sc.get(port, "/api/groups")[2])["lag"]
                raise AssertionError(f"not stale: {last}; {status}") from None
            detail = json.loads(sc.get(port, "/api/group?id=audit")[2])
            assert detail["lag"]["up"] is False and all(p["stale"] for p in detail["partitions"])
            assert max(beats.rtts) < 5.0, beats.rtts
            data_cluster.start()
            produce(data_cluster.bootstrap, 5)

            def back():
                beats.beat()
                offsets, _, fam = lags(port)
                return [s[2] for s in fam["herd_lag_source_up"]["samples"]] == [1] and offsets == {
                    ("audit", 0): 21, ("audit", 1): 15, ("reports", 0): 18, ("reports", 1): 23}

            until("the lag to come back", back, timeout=60)
        finally:
            beats.close()
        print(f"{data_cluster.name}: {len(beats.rtts)} heartbeats while the data cluster was stopped and back, "
              f"max round trip {max(beats.rtts) * 1000:.1f} ms")
