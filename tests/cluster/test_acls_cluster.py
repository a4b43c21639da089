"""The ACLs in a cluster: kept in PostgreSQL (herd_acls), a change made on one node applied by
every node within one lease tick, and read back at start."""
from __future__ import annotations

import time

import pytest

from protocol import acls as W
from protocol import errors as E
from protocol import messages as m
from tests.cluster.nodes import Node
from tools.rawclient import RawClient

pytestmark = pytest.mark.integration

GROUP, READ, DENY, ALLOW, LITERAL, ANY = 3, 3, 2, 3, 3, 1
DENY_ANONYMOUS = W.AclBindingData(GROUP, "locked", LITERAL, "User:ANONYMOUS", "*", READ, DENY)
EVERYTHING = W.AclBindingData(ANY, None, ANY, None, None, ANY, ANY)


def commit_code(node, group="locked"):
    with RawClient(node.address) as c:
        r = c.call(m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
            m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(partition_index=0,
                                                                            committed_offset=1)])]), 8)
    return r.topics[0].partitions[0].error_code


def allowed(node, group="locked"):
    """Not refused by the authorizer (which answers on any node, before the group is routed): the
    group's own node answers NONE, the others NOT_COORDINATOR."""
    return commit_code(node, group) in (E.NONE, E.NOT_COORDINATOR)


def acls_on(node):
    with RawClient(node.address) as c:
        r = c.call(W.DescribeAclsRequest(EVERYTHING), 3)
    assert r.error_code == 0
    return [(res.resource_name, a.principal, a.permission_type) for res in r.resources for a in res.acls]


def wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.1)
    return False


def test_an_acl_made_on_one_node_applies_on_every_node_and_survives_restarts(tmp_path, pg):
    # PLAINTEXT: everyone is User:ANONYMOUS; with no ACL at all everything is allowed
    args = ("--authorizer", "acl", "--allow-everyone-if-no-acl-found", "--topic", "t:1")
    a, b = Node(tmp_path, 1, pg.url, *args, lease_ms=1000), Node(tmp_path, 2, pg.url, *args, lease_ms=1000)
    try:
        for n in (a, b):
            n.spawn()
        for n in (a, b):
            n.wait_ready()
        assert wait_for(lambda: allowed(a) and allowed(b), 20)
        with RawClient(a.address) as c:
            r = c.call(W.CreateAclsRequest([DENY_ANONYMOUS]), 3)
        assert [x.error_code for x in r.results] == [0]
        started = time.monotonic()
        assert wait_for(lambda: commit_code(b) == E.GROUP_AUTHORIZATION_FAILED, 5), "node 2 never applied it"
        assert time.monotonic() - started < 2.5  # within a lease tick (renewals every lease/3), with slack
        assert acls_on(b) == [("locked", "User:ANONYMOUS", DENY)]
        assert allowed(a, "open")  # other groups: still no ACL names them
        for n in (a, b):
            n.stop()
        for n in (a, b):
            n.spawn()
        for n in (a, b):
            n.wait_ready()
        assert acls_on(a) == acls_on(b) == [("locked", "User:ANONYMOUS", DENY)]
        assert commit_code(b) == E.GROUP_AUTHORIZATION_FAILED
        with RawClient(b.address) as c:
            r = c.call(W.DeleteAclsRequest([EVERYTHING]), 3)
        assert len(r.filter_results[0].matching_acls) == 1
        assert wait_for(lambda: acls_on(a) == [] and allowed(a), 5)
    finally:
        for n in (a, b):
            n.stop()
