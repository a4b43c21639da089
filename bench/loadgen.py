"""Raw-protocol load generator: many groups and members over many connections, several processes.

A tool, not a benchmark (no ``main()``): ``bench/scale.py`` and ``bench/server_cost.py`` drive it
through :class:`LoadGen`. Standalone against any Kafka-protocol coordinator::

    python -m bench.loadgen --bootstrap 127.0.0.1:9092 --groups 500 --members 10 --duration 30 \
        [--hb-mode one|pipelined] [--join-mode pipelined|member]

It speaks the wire protocol with herd's own codec (``protocol/``), on uvloop, in ``--procs``
processes. A Kafka broker reads a connection's requests in order and answers them in order, so a
connection may carry several requests at once (pipelining, as librdkafka and the Java client do
with ``max.in.flight.requests.per.connection``); correlation ids are still checked on every answer.

Per process:

* Join (``join_mode``):

  - ``pipelined`` (default): lanes of ``members`` connections, connection *j* of a lane carrying
    member *j* of every group of a batch of ``join_batch`` groups. Three rounds per batch, each ONE
    socket write per connection with the batch's requests in the same group order on every
    connection: JoinGroup v9 with an empty member id (→ MEMBER_ID_REQUIRED and a minted id; the
    member is now "pending", so the group's rebalance waits for it), JoinGroup with the minted id
    (parked by the coordinator until the group's ten joins are in: the same order on every
    connection means group *k*'s joins are at the head of every queue together, so no connection
    waits on a group whose other members sit behind it), then SyncGroup (the leader's carries a
    range-style assignment; the followers' are parked until it arrives, same argument). A group
    whose round answers anything unexpected is finished by the ``member`` procedure below on the
    lane's connections. ``join_concurrency`` groups at once per process (``join_concurrency /
    join_batch`` lanes).
  - ``member``: ``join_concurrency`` lanes of ``members`` connections; a lane takes one group at a
    time and runs its members' joins concurrently, one connection per member, like real clients:
    JoinGroup with an empty member id → MEMBER_ID_REQUIRED → JoinGroup with the minted id; the
    leader computes the assignment, everyone sends SyncGroup. A member that learns of a newer
    rebalance (REBALANCE_IN_PROGRESS on SyncGroup or on a heartbeat while waiting for the others)
    rejoins.

  A group is complete when all of its members hold a successful SyncGroup of the same generation,
  whose leader saw all of them.
* Heartbeats (``hb_conns`` connections, groups spread over them by index; once a group is complete
  its members heartbeat every ``hb_interval`` s until the end of the window the parent sets, each
  at a phase of its own: a late beat does not move the next one, missed beats are not made up, and
  a member never has two heartbeats in flight. ``hb_slip``: the next beat is due one interval after
  the previous one was sent, as a single Java client schedules it; see :func:`next_due` for why
  that is not the default when one process plays thousands of clients).

  - ``hb_mode="one"``: ONE request in flight per connection; a group's members are spread evenly
    over the interval. The request bytes are encoded once per member and only the correlation id
    is patched per send.
  - ``hb_mode="pipelined"``: a group's members beat together: their heartbeats go out in ONE socket
    write (all in flight at once) and their answers come back in order. Each member's frame is
    encoded once with a correlation id that is fixed for that member on that connection; a
    group's batch (the concatenated frames of its live members) is built once and rebuilt only when
    a member drops out. An answer is checked by comparing its bytes with the member's expected
    "no error" answer (correlation id included); anything else is decoded in full. No future or task
    per request: a timer per group and a FIFO of batches per connection.

  Latency = send to arrival of the response bytes (the socket read that completed it). Lateness =
  how long after its due time a heartbeat was sent (a saturated load tool or a connection falling
  behind). Any non-zero error code is counted by name; that member then stops (it would have to
  rejoin), so an expiry is visible as UNKNOWN_MEMBER_ID / REBALANCE_IN_PROGRESS counts and
  ``members_failed``. ``verify`` asks the coordinator (DescribeGroups v5) afterwards which groups
  are Stable and which of the members still beating it still knows.
* Bursts (``burst`` command): the heartbeat connections send a fixed number of Heartbeats or
  OffsetCommits (``commit_partitions`` partitions of ``topic``, offsets increasing) as fast as the
  server answers, ``depth`` requests in flight per connection (closed loop: each answer releases
  the next request; the answers of one socket read release their successors in one write). Used
  to measure the server's CPU cost per request.

* ``protocol="consumer"`` (``--protocol consumer``, KIP-848): each member joins with
  ConsumerGroupHeartbeat v1 (epoch 0, a member id of its own making as v1 clients do, subscribed
  to ``topic``, ``rebalance_timeout_ms``, no owned partitions), one connection per member of a
  lane (``join_mode`` is ``member``), then heartbeats every ``cg_join_poll`` s, at once when the
  answer brought an assignment to acknowledge, until its group has converged: every member at one
  epoch, its latest assignment acknowledged, the ``topic_partitions`` partitions owned exactly once
  between them. Then the heartbeats of ``hb_mode="one"`` run at the interval the server returned
  (``hb_interval`` is ignored), with the epoch it returned and every other field null; an answer
  with a new epoch or assignment changes the member's next beat (the owned partitions sent once,
  at once, then null again, as librdkafka does; counted as ``answers_with_changes``).
  ``verify`` uses ConsumerGroupDescribe (a member counts only at the epoch we hold); ``leave``
  sends epoch -1 for every member still beating.

No FindCoordinator/ApiVersions: the load tool talks to the one node it is given.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import gc
import heapq
import json
import multiprocessing as mp
import os
import socket
import struct
import sys
import time
import uuid
from array import array
from collections import deque

from protocol import errors as E
from protocol import messages as m
from protocol.consumer import (
    Assignment,
    Subscription,
    TopicPartitions,
    encode_assignment,
    encode_subscription,
)
from protocol.headers import decode_response_header, encode_request_header, encode_response_header

_SIZE = struct.Struct(">i")
_Q = struct.Struct(">q")
_now = time.perf_counter  # CLOCK_MONOTONIC on Linux: comparable across processes
SLOW_US = 50_000  # heartbeats slower than this are also recorded by send time
PHASE = 0.6180339887498949  # golden ratio: group i's heartbeat phase = frac(i * PHASE), evenly spread
LAG_TICK = 0.01  # the load processes' own stall probe: period and threshold, s
LAG_STALL = 0.03
HB_MODES = ("one", "pipelined")
JOIN_MODES = ("pipelined", "member")
PROTOCOLS = ("classic", "consumer")
CGH = m.ConsumerGroupHeartbeatRequest.API_KEY

DEFAULTS = {
    "protocol": "classic",  # consumer: KIP-848 ConsumerGroupHeartbeat (join_mode member, hb_mode one)
    "members": 10,
    "session_timeout_ms": 30_000,
    "rebalance_timeout_ms": 60_000,
    "hb_interval": 3.0,
    "hb_slip": False,  # a late beat moves the member's schedule (see next_due)
    "hb_mode": "one",
    "join_mode": "pipelined",
    "join_concurrency": 50,  # groups joining at once per process
    "join_batch": 25,  # pipelined join: groups per lane round
    "join_timeout": 300.0,
    "topic": "bench",
    "partitions_per_member": 2,
    "commit_partitions": 10,
    "versions": {"join": 9, "sync": 5, "heartbeat": 4, "commit": 9, "describe": 5, "cg_heartbeat": 1,
                 "cg_describe": 0},
    "topic_partitions": 100,  # consumer: the topic's partition count (a group is complete when they are all owned)
    "cg_join_poll": 0.5,  # consumer: seconds between a joining member's heartbeats while its group converges
    "hb_schedule": True,  # scale mode: heartbeat every member from its join until the window ends
    "max_latency_samples": 5_000_000,
    "window_grace": 15.0,  # seconds after the window end to finish heartbeats that were due in it
    # heartbeat connections read with the kernel's receive time of each read (SO_TIMESTAMPNS): a
    # second latency, to the answer's arrival in this machine's kernel, that leaves out how long
    # this process waited for a CPU before it read it (a load tool sharing the server's cores)
    "kernel_stamps": False,
}

SO_TIMESTAMPNS = 35  # Linux (asm-generic); Python's socket module does not name it
_CMSG_STAMP = socket.CMSG_SPACE(16) if hasattr(socket, "CMSG_SPACE") else 0
_TIMESPEC = struct.Struct("qq")


class ConnectionLost(Exception):
    pass


def next_due(due: float, sent: float, interval: float, slip: bool) -> float:
    """When a member's next heartbeat is due, after the one due at ``due`` left at ``sent``.

    Default: every ``interval`` at the member's own phase; a beat sent late does not move the next
    one, and beats missed entirely are skipped, not made up. ``slip``: one interval after the send,
    as a single Java client does. With many members simulated in one process, slipping turns every
    stall of the load process itself (a GC pause, a busy turn during the joins) into a permanent
    cluster: all the beats it delayed leave together, and so do all their successors (measured at
    100,000 members: ~500 groups beating in the same instant every 3 s, for the whole window).
    Independent clients do not share their stalls, so the default keeps each member's phase."""
    if slip:
        return (due if due > sent else sent) + interval
    nxt = due + interval
    if nxt <= sent:
        nxt += (int((sent - nxt) / interval) + 1) * interval
    return nxt


def encode_frame(request, version: int, correlation_id: int, client_id: str) -> bytearray:
    out = bytearray(b"\x00\x00\x00\x00")
    encode_request_header(out, request.API_KEY, version, correlation_id, client_id)
    request.encode_into(out, version)
    _SIZE.pack_into(out, 0, len(out) - 4)
    return out


def ok_answer(response, api_key: int, version: int, correlation_id: int) -> bytes:
    """The exact bytes (after the size prefix) of ``response`` answering ``correlation_id``."""
    out = bytearray(encode_response_header(correlation_id, api_key, version))
    response.encode_into(out, version)
    return bytes(out)


