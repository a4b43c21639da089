"""The HTTP views with ``authorizer = acl`` on a real daemon: two teams with prefixed group ACLs, made
with confluent-kafka's AdminClient over SASL/PLAIN; over HTTP (``http_auth_file``: basic users and
bearer tokens, one naming ``User:prometheus``) each team's user sees only its groups and topics,
another team's group answers 403, /metrics needs CLUSTER DESCRIBE; without ``http_auth_file`` a
request is ``User:ANONYMOUS``."""
from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import subprocess
import sys

import pytest

from tests.integration.test_metrics import _metrics_port
from tools.daemon import REPO, Daemon

pytestmark = pytest.mark.integration
ck = pytest.importorskip("confluent_kafka")
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition  # noqa: E402
from confluent_kafka.admin import (  # noqa: E402
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

USERS = {"admin": "admin-pw", "alice": "alice-pw", "bob": "bob-pw"}
SCRAPER, PLAIN = "scrape-token", "unnamed-token"


def _sha(s: str) -> str:
    return hashlib.sha256(s.encode()).hexdigest()


def conf(d, user):
    return {"bootstrap.servers": d.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanisms": "PLAIN",
            "sasl.username": user, "sasl.password": USERS[user]}


def acl(principal, rtype, name, op, pattern=ResourcePatternType.LITERAL):
    return AclBinding(rtype, name, pattern, principal, "*", op, AclPermissionType.ALLOW)


def commit(d, user, group, offsets: dict):
    admin = AdminClient(conf(d, user))
    [f] = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
        group, [TopicPartition(t, p, o) for (t, p), o in offsets.items()])]).values()
    f.result(timeout=30)


@pytest.fixture(scope="module")
def herd(tmp_path_factory):
    base = tmp_path_factory.mktemp("httpauthz")
    users = base / "users"
    users.write_text("".join(f"{u}:{p}\n" for u, p in USERS.items()))
    users.chmod(0o600)
    auth = base / "http-auth"
    auth.write_text("".join(f"basic {u} {_sha(p)}\n" for u, p in USERS.items())
                    + f"bearer {_sha(SCRAPER)} User:prometheus\nbearer {_sha(PLAIN)}\n")
    with Daemon(base / "data", "--security-protocol", "SASL_PLAINTEXT", "--sasl-users-file", users,
                "--authorizer", "acl", "--super-users", "User:admin", "--metrics-port", "0",
                "--http-auth-file", auth, "--topic", "orders:2", "--topic", "payments:1") as d:
        d.metrics_port = _metrics_port(d)
        admin = AdminClient(conf(d, "admin"))
        G, T = ResourceType.GROUP, ResourceType.TOPIC
        for f in admin.create_acls([
                acl("User:alice", G, "team-a-", AclOperation.READ, ResourcePatternType.PREFIXED),
                acl("User:bob", G, "team-b-", AclOperation.READ, ResourcePatternType.PREFIXED),
                acl("User:alice", T, "orders", AclOperation.READ), acl("User:bob", T, "orders", AclOperation.READ),
                acl("User:bob", T, "payments", AclOperation.READ),
                acl("User:prometheus", ResourceType.BROKER, "kafka-cluster", AclOperation.DESCRIBE)]).values():
            assert f.result(timeout=30) is None
        commit(d, "alice", "team-a-orders", {("orders", 0): 5, ("orders", 1): 6})
        commit(d, "bob", "team-b-orders", {("orders", 0): 7})
        commit(d, "bob", "team-b-payments", {("payments", 0): 8})
        commit(d, "admin", "team-a-mixed", {("orders", 0): 1, ("payments", 0): 2})  # a topic alice may not see
        yield d


