"""The gate at the edge, in process (a real Runtime behind a Connection on a fake transport): the
Heartbeat fast path follows ACL changes at once, the general path refuses before the runtime, and
ACLs created over the wire are replayed from the log."""
from __future__ import annotations

from coordinator.core.auth import acl as A
from coordinator.edge.authorization import build
from protocol import acls as W
from protocol import errors as E
from protocol import messages as m
from protocol.headers import decode_response_header
from tests.coordinator.edge.test_server_fastpath import HB, Edge, answers, decode, frame, run, until

DENY_G0 = A.Acl(A.GROUP, "g0", A.LITERAL, "User:ANONYMOUS", "*", A.READ, A.DENY)


def gated(edge):
    edge.server.gate = build(edge.config, edge.runtime.acls.authorizer, edge.runtime.catalog)
    return edge.server.gate


def test_heartbeat_fast_path_follows_acl_changes(tmp_path):
    async def main():
        async with Edge(tmp_path, authorizer="acl", allow_everyone_if_no_acl_found=True) as edge:
            gate = gated(edge)
            hb = await edge.member("g0")
            conn, tr = edge.connect()

            async def beat(cid):
                before = len(answers(tr.data))
                conn.data_received(frame(hb, HB, cid))
                await until(lambda: len(answers(tr.data)) > before, tr)
                return decode(answers(tr.data)[-1], 12, HB)[1].error_code

            assert await beat(1) == E.NONE
            gate.authorizer.add(DENY_G0)
            assert await beat(2) == E.GROUP_AUTHORIZATION_FAILED
            assert await beat(3) == E.GROUP_AUTHORIZATION_FAILED  # cached per connection, still refused
            gate.authorizer.remove(DENY_G0)
            assert await beat(4) == E.NONE
            # the general path: refused before the runtime
            gate.authorizer.add(DENY_G0)
            j = await edge.call(m.JoinGroupRequest(
                group_id="g0", session_timeout_ms=60_000, rebalance_timeout_ms=60_000, protocol_type="consumer",
                protocols=[m.JoinGroupRequestProtocol(name="range", metadata=b"")]), 3)
            assert j.error_code == E.GROUP_AUTHORIZATION_FAILED

    run(main())


def test_acls_created_over_the_wire_are_replayed_from_the_log(tmp_path):
    async def main():
        async with Edge(tmp_path, authorizer="acl", allow_everyone_if_no_acl_found=True) as edge:
            gated(edge)
            conn, tr = edge.connect()
            conn.data_received(frame(W.CreateAclsRequest([W.AclBindingData(
                A.GROUP, "g0", A.LITERAL, "User:ANONYMOUS", "*", A.READ, A.DENY)]), 3, 7))
            await until(lambda: tr.data, tr)  # answered once the record is in the log
            (body,) = answers(tr.data)
            _, pos = decode_response_header(body, W.CREATE_ACLS, 3)
            assert [x.error_code for x in W.CreateAclsResponse.decode(body, 3, pos).results] == [0]

    run(main())
    # a restart: the log's entries replayed by a new runtime rebuild the ACL
    from coordinator.config import Config
    from coordinator.core.catalog import Catalog
    from coordinator.core.coordinator import GroupCoordinator
    from coordinator.runtime import Runtime
    from coordinator.store.filelog import LogStore

    config = Config(data_dir=str(tmp_path), offsets_partitions=4, authorizer="acl")
    store = LogStore(tmp_path, 4, fsync="never")
    shards = store.open(latest_only=True)
    try:
        runtime = Runtime(config, GroupCoordinator(config.group_config(), node_id=0), Catalog(config, node_id=0),
                          store)
        runtime.replay(shards)
        assert runtime.acls.authorizer.acls() == [DENY_G0]
        assert not runtime.acls.authorizer.authorize("User:ANONYMOUS", "127.0.0.1", A.READ, A.GROUP, "g0")
    finally:
        store.close()


def test_a_describe_encoded_in_parts_carries_the_gates_refusals(tmp_path, monkeypatch):
    """A DescribeGroups answer encoded over several turns (ENCODE_SLICE_MEMBERS) carries the
    gate's refusals as the one-piece answer does (after the groups described, as Kafka's
    KafkaApis puts them)."""
    from coordinator.edge import server as edge_server

    async def main():
        async with Edge(tmp_path, authorizer="acl", allow_everyone_if_no_acl_found=True) as edge:
            gate = gated(edge)
            for i in range(4):
                await edge.member(f"g{i}")
            gate.authorizer.add(A.Acl(A.GROUP, "g0", A.LITERAL, "User:ANONYMOUS", "*", A.DESCRIBE, A.DENY))
            gate.authorizer.add(A.Acl(A.GROUP, "g2", A.LITERAL, "User:ANONYMOUS", "*", A.DESCRIBE, A.DENY))
            asked = ["g0", "g1", "g2", "g3"]
            whole = await edge.call(m.DescribeGroupsRequest(groups=asked), 5)
            monkeypatch.setattr(edge_server, "ENCODE_SLICE_MEMBERS", 2)
            conn, tr = edge.connect()
            conn.data_received(frame(m.DescribeGroupsRequest(groups=asked), 5, 1))
            assert not tr.data
            await until(lambda: tr.data, tr)
            (body,) = answers(tr.data)
            _, resp = decode(body, 15, 5)
            assert resp == whole
            assert [(g.group_id, g.error_code) for g in resp.groups] == [
                ("g1", E.NONE), ("g3", E.NONE), ("g0", E.GROUP_AUTHORIZATION_FAILED),
                ("g2", E.GROUP_AUTHORIZATION_FAILED)]

    run(main())