class PipeConn(asyncio.Protocol):
    """One connection; any number of requests in flight, answered in order (as a Kafka broker does).

    Two ways to use it: awaitable calls (``call``, ``call_many``, ``send_frame``: each resolves once
    all of its answers are in), or ``handler(data, spans, arrived)``, which gets every completed
    response as ``(start, end)`` offsets into ``data`` (after the size prefix) with no per-response
    future: the hot paths. ``on_lost(exc)`` is called when the connection goes away."""

    MAX_FRAME = 64 * 1024 * 1024

    def __init__(self, client_id: str):
        self.client_id = client_id
        self.transport = None
        self.loop = None
        self.buf = b""
        self.waiters: deque = deque()  # [expected answers, answers so far, future]
        self.handler = None
        self.on_lost = None
        self.cid = 0
        self.lost = False
        self.why = None
        self.kernel_arrived = None  # stamp_reads(): when the kernel received the last read (perf_counter)
        self._stamped = None  # the socket (a dup of the transport's) read with its kernel timestamps

    def stamp_reads(self) -> bool:
        """Read this connection here with ``recvmsg`` and the kernel's receive timestamp of each read
        (``kernel_arrived``: of its last segment, so an answer that came before it is never made
        faster than it was) instead of through the transport (paused for reading; it still writes).
        False where the kernel or the transport does not allow it (then nothing changes)."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None or not _CMSG_STAMP or not sys.platform.startswith("linux"):
            return False
        try:
            dup = socket.socket(fileno=os.dup(sock.fileno()))
            dup.setblocking(False)
            dup.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        except OSError:
            return False
        self.transport.pause_reading()
        self._stamped = dup
        self.loop.add_reader(dup.fileno(), self._read_stamped)
        return True

    def _read_stamped(self) -> None:
        dup = self._stamped
        try:
            data, anc, _, _ = dup.recvmsg(262144, _CMSG_STAMP)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as e:
            self._unstamp()
            self.why = self.why or str(e)
            self.transport.abort()
            return
        if not data:  # the server closed the connection
            self._unstamp()
            self.transport.abort()
            return
        kernel = None
        for level, kind, raw in anc:
            if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(raw) >= 16:
                sec, ns = _TIMESPEC.unpack_from(raw)
                kernel = sec + ns * 1e-9 - (time.time() - _now())  # realtime -> perf_counter's clock
        self.kernel_arrived = kernel
        self.data_received(data)

    def _unstamp(self) -> None:
        if self._stamped is not None:
            dup, self._stamped = self._stamped, None
            if self.loop is not None and not self.loop.is_closed():
                self.loop.remove_reader(dup.fileno())
            dup.close()

    # asyncio callbacks
    def connection_made(self, transport):
        self.transport = transport
        self.loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data):
        arrived = _now()
        if self.buf:
            data = self.buf + data
        n = len(data)
        pos = 0
        spans = []
        unpack = _SIZE.unpack_from
        while n - pos >= 4:
            size = unpack(data, pos)[0]
            if size < 0 or size > self.MAX_FRAME:
                self.abort(f"bad frame size {size}")
                return
            end = pos + 4 + size
            if end > n:
                break
            spans.append((pos + 4, end))
            pos = end
        self.buf = data[pos:] if pos < n else b""
        if not spans:
            return
        if self.handler is not None:
            self.handler(data, spans, arrived)
            return
        waiters = self.waiters
        for s, e in spans:
            if not waiters:
                self.abort("an answer without a request")
                return
            w = waiters[0]
            got = w[1]
            got.append(data[s:e])
            if len(got) == w[0]:
                waiters.popleft()
                if not w[2].done():
                    w[2].set_result((got, arrived))

    def connection_lost(self, exc):
        self.lost = True
        self._unstamp()
        why = self.why or (str(exc) if exc else "closed by server")
        while self.waiters:
            w = self.waiters.popleft()
            if not w[2].done():
                w[2].set_exception(ConnectionLost(why))
        if self.on_lost is not None:
            self.on_lost(why)

    def abort(self, why: str) -> None:
        """A protocol violation by the server: drop the connection (waiters see ``why``)."""
        self.why = why
        self.lost = True
        if self.transport is not None:
            self.transport.abort()

    # requests
    def next_cid(self) -> int:
        self.cid = (self.cid + 1) & 0x7FFFFFFF
        return self.cid

    async def call_many(self, frames: list) -> tuple[list, float, float]:
        """Send encoded frames in ONE write; -> (answers in order, sent, arrival of the last)."""
        if self.lost:
            raise ConnectionLost(self.why or "connection already lost")
        fut = self.loop.create_future()
        self.waiters.append([len(frames), [], fut])
        sent = _now()
        self.transport.write(frames[0] if len(frames) == 1 else b"".join(frames))
        got, arrived = await fut
        return got, sent, arrived

    async def send_frame(self, frame) -> tuple[bytes, float, float]:
        """Send one encoded frame; -> (response, sent, arrived)."""
        got, sent, arrived = await self.call_many([frame])
        return got[0], sent, arrived

    async def call(self, request, version: int):
        cid = self.next_cid()
        resp, sent, arrived = await self.send_frame(bytes(encode_frame(request, version, cid, self.client_id)))
        got, pos = decode_response_header(resp, request.API_KEY, version)
        if got != cid:
            raise ConnectionLost(f"correlation id {got} != {cid}")
        return m.RESPONSES[request.API_KEY].decode(resp, version, pos), arrived - sent

    def close(self):
        self._unstamp()
        if self.transport is not None:
            self.transport.close()


Conn = PipeConn  # the one-in-flight users simply await each call


async def open_conns(host: str, port: int, n: int, client_id: str, parallel: int = 100) -> list[PipeConn]:
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(parallel)

    async def one():
        async with sem:
            for attempt in range(20):
                try:
                    _, proto = await loop.create_connection(lambda: PipeConn(client_id), host, port)
                    return proto
                except OSError:
                    if attempt == 19:
                        raise
                    await asyncio.sleep(0.05 * (attempt + 1))

    return list(await asyncio.gather(*(one() for _ in range(n))))


# ---- the worker process ----------------------------------------------------------------------------


class Member:
    __slots__ = (
        "group",
        "index",
        "member_id",
        "generation",
        "hb_frame",
        "failed",
        "commit_offset",
        "cid",
        "hb_bytes",
        "hb_ok",
        "commit_tpl",
        "commit_pos",
        "commit_ok",
        "owned",
        "acking",
    )

    def __init__(self, group, index):
        self.group = group
        self.index = index
        self.member_id = ""
        self.generation = -1
        self.hb_frame = None  # bytearray, correlation id patched per send (hb_mode one)
        self.failed = False
        self.commit_offset = 0
        self.cid = 0  # fixed correlation id on its heartbeat connection (pipelined, bursts)
        self.hb_bytes = None
        self.hb_ok = None
        self.commit_tpl = None
        self.commit_pos = ()
        self.commit_ok = None
        self.owned = None  # consumer: the assignment the server last gave, {topic id: partitions}
        self.acking = False  # consumer: its heartbeat frame carries the owned partitions (an ack)


class Group:
    __slots__ = (
        "group_id",
        "slot",
        "members",
        "done",
        "generation",
        "synced",
        "gen_size",
        "joined_at",
        "rebalances",
        # pipelined heartbeats
        "live",
        "batch",
        "inflight",
        "late",
        "due",
        "timer",
        "finished",
        "cg",  # consumer: the group's CgTrack (convergence, kept incrementally)
    )

    def __init__(self, group_id: str, size: int, slot: int):
        self.group_id = group_id
        self.slot = slot  # index in this process: picks the heartbeat connection and the phase
        self.members = [Member(self, i) for i in range(size)]
        self.done = None
        self.generation = -1
        self.synced: dict[int, set] = {}
        self.gen_size: dict[int, int] = {}
        self.joined_at = None
        self.rebalances = 0
        self.live = ()
        self.batch = None
        self.inflight = False
        self.late = False
        self.due = 0.0
        self.timer = None
        self.finished = True
        self.cg = None


class CgTrack:
    """The convergence of one consumer-protocol (KIP-848) group, kept as its members change so
    that asking costs O(1) and a member's change O(its assignment), not O(members): how many
    members are settled at each epoch (epoch > 0, an assignment known, not acknowledging one), how
    many partition slots the members own in all, and how many of those are duplicates. Converged:
    every member settled at one epoch, and the ``partitions`` partitions owned exactly once."""

    __slots__ = ("size", "partitions", "settled", "owners", "seen", "dups")

    def __init__(self, size: int, partitions: int):
        self.size = size
        self.partitions = partitions
        self.settled: dict[int, int] = {}  # epoch -> members settled at it
        self.owners: dict[tuple, int] = {}  # (topic id, partition) -> members owning it
        self.seen = 0  # partitions owned, counted once per owner
        self.dups = 0  # owners beyond the first, over all partitions

    def remove(self, mem) -> None:
        """Take ``mem``'s current state out (call before changing it)."""
        if mem.generation > 0 and mem.owned is not None and not mem.acking:
            left = self.settled[mem.generation] - 1
            if left:
                self.settled[mem.generation] = left
            else:
                del self.settled[mem.generation]
        if mem.owned:
            owners = self.owners
            for t, ps in mem.owned.items():
                self.seen -= len(ps)
                for p in ps:
                    k = (t, p)
                    c = owners[k] - 1
                    if c:
                        owners[k] = c
                        self.dups -= 1
                    else:
                        del owners[k]

    def add(self, mem) -> None:
        """Count ``mem``'s current state in (call after changing it)."""
        if mem.generation > 0 and mem.owned is not None and not mem.acking:
            self.settled[mem.generation] = self.settled.get(mem.generation, 0) + 1
        if mem.owned:
            owners = self.owners
            for t, ps in mem.owned.items():
                self.seen += len(ps)
                for p in ps:
                    k = (t, p)
                    c = owners.get(k, 0)
                    if c:
                        self.dups += 1
                    owners[k] = c + 1

    def converged(self, epoch: int) -> bool:
        return self.settled.get(epoch, 0) == self.size and not self.dups and self.seen == self.partitions


