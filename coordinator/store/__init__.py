"""The durable store the runtime writes through: its interface, its contract and its errors.

The pure core (``coordinator.core.coordinator``, ``coordinator.core.shard``, ``coordinator.core.catalog``)
never sees a store: it returns records as ``(shard_id, key, value)`` and replays entries handed
to it. The runtime (``coordinator.runtime``) is the only caller of a :class:`Store`. The file log
(:class:`coordinator.store.filelog.FileStore`, one append-only file per shard) is one
implementation; a store kept in a database (PostgreSQL, shards owned by nodes through leases) is
meant to be another, with no change to the core or to this interface.

Contract
--------
Entries are opaque ``(key: bytes, value: bytes | None)`` pairs (``None``: a tombstone). A store
never looks inside them. Shards are numbered ``0 .. num_shards - 1``; the count is fixed for the
life of a store (groups hash to shards).

Lifecycle, on the event loop (``open``, ``load``, ``compact`` and ``close`` are awaitable: a store
does its blocking work off the loop, in an executor or its own threads, or talks asyncio)::

    await store.open()          validate (format version, shard count) and start; raises a
                                StoreError subclass with a one-line message an operator can act on
    store.set_listener(fn)      before the first submit
    store.owned_shards()        the shards this node serves once loaded (the file store: all)
    await store.load(shard)     the shard's entries in replay order (or only the latest entry of
                                each key, without tombstones: replaying either gives the same
                                state); called when this node starts serving the shard
    store.submit / flush        the write path, below
    await store.close()         write what was submitted, stop; nothing is accepted afterwards

Writing (the hot path; both calls are made on the event loop thread and must not block on I/O):

* ``submit(shard_id, entries) -> seq`` stages ``entries`` (a list built by herd; the store keeps
  it and may not copy it) and returns the shard's sequence number of this write (1, 2, ... per
  shard, never reused). Nothing is written yet.
* ``flush() -> [(shard_id, seq, exc), ...]`` is called once per event-loop turn in which something
  was submitted. It starts writing everything staged and returns what is already settled (may be
  everything, e.g. without fsync; may be nothing). The rest is reported later, exactly once, to the
  listener.
* Ordering: a shard's writes become durable (or fail) in sequence order, so ``(shard_id, seq,
  None)`` means every write of that shard up to ``seq`` is durable, and one number per shard says
  what is durable. Results of one shard are reported in increasing ``seq``.
* Durability: ``exc is None`` only once the entries survive a crash of this process and of the
  machine under the store's configured guarantee (the file store's ``fsync=always``; ``never``
  promises nothing and is for benchmarks).
* The listener ``listener(results)`` gets a list of ``(shard_id, seq, exc)``. It may be called on
  any thread (the file store: its sync or writer thread); it must be quick and thread-safe (the
  runtime queues the results and wakes the loop once).
* Failures are typed, per shard: :class:`ShardFailedError` (or the ``OSError`` itself) for an I/O
  failure: the shard refuses every later write until a restart (no failed fsync is ever retried);
  :class:`ShardFencedError` when this node no longer owns the shard (another node took it over):
  the write did not happen and none will for this shard until it is loaded again. The runtime
  answers the first with COORDINATOR_NOT_AVAILABLE (retriable, the shard stays down) and the
  second by unloading the shard and answering NOT_COORDINATOR (the client looks up the new owner).

Also: ``compact(shard_id)`` (a hint: rewrite the shard keeping live keys; stores that need none
may return at once) and ``stats()`` (per-shard :class:`ShardStats` for metrics).

Two helpers the implementations share: :func:`check_shard` (the store is open and the shard in
range) and :func:`report` (hand results to the listener, never letting its bug stop the writer).
"""
from __future__ import annotations

import abc
from collections.abc import Callable, Iterable
from dataclasses import dataclass

__all__ = ["Entry", "Store", "StoreError", "ShardFailedError", "ShardFencedError", "ShardStats",
           "Listener", "FSYNC_BUCKETS", "check_shard", "report"]

