"""Runs the pure cores on the event loop.

Feeds requests and timer ticks to the group coordinator and the topic catalog, stages the records
they produce in the store (:class:`coordinator.store.Store`; written once per loop turn by
``_flush``; with the file store under ``fsync=always`` made durable off the loop), and releases
replies only once the records they depend on are durable:

* A result with writes: its replies leave when all of its writes are on disk (fsync'd under
  ``fsync=always``). The log writes each shard's entries in order, so this also orders replies
  behind every earlier write of the same shards.
* A result without writes for a group whose shard has a write in flight: its replies wait for that
  write, so nobody learns state (an assignment, a committed offset) before it is durable.
* A write that fails marks the shard failed (``GroupCoordinator.fail_shard``): the waiting replies
  become COORDINATOR_NOT_AVAILABLE (retriable) and the shard stops accepting requests. herd does
  not pretend: it never retries an fsync that failed.
* A write refused because this node no longer owns the shard (:class:`ShardFencedError`, from a
  store shared by several nodes) unloads the shard: the waiting replies become NOT_COORDINATOR
  and the clients look up the new owner.

One ``loop.call_later`` tracks the coordinator's next deadline. Time comes from one
:class:`~coordinator.clock.Clock` (``now`` monotonic, ``wall`` epoch ms), read here and passed to
the cores, which never read a clock.

The edge (``coordinator.server``) and the runtime talk through two small explicit interfaces:

* a request's *token* (the server's ``Reply``): ``reply(response)`` answers it; ``park(timer)``
  says it waits for ``timer`` (a long-polling Fetch); ``hold()`` says its request is done but its
  answer waits for the store (the connection may handle its next request; the answer still
  leaves in request order). :meth:`Runtime.dispatch` calls at most these on the token it is given.
* the *edge* (the ``Server``, given by :meth:`Runtime.attach_edge`): ``begin_batch()`` and
  ``end_batch()`` around the answers one store report releases, so each connection's answers
  leave in one write.

Shard states
------------
Each shard is in one of the states of :data:`SHARD_STATES`; the table says what a request for one
of its groups gets (the core answers it, see ``GroupCoordinator.refuse``), :data:`TRANSITIONS`
where it may go (anything else raises). With the file store every shard goes NOT_OWNED ->
LOADING -> ACTIVE at start-up and may go to FAILED after a failed write; a store whose shards
are owned through leases adds the moves driven by leases (load on winning one, unload on losing
one) without new states.

Which shards this process serves is an *ownership* object given at construction
(:class:`Ownership`; default :class:`OwnsEveryShard`, the file store's: every shard, for good):
``guard()`` runs before every group request and heartbeat, ConsumerGroupHeartbeat's steady path at
the edge too (a cluster node's self-fencing, checked on the request path), and
``shard_failed(shard)`` hears a write failure that put a shard in FAILED and says whether the shard
will be reloaded (a cluster node takes it again with a fresh epoch once the database answers:
FAILED -> NOT_OWNED -> LOADING -> ACTIVE through :meth:`Runtime.unload_shard` and
:meth:`Runtime.load_shard`) or stays FAILED until restart. A *topic store*
(:class:`TopicStore`, given at construction; None: topics are records of shard 0) keeps the
catalog outside the shards (a database table shared by every node): a catalog request that creates
topics puts them there (``await topic_store.put(key, value) -> the stored value``; the first
writer's wins, and the request is answered again from the catalog when another node's was kept).
"""
from __future__ import annotations

import asyncio
import collections
import time
from typing import Protocol

from coordinator import logging_setup
from coordinator.clock import SystemClock
from coordinator.core.auth.acls import AclManager, is_acl_record
from coordinator.core.catalog import Catalog, is_topic_record
from coordinator.core.responses import error_response
from coordinator.core.result import Result
from coordinator.core.versions import (
    ACL_APIS,
    CREATE_TOPICS,
    FETCH,
    GROUP_APIS,
    LIST_OFFSETS,
    METADATA,
)
from coordinator.ops.stall import StallDetector
from coordinator.store import ShardFencedError
from protocol import errors as E

log = logging_setup.get("herd.runtime")

