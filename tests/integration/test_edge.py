"""The daemon's TCP edge against a real daemon process: versions, bad input, limits, signals."""
from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time

import pytest

from protocol import errors as E
from protocol import messages as m
from protocol.headers import encode_request_header
from tools.daemon import REPO, Daemon
from tools.rawclient import RawClient

pytestmark = pytest.mark.integration


@pytest.fixture
def herd(tmp_path):
    with Daemon(tmp_path / "data", "--connections-max-idle-ms", "1500", "--max-frame-size", "65536") as d:
        yield d


def test_api_versions_advertises_what_is_served(herd):
    with RawClient(herd.address) as c:
        r = c.call(m.ApiVersionsRequest(client_software_name="t", client_software_version="1"), 3)
    ranges = {k.api_key: (k.min_version, k.max_version) for k in r.api_keys}
    assert r.error_code == 0
    assert ranges[11] == (0, 9) and ranges[14] == (0, 5) and ranges[8] == (0, 9) and ranges[10] == (0, 6)
    assert 28 not in ranges  # transactions are not served
    # KIP-848: ConsumerGroupHeartbeat v0-1, ConsumerGroupDescribe v0, and group.version 1 finalized
    assert ranges[68] == (0, 1) and ranges[69] == (0, 0)
    assert [(f.name, f.max_version_level) for f in r.finalized_features] == [("group.version", 1)]


def test_api_versions_newer_than_ours_gets_a_v0_answer(herd):
    with RawClient(herd.address) as c:
        out = bytearray()
        encode_request_header(out, 18, 99, 7, "future-client")
        c.send_raw(bytes(out) + b"\x00\x00")
        data = c.recv_frame()
    assert struct.unpack_from(">i", data)[0] == 7
    r = m.ApiVersionsResponse.decode(data, 0, 4)  # header v0, body v0
    assert r.error_code == E.UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version, k.max_version) for k in r.api_keys] == [(18, 0, 4)]


def test_bad_input_closes_only_that_connection(herd):
    with RawClient(herd.address) as good:
        assert good.call(m.ApiVersionsRequest(), 0).error_code == 0
        cases = [
            b"\x00\x0c",  # truncated header
            struct.pack(">hhih", 12, 4, 1, 0) + b"\xff\xff\xff",  # heartbeat v4 with garbage body
            struct.pack(">hhih", 999, 0, 1, -1),  # unknown api key
            struct.pack(">hhih", 12, 99, 1, -1),  # unsupported version
        ]
        for payload in cases:
            with RawClient(herd.address) as bad:
                bad.send_raw(payload)
                assert bad.closed_by_peer(), payload
        with RawClient(herd.address) as big:  # over --max-frame-size: refused at the prefix
            big.sock.sendall(struct.pack(">i", 10_000_000))
            assert big.closed_by_peer()
        with RawClient(herd.address) as neg:
            neg.sock.sendall(struct.pack(">i", -5))
            assert neg.closed_by_peer()
        # the well-behaved connection still works
        assert good.call(m.FindCoordinatorRequest(key="g", key_type=0), 3).error_code == 0
    assert herd.proc.poll() is None
    assert "malformed" in herd.logs()


def test_idle_connections_are_closed(herd):
    with RawClient(herd.address) as c:
        c.call(m.ApiVersionsRequest(), 1)
        assert c.closed_by_peer(timeout=10)


def test_fetch_waits_max_wait_and_answers_empty(herd):
    with RawClient(herd.address) as c:
        c.call(m.MetadataRequest(topics=[m.MetadataRequestTopic(name="t")]), 9)
        started = time.monotonic()
        r = c.call(m.FetchRequest(max_wait_ms=300, min_bytes=1, topics=[m.FetchRequestFetchTopic(
            topic="t", partitions=[m.FetchRequestFetchPartition(partition=0, fetch_offset=3)])]), 11)
        assert time.monotonic() - started >= 0.25
    pd = r.responses[0].partitions[0]
    assert (pd.error_code, pd.high_watermark) == (0, 3)


