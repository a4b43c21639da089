"""The authorization point: which operation each request needs, the refusals' exact error codes,
and the parts of an answer put back or filtered (Kafka's KafkaApis)."""
from __future__ import annotations

from coordinator.core.auth import acl as A
from coordinator.core.auth.acl import Acl, Authorizer
from coordinator.core.auth.gate import Gate
from coordinator.edge.authorization import DenialReporter
from coordinator.ops.metrics import Counter
from protocol import acls as W
from protocol import errors as E
from protocol import messages as m

H = "127.0.0.1"
ALICE = "User:alice"


def gate(*acls, supers=(), topics=("t", "u", "secret")):
    z = Authorizer(frozenset(supers))
    for a in acls:
        z.add(a)
    denied = []
    from coordinator.core.auth.acls import ACL_APIS
    g = Gate(z, topic_exists=set(topics).__contains__, auto_create=True,
             on_denied=lambda *args: denied.append(args), acl_apis=ACL_APIS)
    g.denied = denied
    return g


def allow(rtype, name, op, pattern=A.LITERAL, principal=ALICE):
    return Acl(rtype, name, pattern, principal, "*", op, A.ALLOW)


def test_group_apis_need_group_read():
    g = gate(allow(A.GROUP, "mine", A.READ))
    for req, key in ((m.JoinGroupRequest(group_id="other", member_id=""), 11),
                     (m.SyncGroupRequest(group_id="other"), 14), (m.HeartbeatRequest(group_id="other"), 12),
                     (m.LeaveGroupRequest(group_id="other"), 13)):
        refusal, amend = g.check(ALICE, H, key, 3, req)
        assert refusal.error_code == E.GROUP_AUTHORIZATION_FAILED
        req.group_id = "mine"
        assert g.check(ALICE, H, key, 3, req) == (None, None)
    assert g.denied[0] == (ALICE, H, A.GROUP, A.READ, "other")


def test_offset_commit_group_then_topics_per_partition():
    g = gate(allow(A.GROUP, "g", A.READ), allow(A.TOPIC, "t", A.READ))
    req = m.OffsetCommitRequest(group_id="g", topics=[
        m.OffsetCommitRequestTopic("secret", [m.OffsetCommitRequestPartition(partition_index=0)]),
        m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(partition_index=1)])])
    refusal, amend = g.check(ALICE, H, 8, 8, req)
    assert refusal is None and [t.name for t in req.topics] == ["t"]
    resp = amend(m.OffsetCommitResponse(topics=[m.OffsetCommitResponseTopic("t", [
        m.OffsetCommitResponsePartition(1, 0)])]))
    assert [(t.name, [(p.partition_index, p.error_code) for p in t.partitions]) for t in resp.topics] == [
        ("secret", [(0, E.TOPIC_AUTHORIZATION_FAILED)]), ("t", [(1, 0)])]
    # no group READ: every partition GROUP_AUTHORIZATION_FAILED
    req = m.OffsetCommitRequest(group_id="h", topics=[
        m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(partition_index=0)])])
    refusal, _ = g.check(ALICE, H, 8, 8, req)
    assert refusal.topics[0].partitions[0].error_code == E.GROUP_AUTHORIZATION_FAILED


def test_a_describe_acl_does_not_allow_commits():
    g = gate(allow(A.GROUP, "g", A.DESCRIBE))
    req = m.OffsetCommitRequest(group_id="g", topics=[])
    assert g.check(ALICE, H, 8, 8, req)[0] is not None
    fetch = m.OffsetFetchRequest(group_id="g", topics=None)
    assert g.check(ALICE, H, 9, 7, fetch)[0] is None  # DESCRIBE is enough to fetch


