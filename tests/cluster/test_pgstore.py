"""The PostgreSQL store against a real server: durability, ordering, fencing, a killed connection,
a stuck transaction, loading, the topic catalog."""
import asyncio

import asyncpg
import pytest

from coordinator.cluster.errors import OwnershipLostError, StoreUnavailableError
from coordinator.cluster.pgstore import PgStore
from coordinator.cluster.url import parse_store_url
from coordinator.store import FSYNC_BUCKETS, ShardFailedError, ShardFencedError, ShardStats, Store

N = 8


async def take(conn, shard, node, lease_s=3600.0):
    """Give ``shard``'s lease to ``node`` (as a lease manager's acquisition does): -> the new epoch."""
    return await conn.fetchval(
        "UPDATE herd_leases SET owner = $2, incarnation = gen_random_uuid(), epoch = epoch + 1, "
        "expires_at = now() + make_interval(secs => $3), acquired_at = now() WHERE shard = $1 RETURNING epoch",
        shard, node, lease_s)


class Heard:
    """The store's listener: every (shard, seq, exc) in arrival order."""

    def __init__(self, store):
        self.results = []
        store.set_listener(self.results.extend)

    async def until(self, pred, timeout=10.0):
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not pred(self.results):
            assert loop.time() < deadline, f"timed out; heard {self.results}"
            await asyncio.sleep(0.01)

    def of(self, shard):
        return [(seq, exc) for s, seq, exc in self.results if s == shard]


@pytest.fixture
async def admin(pg):
    conn = await asyncpg.connect(pg.url)
    yield conn
    await conn.close()


async def new_store(pg, node=1, **kw):
    store = PgStore(parse_store_url(pg.url), N, node, **kw)
    await store.open()
    return store


async def records(conn, shard):
    return [(r["key"], r["value"]) for r in
            await conn.fetch("SELECT key, value FROM herd_records WHERE shard = $1 ORDER BY seq", shard)]


async def test_durable_writes_are_read_back_by_a_new_connection(pg, admin):
    store = await new_store(pg)
    heard = Heard(store)
    try:
        for shard in (0, 3):
            assert await store.load(shard, await take(admin, shard, 1)) == []
        s1 = store.submit(0, [(b"a", b"1"), (b"b", b"1")])
        s2 = store.submit(3, [(b"x", b"9")])
        s3 = store.submit(0, [(b"a", b"2"), (b"b", None), (b"c", b"3")])
        assert (s1, s2, s3) == (1, 1, 2)
        assert store.flush() == []  # nothing settles before the database commits
        await heard.until(lambda r: len([x for x in r if x[0] == 0 and x[1] == 2]) == 1 and any(x[0] == 3 for x in r))
        assert all(exc is None for _, _, exc in heard.results)
        fresh = await asyncpg.connect(pg.url)
        try:
            assert await records(fresh, 0) == [(b"a", b"2"), (b"c", b"3")]  # b: a tombstone deleted it
            assert await records(fresh, 3) == [(b"x", b"9")]
        finally:
            await fresh.close()
    finally:
        await store.close()
    # another store (a new owner) loads the latest values in last-write order
    other = await new_store(pg, node=2)
    try:
        assert await other.load(0, await take(admin, 0, 2)) == [(b"a", b"2"), (b"c", b"3")]
    finally:
        await other.close()


async def test_ordering_under_many_turns(pg, admin):
    store = await new_store(pg)
    heard = Heard(store)
    try:
        for shard in range(4):
            await store.load(shard, await take(admin, shard, 1))
        last = {}
        for turn in range(60):  # writes staged while earlier transactions are in flight
            for shard in range(4):
                key = b"k%d" % (turn % 7)
                last[(shard, key)] = store.submit(shard, [(key, b"%d" % turn), (b"turn", b"%d" % turn)])
            heard.results.extend(store.flush())
            await asyncio.sleep(0)
        await store.drain()
        for shard in range(4):
            seqs = [seq for seq, exc in heard.of(shard)]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs) and seqs[-1] == 60
            assert all(exc is None for _, exc in heard.of(shard))
        assert store.transactions < 60  # batched: turns staged during a transaction share the next one
        got = await records(admin, 2)
        assert got[-1] == (b"turn", b"59") and dict(got)[b"k3"] == b"59"  # 59 % 7 == 3
        # replay order = order of last writes: k3 (turn 59) then turn; k2 before that (turn 58)
        assert [k for k, _ in got][-3:] == [b"k2", b"k3", b"turn"]
    finally:
        await store.close()


