"""Keyed timers with lazy deadlines.

A key (any hashable; the coordinator uses tuples such as ``("hb", group_id, member_id)``,
``("join", group_id)``, ``("sync", group_id)``, ``("pending", group_id, member_id)``,
``("retention",)``) has at most one deadline. Scheduling a key again replaces its deadline,
``cancel`` forgets it, ``expired(now)`` pops the keys whose deadline has passed.

Heartbeats are the hot path: a member's deadline moves forward on every heartbeat. Pushing a heap
entry each time would grow the heap by one entry per heartbeat, so deadlines are *lazy*: the dict
holds each key's true deadline, and the heap holds at most one "armed" entry per key at a time that
is never later than the true deadline. Moving a deadline later is a dict store (O(1)); when the
armed entry surfaces early it is re-armed at the stored deadline (one heap push per session
timeout, not per heartbeat). Moving a deadline earlier pushes a new entry; the superseded entry is
recognised as stale when it surfaces and dropped.

:meth:`shift` moves every deadline later by the same amount: after herd itself stalled (its loop
did not run), each key gets back the time herd was away (see ``coordinator.ops.stall``).
"""
from __future__ import annotations

import heapq
from collections.abc import Hashable

__all__ = ["Timers"]


class Timers:
    __slots__ = ("_deadline", "_armed", "_heap", "_seq", "on_push", "steps")

    def __init__(self) -> None:
        # Called whenever a heap entry is pushed, i.e. the earliest deadline may have moved
        # earlier (a new key, or a deadline brought forward). A lazy extension (the heartbeat
        # case) never calls it, so a caller caching next_deadline() knows when to look again.
        self.on_push = None
        self._deadline: dict[Hashable, int] = {}  # key -> true deadline
        self._armed: dict[Hashable, int] = {}  # key -> deadline of its live heap entry (<= true)
        self._heap: list[tuple[int, int, Hashable]] = []  # (deadline, seq, key)
        self._seq = 0  # tie-break: keys need not be orderable
        # Heap entries looked at by pop_expired (re-armed, dropped as stale, or popped); a caller
        # may reset it and stop when it is large, to hand the event loop back between chunks.
        self.steps = 0

    def __len__(self) -> int:
        return len(self._deadline)

    def __contains__(self, key: Hashable) -> bool:
        return key in self._deadline

    def deadline(self, key: Hashable) -> int | None:
        return self._deadline.get(key)

    def schedule(self, key: Hashable, deadline: int) -> None:
        """Set ``key`` to fire at ``deadline`` (replacing any earlier schedule). O(1) when the
        deadline moves later, O(log n) when it moves earlier or the key is new."""
        self._deadline[key] = deadline
        armed = self._armed.get(key)
        if armed is None or deadline < armed:
            self._armed[key] = deadline
            self._seq += 1
            heapq.heappush(self._heap, (deadline, self._seq, key))
            if self.on_push is not None:
                self.on_push()

    def cancel(self, key: Hashable) -> bool:
        """Forget ``key``; True if it was scheduled. Its heap entry goes stale and is dropped later."""
        if self._deadline.pop(key, None) is None:
            return False
        self._armed.pop(key, None)
        return True

    def _settle(self) -> None:
        """Make the heap top a live entry whose deadline is the key's true deadline."""
        heap = self._heap
        while heap:
            when, _, key = heap[0]
            if self._armed.get(key) != when:  # stale: cancelled or superseded by an earlier push
                heapq.heappop(heap)
                continue
            true = self._deadline[key]
            if true > when:  # lazily extended: re-arm at the true deadline
                self._armed[key] = true
                self._seq += 1
                heapq.heapreplace(heap, (true, self._seq, key))
                continue
            return

    def next_deadline(self) -> int | None:
        """The earliest true deadline, or None when nothing is scheduled."""
        self._settle()
        return self._heap[0][0] if self._heap else None

    def next_check(self) -> int | None:
        """A time no later than the earliest true deadline (the heap top, not settled): when to look
        again. Cheap, and it never re-arms anything ahead of time; :meth:`next_deadline` settles
        every lazily extended entry at the top, which with many members heartbeating in step
        re-arms them all in one go (measured: ~250 ms every session timeout at 100,000 members)."""
        heap = self._heap
        return heap[0][0] if heap else None

    def expired(self, now: int) -> list[Hashable]:
        """Remove and return every key whose deadline is <= ``now``, earliest first."""
        out = []
        while True:
            key = self.pop_expired(now)
            if key is None:
                return out
            out.append(key)

    def pop_expired(self, now: int, limit: int | None = None) -> Hashable | None:
        """Remove and return the earliest key whose deadline is <= ``now`` (None if none): lets a
        caller fire timers one at a time while handlers schedule and cancel others. Only entries
        armed at or before ``now`` are looked at (re-armed or dropped), so the work of re-arming
        extended deadlines is spread over time as their entries come due. With ``limit``, returns
        None once :attr:`steps` reaches it (entries may still be due: ``next_check() <= now``)."""
        heap = self._heap
        armed = self._armed
        while heap and heap[0][0] <= now:
            if limit is not None and self.steps >= limit:
                return None
            self.steps += 1
            when, _, key = heap[0]
            if armed.get(key) != when:  # stale: cancelled or superseded by an earlier push
                heapq.heappop(heap)
                continue
            true = self._deadline[key]
            if true > when:  # lazily extended: re-arm at the true deadline
                armed[key] = true
                self._seq += 1
                heapq.heapreplace(heap, (true, self._seq, key))
                continue
            heapq.heappop(heap)
            del armed[key]
            del self._deadline[key]
            return key
        return None

    def shift(self, by: int) -> None:
        """Move every deadline ``by`` ms later (``by`` > 0): herd stalled, and gives each key back
        the time it was away. A uniform shift keeps the heap's order (and which entries are stale),
        so it is one pass over the keys and the heap: no pushes, no re-heapify, and
        :attr:`on_push` is not called (nothing moved earlier)."""
        if by <= 0:
            return
        deadline, armed = self._deadline, self._armed
        for key in deadline:
            deadline[key] += by
        for key in armed:
            armed[key] += by
        self._heap = [(when + by, seq, key) for when, seq, key in self._heap]

    def heap_size(self) -> int:
        """Entries physically in the heap (live + stale); for tests and diagnostics."""
        return len(self._heap)
