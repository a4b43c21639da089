"""The ACL APIs' codec (v1-3), the ACL records and their replay, the ACL APIs' answers."""
from __future__ import annotations

import pytest

from coordinator.core.auth import acl as A
from coordinator.core.auth.acls import AclManager, acl_key, decode_acl_key, is_acl_record
from coordinator.core.catalog import is_topic_record
from protocol import acls as W
from protocol import errors as E
from protocol.wire import ProtocolError


def binding(**kw):
    base = dict(resource_type=A.GROUP, resource_name="team-a-", pattern_type=A.PREFIXED, principal="User:alice",
                host="*", operation=A.READ, permission_type=A.ALLOW)
    base.update(kw)
    return W.AclBindingData(**base)


@pytest.mark.parametrize("version", [1, 2, 3])
def test_codec_round_trips(version):
    req = W.CreateAclsRequest([binding(), binding(resource_name="é", host="10.0.0.1")])
    got, end = W.CreateAclsRequest.decode_from(req.encode(version), 0, version)
    assert got == req and end == len(req.encode(version))
    d = W.DescribeAclsRequest(binding(resource_name=None, principal=None, host=None))
    assert W.DescribeAclsRequest.decode_from(d.encode(version), 0, version)[0] == d
    dl = W.DeleteAclsRequest([binding(resource_name=None)])
    assert W.DeleteAclsRequest.decode_from(dl.encode(version), 0, version)[0] == dl
    resp = W.DescribeAclsResponse(resources=[W.DescribeAclsResource(A.GROUP, "g", A.LITERAL, [
        W.AclDescription("User:a", "*", A.READ, A.ALLOW)])])
    assert W.DescribeAclsResponse.decode_from(resp.encode(version), 0, version)[0] == resp
    resp = W.DeleteAclsResponse(filter_results=[W.DeleteAclsFilterResult(0, None, [
        W.DeleteAclsMatchingAcl(0, None, binding())])])
    assert W.DeleteAclsResponse.decode_from(resp.encode(version), 0, version)[0] == resp
    resp = W.CreateAclsResponse(results=[W.CreateAclsResult(42, "bad")])
    assert W.CreateAclsResponse.decode_from(resp.encode(version), 0, version)[0].results == resp.results


@pytest.mark.parametrize("data", [b"", b"\x05", b"\x02\x03", b"\xff\xff\xff\x7f"])
def test_malformed_requests_raise_protocol_error(data):
    for cls in W.REQUESTS.values():
        with pytest.raises(ProtocolError):
            cls.decode_from(data, 0, 2)


def test_flexible_v2_bytes_are_kafkas():
    # CreateAcls v2: creations compact array of 1, GROUP, "g", LITERAL, "User:a", "*", READ, ALLOW, tags
    raw = W.CreateAclsRequest([W.AclBindingData(3, "g", 3, "User:a", "*", 3, 3)]).encode(2)
    assert raw == b"\x02\x03\x02g\x03\x07User:a\x02*\x03\x03\x00\x00"


def test_records_round_trip_and_are_not_topic_records():
    acl = A.Acl(A.TOPIC, "t", A.LITERAL, "User:bob", "10.0.0.1", A.WRITE, A.DENY)
    key = acl_key(acl)
    assert is_acl_record(key) and not is_topic_record(key)
    assert decode_acl_key(key) == acl
    with pytest.raises(ProtocolError):
        decode_acl_key(key[:-3])


def test_create_describe_delete_and_replay():
    mgr = AclManager(A.Authorizer())
    writes, resp = mgr.create(W.CreateAclsRequest([binding(), binding(), binding(resource_type=A.TRANSACTIONAL_ID),
                                                   binding(principal="alice")]))
    assert [(r.error_code, bool(r.error_message)) for r in resp.results] == [
        (0, False), (0, False), (E.INVALID_REQUEST, True), (E.INVALID_REQUEST, True)]
    assert resp.results[0].error_message == ""  # Kafka's success message: empty, not null
    assert len(writes) == 1  # the same ACL twice: written once
    d = mgr.describe(W.DescribeAclsRequest(W.AclBindingData(A.ANY, None, A.ANY, None, None, A.ANY, A.ANY)))
    assert [(r.resource_name, len(r.acls)) for r in d.resources] == [("team-a-", 1)]
    d = mgr.describe(W.DescribeAclsRequest(W.AclBindingData(A.GROUP, "team-a-x", A.MATCH, None, None, A.ANY, A.ANY)))
    assert [r.resource_name for r in d.resources] == ["team-a-"]
    assert mgr.describe(W.DescribeAclsRequest(W.AclBindingData(0, None, A.ANY, None, None, A.ANY, A.ANY))
                        ).error_code == E.INVALID_REQUEST
    # replay of the writes rebuilds the same ACLs elsewhere
    other = AclManager(A.Authorizer())
    for _, key, value in writes:
        other.replay(key, value)
    assert other.authorizer.acls() == mgr.authorizer.acls()
    dwrites, dresp = mgr.delete(W.DeleteAclsRequest([W.AclBindingData(A.GROUP, None, A.ANY, "User:alice", None,
                                                                      A.ANY, A.ANY)]))
    assert [ma.acl.resource_name for ma in dresp.filter_results[0].matching_acls] == ["team-a-"]
    assert dwrites[0][2] is None and len(mgr.authorizer) == 0
    for _, key, value in dwrites:
        other.replay(key, value)
    assert len(other.authorizer) == 0
    # a failed write turns every result into the error
    assert [r.error_code for r in dresp.as_error(15).filter_results] == [15]


def test_without_an_authorizer_the_acl_apis_answer_security_disabled():
    mgr = AclManager(A.Authorizer(), enabled=False)
    writes, resp = mgr.create(W.CreateAclsRequest([binding()]))
    assert not writes and resp.results[0].error_code == E.SECURITY_DISABLED
    assert mgr.describe(W.DescribeAclsRequest(binding())).error_code == E.SECURITY_DISABLED