FETCH_WAIT_CAP_MS = 30_000
_CATALOG_WRITES = frozenset({METADATA, CREATE_TOPICS})  # may create topics: refused while closing
# Records replayed between two turns of the event loop at start-up (~30 ms of replay): /healthz and
# the signal handlers are answered during a replay of any length.
REPLAY_STEP = 20_000
# Answers released at once beyond this many (a big group's JoinGroup or SyncGroup fan-out: one
# answer per member) leave in slices of this size, one slice per loop turn, so the other
# connections' requests are served between them (issue 31 item 4). The order of a connection's
# answers is unchanged: a parked request holds its connection, a held one keeps its place.
RELEASE_SLICE = 128  # ~2-4 ms of answers (encode + one socket write each)


NOT_OWNED, LOADING, ACTIVE, FAILED = "not-owned", "loading", "active", "failed"
# state -> the error a request for a group of a shard in that state gets (NONE: served)
SHARD_STATES = {
    NOT_OWNED: E.NOT_COORDINATOR,  # another node's (or nobody's yet): look the coordinator up again
    LOADING: E.COORDINATOR_LOAD_IN_PROGRESS,  # being replayed: retry soon
    ACTIVE: E.NONE,
    FAILED: E.COORDINATOR_NOT_AVAILABLE,  # a write failed: refused until restart (or unloaded)
}
TRANSITIONS = {
    NOT_OWNED: frozenset({LOADING}),
    LOADING: frozenset({ACTIVE, NOT_OWNED}),
    ACTIVE: frozenset({FAILED, NOT_OWNED}),
    FAILED: frozenset({NOT_OWNED}),
}


class Ownership(Protocol):
    """Which shards this process serves, as the runtime asks it (see the module docstring)."""

    def guard(self) -> None:
        """Before every group request and heartbeat: stop serving what may no longer be ours."""

    def shard_failed(self, shard_id: int) -> bool:
        """A write of ``shard_id`` failed (it is FAILED now): True if it will be reloaded."""


class TopicStore(Protocol):
    """Topics kept outside the shards (a cluster's database): the first writer's record wins."""

    async def put(self, key: bytes, value: bytes) -> bytes:
        """Keep the topic record; -> the record stored (another node's if it was first)."""


class OwnsEveryShard:
    """One process alone (the file store): it owns every shard for good, fences nothing, and a
    shard whose write failed stays FAILED until restart."""

    def guard(self) -> None:
        pass

    def shard_failed(self, shard_id: int) -> bool:
        return False


class _Waiter:
    """Replies held until ``count`` shards have made the writes they wait for durable."""

    __slots__ = ("runtime", "count", "result", "on_failure", "failed")

    def __init__(self, runtime, count, result, on_failure):
        self.runtime = runtime
        self.count = count
        self.result = result
        self.on_failure = on_failure
        self.failed = E.NONE  # the error the replies get instead, once a write they wait for failed

    def done(self, shard_id: int, exc: BaseException | None) -> None:
        if exc is not None:
            fenced = isinstance(exc, ShardFencedError)
            if self.failed != E.NOT_COORDINATOR:
                self.failed = E.NOT_COORDINATOR if fenced else E.COORDINATOR_NOT_AVAILABLE
            self.runtime.write_failed(shard_id, exc)
        self.count -= 1
        if self.count == 0:
            replies = self.on_failure(self.result, self.failed) if self.failed else self.result.replies
            self.runtime.release(replies)


def _popping(queue: collections.deque):
    while queue:
        yield queue.popleft()


def _group_failure(result, code: int):
    return result.failure_replies(code)


def _catalog_failure(result, code: int):
    return [(token, error_response(token.api_key, token.api_version, token.request, E.UNKNOWN_SERVER_ERROR))
            for token, _ in result.replies]


