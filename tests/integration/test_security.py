"""TLS and SASL on herd's listener, against the real daemon, with unmodified Kafka clients and raw
requests: who gets in, what the others are told, and that the daemon keeps serving."""
from __future__ import annotations

import asyncio
import os
import ssl
import subprocess
import sys
import time
import urllib.request

import pytest

from protocol import errors as E
from protocol import messages as m
from protocol.sasl import client_mechanism
from tests.support.pki import make_pki
from tools.daemon import REPO, Daemon
from tools.rawclient import RawClient

pytestmark = pytest.mark.integration

PASSWORD = "alice-secret: with spaces"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"), {"alice": PASSWORD, "bob": "bob-pw"})


def _topic_args():
    return ["--topic", "t:2"]


@pytest.fixture(scope="module")
def sasl_ssl(pki, tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("sasl-ssl") / "data", "--security-protocol", "SASL_SSL",
               "--ssl-certfile", pki / "server.pem", "--sasl-users-file", pki / "users", "--metrics-port", "0",
               *_topic_args())
    with d:
        yield d


def _tls(pki, cert=None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    if cert is not None:
        ctx.load_cert_chain(*cert)
    return ctx


def _confluent(bootstrap, group, **conf):
    ck = pytest.importorskip("confluent_kafka")
    errors = []
    c = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
                     "session.timeout.ms": 6000, "error_cb": errors.append, "log_level": 0, **conf})
    return c, errors


def _confluent_commit_round_trip(bootstrap, group, **conf):
    ck = pytest.importorskip("confluent_kafka")
    c, errors = _confluent(bootstrap, group, **conf)
    try:
        c.subscribe(["t"])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and not c.assignment() and not errors:
            c.poll(0.1)
        assert not errors, errors
        assert len(c.assignment()) == 2
        c.commit(offsets=[ck.TopicPartition("t", 0, 42)], asynchronous=False)
        [got] = c.committed([ck.TopicPartition("t", 0)], timeout=10)
        assert got.offset == 42
    finally:
        c.close()


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_confluent_kafka_joins_and_commits_over_sasl_ssl(sasl_ssl, pki, mechanism):
    _confluent_commit_round_trip(sasl_ssl.bootstrap, f"ck-{mechanism}", **{
        "security.protocol": "SASL_SSL", "sasl.mechanisms": mechanism, "sasl.username": "alice",
        "sasl.password": PASSWORD, "ssl.ca.location": str(pki / "ca.pem")})


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-512"])
def test_a_wrong_password_is_refused_with_kafkas_error_and_the_daemon_keeps_serving(sasl_ssl, pki, mechanism):
    c, errors = _confluent(sasl_ssl.bootstrap, "ck-bad", **{
        "security.protocol": "SASL_SSL", "sasl.mechanisms": mechanism, "sasl.username": "alice",
        "sasl.password": "guess", "ssl.ca.location": str(pki / "ca.pem")})
    try:
        c.subscribe(["t"])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not errors:
            c.poll(0.1)
    finally:
        c.close()
    assert errors, "no error reported"
    assert "_AUTHENTICATION" in str(errors[0].name()) or errors[0].code() == -169, errors[0]
    assert "Authentication failed" in errors[0].str()
    assert sasl_ssl.proc.poll() is None
    with urllib.request.urlopen(f"http://127.0.0.1:{_metrics_port(sasl_ssl)}/metrics", timeout=5) as r:
        text = r.read().decode()
    assert f'herd_sasl_authentications_total{{mechanism="{mechanism}",result="failed"}}' in text
    assert "guess" not in sasl_ssl.logs() and PASSWORD not in sasl_ssl.logs()


def _metrics_port(d: Daemon) -> int:
    import json

    for line in d.logs().splitlines():
        if '"metrics listening"' in line:
            return json.loads(line)["port"]
    raise AssertionError("no metrics port in the log")


def test_kafka_python_joins_and_commits_with_scram(sasl_ssl, pki):
    kafka = pytest.importorskip("kafka")
    k = kafka.KafkaConsumer("t", bootstrap_servers=sasl_ssl.bootstrap, group_id="kp-scram",
                            security_protocol="SASL_SSL", sasl_mechanism="SCRAM-SHA-512",
                            sasl_plain_username="bob", sasl_plain_password="bob-pw",
                            ssl_cafile=str(pki / "ca.pem"), enable_auto_commit=False, metadata_max_age_ms=500)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            k.poll(100)
            if len(k.assignment()) == 2:
                try:
                    k.commit({kafka.TopicPartition("t", 1): kafka.OffsetAndMetadata(7, "", -1)})
                    break
                except kafka.errors.RebalanceInProgressError:
                    continue  # kafka-python rejoins once its metadata for t arrives
        assert k.committed(kafka.TopicPartition("t", 1)) == 7
    finally:
        k.close()


