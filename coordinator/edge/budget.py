"""max_buffered_bytes: the bytes every connection holds, counted as they change.

A connection reports its buffered bytes (queued requests, the frame being read at its whole
announced size, unsent answers) through ``change``. Over the limit, a connection that adds stops
being read (``memory_pause``) and waits in line; connections that hold less go on. As bytes are
released the waiting connections resume in the order they stopped, while the frame each announced
fits under the limit.

Progress is guaranteed: a paused connection still holds what it read before it stopped (up to one
socket read), and several of those together can exceed the limit on their own. When nothing but the
waiting connections holds any bytes, nothing else will ever release any, so the first in line is
granted its frame even over the limit (as Kafka's non-strict memory pool allocates a request larger
than what is left): at most one frame over the limit at a time, never a deadlock.
"""
from __future__ import annotations

from collections import deque


class MemoryBudget:
    __slots__ = ("limit", "total", "waiting", "pauses", "forced", "_call_soon", "_wake_scheduled")

    def __init__(self, limit: int, call_soon):
        self.limit = limit
        self.total = 0
        self.waiting: deque = deque()  # paused connections, in the order they stopped
        self.pauses = 0  # times a connection stopped being read
        self.forced = 0  # times the first in line was granted its frame over the limit
        self._call_soon = call_soon
        self._wake_scheduled = False

    def change(self, conn, delta: int) -> None:
        """``conn``'s buffered bytes moved by ``delta``."""
        self.total += delta
        if delta > 0:
            if self.total > self.limit and not conn.memory_paused and not conn.memory_granted \
                    and not conn.closed:
                conn.memory_pause()
                self.waiting.append(conn)
                self.pauses += 1
        elif delta < 0 and self.waiting and not self._wake_scheduled:
            self._wake_scheduled = True
            self._call_soon(self._wake_soon)

    def paused_count(self) -> int:
        return sum(1 for c in self.waiting if c.memory_paused and not c.closed)

    def _wake_soon(self) -> None:
        self._wake_scheduled = False
        self.wake()

    def wake(self) -> None:
        """Resume waiting connections, in the order they stopped, while what each will hold (the
        whole frame it announced) fits under the limit; the first in line regardless when only the
        waiting connections hold bytes."""
        waiting = self.waiting
        while waiting:
            conn = waiting[0]
            if conn.closed or not conn.memory_paused:
                waiting.popleft()
                continue
            need = conn.decoder.reserved - conn.decoder.buffered
            if self.total + need > self.limit:
                held_by_waiting = sum(c.accounted for c in waiting if c.memory_paused and not c.closed)
                if self.total > held_by_waiting:
                    return  # someone else holds bytes: their release wakes us again
                self.forced += 1
            waiting.popleft()
            conn.memory_granted = True  # its announced frame is read even if that goes over
            conn.memory_resume()
