"""ClusterNode, the runtime's side of the leases, with the manual clock and a fake store: the
self-fencing check on the request path, the reload of a shard whose write failed in the database,
and the order of a hand-over. (The same paths against a real database and real processes:
test_serve.py, test_failover.py.)"""
from __future__ import annotations

import asyncio

from coordinator.clock import ManualClock
from coordinator.cluster.errors import StoreUnavailableError
from coordinator.cluster.leases import LeaseManager
from coordinator.cluster.node import ClusterNode
from coordinator.cluster.url import parse_store_url
from coordinator.config import Config
from coordinator.core.catalog import Catalog
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.versions import OFFSET_COMMIT, OFFSET_FETCH
from coordinator.runtime import ACTIVE, FAILED, NOT_OWNED, Runtime
from protocol import errors as E
from protocol import messages as m
from tests.coordinator.test_runtime_shards import FakeStore, commit, commit_code, group_in, send, settle

N = 4
LEASE_MS = 3000  # margin 600: a shard renewed by a request sent at t is served until t + 2400


class PgLikeStore(FakeStore):
    """FakeStore plus PgStore's ownership calls."""

    def __init__(self):
        super().__init__(owned=[])
        for gate in self.gates.values():
            gate.set()
        self.granted: dict[int, int] = {}
        self.disowned: list[int] = []
        self.drains = 0
        self.drain_gate = asyncio.Event()
        self.drain_gate.set()
        self.topics: dict[str, bytes] = {}  # herd_topics: name -> record, first writer wins

    async def load_topics(self):
        return list(self.topics.items())

    async def put_topic(self, name, record):
        return self.topics.setdefault(name, record)

    def grant(self, shard, epoch):
        self.granted[shard] = epoch

    def disown(self, shard):
        self.disowned.append(shard)

    async def drain(self):
        self.drains += 1
        await self.drain_gate.wait()


async def make_node(topics=()):
    clock = ManualClock()
    config = Config(offsets_partitions=N, initial_rebalance_delay_ms=0, shard_lease_ms=LEASE_MS,
                    store="postgresql://u@127.0.0.1:1/db", topics=topics)
    store = PgLikeStore()
    node = ClusterNode(config, store, clock)
    catalog = Catalog(config, node_id=0, routing=node.routing)
    rt = Runtime(config, GroupCoordinator(config.group_config(), node_id=0), catalog, store, clock=clock,
                 ownership=node, topic_store=node)
    node.attach(rt)
    rt.start(asyncio.get_running_loop())
    node.leases = LeaseManager(parse_store_url(config.store), 0, N, node, host="h", port=1, lease_ms=LEASE_MS,
                               clock=clock)  # never started: the table is driven by hand
    return clock, store, rt, node


async def test_the_request_path_fences_a_shard_whose_lease_may_have_lapsed():
    clock, store, rt, node = await make_node()
    node.leases.table.granted(0, 5, sent_ms=clock.monotonic_ms())
    await node.acquired(0, 5)
    assert store.granted == {0: 5} and rt.shard_states[0] == ACTIVE
    clock.advance(2399)  # no timer runs here: only the request path can notice
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(0)))
    await settle()
    assert commit_code(t) == E.NONE
    clock.advance(1)  # the self-fencing deadline: t + lease - margin
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(0)))
    await settle()
    assert commit_code(t) == E.NOT_COORDINATOR
    assert rt.shard_states[0] == NOT_OWNED and store.disowned == [0] and node.leases.losses == 1
    hb = m.HeartbeatRequest(group_id=group_in(0), generation_id=1, member_id="x")
    assert rt.heartbeat(3, hb) == E.NOT_COORDINATOR
    rt.shutdown()


async def test_a_renewed_lease_moves_the_fencing_point_on():
    clock, store, rt, node = await make_node()
    node.leases.table.granted(1, 2, sent_ms=0)
    await node.acquired(1, 2)
    clock.advance(1000)
    node.leases.table.renewed([1], sent_ms=clock.monotonic_ms())
    clock.advance(2000)  # 3000: past the first deadline (2400), before the renewed one (3400)
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(1)))
    await settle()
    assert commit_code(t) == E.NONE and rt.shard_states[1] == ACTIVE
    clock.advance(400)
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(1)))
    await settle()
    assert commit_code(t) == E.NOT_COORDINATOR
    rt.shutdown()