def test_aiokafka_joins_and_commits_with_plain(sasl_ssl, pki):
    aiokafka = pytest.importorskip("aiokafka")

    async def run():
        c = aiokafka.AIOKafkaConsumer("t", bootstrap_servers=sasl_ssl.bootstrap, group_id="aio-plain",
                                      security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                                      sasl_plain_username="alice", sasl_plain_password=PASSWORD,
                                      ssl_context=_tls(pki), enable_auto_commit=False)
        await c.start()
        try:
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and len(c.assignment()) < 2:
                await c.getmany(timeout_ms=100)
            await c.commit({aiokafka.TopicPartition("t", 0): 5})
            return await c.committed(aiokafka.TopicPartition("t", 0))
        finally:
            await c.stop()

    assert asyncio.run(run()) == 5


# ---- the exchange, request by request ---------------------------------------------------------


def _handshake(c: RawClient, mechanism: str, version: int = 1):
    return c.call(m.SaslHandshakeRequest(mechanism=mechanism), version)


def test_api_versions_is_answered_before_authentication_and_advertises_sasl(sasl_ssl, pki):
    with RawClient(sasl_ssl.address, ssl_context=_tls(pki)) as c:
        resp = c.call(m.ApiVersionsRequest(client_software_name="t", client_software_version="1"), 3)
        keys = {k.api_key for k in resp.api_keys}
        assert {17, 36} <= keys
        assert _handshake(c, "SCRAM-SHA-256").mechanisms == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


@pytest.mark.parametrize("first", [
    m.MetadataRequest(topics=None), m.FindCoordinatorRequest(key="g"),
    m.OffsetFetchRequest(group_id="g", topics=None),
])
def test_a_group_or_metadata_request_before_authentication_closes_the_connection(sasl_ssl, pki, first):
    version = {m.MetadataRequest: 1, m.FindCoordinatorRequest: 1, m.OffsetFetchRequest: 2}[type(first)]
    with RawClient(sasl_ssl.address, ssl_context=_tls(pki)) as c:
        c.send(first, version)
        assert c.closed_by_peer()
    with RawClient(sasl_ssl.address, ssl_context=_tls(pki)) as c:  # after the handshake, still not in
        _handshake(c, "PLAIN")
        c.send(first, version)
        assert c.closed_by_peer()


def test_an_unknown_mechanism_is_answered_with_the_enabled_ones_then_closed(sasl_ssl, pki):
    with RawClient(sasl_ssl.address, ssl_context=_tls(pki)) as c:
        cid = c.send(m.SaslHandshakeRequest(mechanism="GSSAPI"), 1)
        for _ in range(50):  # pipelined behind the refused handshake: must not cost its answer
            c.send(m.SaslHandshakeRequest(mechanism="PLAIN"), 1)
        resp = c.receive(17, 1, cid)
        assert resp.error_code == E.UNSUPPORTED_SASL_MECHANISM
        assert resp.mechanisms == ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]
        assert c.closed_by_peer()


def test_authenticate_before_handshake_is_an_illegal_state(sasl_ssl, pki):
    with RawClient(sasl_ssl.address, ssl_context=_tls(pki)) as c:
        resp = c.call(m.SaslAuthenticateRequest(auth_bytes=b"\0alice\0x"), 1)
        assert resp.error_code == E.ILLEGAL_SASL_STATE
        assert c.closed_by_peer()


def test_scram_over_raw_requests_then_group_requests_and_no_second_authentication(sasl_ssl, pki):
    with RawClient(sasl_ssl.address, ssl_context=_tls(pki)) as c:
        assert _handshake(c, "SCRAM-SHA-256").error_code == 0
        client = client_mechanism("SCRAM-SHA-256", "alice", PASSWORD)
        token = client.first()
        while token is not None:
            resp = c.call(m.SaslAuthenticateRequest(auth_bytes=token), 2)
            assert resp.error_code == 0, resp.error_message
            assert resp.session_lifetime_ms == 0  # no re-authentication asked (KIP-368)
            token = client.step(resp.auth_bytes)
        assert client.done  # the server proved it knows the password too
        found = c.call(m.FindCoordinatorRequest(key="g"), 1)
        assert found.error_code == 0 and found.port == sasl_ssl.port
        again = _handshake(c, "PLAIN")
        assert again.error_code == E.ILLEGAL_SASL_STATE
        assert c.call(m.FindCoordinatorRequest(key="g"), 1).error_code == 0  # still usable


