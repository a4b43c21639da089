"""The operator HTTP endpoint of a real daemon: /metrics (Prometheus text format 0.0.4, checked by
a small independent parser), /healthz, /groups and /groups/<group>/history; and that the numbers
follow what the daemon does (requests, group states, rebalances by reason, commits)."""
from __future__ import annotations

import http.client
import json
import math
import re
import time
import urllib.parse

import pytest

from protocol import errors as E
from protocol import messages as m
from protocol.consumer import (
    Assignment,
    Subscription,
    TopicPartitions,
    encode_assignment,
    encode_subscription,
)
from tools.daemon import Daemon
from tools.rawclient import RawClient

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def herd(tmp_path_factory):
    data = tmp_path_factory.mktemp("metrics") / "data"
    with Daemon(data, "--metrics-port", "0", "--min-session-timeout-ms", "500", "--topic", "t:2") as d:
        d.metrics_port = _metrics_port(d)
        yield d


def _metrics_port(d: Daemon) -> int:
    return d.wait_metrics_port()


def request(d: Daemon, path: str, method: str = "GET") -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", d.metrics_port, timeout=10)
    try:
        conn.request(method, path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


# ---- a tiny Prometheus text-format parser -----------------------------------------------------------

_NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
_SAMPLE = re.compile(rf"^({_NAME})(?:\{{(.*)\}})? (\S+)$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\[\\"n])*)"')
_HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")


def _labels(text: str | None) -> dict[str, str]:
    if not text:
        return {}
    out, pos = {}, 0
    while pos < len(text):
        mt = _LABEL.match(text, pos)
        assert mt, f"bad label set {{{text}}} at {pos}"
        name, value = mt.group(1), mt.group(2)
        assert name not in out, f"label {name} twice in {{{text}}}"
        out[name] = re.sub(r"\\(.)", lambda x: "\n" if x.group(1) == "n" else x.group(1), value)
        pos = mt.end()
        if pos < len(text):
            assert text[pos] == ",", f"expected ',' in {{{text}}} at {pos}"
            pos += 1
    return out


def _value(text: str) -> float:
    if text in ("+Inf", "-Inf", "NaN"):
        return float(text.replace("Inf", "inf").replace("NaN", "nan"))
    return float(text)


def parse(text: str) -> dict[str, dict]:
    """{family: {"help", "type", "samples": [(name, labels, value)]}}; asserts the format rules."""
    assert text.endswith("\n"), "the exposition ends with a newline"
    families: dict[str, dict] = {}
    current = None
    finished: set[str] = set()
    for line in text.splitlines():
        if not line.strip():
            continue
        if line.startswith("# HELP "):
            name, _, help_text = line[len("# HELP "):].partition(" ")
            assert re.fullmatch(_NAME, name), line
            assert name not in families, f"family {name} declared twice"
            assert help_text.strip(), f"{name} has an empty HELP"
            if current:
                finished.add(current)
            families[name] = {"help": help_text, "type": None, "samples": []}
            current = name
            continue
        if line.startswith("# TYPE "):
            name, _, kind = line[len("# TYPE "):].partition(" ")
            assert name == current and families[name]["type"] is None and not families[name]["samples"], (
                f"TYPE of {name} must follow its HELP, once, before its samples")
            assert kind in ("counter", "gauge", "histogram", "summary", "untyped"), line
            families[name]["type"] = kind
            continue
        if line.startswith("#"):
            continue
        mt = _SAMPLE.match(line)
        assert mt, f"not a sample line: {line!r}"
        name, labels, value = mt.group(1), _labels(mt.group(2)), _value(mt.group(3))
        family = name
        if current and families[current]["type"] == "histogram" and name.endswith(_HISTOGRAM_SUFFIXES):
            family = name.rsplit("_", 1)[0]
        assert family in families, f"sample {name} has no HELP/TYPE"
        assert family == current and family not in finished, f"samples of {family} are not together"
        assert families[family]["type"] is not None, f"{family} has no TYPE"
        families[family]["samples"].append((name, labels, value))
    return families