def test_topics_survive_restart(tmp_path):
    with Daemon(tmp_path / "data", "--topic", "configured:3") as d:
        with RawClient(d.address) as c:
            c.call(m.CreateTopicsRequest(topics=[m.CreateTopicsRequestCreatableTopic(
                name="created", num_partitions=5, replication_factor=1)]), 5)
        d.restart()
        with RawClient(d.address) as c:
            r = c.call(m.MetadataRequest(topics=None, allow_auto_topic_creation=False), 9)
    assert {t.name: len(t.partitions) for t in r.topics} == {"configured": 3, "created": 5}


def test_sigterm_exits_zero_and_logs_json(tmp_path):
    d = Daemon(tmp_path / "data").start()
    try:
        lines = d.logs().splitlines()
        events = [json.loads(line)["event"] for line in lines]
        # a new data directory is announced; "listening" once the log is replayed and connections
        # are accepted, not at bind time
        assert events[:3] == ["log.new_data_dir", "replayed", "listening"] and f'"port": {d.port}' in lines[2]
        port_file = tmp_path / "data.port"
        assert port_file.read_text().strip() == str(d.port)
        assert d.stop() == 0
        assert not port_file.exists()  # a clean stop takes it away: it says "listening"
    finally:
        d.kill()


@pytest.mark.parametrize("sig", [signal.SIGHUP, signal.SIGINT], ids=lambda s: s.name)
def test_sighup_and_sigint_stop_cleanly_like_sigterm(tmp_path, sig, monkeypatch):
    # SIGHUP's default action killed herd at once (no flush, the port file left naming a dead port).
    # herd keeps an ignored SIGHUP ignored (nohup; the next test), so the daemon starts with the
    # default disposition even when this test run itself was started under nohup (a CI run once was).
    real_popen = subprocess.Popen

    def popen_default_hup(*a, **kw):
        return real_popen(*a, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_DFL), **kw)

    monkeypatch.setattr(subprocess, "Popen", popen_default_hup)
    d = Daemon(tmp_path / "data").start()
    monkeypatch.undo()
    try:
        d.proc.send_signal(sig)
        try:
            code = d.proc.wait(30)  # a bound for a hang, not a pace
        except subprocess.TimeoutExpired:
            raise AssertionError(f"herd did not stop on {sig.name} within 30 s; its log:\n{d.logs()}") from None
        assert code == 0
        stopping = [json.loads(x) for x in d.logs().splitlines() if '"stopping' in x]
        assert stopping and stopping[0]["signal"] == sig.name
        assert not (tmp_path / "data.port").exists()
    finally:
        d.kill()


def test_sighup_ignored_at_start_stays_ignored(tmp_path, monkeypatch):
    # started under nohup (SIGHUP ignored): a closed terminal must not stop herd
    real_popen = subprocess.Popen

    def popen_ignoring_hup(*a, **kw):
        return real_popen(*a, preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN), **kw)

    monkeypatch.setattr(subprocess, "Popen", popen_ignoring_hup)
    d = Daemon(tmp_path / "data").start()
    monkeypatch.undo()
    try:
        d.proc.send_signal(signal.SIGHUP)
        with RawClient(d.address) as c:  # still serving
            assert c.call(m.ApiVersionsRequest(), 0).error_code == 0
        assert d.stop() == 0
        stopping = [json.loads(x) for x in d.logs().splitlines() if '"stopping' in x]
        assert [e["signal"] for e in stopping] == ["SIGTERM"]  # the SIGHUP did nothing
    finally:
        d.kill()


def test_a_failed_start_leaves_no_stale_port_file(tmp_path):
    # a port file left by a killed herd must not name a dead port while the next one replays (or
    # after it failed to start)
    port_file = tmp_path / "herd.port"
    port_file.write_text("40404\n")
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        p = run_cli("serve", "--port", "0", "--data-dir", str(tmp_path / "data"), "--port-file",
                    str(port_file), "--metrics-port", str(busy.getsockname()[1]), "--log-format", "json")
    assert p.returncode == 2 and "cannot listen for metrics" in p.stderr.strip().splitlines()[-1]
    assert not port_file.exists()
    # a busy metrics port is found before the logs are replayed, not after
    assert '"replayed"' not in p.stderr and '"listening"' not in p.stderr


