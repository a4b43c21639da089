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
  history is extrapolated along the history's overall rate; ``c`` at or past the newest log end is
  0 s. It keeps growing while nothing is committed (the moment is fixed, now moves on). The same
  idea as kafka-lag-exporter's lookup table; written here from that description.

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
from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from coordinator import logging_setup

__all__ = ["LogEndSource", "LagTracker", "LagRefresher", "PartialFetch", "time_at", "DEFAULT_HISTORY"]

log = logging_setup.get("herd.lag")

DEFAULT_HISTORY = 30
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

    def __init__(self, history: int = DEFAULT_HISTORY, stale_after_ms: int = 60_000):
        if history < 2:
            raise ValueError("lag history needs at least 2 samples")
        self.history = history
        self.stale_after_ms = stale_after_ms
        self.series: dict[TopicPartition, tuple[bytearray, bytearray]] = {}

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
                continue
            if end == last and n > 8 and _unpack_from(ends, n - 16)[0] == last:
                _pack_into(times, n - 8, wall_ms)  # a flat run keeps its first and its latest point
                continue
            if n >= limit:
                del ends[:8]
                del times[:8]
            ends += _pack(end)
            times += at

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
        s = self.series.get(tp)
        if s is None:
            return None, None, None, True
        ends, times = s
        end = _last(ends)
        stale = now_wall_ms - _last(times) > self.stale_after_ms
        if committed >= end:
            return end, 0, 0, stale
        at = time_at(memoryview(ends).cast("q"), memoryview(times).cast("q"), committed)
        lag_ms = None if at is None else max(0, int(now_wall_ms - at))
        return end, end - committed, lag_ms, stale

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
                 clock, interval_ms: int = 30_000, timeout_ms: int | None = None, batch_size: int = 2000):
        self.tracker = tracker
        self.source = source
        self.partitions = partitions
        self.clock = clock
        self.interval_ms = interval_ms
        self.timeout_ms = timeout_ms if timeout_ms is not None else default_timeout_ms(interval_ms)
        self.batch_size = batch_size
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
        while True:
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
                "last_duration_s": round(self.last_duration_s, 6), "last_cpu_s": round(self.last_cpu_s, 6)}