def test_a_v0_handshake_takes_bare_tokens(sasl_ssl, pki):
    """SaslHandshake v0 (clients before Kafka 1.0): the token and its answer are bare frames."""
    with RawClient(sasl_ssl.address, ssl_context=_tls(pki)) as c:
        assert _handshake(c, "PLAIN", version=0).error_code == 0
        c.send_raw(b"\0alice\0" + PASSWORD.encode())
        assert c.recv_frame() == b""  # PLAIN's empty answer: authenticated
        assert c.call(m.FindCoordinatorRequest(key="g"), 1).error_code == 0
    with RawClient(sasl_ssl.address, ssl_context=_tls(pki)) as c:
        _handshake(c, "PLAIN", version=0)
        c.send_raw(b"\0alice\0nope")
        assert c.closed_by_peer()


def test_a_failed_authentication_is_answered_before_the_close(sasl_ssl, pki):
    with RawClient(sasl_ssl.address, ssl_context=_tls(pki)) as c:
        _handshake(c, "PLAIN")
        cid = c.send(m.SaslAuthenticateRequest(auth_bytes=b"\0mallory\0x"), 1)
        c.send(m.FindCoordinatorRequest(key="g"), 1)  # pipelined behind it: never answered
        started = time.monotonic()
        resp = c.receive(36, 1, cid)
        assert resp.error_code == E.SASL_AUTHENTICATION_FAILED
        assert resp.error_message == "Authentication failed: Invalid username or password"
        assert c.closed_by_peer()
        assert time.monotonic() - started >= 0.05  # Kafka's delay before closing after a failure


def test_a_large_frame_before_authentication_closes_the_connection(sasl_ssl, pki):
    """Kafka's sasl.server.max.receive.size (512 KiB): a peer that has not authenticated cannot
    make herd buffer a max_frame_size (8 MiB) request; once authenticated it can send one."""
    import struct

    size = 600 * 1024
    with RawClient(sasl_ssl.address, ssl_context=_tls(pki)) as c:
        _handshake(c, "PLAIN")
        c.sock.sendall(struct.pack(">i", size) + b"\0" * 1024)
        assert c.closed_by_peer()
    with RawClient(sasl_ssl.address, ssl_context=_tls(pki)) as c:
        _handshake(c, "PLAIN")
        assert c.call(m.SaslAuthenticateRequest(auth_bytes=b"\0alice\0" + PASSWORD.encode()), 1).error_code == 0
        c.sock.sendall(struct.pack(">i", size) + b"\0" * 1024)
        assert not c.closed_by_peer(timeout=1.0)  # waits for the rest of the frame


def test_plaintext_client_on_a_tls_listener_is_dropped_and_the_daemon_keeps_serving(sasl_ssl, pki):
    with RawClient(sasl_ssl.address) as c:
        c.send(m.ApiVersionsRequest(), 0)
        assert c.closed_by_peer(timeout=15)
    with RawClient(sasl_ssl.address, ssl_context=_tls(pki)) as c:
        assert c.call(m.ApiVersionsRequest(), 0).error_code == 0


# ---- other listener kinds ---------------------------------------------------------------------


def test_sasl_without_tls_with_kafka_python(pki, tmp_path):
    kafka = pytest.importorskip("kafka")
    with Daemon(tmp_path / "data", "--security-protocol", "SASL_PLAINTEXT", "--sasl-mechanisms", "SCRAM-SHA-256",
                "--sasl-users-file", pki / "users", *_topic_args()) as d:
        with RawClient(d.address) as c:
            resp = _handshake(c, "PLAIN")
            assert resp.error_code == E.UNSUPPORTED_SASL_MECHANISM and resp.mechanisms == ["SCRAM-SHA-256"]
        admin = kafka.KafkaAdminClient(bootstrap_servers=d.bootstrap, security_protocol="SASL_PLAINTEXT",
                                       sasl_mechanism="SCRAM-SHA-256", sasl_plain_username="bob",
                                       sasl_plain_password="bob-pw")
        try:
            assert list(admin.list_groups()) == []
        finally:
            admin.close()