def get(d, path: str, user: str | None = None, token: str | None = None) -> tuple[int, bytes]:
    headers = {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{USERS[user]}".encode()).decode()
    elif token is not None:
        headers["Authorization"] = f"Bearer {token}"
    conn = http.client.HTTPConnection("127.0.0.1", d.metrics_port, timeout=10)
    try:
        conn.request("GET", path, headers=headers)
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def groups_seen(d, **who) -> dict[str, set]:
    """The groups each view lists for this credential: /groups, /api/groups."""
    status, raw = get(d, "/groups", **who)
    assert status == 200, raw
    status2, raw2 = get(d, "/api/groups?limit=500", **who)
    assert status2 == 200, raw2
    return {"/groups": {g["group_id"] for g in json.loads(raw)},
            "/api/groups": {g["group_id"] for g in json.loads(raw2)["groups"]}}


def test_each_team_sees_only_its_groups(herd):
    for seen in groups_seen(herd, user="alice").values():
        assert seen == {"team-a-orders", "team-a-mixed"}
    for seen in groups_seen(herd, user="bob").values():
        assert seen == {"team-b-orders", "team-b-payments"}
    every = {"team-a-orders", "team-a-mixed", "team-b-orders", "team-b-payments"}
    for seen in groups_seen(herd, user="admin").values():  # a super user
        assert seen == every
    for seen in groups_seen(herd, token=SCRAPER).values():  # CLUSTER DESCRIBE: every group, as ListGroups
        assert seen == every
    for seen in groups_seen(herd, token=PLAIN).values():  # an unnamed token is User:ANONYMOUS
        assert seen == set()


def test_another_team_s_group_is_refused_known_or_not(herd):
    for path in ("/api/group?id=team-b-orders", "/api/group?id=team-b-unknown", "/groups/team-b-orders/history",
                 "/groups/team-b-unknown/history"):
        status, raw = get(herd, path, user="alice")
        assert status == 403 and json.loads(raw)["error_code"] == "GROUP_AUTHORIZATION_FAILED", (path, raw)
    assert get(herd, "/api/group?id=team-a-unknown", user="alice")[0] == 404
    assert get(herd, "/groups/team-a-orders/history", user="alice")[0] == 200
    status, raw = get(herd, "/api/group?id=team-a-orders", user="alice")
    assert status == 200
    assert sorted((p["topic"], p["partition"], p["committed"]) for p in json.loads(raw)["partitions"]) == [
        ("orders", 0, 5), ("orders", 1, 6)]


def test_only_the_topics_it_may_describe(herd):
    status, raw = get(herd, "/api/group?id=team-a-mixed", user="alice")
    assert status == 200 and [p["topic"] for p in json.loads(raw)["partitions"]] == ["orders"]
    row = [g for g in json.loads(get(herd, "/api/groups", user="alice")[1])["groups"]
           if g["group_id"] == "team-a-mixed"]
    assert row[0]["partitions"] == 1
    status, raw = get(herd, "/api/group?id=team-a-mixed", user="admin")
    assert sorted(p["topic"] for p in json.loads(raw)["partitions"]) == ["orders", "payments"]


def test_metrics_need_cluster_describe(herd):
    status, raw = get(herd, "/metrics", user="alice")
    assert status == 403 and b"DESCRIBE on the cluster" in raw
    assert get(herd, "/metrics", token=PLAIN)[0] == 403
    status, raw = get(herd, "/metrics", token=SCRAPER)
    assert status == 200 and b'herd_group_last_commit_age_seconds{group="team-b-orders"}' in raw
    assert b"herd_http_forbidden_total" in raw
    assert get(herd, "/healthz")[0] == 200 and get(herd, "/", user="alice")[0] == 200


def test_the_cli_says_403_in_one_line(herd):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
    env.update(PYTHONPATH=str(REPO), HERD_HTTP_USER="alice", HERD_HTTP_PASSWORD=USERS["alice"])
    cmd = [sys.executable, "-m", "herd_cli", "groups", "history", "--http", f"127.0.0.1:{herd.metrics_port}"]
    r = subprocess.run([*cmd, "team-b-orders"], capture_output=True, text=True, timeout=60, env=env,
                       cwd=str(REPO), stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert "not authorized to describe group 'team-b-orders' (HTTP 403" in r.stderr
    r = subprocess.run([*cmd, "team-a-orders"], capture_output=True, text=True, timeout=60, env=env,
                       cwd=str(REPO), stdin=subprocess.DEVNULL)
    assert r.returncode == 0, r.stderr


def test_without_http_auth_file_a_request_is_anonymous(tmp_path):
    """No credential file: every HTTP request is User:ANONYMOUS from its address (ACL hosts apply)."""
    with Daemon(tmp_path / "data", "--authorizer", "acl", "--allow-everyone-if-no-acl-found", "--metrics-port", "0",
                "--topic", "orders:1") as d:
        d.metrics_port = _metrics_port(d)
        admin = AdminClient({"bootstrap.servers": d.bootstrap})  # kept: a dropped client never answers
        for g in ("g-open", "g-closed"):  # no ACL names them yet: allowed to everyone
            [f] = admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(
                g, [TopicPartition("orders", 0, 3)])]).values()
            f.result(timeout=30)
        assert groups_seen(d)["/groups"] == {"g-open", "g-closed"}
        deny = [AclBinding(rtype, name, ResourcePatternType.LITERAL, "User:ANONYMOUS", "127.0.0.1",
                           AclOperation.DESCRIBE, AclPermissionType.DENY)
                for rtype, name in ((ResourceType.GROUP, "g-closed"), (ResourceType.BROKER, "kafka-cluster"))]
        for f in admin.create_acls(deny).values():
            assert f.result(timeout=30) is None
        assert groups_seen(d) == {"/groups": {"g-open"}, "/api/groups": {"g-open"}}
        assert get(d, "/metrics")[0] == 403
        assert get(d, "/api/group?id=g-closed")[0] == 403 and get(d, "/api/group?id=g-open")[0] == 200