def check_conventions(families: dict[str, dict]) -> None:
    for name, fam in families.items():
        assert name.startswith("herd_"), name
        kind = fam["type"]
        seen = set()
        for sample_name, labels, value in fam["samples"]:
            key = (sample_name, tuple(sorted(labels.items())))
            assert key not in seen, f"duplicate sample {key}"
            seen.add(key)
            assert not math.isnan(value), key
        if kind == "counter":
            assert name.endswith("_total"), f"counter {name} must end in _total"
            assert all(v >= 0 for _, _, v in fam["samples"]), name
        else:
            assert not name.endswith("_total"), f"only counters end in _total: {name} is a {kind}"
        if kind == "histogram":
            check_histogram(name, fam["samples"])


def check_histogram(name: str, samples) -> None:
    series: dict[tuple, dict] = {}
    for sample_name, labels, value in samples:
        le = labels.pop("le", None)
        s = series.setdefault(tuple(sorted(labels.items())), {"buckets": [], "sum": None, "count": None})
        if sample_name == name + "_bucket":
            assert le is not None, f"{name}_bucket without le"
            s["buckets"].append((_value(le), value))
        elif sample_name == name + "_sum":
            s["sum"] = value
        elif sample_name == name + "_count":
            s["count"] = value
        else:
            raise AssertionError(f"unexpected sample {sample_name} in histogram {name}")
    for key, s in series.items():
        bounds = [b for b, _ in s["buckets"]]
        counts = [c for _, c in s["buckets"]]
        assert bounds == sorted(bounds) and len(set(bounds)) == len(bounds), (name, key, bounds)
        assert bounds and bounds[-1] == math.inf, f"{name}{key}: the last bucket is le=\"+Inf\""
        assert counts == sorted(counts), f"{name}{key}: buckets are cumulative: {counts}"
        assert s["count"] is not None and s["sum"] is not None, f"{name}{key}: _sum and _count"
        assert counts[-1] == s["count"], f"{name}{key}: +Inf bucket {counts[-1]} != _count {s['count']}"
        assert s["sum"] >= 0


def scrape(d: Daemon) -> dict[str, dict]:
    status, headers, body = request(d, "/metrics")
    assert status == 200
    assert headers["content-type"].startswith("text/plain; version=0.0.4")
    families = parse(body.decode())
    check_conventions(families)
    return families


def value(families, name: str, family: str | None = None, **labels) -> float:
    fam = families[family or name]
    for sample_name, lab, v in fam["samples"]:
        if sample_name == name and lab == {k: str(x) for k, x in labels.items()}:
            return v
    return 0.0


def test_the_parser_rejects_what_prometheus_would():
    good = "# HELP x_total A.\n# TYPE x_total counter\nx_total{a=\"1\"} 2\n"
    check_conventions({"herd_" + k: v for k, v in parse(good).items()})
    bad = [
        "x_total 1\n",  # no HELP/TYPE
        "# HELP x_total A.\n# TYPE x_total counter\nx_total{a=1} 2\n",  # unquoted label value
        "# HELP x A.\n# TYPE x gauge\nx 1\n# HELP y B.\n# TYPE y gauge\ny 1\nx 2\n",  # family split
        "# HELP x A.\n# TYPE x gauge\nx 1",  # no final newline
    ]
    for text in bad:
        with pytest.raises(AssertionError):
            parse(text)
    with pytest.raises(AssertionError, match="must end in _total"):
        check_conventions(parse("# HELP herd_x A.\n# TYPE herd_x counter\nherd_x 1\n"))
    hist = ('# HELP herd_h H.\n# TYPE herd_h histogram\nherd_h_bucket{le="1"} 2\nherd_h_bucket{le="2"} 1\n'
            'herd_h_bucket{le="+Inf"} 2\nherd_h_sum 1\nherd_h_count 2\n')
    with pytest.raises(AssertionError, match="cumulative"):
        check_conventions(parse(hist))


# ---- a group member on the raw protocol ----------------------------------------------------------