class Stats:
    def __init__(self, max_samples: int):
        self.max_samples = max_samples
        self.errors: dict[str, int] = {}
        self.join_errors: dict[str, int] = {}
        self.join_requests = 0
        self.sync_requests = 0
        self.join_hb_requests = 0
        self.join_fallback_groups = 0
        self.join_latency_us = array("f")
        self.hb_latency_us = array("f")  # in the window
        self.hb_lateness_us = array("f")
        self.hb_sent_at = array("d")  # send time of each sample of hb_latency_us (LoadGen.window(samples=True))
        self.hb_kernel_latency_us = array("f")  # kernel_stamps: to the kernel's receipt, in step with hb_latency_us
        self.slow_kernel_sent = array("d")  # send times of heartbeats slow by that measure
        self.slow_sent = array("d")  # send times of slow heartbeats in the window (stall analysis)
        self.hb_sent = 0
        self.hb_in_window = 0
        self.hb_before_window = 0
        self.hb_max_latency_before_window_us = 0.0
        self.hb_full_decodes = 0  # answers that were not the expected "no error" bytes
        self.hb_writes = 0  # socket writes that carried heartbeats (pipelined)
        self.hb_changes = 0  # consumer: heartbeat answers with a new epoch or assignment
        self.left = 0  # consumer: members that left (epoch -1) at the end
        self.leave_errors: dict[str, int] = {}
        self.loop_stalls = array("d")  # (when, how late) pairs of the lag ticker
        self.members_failed = 0
        self.hb_unanswered = 0
        self.hb_not_sent = 0
        self.groups_joined = 0
        self.groups_failed = 0
        self.join_done_at = None
        self.failure = None

    def heartbeat_answered(self, window: tuple, sent: float, due: float, arrived: float, code: int,
                           mem, kernel: float | None = None) -> None:
        """Count one heartbeat answer: latency and lateness in the window, slow ones, errors.
        ``kernel``: when this machine's kernel received it (``PipeConn.stamp_reads``)."""
        latency = (arrived - sent) * 1e6
        if window[0] <= sent < window[1]:
            self.hb_in_window += 1
            if len(self.hb_latency_us) < self.max_samples:
                self.hb_latency_us.append(latency)
                self.hb_lateness_us.append((sent - due) * 1e6)
                self.hb_sent_at.append(sent)
                if kernel is not None:
                    # never above what this process saw (clock conversion jitter), never below 0
                    self.hb_kernel_latency_us.append(min(latency, max(0.0, (kernel - sent) * 1e6)))
            if latency > SLOW_US and len(self.slow_sent) < 100_000:
                self.slow_sent.append(sent)
            if kernel is not None and (kernel - sent) * 1e6 > SLOW_US and len(self.slow_kernel_sent) < 100_000:
                self.slow_kernel_sent.append(sent)
        else:
            self.hb_before_window += 1
            if latency > self.hb_max_latency_before_window_us:
                self.hb_max_latency_before_window_us = latency
        if code:
            self.error(self.errors, code)
            mem.failed = True
            self.members_failed += 1

    def error(self, table: dict, code: int) -> None:
        name = E.error_name(code) if hasattr(E, "error_name") else str(code)
        table[name] = table.get(name, 0) + 1


