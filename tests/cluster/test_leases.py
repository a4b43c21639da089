"""Leases and membership against a real PostgreSQL: two or three lease managers in one process.

Ownership is checked the way it matters: whenever a node is handed a shard, no other node may still
consider itself able to serve it (``LeaseManager.serving``, its self-fencing deadline)."""
import asyncio
import time

import asyncpg
import pytest

from coordinator.cluster.errors import DuplicateNodeError, OwnershipLostError
from coordinator.cluster.leases import LeaseManager
from coordinator.cluster.pgstore import PgStore
from coordinator.cluster.schema import ensure_schema
from coordinator.cluster.url import parse_store_url

N = 12


class Owner:
    """A stand-in for the runtime: serves what it is given, optionally loading it into a PgStore."""

    def __init__(self, node, cluster, store=None):
        self.node, self.cluster, self.store = node, cluster, store
        self.serving: dict[int, int] = {}
        self.manager: LeaseManager | None = None
        self.fail_once: set[int] = set()

    async def acquired(self, shard, epoch):
        if shard in self.fail_once:
            self.fail_once.discard(shard)
            self.cluster.events.append(("load_failed", self.node, shard, epoch))
            raise OSError("cannot load")
        others = [m.node_id for m in self.cluster.managers if m is not self.manager and m.serving(shard)]
        if others:
            self.cluster.violations.append((shard, self.node, others))
        if self.store is not None:
            await self.store.load(shard, epoch)
        self.serving[shard] = epoch
        self.cluster.events.append(("acquired", self.node, shard, epoch))

    def lost(self, shard):
        self.serving.pop(shard, None)
        if self.store is not None:
            self.store.disown(shard)
        self.cluster.events.append(("lost", self.node, shard))

    async def releasing(self, shard):
        self.serving.pop(shard, None)
        if self.store is not None:
            await self.store.drain()
            self.store.disown(shard)
        self.cluster.events.append(("released", self.node, shard))


class Cluster:
    def __init__(self, pg, lease_ms):
        self.url = parse_store_url(pg.url)
        self.lease_ms = lease_ms
        self.managers: list[LeaseManager] = []
        self.violations: list = []
        self.events: list = []

    async def node(self, node_id, store=None, start=True, **kw):
        owner = Owner(node_id, self, store)
        m = LeaseManager(self.url, node_id, N, owner, host="127.0.0.1", port=9000 + node_id, lease_ms=self.lease_ms)
        owner.manager = m
        self.managers.append(m)
        if start:
            await m.start(**kw)
        return m

    def counts(self):
        return {m.node_id: len(m.owner.serving) for m in self.managers}

    async def until(self, pred, timeout=15.0, what="condition"):
        deadline = time.monotonic() + timeout
        while not pred():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.counts()}"
            await asyncio.sleep(0.02)

    async def close(self):
        for m in self.managers:
            await m.abandon()


@pytest.fixture
async def cluster(pg):
    conn = await asyncpg.connect(pg.url)
    await ensure_schema(conn, N)
    await conn.close()
    made = []

    async def make(lease_ms=2000):
        c = Cluster(pg, lease_ms)
        made.append(c)
        return c

    yield make
    for c in made:
        await c.close()


async def lease_rows(pg):
    conn = await asyncpg.connect(pg.url)
    try:
        return {r["shard"]: dict(r) for r in await conn.fetch("SELECT * FROM herd_leases")}
    finally:
        await conn.close()


async def test_nodes_share_evenly_and_shares_move_on_join(pg, cluster):
    c = await cluster()
    m1 = await c.node(1)
    await c.until(lambda: c.counts() == {1: 12}, what="node 1 to take every shard")
    first = {s: e for s, e in m1.held().items()}
    await c.node(2)
    await c.until(lambda: c.counts() == {1: 6, 2: 6}, what="6/6")
    await c.node(3)
    await c.until(lambda: c.counts() == {1: 4, 2: 4, 3: 4}, what="4/4/4")
    assert c.violations == []
    rows = await lease_rows(pg)
    for shard, row in rows.items():
        owner = row["owner"]
        assert c.managers[owner - 1].held()[shard] == row["epoch"]
        if owner != 1:
            assert row["epoch"] > first[shard]  # a change of owner grows the epoch
    assert [n.node_id for n in m1.nodes] == [1, 2, 3] and m1.nodes[1].port == 9002