def join_group(c: RawClient, group: str, session_ms: int = 10_000) -> tuple[str, int]:
    """A dynamic member joins (KIP-394: the first JoinGroup asks for a member id) and, as leader,
    assigns itself both partitions of t. Returns (member id, generation)."""
    meta = encode_subscription(Subscription(topics=["t"]))

    def join(member_id):
        return c.call(m.JoinGroupRequest(group_id=group, session_timeout_ms=session_ms,
                                         rebalance_timeout_ms=10_000, member_id=member_id,
                                         protocol_type="consumer",
                                         protocols=[m.JoinGroupRequestProtocol("range", meta)]), 5)
    first = join("")
    assert first.error_code == E.MEMBER_ID_REQUIRED
    r = join(first.member_id)
    assert r.error_code == 0 and r.leader == r.member_id
    asg = encode_assignment(Assignment(assigned_partitions=[TopicPartitions(topic="t", partitions=[0, 1])]))
    s = c.call(m.SyncGroupRequest(group_id=group, generation_id=r.generation_id, member_id=r.member_id,
                                  assignments=[m.SyncGroupRequestAssignment(r.member_id, asg)]), 3)
    assert s.error_code == 0
    return r.member_id, r.generation_id


def group_state(d: Daemon, group: str) -> str:
    with RawClient(d.address) as c:
        return c.call(m.DescribeGroupsRequest(groups=[group]), 5).groups[0].group_state


