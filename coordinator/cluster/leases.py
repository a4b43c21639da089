"""Node membership and shard leases in the database (the SQL side of :mod:`placement`).

A :class:`LeaseManager` per node: ``await start()`` registers the node (a duplicate live node_id is
refused with one line), then a loop ticks every ``renew_every_ms`` (a third of the lease) and at
once when another node joins, leaves or releases shards (LISTEN/NOTIFY on ``herd_cluster``):

1. heartbeat the node row and renew every held lease in one statement each (epoch, owner and
   "not yet expired" checked by the database); a held lease not renewed is lost;
2. read the live nodes and every lease (the routing view phase 2 answers Metadata and
   FindCoordinator from);
3. :func:`placement.plan`: release the shares over target (the owner first stops serving and
   settles its writes, then the lease row is freed and the others notified), take free shards up to
   target (``epoch + 1``, conditional on the lease still being free or lapsed).

Between ticks a timer enforces the :class:`placement.LeaseTable` deadlines: a shard whose renewal is
overdue is dropped (``owner.lost``) before its lease can lapse in the database. ``serving(shard)``
is the check for the request path (a process woken from SIGSTOP may read requests before any timer
runs).

The runtime side is a :class:`ShardOwner` (phase 2: the runtime):

- ``await owner.acquired(shard, epoch)``: load the shard (``PgStore.load(shard, epoch)``) and serve
  it; runs as its own task, never holding up renewals. If it raises, the lease is released.
- ``owner.lost(shard)``: stop serving it NOW (self-fenced, or the database says it is not ours).
- ``await owner.releasing(shard)``: hand it over: stop serving, settle its writes; the lease is freed
  when this returns. It runs as its own task: a tick waits for it at most ``handover_wait_ms`` (half
  a renewal interval), so a hand-over stuck behind a hung database never delays the next renewal of
  the other shards towards the self-fencing point; the lease of a shard whose hand-over is still
  running stays held (and renewed) and is freed by the first tick after it ended.

After a write of a shard failed in the database (the store's StoreUnavailableError), the runtime
calls ``request_reload(shard)``: the shard is taken again with ``epoch + 1`` and handed to
``owner.acquired`` once more.

``await stop()`` hands every shard over, frees the leases, removes the node row and notifies, so the
other nodes take the shards at once. ``abandon()`` stops without any of that (a SIGKILL, for tests).
"""
from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from dataclasses import dataclass
from typing import Protocol

import asyncpg
import structlog

from coordinator.clock import Clock, SystemClock
from coordinator.cluster import placement
from coordinator.cluster.db import connect
from coordinator.cluster.errors import DB_ERRORS, ClusterError, DuplicateNodeError
from coordinator.cluster.url import PgURL

log = structlog.get_logger("herd.leases")

CHANNEL = "herd_cluster"
LAPSE_SLACK_MS = 50  # after another node's lease should have lapsed, look again this much later

REGISTER_SQL = """
INSERT INTO herd_nodes AS n (node_id, incarnation, host, port, rack, expires_at)
VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6 / 1000.0))
ON CONFLICT (node_id) DO UPDATE SET incarnation = excluded.incarnation, host = excluded.host,
    port = excluded.port, rack = excluded.rack, started_at = now(), heartbeat_at = now(),
    expires_at = excluded.expires_at
WHERE n.expires_at <= now() OR n.incarnation = excluded.incarnation
RETURNING node_id
"""
LIVE_NODE_SQL = ("SELECT host, port, extract(epoch FROM now() - heartbeat_at) AS ago FROM herd_nodes "
                 "WHERE node_id = $1 AND expires_at > now()")
