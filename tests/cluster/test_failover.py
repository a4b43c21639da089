"""A three-node cluster on loopback with a real PostgreSQL, driven by unmodified Kafka clients, with
nodes killed, paused and restarted and the database restarted, all under commit load.

What is checked, as the issue states it: every client finds its group's coordinator (on different
nodes) and the groups converge; after a failure the group is whole again, no acknowledged commit is
lost, no offset goes backwards, no partition is owned twice in any generation; a rolling restart
expels no member. Leases are short (``LEASE_MS``) so that a lapse takes about two seconds."""
from __future__ import annotations

import shutil
import time

import pytest

from coordinator.core.partitioning import shard_for
from protocol import errors as E
from tests.cluster.load import Committer, fetch_offset, find
from tests.cluster.nodes import Node
from tests.conformance.harness import Members, all_partitions, create_topic, wait_converged, wait_until

pytestmark = [pytest.mark.conformance, pytest.mark.integration, pytest.mark.slow]

LEASE_MS = 2000
SHARDS = 12
DELAY_MS = 1000  # initial_rebalance_delay_ms: see tests/conformance/conftest.py


@pytest.fixture
def members(tmp_path):
    ms = Members(tmp_path)
    try:
        yield ms
    finally:
        ms.cleanup()


@pytest.fixture
def nodes(tmp_path, pg):
    made = [Node(tmp_path, i, pg.url, lease_ms=LEASE_MS, offsets_partitions=SHARDS,
                 initial_rebalance_delay_ms=DELAY_MS) for i in (1, 2, 3)]
    for n in made:
        n.spawn()
    for n in made:
        n.wait_ready()
    try:
        yield made
    finally:
        for n in made:
            if n.proc is not None and n.proc.poll() is None:
                n.resume()
            n.stop()


def bootstrap(nodes) -> str:
    return ",".join(n.bootstrap for n in nodes)


def coordinator(nodes, group: str, timeout: float = 20.0):
    return wait_until(lambda: find(nodes, group), timeout, f"a coordinator for {group}")


def shared(nodes, timeout: float = 20.0):
    """Wait until each live node coordinates some group (its share of the shards is loaded)."""
    def ok():
        owners = {find(nodes, f"probe-{i}") for i in range(40)}
        return len({n.node_id for n in owners if n is not None}) == len([n for n in nodes if n.proc.poll() is None])
    wait_until(ok, timeout, "every node to own a share of the shards")


def same_shard(group: str, n: int) -> list[str]:
    """``n`` other group names that hash to ``group``'s shard (their commits load that shard)."""
    target = shard_for(group, SHARDS)
    return [g for g in (f"{group}-load-{i}" for i in range(2000)) if shard_for(g, SHARDS) == target][:n]


def no_partition_owned_twice(members) -> None:
    """In every generation, the members' reported assignments are disjoint."""
    by_gen: dict[int, dict[str, set]] = {}
    for mem in members:
        for ev in mem.snapshot():
            if ev["ev"] == "state" and ev["generation"] is not None:
                by_gen.setdefault(ev["generation"], {})[mem.name] = {tuple(p) for p in ev["partitions"]}
    for gen, owned in by_gen.items():
        flat = [p for parts in owned.values() for p in parts]
        assert len(flat) == len(set(flat)), f"generation {gen}: a partition owned twice: {owned}"


def member_ids(mem) -> set[str]:
    return {ev["member_id"] for ev in mem.snapshot() if ev["ev"] == "state" and ev.get("member_id")}


def test_unmodified_clients_find_coordinators_on_different_nodes_and_converge(nodes, members, tmp_path):
    from tests.conformance.test_kafkajs import JsMember, require_kafkajs

    if shutil.which("node") is None:
        pytest.skip("node not installed")
    require_kafkajs()
    shared(nodes)
    boot = bootstrap(nodes)
    create_topic(boot, "orders", 4)
    # one group per client library, named so that their coordinators are on different nodes
    clients = ["confluent", "kafka-python", "aiokafka", "kafkajs"]
    groups: dict[str, str] = {}
    used: set[int] = set()
    for i in range(200):
        if len(groups) == len(clients):
            break
        g = f"grp-{i}"
        owner = find(nodes, g)
        client = clients[len(groups)]
        if owner is not None and (owner.node_id not in used or len(used) == 3):
            groups[client] = g
            used.add(owner.node_id)
    assert len(used) == 3, groups
    started = {}
    for client, g in groups.items():
        if client == "kafkajs":
            ms = [JsMember(tmp_path, boot, f"js-{k}", group=g, topics=["orders"]) for k in range(2)]
            members.all.extend(ms)
        else:
            ms = [members.start(client, boot, g, ["orders"], f"{client}-{k}") for k in range(2)]
        started[client] = ms
    for ms in started.values():
        wait_converged(ms, all_partitions("orders", 4), 60)
        no_partition_owned_twice(ms)
    coordinators = {coordinator(nodes, g).node_id for g in groups.values()}
    assert coordinators == {1, 2, 3}


