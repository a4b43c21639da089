"""Consumer lag: the data cluster's log-end offsets against herd's committed offsets.

herd owns every committed offset and its commit time, but not the data: the log end of each topic
partition lives in the data cluster (``data_bootstrap_server``). This module keeps, per partition
that has a committed offset in any group (Empty and member-less groups included), a short history
of ``(log end, wall time)`` samples, and answers two questions about a committed offset ``c``:

* **offset lag**: ``log_end - c`` against the newest sample (never negative: a committed offset past
  the log end, e.g. a recreated topic, counts as caught up);
* **time lag**: how long ago the log end was where ``c`` is. The samples are a piecewise-linear
  picture of the log end over time; the newest sample at or below ``c`` and the one after it bracket
  the moment the log end passed ``c``, found by linear interpolation. ``c`` older than the whole
  history (a backlog produced before herd started: an idle partition's history is flat and brackets
  nothing) takes the timestamp of the record at ``c`` when the source can read it (``record_times``,
  one Fetch per leader; at most ``record_lookups`` a round, after the log ends, cached per
  (partition, offset) in a bounded LRU), else is extrapolated along the history's overall rate;
  ``c`` at or past the newest log end is 0 s. :meth:`LagTracker.lag_with_method` says which. It
  keeps growing while nothing is committed (the moment is fixed, now moves on). The same idea as
  kafka-lag-exporter's lookup table; written here from that description.

Samples are bounded per partition (``lag_history_size``): the oldest goes first, and a flat run
(nothing produced) keeps only its first and its latest point, so an idle partition costs two
samples and a window of N samples spans N changes, not N refreshes.

Pure parts (:class:`LagTracker`, :func:`time_at`) take wall time as arguments. The asyncio edge,
:class:`LagRefresher`, runs as its own task: it asks an injected :class:`LogEndSource` for log ends
in batches, each bounded by a timeout, and never runs inside a group request. When the source fails
or is late, samples stop arriving: a partition whose newest sample is older than ``stale_after_ms``
is *stale* (shown as such, left out of the lag metrics), and it recovers with the next good sample.

The source (phase 2: a reader of the data cluster, ListOffsets batched per broker) implements::

    async def fetch(partitions: list[tuple[str, int]]) -> dict[tuple[str, int], int]

returning the log end (ListOffsets LATEST) of the partitions it could read; it may raise or hang:
the refresher bounds it. A source that read some partitions but not all (one broker of several
down) raises :class:`PartialFetch` with what it read: those samples are kept, the round counts as
failed (``herd_lag_source_up`` 0) and the partitions it could not read go stale.
"""
from __future__ import annotations

import asyncio
import struct
import time
from bisect import bisect_right
from collections import OrderedDict
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from coordinator import logging_setup

__all__ = ["LogEndSource", "LagTracker", "LagRefresher", "PartialFetch", "time_at", "DEFAULT_HISTORY",
           "INTERPOLATED", "EXTRAPOLATED", "RECORD"]

log = logging_setup.get("herd.lag")

DEFAULT_HISTORY = 30
DEFAULT_RECORD_CACHE = 10_000  # record times kept, (partition, offset) pairs
RECORD_LOOKUPS = 100  # record times asked of the data cluster per refresh round, at most
INTERPOLATED, EXTRAPOLATED, RECORD = "interpolated", "extrapolated", "record"
RETAIN_STEP = 10_000
TopicPartition = tuple[str, int]


class PartialFetch(Exception):
    """Raised by a source that read some log ends but not all: ``found`` holds those it read,
    ``str()`` says why the rest could not be."""

    def __init__(self, found: dict, message: str):
        super().__init__(message)
        self.found = found


