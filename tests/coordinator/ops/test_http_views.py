"""With ``authorizer = acl`` the HTTP views (the console's JSON, /groups, the flight recorder, /metrics)
show a principal only what it may DESCRIBE (coordinator.core.auth.view): two teams with prefixed
group ACLs and topic ACLs, over a real GroupCoordinator (manual clock) and a fake log-end source."""
from __future__ import annotations

import asyncio
import json

import pytest

from coordinator.core.auth import acl as A
from coordinator.core.auth.view import EVERYTHING, view_for
from coordinator.ops.console import Console
from coordinator.ops.metrics import HttpEndpoint, Metrics, _json_array
from protocol import messages as m
from protocol.consumer import encode_assignment
from tests.coordinator.core.test_group_harness import Harness
from tests.coordinator.ops.test_console import FakeSource

HOST = "10.0.0.1"


def allow(principal, rtype, name, op=A.DESCRIBE, pattern=A.LITERAL):
    return A.Acl(rtype, name, pattern, principal, "*", op, A.ALLOW)


def authorizer():
    az = A.Authorizer(super_users={"User:admin"})
    for a in (allow("User:alice", A.GROUP, "team-a-", A.READ, A.PREFIXED),
              allow("User:bob", A.GROUP, "team-b-", A.READ, A.PREFIXED),
              allow("User:alice", A.TOPIC, "orders", A.READ), allow("User:bob", A.TOPIC, "orders", A.READ),
              allow("User:bob", A.TOPIC, "payments", A.READ),
              allow("User:ops", A.CLUSTER, A.CLUSTER_NAME)):
        az.add(a)
    return az


def body(answer) -> bytes:
    b = answer[2]
    return b if isinstance(b, (bytes, bytearray)) else b"".join(b)


@pytest.fixture
def setup():
    h = Harness(authorizer="acl", lag_refresh_interval_ms=30_000)
    h.commit("team-a-orders", {("orders", 0): 100, ("payments", 0): 10})
    h.commit("team-b-orders", {("orders", 0): 150, ("payments", 0): 40})
    src = FakeSource({("orders", 0): 200, ("payments", 0): 50})
    c = Console(h.config, h.gc, clock=h.clock, source=src, now_ms=lambda: h.now)
    c.table_ttl_s = 0
    asyncio.run(c.refresher.refresh())
    return h, c, authorizer()


def ids(page) -> list[str]:
    return [g["group_id"] for g in page["groups"]]


def test_the_view_of_each_principal():
    az = authorizer()
    alice = view_for(az, "User:alice", HOST)
    assert alice.group("team-a-x") and not alice.group("team-b-x") and not alice.group("other")
    assert alice.topic("orders") and not alice.topic("payments")
    assert not alice.all_groups and not alice.all_topics and not alice.metrics
    ops = view_for(az, "User:ops", HOST)  # CLUSTER DESCRIBE: every group (ListGroups' rule), not every topic
    assert ops.all_groups and ops.metrics and ops.group("team-b-x") and not ops.topic("orders")
    admin = view_for(az, "User:admin", HOST)
    assert admin.all_groups and admin.all_topics and admin.metrics
    anon = view_for(az, "User:ANONYMOUS", HOST)
    assert not anon.group("team-a-x") and not anon.metrics
    assert view_for(None, "User:ANONYMOUS", HOST) is EVERYTHING
    # DENY wins, host matters
    az.add(A.Acl(A.GROUP, "team-a-secret", A.LITERAL, "User:alice", "*", A.DESCRIBE, A.DENY))
    az.add(A.Acl(A.GROUP, "hosted", A.LITERAL, "User:carol", "10.0.0.9", A.DESCRIBE, A.ALLOW))
    assert not view_for(az, "User:alice", HOST).group("team-a-secret")
    assert not view_for(az, "User:carol", HOST).group("hosted")
    assert view_for(az, "User:carol", "10.0.0.9").group("hosted")