def wait_for(pred, what: str, timeout: float = 15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


# ---- /metrics --------------------------------------------------------------------------------------

def test_exposition_parses_and_follows_the_conventions(herd):
    with RawClient(herd.address) as c:
        c.call(m.ApiVersionsRequest(), 0)
        join_group(c, "expo")
    families = scrape(herd)
    kinds = {name: fam["type"] for name, fam in families.items()}
    for name, kind in {
        "herd_requests_total": "counter", "herd_request_duration_seconds": "histogram",
        "herd_rebalance_duration_seconds": "histogram", "herd_groups": "gauge", "herd_group_members": "gauge",
        "herd_rebalances_total": "counter", "herd_offset_commits_total": "counter", "herd_log_bytes": "gauge",
        "herd_log_fsyncs_total": "counter", "herd_shard_replay_seconds": "gauge",
        "herd_connections": "gauge", "herd_members_removed_total": "counter",
        "herd_gc_frozen_objects": "gauge", "herd_gc_frozen_checks_total": "counter",
        "herd_gc_full_walks_total": "counter", "herd_gc_frozen_check_timeouts_total": "counter",
    }.items():
        assert kinds.get(name) == kind, (name, kinds.get(name))
    # every state has a series, so a dashboard sees zeros instead of gaps
    assert {lab["state"] for _, lab, _ in families["herd_groups"]["samples"]} >= {
        "Empty", "Stable", "PreparingRebalance", "CompletingRebalance"}
    assert value(families, "herd_request_duration_seconds_count", "herd_request_duration_seconds",
                 api="JoinGroup") == 2


def test_request_counters_and_latency_histograms_count_requests(herd):
    before = scrape(herd)
    with RawClient(herd.address) as c:
        for _ in range(3):
            assert c.call(m.ApiVersionsRequest(), 2).error_code == 0
        for _ in range(2):
            c.call(m.MetadataRequest(topics=None), 9)
    after = scrape(herd)

    def delta(name, family=None, **labels):
        return value(after, name, family, **labels) - value(before, name, family, **labels)
    assert delta("herd_requests_total", api="ApiVersions") == 3
    assert delta("herd_requests_total", api="Metadata") == 2
    hist = "herd_request_duration_seconds"
    assert delta(hist + "_count", hist, api="ApiVersions") == 3
    assert delta(hist + "_count", hist, api="Metadata") == 2
    assert delta(hist + "_sum", hist, api="Metadata") > 0
    assert delta("herd_connections_accepted_total") == 1


def test_group_gauges_and_rebalance_counters_follow_a_group(herd):
    g = "followed"

    def state_count(fams, state):
        return value(fams, "herd_groups", state=state)
    before = scrape(herd)
    c = RawClient(herd.address)
    try:
        mid, gen = join_group(c, g)
        stable = scrape(herd)
        assert group_state(herd, g) == "Stable"
        assert state_count(stable, "Stable") == state_count(before, "Stable") + 1
        assert value(stable, "herd_group_members") == value(before, "herd_group_members") + 1
        assert (value(stable, "herd_rebalances_total", reason="initial")
                == value(before, "herd_rebalances_total", reason="initial") + 1)

        commit = m.OffsetCommitRequest(group_id=g, generation_id_or_member_epoch=gen, member_id=mid, topics=[
            m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(0, 10),
                                             m.OffsetCommitRequestPartition(1, 20)])])
        assert all(p.error_code == 0 for t in c.call(commit, 7).topics for p in t.partitions)
        committed = scrape(herd)
        assert value(committed, "herd_offset_commits_total") == value(stable, "herd_offset_commits_total") + 2
        assert value(committed, "herd_committed_offsets") == value(stable, "herd_committed_offsets") + 2
        assert (value(committed, "herd_log_fsync_duration_seconds_count", "herd_log_fsync_duration_seconds")
                > value(stable, "herd_log_fsync_duration_seconds_count", "herd_log_fsync_duration_seconds"))

        # answers with an error are counted by API and error name
        stale = m.OffsetCommitRequest(group_id=g, generation_id_or_member_epoch=gen + 5, member_id=mid, topics=[
            m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(0, 11)])])
        assert c.call(stale, 7).topics[0].partitions[0].error_code == E.ILLEGAL_GENERATION
        hb = c.call(m.HeartbeatRequest(group_id=g, generation_id=gen, member_id="nobody"), 4)
        assert hb.error_code == E.UNKNOWN_MEMBER_ID
        errs = scrape(herd)
        for api, err in (("OffsetCommit", "ILLEGAL_GENERATION"), ("Heartbeat", "UNKNOWN_MEMBER_ID")):
            assert (value(errs, "herd_request_errors_total", api=api, error=err)
                    == value(committed, "herd_request_errors_total", api=api, error=err) + 1)

        leave = c.call(m.LeaveGroupRequest(group_id=g, members=[m.LeaveGroupRequestMemberIdentity(mid)]), 3)
        assert leave.error_code == 0
    finally:
        c.close()
    empty = scrape(herd)
    assert group_state(herd, g) == "Empty"
    assert state_count(empty, "Stable") == state_count(before, "Stable")
    assert state_count(empty, "Empty") == state_count(before, "Empty") + 1
    assert value(empty, "herd_group_members") == value(before, "herd_group_members")
    assert (value(empty, "herd_rebalances_total", reason="member_left")
            == value(before, "herd_rebalances_total", reason="member_left") + 1)
    assert (value(empty, "herd_members_removed_total", why="left")
            == value(before, "herd_members_removed_total", why="left") + 1)
    assert (value(empty, "herd_rebalance_outcomes_total", outcome="empty")
            == value(before, "herd_rebalance_outcomes_total", outcome="empty") + 1)

    with RawClient(herd.address) as c:
        assert c.call(m.DeleteGroupsRequest(groups_names=[g]), 2).results[0].error_code == 0
    deleted = scrape(herd)
    assert state_count(deleted, "Empty") == state_count(before, "Empty")
    assert (value(deleted, "herd_groups_deleted_total", why="deleted")
            == value(before, "herd_groups_deleted_total", why="deleted") + 1)
    # and the operator's action is in the log
    deletions = [json.loads(x) for x in herd.logs().splitlines() if '"group_deleted"' in x]
    assert deletions and deletions[-1]["group_id"] == g and deletions[-1]["offsets"] == 2


def test_an_expired_session_is_counted_by_reason(herd):
    before = scrape(herd)
    with RawClient(herd.address) as c:
        join_group(c, "expiring", session_ms=500)
        # no heartbeats: the session expires, the only member is removed, the group is Empty
        wait_for(lambda: group_state(herd, "expiring") == "Empty", "the session to expire")
    after = scrape(herd)
    assert (value(after, "herd_rebalances_total", reason="session_expired")
            == value(before, "herd_rebalances_total", reason="session_expired") + 1)
    assert (value(after, "herd_members_removed_total", why="session_expired")
            == value(before, "herd_members_removed_total", why="session_expired") + 1)


