"""ACL authorization (authorizer = acl) against the real daemon over SASL/PLAIN, with unmodified
clients: confluent-kafka's AdminClient manages the ACLs; two teams with prefixed group ACLs; a
member of a group it may not READ gets its client's authorization error, not a hang; the ACLs
survive a restart; failures are counted."""
from __future__ import annotations

import json
import time
import urllib.error
import urllib.request

import pytest

from tools.daemon import Daemon

pytestmark = pytest.mark.integration
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import (  # noqa: E402
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

USERS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw"}
ANY = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                       AclPermissionType.ANY)


@pytest.fixture(scope="module")
def herd(tmp_path_factory):
    d = tmp_path_factory.mktemp("authz")
    users = d / "users"
    users.write_text("".join(f"{u}:{p}\n" for u, p in USERS.items()))
    users.chmod(0o600)
    daemon = Daemon(d / "data", "--security-protocol", "SASL_PLAINTEXT", "--sasl-users-file", users,
                    "--authorizer", "acl", "--super-users", "User:admin", "--metrics-port", "0",
                    "--topic", "orders:2", "--topic", "payments:1")
    with daemon:
        admin = AdminClient(conf(daemon, "admin"))
        acls = [team_acl("alice", "team-a-"), team_acl("bob", "team-b-"),
                topic_acl("alice", "orders"), topic_acl("bob", "orders"), topic_acl("bob", "payments")]
        for f in admin.create_acls(acls).values():
            assert f.result() is None
        yield daemon


def conf(d, user, **extra):
    return {"bootstrap.servers": d.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
            "sasl.username": user, "sasl.password": USERS[user], **extra}


def team_acl(user, prefix):
    return AclBinding(ResourceType.GROUP, prefix, ResourcePatternType.PREFIXED, f"User:{user}", "*",
                      AclOperation.READ, AclPermissionType.ALLOW)


def topic_acl(user, topic, op=AclOperation.READ):
    return AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, f"User:{user}", "*", op,
                      AclPermissionType.ALLOW)


def alter_offsets(admin, group, topic="orders", offset=5):
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    [f] = admin.alter_consumer_group_offsets(
        [ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, offset)])]).values()
    return f.result()


def error_name(exc) -> str:
    err = exc.args[0] if exc.args else exc
    return err.name() if hasattr(err, "name") else str(err)


