"""Kafka's own kafka-acls tool (org.apache.kafka.tools.AclCommand from kafka-tools 4.4.0) adds,
lists and removes ACLs on herd (authorizer = acl, SASL/PLAIN), and what it adds is enforced."""
from __future__ import annotations

import subprocess

import pytest

from tools.daemon import Daemon
from tools.reference import classpath, java

pytestmark = [pytest.mark.reference, pytest.mark.conformance]

USERS = {"admin": "admin-pw", "alice": "alice-pw"}


@pytest.fixture(scope="module")
def herd(tmp_path_factory):
    d = tmp_path_factory.mktemp("kafka-acls")
    users = d / "users"
    users.write_text("".join(f"{u}:{p}\n" for u, p in USERS.items()))
    users.chmod(0o600)
    with Daemon(d / "data", "--security-protocol", "SASL_PLAINTEXT", "--sasl-users-file", users,
                "--authorizer", "acl", "--super-users", "User:admin", "--topic", "orders:1") as daemon:
        yield daemon


def kafka_acls(herd, tmp_path, user, *args) -> subprocess.CompletedProcess:
    props = tmp_path / f"{user}.properties"
    props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                     "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                     f'username="{user}" password="{USERS[user]}";\n')
    return subprocess.run([java(), "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", classpath(),
                           "org.apache.kafka.tools.AclCommand", "--bootstrap-server", herd.bootstrap,
                           "--command-config", str(props), *args],
                          capture_output=True, text=True, timeout=120)


def test_kafka_acls_adds_lists_and_removes_acls_on_herd(herd, tmp_path):
    r = kafka_acls(herd, tmp_path, "admin", "--add", "--allow-principal", "User:alice", "--operation", "Read",
                   "--group", "team-a-", "--resource-pattern-type", "prefixed")
    assert r.returncode == 0, r.stdout + r.stderr
    r = kafka_acls(herd, tmp_path, "admin", "--add", "--deny-principal", "User:alice", "--deny-host", "10.0.0.9",
                   "--operation", "Read", "--topic", "orders")
    assert r.returncode == 0, r.stdout + r.stderr
    r = kafka_acls(herd, tmp_path, "admin", "--list")
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "ResourcePattern(resourceType=GROUP, name=team-a-, patternType=PREFIXED)" in out
    assert "(principal=User:alice, host=*, operation=READ, permissionType=ALLOW)" in out
    assert "ResourcePattern(resourceType=TOPIC, name=orders, patternType=LITERAL)" in out
    assert "(principal=User:alice, host=10.0.0.9, operation=READ, permissionType=DENY)" in out
    r = kafka_acls(herd, tmp_path, "admin", "--list", "--group", "team-a-orders",
                   "--resource-pattern-type", "match")
    assert "name=team-a-, patternType=PREFIXED" in r.stdout and "TOPIC" not in r.stdout
    # alice may not manage ACLs
    r = kafka_acls(herd, tmp_path, "alice", "--add", "--allow-principal", "User:alice", "--operation", "All",
                   "--cluster")
    assert r.returncode == 1 and "ClusterAuthorizationException" in r.stdout, r.stdout + r.stderr
    r = kafka_acls(herd, tmp_path, "admin", "--remove", "--force", "--group", "team-a-",
                   "--resource-pattern-type", "prefixed")
    assert r.returncode == 0, r.stdout + r.stderr
    r = kafka_acls(herd, tmp_path, "admin", "--list")
    assert "team-a-" not in r.stdout and "name=orders" in r.stdout


def test_a_transactional_id_acl_is_refused_not_ignored(herd, tmp_path):
    r = kafka_acls(herd, tmp_path, "admin", "--add", "--allow-principal", "User:alice", "--operation", "Write",
                   "--transactional-id", "tx")
    assert "TRANSACTIONAL_ID ACLs are not supported" in r.stdout + r.stderr, r.stdout + r.stderr