async def test_fencing_the_old_owners_writes_are_refused_and_nothing_is_written(pg, admin):
    a = await new_store(pg, node=1)
    b = await new_store(pg, node=2)
    heard_a, heard_b = Heard(a), Heard(b)
    try:
        await a.load(5, await take(admin, 5, 1))
        await a.load(6, await take(admin, 6, 1))
        a.submit(5, [(b"k", b"a1")])
        a.flush()
        await a.drain()
        assert heard_a.of(5) == [(1, None)]
        # node 2 takes shard 5 (epoch + 1) and loads it; node 1 does not know yet
        epoch_b = await take(admin, 5, 2)
        assert await b.load(5, epoch_b) == [(b"k", b"a1")]
        a.submit(5, [(b"k", b"a2"), (b"other", b"a2")])
        a.submit(6, [(b"k6", b"a")])  # a shard node 1 still owns, in the same transaction
        a.flush()
        await a.drain()
        (seq, exc), = heard_a.of(5)[1:]
        assert seq == 2 and isinstance(exc, OwnershipLostError) and exc.shard_id == 5
        assert heard_a.of(6) == [(1, None)]
        assert await records(admin, 5) == [(b"k", b"a1")]
        assert 5 not in a.owned() and a.owned() == {6: 1}
        a.submit(5, [(b"k", b"a3")])  # later writes fail at once
        (shard, seq, exc), = a.flush()
        assert (shard, seq) == (5, 3) and isinstance(exc, OwnershipLostError)
        b.submit(5, [(b"k", b"b1")])
        b.flush()
        await b.drain()
        assert heard_b.of(5) == [(1, None)] and await records(admin, 5) == [(b"k", b"b1")]
    finally:
        await a.close()
        await b.close()


