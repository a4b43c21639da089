"""Each part of the PostgreSQL store's write fence on its own (issue 33 item 12).

A write carries (shard, epoch, node) and commits only where the lease row still has that epoch, that
owner and an unexpired lease. Every other fencing test hands the lease to another node, which the
owner check alone refuses; here each case changes exactly one of the three, so dropping any one
condition from the write statement fails a test.
"""
import asyncpg
import pytest

from coordinator.cluster.errors import OwnershipLostError
from coordinator.cluster.pgstore import PgStore
from coordinator.cluster.url import parse_store_url

N = 8
SHARD = 3


@pytest.fixture
async def admin(pg):
    conn = await asyncpg.connect(pg.url)
    yield conn
    await conn.close()


async def _store(pg, node):
    store = PgStore(parse_store_url(pg.url), N, node)
    await store.open()
    return store


async def _grant(admin, node, lease_s=3600.0):
    return await admin.fetchval(
        "UPDATE herd_leases SET owner = $2, incarnation = gen_random_uuid(), epoch = epoch + 1, "
        "expires_at = now() + make_interval(secs => $3), acquired_at = now() WHERE shard = $1 RETURNING epoch",
        SHARD, node, lease_s)


async def _write(store, value):
    """Submit one record to SHARD and wait for its outcome: -> the exception or None."""
    heard = []
    store.set_listener(heard.extend)
    seq = store.submit(SHARD, [(b"k", value)])
    now = store.flush()
    await store.drain()
    outcome = [exc for shard, s, exc in list(now) + heard if shard == SHARD and s == seq]
    assert len(outcome) == 1, f"no single outcome for seq {seq}: {now} {heard}"
    return outcome[0]


async def _value(admin):
    return await admin.fetchval("SELECT value FROM herd_records WHERE shard = $1 AND key = $2", SHARD, b"k")


async def test_the_right_epoch_owner_and_lease_is_accepted(pg, admin):
    store = await _store(pg, 1)
    try:
        await store.load(SHARD, await _grant(admin, 1))
        assert await _write(store, b"v1") is None
        assert await _value(admin) == b"v1"
    finally:
        await store.close()


async def test_same_node_same_owner_live_lease_but_a_newer_epoch_refuses_the_old_epoch(pg, admin):
    """The node itself re-acquired the shard at epoch + 1 (e.g. after a lapse): a writer still
    carrying the old epoch is refused, although owner and expiry match."""
    old = await _store(pg, 1)
    try:
        epoch = await _grant(admin, 1)
        await old.load(SHARD, epoch)
        assert await _write(old, b"before") is None
        assert await _grant(admin, 1) == epoch + 1  # same owner, live lease, new epoch
        exc = await _write(old, b"stale")
        assert isinstance(exc, OwnershipLostError) and exc.shard_id == SHARD
        assert await _value(admin) == b"before"
        # a store loaded at the new epoch writes
        new = await _store(pg, 1)
        try:
            await new.load(SHARD, epoch + 1)
            assert await _write(new, b"after") is None
            assert await _value(admin) == b"after"
        finally:
            await new.close()
    finally:
        await old.close()


async def test_same_epoch_live_lease_but_another_owner_is_refused(pg, admin):
    store = await _store(pg, 1)
    try:
        epoch = await _grant(admin, 1)
        await store.load(SHARD, epoch)
        # only the owner changes: epoch and expiry stay as they are
        await admin.execute("UPDATE herd_leases SET owner = 2 WHERE shard = $1", SHARD)
        assert await admin.fetchval("SELECT epoch FROM herd_leases WHERE shard = $1", SHARD) == epoch
        exc = await _write(store, b"v")
        assert isinstance(exc, OwnershipLostError)
        assert await _value(admin) is None
    finally:
        await store.close()


async def test_same_epoch_same_owner_but_an_expired_lease_is_refused(pg, admin):
    store = await _store(pg, 1)
    try:
        epoch = await _grant(admin, 1)
        await store.load(SHARD, epoch)
        await admin.execute("UPDATE herd_leases SET expires_at = now() - interval '1 second' WHERE shard = $1",
                            SHARD)
        assert await admin.fetchrow("SELECT epoch, owner FROM herd_leases WHERE shard = $1", SHARD) == (epoch, 1)
        exc = await _write(store, b"v")
        assert isinstance(exc, OwnershipLostError)
        assert await _value(admin) is None
    finally:
        await store.close()
