"""Lag in seconds for a backlog older than herd's log-end history, against a real Kafka broker
(issue 33 item 8): four partitions with 100 records produced once (CreateTime one second apart,
ending well before herd starts), offsets committed at 90/80/70/60 with herd started after. herd's
log-end history is flat (nothing is produced while it runs), so interpolation cannot place the
committed offsets; the time lag comes from the timestamp of the record at each committed offset,
read with one Fetch. /metrics shows the exact offset lag and a time lag matching the records' own
times; the console's JSON says which method gave it."""
from __future__ import annotations

import json
import time
import uuid

import pytest

from tests.integration.test_metrics import parse
from tools import console_scenario as sc
from tools.daemon import Daemon

pytestmark = [pytest.mark.reference, pytest.mark.integration]

REFRESH_MS = 500
COMMITTED = {0: 90, 1: 80, 2: 70, 3: 60}


def test_lag_seconds_for_a_backlog_older_than_herds_history(kafka_broker, tmp_path):
    pytest.importorskip("confluent_kafka")
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    topic, group = f"backlog-{uuid.uuid4().hex[:8]}", f"stuck-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": kafka_broker.bootstrap})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(30)
    base = int(time.time() * 1000) - 600_000  # record i of every partition written at base + i s
    p = Producer({"bootstrap.servers": kafka_broker.bootstrap, "linger.ms": 5})
    for part in range(4):
        for i in range(100):
            p.produce(topic, value=b"r%d" % i, partition=part, timestamp=base + 1000 * i)
    assert p.flush(120) == 0  # a fresh topic's leader can take a while on a loaded machine

    with Daemon(tmp_path / "herd", "--metrics-port", "0", "--data-bootstrap-server", kafka_broker.bootstrap,
                "--lag-refresh-interval-ms", REFRESH_MS, initial_rebalance_delay_ms=0) as d:
        port = sc.metrics_port(d)
        sc.commit_standalone(d.bootstrap, group, {(topic, q): off for q, off in COMMITTED.items()})

        def read():
            fam = parse(sc.get(port, "/metrics")[2].decode())
            out = {}
            for name in ("herd_group_lag", "herd_group_lag_seconds"):
                out[name] = {int(s[1]["partition"]): s[2] for s in fam.get(name, {}).get("samples", [])
                             if s[1]["group"] == group}
            return out

        deadline = time.monotonic() + 60  # a few refreshes (every 0.5 s), a loaded machine's margin
        got = read()
        while time.monotonic() < deadline and len(got["herd_group_lag_seconds"]) < 4:
            time.sleep(0.2)
            got = read()
        now = time.time() * 1000
        assert got["herd_group_lag"] == {q: 100 - off for q, off in COMMITTED.items()}
        seconds = got["herd_group_lag_seconds"]
        status = json.loads(sc.get(port, "/api/groups")[2])["lag"]
        assert set(seconds) == set(COMMITTED), (got, status)
        for q, off in COMMITTED.items():
            expected = (now - (base + 1000 * off)) / 1000  # the committed record's own age
            assert expected - 35 <= seconds[q] <= expected + 1, (q, seconds[q], expected)
        # the records' times, not the history's: one second per offset between the partitions
        assert abs((seconds[3] - seconds[0]) - 30) < 1.0, seconds
        detail = json.loads(sc.get(port, f"/api/group?id={group}")[2])
        rows = {r["partition"]: r for r in detail["partitions"]}
        assert {q: (r["lag"], r["lag_seconds_method"]) for q, r in rows.items()} == {
            q: (100 - off, "record") for q, off in COMMITTED.items()}
        listed = json.loads(sc.get(port, f"/api/groups?q={group}")[2])["groups"]
        assert [(g["group_id"], g["lag_seconds_method"]) for g in listed] == [(group, "record")]
        assert listed[0]["lag_seconds"] >= seconds[3] - 1
