"""Crash durability against the real daemon process.

* SIGKILL at random moments under a commit load (``bench/chaos.py``, 3 cycles here, 20 in the bench):
  after every restart each acknowledged commit is visible, and nothing that was not sent is.
* A full disk (simulated with RLIMIT_FSIZE: writes past the limit fail with EFBIG): the shard stops
  acknowledging, answers the retriable COORDINATOR_NOT_AVAILABLE (it does not pretend), and a
  restart replays every commit acknowledged before the failure.
"""
from __future__ import annotations

import http.client
import json
import os
import resource
import signal
import subprocess
import sys
import time

import pytest

from bench import chaos
from protocol import errors as E
from protocol import messages as m
from tools.daemon import REPO, Daemon
from tools.rawclient import RawClient

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("fsync", ["always", "interval"])
def test_sigkill_at_random_moments_loses_no_acknowledged_commit(tmp_path, fsync):
    # interval: a commit is acknowledged once written to the OS, before any fsync; a SIGKILL of
    # herd leaves the page cache to the kernel, so nothing acknowledged may be lost either
    res = chaos.run(3, groups=24, writers=3, partitions=3, kill_after=(0.25, 0.7),
                    data_dir=tmp_path / "data", seed=int.from_bytes(os.urandom(4), "big"), fsync=fsync)
    detail = json.dumps({k: res[k] for k in ("seed", "lost_examples", "invented_examples", "commit_errors")})
    assert res["cycles"] == 3 and res["fsync"] == fsync
    assert res["commits_acknowledged"] > 0 and res["requests_acknowledged"] > 0
    assert res["commits_lost"] == 0, detail
    assert res["values_invented"] == 0, detail
    assert res["sigterm_exit_code"] == 0
    assert not res["commit_errors"], detail


# ---- disk full ---------------------------------------------------------------------------------

FSIZE_LIMIT = 48 * 1024


def _limit_file_size():  # preexec_fn of the daemon: every file it writes stops at FSIZE_LIMIT
    resource.setrlimit(resource.RLIMIT_FSIZE, (FSIZE_LIMIT, FSIZE_LIMIT))


def _start_limited(data_dir, port_file, log_path):
    env = dict(os.environ)
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    cmd = [sys.executable, "-m", "coordinator", "serve", "--host", "127.0.0.1", "--port", "0",
           "--data-dir", str(data_dir), "--port-file", str(port_file), "--initial-rebalance-delay-ms", "0",
           "--offsets-partitions", "1", "--log-format", "json", "--metrics-port", "0"]
    log = open(log_path, "ab")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=str(REPO), env=env,
                            preexec_fn=_limit_file_size, start_new_session=True)
    log.close()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"herd exited with {proc.returncode}: {log_path.read_text()}")
        if port_file.exists() and port_file.read_text().strip():
            return proc, int(port_file.read_text())
        time.sleep(0.02)
    raise RuntimeError("herd did not start")


def _healthz(log_path) -> tuple[int, bytes]:
    events = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    (port,) = [e["port"] for e in events if e["event"] == "metrics listening"]
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/healthz")
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def _commit(c, group, offset, meta):
    r = c.call(m.OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=-1, member_id="",
        topics=[m.OffsetCommitRequestTopic(name="t", partitions=[
            m.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset,
                                           committed_metadata=meta)])]),
        8)
    return r.topics[0].partitions[0].error_code


def _fetch(c, group):
    r = c.call(m.OffsetFetchRequest(groups=[m.OffsetFetchRequestGroup(group_id=group, topics=None)]), 8)
    g = r.groups[0]
    return g.error_code, {(t.name, p.partition_index): p.committed_offset
                          for t in g.topics for p in t.partitions}


def test_disk_full_answers_a_retriable_error_and_restart_replays_what_was_acknowledged(tmp_path):
    data = tmp_path / "data"
    port_file = tmp_path / "port"
    log_path = tmp_path / "herd.log"
    proc, port = _start_limited(data, port_file, log_path)
    acked: dict[str, int] = {}
    codes = []
    try:
        with RawClient(("127.0.0.1", port)) as c:
            for i in range(60):  # 3 KiB of metadata per commit: the 48 KiB limit is hit after ~15
                group = f"g{i % 3}"
                code = _commit(c, group, i, "m" * 3000)
                codes.append(code)
                if code == 0:
                    acked[group] = i
            # the failed shard keeps refusing, reads included: it does not serve state it could not persist
            assert _fetch(c, "g0")[0] == E.COORDINATOR_NOT_AVAILABLE
        # and the health check says so (a supervisor can restart herd, which replays the log)
        status, body = _healthz(log_path)
        assert status == 503 and b"1 shard(s) stopped after a log write failure: 0;" in body, body
        assert proc.poll() is None, "the daemon must not die on a full disk"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
    first_failure = codes.index(E.COORDINATOR_NOT_AVAILABLE)
    assert 0 < first_failure < 40, codes
    # once failed, never acknowledged again (no pretending, no silent retry)
    assert set(codes[first_failure:]) == {E.COORDINATOR_NOT_AVAILABLE}, codes
    events = [json.loads(line) for line in log_path.read_text().splitlines() if line.startswith("{")]
    assert any(e["event"] == "log.shard_failed" and "File too large" in e.get("error", "") for e in events)

    # restart without the limit: every acknowledged commit is back, the torn tail of the failed write is cut
    with Daemon(data, "--offsets-partitions", "1") as d:
        with RawClient(d.address) as c:
            for group, offset in acked.items():
                err, offsets = _fetch(c, group)
                assert err == 0
                assert offsets == {("t", 0): offset}, (group, offsets)
            assert _commit(c, "g0", 1000, "") == 0  # and the shard takes writes again
    assert "log.tail_truncated" in d.logs()
