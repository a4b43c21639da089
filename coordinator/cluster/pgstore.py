"""The PostgreSQL store: the records of the shards this node owns, written with fencing.

The contract the runtime uses (the file log's, see ``coordinator/log.py``), on the event loop:

- ``submit(shard_id, entries) -> seq`` stages a write (entries: ``(key bytes, value bytes | None)``,
  None = tombstone) and returns the shard's next sequence number (per shard, increasing for the
  life of this object, never reset by a reload).
- ``flush()`` (once per loop turn) hands everything staged to the writer and returns what is settled
  now: ``[(shard_id, seq, exc)]`` for shards that cannot be written (not owned, failed) and have
  nothing in flight; everything else is reported through the listener (``set_listener``) as the
  same triples, on the loop thread: every write of that shard up to ``seq`` is durable (``exc``
  None) or failed with ``exc``. Each shard's triples come in sequence order.
- ``await load(shard_id, epoch)`` -> the shard's records in replay order (the latest value of each
  key, ordered by its last write), and from then on writes of that shard carry ``epoch``.
  ``disown(shard_id)`` stops them (later writes fail with :class:`OwnershipLostError`).
- ``await drain()``, ``await compact(shard_id)``, ``await close()``.

Writing: one transaction at a time on a dedicated connection, holding everything staged since the
previous one began, batched over shards (group commit, as the file log batches fsyncs). The
transaction is ONE statement (one round trip, autocommit): a CTE that locks the lease rows of the
batch's shards ``FOR SHARE`` where the epoch still matches, this node is the owner and the lease
has not expired by the database's clock, and upserts/deletes only the records of the shards it
locked. A takeover (``UPDATE herd_leases ... epoch = epoch + 1``) therefore either commits first
(our lock waits, then re-reads the row: the epoch moved, the shard is left out) or waits for our
commit (the new owner loads after our write). Shards left out get :class:`OwnershipLostError` and
are disowned; nothing of their writes is written.

Failures: a database error, a lost connection or a transaction past ``txn_timeout_s`` fails every
write of the batch with :class:`StoreUnavailableError`, closes the connection (the next batch opens
a new one) and marks the batch's shards failed: their later writes fail too, in order, until the
shard is loaded again (phase 2: with a fresh epoch, so a transaction whose outcome was unknown has
settled before the reload reads). No write of a shard ever lands after one of its writes failed.

Within one batch the last value of a key wins (the batch commits atomically, so no reader can see
the earlier ones); ``seq`` in the table is a per-shard counter continued from the shard's highest at
load, so ``ORDER BY seq`` is the order of last writes.

Compaction: nothing to do. A tombstone deletes the row and an upsert replaces it; the table holds
the latest value per key at all times and PostgreSQL's autovacuum reclaims dead row versions.
"""
from __future__ import annotations

import asyncio
import bisect
import time

import asyncpg
import structlog

from coordinator.cluster.db import connect
from coordinator.cluster.errors import DB_ERRORS, ClusterError, OwnershipLostError, StoreUnavailableError
from coordinator.cluster.schema import SchemaInfo, ensure_schema
from coordinator.cluster.url import PgURL
from coordinator.store import FSYNC_BUCKETS, ShardStats, Store, check_shard, report

log = structlog.get_logger("herd.pgstore")

TXN_TIMEOUT_S = 5.0

# One statement, one round trip: fence (lock the lease rows whose epoch matches), then write only
# the fenced shards' records. $1 shards, $2 epochs, $3 node; $4-$7 upserts; $8-$9 deletes.
WRITE_SQL = """
WITH fence AS (
    SELECT l.shard FROM herd_leases l
    JOIN unnest($1::integer[], $2::bigint[]) AS f(shard, epoch) ON l.shard = f.shard AND l.epoch = f.epoch
    WHERE l.owner = $3 AND l.expires_at > now()
    FOR SHARE OF l
), up AS (
    INSERT INTO herd_records AS r (shard, key, value, seq)
    SELECT u.shard, u.key, u.value, u.seq
    FROM unnest($4::integer[], $5::bytea[], $6::bytea[], $7::bigint[]) AS u(shard, key, value, seq)
    WHERE u.shard IN (SELECT shard FROM fence)
    ON CONFLICT (shard, key) DO UPDATE SET value = excluded.value, seq = excluded.seq
    RETURNING 1
), del AS (
    DELETE FROM herd_records r USING unnest($8::integer[], $9::bytea[]) AS d(shard, key)
    WHERE r.shard = d.shard AND r.key = d.key AND d.shard IN (SELECT shard FROM fence)
    RETURNING 1
)
SELECT shard, (SELECT count(*) FROM up) AS upserted, (SELECT count(*) FROM del) AS deleted FROM fence
"""

