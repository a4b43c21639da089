"""Noticing that herd itself stalled, so that its members are not punished for it.

herd's timers (sessions, rebalances, pending members) run on the monotonic clock. When the whole
process stops running for a while (a SIGSTOP, a VM frozen by its host or live-migrated, CPU
throttling of its container, a stalled disk or swap holding the loop), CLOCK_MONOTONIC keeps
advancing, so every deadline that fell inside the pause is due the moment herd is back, before it
has read the heartbeats that waited in its sockets. Members that did nothing wrong would expire.

:class:`StallDetector` notices such a pause: a probe on the event loop every ``interval_ms``
remembers when the loop was last seen running; a look (the probe, the runtime's timer callback
before it fires anything, or a request handled ``threshold_ms`` after the probe last looked, before
it moves any deadline: back from a pause libuv reads the sockets before its timers run) that
finds the loop was away for ``threshold_ms`` or more reports a stall
of that length to ``on_stall(stall_ms, kind)``. The runtime then moves every deadline by the stall
and reads the sockets before it decides any expiry (``coordinator.runtime``).

What the clocks show, on Linux:

* a stalled loop, SIGSTOP/SIGCONT, a frozen VM whose clock catches up, CPU throttling: CLOCK_MONOTONIC
  jumps forward between two looks (kind ``"loop"``): the whole gap is given back.
* a system suspend (a laptop lid, ``systemctl suspend``, a VM whose monotonic clock is stopped with
  it): CLOCK_MONOTONIC does not advance while suspended, CLOCK_BOOTTIME does. No monotonic deadline
  moved closer, so nothing needs to be given back; the gap between the two clocks grows by the
  suspend, which is reported (kind ``"suspend"``, 0 ms given back) so that it is logged, counted
  and the sockets are still read before timers run.
* a loop that keeps stalling (it ran for less than ``threshold_ms`` since the last stall: a
  sustained overload, not a pause): the stall is reported and the sockets are read first, but no
  time is given back, so that given-back time cannot add up and keep a member that is really gone
  alive for ever.
* a busy or overloaded machine: the loop thread was running (herd's own work, a GC pass) or
  runnable but waiting for a CPU (other processes took the cores) for most of the gap. Its members
  were not kept from being heard by a pause of herd's: the gap is reported (kind ``"busy"``: the
  sockets are read first) but nothing is given back, so that a loaded machine cannot keep dead
  members alive. Linux says how long a thread ran and waited in its run queue
  (``/proc/thread-self/schedstat``); the time given back for a pause is the part of the gap in which
  the loop thread did neither (stopped, frozen, blocked in the kernel).
* a wall-clock step (NTP, an operator's ``date``): no timer runs on the wall clock, so nothing is
  given back; the step is logged (``clock.wall_step``) because record timestamps and offset
  retention use the wall clock (as Kafka's do).

The amount given back is the time since the loop was last seen, so at most ``interval_ms`` more
than the pause itself.
"""
from __future__ import annotations

import time

from coordinator import logging_setup
from coordinator.ops.looplag import Probe

__all__ = ["StallDetector", "boottime_ms", "PROBE_INTERVAL_MS", "STALL_BUCKETS"]

log = logging_setup.get("herd.loop")

PROBE_INTERVAL_MS = 50
# herd_stall_seconds buckets: from the smallest threshold that makes sense to minutes-long freezes
STALL_BUCKETS = (0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 30.0, 60.0, 120.0, 300.0, 600.0)


def boottime_ms() -> int:
    """CLOCK_BOOTTIME in ms: monotonic time that also counts a system suspend (Linux)."""
    return time.clock_gettime_ns(time.CLOCK_BOOTTIME) // 1_000_000


