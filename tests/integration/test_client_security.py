"""herd's own clients (the thin client, the PySpark helpers, ``herd groups``) over TLS and SASL,
against the real daemon: they get in with the right settings, and with wrong ones they fail once,
saying why, without a reconnect loop."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from client import GroupConsumer, TopicPartition
from client import errors as cerr
from client.spark import GroupJob, describe_group, partitions_for, run_member
from tests.support.pki import make_pki
from tools.daemon import REPO, Daemon

pytestmark = pytest.mark.integration

PASSWORD = "alice: secret with spaces"
ALL = {TopicPartition("t", 0), TopicPartition("t", 1)}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_pki(tmp_path_factory.mktemp("pki"), {"alice": PASSWORD})


@pytest.fixture(scope="module")
def sasl_ssl(pki, tmp_path_factory):
    d = Daemon(tmp_path_factory.mktemp("client-sasl-ssl") / "data", "--security-protocol", "SASL_SSL",
               "--ssl-certfile", pki / "server.pem", "--sasl-users-file", pki / "users", "--metrics-port", "0",
               "--topic", "t:2", "--min-session-timeout-ms", "1000")
    with d:
        yield d


def secure(pki, mechanism="SCRAM-SHA-512", password=PASSWORD, ca="ca.pem"):
    return {"security.protocol": "SASL_SSL", "ssl.ca.location": str(pki / ca), "sasl.mechanism": mechanism,
            "sasl.username": "alice", "sasl.password": password}


def _failed_authentications(d: Daemon, mechanism: str) -> float:
    port = next(json.loads(line)["port"] for line in d.logs().splitlines() if '"metrics listening"' in line)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        for line in r.read().decode().splitlines():
            if line.startswith(f'herd_sasl_authentications_total{{mechanism="{mechanism}",result="failed"}}'):
                return float(line.split()[-1])
    return 0.0


# ---- the thin client ------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_thin_client_joins_and_commits_over_sasl_ssl(sasl_ssl, pki, mechanism):
    c = GroupConsumer(f"SASL_SSL://{sasl_ssl.bootstrap}", f"tc-{mechanism}", secure(pki, mechanism),
                      session_timeout_ms=6000, heartbeat_interval_ms=500, enable_auto_commit=False)
    try:
        c.subscribe(["t"])
        deadline = time.monotonic() + 20
        while c.poll(0.5) != ALL and time.monotonic() < deadline:
            pass
        assert c.assignment() == ALL
        c.commit({TopicPartition("t", 0): 42})
        assert c.committed([TopicPartition("t", 0)], timeout_s=10)[TopicPartition("t", 0)].offset == 42
    finally:
        c.close(5)


def test_thin_client_wrong_password_fails_once_with_the_daemons_reason(sasl_ssl, pki):
    before = _failed_authentications(sasl_ssl, "SCRAM-SHA-256")
    c = GroupConsumer(sasl_ssl.bootstrap, "tc-bad", secure(pki, "SCRAM-SHA-256", "guess"),
                      reconnect_backoff_ms=10, reconnect_backoff_max_ms=50)
    try:
        c.subscribe(["t"])
        with pytest.raises(cerr.AuthenticationFailedError, match="SASL SCRAM-SHA-256 authentication of 'alice' "
                                                                 "failed: .*Authentication failed") as info:
            c.poll(10)
        assert not info.value.retriable
        time.sleep(1.0)  # a reconnect loop would try again many times over with these backoffs
        with pytest.raises(cerr.AuthenticationFailedError):
            c.poll(0.1)
    finally:
        c.close(2)
    assert _failed_authentications(sasl_ssl, "SCRAM-SHA-256") == before + 1
    assert "guess" not in sasl_ssl.logs() and PASSWORD not in sasl_ssl.logs()


def test_thin_client_certificate_that_does_not_verify(sasl_ssl, pki):
    c = GroupConsumer(sasl_ssl.bootstrap, "tc-ca", secure(pki, ca="other-ca.pem"))
    try:
        with pytest.raises(cerr.SslAuthenticationError, match="TLS certificate verification of 127.0.0.1:.* failed"):
            c.committed([TopicPartition("t", 0)], timeout_s=10)
    finally:
        c.close(2)


def test_thin_client_with_and_without_a_client_certificate(pki, tmp_path):
    with Daemon(tmp_path / "data", "--security-protocol", "SSL", "--ssl-certfile", pki / "server.pem",
                "--ssl-cafile", pki / "ca.pem", "--ssl-client-auth", "required", "--topic", "t:2") as d:
        tls = {"security.protocol": "SSL", "ssl.ca.location": str(pki / "ca.pem")}
        c = GroupConsumer(d.bootstrap, "mtls", tls, ssl_certificate_location=str(pki / "client.crt"),
                          ssl_key_location=str(pki / "client.key"), enable_auto_commit=False)
        try:
            c.commit({TopicPartition("t", 1): 7})
            assert c.committed([TopicPartition("t", 1)], timeout_s=10)[TopicPartition("t", 1)].offset == 7
        finally:
            c.close(5)
        c = GroupConsumer(d.bootstrap, "mtls", tls)
        try:
            # The daemon closes without a TLS alert (asyncio drops it), so the client cannot tell a
            # refusal from a restart: it retries, and its timeout says what it saw.
            with pytest.raises(cerr.KafkaError, match="require a client certificate"):
                c.committed([TopicPartition("t", 1)], timeout_s=3)
        finally:
            c.close(2)


def test_sasl_client_on_a_plaintext_listener_says_so(tmp_path):
    with Daemon(tmp_path / "data") as d:
        c = GroupConsumer(d.bootstrap, "g", security_protocol="SASL_PLAINTEXT", sasl_username="u", sasl_password="p")
        try:
            with pytest.raises(cerr.AuthenticationFailedError, match="does not take SASL.*check security.protocol"):
                c.committed([TopicPartition("t", 0)], timeout_s=10)
        finally:
            c.close(2)


# ---- the PySpark helpers (no Spark: run_member is a task's body) -----------------------------------


def test_a_spark_task_runs_with_the_jobs_security_settings(sasl_ssl, pki):
    job = GroupJob(sasl_ssl.bootstrap, "spark-secure", {TopicPartition("t", 0): 5, TopicPartition("t", 1): 5},
                   static_membership=True, config={**secure(pki, "SCRAM-SHA-256"), "session.timeout.ms": 6000})
    assert "secret" not in repr(job)
    done = []
    stats = run_member(job, lambda tp, start, end: done.append((tp, start, end)))
    assert stats["records"] == 10 and stats["left"]  # check_topics, the member, and its static leave
    assert describe_group(sasl_ssl.bootstrap, "spark-secure", config=job.config)["state"] == "Empty"
    assert len(partitions_for(sasl_ssl.bootstrap, "t", config=job.config)) == 2
    with pytest.raises(cerr.AuthenticationFailedError):
        partitions_for(sasl_ssl.bootstrap, "t", config=secure(pki, password="guess"))


# ---- herd groups --command-config -------------------------------------------------------------------


def groups(*args, timeout=30):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("HERD_BOOTSTRAP", None)
    r = subprocess.run([sys.executable, "-m", "herd_cli", "groups", *map(str, args)], capture_output=True,
                       text=True, cwd=str(REPO), env=env, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def test_herd_groups_with_a_java_command_config(sasl_ssl, pki, tmp_path):
    c = GroupConsumer(sasl_ssl.bootstrap, "cli-secure", secure(pki), enable_auto_commit=False)
    try:
        c.commit({TopicPartition("t", 1): 9})
    finally:
        c.close(5)
    props = tmp_path / "client.properties"
    props.write_text("\n".join([
        "security.protocol=SASL_SSL",
        "sasl.mechanism=SCRAM-SHA-512",
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\",
        f'    username="alice" password="{PASSWORD}";',
        "ssl.truststore.type=PEM",
        f"ssl.truststore.location={pki / 'ca.pem'}",
    ]) + "\n")
    r = groups("offsets", "cli-secure", "--bootstrap-server", sasl_ssl.bootstrap, "--command-config", props,
               "--output", "json")
    assert r.returncode == 0, r.stderr
    assert "9" in r.stdout and "cli-secure" in r.stdout
    # the same config for the data cluster (here the same daemon)
    r = groups("describe", "cli-secure", "--bootstrap-server", sasl_ssl.bootstrap, "--data-bootstrap-server",
               f"SASL_SSL://{sasl_ssl.bootstrap}", "--command-config", props)
    assert r.returncode == 0, r.stderr
    # librdkafka's names, a wrong password: one line, exit 2
    bad = tmp_path / "bad.properties"
    bad.write_text(f"security.protocol=SASL_SSL\nssl.ca.location={pki / 'ca.pem'}\nsasl.mechanism=PLAIN\n"
                   "sasl.username=alice\nsasl.password=guess\n")
    r = groups("list", "--bootstrap-server", sasl_ssl.bootstrap, "--command-config", bad)
    assert r.returncode == 2
    assert r.stderr.count("\n") == 1 and "SASL PLAIN authentication of 'alice' failed" in r.stderr, r.stderr
    # no config against a SASL_SSL listener: the daemon drops the plaintext request
    r = groups("list", "--bootstrap-server", sasl_ssl.bootstrap, "--timeout", "5")
    assert r.returncode == 2
    jks = tmp_path / "jks.properties"
    jks.write_text("security.protocol=SSL\nssl.truststore.location=/etc/kafka/truststore.jks\n"
                   "ssl.truststore.password=changeit\n")
    r = groups("list", "--bootstrap-server", sasl_ssl.bootstrap, "--command-config", jks)
    assert r.returncode == 2 and "JKS and PKCS12 stores are not supported" in r.stderr