def run_cli(*args, env=None):
    e = dict(os.environ, PYTHONPATH=str(REPO))
    e.update(env or {})
    return subprocess.run([sys.executable, "-m", "herd_cli", *args], capture_output=True, text=True,
                          timeout=30, env=e, cwd=str(REPO))


@pytest.mark.parametrize("args, env, needle", [
    (["serve", "--port", "abc"], {}, "port must be an integer"),
    (["serve", "--fsync", "maybe"], {}, "fsync must be"),
    (["serve"], {"HERD_OFFSETS_PARTITIONS": "-1"}, "offsets_partitions must be positive"),
    (["serve", "--config", "/nonexistent/herd.toml"], {}, "config file not found"),
    # --help says NAME:PARTITIONS: a topic without its count is refused, not taken as 1 partition
    (["serve", "--topic", "orders"], {},
     "herd: error: --topic: wants NAME:PARTITIONS, got 'orders': give the partition count, e.g. orders:6"),
    (["serve", "--topic", "orders:six"], {}, "--topic: wants NAME:PARTITIONS, got 'orders:six': the partition count"),
    (["serve"], {"HERD_TOPICS": "orders:6,audit"}, "HERD_TOPICS: wants NAME:PARTITIONS, got 'audit'"),
])
def test_bad_config_is_one_line_and_exit_2(args, env, needle):
    p = run_cli(*args, env=env)
    assert p.returncode == 2
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and needle in lines[0] and "Traceback" not in p.stderr


@pytest.mark.parametrize("argv, needle", [
    (["serve", "--bogus"], "unrecognized arguments: --bogus"),
    (["serve", "--auto-create-topics=maybe"], "ignored explicit argument 'maybe'"),
    (["nonsense"], "invalid choice: 'nonsense'"),
])
def test_argument_mistakes_are_one_line_and_exit_2(argv, needle):
    p = run_cli(*argv)
    lines = p.stderr.strip().splitlines()
    assert p.returncode == 2 and len(lines) == 1 and needle in lines[0] and "usage" not in p.stderr


def test_unusable_data_dir_files_and_port_file_are_one_line(tmp_path):
    (tmp_path / "a" / ".lock").mkdir(parents=True)  # (root ignores permissions: use a directory)
    p = run_cli("serve", "--port", "0", "--data-dir", str(tmp_path / "a"))
    assert p.returncode == 2 and p.stderr.strip().splitlines()[-1].startswith(
        "herd: error: cannot open the lock file") and "Traceback" not in p.stderr
    d = Daemon(tmp_path / "b").start()
    d.stop()
    log = next((tmp_path / "b").glob("shard-04/*.log"))
    log.unlink()
    log.mkdir()
    p = run_cli("serve", "--port", "0", "--data-dir", str(tmp_path / "b"))
    last = p.stderr.strip().splitlines()[-1]
    assert p.returncode == 2 and "cannot open the logs" in last and "Is a directory" in last
    assert "Traceback" not in p.stderr and '"listening"' not in p.stderr
    p = run_cli("serve", "--port", "0", "--data-dir", str(tmp_path / "c"), "--port-file",
                str(tmp_path / "missing" / "port"))
    assert p.returncode == 2 and "cannot write port file" in p.stderr.strip().splitlines()[-1]
    assert not (tmp_path / "c").exists()  # refused before anything was created


def test_data_dir_in_use_is_refused(tmp_path):
    with Daemon(tmp_path / "data"):
        p = run_cli("serve", "--port", "0", "--data-dir", str(tmp_path / "data"))
    assert p.returncode == 2 and "in use by another herd process" in p.stderr