def test_admin_client_lists_the_acls_it_created(herd):
    admin = AdminClient(conf(herd, "admin"))
    got = admin.describe_acls(ANY).result()
    assert {(b.restype, b.name, b.resource_pattern_type, b.principal) for b in got} == {
        (ResourceType.GROUP, "team-a-", ResourcePatternType.PREFIXED, "User:alice"),
        (ResourceType.GROUP, "team-b-", ResourcePatternType.PREFIXED, "User:bob"),
        (ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice"),
        (ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:bob"),
        (ResourceType.TOPIC, "payments", ResourcePatternType.LITERAL, "User:bob")}
    only_groups = AclBindingFilter(ResourceType.GROUP, None, ResourcePatternType.ANY, None, None,
                                   AclOperation.ANY, AclPermissionType.ANY)
    assert len(admin.describe_acls(only_groups).result()) == 2


def test_a_user_without_cluster_alter_cannot_manage_acls(herd):
    alice = AdminClient(conf(herd, "alice"))
    [f] = alice.create_acls([team_acl("alice", "team-b-")]).values()
    with pytest.raises(ck.KafkaException) as exc:
        f.result()
    assert error_name(exc.value) == "CLUSTER_AUTHORIZATION_FAILED"
    # DescribeAcls is answered CLUSTER_AUTHORIZATION_FAILED (the gate's tests check the answer);
    # librdkafka 2.16 hands that to the application as an empty list: nothing is shown to alice
    assert alice.describe_acls(ANY).result() == []


def test_team_a_cannot_reset_team_b_offsets_and_lists_only_its_groups(herd):
    alice, bob = AdminClient(conf(herd, "alice")), AdminClient(conf(herd, "bob"))
    alter_offsets(alice, "team-a-orders")
    alter_offsets(bob, "team-b-orders")
    with pytest.raises(ck.KafkaException) as exc:
        alter_offsets(alice, "team-b-orders", offset=0)
    assert error_name(exc.value) == "GROUP_AUTHORIZATION_FAILED"
    assert partition_error(alice, "team-a-orders", "payments") == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    listed = {g.group_id for g in alice.list_consumer_groups().result().valid}
    assert "team-a-orders" in listed and not any(g.startswith("team-b-") for g in listed)
    admin = AdminClient(conf(herd, "admin"))
    everything = {g.group_id for g in admin.list_consumer_groups().result().valid}
    assert {"team-a-orders", "team-b-orders"} <= everything


def test_deleting_the_topic_acl_refuses_the_commit_per_partition(herd):
    admin, alice = AdminClient(conf(herd, "admin")), AdminClient(conf(herd, "alice"))
    alter_offsets(alice, "team-a-del")
    f = AclBindingFilter(ResourceType.TOPIC, "orders", ResourcePatternType.LITERAL, "User:alice", None,
                         AclOperation.ANY, AclPermissionType.ANY)
    [deleted] = admin.delete_acls([f]).values()
    assert [b.principal for b in deleted.result()] == ["User:alice"]
    try:
        assert partition_error(alice, "team-a-del", "orders") == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED
    finally:
        for fut in admin.create_acls([topic_acl("alice", "orders")]).values():
            fut.result()
    assert partition_error(alice, "team-a-del", "orders") is None


def partition_error(admin, group, topic):
    """The partition's error code in the answer to an offset change (confluent-kafka reports a
    per-partition error on the partition, not as an exception)."""
    try:
        result = alter_offsets(admin, group, topic)
    except ck.KafkaException as exc:
        raise AssertionError(f"the whole request failed: {exc}") from None
    err = result.topic_partitions[0].error
    return err.code() if err is not None else None


def _poll_for_error(consumer, errors, seconds=20):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None and msg.error():
            return msg.error()
        if errors:
            return errors[0]
    return None


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_confluent_member_of_a_forbidden_group_gets_group_authorization_failed(herd, protocol):
    errors = []
    extra = {"group.protocol": protocol} if protocol == "consumer" else {"session.timeout.ms": 6000}
    c = ck.Consumer(conf(herd, "alice", **{"group.id": f"team-b-{protocol}", "error_cb": errors.append,
                                           "log_level": 0, **extra}))
    try:
        c.subscribe(["orders"])
        err = _poll_for_error(c, errors)
    finally:
        c.close()
    assert err is not None, "no error within 20 s"
    assert err.code() == ck.KafkaError.GROUP_AUTHORIZATION_FAILED, err


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_confluent_member_of_its_own_group_joins_and_commits(herd, protocol):
    errors = []
    extra = {"group.protocol": protocol} if protocol == "consumer" else {"session.timeout.ms": 6000}
    c = ck.Consumer(conf(herd, "alice", **{"group.id": f"team-a-{protocol}", "error_cb": errors.append,
                                           "enable.auto.commit": False, "log_level": 0, **extra}))
    try:
        c.subscribe(["orders"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not c.assignment() and not errors:
            c.poll(0.1)
        assert not errors, errors
        assert len(c.assignment()) == 2
        c.commit(offsets=[ck.TopicPartition("orders", 0, 42)], asynchronous=False)
        [got] = c.committed([ck.TopicPartition("orders", 0)], timeout=10)
        assert got.offset == 42
    finally:
        c.close()


def test_kafka_python_member_of_a_forbidden_group_gets_its_authorization_error(herd):
    kafka = pytest.importorskip("kafka")
    from kafka.errors import GroupAuthorizationFailedError

    k = kafka.KafkaConsumer("orders", bootstrap_servers=herd.bootstrap, group_id="team-b-kp",
                            security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN",
                            sasl_plain_username="alice", sasl_plain_password="alice-pw",
                            enable_auto_commit=False, request_timeout_ms=10000)
    try:
        with pytest.raises(GroupAuthorizationFailedError):
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                k.poll(timeout_ms=200)
    finally:
        k.close()


def test_failures_are_counted_and_logged_without_secrets(herd):
    port = next(json.loads(ln)["port"] for ln in herd.logs().splitlines() if '"metrics listening"' in ln)
    # with authorizer = acl, /metrics (every group's labels) needs CLUSTER DESCRIBE: an HTTP request
    # without http_auth_file is User:ANONYMOUS from its address
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
    assert refused.value.code == 403
    admin = AdminClient(conf(herd, "admin"))
    scrape = AclBinding(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL, "User:ANONYMOUS",
                        "127.0.0.1", AclOperation.DESCRIBE, AclPermissionType.ALLOW)
    [f] = admin.create_acls([scrape]).values()
    assert f.result(timeout=30) is None
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    finally:
        [f] = admin.delete_acls([AclBindingFilter(ResourceType.BROKER, "kafka-cluster", ResourcePatternType.LITERAL,
                                                  "User:ANONYMOUS", "127.0.0.1", AclOperation.DESCRIBE,
                                                  AclPermissionType.ALLOW)]).values()
        assert len(f.result(timeout=30)) == 1
    # a member of another team's group is refused at FindCoordinator already (GROUP DESCRIBE)
    assert 'herd_authorization_failures_total{resource_type="GROUP",operation="DESCRIBE"}' in text
    assert 'herd_authorization_failures_total{resource_type="CLUSTER",operation="ALTER"}' in text
    denials = herd.log_events("authorization failed")
    assert denials and {"principal", "host", "operation", "resource_type", "resource"} <= set(denials[0])
    assert not any(p in herd.logs() for p in USERS.values())


def test_acls_survive_a_restart(herd):
    admin = AdminClient(conf(herd, "admin"))
    before = admin.describe_acls(ANY).result()
    herd.restart()
    admin = AdminClient(conf(herd, "admin"))
    after = admin.describe_acls(ANY).result()
    assert sorted(map(str, after)) == sorted(map(str, before)) and len(after) == 5
    alice = AdminClient(conf(herd, "alice"))
    with pytest.raises(ck.KafkaException):
        alter_offsets(alice, "team-b-orders", offset=1)


def herd_acls(herd, tmp_path, user, *args):
    import subprocess
    import sys

    props = tmp_path / f"{user}.properties"
    props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\n"
                     "sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required "
                     f'username="{user}" password="{USERS[user]}";\n')
    return subprocess.run([sys.executable, "-m", "herd_cli", "acls", *args, "--bootstrap-server", herd.bootstrap,
                           "--command-config", str(props), "--output", "json"],
                          capture_output=True, text=True, timeout=60)


def test_herd_acls_add_list_remove(herd, tmp_path):
    r = herd_acls(herd, tmp_path, "admin", "add", "--allow-principal", "User:carol", "--operation", "Read",
                  "--operation", "Describe", "--group", "team-c-", "--resource-pattern-type", "prefixed")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["added"]) == 2
    r = herd_acls(herd, tmp_path, "admin", "list", "--group", "team-c-x", "--resource-pattern-type", "match")
    assert r.returncode == 0, r.stderr
    assert {(a["principal"], a["operation"], a["pattern_type"]) for a in json.loads(r.stdout)["acls"]} == {
        ("User:carol", "READ", "PREFIXED"), ("User:carol", "DESCRIBE", "PREFIXED")}
    r = herd_acls(herd, tmp_path, "alice", "list")
    assert r.returncode == 2 and "CLUSTER_AUTHORIZATION_FAILED" in r.stderr and "Traceback" not in r.stderr
    r = herd_acls(herd, tmp_path, "admin", "remove", "--group", "team-c-", "--resource-pattern-type", "prefixed")
    assert r.returncode == 0, r.stderr
    assert len(json.loads(r.stdout)["removed"]) == 2
    r = herd_acls(herd, tmp_path, "admin", "add", "--allow-principal", "alice", "--group", "g")
    assert r.returncode == 2 and "TYPE:NAME" in r.stderr


def test_tls_client_certificates_map_to_principals(tmp_path):
    """SSL with client certificates: the subject mapped by ssl_principal_mapping_rules is the
    principal (a super user here); another subject is refused; a subject no rule maps is closed."""
    trustme = pytest.importorskip("trustme")
    import ssl

    from protocol import errors as E
    from protocol import messages as m
    from tools.rawclient import RawClient

    ca = trustme.CA()
    ca.issue_cert("127.0.0.1").private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    certs = {}
    for name, ou in (("Alice", "ServiceUsers"), ("Bob", "ServiceUsers"), ("Eve", "Elsewhere")):
        cert = ca.issue_cert("client.example", common_name=name, organization_unit_name=ou)
        cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / f"{name}.pem"))
        certs[name] = tmp_path / f"{name}.pem"
    rules = "RULE:^CN=([^,]*),OU=ServiceUsers,.*$/$1/L"  # no DEFAULT: Eve's subject maps to nothing
    with Daemon(tmp_path / "data", "--security-protocol", "SSL", "--ssl-certfile", tmp_path / "server.pem",
                "--ssl-cafile", tmp_path / "ca.pem", "--ssl-client-auth", "required",
                "--ssl-principal-mapping-rules", rules, "--authorizer", "acl", "--super-users", "User:alice",
                "--topic", "t:1") as d:
        def commit(name):
            ctx = ssl.create_default_context(cafile=str(tmp_path / "ca.pem"))
            ctx.load_cert_chain(str(certs[name]))
            with RawClient(d.address, ssl_context=ctx) as c:
                r = c.call(m.OffsetCommitRequest(group_id="g", generation_id_or_member_epoch=-1, member_id="",
                                                 topics=[m.OffsetCommitRequestTopic("t", [
                                                     m.OffsetCommitRequestPartition(partition_index=0,
                                                                                    committed_offset=3)])]), 8)
            return r.topics[0].partitions[0].error_code

        assert commit("Alice") == E.NONE
        assert commit("Bob") == E.GROUP_AUTHORIZATION_FAILED
        with pytest.raises(OSError):  # ConnectionError (closed by herd) or a TLS error: no principal
            commit("Eve")
        assert d.proc.poll() is None
        denied = d.log_events("authorization failed")
        assert denied and denied[0]["principal"] == "User:bob"