class Runtime:
    def __init__(self, config, groups, catalog: Catalog, store, clock=None, metrics=None, *,
                 ownership: Ownership | None = None, topic_store: TopicStore | None = None, data=None,
                 acl_store=None):
        self.config = config
        # the data cluster as the catalog (coordinator.ops.datacatalog.DataCatalog), None without one: a
        # Metadata naming topics never read waits for their read (bounded); ListOffsets is its answer
        self.data = data
        if data is not None:
            data.on_change = self.topics_changed  # a topic made, grown or deleted there: consumer groups see it
        self.groups = groups
        self.catalog = catalog
        groups.set_topics(catalog)  # consumer groups assign the catalog's topics (by topic id)
        self.store = store
        self.clock = clock if clock is not None else SystemClock()
        self.metrics = metrics
        self.loop: asyncio.AbstractEventLoop | None = None
        # Per shard: the last write sequence number handed to the store, the last one known
        # durable, and the waiters (seq, _Waiter) in seq order. See apply() and _durable().
        n = config.offsets_partitions
        self._submitted = [0] * n
        self._durable_seq = [0] * n
        self._waiting: list[collections.deque] = [collections.deque() for _ in range(n)]
        self._flush_scheduled = False
        self._timer = None
        self._timer_at: int | None = None
        self._closing = False
        self._release_batch: list | None = None  # replies released while settling (see _settle)
        self._outbox: collections.deque = collections.deque()  # big fan-outs' answers still to send (release)
        self.shard_states = [NOT_OWNED] * n  # see SHARD_STATES; moved only by _move()
        for shard_id in range(n):
            groups.refuse(shard_id, SHARD_STATES[NOT_OWNED])
        self._completed: collections.deque = collections.deque()  # (shard, seq, exc) from the writer
        self._drain_scheduled = False
        self._edge = None  # the Server (attach_edge): answers released together leave together
        # see the module docstring: which shards are served, where topics are kept (None: shard 0)
        self.ownership = ownership if ownership is not None else OwnsEveryShard()
        self._guard = self.ownership.guard
        self.topic_store = topic_store
        # the ACLs (coordinator.core.auth.acls): replayed from the catalog shard, served by the ACL APIs
        self.acls = AclManager.from_config(config)
        self.acl_store = acl_store  # a cluster node's: the ACL records go to the database, not shard 0
        self._data_jobs: set = set()  # Metadata/ListOffsets waiting for the data cluster
        store.set_listener(self._on_durable)
        # herd's own stalls (coordinator.stall): started with the loop; while _held, no timer of
        # the core fires (the sockets are read first); listeners get (stall_ms, kind) (metrics)
        self.stall: StallDetector | None = None
        self.stall_listeners: list = []
        self._held = False

    def now_ms(self) -> int:
        return self.clock.monotonic_ms()

    def attach_edge(self, edge) -> None:
        """``edge.begin_batch()`` / ``edge.end_batch()`` bracket every batch of released answers."""
        self._edge = edge

    # ---- start-up ----------------------------------------------------------------------------

    async def load_owned(self, stop: asyncio.Event | None = None) -> dict | None:
        """Start-up: load every shard the store gives this node (``store.owned_shards()``) and
        replay it, letting the event loop run every REPLAY_STEP records (/healthz, signals); the
        shards go LOADING, then ACTIVE together. -> the replay stats, or None when ``stop`` was
        set first (nothing is served then)."""
        store = self.store
        owned = list(store.owned_shards())
        for shard_id in owned:
            self._move(shard_id, LOADING)
        shards = {}
        for shard_id in owned:
            shards[shard_id] = await store.load(shard_id)
        steps = self.replay_steps(shards, owned=owned)
        del shards
        while stop is None or not stop.is_set():
            try:
                next(steps)
            except StopIteration as done:
                return done.value
            await asyncio.sleep(0)  # a turn of the loop: /healthz, signals
        return None

    async def load_shard(self, shard_id: int) -> int:
        """Start serving one more shard (a cluster node that won its lease): LOADING, its entries
        from ``store.load`` replayed (the loop turns every REPLAY_STEP records), ACTIVE.
        -> the records replayed."""
        if self.shard_states[shard_id] != LOADING:
            self._move(shard_id, LOADING)
        entries = await self.store.load(shard_id)
        steps = self.replay_steps({shard_id: entries}, owned=(shard_id,))
        del entries
        while True:
            try:
                next(steps)
            except StopIteration as done:
                if self.loop is not None:  # the catalog may have moved while another node had it
                    self.topics_changed()
                return done.value["records"]
            await asyncio.sleep(0)

    def unload_shard(self, shard_id: int) -> None:
        """Stop serving a shard (a cluster node that lost its lease): NOT_OWNED; requests parked in
        it are answered NOT_COORDINATOR and its state is forgotten."""
        self._move(shard_id, NOT_OWNED)

    def replay(self, shards, owned=None) -> dict:
        """Feed every shard's entries to the cores and start serving the ``owned`` shards (default:
        every shard, as with the file store). ``shards``: shard id -> iterable of (key, value)."""
        steps = self.replay_steps(shards, owned=owned)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value

    def replay_steps(self, shards, every: int = REPLAY_STEP, owned=None):
        """:meth:`replay` as a generator that pauses after every ``every`` records, so that the
        caller can let the event loop run between steps (``herd serve`` answers /healthz and
        signals during a long replay); returns the stats as :meth:`replay` does."""
        started = time.perf_counter()
        owned = range(self.config.offsets_partitions) if owned is None else list(owned)
        for shard_id in owned:
            if self.shard_states[shard_id] != LOADING:
                self._move(shard_id, LOADING)
        count = 0
        pause_at = every
        groups_replay = self.groups.replay
        catalog_replay = self.catalog.replay
        acl_replay = self.acls.replay
        for shard_id in owned:
            for key, value in shards.get(shard_id, ()):
                if is_topic_record(key):
                    catalog_replay(key, value)
                elif is_acl_record(key):
                    acl_replay(key, value)
                else:
                    groups_replay(shard_id, key, value)
                count += 1
                if count == pause_at:
                    pause_at += every
                    yield count
        now, wall = self.clock.monotonic_ms(), self.clock.wall_ms()
        for shard_id in owned:
            self._move(shard_id, ACTIVE, now, wall)
        return {"records": count, "seconds": round(time.perf_counter() - started, 3)}

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        writes = self.catalog.configured_topics()
        if writes:
            self._catalog_result(Result(writes, []), None)
        # looks from now on: the replay before was no stall (loaded members got fresh deadlines)
        self.stall = StallDetector(self.clock, self.config.stall_threshold_ms,
                                   on_stall=self._on_stall).start(loop)
        self.topics_changed()  # also when nothing changed now: the catalog may have moved since
        self.arm(force=True)

    def replay_topics(self, records) -> int:
        """Topic records read from outside the shards (a cluster's database: ``(key, value)``s)
        go to the catalog; once serving, consumer groups see the change. -> how many."""
        count = 0
        for key, value in records:
            self.catalog.replay(key, value)
            count += 1
        if count and self.loop is not None:
            self.topics_changed()
        return count

    def topics_changed(self) -> None:
        """Topics were created or grown: consumer groups subscribed to them get a new epoch."""
        clock = self.clock
        self.apply(self.groups.topics_changed(clock.monotonic_ms(), clock.wall_ms()))

    def forget_pending(self, pending) -> None:
        """A connection closed: the pending member ids its JoinGroups were answered with
        (MEMBER_ID_REQUIRED) and never used stop holding their groups' join phases."""
        if self._closing:
            return
        clock = self.clock
        self.apply(self.groups.forget_pending(pending, clock.monotonic_ms(), clock.wall_ms()))

    # ---- requests ----------------------------------------------------------------------------

    def dispatch(self, token, api_key: int, version: int, request, client_id: str, client_host: str) -> None:
        """Handle one request (any but Heartbeat, see :meth:`heartbeat`): its answer goes to
        ``token`` now, or once what it depends on is durable (``token.hold()`` first), or later
        (parked)."""
        if self._closing and (api_key in GROUP_APIS or api_key in _CATALOG_WRITES):
            token.reply(error_response(api_key, version, request, E.NOT_COORDINATOR))
            return
        # while closing, the catalog's reads (FindCoordinator, ListOffsets, Fetch, DescribeCluster)
        # are answered as usual: they write nothing (they have no NOT_COORDINATOR answer of their own)
        if api_key in GROUP_APIS:
            self._guard()
            clock = self.clock
            now = clock.monotonic_ms()
            stall = self.stall
            if stall is not None and now - stall.last_seen >= stall.threshold_ms > 0:
                self._stall_check()
            self.apply(self.groups.handle(api_key, version, request, token, now, clock.wall_ms(),
                                          client_id, client_host))
            self.arm()
            return
        if api_key in ACL_APIS:
            result = self.acls.handle(api_key, version, request, token)
            if result.writes and self.acl_store is not None:
                for t, _ in result.replies:
                    t.hold()
                self.loop.create_task(self._put_acls(result))
            else:
                self.apply(result)
            return
        if api_key == FETCH:  # an empty log: a long poll waits its max_wait_ms out, then answers
            resp = self.catalog.fetch(request, version)
            wait = min(max(request.max_wait_ms, 0), FETCH_WAIT_CAP_MS)
            if wait and request.min_bytes > 0:
                token.park(self.loop.call_later(wait / 1000, token.reply, resp))
            else:
                token.reply(resp)
            return
        if self.data is not None and api_key in (METADATA, LIST_OFFSETS) and self._from_data(
                token, api_key, version, request):
            return
        result = self.catalog.handle(api_key, version, request, token, self.clock.monotonic_ms())
        self._catalog_result(result, (api_key, version, request, token))
        if result.writes:  # a topic created (CreateTopics, or Metadata's auto-creation)
            self.topics_changed()
            self.arm()

    def _from_data(self, token, api_key: int, version: int, request) -> bool:
        """With a data cluster: a ListOffsets, or a Metadata naming topics never read, is answered
        once the data cluster has (bounded by the data catalog's wait); -> whether it was taken."""
        if api_key == METADATA:
            need = self.catalog.data_needs(request, version, self.clock.monotonic_ms())
            if need is None:
                return False
            job = self._metadata_after_read(need, token, version, request)
        else:
            job = self._list_offsets_from_data(token, version, request)
        token.hold()
        task = self.loop.create_task(job)
        self._data_jobs.add(task)
        task.add_done_callback(self._data_jobs.discard)
        return True

    async def _metadata_after_read(self, names, token, version: int, request) -> None:
        try:
            await self.data.read(names)
            result = self.catalog.handle(METADATA, version, request, token, self.clock.monotonic_ms())
            replies = result.replies
        except Exception:  # noqa: BLE001 - our bug: logged, the request still gets an answer
            log.exception("metadata from the data cluster failed", topics=len(names))
            replies = [(token, error_response(METADATA, version, request, E.UNKNOWN_SERVER_ERROR))]
        self.release(replies)

    async def _list_offsets_from_data(self, token, version: int, request) -> None:
        try:
            resp = await self.data.list_offsets(request, version)
        except Exception:  # noqa: BLE001 - our bug: logged, the request still gets an answer
            log.exception("list offsets from the data cluster failed")
            resp = self.catalog.list_offsets_answer(request, version, {})  # every partition retriable
        token.reply(resp)

    def _catalog_result(self, result, request) -> None:
        if not result.writes or self.topic_store is None:
            self.apply(result, _catalog_failure)
            return
        for token, _ in result.replies:
            token.hold()
        self.loop.create_task(self._put_topics(result, request))

    async def _put_acls(self, result) -> None:
        """A cluster node's ACL changes go to ``acl_store`` (the database) before their answer
        leaves; a failure answers as a failed write does (the change stays in this node's memory
        until the next refresh reads the database's ACLs back)."""
        try:
            for _shard, key, value in result.writes:
                await self.acl_store.put_acl(key, value)
        except Exception as exc:  # noqa: BLE001 - the store's failure becomes the answer
            log.warning("ACLs not stored", error=str(exc))
            self.release(result.failure_replies(E.UNKNOWN_SERVER_ERROR))
            return
        self.release(result.replies)

    async def _put_topics(self, result, request) -> None:
        """The topics a catalog request created go to ``topic_store`` before its answer leaves. A
        topic another node stored first is adopted (replayed) and the request answered again; a
        failure forgets the topics not stored and answers as a failed write does."""
        catalog = self.catalog
        adopted = False
        pending = list(result.writes)
        try:
            while pending:
                _shard, key, value = pending[0]
                stored = await self.topic_store.put(key, value)
                pending.pop(0)
                if stored != value:
                    catalog.replay(key, stored)
                    adopted = True
        except Exception as exc:  # noqa: BLE001 - the store's failure becomes the answer
            log.warning("topics not stored", error=str(exc), topics=len(pending))
            for _shard, key, _value in pending:
                catalog.replay(key, None)
            self.release(_catalog_failure(result, E.UNKNOWN_SERVER_ERROR))
            return
        if adopted and request is not None and result.replies:
            again = catalog.handle(*request)
            if not again.writes:
                self.release(again.replies)
                return
        self.release(result.replies)

    def heartbeat(self, version: int, request) -> int:
        """Heartbeat's one path (the edge answers it in place with cached bytes): it writes
        nothing and waits for nothing: -> its error code, now."""
        if self._closing:
            return E.NOT_COORDINATOR
        self._guard()
        now = self.clock.monotonic_ms()
        stall = self.stall
        if stall is not None and now - stall.last_seen >= stall.threshold_ms > 0:
            self._stall_check()
        code = self.groups.heartbeat(version, request, now)
        self.arm()
        return code

    def consumer_heartbeat_steady(self, group_id: str, member_id: str, member_epoch: int, client_id: str,
                                  client_host: str) -> int | None:
        """A ConsumerGroupHeartbeat that changes nothing, answered at the edge (see
        GroupCoordinator.consumer_heartbeat_steady): -> its heartbeat interval, or None: dispatch
        it. Only when no write of its shard is in flight: the full path's answer would wait for
        that write to be durable (and get its error if it failed)."""
        if self._closing:
            return None
        self._guard()  # a cluster node: no answer for a shard whose lease may have lapsed
        now = self.clock.monotonic_ms()
        stall = self.stall
        if stall is not None and now - stall.last_seen >= stall.threshold_ms > 0:
            self._stall_check()
        interval = self.groups.consumer_heartbeat_steady(group_id, member_id, member_epoch, client_id, client_host,
                                                         now, self._write_pending)
        if interval is not None:
            self.arm()
        return interval

    def _write_pending(self, shard_id: int) -> bool:
        return self._submitted[shard_id] > self._durable_seq[shard_id]

    # ---- writes and replies --------------------------------------------------------------------

    def apply(self, result, on_failure=_group_failure) -> None:
        """Stage the result's writes; send its replies once they (and any earlier pending writes
        of ``result.shards``) are durable.

        Each shard's writes carry increasing sequence numbers and the store makes them durable in
        that order, so "every write of shard S up to n is durable" is one number per shard: a reply
        waits for the last sequence number of each shard it depends on. The writes of one loop
        iteration reach the writer thread together (one hand-over, see _flush). What the core
        left for later (``result.later``: a big group's answers in slices) runs in the next loop
        turns, one slice per callback, after whatever else is ready (a small group's heartbeat)."""
        if result.later is not None:
            self._schedule_later(result.later)
        waits = None
        if result.writes:
            store = self.store
            by_shard: dict[int, list] = {}
            for shard_id, key, value in result.writes:
                entries = by_shard.get(shard_id)
                if entries is None:
                    by_shard[shard_id] = [(key, value)]
                else:
                    entries.append((key, value))
            waits = {}
            for shard_id, entries in by_shard.items():
                waits[shard_id] = self._submitted[shard_id] = store.submit(shard_id, entries)
            if not self._flush_scheduled:
                self._flush_scheduled = True
                self.loop.call_soon(self._flush)
        submitted, durable = self._submitted, self._durable_seq
        for shard_id in result.shards:
            seq = submitted[shard_id]
            if seq > durable[shard_id]:
                if waits is None:
                    waits = {}
                waits.setdefault(shard_id, seq)
        if not waits:
            if result.replies:
                self.release(result.replies)
            return
        waiter = _Waiter(self, len(waits), result, on_failure)
        for token, _ in result.replies:
            token.hold()  # its request is done: the connection may handle the next one
        for shard_id, seq in waits.items():
            self._waiting[shard_id].append((seq, waiter))

    def _schedule_later(self, slices) -> None:
        loop = self.loop
        for more in slices:
            if loop is None or not loop.is_running():
                self._run_later(more)  # no loop turns (tests driving the runtime directly)
            else:
                loop.call_soon(self._run_later, more)

    def _run_later(self, more) -> None:
        """One slice of an operation the core cut up (Result.later)."""
        if self._closing:
            return  # shutdown answered every parked request
        self._guard()  # a cluster node: a shard whose lease may have lapsed is unloaded (the slice finds no group)
        clock = self.clock
        try:
            result = more(clock.monotonic_ms(), clock.wall_ms())
        except Exception:  # our bug: log it; the requests it would have answered wait for their timeouts
            log.exception("error in a later slice of a group operation")
            return
        self.apply(result)
        self.arm()

    def _flush(self) -> None:
        """Write what this loop iteration staged. The store writes on this thread and returns what
        is settled at once (everything under fsync=never, so a commit is answered in this turn
        without a thread hand-off; under always only immediate failures); the rest comes through
        :meth:`_on_durable` once fsync'd."""
        self._flush_scheduled = False
        settled = self.store.flush()
        if settled:
            self._settle(settled)

    def _settle(self, results) -> None:
        """Settle what the store made durable. The replies of every result this releases leave
        as one fan-out (the first RELEASE_SLICE now, the rest a slice per loop turn): a write that
        thousands of answers waited for (a big group's, in many results) does not send them all
        in this turn."""
        edge = self._edge
        if edge is not None:
            edge.begin_batch()
        nested = self._release_batch is not None
        if not nested:
            batch = self._release_batch = []
        try:
            settle = self._settle_one
            for shard_id, seq, exc in results:
                settle(shard_id, seq, exc)
        finally:
            if not nested:
                self._release_batch = None
                if batch:
                    self.release(batch)
            if edge is not None:
                edge.end_batch()

    def _on_durable(self, results) -> None:
        """The store's listener, called in a log thread for what flush() could not settle: queue the
        results and wake the loop once (not once per write)."""
        self._completed.extend(results)
        if not self._drain_scheduled:
            self._drain_scheduled = True
            loop = self.loop
            if loop is not None and not loop.is_closed():
                loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self._drain_scheduled = False
        self._settle(_popping(self._completed))  # one at a time: a settle that raises loses no other

    def _settle_one(self, shard_id: int, seq: int, exc) -> None:
        """Every write of ``shard_id`` up to ``seq`` is durable (or failed with ``exc``)."""
        if seq > self._durable_seq[shard_id]:
            self._durable_seq[shard_id] = seq  # settled: durable, or failed (then the shard refuses work)
        queue = self._waiting[shard_id]
        while queue and queue[0][0] <= seq:
            queue.popleft()[1].done(shard_id, exc)

    def release(self, replies) -> None:
        batch = self._release_batch
        if batch is not None:  # settling: released together at its end
            batch.extend(replies)
            return
        loop = self.loop
        if len(replies) <= RELEASE_SLICE or loop is None or not loop.is_running():
            for token, resp in replies:
                token.reply(resp)
            return
        outbox = self._outbox
        if not outbox:
            for token, resp in replies[:RELEASE_SLICE]:
                token.reply(resp)
            outbox.append([replies, RELEASE_SLICE])
            loop.call_soon(self._release_slice)
        else:  # behind the fan-outs already waiting: RELEASE_SLICE per turn for all of them together
            outbox.append([replies, 0])

    def _release_slice(self) -> None:
        """The next RELEASE_SLICE answers of the big fan-outs waiting (oldest first), written
        together; again in the next loop turn while any are left."""
        outbox = self._outbox
        edge = self._edge
        if edge is not None:
            edge.begin_batch()
        try:
            budget = RELEASE_SLICE
            while outbox and budget:
                item = outbox[0]
                replies, start = item
                end = min(start + budget, len(replies))
                budget -= end - start
                if end == len(replies):
                    outbox.popleft()
                else:
                    item[1] = end
                for token, resp in replies[start:end]:
                    token.reply(resp)
        finally:
            if outbox:
                self.loop.call_soon(self._release_slice)
            if edge is not None:
                edge.end_batch()

    def write_failed(self, shard_id: int, exc: BaseException) -> None:
        """A write of ``shard_id`` failed: an I/O failure stops the shard (FAILED); a fencing
        error (another node owns the shard now) unloads it (NOT_OWNED)."""
        state = self.shard_states[shard_id]
        if isinstance(exc, ShardFencedError):
            if state in (ACTIVE, FAILED):
                log.warning("shard lost to another node; unloading it", shard=shard_id, error=str(exc))
                self._move(shard_id, NOT_OWNED)
        elif state == ACTIVE:
            self._move(shard_id, FAILED)
            if self.ownership.shard_failed(shard_id):
                log.warning("shard write failed; the shard is reloaded once the store answers again",
                            shard=shard_id, error=str(exc))
            else:
                log.error("shard write failed; the shard stops accepting requests until restart",
                          shard=shard_id, error=str(exc))

    # ---- shard states --------------------------------------------------------------------------

    def _move(self, shard_id: int, state: str, now: int | None = None, wall: int | None = None) -> None:
        """Move ``shard_id`` to ``state`` (a transition of TRANSITIONS, else RuntimeError) and make
        the core answer as SHARD_STATES says; requests parked in a shard that stops serving are
        answered now."""
        old = self.shard_states[shard_id]
        if state not in TRANSITIONS[old]:
            raise RuntimeError(f"shard {shard_id}: no transition {old} -> {state}")
        self.shard_states[shard_id] = state
        groups = self.groups
        if state == ACTIVE:
            clock = self.clock
            groups.loaded(clock.monotonic_ms() if now is None else now, clock.wall_ms() if wall is None else wall,
                          shard_ids=(shard_id,))
        elif state == NOT_OWNED:
            self.release(groups.unload(shard_id).replies)
        else:
            self.release(groups.refuse(shard_id, SHARD_STATES[state]).replies)
        if self.loop is not None:
            self.arm(force=True)

    # ---- timers ------------------------------------------------------------------------------

    def arm(self, force: bool = False) -> None:
        """Re-arm the loop timer at the coordinator's next deadline. Skipped unless a deadline may
        have moved earlier (a heartbeat only extends one: nothing to do) or ``force``."""
        groups = self.groups
        if self._held or not (force or groups.timers_changed):
            return  # held: _release_hold re-arms
        deadline = groups.next_check()
        if deadline == self._timer_at:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = deadline
        if deadline is not None and self.loop is not None:
            delay = max(0, deadline - self.now_ms()) / 1000
            self._timer = self.loop.call_later(delay, self._fire)

    def _fire(self) -> None:
        self._timer = None
        self._timer_at = None
        if self.stall is not None:
            self.stall.check()  # back from a stall? then its deadlines move and we are held
        if self._held:
            return
        clock = self.clock
        self.apply(self.groups.on_timers(clock.monotonic_ms(), clock.wall_ms()))
        self.arm(force=True)

    # ---- stalls --------------------------------------------------------------------------------

    def _stall_check(self) -> None:
        """A request is handled over ``stall_threshold_ms`` after the stall probe last looked: look
        now, before the request moves any deadline. Back from a pause, the loop reads the sockets
        before its timers run (libuv polls first), so a Heartbeat that waited in the kernel would
        otherwise set its member's deadline and then see it moved by the whole pause as well
        (a member killed during the pause kept the pause twice over)."""
        self.stall.check()

    def _on_stall(self, give_back_ms: int, kind: str, stall_ms: int) -> None:
        """herd was away for ``stall_ms`` (the detector, from a loop timer callback): every
        deadline moves ``give_back_ms`` later, and no timer of the core fires until the sockets
        have been read (the heartbeats that waited there come first)."""
        clock = self.clock
        self.groups.on_stall(stall_ms, clock.monotonic_ms(), clock.wall_ms(), shift_ms=give_back_ms)
        for listener in self.stall_listeners:
            listener(stall_ms, kind)
        self.hold_timers()

    def hold_timers(self) -> None:
        """Fire no core timer until the loop has polled its sockets: two ``call_soon`` hops. From a
        timer callback, uvloop (libuv) runs the first hop in this iteration's idle phase, then
        polls I/O (the read callbacks run), then the second hop; asyncio's own loop runs the first
        after its next select, before that select's read callbacks, and the second after them.
        (``tests/coordinator/ops/test_stall.py`` checks the order on uvloop with real sockets.)"""
        if self.loop is None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._timer_at = None
        self._held = True
        self.loop.call_soon(self._release_hold, 2)

    def _release_hold(self, hops: int) -> None:
        if hops > 1:
            self.loop.call_soon(self._release_hold, hops - 1)
            return
        self._held = False
        self.arm(force=True)

    # ---- shutdown ----------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Answer every parked request with NOT_COORDINATOR and stop the timer."""
        self._closing = True
        self._flush()
        if self.stall is not None:
            self.stall.stop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.release(self.groups.shutdown().replies)