async def test_a_killed_nodes_shards_are_taken_after_its_leases_lapse(pg, cluster):
    c = await cluster()
    await c.node(1)
    await c.node(2)
    m3 = await c.node(3)
    await c.until(lambda: c.counts() == {1: 4, 2: 4, 3: 4}, what="4/4/4")
    dead = set(m3.held())
    await m3.abandon()  # SIGKILL: no release, no more renewals
    c.managers.remove(m3)
    lapse = max(r["expires_at"] for s, r in (await lease_rows(pg)).items() if s in dead)
    await c.until(lambda: c.counts() == {1: 6, 2: 6}, what="the survivors to take node 3's shards")
    rows = await lease_rows(pg)
    for shard in dead:
        assert rows[shard]["owner"] in (1, 2) and rows[shard]["acquired_at"] >= lapse
    assert c.violations == []


async def test_a_released_share_is_taken_at_once(pg, cluster):
    c = await cluster(lease_ms=60_000)  # no lease can lapse during this test: only hand-over moves shards
    await c.node(1)
    m2 = await c.node(2)
    await c.until(lambda: c.counts() == {1: 6, 2: 6}, what="6/6", timeout=20)
    given = set(m2.held())
    mark = len(c.events)
    started = time.monotonic()
    await m2.stop()
    c.managers.remove(m2)
    await c.until(lambda: c.counts() == {1: 12}, what="node 1 to take node 2's shards", timeout=20)
    assert time.monotonic() - started < 20  # far inside the 60 s lease: released, not lapsed
    after = c.events[mark:]
    released = [e for e in after if e[0] == "released" and e[1] == 2]
    assert {e[2] for e in released} == given
    last_release = max(i for i, e in enumerate(after) if e[0] == "released" and e[1] == 2)
    first_take = min(i for i, e in enumerate(after) if e[0] == "acquired" and e[1] == 1 and e[2] in given)
    assert last_release < first_take
    rows = await lease_rows(pg)
    assert all(rows[s]["owner"] == 1 for s in range(N)) and c.violations == []


async def test_a_paused_node_wakes_learns_it_lost_and_steps_down(pg, cluster):
    c = await cluster()
    store = PgStore(parse_store_url(pg.url), N, 1)
    await store.open()
    heard = []
    store.set_listener(heard.extend)
    try:
        m1 = await c.node(1, store=store)
        await c.node(2)
        await c.until(lambda: c.counts() == {1: 6, 2: 6} and len(store.owned()) == 6, what="6/6")
        old = m1.held()
        shard = min(old)
        await m1.pause()  # SIGSTOP
        await c.until(lambda: c.counts()[2] == 12, what="node 2 to take every shard")
        assert not any(m1.serving(s) for s in old)  # its own clock already says stop
        assert c.violations == []
        # woken, its runtime writes before anything else ran: the database refuses it
        assert store.owned()[shard] == old[shard]
        store.submit(shard, [(b"k", b"stale")])
        heard.extend(store.flush())
        await store.drain()
        assert isinstance(heard[-1][2], OwnershipLostError)
        conn = await asyncpg.connect(pg.url)
        try:
            assert await conn.fetchval("SELECT count(*) FROM herd_records") == 0
        finally:
            await conn.close()
        mark = len(c.events)
        await m1.resume()
        after = c.events[mark:]
        lost = [e[2] for e in after if e[0] == "lost" and e[1] == 1]
        assert set(lost) == set(old)
        # then it rejoins the sharing with new epochs
        await c.until(lambda: c.counts() == {1: 6, 2: 6}, what="6/6 again")
        assert all(e > old.get(s, 0) for s, e in m1.held().items())
        assert c.violations == []
    finally:
        await store.close()


async def test_a_duplicate_live_node_id_is_refused_with_one_line(pg, cluster):
    c = await cluster()
    m1 = await c.node(1)
    twin = await c.node(1, start=False)
    with pytest.raises(DuplicateNodeError) as info:
        await twin.start()
    message = str(info.value)
    assert message.startswith("node_id 1 is already live in this cluster (127.0.0.1:9001, last heartbeat ")
    assert message.endswith(" s ago): give every node its own node_id") and "\n" not in message
    await twin.abandon()
    await m1.abandon()  # killed: its row stays live until its lease lapses
    c.managers.remove(m1)
    again = await c.node(1, start=False)
    await again.start(wait_ms=10_000)  # a restart waits for the dead one's row to lapse
    await c.until(lambda: len(again.held()) == N, what="the restarted node to take every shard")


