"""herd with ``--authorizer acl`` against a real Kafka broker with StandardAuthorizer: the same ACLs
made with CreateAcls on both, then the same requests, allowed and denied, answers compared field by
field (tests/reference/differential.py normalises). Both listeners are PLAINTEXT (every client is
User:ANONYMOUS) with allow.everyone.if.no.acl.found, so the broker's own inter-broker traffic and
the scripts' set-up need no ACL; the resources the script names are decided by its ACLs."""
from __future__ import annotations

import time

import pytest

from protocol import acls as W
from protocol import messages as m
from tests.reference.differential import Run, compare, describe
from tools.daemon import Daemon

pytestmark = pytest.mark.reference

ANON = "User:ANONYMOUS"
GROUP, TOPIC, LITERAL, PREFIXED, ANY, MATCH = 3, 2, 3, 4, 1, 2
READ, DESCRIBE, DELETE, DENY, ALLOW = 3, 8, 6, 2, 3


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from tools.kafka_broker import KafkaBroker

    overrides = {"authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
                 "allow.everyone.if.no.acl.found": "true", "super.users": "User:nobody"}
    with KafkaBroker(tmp_path_factory.mktemp("kafka-acl"), overrides) as broker, \
            Daemon(tmp_path_factory.mktemp("herd-acl") / "data", "--authorizer", "acl",
                   "--allow-everyone-if-no-acl-found", "--super-users", "User:nobody") as herd:
        yield herd, broker


def acl(rtype, name, pattern, op, perm, principal=ANON):
    return W.AclBindingData(rtype, name, pattern, principal, "*", op, perm)


def script(r: Run):
    t, secret = r.topic("t", 2), r.topic("secret", 1)
    ok, no, ro = r.group("authz-ok"), r.group("authz-no"), r.group("authz-ro")
    c = r.conn()
    acls = [acl(GROUP, ok, LITERAL, READ, ALLOW), acl(GROUP, no, LITERAL, READ, DENY),
            acl(GROUP, ro, LITERAL, DESCRIBE, ALLOW), acl(TOPIC, t, LITERAL, READ, ALLOW),
            acl(TOPIC, secret, LITERAL, DESCRIBE, DENY), acl(TOPIC, secret, LITERAL, READ, DENY)]
    r.call(c, W.CreateAclsRequest(acls), 3, "create acls")
    mine = W.AclBindingData(ANY, None, ANY, ANON, None, ANY, ANY)
    deadline = time.monotonic() + 15  # Kafka applies ACLs from its metadata log a moment later
    while time.monotonic() < deadline:
        got = c.raw.call(m.DescribeGroupsRequest(groups=[no]), 5).groups[0].error_code
        if got == 30:
            break
        time.sleep(0.1)

    def commit(group, topics, label):
        r.call(c, m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
            m.OffsetCommitRequestTopic(name, [m.OffsetCommitRequestPartition(partition_index=0, committed_offset=7)])
            for name in topics]), 9, label)

    commit(ok, [t], "commit allowed")
    commit(ok, [t, secret], "commit, one topic denied")
    commit(no, [t], "commit, group denied")
    commit(ro, [t], "commit, group DESCRIBE only")
    r.call(c, m.OffsetFetchRequest(groups=[
        m.OffsetFetchRequestGroup(group_id=ok, topics=[m.OffsetFetchRequestTopics(t, [0]),
                                                       m.OffsetFetchRequestTopics(secret, [0])]),
        m.OffsetFetchRequestGroup(group_id=no, topics=None)]), 9, "fetch v9")
    r.call(c, m.OffsetFetchRequest(group_id=ro, topics=[m.OffsetFetchRequestTopic(t, [0])]), 7, "fetch v7 ro")
    r.call(c, m.OffsetFetchRequest(group_id=no, topics=None), 7, "fetch v7 denied")
    r.call(c, m.DescribeGroupsRequest(groups=[ok, no], include_authorized_operations=True), 5, "describe groups")
    r.call(c, m.FindCoordinatorRequest(key=no, key_type=0), 3, "find coordinator v3 denied")
    r.call(c, m.FindCoordinatorRequest(key_type=0, coordinator_keys=[ok, no]), 4, "find coordinator v4")
    r.call(c, m.JoinGroupRequest(group_id=no, session_timeout_ms=10000, rebalance_timeout_ms=5000, member_id="",
                                 protocol_type="consumer",
                                 protocols=[m.JoinGroupRequestProtocol(name="range", metadata=b"")]), 9, "join denied")
    r.call(c, m.HeartbeatRequest(group_id=no, generation_id=1, member_id="x"), 4, "heartbeat denied")
    r.call(c, m.DeleteGroupsRequest(groups_names=[ro, no]), 2, "delete groups")
    r.call(c, m.OffsetDeleteRequest(group_id=no, topics=[m.OffsetDeleteRequestTopic(t, [
        m.OffsetDeleteRequestPartition(0)])]), 0, "offset delete denied")
    md = c.raw.call(m.MetadataRequest(topics=[m.MetadataRequestTopic(name=t), m.MetadataRequestTopic(name=secret)],
                                      allow_auto_topic_creation=False), 9)
    # the brokers, cluster id and leaders differ between any two servers: the topics' answers only
    r.note("metadata", [{"name": x.name, "error_code": x.error_code, "partitions": len(x.partitions)}
                        for x in md.topics])
    r.call(c, W.DescribeAclsRequest(W.AclBindingData(GROUP, ok, MATCH, None, None, ANY, ANY)), 3, "describe acls")
    deleted = c.raw.call(W.DeleteAclsRequest([mine]), 3)
    # the order of the matching ACLs is the server's own (Kafka's: its ACL cache's)
    r.note("delete acls", [{"error_code": f.error_code, "error_message": f.error_message, "acls": [
        "|".join(map(str, x)) for x in sorted(
            (a.error_code, a.error_message or "", a.acl.resource_type, a.acl.resource_name, a.acl.pattern_type,
             a.acl.principal, a.acl.host, a.acl.operation, a.acl.permission_type) for a in f.matching_acls)]}
        for f in deleted.filter_results])


def test_authorization_answers_are_kafkas(servers):
    herd, broker = servers
    h, k = Run(herd.address, "herd"), Run(broker.address, "kafka")
    try:
        script(h)
        script(k)
        diffs = compare(h, k)
    finally:
        h.close()
        k.close()
    assert not diffs, "herd and Kafka differ:\n" + describe(diffs)