LOAD_FENCE_SQL = "SELECT epoch, owner, expires_at > now() AS live FROM herd_leases WHERE shard = $1"
LOAD_SQL = "SELECT key, value, seq FROM herd_records WHERE shard = $1 ORDER BY seq"


class StoreClosedError(ClusterError):
    pass


class _ShardState:
    __slots__ = ("epoch", "seq", "db_seq", "failed", "pending", "inflight", "batches", "seconds", "buckets",
                 "records")

    def __init__(self):
        self.epoch: int | None = None  # the lease epoch writes carry; None = not owned
        self.seq = 0  # last sequence number handed out by submit
        self.db_seq = 0  # last herd_records.seq written (continued from the highest at load)
        self.failed: BaseException | None = None  # set by a failed batch: later writes fail until load
        self.pending: list = []  # [(entries, seq)] staged, not yet in a transaction
        self.inflight = 0  # the last seq in the transaction in flight (0: none)
        self.batches = 0  # committed transactions that carried this shard
        self.seconds = 0.0  # and their time
        self.buckets = [0] * (len(FSYNC_BUCKETS) + 1)  # their latency per FSYNC_BUCKETS bucket, then the rest
        self.records = 0  # records written


class PgStore(Store):
    def __init__(self, url: PgURL, num_shards: int, node_id: int, *, txn_timeout_s: float = TXN_TIMEOUT_S,
                 pool_size: int = 2):
        self.url = url
        self.num_shards = num_shards
        self.node_id = node_id
        self.txn_timeout_s = txn_timeout_s
        self.pool_size = pool_size
        self._shards = [_ShardState() for _ in range(num_shards)]
        self._dirty: dict[int, None] = {}  # shards with pending writes, in first-staged order
        self._granted: dict[int, int] = {}  # shard -> epoch granted by the lease manager, not yet loaded
        self._listener = None
        self._wconn: asyncpg.Connection | None = None
        self._pool: asyncpg.Pool | None = None
        self._task: asyncio.Task | None = None
        self._idle = asyncio.Event()
        self._idle.set()
        self._state = "new"
        # figures for metrics and benchmarks
        self.transactions = 0
        self.failed_transactions = 0
        self.records_written = 0
        self.txn_seconds_total = 0.0
        self.txn_seconds_last = 0.0

    # ---- lifecycle -------------------------------------------------------------------------------

    async def open(self, offsets_partitions: int | None = None, cluster_id: str = "herd-cluster") -> SchemaInfo:
        """Connect, create or check the schema (:class:`SchemaError`, :class:`StoreConnectError`:
        one line each)."""
        conn = await connect(self.url)
        try:
            info = await ensure_schema(conn, offsets_partitions or self.num_shards, cluster_id)
        except BaseException:
            await conn.close()
            raise
        await conn.close()
        self._wconn = await self._connect_writer()
        try:
            self._pool = await asyncpg.create_pool(**self.url.connect_kwargs(), min_size=0, max_size=self.pool_size)
        except BaseException:
            self._drop_connection()
            raise
        self._state = "open"
        return info

    async def close(self, timeout: float | None = None) -> None:
        """Settle everything submitted (written, or failed), then close the connections."""
        if self._state in ("closing", "closed"):
            return
        self._state = "closing"
        try:
            await asyncio.wait_for(self.drain(), timeout)
        except TimeoutError:
            pass
        if self._task is not None and not self._task.done():
            self._task.cancel()
        if self._wconn is not None:
            self._wconn.terminate()
            self._wconn = None
        if self._pool is not None:
            self._pool.terminate()
            self._pool = None
        self._state = "closed"

    def set_listener(self, listener) -> None:
        """``listener(results)``, called on the event loop with ``[(shard_id, seq, exc)]``."""
        self._listener = listener

    # ---- ownership -------------------------------------------------------------------------------

    def owned(self) -> dict[int, int]:
        """shard -> the epoch its writes carry."""
        return {i: st.epoch for i, st in enumerate(self._shards) if st.epoch is not None}

    def grant(self, shard_id: int, epoch: int) -> None:
        """The lease manager won ``shard_id`` with ``epoch``: the next :meth:`load` (without an
        epoch, as the Store interface calls it) uses it."""
        self._check_shard(shard_id)
        self._granted[shard_id] = epoch

    def owned_shards(self) -> list[int]:
        """The Store interface's: the shards granted (to be loaded) or loaded."""
        return sorted(set(self._granted) | set(self.owned()))

    async def load(self, shard_id: int, epoch: int | None = None) -> list[tuple[bytes, bytes]]:
        """The shard's records (latest value per key, in the order of their last writes); from now on
        its writes carry ``epoch`` (default: the one given to :meth:`grant`). Raises
        :class:`OwnershipLostError` if the lease is not held with ``epoch`` by this node,
        :class:`StoreUnavailableError` if the database fails."""
        self._check_shard(shard_id)
        if epoch is None:
            epoch = self._granted.get(shard_id)
            if epoch is None:
                raise OwnershipLostError(shard_id, None, f"shard {shard_id}: no lease granted to load it with")
        st = self._shards[shard_id]
        if st.inflight or st.pending:
            await self.drain()
        try:
            async with self._pool.acquire(timeout=self.txn_timeout_s) as conn:
                async with conn.transaction(isolation="repeatable_read", readonly=True):
                    lease = await conn.fetchrow(LOAD_FENCE_SQL, shard_id, timeout=self.txn_timeout_s)
                    if lease is None or lease["epoch"] != epoch or lease["owner"] != self.node_id \
                            or not lease["live"]:
                        raise OwnershipLostError(shard_id, epoch, f"shard {shard_id}: cannot load with epoch "
                                                 f"{epoch}: the lease is not this node's with that epoch")
                    rows = await conn.fetch(LOAD_SQL, shard_id, timeout=self.txn_timeout_s)
        except DB_ERRORS as exc:
            raise StoreUnavailableError(f"shard {shard_id}: load failed: {_describe(exc)}", shard_id) from None
        st.epoch = epoch
        st.failed = None
        self._granted.pop(shard_id, None)
        st.db_seq = rows[-1]["seq"] if rows else 0  # ORDER BY seq: the highest
        return [(r["key"], r["value"]) for r in rows]

    def disown(self, shard_id: int) -> None:
        """Stop writing ``shard_id``: writes not yet in a transaction fail with OwnershipLostError
        (reported in order, after any in flight)."""
        self._shards[shard_id].epoch = None
        self._granted.pop(shard_id, None)

    # ---- writing ---------------------------------------------------------------------------------

    def submit(self, shard_id: int, entries: list) -> int:
        if self._state != "open":
            raise StoreClosedError(f"store is {self._state}")
        st = self._shards[shard_id]
        st.seq += 1
        st.pending.append((entries, st.seq))
        self._dirty[shard_id] = None
        return st.seq

    def flush(self) -> list:
        """Start a transaction for what is staged, unless one is in flight (it then takes them when it
        ends); -> the writes that fail at once (shards not owned or failed, with nothing in flight)."""
        settled = []
        for shard_id in list(self._dirty):
            st = self._shards[shard_id]
            exc = self._refusal(shard_id, st)
            if exc is not None and not st.inflight:
                settled.append((shard_id, st.pending[-1][1], exc))
                st.pending.clear()
                del self._dirty[shard_id]
        if self._dirty and (self._task is None or self._task.done()):
            self._idle.clear()
            self._task = asyncio.get_running_loop().create_task(self._writer())
        return settled

    async def drain(self) -> None:
        """Wait until every write submitted so far is settled."""
        if self._dirty and (self._task is None or self._task.done()):
            self._report(self.flush())
        while not self._idle.is_set():
            await self._idle.wait()
            if self._dirty and (self._task is None or self._task.done()):
                self._report(self.flush())

    async def compact(self, shard_id: int) -> dict:
        """Nothing to compact (the table holds the latest value per key); -> the shard's figures."""
        self._check_shard(shard_id)
        count = await self._pooled(f"shard {shard_id}: compact", lambda conn: conn.fetchval(
            "SELECT count(*) FROM herd_records WHERE shard = $1", shard_id, timeout=self.txn_timeout_s))
        return {"shard": shard_id, "records": count, "removed": 0}

    async def _pooled(self, what: str, fn):
        """``await fn(conn)`` on a pooled connection; database failures -> StoreUnavailableError."""
        if self._pool is None:
            raise StoreClosedError(f"store is {self._state}")
        try:
            async with self._pool.acquire(timeout=self.txn_timeout_s) as conn:
                return await fn(conn)
        except DB_ERRORS as exc:
            raise StoreUnavailableError(f"{what}: {_describe(exc)}") from None

    def stats(self) -> list[ShardStats]:
        """Per owned (or failed) shard, as the Store interface's :class:`ShardStats`: a committed
        transaction that carried the shard counts as a batch and as an fsync (one WAL flush), with
        its latency; sizes are not tracked here (the table's), so they read 0."""
        out = []
        for shard_id, st in enumerate(self._shards):
            if st.epoch is None and st.failed is None:
                continue
            out.append(ShardStats(
                shard=shard_id, bytes=0, entries=st.records, live_keys=0, live_bytes=0, dead_bytes=0,
                batches=st.batches, fsyncs=st.batches, fsync_seconds=st.seconds, compactions=0,
                compaction_seconds=0.0, failed=str(st.failed) if st.failed else None,
                fsync_buckets=tuple(st.buckets)))
        return out

    def epochs(self) -> dict[int, int | None]:
        """shard -> the epoch its writes carry, for the owned or failed shards (tests, views)."""
        return {i: st.epoch for i, st in enumerate(self._shards) if st.epoch is not None or st.failed is not None}

    def _refusal(self, shard_id: int, st: _ShardState) -> BaseException | None:
        if st.failed is not None:
            return StoreUnavailableError(f"shard {shard_id}: an earlier write failed ({st.failed}); "
                                         "reload the shard", shard_id)
        if st.epoch is None:
            return OwnershipLostError(shard_id, None, f"shard {shard_id}: not owned by this node")
        return None

    def _check_shard(self, shard_id: int) -> None:
        check_shard(self._state, shard_id, self.num_shards, StoreClosedError, "store")

    def _report(self, results: list) -> None:
        report(self._listener, results, log, "pgstore.listener_error")

    async def _writer(self) -> None:
        """Write batches until nothing is staged: each transaction takes everything staged so far."""
        try:
            while self._dirty:
                batch, refused = self._take_batch()
                self._report(refused)
                if batch:
                    self._report(await self._write(batch))
        finally:
            self._idle.set()

    def _take_batch(self):
        """-> ({shard: (epoch, last seq, [entries...])}, refused triples)."""
        batch: dict[int, tuple[int, int, list]] = {}
        refused = []
        for shard_id in self._dirty:
            st = self._shards[shard_id]
            exc = self._refusal(shard_id, st)
            if exc is not None:
                refused.append((shard_id, st.pending[-1][1], exc))
            else:
                entries = []
                for items, _seq in st.pending:
                    entries.extend(items)
                st.inflight = st.pending[-1][1]
                batch[shard_id] = (st.epoch, st.inflight, entries)
            st.pending = []
        self._dirty.clear()
        return batch, refused

    async def _write(self, batch: dict) -> list:
        shards, epochs = [], []
        up_s, up_k, up_v, up_q, del_s, del_k = [], [], [], [], [], []
        db_seqs = {}
        for shard_id, (epoch, _seq, entries) in batch.items():
            shards.append(shard_id)
            epochs.append(epoch)
            st = self._shards[shard_id]
            last: dict[bytes, bytes | None] = {}
            for key, value in entries:
                last.pop(key, None)  # re-inserted: its position is its last write
                last[key] = value
            db_seq = st.db_seq
            for key, value in last.items():
                if value is None:
                    del_s.append(shard_id)
                    del_k.append(key)
                else:
                    db_seq += 1
                    up_s.append(shard_id)
                    up_k.append(key)
                    up_v.append(value)
                    up_q.append(db_seq)
            db_seqs[shard_id] = db_seq
        started = time.perf_counter()
        try:
            conn = self._wconn
            if conn is None or conn.is_closed():
                self._wconn = conn = await self._connect_writer()
            rows = await conn.fetch(WRITE_SQL, shards, epochs, self.node_id, up_s, up_k, up_v, up_q, del_s, del_k,
                                    timeout=self.txn_timeout_s * 1.5 + 0.5)
        except Exception as exc:  # noqa: BLE001 - whatever failed, the batch failed and the connection goes
            self.failed_transactions += 1
            self._drop_connection()
            reason = _describe(exc)
            log.warning("pgstore.write_failed", shards=shards, error=reason)
            out = []
            for shard_id, (_epoch, seq, _entries) in batch.items():
                st = self._shards[shard_id]
                st.inflight = 0
                st.failed = exc
                out.append((shard_id, seq, StoreUnavailableError(f"shard {shard_id}: write failed: {reason}",
                                                                 shard_id)))
            return out
        elapsed = time.perf_counter() - started
        self.transactions += 1
        self.txn_seconds_total += elapsed
        self.txn_seconds_last = elapsed
        fenced = {r["shard"] for r in rows}
        bucket = bisect.bisect_left(FSYNC_BUCKETS, elapsed)
        out = []
        for shard_id, (epoch, seq, entries) in batch.items():
            st = self._shards[shard_id]
            st.inflight = 0
            if shard_id in fenced:
                st.db_seq = db_seqs[shard_id]
                st.batches += 1
                st.seconds += elapsed
                st.buckets[bucket] += 1
                st.records += len(entries)
                self.records_written += len(entries)
                out.append((shard_id, seq, None))
            else:
                if st.epoch == epoch:
                    st.epoch = None  # the database says it is not ours: stop writing it
                log.warning("pgstore.ownership_lost", shard=shard_id, epoch=epoch)
                out.append((shard_id, seq, OwnershipLostError(shard_id, epoch)))
        return out

    async def _connect_writer(self) -> asyncpg.Connection:
        """The write connection. The server aborts a write statement past ``txn_timeout_s`` itself
        (statement_timeout: then it surely wrote nothing; the client's own timeout is a little
        longer, for a database that does not answer at all), and checks every second that we are
        still there while a statement runs (a connection we dropped does not commit later)."""
        settings = dict(self.url.connect_kwargs().get("server_settings") or {})
        settings["statement_timeout"] = str(max(1, int(self.txn_timeout_s * 1000)))
        settings["client_connection_check_interval"] = "1000"
        return await connect(self.url, timeout=self.txn_timeout_s, server_settings=settings)

    def _drop_connection(self) -> None:
        conn, self._wconn = self._wconn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()  # its transaction may be anywhere: never reuse it

    # ---- the topic catalog -----------------------------------------------------------------------

    async def put_topic(self, name: str, record: bytes) -> bytes:
        """Store a topic unless one of that name exists; -> the stored record (the first writer's)."""
        async def put(conn):
            for _ in range(3):
                stored = await conn.fetchval(
                    "WITH ins AS (INSERT INTO herd_topics (name, record) VALUES ($1, $2) "
                    "ON CONFLICT (name) DO NOTHING RETURNING record) "
                    "SELECT record FROM ins UNION ALL SELECT record FROM herd_topics WHERE name = $1 LIMIT 1",
                    name, record, timeout=self.txn_timeout_s)
                if stored is not None:  # None: a concurrent insert committed after our snapshot
                    return stored
            raise StoreUnavailableError(f"topic {name}: could not read it back")

        return await self._pooled(f"topic {name}", put)

    async def put_acl(self, key: bytes, value: bytes | None) -> None:
        """Keep (value) or delete (None) one ACL record in herd_acls."""
        if value is None:
            sql = "DELETE FROM herd_acls WHERE key = $1"
        else:
            sql = "INSERT INTO herd_acls (key) VALUES ($1) ON CONFLICT (key) DO NOTHING"
        await self._pooled("acl", lambda conn: conn.execute(sql, key, timeout=self.txn_timeout_s))

    async def load_acls(self) -> list[bytes]:
        rows = await self._pooled("acls", lambda conn: conn.fetch(
            "SELECT key FROM herd_acls ORDER BY created_at, key", timeout=self.txn_timeout_s))
        return [bytes(r["key"]) for r in rows]

    async def load_topics(self) -> list[tuple[str, bytes]]:
        rows = await self._pooled("topics", lambda conn: conn.fetch(
            "SELECT name, record FROM herd_topics ORDER BY created_at, name", timeout=self.txn_timeout_s))
        return [(r["name"], r["record"]) for r in rows]


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer from the database in time"
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