class Worker:
    def __init__(self, cfg: dict, pipe):
        self.cfg = cfg
        self.pipe = pipe
        self.host, port = cfg["bootstrap"].rsplit(":", 1)
        self.port = int(port)
        self.client_id = f"loadgen-{cfg['proc']}"
        self.v = cfg["versions"]
        self.groups = [Group(g, cfg["members"], i) for i, g in enumerate(cfg["group_ids"])]
        self.stats = Stats(cfg["max_latency_samples"])
        self.window = (float("inf"), float("inf"))
        self.slip = cfg.get("hb_slip", False)
        self.join_conns: list[PipeConn] = []
        self.hb_conns: list[PipeConn] = []
        self.schedules: list = []
        self.pipe_active = 0  # pipelined: groups still heartbeating
        self.pipe_done = None
        self.join_seconds = None
        topic = cfg["topic"]
        self.subscription = encode_subscription(Subscription(topics=[topic]), 1)
        self.consumer = cfg.get("protocol") == "consumer"
        if self.consumer:
            for g in self.groups:
                g.cg = CgTrack(len(g.members), cfg["topic_partitions"])
        self.hb_interval = cfg["hb_interval"]  # consumer: the server's heartbeat_interval_ms
        self.loop = None

    # -- commands from the parent --------------------------------------------------------------
    def send(self, *msg):
        self.pipe.send(msg)

    def join_lanes(self) -> int:
        cfg = self.cfg
        if cfg["join_mode"] == "member" or self.consumer:
            return cfg["join_concurrency"]
        return max(1, -(-cfg["join_concurrency"] // cfg["join_batch"]))

    async def run(self):
        self.loop = asyncio.get_running_loop()
        cfg = self.cfg
        try:
            n_join = self.join_lanes() * cfg["members"]
            self.join_conns = await open_conns(self.host, self.port, n_join, self.client_id)
            self.hb_conns = await open_conns(self.host, self.port, cfg["hb_conns"], self.client_id)
            if cfg["kernel_stamps"]:
                for c in self.hb_conns:
                    c.stamp_reads()
            kind = _PipeSchedule if cfg["hb_mode"] == "pipelined" else _Schedule
            self.schedules = [kind(self, c) for c in self.hb_conns]
            self.send("ready", {"cpu_s": _cpu()})
            while True:
                cmd = await self.loop.run_in_executor(None, self.pipe.recv)
                kind = cmd[0]
                if kind == "join":
                    await self.join_all()
                    # the groups and members live to the end: keep them out of every later collection
                    # (a full collection over them pauses this process for a noticeable time)
                    gc.collect()
                    gc.freeze()
                    self.send("joined", self._join_report())
                elif kind == "window":
                    self.window = (cmd[1], cmd[2])
                    self._lag_tick(_now() + LAG_TICK)
                    await self.finish_window(cmd[2])
                    self._lag_handle.cancel()
                    self.send("window_done", self._hb_report())
                elif kind == "verify":
                    self.send("verified", await self.verify())
                elif kind == "leave":
                    self.send("left", await self.leave())
                elif kind == "burst":
                    self.send("burst_done", await self.burst(cmd[1], cmd[2], cmd[3] if len(cmd) > 3 else 1))
                elif kind == "stop":
                    break
        except Exception as exc:  # report instead of hanging the parent
            import traceback

            self.send("failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            for s in self.schedules:
                if isinstance(s, _PipeSchedule):
                    s.conn.on_lost = None
            for c in self.hb_conns + self.join_conns:
                c.close()
            await asyncio.sleep(0.05)

    def _lag_tick(self, due: float) -> None:
        """A 10 ms ticker while the window runs: how late it runs is this process's own stall (a
        slow answer seen while this process was stalled is not the server's)."""
        now = _now()
        lag = now - due
        if lag > LAG_STALL and len(self.stats.loop_stalls) < 20_000:
            self.stats.loop_stalls.extend((due, lag))
        self._lag_handle = self.loop.call_later(LAG_TICK, self._lag_tick, now + LAG_TICK)

    async def finish_window(self, end: float) -> None:
        """Wait until every heartbeat due before ``end`` is answered (at most ``end`` + grace)."""
        timeout = max(0.0, end - _now()) + self.cfg["window_grace"]
        st = self.stats
        if self.cfg["hb_mode"] == "pipelined":
            self.pipe_done = self.loop.create_future()
            for s in self.schedules:
                s.window_set(end)
            if self.pipe_active > 0:
                try:
                    await asyncio.wait_for(asyncio.shield(self.pipe_done), timeout)
                except TimeoutError:
                    pass
            for s in self.schedules:
                s.abandon(end)  # counts what is still unanswered / due but not sent
            return
        for s in self.schedules:
            s.poke()
        tasks = [s.task for s in self.schedules if s.task is not None]
        if tasks:
            # a heartbeat due before the end may still be sent until end + grace; an answer still
            # missing then is counted as unanswered
            _, late = await asyncio.wait(tasks, timeout=timeout)
            for s in self.schedules:
                if s.task in late:
                    st.hb_unanswered += 1 if s.inflight else 0
                    st.hb_not_sent += s.due_before(end)
                    s.task.cancel()

    # -- joining -------------------------------------------------------------------------------
    def _complete(self, g: Group) -> None:
        self.stats.groups_joined += 1
        g.joined_at = _now()
        if self.cfg["hb_schedule"]:
            self.schedule_group(g)

    async def join_all(self):
        cfg = self.cfg
        queue = list(reversed(self.groups))
        size = cfg["members"]
        n_lanes = self.join_lanes()
        lanes = [self.join_conns[i * size : (i + 1) * size] for i in range(n_lanes)]
        deadline = _now() + cfg["join_timeout"]
        started = _now()
        pipelined = cfg["join_mode"] == "pipelined" and not self.consumer

        async def one_by_one(groups, i):
            for g in groups:
                if _now() >= deadline:
                    self.stats.groups_failed += 1
                    continue
                try:
                    await asyncio.wait_for(self.join_group(g, lanes[i]), max(0.1, deadline - _now()))
                except (TimeoutError, ConnectionLost):
                    self.stats.groups_failed += 1
                    await self._renew_lane(lanes, i)
                    continue
                self._complete(g)

        async def lane(i):
            while queue and _now() < deadline:
                if not pipelined:
                    await one_by_one([queue.pop()], i)
                    continue
                batch = [queue.pop() for _ in range(min(cfg["join_batch"], len(queue)))]
                try:
                    left = await asyncio.wait_for(self.join_batch(batch, lanes[i]), max(0.1, deadline - _now()))
                except (TimeoutError, ConnectionLost):
                    # the lane's connections are in an unknown state: replace them, redo the rest
                    await self._renew_lane(lanes, i)
                    left = [g for g in batch if g.joined_at is None]
                self.stats.join_fallback_groups += len(left)
                await one_by_one(left, i)

        await asyncio.gather(*(lane(i) for i in range(n_lanes)))
        self.stats.groups_failed += len(queue)
        self.stats.join_done_at = _now()
        self.join_seconds = _now() - started

    async def _renew_lane(self, lanes, i):
        for c in lanes[i]:
            c.close()
        lanes[i] = await open_conns(self.host, self.port, len(lanes[i]), self.client_id)
        self.join_conns = [c for lane in lanes for c in lane]

    async def _round(self, conns, groups, build, version: int, members=None) -> list[list]:
        """One pipelined round: connection j sends ``build(g, g.members[j])`` for every group (j in
        ``members``, default all), in one write, same group order everywhere; -> answers[k][i] for
        group k and the i-th of ``members``."""
        idx = range(len(conns)) if members is None else members
        if not groups:
            return []
        api_key = None
        lat_arr = self.stats.join_latency_us
        cap = self.stats.max_samples

        async def one(j):
            nonlocal api_key
            conn = conns[j]
            cids, frames = [], []
            for g in groups:
                req = build(g, g.members[j])
                api_key = req.API_KEY
                cid = conn.next_cid()
                cids.append(cid)
                frames.append(bytes(encode_frame(req, version, cid, self.client_id)))
            raw, sent, arrived = await conn.call_many(frames)
            decode = m.RESPONSES[api_key].decode
            out = []
            for cid, resp in zip(cids, raw, strict=True):
                got, pos = decode_response_header(resp, api_key, version)
                if got != cid:
                    raise ConnectionLost(f"correlation id {got} != {cid}")
                out.append(decode(resp, version, pos))
            if len(lat_arr) < cap:
                lat_arr.extend(array("f", [(arrived - sent) * 1e6]) * len(out))
            return out

        per_conn = await asyncio.gather(*(one(j) for j in idx))
        return [[answers[k] for answers in per_conn] for k in range(len(groups))]

    async def join_batch(self, batch: list[Group], conns: list[PipeConn]) -> list[Group]:
        """Join ``batch`` in pipelined rounds (connection j carries member j of every group, the
        same group order on every connection); -> the groups that need the one-by-one path.

        herd, like Kafka, completes the FIRST rebalance of an Empty group when
        ``initial_rebalance_delay_ms`` (0 in the benchmarks) has passed, with whoever has joined by
        then, pending (KIP-394) members or not. If a connection is held up a moment (an answer
        waiting for a log write), a group would complete without that member, whose join then
        starts a rebalance that waits for members whose connections have moved on. So member 0
        makes each group non-Empty first (join, join, sync: gen 1 with one member, Stable); the
        ten members' join is then an ordinary rebalance that completes only once every known and
        pending member has joined, whatever the order of arrival:

        A. member 0: JoinGroup without id (MEMBER_ID_REQUIRED)   B. member 0: JoinGroup with id
        C. member 0: SyncGroup (its own assignment), and at the same time 1. members 1..n-1:
        JoinGroup without id (they become pending)   2. everyone: JoinGroup with id (member 0, the
        leader, rejoins in Stable; parked until all are in)   3. everyone: SyncGroup (the followers'
        are parked until the leader's, at the same position on its connection, arrives)."""
        cfg, st, v = self.cfg, self.stats, self.v
        size = cfg["members"]
        k_parts = cfg["partitions_per_member"]
        protocols = [m.JoinGroupRequestProtocol(name="range", metadata=self.subscription)]
        fallback: list[Group] = []
        leaders: dict[str, str] = {}
        assignments: dict[str, list] = {}
        for g in batch:
            g.done = asyncio.Event()

        def join_req(g, mem):
            return m.JoinGroupRequest(
                group_id=g.group_id,
                session_timeout_ms=cfg["session_timeout_ms"],
                rebalance_timeout_ms=cfg["rebalance_timeout_ms"],
                member_id=mem.member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocols=protocols,
            )

        def sync_req(g, mem):
            return m.SyncGroupRequest(
                group_id=g.group_id,
                generation_id=g.generation,
                member_id=mem.member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocol_name="range",
                assignments=assignments[g.group_id] if mem.member_id == leaders[g.group_id] else [],
            )

        def assign(g, member_ids):
            assignments[g.group_id] = [
                m.SyncGroupRequestAssignment(
                    member_id=mid,
                    assignment=encode_assignment(
                        Assignment(
                            assigned_partitions=[
                                TopicPartitions(
                                    topic=cfg["topic"], partitions=list(range(i * k_parts, i * k_parts + k_parts))
                                )
                            ]
                        ),
                        1,
                    ),
                )
                for i, mid in enumerate(member_ids)
            ]

        def keep(groups, answers, check) -> list[Group]:
            """Groups whose answers all pass ``check(group, member, answer)``; the rest fall back."""
            ok = []
            for g, rs in zip(groups, answers, strict=True):
                good = True
                for r in rs:
                    if r.error_code and r.error_code != E.MEMBER_ID_REQUIRED:
                        st.error(st.join_errors, r.error_code)
                for r in rs:
                    if not check(g, r):
                        good = False
                (ok if good else fallback).append(g)
            return ok

        def minted(g, r):
            return r.error_code == E.MEMBER_ID_REQUIRED and bool(r.member_id)

        first = [0]
        rest = list(range(1, size))
        todo = [g for g in batch if not any(mem.member_id for mem in g.members)]
        fallback += [g for g in batch if g not in todo]
        # A: member 0 without an id
        answers = await self._round(conns, todo, join_req, v["join"], first)
        st.join_requests += len(todo)
        for g, rs in zip(todo, answers, strict=True):
            if minted(g, rs[0]):
                g.members[0].member_id = rs[0].member_id
        todo = keep(todo, answers, minted)
        # B: member 0 with its id: the group's first generation, member 0 alone (and its leader)
        answers = await self._round(conns, todo, join_req, v["join"], first)
        st.join_requests += len(todo)
        for g, rs in zip(todo, answers, strict=True):
            r = rs[0]
            if r.error_code == 0:
                g.generation = r.generation_id
                leaders[g.group_id] = r.leader
                assign(g, [jm.member_id for jm in r.members])
        todo = keep(todo, answers, lambda g, r: r.error_code == 0 and r.leader == g.members[0].member_id)
        # C: member 0 syncs (the group becomes Stable) || 1: the others get their ids (pending)
        sync0, pend = await asyncio.gather(
            self._round(conns, todo, sync_req, v["sync"], first),
            self._round(conns, todo, join_req, v["join"], rest),
        )
        st.sync_requests += len(todo)
        st.join_requests += len(todo) * len(rest)
        for g, rs in zip(todo, pend, strict=True):
            for mem, r in zip(g.members[1:], rs, strict=True):
                if minted(g, r):
                    mem.member_id = r.member_id
        todo = keep(
            todo,
            [a + b for a, b in zip(sync0, pend, strict=True)],
            lambda g, r: r.error_code == 0 if isinstance(r, m.SyncGroupResponse) else minted(g, r),
        )
        for g in todo:
            g.rebalances += 1
        # 2: everyone joins with an id (member 0 rejoins); answered once all are in
        answers = await self._round(conns, todo, join_req, v["join"])
        st.join_requests += len(todo) * size
        ready = []
        for g, rs in zip(todo, answers, strict=True):
            gens = {r.generation_id for r in rs}
            leader = next((r for r in rs if r.error_code == 0 and r.leader == r.member_id), None)
            for r in rs:
                if r.error_code:
                    st.error(st.join_errors, r.error_code)
            if any(r.error_code for r in rs) or len(gens) != 1 or leader is None or len(leader.members) != size:
                fallback.append(g)
                continue
            for mem, r in zip(g.members, rs, strict=True):
                mem.member_id = r.member_id
            g.generation = gens.pop()
            g.rebalances += 1
            leaders[g.group_id] = leader.member_id
            assign(g, [jm.member_id for jm in leader.members])
            ready.append(g)
        # 3: SyncGroup; the followers' are parked until the leader's (same position) arrives
        answers = await self._round(conns, ready, sync_req, v["sync"])
        st.sync_requests += len(ready) * size
        for g in keep(ready, answers, lambda g, r: r.error_code == 0):
            for mem in g.members:
                mem.generation = g.generation
            g.gen_size[g.generation] = size
            g.done.set()
            self._complete(g)
        for g in fallback:
            g.generation = -1
            g.synced = {}
            g.gen_size = {}
        return fallback

    async def join_group(self, g: Group, conns: list[PipeConn]):
        g.done = asyncio.Event()
        join = self.join_consumer if self.consumer else self.join_member
        await asyncio.gather(*(join(g, mem, conns[mem.index]) for mem in g.members))

    # -- the consumer protocol (KIP-848) ----------------------------------------------------------
    def cg_request(self, g: Group, mem: Member, epoch: int, ack: bool):
        """A ConsumerGroupHeartbeat. Epoch 0 (join): the full metadata (subscription, rebalance
        timeout) and no owned partitions; -1: leave; otherwise the unchanged fields are null, and
        the owned partitions are sent only as an acknowledgement of a new assignment (``ack``), as
        librdkafka does."""
        join = epoch == 0
        owned = None
        if join:
            owned = []
        elif ack:
            owned = [m.ConsumerGroupHeartbeatRequestTopicPartitions(topic_id=t, partitions=sorted(ps))
                     for t, ps in sorted((mem.owned or {}).items())]
        return m.ConsumerGroupHeartbeatRequest(
            group_id=g.group_id,
            member_id=mem.member_id,
            member_epoch=epoch,
            rebalance_timeout_ms=self.cfg["rebalance_timeout_ms"] if join else -1,
            subscribed_topic_names=[self.cfg["topic"]] if join else None,
            topic_partitions=owned,
        )

    def cg_answer(self, mem: Member, r) -> bool:
        """Apply a successful ConsumerGroupHeartbeat answer to ``mem``; -> whether its next
        heartbeat differs (a new epoch, or a new assignment to acknowledge)."""
        changed = False
        tr = mem.group.cg
        if r.assignment is None and not mem.acking and r.member_epoch == mem.generation:
            return False
        if tr is not None:
            tr.remove(mem)
        if r.assignment is not None:
            mem.owned = {tp.topic_id: frozenset(tp.partitions) for tp in r.assignment.topic_partitions}
            mem.acking = changed = True
        elif mem.acking:  # the acknowledgement went out and was answered: back to null
            mem.acking = False
            changed = True
        if r.member_epoch != mem.generation:
            mem.generation = r.member_epoch
            changed = True
        if tr is not None:
            tr.add(mem)
        return changed

    def cg_set(self, mem: Member, **fields) -> None:
        """Set a consumer-protocol member's ``generation`` / ``owned`` / ``acking``, keeping its
        group's :class:`CgTrack` in step (every change of those three goes through here or
        :meth:`cg_answer`)."""
        tr = mem.group.cg
        if tr is not None:
            tr.remove(mem)
        for k, v in fields.items():
            setattr(mem, k, v)
        if tr is not None:
            tr.add(mem)

    def cg_converged(self, g: Group) -> bool:
        """Every member at the same epoch, its latest assignment acknowledged, and the topic's
        partitions owned exactly once between them: O(1), from the group's :class:`CgTrack`."""
        return g.cg.converged(g.members[0].generation)

    async def join_consumer(self, g: Group, mem: Member, conn: PipeConn):
        """One consumer-protocol member: join (epoch 0, a member id of its own making, as KIP-848
        v1 clients do), then heartbeat every ``cg_join_poll`` s (at once when it has an assignment
        to acknowledge) until its group has converged (:meth:`cg_converged`)."""
        st, v = self.stats, self.v["cg_heartbeat"]
        mem.member_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        self.cg_set(mem, generation=0, owned=None, acking=False)
        while not g.done.is_set():
            r, lat = await conn.call(self.cg_request(g, mem, mem.generation, mem.acking), v)
            st.join_requests += 1
            if len(st.join_latency_us) < st.max_samples:
                st.join_latency_us.append(lat * 1e6)
            if r.error_code:
                st.error(st.join_errors, r.error_code)
                if r.error_code in (E.FENCED_MEMBER_EPOCH, E.UNKNOWN_MEMBER_ID):
                    self.cg_set(mem, generation=0, owned=None, acking=False)  # rejoin, as a client does
                await asyncio.sleep(self.cfg["cg_join_poll"])
                continue
            if r.heartbeat_interval_ms > 0:
                self.hb_interval = r.heartbeat_interval_ms / 1000
            if self.cg_answer(mem, r) and mem.acking:
                if g.gen_size.get(mem.generation) is None:
                    g.gen_size[mem.generation] = 1
                    g.rebalances += 1
                continue  # acknowledge at once
            if self.cg_converged(g):
                g.generation = mem.generation
                g.done.set()
                return
            try:
                await asyncio.wait_for(g.done.wait(), self.cfg["cg_join_poll"])
            except TimeoutError:
                pass

    async def join_member(self, g: Group, mem: Member, conn: PipeConn):
        cfg, st, v = self.cfg, self.stats, self.v
        size = len(g.members)
        protocols = [m.JoinGroupRequestProtocol(name="range", metadata=self.subscription)]
        while not g.done.is_set():
            req = m.JoinGroupRequest(
                group_id=g.group_id,
                session_timeout_ms=cfg["session_timeout_ms"],
                rebalance_timeout_ms=cfg["rebalance_timeout_ms"],
                member_id=mem.member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocols=protocols,
            )
            r, lat = await conn.call(req, v["join"])
            st.join_requests += 1
            if len(st.join_latency_us) < st.max_samples:
                st.join_latency_us.append(lat * 1e6)
            if r.error_code == E.MEMBER_ID_REQUIRED:
                mem.member_id = r.member_id
                continue
            if r.error_code:
                st.error(st.join_errors, r.error_code)
                if r.error_code == E.UNKNOWN_MEMBER_ID:
                    mem.member_id = ""
                await asyncio.sleep(0.05)
                continue
            gen = r.generation_id
            mem.member_id = r.member_id
            assignments = []
            if r.leader == mem.member_id:
                g.gen_size[gen] = len(r.members)
                g.rebalances += 1
                k = cfg["partitions_per_member"]
                for i, jm in enumerate(r.members):
                    asg = Assignment(
                        assigned_partitions=[
                            TopicPartitions(topic=cfg["topic"], partitions=list(range(i * k, i * k + k)))
                        ]
                    )
                    assignments.append(
                        m.SyncGroupRequestAssignment(member_id=jm.member_id, assignment=encode_assignment(asg, 1))
                    )
            sreq = m.SyncGroupRequest(
                group_id=g.group_id,
                generation_id=gen,
                member_id=mem.member_id,
                group_instance_id=None,
                protocol_type="consumer",
                protocol_name="range",
                assignments=assignments,
            )
            s, lat = await conn.call(sreq, v["sync"])
            st.sync_requests += 1
            if len(st.join_latency_us) < st.max_samples:
                st.join_latency_us.append(lat * 1e6)
            if s.error_code:
                st.error(st.join_errors, s.error_code)
                if s.error_code == E.UNKNOWN_MEMBER_ID:
                    mem.member_id = ""
                continue  # REBALANCE_IN_PROGRESS / ILLEGAL_GENERATION: rejoin
            mem.generation = gen
            synced = g.synced.setdefault(gen, set())
            synced.add(mem.member_id)
            if g.gen_size.get(gen) == size and len(synced) == size:
                g.generation = gen
                g.done.set()
                return
            # wait for the others; a heartbeat now and then tells us about a newer rebalance
            while not g.done.is_set():
                try:
                    await asyncio.wait_for(g.done.wait(), 0.3)
                except TimeoutError:
                    pass
                if g.done.is_set():
                    break
                h, _ = await conn.call(
                    m.HeartbeatRequest(group_id=g.group_id, generation_id=gen, member_id=mem.member_id),
                    v["heartbeat"],
                )
                st.join_hb_requests += 1
                if h.error_code:
                    if h.error_code == E.UNKNOWN_MEMBER_ID:
                        mem.member_id = ""
                    break  # rejoin
        # done: every member's generation is the group's
        mem.generation = g.generation

    def _join_report(self) -> dict:
        st = self.stats
        return {
            "groups_joined": st.groups_joined,
            "groups_failed": st.groups_failed,
            "members_joined": sum(len(g.members) for g in self.groups if g.joined_at is not None),
            "join_requests": st.join_requests,
            "sync_requests": st.sync_requests,
            "join_heartbeats": st.join_hb_requests,
            "join_fallback_groups": st.join_fallback_groups,
            "join_errors": st.join_errors,
            "rebalances": sum(g.rebalances for g in self.groups),
            "join_done_at": st.join_done_at,
            "join_seconds": self.join_seconds,
            "join_latency_us": st.join_latency_us.tobytes(),
            "cpu_s": _cpu(),
        }

    # -- checking the coordinator's view ---------------------------------------------------------
    async def _spare_conn(self) -> PipeConn:
        conn = next((c for c in self.join_conns if not c.lost), None)
        if conn is None:
            conn = (await open_conns(self.host, self.port, 1, self.client_id))[0]
            self.join_conns.append(conn)
        return conn

    async def verify(self) -> dict:
        """DescribeGroups (v5, 100 groups per request, all in one write) for every group
        (consumer protocol: ConsumerGroupDescribe, a member counting only at the epoch we hold):
        its state and whether each member we still consider alive is still a member."""
        req_cls = m.ConsumerGroupDescribeRequest if self.consumer else m.DescribeGroupsRequest
        version = self.v["cg_describe" if self.consumer else "describe"]
        conn = await self._spare_conn()
        by_id = {g.group_id: g for g in self.groups}
        ids = list(by_id)
        frames, cids = [], []
        for i in range(0, len(ids), 100):
            if self.consumer:
                req = req_cls(group_ids=ids[i : i + 100], include_authorized_operations=False)
            else:
                req = req_cls(groups=ids[i : i + 100], include_authorized_operations=False)
            cids.append(conn.next_cid())
            frames.append(bytes(encode_frame(req, version, cids[-1], self.client_id)))
        raw, _, _ = await conn.call_many(frames) if frames else ([], 0, 0)
        states: dict[str, int] = {}
        joined = expected = present = extra = stable_complete = 0
        for cid, resp in zip(cids, raw, strict=True):
            got, pos = decode_response_header(resp, req_cls.API_KEY, version)
            if got != cid:
                raise ConnectionLost(f"correlation id {got} != {cid}")
            for dg in m.RESPONSES[req_cls.API_KEY].decode(resp, version, pos).groups:
                g = by_id.get(dg.group_id)
                if g is None or g.joined_at is None:
                    continue
                joined += 1
                state = dg.group_state if not dg.error_code else f"error {E.error_name(dg.error_code)}"
                states[state] = states.get(state, 0) + 1
                if self.consumer:  # a member is ours only at the epoch we hold
                    held = {mem.member_id: mem.generation for mem in g.members}
                    there = {dm.member_id for dm in dg.members if held.get(dm.member_id) == dm.member_epoch}
                    extra += len(dg.members) - len(there)
                else:
                    there = {dm.member_id for dm in dg.members}
                ours = [mem for mem in g.members if not mem.failed]
                mine = sum(1 for mem in ours if mem.member_id in there)
                expected += len(ours)
                present += mine
                extra += len(there) - mine
                if state == "Stable" and mine == len(g.members) == len(there) == len(dg.members):
                    stable_complete += 1
        return {
            "groups": joined,
            "states": states,
            "groups_stable_complete": stable_complete,
            "members_expected": expected,
            "members_present": present,
            "members_missing": expected - present,
            "members_unexpected": extra,
        }

    async def leave(self) -> dict:
        """Consumer protocol: every member still beating leaves (epoch -1), the members of a
        heartbeat connection in one write; -> counts. Classic: nothing (its members expire)."""
        st = self.stats
        if not self.consumer:
            return {"left": 0, "leave_errors": {}}
        version = self.v["cg_heartbeat"]
        per_conn: dict[int, list] = {}
        for g in self.groups:
            if g.joined_at is None:
                continue
            for mem in g.members:
                if not mem.failed:
                    per_conn.setdefault(g.slot % len(self.hb_conns), []).append((g, mem))

        async def one(i, pairs):
            conn = self.hb_conns[i]
            if conn.lost:
                conn = await self._spare_conn()
            cids = [conn.next_cid() for _ in pairs]
            frames = [bytes(encode_frame(self.cg_request(g, mem, -1, False), version, cid, self.client_id))
                      for (g, mem), cid in zip(pairs, cids, strict=True)]
            raw, _, _ = await conn.call_many(frames)
            for cid, resp in zip(cids, raw, strict=True):
                got, pos = decode_response_header(resp, CGH, version)
                code = m.ConsumerGroupHeartbeatResponse.decode(resp, version, pos).error_code if got == cid else -1
                if code:
                    st.error(st.leave_errors, code)
                else:
                    st.left += 1

        await asyncio.gather(*(one(i, pairs) for i, pairs in per_conn.items()))
        return {"left": st.left, "leave_errors": st.leave_errors}

    # -- heartbeats ----------------------------------------------------------------------------
    def hb_request(self, g: Group, mem: Member):
        return m.HeartbeatRequest(
            group_id=g.group_id, generation_id=g.generation, member_id=mem.member_id, group_instance_id=None
        )

    def hb_frame(self, g: Group, mem: Member) -> bytearray:
        if self.consumer:
            return encode_frame(self.cg_request(g, mem, mem.generation, mem.acking), self.v["cg_heartbeat"], 0,
                                self.client_id)
        return encode_frame(self.hb_request(g, mem), self.v["heartbeat"], 0, self.client_id)

    def fix_hb(self, g: Group, mem: Member, conn: PipeConn) -> None:
        """Give ``mem`` a correlation id of its own on ``conn``, its heartbeat frame with that id and
        the exact bytes of a "no error" answer to it."""
        v = self.v["heartbeat"]
        mem.cid = conn.next_cid()
        mem.hb_bytes = bytes(encode_frame(self.hb_request(g, mem), v, mem.cid, self.client_id))
        mem.hb_ok = ok_answer(m.HeartbeatResponse(throttle_time_ms=0, error_code=0), 12, v, mem.cid)

    def fix_commit(self, g: Group, mem: Member) -> None:
        """An OffsetCommit frame for ``mem`` (fixed correlation id) whose offsets are patched per
        send, and the exact bytes of a "no error" answer."""
        cfg, v = self.cfg, self.v["commit"]
        nparts, topic = cfg["commit_partitions"], cfg["topic"]
        first = (mem.index * nparts) % 100
        idx = [(first + p) % 100 for p in range(nparts)]

        def frame(offset):
            parts = [
                m.OffsetCommitRequestPartition(
                    partition_index=i, committed_offset=offset, committed_leader_epoch=-1, committed_metadata=""
                )
                for i in idx
            ]
            req = m.OffsetCommitRequest(
                group_id=g.group_id,
                generation_id_or_member_epoch=g.generation,
                member_id=mem.member_id,
                group_instance_id=None,
                topics=[m.OffsetCommitRequestTopic(name=topic, partitions=parts)],
            )
            return encode_frame(req, v, mem.cid, self.client_id)

        a, b = frame(0x1111111111111111), frame(0x2222222222222222)
        pos = [i for i in range(len(a) - 7) if a[i : i + 8] == b"\x11" * 8 and b[i : i + 8] == b"\x22" * 8]
        if len(pos) != nparts:
            raise RuntimeError(f"cannot locate the {nparts} offsets in an OffsetCommit v{v} frame")
        mem.commit_tpl = a
        mem.commit_pos = tuple(pos)
        resp = m.OffsetCommitResponse(
            throttle_time_ms=0,
            topics=[
                m.OffsetCommitResponseTopic(
                    name=topic,
                    partitions=[m.OffsetCommitResponsePartition(partition_index=i, error_code=0) for i in idx],
                )
            ],
        )
        mem.commit_ok = ok_answer(resp, m.OffsetCommitRequest.API_KEY, v, mem.cid)

    def schedule_group(self, g: Group):
        """Start heartbeating a complete group. Groups are spread over the interval by a phase of
        their own (groups of a join batch complete together); in mode one, a group's members are
        also spread evenly over the interval; pipelined, they beat together."""
        interval = self.hb_interval
        sched = self.schedules[g.slot % len(self.schedules)]
        now = _now()
        phase = (g.slot * PHASE) % 1.0
        if isinstance(sched, _PipeSchedule):
            sched.add(g, now + interval * phase)
            return
        size = len(g.members)
        for mem in g.members:
            mem.hb_frame = self.hb_frame(g, mem)
            sched.add(now + interval * (mem.index + phase) / size, mem)

    def _hb_report(self) -> dict:
        st = self.stats
        return {
            "hb_sent": st.hb_sent,
            "hb_in_window": st.hb_in_window,
            "hb_before_window": st.hb_before_window,
            "hb_max_latency_before_window_us": st.hb_max_latency_before_window_us,
            "hb_full_decodes": st.hb_full_decodes,
            "hb_writes": st.hb_writes,
            "hb_changes": st.hb_changes,
            "loop_stalls": st.loop_stalls.tobytes(),
            "errors": st.errors,
            "members_failed": st.members_failed,
            "hb_unanswered": st.hb_unanswered,
            "hb_not_sent": st.hb_not_sent,
            "hb_latency_us": st.hb_latency_us.tobytes(),
            "slow_sent": st.slow_sent.tobytes(),
            "hb_lateness_us": st.hb_lateness_us.tobytes(),
            "hb_sent_at": st.hb_sent_at.tobytes(),
            "hb_kernel_latency_us": st.hb_kernel_latency_us.tobytes(),
            "slow_kernel_sent": st.slow_kernel_sent.tobytes(),
            "cpu_s": _cpu(),
        }

    # -- bursts --------------------------------------------------------------------------------
    async def burst(self, kind: str, total: int, depth: int = 1) -> dict:
        """Send ``total`` requests of ``kind`` over all heartbeat connections, ``depth`` in flight
        on each, closed loop."""
        members_by_conn = [[] for _ in self.hb_conns]
        for g in self.groups:
            if g.generation < 0:
                continue
            idx = g.slot % len(self.hb_conns)
            conn = self.hb_conns[idx]
            for mem in g.members:
                if mem.hb_bytes is None:
                    self.fix_hb(g, mem, conn)
                if kind == "commit" and mem.commit_tpl is None:
                    self.fix_commit(g, mem)
                members_by_conn[idx].append(mem)
        live = [(c, ms) for c, ms in zip(self.hb_conns, members_by_conn, strict=True) if ms]
        per_conn = [total // len(live) + (1 if i < total % len(live) else 0) for i in range(len(live))]
        lat = array("f")
        errors: dict[str, int] = {}
        runs = [
            _Burst(self, c, ms, n, depth, kind, lat, errors)
            for (c, ms), n in zip(live, per_conn, strict=True)
            if n
        ]
        cpu0 = _cpu()
        t0 = _now()
        for b in runs:
            b.start()
        try:
            await asyncio.gather(*(b.fut for b in runs))
        finally:
            for b in runs:
                b.restore()
        t1 = _now()
        return {
            "kind": kind,
            "depth": depth,
            "requests": len(lat),
            "seconds": t1 - t0,
            "started": t0,
            "ended": t1,
            "errors": errors,
            "full_decodes": sum(b.full_decodes for b in runs),
            "writes": sum(b.writes for b in runs),
            "latency_us": lat.tobytes(),
            "cpu_s": _cpu() - cpu0,
            "connections": len(runs),
        }


class _Burst:
    """A closed loop of ``count`` requests with ``depth`` in flight on one connection."""

    def __init__(self, w: Worker, conn: PipeConn, members: list, count: int, depth: int, kind, lat, errors):
        self.w = w
        self.conn = conn
        self.members = members
        self.count = count
        self.depth = max(1, depth)
        self.commit = kind == "commit"
        self.lat = lat
        self.errors = errors
        self.to_send = count
        self.received = 0
        self.i = 0
        self.fifo: deque = deque()  # (sent, member)
        self.full_decodes = 0
        self.writes = 0
        self.fut = w.loop.create_future()
        self.saved = (conn.handler, conn.on_lost)
        conn.handler = self.on_frames
        conn.on_lost = self.on_lost

    def restore(self):
        self.conn.handler, self.conn.on_lost = self.saved

    def start(self):
        self.send(min(self.depth, self.to_send))

    def send(self, k: int) -> None:
        members, n = self.members, len(self.members)
        out = []
        mems = []
        pack = _Q.pack_into
        for _ in range(k):
            mem = members[self.i % n]
            self.i += 1
            if self.commit:
                mem.commit_offset += 1
                tpl = mem.commit_tpl
                off = mem.commit_offset
                for p in mem.commit_pos:
                    pack(tpl, p, off)
                out.append(bytes(tpl))
            else:
                out.append(mem.hb_bytes)
            mems.append(mem)
        self.to_send -= k
        sent = _now()
        self.conn.transport.write(out[0] if k == 1 else b"".join(out))
        self.writes += 1
        self.fifo.extend([(sent, mm) for mm in mems])

    def on_frames(self, data, spans, arrived):
        fifo, lat = self.fifo, self.lat
        commit = self.commit
        for s, e in spans:
            if not fifo:
                self.conn.abort("an answer without a request")
                return
            sent, mem = fifo.popleft()
            chunk = data[s:e]
            if chunk != (mem.commit_ok if commit else mem.hb_ok):
                self.full_decode(chunk, mem)
            lat.append((arrived - sent) * 1e6)
        self.received += len(spans)
        k = min(len(spans), self.to_send)
        if k:
            self.send(k)
        if self.received >= self.count and not self.fut.done():
            self.fut.set_result(None)

    def full_decode(self, chunk: bytes, mem: Member) -> None:
        self.full_decodes += 1
        v = self.w.v["commit" if self.commit else "heartbeat"]
        api = m.OffsetCommitRequest.API_KEY if self.commit else m.HeartbeatRequest.API_KEY
        got, pos = decode_response_header(chunk, api, v)
        if got != mem.cid:
            code_name = "CORRELATION_ID_MISMATCH"
        else:
            r = m.RESPONSES[api].decode(chunk, v, pos)
            if self.commit:
                code = next((p.error_code for t in r.topics for p in t.partitions if p.error_code), 0)
            else:
                code = r.error_code
            if not code:
                return
            code_name = E.error_name(code)
        self.errors[code_name] = self.errors.get(code_name, 0) + 1

    def on_lost(self, why):
        if not self.fut.done():
            self.fut.set_exception(ConnectionLost(why))


class _Schedule:
    """hb_mode one: the heartbeat timetable of one connection: a heap of (due, seq, member), one
    sender, one request in flight."""

    def __init__(self, worker: Worker, conn: PipeConn):
        self.w = worker
        self.conn = conn
        self.heap: list = []
        self.seq = 0
        self.task = None
        self._fut = None
        self._handle = None
        self._due = None
        self.inflight = False

    def due_before(self, t: float) -> int:
        return sum(1 for e in self.heap if e[0] < t)

    def add(self, due: float, mem: Member):
        self.seq += 1
        heapq.heappush(self.heap, (due, self.seq, mem))
        if self.task is None:
            self.task = asyncio.ensure_future(self.run())
        elif self._fut is not None and (self._due is None or due < self._due):
            self.poke()

    def poke(self):
        if self._fut is not None and not self._fut.done():
            self._fut.set_result(None)

    async def _sleep(self, due):
        loop = self.w.loop
        self._fut = fut = loop.create_future()
        self._due = due
        self._handle = loop.call_later(max(0.0, due - _now()), _wake, fut) if due is not None else None
        try:
            await fut
        finally:
            if self._handle is not None:
                self._handle.cancel()
            self._fut = None

    async def run(self):
        w = self.w
        st = w.stats
        interval = w.hb_interval
        consumer = w.consumer
        api_key = CGH if consumer else 12
        version = w.v["cg_heartbeat" if consumer else "heartbeat"]
        conn = self.conn
        heap = self.heap
        decode = (m.ConsumerGroupHeartbeatResponse if consumer else m.HeartbeatResponse).decode
        pack_into = struct.pack_into
        while True:
            w_end = w.window[1]
            if not heap:
                if w_end != float("inf"):
                    return
                await self._sleep(None)
                continue
            due = heap[0][0]
            if due >= w_end:
                return
            now = _now()
            if due > now:
                await self._sleep(due)
                continue
            due, seq, mem = heapq.heappop(heap)
            frame = mem.hb_frame
            cid = conn.next_cid()
            pack_into(">i", frame, 8, cid)
            self.inflight = True
            try:
                resp, sent, arrived = await conn.send_frame(bytes(frame))
            except ConnectionLost:
                st.error(st.errors, E.NETWORK_EXCEPTION)
                st.members_failed += 1 + len(heap)
                heap.clear()
                return
            self.inflight = False
            got, pos = decode_response_header(resp, api_key, version)
            if got != cid:
                st.errors["CORRELATION_ID_MISMATCH"] = st.errors.get("CORRELATION_ID_MISMATCH", 0) + 1
                st.members_failed += 1 + len(heap)
                heap.clear()
                conn.abort(f"correlation id {got} != {cid}")
                return
            r = decode(resp, version, pos)
            code = r.error_code
            st.hb_sent += 1
            st.heartbeat_answered(w.window, sent, due, arrived, code, mem, conn.kernel_arrived)
            if code:
                continue
            if consumer and w.cg_answer(mem, r):  # a new epoch or assignment: the next beat says so
                st.hb_changes += 1
                mem.hb_frame = w.hb_frame(mem.group, mem)
                if mem.acking:  # acknowledge at once, as librdkafka does
                    heapq.heappush(heap, (_now(), seq, mem))
                    continue
            heapq.heappush(heap, (next_due(due, sent, interval, w.slip), seq, mem))


class _PipeSchedule:
    """hb_mode pipelined: the groups on one connection. Each group has one timer; when it fires, the
    group's live members' heartbeats go out in one write and a batch entry joins the connection's
    FIFO; answers are matched to the head of the FIFO in order."""

    def __init__(self, worker: Worker, conn: PipeConn):
        self.w = worker
        self.conn = conn
        self.groups: list[Group] = []
        self.fifo: deque = deque()  # [group, sent, due, members, answered, failures]
        self.interval = worker.cfg["hb_interval"]
        conn.handler = self.on_frames
        conn.on_lost = self.on_lost

    def add(self, g: Group, due: float) -> None:
        for mem in g.members:
            self.w.fix_hb(g, mem, self.conn)
        g.live = tuple(mem for mem in g.members if not mem.failed)
        g.batch = None
        g.inflight = False
        g.late = False
        g.finished = False
        g.due = due
        self.groups.append(g)
        self.w.pipe_active += 1
        g.timer = self.w.loop.call_later(max(0.0, due - _now()), self.fire, g)

    def fire(self, g: Group) -> None:
        g.timer = None
        if g.finished:
            return
        if g.due >= self.w.window[1]:
            self.finish(g)
        elif g.inflight:
            g.late = True  # sent as soon as the answers are in
        else:
            self.send(g)

    def send(self, g: Group) -> None:
        batch = g.batch
        if batch is None:
            batch = g.batch = b"".join([mem.hb_bytes for mem in g.live])
        due = g.due
        sent = _now()
        self.conn.transport.write(batch)
        self.w.stats.hb_writes += 1
        self.fifo.append([g, sent, due, g.live, 0, 0])
        g.inflight = True
        g.due = nxt = next_due(due, sent, self.interval, self.w.slip)
        g.timer = self.w.loop.call_later(nxt - sent, self.fire, g)

    def on_frames(self, data, spans, arrived):
        w = self.w
        st = w.stats
        window = w.window
        fifo = self.fifo
        kernel = self.conn.kernel_arrived
        for s, e in spans:
            if not fifo:
                self.conn.abort("a heartbeat answer without a request")
                return
            b = fifo[0]
            members = b[3]
            i = b[4]
            mem = members[i]
            b[4] = i + 1
            chunk = data[s:e]
            code = 0 if chunk == mem.hb_ok else self.full_decode(chunk, mem)
            if code is None:
                return  # the connection is being dropped
            st.heartbeat_answered(window, b[1], b[2], arrived, code, mem, kernel)
            if code:
                b[5] += 1
            if i + 1 == len(members):
                fifo.popleft()
                self.batch_done(b[0], b[5])
        st.hb_sent += len(spans)

    def full_decode(self, chunk: bytes, mem: Member):
        st = self.w.stats
        st.hb_full_decodes += 1
        v = self.w.v["heartbeat"]
        got, pos = decode_response_header(chunk, 12, v)
        if got != mem.cid:
            self.conn.abort(f"correlation id {got} != {mem.cid}")
            return None
        return m.HeartbeatResponse.decode(chunk, v, pos).error_code

    def batch_done(self, g: Group, failures: int) -> None:
        g.inflight = False
        if failures:
            g.live = tuple(mem for mem in g.live if not mem.failed)
            g.batch = None
            if not g.live:
                self.finish(g)
                return
        if g.due >= self.w.window[1]:
            self.finish(g)
        elif g.late:
            g.late = False
            self.send(g)

    def finish(self, g: Group) -> None:
        if g.finished:
            return
        g.finished = True
        if g.timer is not None:
            g.timer.cancel()
            g.timer = None
        w = self.w
        w.pipe_active -= 1
        if w.pipe_active == 0 and w.pipe_done is not None and not w.pipe_done.done():
            w.pipe_done.set_result(None)

    def window_set(self, end: float) -> None:
        for g in self.groups:
            if not g.finished and not g.inflight and g.due >= end:
                self.finish(g)

    def abandon(self, end: float) -> None:
        st = self.w.stats
        for b in self.fifo:
            st.hb_unanswered += len(b[3]) - b[4]
        for g in self.groups:
            if g.finished:
                continue
            if g.late or (not g.inflight and g.due < end):
                st.hb_not_sent += len(g.live)
            self.finish(g)

    def on_lost(self, why) -> None:
        st = self.w.stats
        if any(not g.finished for g in self.groups):
            st.error(st.errors, E.NETWORK_EXCEPTION)
        for g in self.groups:
            if not g.finished:
                st.members_failed += len(g.live)
                for mem in g.live:
                    mem.failed = True
                self.finish(g)
        self.fifo.clear()


def _wake(fut):
    if not fut.done():
        fut.set_result(None)


def _cpu() -> float:
    t = os.times()
    return t.user + t.system


def _worker_main(cfg: dict, pipe) -> None:
    try:
        import uvloop

        runner = asyncio.Runner(loop_factory=uvloop.new_event_loop)
    except ImportError:
        runner = asyncio.Runner()
    with runner:
        runner.run(Worker(cfg, pipe).run())
    pipe.close()


# ---- the parent side --------------------------------------------------------------------------------


def _merge_counts(dicts) -> dict:
    out: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            out[k] = out.get(k, 0) + v
    return out


def _stalls(reps, start: float, bucket: float = 0.25, key: str = "slow_sent") -> dict:
    """Slow (> SLOW_US) heartbeats grouped by when they were sent: many in few 250 ms buckets
    point to the server stalling (every connection waits at once); spread thin, to CPU contention."""
    sent = array("d")
    per_proc = []
    for r in reps:
        n = len(sent)
        sent.frombytes(r[key])
        per_proc.append(len(sent) - n)
    buckets: dict[int, int] = {}
    for t in sent:
        k = int((t - start) / bucket)
        buckets[k] = buckets.get(k, 0) + 1
    top = sorted(buckets.items(), key=lambda kv: -kv[1])[:10]
    return {
        "threshold_ms": SLOW_US / 1000,
        "count": len(sent),
        "count_per_process": per_proc,  # a server stall slows every process's heartbeats
        "buckets_250ms": len(buckets),
        "top_buckets": [[round(k * bucket, 2), n] for k, n in top],  # [seconds into the window, count]
    }


def _loop_stalls(reps, start: float) -> dict:
    """Stalls of the load processes' own event loops in the window (their lag ticker late by more
    than LAG_STALL): a slow answer that coincides with one says nothing about the server."""
    per_proc = []
    worst = 0.0
    when: dict[float, int] = {}
    for r in reps:
        a = array("d")
        a.frombytes(r["loop_stalls"])
        per_proc.append(len(a) // 2)
        for t, lag in zip(a[::2], a[1::2], strict=True):
            worst = max(worst, lag)
            k = round(int((t - start) / 0.25) * 0.25, 2)
            when[k] = when.get(k, 0) + 1
    return {
        "threshold_ms": LAG_STALL * 1000,
        "count_per_process": per_proc,
        "max_ms": worst * 1000,
        "top_buckets": sorted(when.items(), key=lambda kv: -kv[1])[:10],  # [seconds into the window, count]
    }


def _doubles(blobs) -> array:
    a = array("d")
    for b in blobs:
        a.frombytes(b)
    return a


def _floats(blobs) -> array:
    a = array("f")
    for b in blobs:
        a.frombytes(b)
    return a


class LoadGen:
    """Parent-side handle on ``procs`` worker processes. Use as a context manager.

    ``with LoadGen(bootstrap, groups=500, members=10) as lg: lg.join(); lg.window(60)``"""

    def __init__(
        self,
        bootstrap: str,
        groups: int,
        members: int | None = None,
        procs: int = 2,
        hb_conns: int | None = None,
        group_prefix: str = "load",
        group_ids: list[str] | None = None,
        **options,
    ):
        """``group_ids``: the groups' names (default ``{group_prefix}-{i:07d}``), e.g. names a given
        cluster node coordinates, since the load tool talks to one node only."""
        if group_ids is not None and len(group_ids) != groups:
            raise ValueError("group_ids must name exactly `groups` groups")
        self.group_ids = list(group_ids) if group_ids is not None else None
        self.bootstrap = bootstrap
        self.n_groups = groups
        self.procs = max(1, min(procs, groups))
        cfg = json.loads(json.dumps(DEFAULTS))
        if members is not None:
            cfg["members"] = members
        for k, v in options.items():
            if v is None:
                continue
            if k not in cfg:
                raise TypeError(f"unknown option {k}")
            cfg[k] = v
        total_hb = hb_conns if hb_conns is not None else groups
        if cfg["hb_mode"] not in HB_MODES or cfg["join_mode"] not in JOIN_MODES or cfg["protocol"] not in PROTOCOLS:
            raise ValueError(f"hb_mode must be one of {HB_MODES}, join_mode one of {JOIN_MODES}, "
                             f"protocol one of {PROTOCOLS}")
        if cfg["protocol"] == "consumer":
            if cfg["hb_mode"] != "one":
                raise ValueError("the consumer protocol runs with hb_mode one (each answer may change the next beat)")
            cfg["join_mode"] = "member"  # each member joins on its own connection, as real clients do
        self.cfg = cfg
        self.hb_conns_total = max(self.procs, total_hb)
        self.group_prefix = group_prefix
        self.children = []
        self.pipes = []
        self.cpu_at_ready = []

    def params(self) -> dict:
        p = {k: v for k, v in self.cfg.items() if k not in ("max_latency_samples",)}
        p.update(
            groups=self.n_groups,
            procs=self.procs,
            hb_conns=self.hb_conns_total,
            join_conns=self.join_conns_total(),
        )
        return p

    def join_conns_total(self) -> int:
        cfg = self.cfg
        lanes = cfg["join_concurrency"]
        if cfg["join_mode"] == "pipelined":
            lanes = -(-lanes // cfg["join_batch"])
        return lanes * cfg["members"] * self.procs

    def connections_needed(self) -> int:
        return self.hb_conns_total + self.join_conns_total() + self.procs

    def __enter__(self):
        ctx = mp.get_context("spawn")
        ids = self.group_ids or [f"{self.group_prefix}-{i:07d}" for i in range(self.n_groups)]
        try:
            for p in range(self.procs):
                mine = ids[p :: self.procs]
                cfg = dict(
                    self.cfg,
                    proc=p,
                    bootstrap=self.bootstrap,
                    group_ids=mine,
                    hb_conns=max(
                        1,
                        self.hb_conns_total // self.procs
                        + (1 if p < self.hb_conns_total % self.procs else 0),
                    ),
                    join_concurrency=max(1, min(self.cfg["join_concurrency"], len(mine))),
                )
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_worker_main, args=(cfg, child), daemon=True)
                proc.start()
                child.close()
                self.children.append(proc)
                self.pipes.append(parent)
            self.cpu_at_ready = [r["cpu_s"] for r in self._collect("ready", 300)]
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc):
        self.close()

    def close(self):
        for pipe in self.pipes:
            try:
                pipe.send(("stop",))
            except (OSError, BrokenPipeError):
                pass
        for proc in self.children:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        for pipe in self.pipes:
            pipe.close()
        self.children, self.pipes = [], []

    def pids(self) -> list[int]:
        return [p.pid for p in self.children]

    def _collect(self, expect: str, timeout: float) -> list:
        out = []
        deadline = time.monotonic() + timeout
        for pipe in self.pipes:
            while True:
                left = deadline - time.monotonic()
                if left <= 0 or not pipe.poll(min(left, 1.0)):
                    if left <= 0:
                        raise TimeoutError(f"load worker did not report {expect!r} within {timeout}s")
                    continue
                try:
                    msg = pipe.recv()
                except EOFError:
                    raise RuntimeError("a load worker process died (see its traceback above)") from None
                if msg[0] == "failed":
                    raise RuntimeError(f"load worker failed: {msg[1]}")
                if msg[0] == expect:
                    out.append(msg[1])
                    break
        return out

    def _broadcast(self, *msg):
        for pipe in self.pipes:
            pipe.send(msg)

    def join(self, timeout: float | None = None) -> dict:
        """Join every group; -> stats. ``seconds``: from the command to the last group complete."""
        t0 = _now()
        self._broadcast("join")
        reps = self._collect("joined", (timeout or self.cfg["join_timeout"]) + 60)
        lat = _floats(r["join_latency_us"] for r in reps)
        from bench._util import percentiles

        return {
            "seconds": max(r["join_done_at"] for r in reps) - t0,
            "groups_joined": sum(r["groups_joined"] for r in reps),
            "groups_failed": sum(r["groups_failed"] for r in reps),
            "members_joined": sum(r["members_joined"] for r in reps),
            "join_requests": sum(r["join_requests"] for r in reps),
            "sync_requests": sum(r["sync_requests"] for r in reps),
            "heartbeats_while_joining": sum(r["join_heartbeats"] for r in reps),
            "groups_joined_one_by_one": sum(r["join_fallback_groups"] for r in reps),
            "generations": sum(r["rebalances"] for r in reps),
            "errors": _merge_counts(r["join_errors"] for r in reps),
            "request_latency_ms": {
                k: (v / 1000 if isinstance(v, float) else v) for k, v in percentiles(lat, (50, 99)).items()
            },
            "load_cpu_s": sum(r["cpu_s"] for r in reps) - sum(self.cpu_at_ready),
        }

    def window(self, duration: float, start: float | None = None, samples: bool = False) -> dict:
        """Measure heartbeats sent in [start, start + duration); wait for them; -> stats.
        ``samples``: also ``"samples": (send times, latencies in µs)``, two arrays in step (send
        times are ``time.perf_counter()``, comparable across processes), to slice the window into
        phases (``bench/big_group.py``); not JSON: pop it before printing."""
        start = _now() if start is None else start
        end = start + duration
        cpu0 = self._children_cpu()
        self._broadcast("window", start, end)
        reps = self._collect("window_done", duration + self.cfg["window_grace"] + 60)
        cpu1 = self._children_cpu()
        lat = _floats(r["hb_latency_us"] for r in reps)
        late = _floats(r["hb_lateness_us"] for r in reps)
        kernel = _floats(r.get("hb_kernel_latency_us", b"") for r in reps)
        stamped = len(kernel) == len(lat) and len(lat) > 0  # every sample has its kernel receipt
        from bench._util import percentiles

        lat_ms = {
            k: (v / 1000 if isinstance(v, float) else v) for k, v in percentiles(lat, (50, 99, 99.9)).items()
        }
        late_ms = {
            k: (v / 1000 if isinstance(v, float) else v) for k, v in percentiles(late, (50, 99)).items()
        }
        return {
            "window_s": duration,
            "heartbeats": sum(r["hb_in_window"] for r in reps),
            "heartbeats_per_s": sum(r["hb_in_window"] for r in reps) / duration,
            "heartbeats_before_window": sum(r["hb_before_window"] for r in reps),
            "max_latency_before_window_ms": max(r["hb_max_latency_before_window_us"] for r in reps) / 1000,
            "latency_ms": lat_ms,
            "lateness_ms": late_ms,
            "errors": _merge_counts(r["errors"] for r in reps),
            "members_failed": sum(r["members_failed"] for r in reps),
            "full_decodes": sum(r["hb_full_decodes"] for r in reps),
            "heartbeat_writes": sum(r["hb_writes"] for r in reps),
            "answers_with_changes": sum(r["hb_changes"] for r in reps),
            "unanswered": sum(r["hb_unanswered"] for r in reps),
            "due_but_not_sent": sum(r["hb_not_sent"] for r in reps),
            "load_cpu_util": (cpu1 - cpu0) / max(1e-9, _now() - start),
            "slow": _stalls(reps, start),
            "load_stalls": _loop_stalls(reps, start),
            # kernel_stamps: the same heartbeats, to when this machine's kernel received each answer
            # (what the load process's own wait for a CPU added is left out)
            **({"latency_at_kernel_ms": {k: (v / 1000 if isinstance(v, float) else v)
                                         for k, v in percentiles(kernel, (50, 99, 99.9)).items()},
                "slow_at_kernel": _stalls(reps, start, key="slow_kernel_sent")} if stamped else {}),
            **({"samples": (_doubles(r["hb_sent_at"] for r in reps), lat) + ((kernel,) if stamped else ())}
               if samples else {}),
        }

    def leave(self, timeout: float = 120.0) -> dict:
        """Consumer protocol: every member still beating leaves the group (epoch -1)."""
        self._broadcast("leave")
        reps = self._collect("left", timeout)
        return {"members_left": sum(r["left"] for r in reps),
                "errors": _merge_counts(r["leave_errors"] for r in reps)}

    def verify(self, timeout: float = 120.0) -> dict:
        """Ask the coordinator (DescribeGroups) about every joined group; -> merged counts."""
        self._broadcast("verify")
        reps = self._collect("verified", timeout)
        out = {k: sum(r[k] for r in reps) for k in reps[0] if k != "states"}
        out["states"] = _merge_counts(r["states"] for r in reps)
        return out

    def burst(self, kind: str, total: int, depth: int = 1) -> dict:
        """``total`` requests of ``kind`` over the heartbeat connections, ``depth`` in flight on each."""
        per = [total // self.procs + (1 if i < total % self.procs else 0) for i in range(self.procs)]
        for pipe, n in zip(self.pipes, per, strict=True):
            pipe.send(("burst", kind, n, depth))
        reps = self._collect("burst_done", 600)
        lat = _floats(r["latency_us"] for r in reps)
        from bench._util import percentiles

        started = min(r["started"] for r in reps)
        ended = max(r["ended"] for r in reps)
        n = sum(r["requests"] for r in reps)
        return {
            "kind": kind,
            "depth": depth,
            "requests": n,
            "seconds": ended - started,
            "requests_per_s": n / (ended - started) if ended > started else None,
            "errors": _merge_counts(r["errors"] for r in reps),
            "latency_ms": {
                k: (v / 1000 if isinstance(v, float) else v) for k, v in percentiles(lat, (50, 99)).items()
            },
            "connections": sum(r["connections"] for r in reps),
            "writes": sum(r["writes"] for r in reps),
            "full_decodes": sum(r["full_decodes"] for r in reps),
            "load_cpu_us_per_request": sum(r["cpu_s"] for r in reps) * 1e6 / n if n else None,
        }

    def _children_cpu(self) -> float:
        from bench._util import proc_cpu_seconds

        total = 0.0
        for pid in self.pids():
            try:
                total += proc_cpu_seconds(pid)
            except OSError:
                pass
        return total


# ---- standalone use ------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__.split("\n\n")[0])
    ap.add_argument("--bootstrap", required=True, help="HOST:PORT of the coordinator")
    ap.add_argument("--groups", type=int, default=500)
    ap.add_argument("--members", type=int, default=10)
    ap.add_argument("--procs", type=int, default=2)
    ap.add_argument(
        "--hb-conns", type=int, default=None, help="heartbeat connections in all (default: groups)"
    )
    ap.add_argument(
        "--join-concurrency",
        type=int,
        default=DEFAULTS["join_concurrency"],
        help="groups joining at once per process",
    )
    ap.add_argument("--protocol", choices=PROTOCOLS, default=DEFAULTS["protocol"],
                    help="consumer: KIP-848 ConsumerGroupHeartbeat at the server's interval (hb-mode one)")
    ap.add_argument("--hb-mode", choices=HB_MODES, default=DEFAULTS["hb_mode"])
    ap.add_argument("--join-mode", choices=JOIN_MODES, default=DEFAULTS["join_mode"])
    ap.add_argument("--join-batch", type=int, default=DEFAULTS["join_batch"], help="pipelined join: groups per round")
    ap.add_argument("--session-timeout-ms", type=int, default=DEFAULTS["session_timeout_ms"])
    ap.add_argument("--hb-interval", type=float, default=DEFAULTS["hb_interval"])
    ap.add_argument("--hb-slip", action="store_true", help="a late heartbeat moves the member's schedule")
    ap.add_argument("--duration", type=float, default=30.0, help="heartbeat window, seconds")
    ap.add_argument("--group-prefix", default=f"loadgen-{os.getpid()}")
    return ap


def cli(argv=None) -> int:
    args = build_parser().parse_args(argv)
    with LoadGen(
        args.bootstrap,
        args.groups,
        args.members,
        procs=args.procs,
        hb_conns=args.hb_conns,
        group_prefix=args.group_prefix,
        join_concurrency=args.join_concurrency,
        session_timeout_ms=args.session_timeout_ms,
        hb_interval=args.hb_interval,
        hb_slip=args.hb_slip,
        hb_mode=args.hb_mode,
        join_mode=args.join_mode,
        join_batch=args.join_batch,
        protocol=args.protocol,
    ) as lg:
        joined = lg.join()
        hb = lg.window(args.duration)
        verified = lg.verify()
        left = lg.leave()
    print(json.dumps({"params": lg.params(), "join": joined, "heartbeat": hb, "verify": verified, "leave": left}))
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