def test_rebalance_duration_histogram_observes_completed_rebalances(herd):
    before = scrape(herd)
    with RawClient(herd.address) as c:
        join_group(c, "timed")
    after = scrape(herd)
    name, fam = "herd_rebalance_duration_seconds_count", "herd_rebalance_duration_seconds"
    assert value(after, name, fam) == value(before, name, fam) + 1


# ---- the other endpoints ---------------------------------------------------------------------------

def test_groups_and_history_json(herd):
    g = "json view/ä"  # needs percent-encoding in the path
    with RawClient(herd.address) as c:
        mid, gen = join_group(c, g)
        status, headers, body = request(herd, "/groups")
        assert status == 200 and headers["content-type"] == "application/json"
        (row,) = [x for x in json.loads(body) if x["group_id"] == g]
        assert row["state"] == "Stable" and row["members"] == 1 and row["generation"] == gen
        assert row["protocol_type"] == "consumer" and row["protocol"] == "range" and row["leader"] == mid

        status, headers, body = request(herd, f"/groups/{urllib.parse.quote(g, safe='')}/history")
        assert status == 200 and headers["content-type"] == "application/json"
        (entry,) = json.loads(body)
        assert entry["reason"] == "initial" and entry["outcome"] == "stable" and entry["generation"] == gen
        assert entry["trigger"]["member_id"] == mid and entry["trigger"]["client_id"] == "herd-test"
        assert entry["members"] == 1 and entry["protocol"] == "range"
        assert set(entry["phases"]) == {"preparing_ms", "completing_ms"}

    status, headers, body = request(herd, "/groups/no-such-group/history")
    assert status == 404 and headers["content-type"] == "application/json"
    assert "no-such-group" in json.loads(body)["error"]


def test_http_methods_and_paths(herd):
    status, _, body = request(herd, "/healthz")
    assert (status, body) == (200, b"ok\n")
    status, headers, body = request(herd, "/healthz", "HEAD")
    assert status == 200 and body == b"" and headers["content-length"] == "3"
    for method in ("POST", "PUT", "DELETE"):
        status, _, _ = request(herd, "/metrics", method)
        assert status == 405, method
    status, _, _ = request(herd, "/groups", "POST")
    assert status == 405
    status, _, _ = request(herd, "/nope")
    assert status == 404
    assert herd.proc.poll() is None


def test_a_sigstop_of_herd_is_counted_and_the_heartbeat_that_waited_keeps_the_member(herd):
    """herd stopped for 1.5 s (stall_threshold_ms 1000) under a member with a 1 s session whose
    heartbeat waits in the socket meanwhile: the member is kept, the stall is counted once."""
    import os
    import signal

    before = scrape(herd)
    with RawClient(herd.address) as c:
        mid, gen = join_group(c, "paused", session_ms=1_000)
        os.kill(herd.proc.pid, signal.SIGSTOP)
        try:
            time.sleep(0.3)
            corr = c.send(m.HeartbeatRequest(group_id="paused", generation_id=gen, member_id=mid), 3)
            time.sleep(1.2)
        finally:
            os.kill(herd.proc.pid, signal.SIGCONT)
        assert c.receive(12, 3, corr).error_code == E.NONE  # read before the overdue session ran
        time.sleep(0.5)  # the session, from the heartbeat, would have ended during the pause
        hb = c.call(m.HeartbeatRequest(group_id="paused", generation_id=gen, member_id=mid), 3)
        assert hb.error_code == E.NONE and group_state(herd, "paused") == "Stable"
    after = scrape(herd)
    assert value(after, "herd_stalls_total") == value(before, "herd_stalls_total") + 1
    name, fam = "herd_stall_seconds_count", "herd_stall_seconds"
    assert value(after, name, fam) == value(before, name, fam) + 1
    assert (value(after, "herd_stall_seconds_sum", fam) - value(before, "herd_stall_seconds_sum", fam)) >= 1.5
    assert value(after, "herd_stall_seconds_bucket", fam, le="1") == value(before, "herd_stall_seconds_bucket", fam,
                                                                            le="1")