def test_port_in_use_is_one_line(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = run_cli("serve", "--port", str(port), "--data-dir", str(tmp_path / "d"))
    assert p.returncode == 2 and "cannot listen" in p.stderr.strip().splitlines()[-1]


def test_produce_is_refused_per_partition_and_acks0_gets_no_answer(herd):
    from protocol.headers import encode_request_header as hdr

    def produce(acks):
        out = bytearray()
        hdr(out, 0, 7, 5, "producer")
        out += struct.pack(">hhi", -1, acks, 1000)  # null transactional id, acks, timeout
        out += struct.pack(">i", 1) + struct.pack(">h", 1) + b"t" + struct.pack(">i", 1)
        out += struct.pack(">ii", 0, 3) + b"xyz"  # partition 0, 3 bytes of records
        return bytes(out)

    with RawClient(herd.address) as c:
        c.send_raw(produce(0))  # acks=0: Kafka sends no response
        c.send_raw(produce(1))
        data = c.recv_frame()
        assert struct.unpack_from(">i", data)[0] == 5
        n_topics, = struct.unpack_from(">i", data, 4)
        (name_len,) = struct.unpack_from(">h", data, 8)
        index, error = struct.unpack_from(">ih", data, 10 + name_len + 4)
        assert (n_topics, data[10:10 + name_len], index, error) == (1, b"t", 0, E.INVALID_REQUEST)
        # the connection is still good
        assert c.call(m.ApiVersionsRequest(), 2).error_code == 0


def test_confluent_producer_gets_a_clear_error(herd):
    confluent_kafka = pytest.importorskip("confluent_kafka")
    errors = []
    p = confluent_kafka.Producer({"bootstrap.servers": herd.bootstrap, "message.timeout.ms": 5000,
                                  "retries": 0})
    p.produce("t", b"v", on_delivery=lambda err, msg: errors.append(err))
    p.flush(10)
    assert len(errors) == 1 and errors[0] is not None
    assert errors[0].code() == confluent_kafka.KafkaError.INVALID_REQUEST
    assert herd.proc.poll() is None


def test_list_offsets_every_version_encodes(herd):
    with RawClient(herd.address) as c:
        c.call(m.MetadataRequest(topics=[m.MetadataRequestTopic(name="lo")]), 9)
        for version in range(0, 11):
            r = c.call(m.ListOffsetsRequest(replica_id=-1, topics=[m.ListOffsetsRequestListOffsetsTopic(
                name="lo", partitions=[m.ListOffsetsRequestListOffsetsPartition(partition_index=0,
                                                                                timestamp=-1)])]), version)
            assert r.topics[0].partitions[0].error_code == 0, version


def test_systemd_notify_ready_after_listening_watchdog_and_stopping(tmp_path):
    """Type=notify: READY=1 (with the address) once requests are answered, WATCHDOG=1 pings from
    the loop when WatchdogSec is set, STOPPING=1 on SIGTERM."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as notify:
        notify.bind(str(tmp_path / "notify"))
        notify.settimeout(30)
        env = dict(os.environ, PYTHONPATH=str(REPO), NOTIFY_SOCKET=str(tmp_path / "notify"),
                   WATCHDOG_USEC="400000")
        env.pop("WATCHDOG_PID", None)
        proc = subprocess.Popen([sys.executable, "-m", "coordinator", "serve", "--port", "0", "--data-dir",
                                 str(tmp_path / "data"), "--log-level", "warning"], cwd=str(REPO), env=env)
        try:
            ready = dict(line.split("=", 1) for line in notify.recv(4096).decode().split("\n"))
            assert ready["READY"] == "1" and ready["MAINPID"] == str(proc.pid)
            host, port = ready["STATUS"].removeprefix("listening on ").rsplit(":", 1)
            with RawClient((host, int(port))) as c:  # answered as soon as READY=1 arrives
                assert c.call(m.ApiVersionsRequest(), 0).error_code == E.NONE
            assert notify.recv(4096) == b"WATCHDOG=1"
            assert notify.recv(4096) == b"WATCHDOG=1"
            proc.send_signal(signal.SIGTERM)
            while (msg := notify.recv(4096)) == b"WATCHDOG=1":
                pass
            assert msg.startswith(b"STOPPING=1\n")
            assert proc.wait(30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
