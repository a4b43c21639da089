"""Event-loop lag: how late a timer set on the loop actually runs.

Everything herd does for a request happens on one event loop, so a request waits for whatever the
loop is doing when it arrives. A probe timer every ``interval`` seconds measures how late it fires
(the loop was busy: a burst of reads, a collection, a long callback) into a histogram that
``/metrics`` exports (``herd_event_loop_lag_seconds``), and a lag over ``warn_s`` is logged
(``loop.lag``). The probe costs one timer callback per interval.

:class:`Probe` is that repeating timer; the stall detector (:mod:`coordinator.ops.stall`) uses one too.
"""
from __future__ import annotations

import bisect
import time

from coordinator import logging_setup

log = logging_setup.get("herd.loop")

BUCKETS = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


class Probe:
    """``tick()`` every ``interval`` seconds on an event loop: a ``call_later`` timer armed again
    after each call, until :meth:`stop`."""

    def __init__(self, interval: float, tick):
        self.interval = interval
        self.tick = tick
        self._loop = None
        self._handle = None

    def start(self, loop) -> None:
        self._loop = loop
        self._arm()

    def stop(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def _arm(self) -> None:
        self._handle = self._loop.call_later(self.interval, self._fire)

    def _fire(self) -> None:
        self.tick()
        self._arm()


class LoopLag:
    def __init__(self, interval: float = 0.05, warn_s: float = 0.25, clock=time.monotonic,
                 stall_s: float | None = None):
        self.interval = interval
        self.warn_s = warn_s
        # a lag this long is a stall: the stall detector (coordinator.ops.stall) logs it, once
        self.stall_s = stall_s
        self.clock = clock
        self.counts = [0] * (len(BUCKETS) + 1)  # the last one: over the largest bucket
        self.total = 0.0
        self.max = 0.0
        self._probe = Probe(interval, self._tick)
        self._expected = 0.0

    def start(self, loop) -> LoopLag:
        self._expected = self.clock() + self.interval
        self._probe.start(loop)
        return self

    def stop(self) -> None:
        self._probe.stop()

    def _tick(self) -> None:
        self.observe(max(0.0, self.clock() - self._expected))
        self._expected = self.clock() + self.interval  # the probe fires again after this

    def observe(self, lag: float) -> None:
        self.counts[bisect.bisect_left(BUCKETS, lag)] += 1
        self.total += lag
        if lag > self.max:
            self.max = lag
        if lag >= self.warn_s and (self.stall_s is None or lag < self.stall_s):
            log.warning("loop.lag", lag_ms=round(lag * 1000, 1))

    def quantile(self, q: float) -> float | None:
        """An upper bound for the ``q`` quantile (the bucket it falls in); None before any sample."""
        n = sum(self.counts)
        if not n:
            return None
        need = q * n
        seen = 0
        for i, c in enumerate(self.counts):
            seen += c
            if seen >= need:
                return BUCKETS[i] if i < len(BUCKETS) else self.max
        return self.max  # pragma: no cover

    def summary(self) -> dict:
        n = sum(self.counts)
        return {"samples": n, "p50_le_ms": _ms(self.quantile(0.5)), "p99_le_ms": _ms(self.quantile(0.99)),
                "max_ms": round(self.max * 1000, 1), "mean_ms": round(self.total / n * 1000, 2) if n else None}

    def metric_lines(self) -> list[str]:
        name = "herd_event_loop_lag_seconds"
        lines = [f"# HELP {name} How late a probe timer on the event loop ran (the loop was busy).",
                 f"# TYPE {name} histogram"]
        cumulative = 0
        for le, c in zip(BUCKETS, self.counts, strict=False):
            cumulative += c
            lines.append(f'{name}_bucket{{le="{le}"}} {cumulative}')
        cumulative += self.counts[-1]
        lines += [f'{name}_bucket{{le="+Inf"}} {cumulative}', f"{name}_sum {round(self.total, 6)}",
                  f"{name}_count {cumulative}",
                  "# HELP herd_event_loop_lag_max_seconds The largest lag since start.",
                  "# TYPE herd_event_loop_lag_max_seconds gauge",
                  f"herd_event_loop_lag_max_seconds {round(self.max, 6)}"]
        return lines


def _ms(v: float | None) -> float | None:
    return None if v is None else round(v * 1000, 1)