async def _wait_blocked(admin, database, timeout=10.0):
    """Until some session of ``database`` waits for a lock."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not await admin.fetchval("SELECT count(*) FROM pg_stat_activity WHERE datname = $1 "
                                   "AND wait_event_type = 'Lock'", database):
        assert loop.time() < deadline, "the store's transaction never blocked"
        await asyncio.sleep(0.02)


async def test_a_takeover_racing_a_write_wins_or_waits(pg, admin):
    """The takeover holds the lease row (uncommitted) when the write starts: the write waits for it,
    then sees the new epoch and writes nothing."""
    a = await new_store(pg, node=1)
    heard = Heard(a)
    try:
        await a.load(2, await take(admin, 2, 1))
        taker = await asyncpg.connect(pg.url)
        try:
            tx = taker.transaction()
            await tx.start()
            await take(taker, 2, 2)
            a.submit(2, [(b"k", b"late")])
            a.flush()
            await _wait_blocked(admin, pg.name)
            await tx.commit()
        finally:
            await taker.close()
        await a.drain()
        (seq, exc), = heard.of(2)
        assert isinstance(exc, OwnershipLostError)
        assert await records(admin, 2) == []
    finally:
        await a.close()


async def test_a_killed_connection_fails_the_batch_in_order_until_reload(pg, admin):
    a = await new_store(pg, node=1)
    heard = Heard(a)
    try:
        epoch = await take(admin, 1, 1)
        await a.load(1, epoch)
        await a.load(4, await take(admin, 4, 1))
        locker = await asyncpg.connect(pg.url)
        try:
            tx = locker.transaction()
            await tx.start()
            await locker.execute("SELECT * FROM herd_leases WHERE shard = 1 FOR UPDATE")  # the write will wait
            a.submit(1, [(b"k", b"lost")])
            a.submit(4, [(b"k", b"lost")])
            a.flush()
            await _wait_blocked(admin, pg.name)
            a.submit(1, [(b"k", b"after")])  # staged while the transaction hangs
            a.flush()
            killed = await admin.fetchval(
                "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                "WHERE datname = $1 AND wait_event_type = 'Lock'", pg.name)
            assert killed == 1
            await a.drain()
            await tx.rollback()
        finally:
            await locker.close()
        r1 = heard.of(1)
        assert [seq for seq, _ in r1] == [1, 2]
        assert all(isinstance(exc, StoreUnavailableError) for _, exc in r1 + heard.of(4))
        assert await records(admin, 1) == [] and await records(admin, 4) == []
        a.submit(1, [(b"k", b"still-failed")])
        (shard, seq, exc), = a.flush()
        assert (shard, seq) == (1, 3) and isinstance(exc, StoreUnavailableError)
        assert await a.load(1, epoch) == []  # reloaded: writes go on over a new connection
        a.submit(1, [(b"k", b"ok")])
        a.flush()
        await a.drain()
        assert heard.of(1)[-1] == (4, None) and await records(admin, 1) == [(b"k", b"ok")]
    finally:
        await a.close()


async def test_a_stuck_transaction_times_out(pg, admin):
    a = await new_store(pg, node=1, txn_timeout_s=0.3)
    heard = Heard(a)
    try:
        await a.load(0, await take(admin, 0, 1))
        locker = await asyncpg.connect(pg.url)
        try:
            tx = locker.transaction()
            await tx.start()
            await locker.execute("SELECT * FROM herd_leases WHERE shard = 0 FOR UPDATE")
            a.submit(0, [(b"k", b"v")])
            a.flush()
            await a.drain()
            (seq, exc), = heard.of(0)
            assert isinstance(exc, StoreUnavailableError) and "statement timeout" in str(exc)
            await tx.rollback()
        finally:
            await locker.close()
        # the database cancelled the statement: it wrote nothing
        await asyncio.sleep(0.1)
        assert await records(admin, 0) == []
    finally:
        await a.close()


async def test_an_expired_lease_refuses_writes_and_loads(pg, admin):
    a = await new_store(pg, node=1)
    heard = Heard(a)
    try:
        epoch = await take(admin, 7, 1)
        await a.load(7, epoch)
        await admin.execute("UPDATE herd_leases SET expires_at = now() - interval '1 second' WHERE shard = 7")
        a.submit(7, [(b"k", b"v")])
        a.flush()
        await a.drain()
        assert isinstance(heard.of(7)[0][1], OwnershipLostError)
        with pytest.raises(OwnershipLostError, match="cannot load with epoch"):
            await a.load(7, epoch)
        assert await records(admin, 7) == []
    finally:
        await a.close()


async def test_not_owned_shard_fails_at_once(pg):
    a = await new_store(pg, node=1)
    try:
        a.submit(3, [(b"k", b"v")])
        (shard, seq, exc), = a.flush()
        assert (shard, seq) == (3, 1) and isinstance(exc, OwnershipLostError)
    finally:
        await a.close()


async def test_topic_catalog_first_writer_wins(pg):
    a = await new_store(pg, node=1)
    b = await new_store(pg, node=2)
    try:
        assert await a.put_topic("orders", b"A") == b"A"
        assert await b.put_topic("orders", b"B") == b"A"
        assert await b.put_topic("clicks", b"C") == b"C"
        assert await a.load_topics() == [("orders", b"A"), ("clicks", b"C")]
        assert (await a.compact(0))["records"] == 0
    finally:
        await a.close()
        await b.close()


def test_store_errors_are_the_store_interfaces():
    """The runtime tells the two failures apart by the Store interface's types only."""
    assert issubclass(PgStore, Store)
    lost, down = OwnershipLostError(3, 7), StoreUnavailableError("shard 3: write failed: x", 3)
    assert isinstance(lost, ShardFencedError) and lost.shard == 3 and "epoch 7" in str(lost)
    assert isinstance(down, ShardFailedError) and down.shard == 3 and str(down) == "shard 3: write failed: x"