@pytest.mark.parametrize("user,expected", [("alice", {("orders", 0), ("orders", 1)}),
                                           ("bob", {("orders", 0), ("orders", 1), ("payments", 0)})])
def test_a_consumer_protocol_regex_is_assigned_only_topics_the_member_may_describe(herd, user, expected):
    """KIP-848 with a regex (librdkafka sends SubscribedTopicRegex): as Kafka 4 resolves it, the topics
    the member may not DESCRIBE (payments, for alice) are left out of its assignment, no error."""
    errors = []
    group = {"alice": "team-a-regex", "bob": "team-b-regex"}[user]
    c = ck.Consumer(conf(herd, user, **{"group.id": group, "group.protocol": "consumer", "error_cb": errors.append,
                                        "enable.auto.commit": False, "log_level": 0}))
    try:
        c.subscribe(["^(orders|payments)$"])
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and len(c.assignment()) < len(expected) and not errors:
            c.poll(0.1)
        end = time.monotonic() + 2  # and nothing more arrives
        while time.monotonic() < end:
            c.poll(0.1)
        assert not errors, errors
        assert {(tp.topic, tp.partition) for tp in c.assignment()} == expected
        # the coordinator's own assignment (librdkafka would also drop a topic whose id its Metadata
        # does not show): described by the super user
        admin = AdminClient(conf(herd, "admin"))
        [f] = admin.describe_consumer_groups([group], request_timeout=10).values()
        [member] = f.result(timeout=15).members
        assert {(tp.topic, tp.partition) for tp in member.assignment.topic_partitions} == expected
    finally:
        c.close()


def test_a_consumer_protocol_subscription_naming_a_topic_it_may_not_describe_is_an_error(herd):
    """SubscribedTopicNames with a topic the member may not DESCRIBE: TOPIC_AUTHORIZATION_FAILED (Kafka 4)."""
    errors = []
    c = ck.Consumer(conf(herd, "alice", **{"group.id": "team-a-named", "group.protocol": "consumer",
                                           "error_cb": errors.append, "enable.auto.commit": False, "log_level": 0}))
    try:
        c.subscribe(["orders", "payments"])
        err = _poll_for_error(c, errors)
    finally:
        c.close()
    assert err is not None, "no error within 20 s"
    assert err.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED, err