async def test_a_write_failed_in_the_database_reloads_the_shard_with_a_new_epoch():
    clock, store, rt, node = await make_node()
    reloads = []
    node.leases.request_reload = reloads.append
    node.leases.table.granted(2, 7, sent_ms=0)
    await node.acquired(2, 7)
    store.fail[2] = StoreUnavailableError("shard 2: write failed: connection lost", 2)
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(2)))
    await settle()
    assert commit_code(t) == E.COORDINATOR_NOT_AVAILABLE
    assert rt.shard_states[2] == FAILED and reloads == [2]
    # the lease manager took it again with epoch + 1: loaded afresh from what the store holds
    del store.fail[2]
    store.entries[2] = []
    node.leases.table.granted(2, 8, sent_ms=clock.monotonic_ms())
    await node.acquired(2, 8)
    assert rt.shard_states[2] == ACTIVE and store.granted[2] == 8
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(2)))
    await settle()
    assert commit_code(t) == E.NONE
    rt.shutdown()


async def test_a_hand_over_stops_taking_requests_then_settles_the_writes_then_disowns():
    clock, store, rt, node = await make_node()
    node.leases.table.granted(3, 1, sent_ms=0)
    await node.acquired(3, 1)
    store.drain_gate.clear()
    handing = asyncio.ensure_future(node.releasing(3))
    await settle()
    assert rt.shard_states[3] == NOT_OWNED and store.drains == 1 and store.disowned == []
    t = send(rt, OFFSET_FETCH, 5, m.OffsetFetchRequest(group_id=group_in(3), topics=None))
    assert t.responses[0].error_code == E.NOT_COORDINATOR
    store.drain_gate.set()
    await asyncio.wait_for(handing, 5)
    assert store.disowned == [3]
    rt.shutdown()


async def test_the_steady_consumer_heartbeat_path_fences_too():
    """ConsumerGroupHeartbeat's steady path (answered at the edge, KIP-848) checks the lease first."""
    clock, store, rt, node = await make_node()
    node.leases.table.granted(1, 3, sent_ms=clock.monotonic_ms())
    await node.acquired(1, 3)
    clock.advance(2400)
    assert rt.consumer_heartbeat_steady(group_in(1), "m", 1, "c", "/127.0.0.1") is None
    assert rt.shard_states[1] == NOT_OWNED and store.disowned == [1]
    rt.shutdown()


async def test_the_topics_configured_at_start_go_to_the_database_not_to_a_shard():
    """The node is the runtime's topic store from its construction: ``--topic`` topics are put in
    herd_topics when the runtime starts (first writer wins), and none is written to shard 0."""
    clock, store, rt, node = await make_node(topics=(("orders", 3),))
    await settle()
    assert list(store.topics) == ["orders"] and store.seqs == [0] * N
    assert rt.catalog.get("orders")[1] == 3
    rt.shutdown()


async def test_topics_read_from_the_database_reach_the_catalog_and_the_consumer_groups():
    clock, store, rt, node = await make_node()
    store.topics["made-elsewhere"] = _topic_record("made-elsewhere", 5)
    assert await node.load_topics() == 1
    assert rt.catalog.get("made-elsewhere")[1] == 5
    assert await node.load_topics() == 0  # unchanged: not replayed again
    rt.shutdown()


def _topic_record(name, partitions):
    from coordinator.core.catalog import Topic, topic_value

    return topic_value(Topic(name, partitions, bytes(range(16))))


async def test_stop_returns_even_when_the_topic_refresh_swallows_its_cancellation():
    """Python 3.11's wait_for (asyncpg uses it) can swallow a cancellation that arrives as its wait
    ends (gh-86296): the refresh loop must still end, or stop() awaits it for ever (as the lease loop
    once did in a CI run). Forced: the database read swallows the cancel and returns normally."""
    clock, store, rt, node = await make_node()
    node.leases.table.renew_every_ms = 1  # the loop's floor: a read every 50 ms
    reading, swallowed = asyncio.Event(), []

    async def swallowing_read():
        reading.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            swallowed.append(1)
        return []

    store.load_topics = swallowing_read
    node._topic_task = asyncio.get_running_loop().create_task(node._refresh_topics())
    await asyncio.wait_for(reading.wait(), 5)
    node.leases = None  # never started: nothing of its own to stop
    stopping = asyncio.get_running_loop().create_task(node.stop())
    await asyncio.wait({stopping}, timeout=5)  # not wait_for: its cancel would be eaten the same way
    assert stopping.done() and swallowed and node._topic_task.done()
    rt.shutdown()