def test_offset_fetch_v8_per_group_and_topic():
    g = gate(allow(A.GROUP, "g", A.DESCRIBE), allow(A.TOPIC, "t", A.DESCRIBE))
    req = m.OffsetFetchRequest(groups=[
        m.OffsetFetchRequestGroup(group_id="g", topics=[m.OffsetFetchRequestTopics("t", [0]),
                                                        m.OffsetFetchRequestTopics("secret", [0])]),
        m.OffsetFetchRequestGroup(group_id="other", topics=None)])
    refusal, amend = g.check(ALICE, H, 9, 8, req)
    assert refusal is None and [x.group_id for x in req.groups] == ["g"]
    assert [t.name for t in req.groups[0].topics] == ["t"]
    resp = amend(m.OffsetFetchResponse(groups=[m.OffsetFetchResponseGroup("g", [
        m.OffsetFetchResponseTopics("t", [m.OffsetFetchResponsePartitions(0, 5, -1, "", 0)])], 0)]))
    assert [(x.group_id, x.error_code) for x in resp.groups] == [("g", 0), ("other", E.GROUP_AUTHORIZATION_FAILED)]
    assert [(t.name, t.partitions[0].error_code, t.partitions[0].committed_offset)
            for t in resp.groups[0].topics] == [("t", 0, 5), ("secret", E.TOPIC_AUTHORIZATION_FAILED, -1)]


def test_offset_fetch_of_every_topic_shows_only_describable_ones():
    g = gate(allow(A.GROUP, "g", A.READ), allow(A.TOPIC, "t", A.READ))
    refusal, amend = g.check(ALICE, H, 9, 5, m.OffsetFetchRequest(group_id="g", topics=None))
    resp = amend(m.OffsetFetchResponse(topics=[
        m.OffsetFetchResponseTopic("t", []), m.OffsetFetchResponseTopic("secret", [])]))
    assert [t.name for t in resp.topics] == ["t"]


def test_list_groups_filtered_unless_cluster_describe():
    g = gate(allow(A.GROUP, "team-a-", A.DESCRIBE, pattern=A.PREFIXED))
    _, amend = g.check(ALICE, H, 16, 4, m.ListGroupsRequest())
    resp = amend(m.ListGroupsResponse(groups=[m.ListGroupsResponseListedGroup(group_id=x)
                                              for x in ("team-a-1", "team-b-1")]))
    assert [x.group_id for x in resp.groups] == ["team-a-1"]
    g.authorizer.add(allow(A.CLUSTER, "kafka-cluster", A.DESCRIBE))
    assert g.check(ALICE, H, 16, 4, m.ListGroupsRequest()) == (None, None)


def test_describe_and_delete_groups_per_group():
    g = gate(allow(A.GROUP, "g", A.DELETE))
    req = m.DescribeGroupsRequest(groups=["g", "x"], include_authorized_operations=True)
    _, amend = g.check(ALICE, H, 15, 5, req)
    assert req.groups == ["g"]  # DELETE implies DESCRIBE
    resp = amend(m.DescribeGroupsResponse(groups=[m.DescribeGroupsResponseDescribedGroup(group_id="g")]))
    assert [(x.group_id, x.error_code) for x in resp.groups] == [("g", 0), ("x", E.GROUP_AUTHORIZATION_FAILED)]
    assert resp.groups[0].authorized_operations == (1 << A.DELETE) | (1 << A.DESCRIBE)
    req = m.DeleteGroupsRequest(groups_names=["x"])
    refusal, _ = g.check(ALICE, H, 42, 2, req)
    assert [(r.group_id, r.error_code) for r in refusal.results] == [("x", E.GROUP_AUTHORIZATION_FAILED)]


def test_metadata_hides_and_refuses_topics():
    g = gate(allow(A.TOPIC, "t", A.DESCRIBE))
    req = m.MetadataRequest(topics=[m.MetadataRequestTopic(name="t"), m.MetadataRequestTopic(name="secret"),
                                    m.MetadataRequestTopic(name="new")], allow_auto_topic_creation=True)
    _, amend = g.check(ALICE, H, 3, 12, req)
    assert [t.name for t in req.topics] == ["t"]
    resp = amend(m.MetadataResponse(topics=[m.MetadataResponseTopic(name="t")]))
    assert [(t.name, t.error_code) for t in resp.topics] == [
        ("t", 0), ("secret", E.TOPIC_AUTHORIZATION_FAILED), ("new", E.TOPIC_AUTHORIZATION_FAILED)]
    _, amend = g.check(ALICE, H, 3, 12, m.MetadataRequest(topics=None))
    resp = amend(m.MetadataResponse(topics=[m.MetadataResponseTopic(name="t"),
                                            m.MetadataResponseTopic(name="secret")]))
    assert [t.name for t in resp.topics] == ["t"]