HEARTBEAT_SQL = """
UPDATE herd_nodes SET heartbeat_at = now(), expires_at = now() + make_interval(secs => $3 / 1000.0)
WHERE node_id = $1 AND incarnation = $2 RETURNING node_id
"""
RENEW_SQL = """
UPDATE herd_leases l SET expires_at = now() + make_interval(secs => $4 / 1000.0)
FROM unnest($1::integer[], $2::bigint[]) AS f(shard, epoch)
WHERE l.shard = f.shard AND l.epoch = f.epoch AND l.owner = $3 AND l.expires_at > now()
RETURNING l.shard
"""
ACQUIRE_SQL = """
UPDATE herd_leases SET owner = $2, incarnation = $3, epoch = epoch + 1,
    expires_at = now() + make_interval(secs => $4 / 1000.0), acquired_at = now()
WHERE shard = ANY($1::integer[]) AND (owner IS NULL OR expires_at <= now())
RETURNING shard, epoch
"""
BUMP_SQL = """
UPDATE herd_leases SET epoch = epoch + 1, expires_at = now() + make_interval(secs => $4 / 1000.0),
    acquired_at = now()
WHERE shard = $1 AND epoch = $2 AND owner = $3 AND expires_at > now()
RETURNING epoch
"""
RELEASE_SQL = """
UPDATE herd_leases l SET owner = NULL, incarnation = NULL, expires_at = NULL
FROM unnest($1::integer[], $2::bigint[]) AS f(shard, epoch)
WHERE l.shard = f.shard AND l.epoch = f.epoch AND l.owner = $3
RETURNING l.shard
"""
VIEW_NODES_SQL = "SELECT node_id, host, port, rack FROM herd_nodes WHERE expires_at > now() ORDER BY node_id"
VIEW_LEASES_SQL = ("SELECT shard, owner, epoch, owner IS NOT NULL AND expires_at > now() AS live, "
                   "(extract(epoch FROM expires_at - now()) * 1000)::bigint AS left_ms "
                   "FROM herd_leases ORDER BY shard")


class ShardOwner(Protocol):
    async def acquired(self, shard: int, epoch: int) -> None: ...

    def lost(self, shard: int) -> None: ...

    async def releasing(self, shard: int) -> None: ...


@dataclass(frozen=True)
class NodeInfo:
    node_id: int
    host: str
    port: int
    rack: str | None = None