async def test_a_database_restart_is_ridden_out_without_a_restart_of_ours(pg, cluster):
    """PostgreSQL restarts (fast shutdown, start) while a node holds every shard: its ticks fail
    meanwhile, then it reconnects and renews before any lease can lapse; the store's next write goes
    over a new connection."""
    c = await cluster(lease_ms=6000)
    store = PgStore(parse_store_url(pg.url), N, 1)
    await store.open()
    heard = []
    store.set_listener(heard.extend)
    try:
        m1 = await c.node(1, store=store)
        await c.until(lambda: len(store.owned()) == N, what="node 1 to load every shard")
        store.submit(0, [(b"k", b"before")])
        store.flush()
        await store.drain()
        renewals = m1.renewals
        await asyncio.to_thread(pg.server.restart)
        await c.until(lambda: m1.renewals > renewals, what="a renewal after the restart", timeout=20)
        assert not [e for e in c.events if e[0] == "lost"] and all(m1.serving(s) for s in range(N))
        store.submit(0, [(b"k", b"after")])
        heard.extend(store.flush())
        await store.drain()
        assert heard[-1][1:] == (2, None), heard
        conn = await asyncpg.connect(pg.url)
        try:
            assert await conn.fetchval("SELECT value FROM herd_records WHERE shard = 0 AND key = 'k'") == b"after"
        finally:
            await conn.close()
    finally:
        await store.close()


async def test_a_shard_that_fails_to_load_is_freed_and_taken_again(pg, cluster):
    c = await cluster()
    m1 = await c.node(1, start=False)
    m1.owner.fail_once = {3}
    await m1.start()
    await c.until(lambda: c.counts() == {1: 12}, what="node 1 to serve every shard")
    failed = [e for e in c.events if e[0] == "load_failed"]
    taken = [e for e in c.events if e[0] == "acquired" and e[2] == 3]
    assert len(failed) == 1 and len(taken) == 1 and taken[0][3] > failed[0][3]  # a new epoch
    assert ("lost", 1, 3) in c.events