def test_create_topics_needs_cluster_or_topic_create():
    g = gate(allow(A.TOPIC, "mine-", A.CREATE, pattern=A.PREFIXED))
    req = m.CreateTopicsRequest(topics=[m.CreateTopicsRequestCreatableTopic(name="mine-1"),
                                        m.CreateTopicsRequestCreatableTopic(name="x")])
    _, amend = g.check(ALICE, H, 19, 7, req)
    assert [t.name for t in req.topics] == ["mine-1"]
    resp = amend(m.CreateTopicsResponse(topics=[m.CreateTopicsResponseCreatableTopicResult(name="mine-1")]))
    assert [(t.name, t.error_code) for t in resp.topics] == [("mine-1", 0), ("x", E.TOPIC_AUTHORIZATION_FAILED)]
    g.authorizer.add(allow(A.CLUSTER, "kafka-cluster", A.CREATE))
    assert g.check(ALICE, H, 19, 7, m.CreateTopicsRequest(topics=[])) == (None, None)


def test_acl_apis_need_cluster_alter_or_describe():
    g = gate(allow(A.CLUSTER, "kafka-cluster", A.DESCRIBE))
    assert g.check(ALICE, H, W.DESCRIBE_ACLS, 3, W.DescribeAclsRequest()) == (None, None)
    refusal, _ = g.check(ALICE, H, W.CREATE_ACLS, 3, W.CreateAclsRequest([W.AclBindingData()]))
    assert [r.error_code for r in refusal.results] == [E.CLUSTER_AUTHORIZATION_FAILED]
    refusal, _ = g.check("User:bob", H, W.DESCRIBE_ACLS, 3, W.DescribeAclsRequest())
    assert refusal.error_code == E.CLUSTER_AUTHORIZATION_FAILED
    assert g.check("User:root", H, W.DELETE_ACLS, 3, W.DeleteAclsRequest([])) != (None, None)
    assert gate(supers={"User:root"}).check("User:root", H, W.DELETE_ACLS, 3, W.DeleteAclsRequest([])) == (None, None)


def test_consumer_group_heartbeat_needs_group_read_and_topic_describe():
    g = gate(allow(A.GROUP, "g", A.READ), allow(A.TOPIC, "t", A.READ))
    req = m.ConsumerGroupHeartbeatRequest(group_id="g", subscribed_topic_names=["t", "secret"])
    refusal, _ = g.check(ALICE, H, 68, 0, req)
    assert refusal.error_code == E.TOPIC_AUTHORIZATION_FAILED
    req = m.ConsumerGroupHeartbeatRequest(group_id="h")
    assert g.check(ALICE, H, 68, 0, req)[0].error_code == E.GROUP_AUTHORIZATION_FAILED


def test_fast_path_cache_follows_acl_changes():
    g = gate()
    cache = {}
    assert not g.group_read(cache, ALICE, H, "g")
    g.authorizer.add(allow(A.GROUP, "g", A.READ))
    assert g.group_read(cache, ALICE, H, "g")
    assert g.group_read(cache, ALICE, H, "g")
    g.authorizer.remove(allow(A.GROUP, "g", A.READ))
    assert not g.group_read(cache, ALICE, H, "g")


def test_denials_counted_always_logged_once_a_second_per_principal(capsys):
    now = [100.0]
    counter = Counter("herd_authorization_failures_total", "x", ("resource_type", "operation"))
    rep = DenialReporter(counter, clock=lambda: now[0])
    logged = []
    import coordinator.edge.authorization as audit
    real = audit.log
    audit.log = type("L", (), {"info": lambda self, event, **kw: logged.append(kw)})()
    try:
        for _ in range(5):
            rep(ALICE, H, A.GROUP, A.READ, "g")
        rep("User:bob", H, A.TOPIC, A.READ, "t")
        now[0] += 1.5
        rep(ALICE, H, A.GROUP, A.READ, "g")
    finally:
        audit.log = real
    assert counter.values == {("GROUP", "READ"): 6, ("TOPIC", "READ"): 1}
    assert [(x["principal"], x["not_logged_since"]) for x in logged] == [(ALICE, 0), ("User:bob", 0), (ALICE, 4)]
    assert 'herd_authorization_failures_total{resource_type="GROUP",operation="READ"} 6' in counter.render()