def test_tls_with_client_certificates_required(pki, tmp_path):
    with Daemon(tmp_path / "data", "--security-protocol", "SSL", "--ssl-certfile", pki / "server.pem",
                "--ssl-cafile", pki / "ca.pem", "--ssl-client-auth", "required", *_topic_args()) as d:
        cert = (str(pki / "client.crt"), str(pki / "client.key"))
        with RawClient(d.address, ssl_context=_tls(pki, cert)) as c:
            assert c.call(m.FindCoordinatorRequest(key="g"), 1).error_code == 0
            assert _handshake(c, "PLAIN").error_code == E.ILLEGAL_SASL_STATE  # no SASL on this listener
        for who in (None, (str(pki / "stranger.pem"),)):
            with pytest.raises((ssl.SSLError, ConnectionError, OSError)):
                with RawClient(d.address, ssl_context=_tls(pki, who)) as c:
                    c.call(m.ApiVersionsRequest(), 0)  # TLS 1.3: the refusal arrives after the handshake
        _confluent_commit_round_trip(d.bootstrap, "ck-mtls", **{
            "security.protocol": "SSL", "ssl.ca.location": str(pki / "ca.pem"),
            "ssl.certificate.location": cert[0], "ssl.key.location": cert[1]})


def test_plaintext_listener_answers_sasl_requests_illegal_state(tmp_path):
    with Daemon(tmp_path / "data") as d, RawClient(d.address) as c:
        assert _handshake(c, "PLAIN").error_code == E.ILLEGAL_SASL_STATE
        resp = c.call(m.SaslAuthenticateRequest(auth_bytes=b"x"), 1)
        assert resp.error_code == E.ILLEGAL_SASL_STATE
        assert c.call(m.FindCoordinatorRequest(key="g"), 1).error_code == 0


# ---- configuration mistakes: one line, exit 2, before the port opens --------------------------


@pytest.mark.parametrize("args,expect", [
    (["--security-protocol", "SASL_SSL", "--sasl-users-file", "{pki}/users"], "needs ssl_certfile"),
    (["--security-protocol", "SASL_PLAINTEXT"], "needs sasl_users_file"),
    (["--security-protocol", "TLS"], "security_protocol must be one of"),
    (["--security-protocol", "SSL", "--ssl-certfile", "{pki}/missing.pem"], "missing.pem: no such file"),
    (["--security-protocol", "SSL", "--ssl-certfile", "{pki}/ca.pem"], "not a usable PEM certificate"),
    (["--security-protocol", "SASL_PLAINTEXT", "--sasl-users-file", "{pki}/nope"], "nope: no such file"),
    (["--security-protocol", "SASL_PLAINTEXT", "--sasl-users-file", "{pki}/ca.pem"], "expected user:password"),
    (["--sasl-mechanisms", "PLAIN,GSSAPI"], "sasl_mechanisms: GSSAPI"),
    (["--ssl-certfile", "{pki}/server.pem"], "ssl_certfile is set but security_protocol is PLAINTEXT"),
    (["--security-protocol", "SSL", "--ssl-certfile", "{pki}/server.pem", "--ssl-client-auth", "required"],
     "needs ssl_cafile"),
])
def test_security_mistakes_are_one_line(pki, tmp_path, args, expect):
    cmd = [sys.executable, "-m", "coordinator", "serve", "--port", "0", "--data-dir", str(tmp_path / "d"),
           *[a.format(pki=pki) for a in args]]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=str(REPO), env=env)
    assert r.returncode == 2, r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and expect in lines[0], r.stderr


# ---- kcat and KafkaJS (other SASL/TLS implementations) -----------------------------------------