def test_the_group_list_shows_each_team_its_groups_summed_over_its_topics(setup):
    h, c, az = setup
    full = c.group_list({})
    assert ids(full) == ["team-a-orders", "team-b-orders"] and full["total"] == 2
    a = {g["group_id"]: g for g in full["groups"]}["team-a-orders"]
    assert (a["partitions"], a["lag"]) == (2, 100 + 40)
    alice = c.group_list({}, view_for(az, "User:alice", HOST))
    assert ids(alice) == ["team-a-orders"] and alice["total"] == 1 and alice["by_state"] == {"Empty": 1}
    [row] = alice["groups"]  # payments is not alice's: neither its partition nor its lag counts
    assert (row["partitions"], row["lag"], row["lag_partitions"]) == (1, 100, 1)
    bob = c.group_list({"sort": ["lag"]}, view_for(az, "User:bob", HOST))
    assert ids(bob) == ["team-b-orders"] and bob["groups"][0]["lag"] == 50 + 10
    nobody = c.group_list({}, view_for(az, "User:ANONYMOUS", HOST))
    assert nobody["groups"] == [] and nobody["total"] == 0 and nobody["by_state"] == {}
    ops = c.group_list({}, view_for(az, "User:ops", HOST))  # every group, but no topic it may describe
    assert ids(ops) == ["team-a-orders", "team-b-orders"] and {g["partitions"] for g in ops["groups"]} == {0}
    assert ids(c.group_list({}, view_for(az, "User:admin", HOST))) == ids(full)


def test_a_group_it_may_not_describe_is_403_known_or_not(setup):
    h, c, az = setup
    alice = view_for(az, "User:alice", HOST)
    status, _, raw, _ = c.route("/api/group", "id=team-b-orders", alice)
    assert status == 403 and json.loads(raw)["error_code"] == "GROUP_AUTHORIZATION_FAILED"
    unknown = c.route("/api/group", "id=team-b-nothing", alice)  # the same answer: existence not told
    assert unknown[0] == 403 and json.loads(unknown[2])["group_id"] == "team-b-nothing"
    assert c.route("/api/group", "id=team-a-nothing", alice)[0] == 404  # hers to describe, unknown
    status, _, raw, _ = c.route("/api/group", "id=team-a-orders", alice)
    assert status == 200
    assert [(p["topic"], p["lag"]) for p in json.loads(raw)["partitions"]] == [("orders", 100)]
    assert {p["topic"] for p in c.group_detail("team-a-orders")["partitions"]} == {"orders", "payments"}


def test_assignments_show_only_the_topics_it_may_describe(setup):
    h, c, az = setup
    mid, t = h.join_dynamic("team-a-live", client_id="c0")
    g = h.group("team-a-live")
    asg = encode_assignment(m.ConsumerProtocolAssignment(assigned_partitions=[
        m.ConsumerProtocolAssignmentTopicPartition("orders", [0]),
        m.ConsumerProtocolAssignmentTopicPartition("payments", [0])]))
    assert h.reply(h.sync("team-a-live", g.generation, mid, {mid: asg}, version=5)).error_code == 0
    d = c.group_detail("team-a-live", view_for(az, "User:alice", HOST))
    assert d["members"][0]["assignment"] == [("orders", [0])]
    assert [(p["topic"], p["owner"]) for p in d["partitions"]] == [("orders", mid)]
    full = c.group_detail("team-a-live")
    assert [t for t, _ in full["members"][0]["assignment"]] == ["orders", "payments"]


def test_the_endpoint_filters_groups_history_and_metrics(setup):
    h, c, az = setup
    http = HttpEndpoint(Metrics(), h.gc.iter_groups, lambda g: h.gc.group_history(g, h.now))
    http.console, http.authorizer = c, az
    alice, ops, admin = (view_for(az, p, HOST) for p in ("User:alice", "User:ops", "User:admin"))
    listed = json.loads(body(http.route("/groups", alice)))
    assert [g["group_id"] for g in listed] == ["team-a-orders"]
    assert len(json.loads(body(http.route("/groups", ops)))) == 2
    assert http.route("/groups/team-b-orders/history", alice)[0] == 403
    assert http.route("/groups/team-b-nothing/history", alice)[0] == 403
    assert http.route("/groups/team-a-orders/history", alice)[0] == 200
    assert http.route("/groups/team-a-nothing/history", alice)[0] == 404
    status, _, text = http.route("/metrics", alice)
    assert status == 403 and b"User:alice" in text and b"DESCRIBE on the cluster" in text
    assert http.route("/metrics", ops)[0] == 200 and http.route("/metrics", admin)[0] == 200
    assert http.route("/api/group?id=team-b-orders", alice)[0] == 403
    assert b"herd_http_forbidden_total 4" in body(http.route("/metrics", admin))
    assert http.route("/", alice)[0] == 200  # the page itself holds no data
    assert b"".join(_json_array([])) == b"[]\n"