def test_a_refused_join_names_no_member_as_kafka():
    refusal, _ = gate().check(ALICE, H, 11, 7, m.JoinGroupRequest(group_id="g", member_id="m-1"))
    assert (refusal.error_code, refusal.member_id, refusal.generation_id) == (E.GROUP_AUTHORIZATION_FAILED, "", -1)


def test_cluster_authorized_operations_are_zero_without_cluster_describe():
    g = gate(allow(A.CLUSTER, "kafka-cluster", A.CREATE))
    req = m.DescribeClusterRequest(include_cluster_authorized_operations=True)
    _, amend = g.check(ALICE, H, 60, 1, req)
    assert amend(m.DescribeClusterResponse()).cluster_authorized_operations == 0
    g.authorizer.add(allow(A.CLUSTER, "kafka-cluster", A.DESCRIBE))
    _, amend = g.check(ALICE, H, 60, 1, req)
    assert amend(m.DescribeClusterResponse()).cluster_authorized_operations == (1 << A.CREATE) | (1 << A.DESCRIBE)


def test_consumer_group_describe_hides_a_group_naming_a_topic_it_may_not_describe():
    """Kafka 4 (KAFKA-18813): a described group whose members' assignment or target assignment names
    a topic the client may not DESCRIBE is answered TOPIC_AUTHORIZATION_FAILED, without members."""
    g = gate(allow(A.GROUP, "g", A.READ), allow(A.GROUP, "h", A.READ), allow(A.TOPIC, "t", A.READ))

    def described(gid, current, target):
        def asg(names):
            return m.ConsumerGroupDescribeResponseAssignment(topic_partitions=[
                m.ConsumerGroupDescribeResponseTopicPartitions(topic_id=bytes(16), topic_name=n, partitions=[0])
                for n in names])
        return m.ConsumerGroupDescribeResponseDescribedGroup(group_id=gid, group_state="Stable", members=[
            m.ConsumerGroupDescribeResponseMember(member_id="m1", assignment=asg(current),
                                                  target_assignment=asg(target))])
    req = m.ConsumerGroupDescribeRequest(group_ids=["g", "h", "x"], include_authorized_operations=True)
    refusal, amend = g.check(ALICE, H, 69, 0, req)
    assert refusal is None and req.group_ids == ["g", "h"]
    resp = amend(m.ConsumerGroupDescribeResponse(groups=[described("g", ["t"], ["t"]),
                                                         described("h", ["t"], ["secret"])]))
    got = {x.group_id: x for x in resp.groups}
    assert got["g"].error_code == 0 and len(got["g"].members) == 1
    assert got["g"].authorized_operations == (1 << A.READ) | (1 << A.DESCRIBE)
    assert got["h"].error_code == E.TOPIC_AUTHORIZATION_FAILED and got["h"].members == []
    assert got["h"].error_message == "The group has described topic(s) that the client is not authorized to describe."
    assert got["x"].error_code == E.GROUP_AUTHORIZATION_FAILED
    assert (ALICE, H, A.TOPIC, A.DESCRIBE, "secret") in g.denied


def test_a_consumer_group_heartbeat_s_token_carries_the_client_s_topic_describe():
    from types import SimpleNamespace

    g = gate(allow(A.GROUP, "g", A.READ), allow(A.TOPIC, "orders.", A.DESCRIBE, A.PREFIXED))
    token = SimpleNamespace(topic_filter=None)
    req = m.ConsumerGroupHeartbeatRequest(group_id="g", subscribed_topic_regex=r"orders\..*")
    assert g.check(ALICE, H, 68, 1, req, token) == (None, None)
    may = token.topic_filter
    assert may("orders.eu") and not may("payments")
    assert may.generation == g.authorizer.generation
    assert not g.denied  # topics left out of a regex are not denials
    refused = SimpleNamespace(topic_filter=None)
    g.check("User:bob", H, 68, 1, m.ConsumerGroupHeartbeatRequest(group_id="g"), refused)
    assert refused.topic_filter is None  # refused: it never reaches the core
