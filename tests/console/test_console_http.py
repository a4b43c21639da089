"""The console's HTTP side on a real daemon: commit ages on /metrics for every group with commits
(a member-less writer and a group that emptied included), no lag without a data cluster, the JSON
endpoints (server-side paging, sorting, filtering; group ids as data), the page's security headers,
and nothing that changes state."""
from __future__ import annotations

import http.client
import json
import time
import urllib.parse

import pytest

from tests.integration.test_metrics import parse
from tools import console_scenario as sc
from tools.daemon import Daemon

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    data = tmp_path_factory.mktemp("console-http") / "data"
    with Daemon(data, "--metrics-port", "0", "--topic", "orders:4", "--topic", "payments:1",
                "--min-session-timeout-ms", "500") as d:
        port = sc.metrics_port(d)
        members = sc.build(d.bootstrap)
        try:
            yield d, port
        finally:
            for c in members.values():
                c.close(timeout_s=5)


def metrics(port: int) -> dict:
    status, _, body = sc.get(port, "/metrics")
    assert status == 200
    return parse(body.decode())


def api(port: int, path: str):
    status, headers, body = sc.get(port, path)
    assert headers["content-type"] == "application/json"
    return status, json.loads(body)


def test_commit_ages_for_every_group_with_commits_and_no_invented_lag(world):
    d, port = world
    fam = metrics(port)
    ages = {s[1]["group"]: s[2] for s in fam["herd_group_last_commit_age_seconds"]["samples"]}
    assert set(ages) == {"audit", "reports", "billing", sc.HOSTILE}  # Empty and member-less included
    assert all(0 <= a < 60 for a in ages.values())
    assert fam["herd_group_last_commit_age_seconds"]["type"] == "gauge"
    assert not any(name.startswith(("herd_group_lag", "herd_group_max_lag", "herd_lag_")) for name in fam)
    # the age moves with the daemon's clock: scrape until the table behind it (at most 1 s old) moves
    first = time.monotonic()
    deadline = first + 10  # a bound for a hang, not a pace
    while True:
        later = {s[1]["group"]: s[2] for s in metrics(port)["herd_group_last_commit_age_seconds"]["samples"]}
        if later["audit"] > ages["audit"] or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    grown = later["audit"] - ages["audit"]
    assert 0 < grown <= time.monotonic() - first + 1.0 + 0.01  # no faster than the clock, table <= 1 s old


def test_group_list_is_paged_sorted_and_filtered_by_the_server(world):
    d, port = world
    status, page = api(port, "/api/groups?limit=2&sort=partitions&order=desc")
    assert status == 200 and page["total"] == 4 and page["matched"] == 4
    assert [g["group_id"] for g in page["groups"]] == ["billing", "reports"]
    status, page = api(port, "/api/groups?limit=2&offset=2&sort=partitions&order=desc")
    assert [g["group_id"] for g in page["groups"]] == ["audit", sc.HOSTILE]
    status, page = api(port, "/api/groups?state=empty&q=" + urllib.parse.quote("<IMG"))
    assert [g["group_id"] for g in page["groups"]] == [sc.HOSTILE]
    assert page["lag"] == {"configured": False, "up": False, "reader": False, "data_bootstrap_server": None}
    billing = next(g for g in api(port, "/api/groups")[1]["groups"] if g["group_id"] == "billing")
    assert (billing["state"], billing["type"], billing["protocol_type"], billing["members"], billing["partitions"]) == \
        ("Stable", "classic", "consumer", 2, 4)  # a classic group: TYPE is the group type (issue 33 item 5)
    assert billing["lag"] is None and billing["lag_seconds"] is None and billing["rebalances_1h"] >= 1
    # the daemon started moments ago: its in-memory flight recorder counts since the start, and says so
    assert page["rebalances"]["since_start"] is True and page["rebalances"]["label"] == "since start"


def test_group_detail_and_ids_as_data(world):
    d, port = world
    status, g = api(port, "/api/group?id=" + urllib.parse.quote(sc.HOSTILE, safe=""))
    assert status == 200 and g["group_id"] == sc.HOSTILE and g["partitions"][0]["committed"] == 1
    status, g = api(port, "/api/group?id=billing")
    assert sorted(m["client_id"] for m in g["members"]) == ["billing-1", "billing-2"]
    owned = sorted(p for m in g["members"] for _, ps in m["assignment"] for p in ps)
    assert owned == [0, 1, 2, 3]
    assert {p["owner"] for p in g["partitions"]} == {m["member_id"] for m in g["members"]}
    assert api(port, "/api/group?id=no-such-group")[0] == 404


def test_the_page_is_served_by_herd_with_a_strict_policy_and_is_read_only(world):
    d, port = world
    status, headers, body = sc.get(port, "/")
    assert status == 200 and headers["content-type"].startswith("text/html")
    csp = headers["content-security-policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "frame-ancestors 'none'" in csp
    assert headers["x-content-type-options"] == "nosniff"
    for asset in ("console/app.js", "console/app.css", "console/favicon.svg"):
        assert asset.encode() in body
        assert sc.get(port, "/" + asset)[0] == 200
    assert b"http://" not in body and b"https://" not in body  # nothing from another host

    for method in ("POST", "PUT", "DELETE"):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        conn.request(method, "/api/group?id=billing")
        assert conn.getresponse().status == 405
        conn.close()
    assert api(port, "/api/group?id=billing")[1]["state"] == "Stable"


def test_an_unreachable_data_cluster_is_down_and_invents_no_lag(tmp_path):
    with Daemon(tmp_path / "data", "--metrics-port", "0", "--data-bootstrap-server", "127.0.0.1:1",
                "--lag-refresh-interval-ms", "200") as d:
        port = sc.metrics_port(d)
        sc.commit_standalone(d.bootstrap, "audit", {("orders", 0): 5})
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            status, page = api(port, "/api/groups")
            if page["lag"].get("refreshes", 0) >= 2:
                break
            time.sleep(0.05)
        lag = page["lag"]
        assert lag["configured"] and lag["reader"] and lag["up"] is False
        assert "no data cluster broker answered Metadata" in lag["last_error"]
        fam = metrics(port)
        assert [s[2] for s in fam["herd_lag_source_up"]["samples"]] == [0]
        assert fam["herd_group_lag"]["samples"] == [] and fam["herd_group_lag_seconds"]["samples"] == []
        assert fam["herd_group_max_lag"]["samples"] == []
        assert "data cluster broker unreachable" in d.logs()


def test_a_data_command_config_that_cannot_be_used_stops_herd_with_one_line(tmp_path):
    import subprocess
    import sys

    bad = tmp_path / "data.properties"
    bad.write_text("security.protocol=SSL\nssl.keystore.type=PKCS12\n")
    r = subprocess.run([sys.executable, "-m", "coordinator", "serve", "--data-dir", str(tmp_path / "d"), "--port", "0",
                        "--data-bootstrap-server", "127.0.0.1:9092", "--data-command-config", str(bad)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode != 0
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "data_command_config" in err[0] and "ssl.keystore.type=PKCS12 is not supported" in err[0]