def thread_sched_ms() -> int | None:
    """How long the calling thread has run plus waited in a run queue, in ms (Linux schedstat:
    ``cpu_ns wait_ns slices``), or None where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            fields = f.read().split()
        return (int(fields[0]) + int(fields[1])) // 1_000_000
    except (OSError, ValueError, IndexError):
        return None


def _default_sched(clock):
    from coordinator.clock import SystemClock

    if isinstance(clock, SystemClock) and thread_sched_ms() is not None:
        return thread_sched_ms
    return None


def _default_boottime(clock):
    # Only a real clock has a boot time to compare with; a manual clock in a test gets one from
    # the test, if it wants suspends.
    from coordinator.clock import SystemClock

    if isinstance(clock, SystemClock) and hasattr(time, "CLOCK_BOOTTIME"):
        return boottime_ms
    return None


class StallDetector:
    """``check()`` looks at the clocks; ``start(loop)`` looks every ``interval_ms`` on its own.

    ``threshold_ms`` 0 turns detection off (``check`` always answers 0)."""

    def __init__(self, clock, threshold_ms: int, on_stall=None, interval_ms: int = PROBE_INTERVAL_MS,
                 boottime=_default_boottime, sched=_default_sched):
        self.clock = clock
        self.threshold_ms = threshold_ms
        self.interval_ms = interval_ms
        self.on_stall = on_stall  # (stall_ms to give back, kind, length_ms) -> None
        self.boottime = boottime(clock) if boottime is _default_boottime else boottime
        # ms the loop thread ran or waited for a CPU (None: unknown, every gap counts as a pause);
        # read on the loop thread only (start, reset, check)
        self.sched = sched(clock) if sched is _default_sched else sched
        self._sched_seen: int | None = None
        self.stalls = 0
        self.last_seen = clock.monotonic_ms()
        self._boot_offset = self._offset_boot(self.last_seen)
        self._wall_offset = clock.wall_ms() - self.last_seen
        self._last_stall_end: int | None = None  # when the last stall was noticed
        self._probe = Probe(interval_ms / 1000, self.check)

    def _offset_boot(self, mono: int) -> int | None:
        return None if self.boottime is None else self.boottime() - mono

    # ---- the probe ---------------------------------------------------------------------------

    def start(self, loop) -> StallDetector:
        self.reset()
        if self.threshold_ms > 0:
            self._probe.start(loop)
        return self

    def stop(self) -> None:
        self._probe.stop()

    # ---- looking -----------------------------------------------------------------------------

    def reset(self) -> None:
        """Forget the time before now (e.g. a start-up replay: loaded members get fresh deadlines)."""
        now = self.clock.monotonic_ms()
        self.last_seen = now
        self._boot_offset = self._offset_boot(now)
        self._wall_offset = self.clock.wall_ms() - now
        self._sched_seen = None if self.sched is None else self.sched()

    def check(self) -> int:
        """Look at the clocks now: -> the ms to give back (0: no stall, or a suspend, which the
        monotonic clock already left out). A stall is reported to ``on_stall`` once."""
        if self.threshold_ms <= 0:
            return 0
        clock = self.clock
        now = clock.monotonic_ms()
        seen = self.last_seen
        gap = now - seen
        self.last_seen = now
        wall_offset = clock.wall_ms() - now
        step = wall_offset - self._wall_offset
        self._wall_offset = wall_offset
        busy = 0  # of the gap, ms the loop thread ran or waited for a CPU
        if self.sched is not None:
            ran = self.sched()
            if ran is not None and self._sched_seen is not None:
                busy = max(0, ran - self._sched_seen)
            self._sched_seen = ran
        suspended = 0
        if self.boottime is not None:
            boot_offset = self.boottime() - now
            suspended = boot_offset - self._boot_offset
            self._boot_offset = boot_offset
        if gap >= self.threshold_ms and gap - busy < self.threshold_ms:
            # herd was running or waiting for a CPU: late, not paused; nothing given back
            self._report(0, "busy", gap, now, busy_ms=busy)
            return 0
        if gap >= self.threshold_ms:
            away = gap - busy  # give back only the time the loop thread was away
            ended = self._last_stall_end
            # a loop that keeps stalling (it ran less than the threshold since the last stall) gets
            # the sockets read first but no time back: else, under a sustained overload, the time
            # given back would add up and a member that is really gone would never expire
            give = 0 if ended is not None and seen - ended < self.threshold_ms else away
            self._last_stall_end = now
            self._report(give, "loop", gap, now, busy_ms=busy)
            return give
        if suspended >= self.threshold_ms:
            # the wall clock moved with the suspend: not a step
            self._report(0, "suspend", suspended, now)
            return 0
        if abs(step) >= self.threshold_ms:
            log.warning("clock.wall_step", step_ms=step,
                        note="timers run on the monotonic clock; record timestamps and offset retention "
                             "use the wall clock")
        return 0

    def _report(self, give_back: int, kind: str, length: int, now: int, busy_ms: int = 0) -> None:
        self.stalls += 1
        log.warning("loop.stall", stall_ms=length, kind=kind, given_back_ms=give_back,
                    threshold_ms=self.threshold_ms, running_or_runnable_ms=busy_ms)
        if self.on_stall is not None:
            self.on_stall(give_back, kind, length)
