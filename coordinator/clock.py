"""Clocks: a monotonic one for timeouts and a wall one for timestamps written to records.

The pure coordinator never reads a clock on its own: the runtime reads both from the one
:class:`Clock` it is given and passes ``now_ms`` (monotonic) and ``wall_ms`` (epoch) into every
call. Tests use :class:`ManualClock`, which moves both together and never sleeps.
"""
from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

__all__ = ["Clock", "SystemClock", "ManualClock"]


@runtime_checkable
class Clock(Protocol):
    def monotonic_ms(self) -> int:
        """Milliseconds from an arbitrary origin; never goes backwards. For timeouts."""
        ...

    def wall_ms(self) -> int:
        """Milliseconds since the Unix epoch. For timestamps stored in records and shown to people."""
        ...


class SystemClock:
    __slots__ = ()

    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def __repr__(self) -> str:
        return "SystemClock()"


class ManualClock:
    """A clock that only moves when told to. ``advance`` moves monotonic and wall time together."""

    __slots__ = ("_mono", "_wall")

    def __init__(self, monotonic_ms: int = 0, wall_ms: int = 1_700_000_000_000):
        self._mono = int(monotonic_ms)
        self._wall = int(wall_ms)

    def monotonic_ms(self) -> int:
        return self._mono

    def wall_ms(self) -> int:
        return self._wall

    def advance(self, ms: int) -> int:
        """Move both clocks forward by ``ms`` (>= 0); return the new monotonic time."""
        if ms < 0:
            raise ValueError("a ManualClock cannot go backwards")
        self._mono += int(ms)
        self._wall += int(ms)
        return self._mono

    def set_wall(self, wall_ms: int) -> None:
        """Jump the wall clock (e.g. an NTP step); monotonic time is unaffected."""
        self._wall = int(wall_ms)

    def __repr__(self) -> str:
        return f"ManualClock(monotonic_ms={self._mono}, wall_ms={self._wall})"