def test_sigkill_the_owner_under_commit_load(nodes, members):
    shared(nodes)
    boot = bootstrap(nodes)
    create_topic(boot, "kill", 6)
    group = "victim"
    ms = [members.start("confluent", boot, group, ["kill"], f"c{k}") for k in range(3)]
    gen = wait_converged(ms, all_partitions("kill", 6), 60)
    load = [Committer(nodes, g) for g in same_shard(group, 2) + ["elsewhere-a", "elsewhere-b"]]
    for c in load:
        c.start()
    wait_until(lambda: all(c.acks >= 20 for c in load), 20, "commits to flow")
    owner = coordinator(nodes, group)
    owner.kill()  # SIGKILL: no hand-over, its leases lapse
    killed_at = time.monotonic()
    wait_until(lambda: (c := find(nodes, group)) is not None and c is not owner, 20, "another node to take over")
    wait_until(lambda: all(c.last_ack_at > killed_at + 0.1 for c in load), 20, "commits to flow again")
    after = wait_converged(ms, all_partitions("kill", 6), 40)
    for c in load:
        c.stop()
    assert all(m.alive() for m in ms)
    assert after >= gen
    no_partition_owned_twice(ms)
    for c in load:
        assert c.unexpected == [] and c.backwards == [], (c.group, c.codes, c.backwards)
        assert fetch_offset(nodes, c.group) >= c.acked  # no acknowledged commit lost


def test_sigstop_past_the_lease_then_sigcont_steps_down(nodes, members):
    shared(nodes)
    group = "paused"
    load = [Committer(nodes, g) for g in same_shard(group, 3)]
    for c in load:
        c.start()
    wait_until(lambda: all(c.acks >= 20 for c in load), 20, "commits to flow")
    owner = coordinator(nodes, group)
    owner.pause()
    paused_at = time.monotonic()
    try:
        wait_until(lambda: (c := find(nodes, group)) is not None and c is not owner, 20,
                   "another node to take over the paused node's shard")
        wait_until(lambda: all(c.last_ack_at > paused_at + 0.1 for c in load), 20, "commits to flow again")
        # a commit sent to the paused node waits in its socket: the first thing it reads on waking
        stale = owner.client(timeout=20.0)
        from tests.cluster.load import commit_request
        cid = stale.send(commit_request(group, 10**9), 7)
        time.sleep(max(0.0, paused_at + 2 * LEASE_MS / 1000 - time.monotonic()))
    finally:
        owner.resume()
    from protocol import messages as m

    resp = stale.receive(m.OffsetCommitRequest.API_KEY, 7, cid)
    stale.close()
    assert resp.topics[0].partitions[0].error_code == E.NOT_COORDINATOR  # it stepped down first
    wait_until(lambda: "leases.self_fenced" in owner.logs() or "leases.lost" in owner.logs(), 10,
               "the paused node to log that it stepped down")
    time.sleep(1.0)
    for c in load:
        c.stop()
    for c in load:
        assert c.unexpected == [] and c.backwards == [], (c.group, c.codes, c.backwards)
        got = fetch_offset(nodes, c.group)
        assert c.acked <= got < 10**9  # nothing lost, and the paused node's write never landed
    shared(nodes)  # it rejoined the sharing


def test_rolling_restart_under_load_expels_no_member(nodes, members):
    shared(nodes)
    boot = bootstrap(nodes)
    create_topic(boot, "roll", 6)
    groups = ["roll-a", "roll-b"]
    ms = {g: [members.start("confluent", boot, g, ["roll"], f"{g}-{k}") for k in range(3)] for g in groups}
    gens = {g: wait_converged(ms[g], all_partitions("roll", 6), 60) for g in groups}
    ids = {mem.name: member_ids(mem) for g in groups for mem in ms[g]}
    load = [Committer(nodes, f"roll-load-{i}") for i in range(4)]
    for c in load:
        c.start()
    wait_until(lambda: all(c.acks >= 10 for c in load), 20, "commits to flow")
    for n in nodes:
        assert n.stop() == 0  # SIGTERM: its shards handed over
        n.start()
        shared(nodes)
        marks = {c.group: c.acks for c in load}
        wait_until(lambda marks=marks: all(c.acks > marks[c.group] for c in load), 20,
                   "commits to flow after a restart")
    for c in load:
        c.stop()
    for g in groups:
        assert wait_converged(ms[g], all_partitions("roll", 6), 30) == gens[g]  # no rebalance at all
        no_partition_owned_twice(ms[g])
        for mem in ms[g]:
            assert mem.alive() and member_ids(mem) == ids[mem.name]  # nobody expelled, nobody rejoined
            assert not any(ev["ev"] == "lost" for ev in mem.snapshot())
    for c in load:
        assert c.unexpected == [] and c.backwards == [], (c.group, c.codes, c.backwards)
        assert fetch_offset(nodes, c.group) >= c.acked


def test_database_restarted_under_load(nodes, members, pg):
    shared(nodes)
    boot = bootstrap(nodes)
    create_topic(boot, "dbr", 4)
    ms = [members.start("confluent", boot, "dbr-group", ["dbr"], f"d{k}") for k in range(2)]
    wait_converged(ms, all_partitions("dbr", 4), 60)
    load = [Committer(nodes, f"dbr-load-{i}") for i in range(4)]
    for c in load:
        c.start()
    wait_until(lambda: all(c.acks >= 10 for c in load), 20, "commits to flow")
    pg.server.stop()
    down_at = time.monotonic()
    try:
        time.sleep(1.0)
        acked_while_down = {c.group: c.acks for c in load}
        time.sleep(1.0)
        assert all(c.acks == acked_while_down[c.group] for c in load)  # nothing acknowledged without it
    finally:
        pg.server.start()
    wait_until(lambda: all(c.last_ack_at > down_at + 1 for c in load), 30, "commits to flow after the restart")
    wait_converged(ms, all_partitions("dbr", 4), 40)
    for c in load:
        c.stop()
    assert any(c.codes.get(E.COORDINATOR_NOT_AVAILABLE) for c in load), [c.codes for c in load]
    for c in load:
        assert c.unexpected == [] and c.backwards == [], (c.group, c.codes, c.backwards)
        assert fetch_offset(nodes, c.group) >= c.acked
    assert all(n.proc.poll() is None for n in nodes)  # no herd restart
