"""A cluster node's /healthz, /readyz and herd_cluster_* metrics, through the real process."""
from __future__ import annotations

import http.client
import json
import re

import pytest

from tests.cluster.nodes import Node
from tests.conformance.harness import wait_until

pytestmark = pytest.mark.integration


def metrics_port(node) -> int:
    def port():
        for line in node.logs().splitlines():
            if '"metrics listening"' in line:
                return json.loads(line)["port"]
        return None
    return wait_until(port, 10, "the metrics port in the log")


def get(port: int, path: str) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode()
    finally:
        conn.close()


def value(text: str, name: str) -> float:
    m = re.search(rf"^{re.escape(name)} (\S+)$", text, re.M)
    assert m, f"{name} not in the metrics"
    return float(m.group(1))


def test_health_readiness_and_metrics_per_node(tmp_path, pg):
    a = Node(tmp_path, 1, pg.url, "--metrics-port", "0", lease_ms=1500).start()
    b = Node(tmp_path, 2, pg.url, "--metrics-port", "0", lease_ms=1500).start()
    try:
        pa, pb = metrics_port(a), metrics_port(b)
        for port in (pa, pb):
            assert get(port, "/healthz") == (200, "ok\n")
            assert get(port, "/readyz") == (200, "ready\n")

        def shared():
            return all(value(get(p, "/metrics")[1], "herd_cluster_shards_owned") == 6 for p in (pa, pb))
        wait_until(shared, 20, "6 shards owned by each node")
        text = get(pa, "/metrics")[1]
        assert value(text, "herd_cluster_nodes") == 2
        assert value(text, 'herd_cluster_shards{state="active"}') == 6
        assert value(text, "herd_cluster_lease_acquisitions_total") >= 6
        assert value(text, "herd_cluster_shard_load_duration_seconds_count") >= 6
        wait_until(lambda: value(get(pa, "/metrics")[1], "herd_cluster_lease_renewals_total") >= 6, 10,
                   "a renewal")
        text = get(pa, "/metrics")[1]
        assert value(text, "herd_cluster_db_roundtrip_seconds_count") >= 1
        assert value(text, "herd_cluster_db_roundtrip_seconds_sum") > 0
        assert "herd_cluster_lease_losses_total 0" in text
        # the daemon's own watches run on a cluster node as on a single node (they used to be
        # started by the single node only)
        for name in ("herd_gc_collections_total", "herd_event_loop_lag_max_seconds", "herd_stalls_total"):
            assert f"\n{name}" in text, name
        # the database goes away: still alive, no longer ready (and says why); the leases are lost
        pg.server.stop()
        try:
            wait_until(lambda: get(pa, "/readyz")[0] == 503, 10, "/readyz to say not ready")
            status, body = get(pa, "/readyz")
            assert "database has not answered" in body
            assert get(pa, "/healthz") == (200, "ok\n")
            wait_until(lambda: value(get(pa, "/metrics")[1], "herd_cluster_lease_losses_total") >= 6, 10,
                       "the leases to be given up")
            assert value(get(pa, "/metrics")[1], "herd_cluster_lease_failed_ticks_total") >= 1
        finally:
            pg.server.start()
        wait_until(lambda: get(pa, "/readyz") == (200, "ready\n"), 20, "ready again")
        wait_until(shared, 20, "the shards shared again")
    finally:
        a.stop()
        b.stop()
