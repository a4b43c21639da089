"""``herd serve --store postgresql://...`` through the real CLI: one line for every failure to join, and
the routing of a three-node cluster (Metadata, FindCoordinator, NOT_COORDINATOR, DescribeCluster)."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import asyncpg
import pytest

from protocol import errors as E
from protocol import messages as m
from tests.cluster.nodes import Node, coordinator_of, find_coordinator, metadata
from tools.daemon import REPO
from tools.postgres import PASSWORD, _run_async

pytestmark = pytest.mark.integration


def serve(tmp_path, url: str, *args: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), HERD_STORE=url)
    env.pop("HERD_PORT", None)
    return subprocess.run([sys.executable, "-m", "coordinator", "serve", "--port", "0", "--data-dir",
                           str(tmp_path / "d"), "--log-format", "json", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=str(REPO), env=env)


def one_line_error(proc: subprocess.CompletedProcess) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("herd: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert PASSWORD not in proc.stderr + proc.stdout
    return errors[0]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_unreachable_database_at_start_is_one_line(tmp_path):
    port = _free_port()
    line = one_line_error(serve(tmp_path, f"postgresql://herd:{PASSWORD}@127.0.0.1:{port}/herd"))
    assert f"cannot reach the database at 127.0.0.1:{port}" in line and "***" in line


def test_refused_login_is_one_line(tmp_path, pg):
    line = one_line_error(serve(tmp_path, pg.server.tcp_url(pg.name, password="wrong-pw")))
    assert "refused the login of user 'herd'" in line and "wrong-pw" not in line


def test_missing_database_is_one_line(tmp_path, pg):
    line = one_line_error(serve(tmp_path, pg.server.tcp_url("no_such_db")))
    assert "database 'no_such_db' does not exist" in line


def test_mismatched_offsets_partitions_is_one_line(tmp_path, pg):
    with Node(tmp_path, 1, pg.url, offsets_partitions=12):
        pass
    line = one_line_error(serve(tmp_path, pg.url, "--offsets-partitions", "50", "--node-id", "2"))
    assert "offsets_partitions is 50 here but 12 in the cluster's database" in line


def test_duplicate_live_node_id_is_one_line(tmp_path, pg):
    with Node(tmp_path, 1, pg.url, lease_ms=1500) as first:
        started = time.monotonic()
        line = one_line_error(serve(tmp_path, pg.url, "--node-id", "1", "--offsets-partitions", "12",
                                    "--shard-lease-ms", "1500"))
        assert "node_id 1 is already live in this cluster" in line and f":{first.port}" in line
        assert time.monotonic() - started >= 1.5  # it waited a lease for a crashed node's row to lapse
        assert first.proc.poll() is None


def test_a_password_never_shows_in_logs(tmp_path, pg):
    with Node(tmp_path, 1, pg.tcp_url) as node:
        logs = node.logs()
    assert "postgresql://herd:***@127.0.0.1" in logs and PASSWORD not in logs


@pytest.fixture
def start_nodes(tmp_path, pg):
    made = []

    def start(ids=(1, 2, 3), **kw):
        nodes = [Node(tmp_path, i, pg.url, **kw) for i in ids]
        made.extend(nodes)
        for n in nodes:
            n.spawn()
        for n in nodes:
            n.wait_ready()
        return nodes

    yield start
    for n in made:
        n.stop()


@pytest.fixture
def three(start_nodes):
    return start_nodes()


async def _owners(url: str) -> dict[int, int]:
    conn = await asyncpg.connect(url)
    try:
        return {r["shard"]: r["owner"] for r in await conn.fetch(
            "SELECT shard, owner FROM herd_leases WHERE owner IS NOT NULL AND expires_at > now()")}
    finally:
        await conn.close()


def wait_shared(pg, nodes, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owners = _run_async(_owners(pg.url))
        counts = {n.node_id: sum(1 for o in owners.values() if o == n.node_id) for n in nodes}
        if len(owners) == 12 and all(c == 12 // len(nodes) for c in counts.values()):
            return owners
        time.sleep(0.1)
    raise AssertionError(f"shards not shared evenly: {owners}")


def test_three_nodes_route_groups_to_their_shards_owner(pg, three):
    from coordinator.core.partitioning import shard_for

    owners = wait_shared(pg, three)
    by_id = {n.node_id: n for n in three}
    groups = [f"group-{i}" for i in range(30)]

    def routing_settled():  # every node's routing view has seen the last acquisitions
        return all((r.error_code, r.node_id) == (E.NONE, owners[shard_for(g, 12)])
                   for via in three for g in groups for r in [find_coordinator(via.address, g)])

    deadline = time.monotonic() + 20.0
    while not routing_settled():
        assert time.monotonic() < deadline, "the nodes' routing views never agreed with the lease table"
        time.sleep(0.05)
    for node in three:
        md = metadata(node.address)
        assert sorted((b.node_id, b.host, b.port) for b in md.brokers) == \
            sorted((n.node_id, "127.0.0.1", n.port) for n in three)
        with node.client() as c:
            dc = c.call(m.DescribeClusterRequest(endpoint_type=1), 0)
        assert dc.error_code == E.NONE and sorted(b.broker_id for b in dc.brokers) == [1, 2, 3]
    seen = set()
    for group in groups:
        owner = owners[shard_for(group, 12)]
        seen.add(owner)
        for via in three:  # any node answers the owner of the group's shard
            r = find_coordinator(via.address, group)
            assert (r.error_code, r.node_id, r.port) == (E.NONE, owner, by_id[owner].port), (group, via.node_id)
        for node in three:  # a node asked about a group whose shard it does not own: NOT_COORDINATOR
            with node.client() as c:
                resp = c.call(m.OffsetFetchRequest(group_id=group, topics=None), 5)
            assert resp.error_code == (E.NONE if node.node_id == owner else E.NOT_COORDINATOR)
    assert seen == {1, 2, 3}


def test_sigterm_hands_shards_over_and_commits_survive(pg, start_nodes):
    three = start_nodes(lease_ms=60_000)  # nothing can lapse here: only a hand-over moves a shard
    owners = wait_shared(pg, three)
    group = "handed-over"
    owner = coordinator_of(three, group)
    assert commit_ok(owner, group, 42) == E.NONE
    started = time.monotonic()
    assert owner.stop() == 0
    assert "handing the shards over" in owner.logs()
    rest = [n for n in three if n is not owner]
    new = coordinator_of(rest, group, timeout=20.0)
    assert time.monotonic() - started < 20.0  # far inside the 60 s lease: handed over, not lapsed
    with new.client() as c:
        fetched = c.call(m.OffsetFetchRequest(group_id=group, topics=[
            m.OffsetFetchRequestTopic(name="t", partition_indexes=[0])]), 5)
    assert fetched.topics[0].partitions[0].committed_offset == 42
    assert len(owners) == 12


def commit(node, group: str, offset: int, partition: int = 0) -> int:
    with node.client(timeout=15.0) as c:
        resp = c.call(m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
            m.OffsetCommitRequestTopic(name="t", partitions=[
                m.OffsetCommitRequestPartition(partition_index=partition, committed_offset=offset)])]), 7)
    return resp.topics[0].partitions[0].error_code


def fetch(node, group: str, partition: int = 0) -> tuple[int, int]:
    with node.client(timeout=15.0) as c:
        resp = c.call(m.OffsetFetchRequest(group_id=group, topics=[
            m.OffsetFetchRequestTopic(name="t", partition_indexes=[partition])]), 5)
    return resp.error_code, resp.topics[0].partitions[0].committed_offset if resp.topics else -1


def commit_ok(node, group: str, offset: int, timeout: float = 10.0) -> int:
    """commit, retried while the shard is being loaded (COORDINATOR_LOAD_IN_PROGRESS: retriable)."""
    deadline = time.monotonic() + timeout
    while (code := commit(node, group, offset)) == E.COORDINATOR_LOAD_IN_PROGRESS and time.monotonic() < deadline:
        time.sleep(0.05)
    return code


def test_database_down_is_coordinator_not_available_then_recovers_without_restart(pg, start_nodes):
    (node,) = start_nodes(ids=(1,), lease_ms=2000)
    group = "outage"
    coordinator_of([node], group)
    assert commit_ok(node, group, 1) == E.NONE
    pid = node.proc.pid
    pg.server.stop()
    try:
        codes = {commit(node, group, 2)}  # the write fails in the database: never acknowledged
        assert codes == {E.COORDINATOR_NOT_AVAILABLE}
        deadline = time.monotonic() + 4.0  # past the lease: self-fenced, the routing view stale
        while time.monotonic() < deadline:
            codes.add(commit(node, group, 3))
            time.sleep(0.2)
        assert codes <= {E.COORDINATOR_NOT_AVAILABLE, E.NOT_COORDINATOR}, codes
        assert find_coordinator(node.address, group).error_code == E.COORDINATOR_NOT_AVAILABLE
    finally:
        pg.server.start()
    coordinator_of([node], group, timeout=30.0)
    deadline = time.monotonic() + 20.0
    while (code := commit(node, group, 4)) != E.NONE:
        assert code in (E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS, E.NOT_COORDINATOR), code
        assert time.monotonic() < deadline, "no recovery after the database came back"
        time.sleep(0.1)
    assert fetch(node, group) == (E.NONE, 4)
    assert node.proc.pid == pid and node.proc.poll() is None


def test_the_topic_catalog_lives_in_the_database(pg, three):
    a, b, c = three
    with a.client() as cl:
        made = cl.call(m.CreateTopicsRequest(topics=[m.CreateTopicsRequestCreatableTopic(
            name="shared", num_partitions=6, replication_factor=1, assignments=[], configs=[])],
            timeout_ms=5000), 5)
    assert made.topics[0].error_code == E.NONE
    tid = made.topics[0].topic_id
    # another node knows it by name at once (the first writer's record: same id, same partitions)
    md = metadata(b.address, [m.MetadataRequestTopic(name="shared")])
    assert (md.topics[0].error_code, md.topics[0].topic_id, len(md.topics[0].partitions)) == (E.NONE, tid, 6)
    # and lists it with every topic once its catalog was refreshed (every renewal interval)
    deadline = time.monotonic() + 10.0
    while not any(t.name == "shared" for t in metadata(c.address).topics):
        assert time.monotonic() < deadline, "node 3 never listed the topic made on node 1"
        time.sleep(0.1)
    # auto-created on two nodes at once: one record wins, both nodes answer with it
    md_b = metadata(b.address, [m.MetadataRequestTopic(name="auto")])
    md_c = metadata(c.address, [m.MetadataRequestTopic(name="auto")])
    assert md_b.topics[0].topic_id == md_c.topics[0].topic_id
    # it survives every node: a new node started later reads it from the database
    for n in three:
        n.stop()
    for n in three:
        n.start()
    md = metadata(a.address, [m.MetadataRequestTopic(name="shared")])
    assert (md.topics[0].topic_id, len(md.topics[0].partitions)) == (tid, 6)
