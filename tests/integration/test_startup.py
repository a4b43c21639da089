"""Start-up as a container runtime sees it: the HTTP endpoint answers /healthz (alive, "starting")
and /readyz (503) while the log is opened and replayed, and a SIGTERM during that time stops herd
cleanly (as PID 1 in a container a signal without a handler is ignored: `docker stop` waited for
its SIGKILL).

The daemon is held in the middle of opening its log by a data directory whose ``herd-log.json`` is
a named pipe: herd blocks reading it until the test writes the file's content."""
from __future__ import annotations

import errno
import http.client
import json
import os
import signal
import time

import pytest

from tools.daemon import Daemon

pytestmark = pytest.mark.integration

SHARDS = 2
META = json.dumps({"format": 1, "num_shards": SHARDS}).encode() + b"\n"


def _held_data_dir(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    os.mkfifo(data / "herd-log.json")
    return data


def _open_pipe_when_read(d: Daemon, timeout: float = 20.0) -> int:
    """The pipe's write end, once herd has opened it for reading (it is then inside the log's open)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return os.open(d.data_dir / "herd-log.json", os.O_WRONLY | os.O_NONBLOCK)
        except OSError as exc:  # ENXIO: no reader yet
            if exc.errno != errno.ENXIO:
                raise
        assert d.proc.poll() is None, d.logs()
        time.sleep(0.01)
    raise AssertionError(f"herd never opened its data directory:\n{d.logs()}")


def _release(fd: int) -> None:
    os.write(fd, META)
    os.close(fd)


def _metrics_port(d: Daemon, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in d.logs().splitlines():
            if '"metrics listening"' in line:
                return json.loads(line)["port"]
        assert d.proc.poll() is None, d.logs()
        time.sleep(0.02)
    raise AssertionError(f"the metrics endpoint is not served while herd starts:\n{d.logs()}")


def _get(port: int, path: str) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_healthz_answers_while_the_log_is_replayed_and_readyz_waits_for_it(tmp_path):
    data = _held_data_dir(tmp_path)
    with Daemon(data, "--offsets-partitions", SHARDS, "--metrics-port", "0").spawn() as d:
        mport = _metrics_port(d)
        fd = _open_pipe_when_read(d)
        try:
            # a liveness probe must not fail (a restart would only replay again); readiness waits
            assert _get(mport, "/healthz") == (200, b"starting: replaying the log\n")
            status, body = _get(mport, "/readyz")
            assert status == 503 and b"starting" in body
            assert _get(mport, "/metrics")[0] == 503  # the group state is not whole yet
            assert not d.port_file.exists()
        finally:
            _release(fd)
        d.wait_ready()
        assert _get(mport, "/readyz") == (200, b"ready\n")
        assert _get(mport, "/healthz") == (200, b"ok\n")
        assert _get(mport, "/metrics")[0] == 200


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_while_the_log_is_opened_stops_herd_cleanly(tmp_path, sig):
    data = _held_data_dir(tmp_path)
    with Daemon(data, "--offsets-partitions", SHARDS).spawn() as d:
        fd = _open_pipe_when_read(d)
        d.proc.send_signal(sig)
        _release(fd)
        assert d.proc.wait(20) == 0, d.logs()
        events = [json.loads(line) for line in d.logs().splitlines() if line.startswith("{")]
        stopping = [e for e in events if e["event"] == "stopping before the replay ended"]
        assert stopping and stopping[0]["signal"] == sig.name, d.logs()
        assert events[-1]["event"] == "stopped"
        assert not any(e["event"] == "listening" for e in events)
        assert not d.port_file.exists()