async def test_store_interface_calls_grant_then_load_without_an_epoch(pg, admin):
    """The runtime's Store interface loads by shard id only: the lease manager grants the epoch
    first; owned_shards() lists granted and loaded shards; stats() per owned shard."""
    a = await new_store(pg, node=1)
    try:
        with pytest.raises(OwnershipLostError, match="no lease granted"):
            await a.load(2)
        a.grant(2, await take(admin, 2, 1))
        a.grant(5, await take(admin, 5, 1))
        assert a.owned_shards() == [2, 5]
        assert await a.load(2) == [] and a.owned() == {2: 1}
        a.submit(2, [(b"k", b"v")])
        a.flush()
        await a.drain()
        (st,) = [s for s in a.stats() if s.shard == 2]
        assert isinstance(st, ShardStats)
        assert (st.batches, st.fsyncs, st.entries, st.failed) == (1, 1, 1, None)
        assert sum(st.fsync_buckets) == 1 and len(st.fsync_buckets) == len(FSYNC_BUCKETS) + 1
        assert a.epochs()[2] == 1
        a.disown(5)
        assert a.owned_shards() == [2]
    finally:
        await a.close()


async def test_catalog_and_loads_fail_as_unavailable_when_the_database_is_down(pg, admin):
    a = await new_store(pg, node=1)
    try:
        epoch = await take(admin, 0, 1)
        await a.put_topic("t", b"T")
        pg.server.terminate_backends(pg.name)  # every connection of the pool and the writer dies
        pg.server.stop()
        try:
            with pytest.raises(StoreUnavailableError, match="^topics: "):
                await a.load_topics()
            with pytest.raises(StoreUnavailableError, match="^shard 0: load failed: "):
                await a.load(0, epoch)
        finally:
            pg.server.start()
        assert await a.load_topics() == [("t", b"T")]
        assert await a.load(0, epoch) == []
    finally:
        await a.close()


async def test_any_driver_failure_fails_the_batch_and_the_next_one_uses_a_new_connection(pg, admin):
    """asyncpg's InternalClientError ("another operation is in progress") is neither a PostgresError
    nor an InterfaceError: it killed the writer task once, leaving every later commit of its shards
    unanswered. Any failure of the write statement fails the batch (reported) and drops the
    connection."""
    a = await new_store(pg, node=1)
    heard = Heard(a)
    try:
        epoch = await take(admin, 2, 1)
        await a.load(2, epoch)
        a.submit(2, [(b"k", b"v1")])
        a.flush()
        await a.drain()
        real = a._wconn

        class Broken:  # the writer's connection in a state the driver refuses to use
            def is_closed(self):
                return False

            async def fetch(self, *args, **kw):
                raise asyncpg.InternalClientError("cannot switch to state 12; another operation (2) is in progress")

            def terminate(self):
                real.terminate()

        a._wconn = Broken()
        a.submit(2, [(b"k", b"v2")])
        a.flush()
        await asyncio.wait_for(a.drain(), 5)
        (seq, exc), = heard.of(2)[1:]
        assert seq == 2 and isinstance(exc, StoreUnavailableError) and "InternalClientError" in str(exc)
        assert a._wconn is None and a.failed_transactions == 1
        await a.load(2, epoch)
        a.submit(2, [(b"k", b"v3")])
        a.flush()
        await asyncio.wait_for(a.drain(), 5)
        assert heard.of(2)[-1] == (3, None) and await records(admin, 2) == [(b"k", b"v3")]
    finally:
        await a.close()