class LeaseManager:
    def __init__(self, url: PgURL, node_id: int, num_shards: int, owner: ShardOwner, *, host: str, port: int,
                 lease_ms: int = 10000, rack: str | None = None, clock: Clock | None = None,
                 margin_ms: int | None = None, renew_every_ms: int | None = None):
        self.url = url
        self.node_id = node_id
        self.num_shards = num_shards
        self.owner = owner
        self.host, self.port, self.rack = host, port, rack
        self.lease_ms = lease_ms
        self.clock = clock or SystemClock()
        self.table = placement.LeaseTable(lease_ms, margin_ms, renew_every_ms)
        self.incarnation = uuid.uuid4()
        self.nodes: list[NodeInfo] = []  # live nodes, by the last tick
        self.leases: dict[int, tuple[int | None, int, bool]] = {}  # shard -> (owner, epoch, live)
        self._conn: asyncpg.Connection | None = None
        self._task: asyncio.Task | None = None
        self._loads: dict[int, asyncio.Task] = {}
        self._handing: dict[int, asyncio.Task] = {}  # shard -> owner.releasing running (lease still held)
        self.handover_wait_ms = max(self.table.renew_every_ms // 2, 1)
        self._lapse_at: int | None = None  # monotonic ms just after another node's lease lapses next
        self.last_ok_ms: int | None = None  # monotonic time the last tick that reached the database was sent
        self.on_roundtrip = None  # (seconds) -> None: the heartbeat statement's round trip, for metrics
        self._unloaded: dict[int, int] = {}  # shard -> epoch: failed to load, lease to be freed
        self._reloads: set[int] = set()  # shards to take again with epoch + 1 (request_reload)
        self._wake = asyncio.Event()
        self._running = False
        # the _loop task allowed to run; _cancel_loop moves it on (see there)
        self._loop_gen = 0
        # figures for metrics
        self.renewals = 0
        self.losses = 0
        self.acquisitions = 0
        self.failed_ticks = 0

    # ---- lifecycle -------------------------------------------------------------------------------

    async def start(self, wait_ms: int = 0) -> None:
        """Register this node, take a first share and start the loop. ``wait_ms``: how long to wait
        for a live node of the same id to lapse (a restart after a crash) before refusing."""
        await self._ensure_conn()
        await self._register(wait_ms)
        self._running = True
        await self._notify()
        await self.tick()
        self._task = asyncio.get_running_loop().create_task(self._loop(self._loop_gen))

    async def stop(self) -> None:
        """Graceful hand-over: stop serving every shard, free its lease, leave, notify."""
        self._running = False
        await self._cancel_loop()
        held = self.table.held()
        for shard in held:
            if shard not in self._handing:
                self._handing[shard] = asyncio.get_running_loop().create_task(self._hand_over(shard))
        tasks = [t for s, t in self._handing.items() if s in held]
        if tasks:  # bounded: a shard whose hand-over does not end in time is left to lapse
            await asyncio.wait(tasks, timeout=max(self.lease_ms / 1000, 1.0))
        held = {s: e for s, e in held.items() if self._handing.pop(s).done()}
        for task in self._handing.values():
            task.cancel()
        self._handing.clear()
        for shard in held:  # handed over: not served from now on, before another node can take it
            self.table.drop(shard)
        try:
            await self._close_conn()  # a cancelled tick may have left it mid-statement: start afresh
            conn = await self._ensure_conn()
            shards = list(held)
            await conn.fetch(RELEASE_SQL, shards, [held[s] for s in shards], self.node_id, timeout=self._timeout)
            await conn.execute("DELETE FROM herd_nodes WHERE node_id = $1 AND incarnation = $2",
                               self.node_id, self.incarnation, timeout=self._timeout)
            await self._notify()
        except (*DB_ERRORS, ClusterError) as exc:
            log.warning("leases.stop_failed", error=str(exc))  # the leases lapse on their own
        await self._close_conn()

    async def abandon(self) -> None:
        """Stop without releasing anything (as if killed): for tests."""
        self._running = False
        await self._cancel_loop()
        await self._close_conn()

    async def pause(self) -> None:
        """Stop ticking and fencing, holding everything as it is (a SIGSTOP, for tests)."""
        await self._cancel_loop(cancel_loads=False)

    async def resume(self) -> None:
        """Wake from :meth:`pause`: fence by the clock, then tick and loop again."""
        self._fence()
        await self.tick()
        self._task = asyncio.get_running_loop().create_task(self._loop(self._loop_gen))

    # ---- what the runtime asks -----------------------------------------------------------------

    def serving(self, shard: int) -> bool:
        """May this node answer for ``shard`` now (it holds the lease and its deadline is ahead)?"""
        return self.table.valid(shard, self.clock.monotonic_ms())

    def held(self) -> dict[int, int]:
        return self.table.held()

    def fence(self) -> None:
        """Stop serving (``owner.lost``) every shard whose self-fencing deadline has passed: the
        request path calls it (through a cheap check of :meth:`LeaseTable.next_deadline`) so that a
        process woken from SIGSTOP answers nothing for a shard before this ran."""
        self._fence()

    def fresh(self, max_age_ms: int | None = None) -> bool:
        """Did a tick reach the database within ``max_age_ms`` (default: the lease)? When not, the
        routing view (``nodes``, ``owner_of``) may be stale: answer COORDINATOR_NOT_AVAILABLE."""
        age = self.lease_ms if max_age_ms is None else max_age_ms
        return self.last_ok_ms is not None and self.clock.monotonic_ms() - self.last_ok_ms < age

    def request_reload(self, shard: int) -> None:
        """A write of ``shard`` failed in the database (StoreUnavailableError): take the shard again
        with ``epoch + 1`` and hand it to ``owner.acquired`` to load. The epoch bump is an UPDATE of
        the lease row, so it waits for any transaction of the old epoch still holding the row (one
        whose outcome we never learnt): the reload reads after it settled. Done by the next tick
        (at once); retried every tick while the database fails, dropped if the shard is lost."""
        if shard in self.table.held():
            self._reloads.add(shard)
            self._wake.set()

    def owner_of(self, shard: int) -> int | None:
        """The shard's owner by the last tick (None: free or lapsed)."""
        owner, _epoch, live = self.leases.get(shard, (None, 0, False))
        return owner if live else None

    # ---- the loop --------------------------------------------------------------------------------

    @property
    def _timeout(self) -> float:
        return max(self.table.renew_every_ms / 1000, 0.1)

    async def _loop(self, gen: int) -> None:
        next_tick = self.clock.monotonic_ms() + self.table.renew_every_ms
        while self._running and gen == self._loop_gen:
            self._fence()
            now = self.clock.monotonic_ms()
            wake_at = next_tick
            deadline = self.table.next_deadline()
            if deadline is not None:
                wake_at = min(wake_at, deadline)
            lapse = self._lapse_at  # a node that stopped renewing: take its shards once they lapse
            if lapse is not None:
                wake_at = min(wake_at, lapse)
            if wake_at > now and not self._wake.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), (wake_at - now) / 1000)
            if not self._running or gen != self._loop_gen:
                return
            self._fence()
            lapsed = lapse is not None and self.clock.monotonic_ms() >= lapse
            if lapsed:
                self._lapse_at = None
            if self.clock.monotonic_ms() >= next_tick or self._wake.is_set() or lapsed:
                self._wake.clear()
                next_tick = self.clock.monotonic_ms() + self.table.renew_every_ms
                try:
                    await self.tick()
                except Exception as exc:  # noqa: BLE001 - never let the loop die: renewals must go on
                    self.failed_ticks += 1
                    log.warning("leases.tick_error", error=f"{type(exc).__name__}: {exc}")
                    await self._close_conn()

    def _fence(self) -> None:
        for shard in self.table.expired(self.clock.monotonic_ms()):
            self.losses += 1
            log.warning("leases.self_fenced", shard=shard, node_id=self.node_id)
            self._lose(shard)

    def _lose(self, shard: int) -> None:
        task = self._loads.pop(shard, None)
        if task is not None:
            task.cancel()
        self._handing.pop(shard, None)  # its hand-over may go on; the lease is gone anyway
        self.owner.lost(shard)

    async def tick(self) -> None:
        """One round: heartbeat and renew, read the cluster, release and take shares."""
        self._fence()
        try:
            conn = await self._ensure_conn()
            sent = self.clock.monotonic_ms()
            started = time.perf_counter()
            alive = await conn.fetchval(HEARTBEAT_SQL, self.node_id, self.incarnation, self.lease_ms,
                                        timeout=self._timeout)
            if self.on_roundtrip is not None:
                self.on_roundtrip(time.perf_counter() - started)
            held = self.table.held()
            shards = list(held)
            renewed = {r[0] for r in await conn.fetch(RENEW_SQL, shards, [held[s] for s in shards], self.node_id,
                                                      self.lease_ms, timeout=self._timeout)} if shards else set()
            self.table.renewed(renewed, sent)
            self.renewals += len(renewed)
            for shard in shards:
                if shard not in renewed and self.table.epoch(shard) == held[shard]:
                    self.table.drop(shard)
                    self.losses += 1
                    log.warning("leases.lost", shard=shard, epoch=held[shard], node_id=self.node_id)
                    self._lose(shard)
            if self._unloaded:  # shards the owner failed to load: free their leases for another try
                failed = dict(self._unloaded)
                shards = list(failed)
                await conn.fetch(RELEASE_SQL, shards, [failed[s] for s in shards], self.node_id,
                                 timeout=self._timeout)
                for shard in shards:
                    self._unloaded.pop(shard, None)
                await self._notify()
            for shard in sorted(self._reloads):
                await self._bump(conn, shard)
            if alive is None:  # our node row lapsed and was taken, or removed: register again
                log.warning("leases.node_row_lost", node_id=self.node_id)
                await self._register(0)
            nodes = await conn.fetch(VIEW_NODES_SQL, timeout=self._timeout)
            rows = await conn.fetch(VIEW_LEASES_SQL, timeout=self._timeout)
        except Exception as exc:  # noqa: BLE001 - any failure of a round: the next one starts afresh
            self.failed_ticks += 1
            log.warning("leases.tick_failed", error=str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            await self._close_conn()
            return
        self.nodes = [NodeInfo(r["node_id"], r["host"], r["port"], r["rack"]) for r in nodes]
        self.leases = {r["shard"]: (r["owner"], r["epoch"], r["live"]) for r in rows}
        # wake up just after the next lease of another node lapses (by the database's clock, read
        # now): a killed node's shards are taken then, not up to a renewal interval later
        left = [r["left_ms"] for r in rows if r["live"] and r["owner"] != self.node_id and r["left_ms"] is not None]
        self._lapse_at = sent + max(min(left), 0) + LAPSE_SLACK_MS if left else None
        self.last_ok_ms = sent
        if not self._running:
            return
        if self._handing:  # hand-overs that ended since the last tick: free their leases now
            await self._release(())
        view = {s: placement.LeaseView(o, live) for s, (o, _e, live) in self.leases.items()}
        decision = placement.plan(self.node_id, [n.node_id for n in self.nodes], view, self.num_shards,
                                  mine=self.table.held())
        if decision.release:
            await self._release(decision.release)
        if decision.acquire:
            await self._acquire(decision.acquire)

    async def _bump(self, conn, shard: int) -> None:
        epoch = self.table.epoch(shard)
        if epoch is None:
            self._reloads.discard(shard)
            return
        sent = self.clock.monotonic_ms()
        new = await conn.fetchval(BUMP_SQL, shard, epoch, self.node_id, self.lease_ms, timeout=self._timeout)
        self._reloads.discard(shard)
        if self.table.epoch(shard) != epoch:
            return
        if new is None:  # lapsed or taken meanwhile
            self.table.drop(shard)
            self.losses += 1
            self._lose(shard)
            return
        task = self._loads.pop(shard, None)
        if task is not None:
            task.cancel()
        self.table.granted(shard, new, sent)
        self.leases[shard] = (self.node_id, new, True)
        log.info("leases.reloading", shard=shard, epoch=new, node_id=self.node_id)
        self._loads[shard] = asyncio.get_running_loop().create_task(self._load(shard, new))

    async def _release(self, shards) -> None:
        """Hand ``shards`` over (each ``owner.releasing`` in its own task, waited for at most
        ``handover_wait_ms``) and free the leases of every hand-over that has ended."""
        held = self.table.held()
        loop = asyncio.get_running_loop()
        for shard in shards:
            if shard in held and shard not in self._handing:
                self._handing[shard] = loop.create_task(self._hand_over(shard))
        running = [t for t in self._handing.values() if not t.done()]
        if running:
            await asyncio.wait(running, timeout=self.handover_wait_ms / 1000)
        shards = []
        for shard, task in list(self._handing.items()):
            if task.done():
                del self._handing[shard]
                if shard in held:
                    shards.append(shard)
        if not shards:
            return
        for shard in shards:  # handed over: not served from now on, before another node can take it
            self.table.drop(shard)
        try:
            await self._conn.fetch(RELEASE_SQL, shards, [held[s] for s in shards], self.node_id,
                                   timeout=self._timeout)
            await self._notify()
        except DB_ERRORS as exc:
            log.warning("leases.release_failed", shards=shards, error=str(exc))  # they lapse on their own
        log.info("leases.released", shards=shards, node_id=self.node_id)

    async def _hand_over(self, shard: int) -> None:
        task = self._loads.pop(shard, None)
        if task is not None:
            task.cancel()
        try:
            await self.owner.releasing(shard)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the lease is freed all the same
            log.warning("leases.handover_failed", shard=shard, error=str(exc))

    async def _acquire(self, shards) -> None:
        sent = self.clock.monotonic_ms()
        try:
            rows = await self._conn.fetch(ACQUIRE_SQL, list(shards), self.node_id, self.incarnation, self.lease_ms,
                                          timeout=self._timeout)
        except DB_ERRORS as exc:
            log.warning("leases.acquire_failed", shards=list(shards), error=str(exc))
            await self._close_conn()
            return
        for row in rows:
            shard, epoch = row["shard"], row["epoch"]
            self.table.granted(shard, epoch, sent)
            self.acquisitions += 1
            self.leases[shard] = (self.node_id, epoch, True)
            self._loads[shard] = asyncio.get_running_loop().create_task(self._load(shard, epoch))
        if rows:
            log.info("leases.acquired", shards=[r["shard"] for r in rows], node_id=self.node_id)
            await self._notify()  # the others refresh their routing view now, not a renewal later

    async def _load(self, shard: int, epoch: int) -> None:
        try:
            await self.owner.acquired(shard, epoch)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - the owner could not load it: let another node try
            log.warning("leases.load_failed", shard=shard, epoch=epoch, error=str(exc))
            if self.table.epoch(shard) == epoch:
                self.table.drop(shard)
                self.owner.lost(shard)
                self._unloaded[shard] = epoch  # the next tick frees the lease (one user of the connection)
                self._wake.set()
        finally:
            if self._loads.get(shard) is asyncio.current_task():
                del self._loads[shard]

    # ---- database --------------------------------------------------------------------------------

    async def _ensure_conn(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            self._conn = await connect(self.url, timeout=max(self._timeout, 1.0))
            await self._conn.add_listener(CHANNEL, self._notified)
        return self._conn

    async def _close_conn(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            conn.terminate()

    def _notified(self, *_args) -> None:
        self._wake.set()

    async def _notify(self) -> None:
        with contextlib.suppress(*DB_ERRORS):
            await self._conn.execute(f"NOTIFY {CHANNEL}, '{self.node_id}'", timeout=self._timeout)

    async def _register(self, wait_ms: int) -> None:
        conn = self._conn
        loop = asyncio.get_running_loop()
        deadline = loop.time() + wait_ms / 1000
        while True:
            got = await conn.fetchval(REGISTER_SQL, self.node_id, self.incarnation, self.host, self.port, self.rack,
                                      self.lease_ms, timeout=max(self._timeout, 1.0))
            if got is not None:
                return
            if loop.time() >= deadline:
                row = await conn.fetchrow(LIVE_NODE_SQL, self.node_id)
                where = f" ({row['host']}:{row['port']}, last heartbeat {float(row['ago']):.1f} s ago)" if row else ""
                raise DuplicateNodeError(f"node_id {self.node_id} is already live in this cluster{where}: "
                                         "give every node its own node_id")
            await asyncio.sleep(min(0.2, max(deadline - loop.time(), 0.01)))

    async def _cancel_loop(self, cancel_loads: bool = True) -> None:
        # Python 3.11's wait_for can swallow a cancellation that arrives as the wait ends (gh-86296):
        # the loop then carried on and the await below never returned (a paused test node hung CI).
        # Moving the generation on ends that loop at its next check whatever became of the cancel.
        self._loop_gen += 1
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if cancel_loads:
            for shard in list(self._loads):
                self._loads.pop(shard).cancel()
            for shard in list(self._handing):
                self._handing.pop(shard).cancel()