async def test_a_failed_write_is_followed_by_a_reload_with_a_new_epoch(pg, cluster):
    """The store's connection is killed mid-transaction: the shard's writes fail; the runtime asks
    for a reload; the lease manager takes the shard again with epoch + 1 (waiting for any
    transaction still holding the lease row) and hands it over to be loaded; writes go on."""
    c = await cluster(lease_ms=6000)
    store = PgStore(parse_store_url(pg.url), N, 1)
    await store.open()
    heard = []
    store.set_listener(heard.extend)
    admin = await asyncpg.connect(pg.url)
    try:
        m1 = await c.node(1, store=store)
        await c.until(lambda: len(store.owned()) == N, what="node 1 to load every shard")
        epoch = store.owned()[4]
        locker = await asyncpg.connect(pg.url)
        tx = locker.transaction()
        await tx.start()
        await locker.execute("SELECT * FROM herd_leases WHERE shard = 4 FOR UPDATE")
        store.submit(4, [(b"k", b"lost")])
        store.flush()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10
        while not await admin.fetchval("SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                                       "WHERE datname = $1 AND wait_event_type = 'Lock'", pg.name):
            assert loop.time() < deadline
            await asyncio.sleep(0.02)
        await tx.rollback()
        await locker.close()
        await store.drain()
        assert heard[-1][0] == 4 and heard[-1][2] is not None
        m1.request_reload(4)
        await c.until(lambda: store.owned().get(4) == epoch + 1, what="shard 4 reloaded with a new epoch")
        assert ("acquired", 1, 4, epoch + 1) in c.events and m1.serving(4)
        store.submit(4, [(b"k", b"after")])
        store.flush()
        await store.drain()
        assert heard[-1] == (4, 2, None)
        assert await admin.fetchval("SELECT value FROM herd_records WHERE shard = 4") == b"after"
    finally:
        await admin.close()
        await store.close()


async def test_a_stuck_hand_over_does_not_hold_up_renewals(pg, cluster):
    """A hand-over (owner.releasing) stuck behind a hung database must not delay the tick: the other
    shards keep being renewed, the stuck shard's lease stays held until its hand-over ends, and
    is freed by the first tick after that."""
    c = await cluster(lease_ms=3000)  # renewals every 1 s, self-fencing at 2.4 s
    m1 = await c.node(1)
    await c.until(lambda: c.counts() == {1: 12}, what="node 1 to take every shard")
    gate = asyncio.Event()
    stuck = max(m1.held())  # node 1 releases its highest shards when node 2 joins
    plain = m1.owner.releasing

    async def releasing(shard):
        if shard == stuck:
            await gate.wait()
        await plain(shard)

    m1.owner.releasing = releasing
    await c.node(2)
    renewals = m1.renewals
    await asyncio.sleep(3.5)  # past the lease: without the bound node 1 would have self-fenced
    assert m1.renewals >= renewals + 2 * 6  # its ticks went on renewing what it keeps
    assert stuck in m1.held() and m1.losses == 0  # held (and renewed) while the hand-over runs
    assert c.counts()[2] == 5  # the others were handed over meanwhile
    gate.set()
    await c.until(lambda: c.counts() == {1: 6, 2: 6}, what="the stuck shard to move once handed over")
    assert stuck in c.managers[1].owner.serving and m1.losses == 0 and c.violations == []


async def test_a_dead_nodes_shards_are_taken_as_soon_as_they_lapse(pg, cluster):
    """The survivor wakes up when the dead node's leases lapse by the database's clock (read at its
    last tick), not up to a renewal interval (3 s here) later."""
    c = await cluster(lease_ms=9000)
    m1 = await c.node(1)
    m2 = await c.node(2)
    await c.until(lambda: c.counts() == {1: 6, 2: 6}, what="6/6", timeout=30)
    dead = set(m2.held())
    await m2.pause()
    # node 2's last renewal half-way between two of node 1's ticks: its leases lapse there too
    await asyncio.sleep(max(0.0, (m1.last_ok_ms + 1500 - m1.clock.monotonic_ms()) / 1000))
    await m2.tick()
    await m2.abandon()
    c.managers.remove(m2)
    lapse = max(r["expires_at"] for s, r in (await lease_rows(pg)).items() if s in dead)
    await c.until(lambda: c.counts() == {1: 12}, what="node 1 to take node 2's shards", timeout=30)
    rows = await lease_rows(pg)
    late = max((rows[s]["acquired_at"] - lapse).total_seconds() for s in dead)
    assert 0 <= late < 0.4, late
    assert c.violations == []


async def test_pause_returns_even_when_the_loop_swallows_its_cancellation(pg, cluster, monkeypatch):
    """Python 3.11's wait_for can swallow a cancellation that arrives as its wait ends (gh-86296):
    the lease loop then went on, and pause() (and stop()) awaited it for ever (a CI run hung here).
    Forced: the loop's wait swallows every cancellation; pause() must still return, and the node
    resume and renew as before."""
    import coordinator.cluster.leases as leases_mod

    real_wait_for = asyncio.wait_for
    swallowed = []

    async def swallowing_wait_for(aw, timeout):
        if getattr(aw, "__qualname__", "") != "Event.wait":
            return await real_wait_for(aw, timeout)
        try:
            return await real_wait_for(aw, timeout)
        except asyncio.CancelledError:
            swallowed.append(1)  # as 3.11 does when the inner wait completes with the cancel
            return True

    c = await cluster(lease_ms=1000)
    m1 = await c.node(1)
    await c.until(lambda: c.counts() == {1: N}, what="node 1 to take every shard")
    monkeypatch.setattr(leases_mod.asyncio, "wait_for", swallowing_wait_for)
    await asyncio.sleep(0.05)  # the loop is in its swallowing wait now
    await asyncio.wait_for(m1.pause(), 5)  # through the fake too: not an Event.wait, so the real one
    assert swallowed
    monkeypatch.setattr(leases_mod.asyncio, "wait_for", real_wait_for)
    await m1.resume()
    renewed = m1.renewals
    await c.until(lambda: m1.renewals > renewed, what="a renewal after the resume")
    assert c.counts() == {1: N} and c.violations == []