@runtime_checkable
class LogEndSource(Protocol):
    async def fetch(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        """The log-end offset of each partition it could read (missing ones are simply absent)."""
        ...


def time_at(ends, times, committed: int) -> float | None:
    """The wall time (ms) at which the log end reached ``committed``, from samples ``ends``/``times``
    (same length, times increasing, ends non-decreasing); None when it cannot be estimated (no
    samples, or ``committed`` is below a single sample / a history that never moved)."""
    n = len(ends)
    if n == 0:
        return None
    if committed >= ends[-1]:
        return float(times[-1])  # caught up: lag 0 (the caller measures from now, clamps to the sample)
    i = bisect_right(ends, committed) - 1  # the newest sample at or below committed
    if i >= 0:
        # ends[i] <= committed < ends[i + 1]: the log end passed committed between the two samples
        e0, t0, e1, t1 = ends[i], times[i], ends[i + 1], times[i + 1]
        return t0 + (committed - e0) * (t1 - t0) / (e1 - e0)
    # older than the whole history: extrapolate along its overall rate
    if n < 2 or ends[-1] == ends[0]:
        return None
    rate = (ends[-1] - ends[0]) / (times[-1] - times[0])  # offsets per ms
    return times[0] - (ends[0] - committed) / rate


_Q = struct.Struct("=q")  # native order, as memoryview.cast("q") reads it
_pack, _unpack_from, _pack_into = _Q.pack, _Q.unpack_from, _Q.pack_into


def _last(buf: bytearray) -> int:
    return _unpack_from(buf, len(buf) - 8)[0]


class LagTracker:
    """Log-end samples per topic partition. Pure: wall times come in as arguments.

    A partition's samples are two bytearrays of int64 (log ends, wall ms) in a tuple: no object
    the cyclic GC must walk (bytearrays are not tracked, and a tuple of untracked objects is
    untracked at the next collection), so 100,000 tracked partitions never lengthen a GC pause."""

    def __init__(self, history: int = DEFAULT_HISTORY, stale_after_ms: int = 60_000,
                 record_cache_size: int = DEFAULT_RECORD_CACHE):
        if history < 2:
            raise ValueError("lag history needs at least 2 samples")
        self.history = history
        self.stale_after_ms = stale_after_ms
        self.series: dict[TopicPartition, tuple[bytearray, bytearray]] = {}
        # record times (epoch ms) of committed offsets older than their partition's history, by
        # (partition, offset), least recently used first; and the offsets waiting for one
        self.record_cache_size = record_cache_size
        self.record_ms: OrderedDict[tuple[TopicPartition, int], int] = OrderedDict()
        self.wanted: dict[tuple[TopicPartition, int], None] = {}

    def __len__(self) -> int:
        return len(self.series)

    def observe(self, log_ends: dict[TopicPartition, int], wall_ms: int) -> None:
        """Record one sample per partition, taken at ``wall_ms``."""
        series = self.series
        limit = 8 * self.history
        at = _pack(wall_ms)
        for tp, end in log_ends.items():
            s = series.get(tp)
            if s is None:
                series[tp] = (bytearray(_pack(end)), bytearray(at))
                continue
            ends, times = s
            n = len(ends)
            if wall_ms <= _unpack_from(times, n - 8)[0]:
                continue  # out of order (a batch answered after a newer one): keep the newer
            last = _unpack_from(ends, n - 8)[0]
            if end < last:  # the log end went back (topic recreated, truncated): start over
                series[tp] = (bytearray(_pack(end)), bytearray(at))
                self._forget_record_times({tp})
                continue
            if end == last and n > 8 and _unpack_from(ends, n - 16)[0] == last:
                _pack_into(times, n - 8, wall_ms)  # a flat run keeps its first and its latest point
                continue
            if n >= limit:
                del ends[:8]
                del times[:8]
            ends += _pack(end)
            times += at

    def _forget_record_times(self, tps) -> None:
        """Record times of these partitions no longer hold (their log was recreated)."""
        for key in [k for k in self.record_ms if k[0] in tps]:
            del self.record_ms[key]

    def retain_among(self, candidates, partitions) -> int:
        """Of ``candidates``, forget those not in ``partitions``; returns how many."""
        series = self.series
        gone = [tp for tp in candidates if tp not in partitions and tp in series]
        for tp in gone:
            del series[tp]
        return len(gone)

    def retain(self, partitions) -> int:
        """Forget partitions no longer committed in any group; returns how many were dropped."""
        return self.retain_among(list(self.series), partitions)

    def log_end(self, tp: TopicPartition) -> int | None:
        s = self.series.get(tp)
        return None if s is None else _last(s[0])

    def sampled_ms(self, tp: TopicPartition) -> int | None:
        """Wall time of the newest sample."""
        s = self.series.get(tp)
        return None if s is None else _last(s[1])

    def is_stale(self, tp: TopicPartition, now_wall_ms: int) -> bool:
        s = self.series.get(tp)
        return s is None or now_wall_ms - _last(s[1]) > self.stale_after_ms

    def stale_count(self, now_wall_ms: int) -> int:
        cutoff = now_wall_ms - self.stale_after_ms
        return sum(1 for _, times in self.series.values() if _last(times) < cutoff)

    def lag(self, tp: TopicPartition, committed: int, now_wall_ms: int):
        """``(log_end, offset_lag, time_lag_ms, stale)`` for a committed offset; log_end and
        offset_lag are None without a sample, time_lag_ms None when it cannot be estimated."""
        return self.lag_with_method(tp, committed, now_wall_ms)[:4]

    def lag_with_method(self, tp: TopicPartition, committed: int, now_wall_ms: int):
        """:meth:`lag` and the method that gave the time lag: ``"interpolated"`` (the log-end
        history brackets the committed offset; 0 s when caught up), ``"record"`` (the committed
        offset is older than the history: the timestamp of the record there, read from the data
        cluster), ``"extrapolated"`` (older than the history, no record time yet: along the
        history's overall rate), or None (no time lag). An offset older than the history with no
        record time is noted for the refresher to look up (:meth:`wanted_record_times`)."""
        s = self.series.get(tp)
        if s is None:
            return None, None, None, True, None
        ends, times = s
        end = _last(ends)
        stale = now_wall_ms - _last(times) > self.stale_after_ms
        if committed >= end:
            return end, 0, 0, stale, INTERPOLATED
        ev = memoryview(ends).cast("q")
        tv = memoryview(times).cast("q")
        if committed >= ev[0]:
            method = INTERPOLATED
            at = time_at(ev, tv, committed)
        else:
            key = (tp, committed)
            at = self.record_ms.get(key)
            if at is not None:
                method = RECORD
                self.record_ms.move_to_end(key)
            else:
                if len(self.wanted) < self.record_cache_size:
                    self.wanted[key] = None
                at = time_at(ev, tv, committed)
                method = None if at is None else EXTRAPOLATED
        lag_ms = None if at is None else max(0, int(now_wall_ms - at))
        return end, end - committed, lag_ms, stale, method

    # -- record times: the time lag of an offset older than the history ---------------------------
    def wanted_record_times(self, limit: int) -> dict[TopicPartition, int]:
        """Up to ``limit`` committed offsets (oldest wish first) whose record time would answer
        their time lag, as ``{tp: offset}`` (one offset per partition a round), taken off the list."""
        out: dict[TopicPartition, int] = {}
        for key in list(self.wanted):
            if len(out) >= limit:
                break
            tp, off = key
            if tp in out:
                continue
            del self.wanted[key]
            if key not in self.record_ms:
                out[tp] = off
        return out

    def record_times(self, found: dict[TopicPartition, int | None], offsets: dict[TopicPartition, int]) -> int:
        """Keep the record times read for ``offsets`` (None or negative: not read, asked again when
        wanted again); the cache keeps the ``record_cache_size`` most recently used. Returns how
        many were kept."""
        kept = 0
        cache = self.record_ms
        for tp, off in offsets.items():
            ts = found.get(tp)
            if ts is None or ts < 0:
                continue
            cache[(tp, off)] = ts
            cache.move_to_end((tp, off))
            kept += 1
        while len(cache) > self.record_cache_size:
            cache.popitem(last=False)
        return kept

    def samples(self, tp: TopicPartition) -> list[tuple[int, int]]:
        s = self.series.get(tp)
        if s is None:
            return []
        return list(zip(memoryview(s[0]).cast("q"), memoryview(s[1]).cast("q"), strict=True))


def default_timeout_ms(interval_ms: int) -> int:
    """How long the refresher waits for one batch by default (a source should give up before)."""
    return max(1000, interval_ms // 2)


class LagRefresher:
    """The asyncio edge: every ``interval_ms``, the partitions committed in any group (from
    ``partitions()``, an iterable of lists of them, e.g. one per shard) are asked of ``source`` in
    batches of ``batch_size``, each bounded by
    ``timeout_ms``; a refresh that runs past ``interval_ms`` stops asking (the rest stay unsampled
    this round). One refresh at a time; a slow source delays the next refresh, never a request.
    Wall times come from ``clock`` (a ManualClock in tests)."""

    def __init__(self, tracker: LagTracker, source: LogEndSource, partitions: Callable[[], Iterable[list]],
                 clock, interval_ms: int = 30_000, timeout_ms: int | None = None, batch_size: int = 2000,
                 record_lookups: int = RECORD_LOOKUPS):
        self.tracker = tracker
        self.source = source
        self.partitions = partitions
        self.clock = clock
        self.interval_ms = interval_ms
        self.timeout_ms = timeout_ms if timeout_ms is not None else default_timeout_ms(interval_ms)
        self.batch_size = batch_size
        self.record_lookups = record_lookups
        self.task: asyncio.Task | None = None
        # status, for /metrics and the console
        self.refreshes = 0
        self.failures = 0  # refreshes with at least one failed or timed-out batch
        self.consecutive_failures = 0
        self.last_attempt_ms: int | None = None
        self.last_success_ms: int | None = None  # wall time of the last refresh where every batch answered
        self.last_error: str | None = None
        self.last_duration_s = 0.0
        self.last_cpu_s = 0.0  # process CPU during the last refresh (the loop's share of it, mostly)
        self.last_partitions = 0
        self.record_lookups_total = 0  # record times asked of the source
        self.record_times_found = 0  # of which answered
        self.record_lookup_failures = 0  # rounds whose record-time lookup failed or timed out

    async def _lookup_record_times(self, deadline: float) -> None:
        """Ask the source (when it can: ``record_times``) for the record time of at most
        ``record_lookups`` committed offsets older than their history, within the reader's timeout
        and what is left of the round. Best effort: a failure leaves those offsets without a time
        lag this round (they are asked again when read again), never fails the round."""
        lookup = getattr(self.source, "record_times", None)
        if lookup is None or self.record_lookups <= 0 or not self.tracker.wanted:
            return
        left = deadline - time.monotonic()
        if left <= 0:
            return
        offsets = self.tracker.wanted_record_times(self.record_lookups)
        if not offsets:
            return
        self.record_lookups_total += len(offsets)
        try:
            found = await asyncio.wait_for(lookup(offsets), min(self.timeout_ms / 1000, left))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # TimeoutError included: lag's problem, never the daemon's
            self.record_lookup_failures += 1
            log.debug("record-time lookup failed", error=repr(exc)[:300], partitions=len(offsets))
            return
        self.record_times_found += self.tracker.record_times(found, offsets)

    async def refresh(self) -> bool:
        """One round; True when every batch answered in time."""
        started, cpu0 = time.monotonic(), time.process_time()
        self.last_attempt_ms = self.clock.wall_ms()
        # the partitions to ask for, gathered a shard at a time, and the ones no longer committed
        # dropped RETAIN_STEP at a time: at 100,000 partitions either would hold the loop for tens
        # of milliseconds in one piece
        wanted: set = set()
        for chunk in self.partitions():
            wanted.update(chunk)
            await asyncio.sleep(0)
        tps = list(wanted)
        known = list(self.tracker.series)
        for i in range(0, len(known), RETAIN_STEP):
            self.tracker.retain_among(known[i:i + RETAIN_STEP], wanted)
            await asyncio.sleep(0)
        self.last_partitions = len(tps)
        errors: list[str] = []
        deadline = started + self.interval_ms / 1000
        for i in range(0, len(tps), self.batch_size):
            batch = tps[i:i + self.batch_size]
            left = deadline - time.monotonic()
            if left <= 0:
                errors.append(f"refresh ran past its interval: {len(tps) - i} partitions not asked")
                break
            try:
                ends = await asyncio.wait_for(self.source.fetch(batch), min(self.timeout_ms / 1000, left))
            except TimeoutError:
                errors.append(f"log-end fetch timed out after {self.timeout_ms} ms ({len(batch)} partitions)")
                continue
            except asyncio.CancelledError:
                raise
            except PartialFetch as exc:
                errors.append(f"log-end fetch incomplete: {exc}"[:300])
                ends = exc.found
            except Exception as exc:  # the source's failure is lag's problem, never the daemon's
                errors.append(f"log-end fetch failed: {exc!r}"[:300])
                continue
            self.tracker.observe({tp: end for tp, end in ends.items() if tp in wanted}, self.clock.wall_ms())
            await asyncio.sleep(0)  # a turn of the loop between batches
        await self._lookup_record_times(deadline)
        self.refreshes += 1
        self.last_duration_s = time.monotonic() - started
        self.last_cpu_s = time.process_time() - cpu0
        if errors:
            self.failures += 1
            self.consecutive_failures += 1
            if self.last_error != errors[0] or self.consecutive_failures == 1:
                log.warning("lag refresh failed: lag goes stale", error=errors[0], failed_batches=len(errors))
            self.last_error = errors[0]
            return False
        if self.consecutive_failures:
            log.info("lag refresh recovered", after_failures=self.consecutive_failures)
        self.consecutive_failures = 0
        self.last_error = None
        self.last_success_ms = self.clock.wall_ms()
        return True

    async def run(self) -> None:
        # stop() also sets _stopped: on Python 3.11 asyncio.wait_for can swallow a cancellation that
        # arrives as the awaited fetch completes (gh-86296), and the loop must end all the same
        self._stopped = False
        while not self._stopped:
            try:
                await self.refresh()
            except asyncio.CancelledError:
                raise
            except Exception:  # a bug here must not end lag tracking for good
                log.exception("lag refresh crashed")
            await asyncio.sleep(self.interval_ms / 1000)

    def start(self, loop: asyncio.AbstractEventLoop | None = None) -> LagRefresher:
        loop = loop or asyncio.get_running_loop()
        self.task = loop.create_task(self.run(), name="herd-lag-refresher")
        return self

    def stop(self) -> None:
        self._stopped = True
        if self.task is not None:
            self.task.cancel()
            self.task = None

    @property
    def up(self) -> bool:
        """The source answered the last refresh entirely."""
        return self.refreshes > 0 and self.consecutive_failures == 0

    def status(self) -> dict:
        return {"configured": True, "up": self.up, "refreshes": self.refreshes, "failures": self.failures,
                "consecutive_failures": self.consecutive_failures, "last_attempt_ms": self.last_attempt_ms,
                "last_success_ms": self.last_success_ms, "last_error": self.last_error,
                "interval_ms": self.interval_ms, "partitions": self.last_partitions,
                "last_duration_s": round(self.last_duration_s, 6), "last_cpu_s": round(self.last_cpu_s, 6),
                "record_lookups": self.record_lookups_total, "record_times_found": self.record_times_found,
                "record_lookup_failures": self.record_lookup_failures,
                "record_times_cached": len(self.tracker.record_ms)}
