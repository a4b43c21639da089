"""Rebalance requests yield to the rest when a loop turn is long (issue 31 item 4).

Everything herd does happens on one event loop: when thousands of members of one group send their
JoinGroup or SyncGroup at once (a big group forming or rebalancing), a single loop turn would
handle them all, and every other connection's request (a small group's Heartbeat, a commit)
waits for the whole burst. So a loop turn handles rebalance requests (JoinGroup, SyncGroup,
LeaveGroup, and a KIP-848 ConsumerGroupHeartbeat that joins, leaves or reports owned partitions or
a new subscription: all but a member's steady heartbeat) for at most ``budget`` seconds; a
connection whose next request is one of them after that waits in a FIFO, and each following turn
first serves whatever arrived (heartbeats never wait here), then hands ``budget`` seconds to the
waiting connections, oldest first.

Nothing changes for a client but timing: a connection's requests are still handled and answered
in order (a waiting connection handles nothing else meanwhile), and the members of a rebalance
wait for one another anyway. Across connections Kafka promises no order.

A burst is also costly to *read*: libuv's poll phase reads every ready socket before any callback
or timer runs (it polls again while its 1,024-event batches come back full), so 10,000 members
rejoining in the same millisecond hold the loop for 0.2-0.6 s in reads alone, and a small group's
heartbeat that arrives meanwhile waits behind them in epoll's ready list. So the turn counts the
rebalance requests it read and deferred; at ``hold_back_after`` (half a batch) it calls
``on_burst`` once: the server stops reading every connection likely to send a rebalance request
next that has not sent it yet (fresh, its last request was one, or a Heartbeat answered with an
error: ``Connection.rejoin_likely``, kept in ``likely`` as it changes), and reads them again
``REARM_PER_TURN`` per turn (``Server.hold_back``). Their requests wait in the kernel; a paused
socket's later events in the same poll phase cost libuv one epoll_ctl, not a read. Measured
(bench/RESULTS.md 15.6): the worst loop stall of a 10,000-member group sending at once stays
under 0.1 s; the others' heartbeat latency is about what it was.
"""
from __future__ import annotations

import time
from collections import deque

from coordinator import logging_setup
from protocol.fastpath import consumer_heartbeat_is_rebalance_work

log = logging_setup.get("herd.edge")

REBALANCE_APIS = frozenset({11, 13, 14})  # JoinGroup, LeaveGroup, SyncGroup
CONSUMER_GROUP_HEARTBEAT = 68  # waits here unless it is a member's steady heartbeat
_cg_rebalance_work = consumer_heartbeat_is_rebalance_work
TURN_BUDGET_S = 0.008
HOLD_BACK_AFTER = 512  # rebalance requests read and deferred in one turn: a burst (see above)
OFFSET_COMMIT = 8

_now = time.perf_counter


class Turns:
    def __init__(self, call_soon, budget: float = TURN_BUDGET_S, clock=_now, hold_back_after: int = HOLD_BACK_AFTER):
        self.call_soon = call_soon
        self.budget = budget
        self.clock = clock
        self.hold_back_after = hold_back_after
        self.deferred_reads = 0  # rebalance requests read and deferred in this turn
        self.on_burst = None  # called when they reach hold_back_after (once per turn)
        # called at the end of each turn of a burst (rebalance work over the turn's budget; the
        # daemon: GcWatch.freeze_young, so a big group's joins are not interrupted by young
        # collections that would free nothing; ordinary turns keep the usual collections)
        self.after_turn = None
        # the connections whose ``rejoin_likely`` is set (kept as it changes: a burst looks at these
        # only, not at every connection)
        self.likely: set = set()
        self.open = False  # a turn is being measured (closed by the callback it scheduled)
        self.start = 0.0
        self.waiting: deque = deque()  # connections whose next request waits for a turn
        self.deferred_total = 0

    def spent(self) -> bool:
        """Is this loop turn's budget for rebalance requests used up? The first call of a turn
        starts measuring it (and schedules its end)."""
        if not self.open:
            self.open = True
            self.start = self.clock()
            self.call_soon(self._next_turn)
            return False
        return self.clock() - self.start > self.budget

    def defers(self, conn, frame) -> bool:
        """Must ``conn`` wait before handling ``frame`` (a request, header first)? If so it is
        queued here and resumed (``conn.resume_turn()``) in a later turn."""
        if conn.turn_pass:
            conn.turn_pass = False
            return False
        if len(frame) < 2:
            return False
        api = (frame[0] << 8) | frame[1]
        if api not in REBALANCE_APIS:
            if api != CONSUMER_GROUP_HEARTBEAT:
                if api == OFFSET_COMMIT and conn.rejoin_likely:  # a member at work (and see Connection.heartbeat)
                    self.unlikely(conn)
                return False
            if not _cg_rebalance_work(frame):
                if conn.rejoin_likely:
                    self.unlikely(conn)
                return False  # a member's steady heartbeat (answered at the edge) never waits
        if not conn.rejoin_likely:
            self.rejoin_likely(conn)
        if conn.turn_waiting:
            return True
        return self.defers_late(conn)

    def defers_late(self, conn) -> bool:
        """Must ``conn`` wait with the request it is handling, found to be rebalance work only
        once looked at (a steady-looking ConsumerGroupHeartbeat the edge cannot answer: its shard
        has a write in flight, so it takes the full path)? Only when this turn's budget is spent;
        then it is queued here as :meth:`defers` queues, and the caller puts the frame back."""
        if not self.spent():
            return False
        conn.turn_waiting = True
        self.waiting.append(conn)
        self.deferred_total += 1
        return True

    def rejoin_likely(self, conn) -> None:
        """``conn``'s next request is likely a rebalance one."""
        conn.rejoin_likely = True
        self.likely.add(conn)

    def unlikely(self, conn) -> None:
        conn.rejoin_likely = False
        self.likely.discard(conn)

    def read_deferred(self) -> None:
        """A rebalance request just read waits (``defers`` said so): counted; the
        ``hold_back_after``-th of a turn calls ``on_burst``."""
        self.deferred_reads += 1
        if self.deferred_reads == self.hold_back_after and self.on_burst is not None:
            self.on_burst()

    def _next_turn(self) -> None:
        self.open = False
        burst = self.deferred_reads or self.waiting  # this turn had more rebalance work than its budget
        self.deferred_reads = 0
        if burst and self.after_turn is not None:
            try:
                self.after_turn()
            except Exception:  # our bug: logged; the waiting connections must still get their turns
                log.exception("error at the end of a turn")
        waiting = self.waiting
        while waiting and not self.spent():
            conn = waiting.popleft()
            conn.turn_waiting = False
            conn.turn_pass = True  # its waiting request goes first
            conn.resume_turn()