def test_kcat_lists_metadata_over_sasl_ssl_and_is_told_a_wrong_password(sasl_ssl, pki):
    import json
    import shutil

    if shutil.which("kcat") is None:
        pytest.fail("kcat is not installed: run `make conformance-deps` as root", pytrace=False)
    base = ["kcat", "-L", "-J", "-b", sasl_ssl.bootstrap, "-m", "10", "-X", "security.protocol=SASL_SSL",
            "-X", "sasl.mechanisms=SCRAM-SHA-256", "-X", "sasl.username=alice",
            "-X", f"ssl.ca.location={pki / 'ca.pem'}"]
    ok = subprocess.run([*base, "-X", f"sasl.password={PASSWORD}"], capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr
    assert "t" in {t["topic"] for t in json.loads(ok.stdout)["topics"]}
    bad = subprocess.run([*base, "-X", "sasl.password=guess"], capture_output=True, text=True, timeout=30)
    assert bad.returncode != 0 and "Authentication failed" in bad.stderr, bad.stderr


KAFKAJS_SCRIPT = r"""
const fs = require('fs');
const { Kafka, logLevel } = require('kafkajs');
const [bootstrap, ca, mechanism, password] = process.argv.slice(1);
const kafka = new Kafka({ clientId: 'sec', brokers: [bootstrap], logLevel: logLevel.NOTHING,
  ssl: { ca: [fs.readFileSync(ca, 'utf-8')] }, sasl: { mechanism, username: 'alice', password } });
(async () => {
  const admin = kafka.admin();
  try {
    await admin.connect();
    await admin.setOffsets({ groupId: 'kjs', topic: 't', partitions: [{ partition: 0, offset: '11' }] });
    const [got] = await admin.fetchOffsets({ groupId: 'kjs', topics: ['t'] });
    console.log(JSON.stringify({ ok: got.partitions.find(p => p.partition === 0).offset }));
  } catch (e) {
    console.log(JSON.stringify({ error: e.name, message: e.message }));
  } finally {
    await admin.disconnect();
  }
})();
"""


@pytest.mark.parametrize("mechanism", ["plain", "scram-sha-512"])
def test_kafkajs_authenticates_and_commits_over_sasl_ssl(sasl_ssl, pki, mechanism):
    import json
    import shutil

    js = REPO / "tests" / "conformance" / "js"
    if shutil.which("node") is None:
        pytest.skip("node not installed")
    if not (js / "node_modules" / "kafkajs").exists():
        pytest.fail("KafkaJS is not installed: run `make conformance-deps`", pytrace=False)

    def run(password):
        r = subprocess.run(["node", "-e", KAFKAJS_SCRIPT, sasl_ssl.bootstrap, str(pki / "ca.pem"), mechanism,
                            password], capture_output=True, text=True, timeout=60, cwd=str(js))
        return json.loads(r.stdout.strip().splitlines()[-1])

    assert run(PASSWORD) == {"ok": "11"}
    bad = run("guess")
    assert bad["error"] == "KafkaJSSASLAuthenticationError" and "Authentication failed" in bad["message"], bad


def test_a_users_file_others_can_read_is_warned_about(pki, tmp_path):
    users = tmp_path / "users"
    users.write_text(f"alice:{PASSWORD}\n")
    users.chmod(0o644)
    with Daemon(tmp_path / "data", "--security-protocol", "SASL_PLAINTEXT", "--sasl-users-file", users) as d:
        assert "the SASL users file is readable by other users" in d.logs()
        assert PASSWORD not in d.logs()
    users.chmod(0o600)
    with Daemon(tmp_path / "data2", "--security-protocol", "SASL_PLAINTEXT", "--sasl-users-file", users) as d:
        assert "readable by other users" not in d.logs()


def test_an_encrypted_key_without_its_password_is_one_line_not_a_prompt(pki, tmp_path):
    """OpenSSL would read the pass phrase from the terminal; herd must fail at once instead."""
    from cryptography.hazmat.primitives import serialization

    pem = (pki / "server.pem").read_bytes()
    key = serialization.load_pem_private_key(pem[:pem.index(b"-----BEGIN CERTIFICATE-----")], None)
    (tmp_path / "key.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"key-pw")))
    (tmp_path / "cert.pem").write_bytes(pem[pem.index(b"-----BEGIN CERTIFICATE-----"):])
    base = [sys.executable, "-m", "coordinator", "serve", "--port", "0", "--security-protocol", "SSL",
            "--ssl-certfile", str(tmp_path / "cert.pem"), "--ssl-keyfile", str(tmp_path / "key.pem")]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    # a pseudo-terminal as stdin: where OpenSSL's prompt would wait for an answer
    import pty

    leader, follower = pty.openpty()
    try:
        r = subprocess.run([*base, "--data-dir", str(tmp_path / "d")], stdin=follower, capture_output=True,
                           text=True, timeout=60, cwd=str(REPO), env=env)
    finally:
        os.close(leader)
        os.close(follower)
    assert r.returncode == 2 and "the private key is encrypted: set ssl_key_password" in r.stderr, r.stderr
    with Daemon(tmp_path / "data", "--security-protocol", "SSL", "--ssl-certfile", tmp_path / "cert.pem",
                "--ssl-keyfile", tmp_path / "key.pem", env={"HERD_SSL_KEY_PASSWORD": "key-pw"}) as d:
        with RawClient(d.address, ssl_context=_tls(pki)) as c:
            assert c.call(m.FindCoordinatorRequest(key="g"), 1).error_code == 0
        assert "key-pw" not in d.logs()