Entry = tuple[bytes, bytes | None]
Listener = Callable[[list[tuple[int, int, BaseException | None]]], None]

# upper bounds (seconds) of the durability latency buckets (herd_log_fsync_duration_seconds)
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class StoreError(Exception):
    """Base class of every store error. Its message is one line an operator can act on (``herd
    serve`` prints it and exits with status 2)."""


class ShardFailedError(StoreError):
    """An I/O failure of this shard earlier (a write or fsync failed); it takes no more writes until
    a restart."""

    def __init__(self, shard_id: int, cause: BaseException):
        self.shard = shard_id
        self.cause = cause
        super().__init__(f"log shard {shard_id} failed earlier and refuses writes until restart: {cause}")


class ShardFencedError(StoreError):
    """This node lost ownership of the shard (another node holds it now, with a newer fencing
    epoch): the write was refused. The file store never raises it (one node owns every shard)."""

    def __init__(self, shard_id: int, detail: str = ""):
        self.shard = shard_id
        super().__init__(f"shard {shard_id} is no longer owned by this node" + (f": {detail}" if detail else ""))


@dataclass(frozen=True)
class ShardStats:
    shard: int
    bytes: int  # stored size
    entries: int  # entries stored
    live_keys: int
    live_bytes: int  # framed bytes of the live entries (estimate)
    dead_bytes: int
    batches: int  # write batches
    fsyncs: int  # durable flushes of appended data (one per batch under fsync="always")
    fsync_seconds: float  # their cumulative latency
    compactions: int
    compaction_seconds: float
    failed: str | None  # the error that failed the shard
    fsync_buckets: tuple = ()  # flushes per FSYNC_BUCKETS latency bucket (not cumulative), then the rest


class Store(abc.ABC):
    """What the runtime needs from a durable store. See the module docstring for the contract."""

    num_shards: int

    @abc.abstractmethod
    async def open(self) -> None:
        """Validate and start. Raises a :class:`StoreError` subclass (one line) on anything the
        operator must fix."""

    @abc.abstractmethod
    def owned_shards(self) -> Iterable[int]:
        """The shards this node is to load and serve after :meth:`open`."""

    @abc.abstractmethod
    async def load(self, shard_id: int) -> Iterable[Entry]:
        """The shard's entries in replay order (latest-only allowed, see the module docstring)."""

    @abc.abstractmethod
    def submit(self, shard_id: int, entries: list[Entry]) -> int:
        """Stage ``entries``; -> this write's sequence number in the shard. On the loop, no I/O."""

    @abc.abstractmethod
    def flush(self) -> list[tuple[int, int, BaseException | None]]:
        """Start writing what is staged; -> the results settled now (the rest go to the listener)."""

    @abc.abstractmethod
    def set_listener(self, listener: Listener) -> None:
        """``listener(results)`` hears, once each, the results :meth:`flush` did not return."""

    @abc.abstractmethod
    async def compact(self, shard_id: int) -> dict | None:
        """Rewrite ``shard_id`` keeping only live keys (a no-op for stores that need none)."""

    @abc.abstractmethod
    def stats(self) -> list[ShardStats]:
        """Per-shard figures for metrics (owned shards)."""

    @abc.abstractmethod
    async def close(self) -> None:
        """Write everything submitted (reporting it), stop, release resources. Idempotent."""


def check_shard(state: str, shard_id: int, num_shards: int, closed: type[BaseException], what: str) -> None:
    """Raise ``closed("<what> is <state>")`` unless the store is open, ValueError unless
    ``shard_id`` is one of its ``num_shards`` shards."""
    if state != "open":
        raise closed(f"{what} is {state}")
    if not 0 <= shard_id < num_shards:
        raise ValueError(f"shard {shard_id} out of range 0..{num_shards - 1}")


def report(listener: Listener | None, results: list, log, event: str) -> None:
    """Give ``results`` (if any) to ``listener`` (if set); its exception is logged as ``event`` on
    ``log``, not raised: the listener's bug must not stop the writer."""
    if listener is not None and results:
        try:
            listener(results)
        except Exception:
            log.exception(event)
