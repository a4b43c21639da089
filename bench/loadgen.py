"""Raw-protocol load generator: many groups and members over many connections, several processes.

A tool, not a benchmark (no ``main()``): ``bench/scale.py`` and ``bench/server_cost.py`` drive it
through :class:`LoadGen`. Standalone against any Kafka-protocol coordinator::

    python -m bench.loadgen --bootstrap 127.0.0.1:9092 --groups 500 --members 10 --duration 30

It speaks the wire protocol with herd's own codec (``protocol/``), on uvloop, in ``--procs``
processes. Every connection carries ONE request at a time (a Kafka broker answers a connection's
requests in order), so concurrency comes from the number of connections.

Per process:

* Join lanes (``join_concurrency`` lanes of ``members`` connections each): a lane takes the next
  group and runs its members' joins concurrently, one connection per member, like real clients:
  JoinGroup with an empty member id → MEMBER_ID_REQUIRED → JoinGroup with the minted id; the
  leader computes a range-style assignment, everyone sends SyncGroup. A member that learns of a
  newer rebalance (REBALANCE_IN_PROGRESS on SyncGroup or on a heartbeat while waiting for the
  others) rejoins. A group is complete when all of its members hold a successful SyncGroup of the
  same generation, whose leader saw all of them.
* Heartbeat connections (``hb_conns``, groups spread over them): once a group is complete its
  members heartbeat every ``hb_interval`` s at fixed rate, spread evenly over the interval, until
  the end of the window the parent sets. Request bytes are encoded once per member with the codec
  and only the correlation id is patched per send. Latency = send to arrival of the response
  bytes (before the awaiting coroutine runs). Lateness = how long after its due time a heartbeat
  was sent (shows a saturated load tool or a connection falling behind). Any non-zero error code
  is counted by name; that member then stops (it would have to rejoin), so an expiry is visible
  as UNKNOWN_MEMBER_ID / REBALANCE_IN_PROGRESS counts and ``members_failed``.
* Bursts (``burst`` command): every heartbeat connection sends a fixed number of Heartbeats or
  OffsetCommits (``commit_partitions`` partitions of ``topic``, offsets increasing) back to back,
  as fast as the server answers. Used to measure the server's CPU cost per request.

No FindCoordinator/ApiVersions: the load tool talks to the one node it is given.
"""

from __future__ import annotations

import argparse
import asyncio
import heapq
import json
import multiprocessing as mp
import os
import socket
import struct
import sys
import time
from array import array

from protocol import errors as E
from protocol import messages as m
from protocol.consumer import (
    Assignment,
    Subscription,
    TopicPartitions,
    encode_assignment,
    encode_subscription,
)
from protocol.framing import FrameDecoder
from protocol.headers import decode_response_header, encode_request_header

_SIZE = struct.Struct(">i")
_now = time.perf_counter  # CLOCK_MONOTONIC on Linux: comparable across processes
SLOW_US = 50_000  # heartbeats slower than this are also recorded by send time

DEFAULTS = {
    "members": 10,
    "session_timeout_ms": 30_000,
    "rebalance_timeout_ms": 60_000,
    "hb_interval": 3.0,
    "join_concurrency": 50,
    "join_timeout": 300.0,
    "topic": "bench",
    "partitions_per_member": 2,
    "commit_partitions": 10,
    "versions": {"join": 9, "sync": 5, "heartbeat": 4, "commit": 9},
    "hb_schedule": True,  # scale mode: heartbeat every member from its join until the window ends
    "max_latency_samples": 5_000_000,
    "window_grace": 15.0,  # seconds after the window end to finish heartbeats that were due in it
}


class ConnectionLost(Exception):
    pass


def encode_frame(request, version: int, correlation_id: int, client_id: str) -> bytearray:
    out = bytearray(b"\x00\x00\x00\x00")
    encode_request_header(out, request.API_KEY, version, correlation_id, client_id)
    request.encode_into(out, version)
    _SIZE.pack_into(out, 0, len(out) - 4)
    return out


class Conn(asyncio.Protocol):
    """One connection, one request in flight. ``call`` returns the decoded response."""

    def __init__(self, client_id: str):
        self.client_id = client_id
        self.decoder = FrameDecoder(64 * 1024 * 1024)
        self.transport = None
        self.waiter: asyncio.Future | None = None
        self.cid = 0
        self.lost = False

    # asyncio callbacks
    def connection_made(self, transport):
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass

    def data_received(self, data):
        arrived = _now()
        for frame in self.decoder.feed(data):
            w = self.waiter
            self.waiter = None
            if w is not None and not w.done():
                w.set_result((frame, arrived))

    def connection_lost(self, exc):
        self.lost = True
        w = self.waiter
        self.waiter = None
        if w is not None and not w.done():
            w.set_exception(ConnectionLost(str(exc) if exc else "closed by server"))

    # requests
    async def send_frame(self, frame) -> tuple[bytes, float, float]:
        """Send an encoded frame whose correlation id is ``self.cid``; -> (response, sent, arrived)."""
        if self.lost:
            raise ConnectionLost("connection already lost")
        fut = asyncio.get_running_loop().create_future()
        self.waiter = fut
        sent = _now()
        self.transport.write(frame)
        resp, arrived = await fut
        return resp, sent, arrived

    def next_cid(self) -> int:
        self.cid = (self.cid + 1) & 0x7FFFFFFF
        return self.cid

    async def call(self, request, version: int):
        cid = self.next_cid()
        resp, sent, arrived = await self.send_frame(
            bytes(encode_frame(request, version, cid, self.client_id))
        )
        got, pos = decode_response_header(resp, request.API_KEY, version)
        if got != cid:
            raise ConnectionLost(f"correlation id {got} != {cid}")
        return m.RESPONSES[request.API_KEY].decode(resp, version, pos), arrived - sent

    def close(self):
        if self.transport is not None:
            self.transport.close()


async def open_conns(host: str, port: int, n: int, client_id: str, parallel: int = 100) -> list[Conn]:
    loop = asyncio.get_running_loop()
    sem = asyncio.Semaphore(parallel)

    async def one():
        async with sem:
            for attempt in range(20):
                try:
                    _, proto = await loop.create_connection(lambda: Conn(client_id), host, port)
                    return proto
                except OSError:
                    if attempt == 19:
                        raise
                    await asyncio.sleep(0.05 * (attempt + 1))

    return list(await asyncio.gather(*(one() for _ in range(n))))


# ---- the worker process ----------------------------------------------------------------------------


class Member:
    __slots__ = ("group", "index", "member_id", "generation", "hb_frame", "failed", "commit_offset")

    def __init__(self, group, index):
        self.group = group
        self.index = index
        self.member_id = ""
        self.generation = -1
        self.hb_frame = None
        self.failed = False
        self.commit_offset = 0


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
    )

    def __init__(self, group_id: str, size: int, slot: int):
        self.group_id = group_id
        self.slot = slot  # index in this process: picks the heartbeat connection
        self.members = [Member(self, i) for i in range(size)]
        self.done = None
        self.generation = -1
        self.synced: dict[int, set] = {}
        self.gen_size: dict[int, int] = {}
        self.joined_at = None
        self.rebalances = 0


class Stats:
    def __init__(self, max_samples: int):
        self.max_samples = max_samples
        self.errors: dict[str, int] = {}
        self.join_errors: dict[str, int] = {}
        self.join_requests = 0
        self.sync_requests = 0
        self.join_hb_requests = 0
        self.join_latency_us = array("f")
        self.hb_latency_us = array("f")  # in the window
        self.hb_lateness_us = array("f")
        self.slow_sent = array("d")  # send times of slow heartbeats in the window (stall analysis)
        self.hb_sent = 0
        self.hb_in_window = 0
        self.hb_before_window = 0
        self.hb_max_latency_before_window_us = 0.0
        self.members_failed = 0
        self.hb_unanswered = 0
        self.hb_not_sent = 0
        self.groups_joined = 0
        self.groups_failed = 0
        self.join_done_at = None
        self.failure = None

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
        self.hb_conns: list[Conn] = []
        self.schedules: list[_Schedule] = []
        topic = cfg["topic"]
        self.subscription = encode_subscription(Subscription(topics=[topic]), 1)
        self.loop = None

    # -- commands from the parent --------------------------------------------------------------
    def send(self, *msg):
        self.pipe.send(msg)

    async def run(self):
        self.loop = asyncio.get_running_loop()
        cfg = self.cfg
        try:
            n_join = cfg["join_concurrency"] * cfg["members"]
            self.join_conns = await open_conns(self.host, self.port, n_join, self.client_id)
            self.hb_conns = await open_conns(self.host, self.port, cfg["hb_conns"], self.client_id)
            self.schedules = [_Schedule(self, c) for c in self.hb_conns]
            self.send("ready", {"cpu_s": _cpu()})
            while True:
                cmd = await self.loop.run_in_executor(None, self.pipe.recv)
                kind = cmd[0]
                if kind == "join":
                    await self.join_all()
                    self.send("joined", self._join_report())
                elif kind == "window":
                    self.window = (cmd[1], cmd[2])
                    for s in self.schedules:
                        s.poke()
                    tasks = [s.task for s in self.schedules if s.task is not None]
                    if tasks:
                        # a heartbeat due before the end may still be sent until end + grace; an
                        # answer still missing then is counted as unanswered
                        _, late = await asyncio.wait(
                            tasks, timeout=max(0.0, cmd[2] - _now()) + cfg["window_grace"]
                        )
                        for s in self.schedules:
                            if s.task in late:
                                self.stats.hb_unanswered += 1 if s.inflight else 0
                                self.stats.hb_not_sent += s.due_before(cmd[2])
                                s.task.cancel()
                    self.send("window_done", self._hb_report())
                elif kind == "burst":
                    self.send("burst_done", await self.burst(cmd[1], cmd[2]))
                elif kind == "stop":
                    break
        except Exception as exc:  # report instead of hanging the parent
            import traceback

            self.send("failed", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
        finally:
            for c in self.hb_conns + getattr(self, "join_conns", []):
                c.close()
            await asyncio.sleep(0.05)

    # -- joining -------------------------------------------------------------------------------
    async def join_all(self):
        cfg = self.cfg
        queue = list(reversed(self.groups))
        size = cfg["members"]
        lanes = [self.join_conns[i * size : (i + 1) * size] for i in range(cfg["join_concurrency"])]
        deadline = _now() + cfg["join_timeout"]
        started = _now()

        async def lane(conns):
            while queue and _now() < deadline:
                g = queue.pop()
                try:
                    await asyncio.wait_for(self.join_group(g, conns), max(0.1, deadline - _now()))
                except TimeoutError:
                    self.stats.groups_failed += 1
                    continue
                self.stats.groups_joined += 1
                g.joined_at = _now()
                if cfg["hb_schedule"]:
                    self.schedule_group(g)

        await asyncio.gather(*(lane(c) for c in lanes))
        self.stats.groups_failed += len(queue)
        self.stats.join_done_at = _now()
        self.join_seconds = _now() - started

    async def join_group(self, g: Group, conns: list[Conn]):
        g.done = asyncio.Event()
        await asyncio.gather(*(self.join_member(g, mem, conns[mem.index]) for mem in g.members))

    async def join_member(self, g: Group, mem: Member, conn: Conn):
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
                        m.SyncGroupRequestAssignment(
                            member_id=jm.member_id, assignment=encode_assignment(asg, 1)
                        )
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
            "join_errors": st.join_errors,
            "rebalances": sum(g.rebalances for g in self.groups),
            "join_done_at": st.join_done_at,
            "join_seconds": self.join_seconds,
            "join_latency_us": st.join_latency_us.tobytes(),
            "cpu_s": _cpu(),
        }

    # -- heartbeats ----------------------------------------------------------------------------
    def hb_frame(self, g: Group, mem: Member) -> bytearray:
        req = m.HeartbeatRequest(
            group_id=g.group_id, generation_id=g.generation, member_id=mem.member_id, group_instance_id=None
        )
        return encode_frame(req, self.v["heartbeat"], 0, self.client_id)

    def schedule_group(self, g: Group):
        """Start heartbeating a complete group: members spread evenly over one interval."""
        interval = self.cfg["hb_interval"]
        sched = self.schedules[g.slot % len(self.schedules)]
        now = _now()
        size = len(g.members)
        for mem in g.members:
            mem.hb_frame = self.hb_frame(g, mem)
            sched.add(now + interval * (mem.index + 0.5) / size, mem)

    def _hb_report(self) -> dict:
        st = self.stats
        return {
            "hb_sent": st.hb_sent,
            "hb_in_window": st.hb_in_window,
            "hb_before_window": st.hb_before_window,
            "hb_max_latency_before_window_us": st.hb_max_latency_before_window_us,
            "errors": st.errors,
            "members_failed": st.members_failed,
            "hb_unanswered": st.hb_unanswered,
            "hb_not_sent": st.hb_not_sent,
            "hb_latency_us": st.hb_latency_us.tobytes(),
            "slow_sent": st.slow_sent.tobytes(),
            "hb_lateness_us": st.hb_lateness_us.tobytes(),
            "cpu_s": _cpu(),
        }

    # -- bursts --------------------------------------------------------------------------------
    async def burst(self, kind: str, total: int) -> dict:
        """Send ``total`` requests of ``kind`` over all heartbeat connections, closed loop."""
        members_by_conn = [[] for _ in self.hb_conns]
        for g in self.groups:
            if g.generation < 0:
                continue
            idx = g.slot % len(self.hb_conns)
            for mem in g.members:
                if mem.hb_frame is None:
                    mem.hb_frame = self.hb_frame(g, mem)
                members_by_conn[idx].append(mem)
        live = [(c, ms) for c, ms in zip(self.hb_conns, members_by_conn, strict=True) if ms]
        per_conn = [total // len(live) + (1 if i < total % len(live) else 0) for i in range(len(live))]
        lat = array("f")
        errors: dict[str, int] = {}
        v = self.v
        topic = self.cfg["topic"]
        nparts = self.cfg["commit_partitions"]

        async def run(conn: Conn, members: list[Member], count: int):
            for i in range(count):
                mem = members[i % len(members)]
                g = mem.group
                if kind == "heartbeat":
                    frame = mem.hb_frame
                    cid = conn.next_cid()
                    struct.pack_into(">i", frame, 8, cid)
                    resp, sent, arrived = await conn.send_frame(bytes(frame))
                    _, pos = decode_response_header(resp, 12, v["heartbeat"])
                    code = m.HeartbeatResponse.decode(resp, v["heartbeat"], pos).error_code
                else:
                    mem.commit_offset += 1
                    first = (mem.index * nparts) % 100
                    parts = [
                        m.OffsetCommitRequestPartition(
                            partition_index=(first + p) % 100,
                            committed_offset=mem.commit_offset,
                            committed_leader_epoch=-1,
                            committed_metadata="",
                        )
                        for p in range(nparts)
                    ]
                    req = m.OffsetCommitRequest(
                        group_id=g.group_id,
                        generation_id_or_member_epoch=g.generation,
                        member_id=mem.member_id,
                        group_instance_id=None,
                        topics=[m.OffsetCommitRequestTopic(name=topic, partitions=parts)],
                    )
                    cid = conn.next_cid()
                    resp, sent, arrived = await conn.send_frame(
                        bytes(encode_frame(req, v["commit"], cid, self.client_id))
                    )
                    _, pos = decode_response_header(resp, 8, v["commit"])
                    r = m.OffsetCommitResponse.decode(resp, v["commit"], pos)
                    code = next((p.error_code for t in r.topics for p in t.partitions if p.error_code), 0)
                if code:
                    name = E.error_name(code)
                    errors[name] = errors.get(name, 0) + 1
                lat.append((arrived - sent) * 1e6)

        cpu0 = _cpu()
        t0 = _now()
        await asyncio.gather(*(run(c, ms, n) for (c, ms), n in zip(live, per_conn, strict=True)))
        t1 = _now()
        return {
            "kind": kind,
            "requests": len(lat),
            "seconds": t1 - t0,
            "started": t0,
            "ended": t1,
            "errors": errors,
            "latency_us": lat.tobytes(),
            "cpu_s": _cpu() - cpu0,
            "connections": len(live),
        }


class _Schedule:
    """The heartbeat timetable of one connection: a heap of (due, seq, member), one sender."""

    def __init__(self, worker: Worker, conn: Conn):
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
        interval = w.cfg["hb_interval"]
        version = w.v["heartbeat"]
        conn = self.conn
        heap = self.heap
        decode = m.HeartbeatResponse.decode
        pack_into = struct.pack_into
        while True:
            w_start, w_end = w.window
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
            _, pos = decode_response_header(resp, 12, version)
            code = decode(resp, version, pos).error_code
            st.hb_sent += 1
            latency = (arrived - sent) * 1e6
            if w_start <= sent < w_end:
                st.hb_in_window += 1
                if len(st.hb_latency_us) < st.max_samples:
                    st.hb_latency_us.append(latency)
                    st.hb_lateness_us.append((sent - due) * 1e6)
                if latency > SLOW_US and len(st.slow_sent) < 100_000:
                    st.slow_sent.append(sent)
            else:
                st.hb_before_window += 1
                if latency > st.hb_max_latency_before_window_us:
                    st.hb_max_latency_before_window_us = latency
            if code:
                st.error(st.errors, code)
                mem.failed = True
                st.members_failed += 1
                continue
            # like a real client: the next heartbeat is due one interval after this one was sent
            # (on time: due + interval; late: the schedule slips, missed beats are not made up)
            heapq.heappush(heap, (max(due, sent) + interval, seq, mem))


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


def _stalls(reps, start: float, bucket: float = 0.25) -> dict:
    """Slow (> SLOW_US) heartbeats grouped by when they were sent: many in few 250 ms buckets
    point to the server stalling (every connection waits at once); spread thin, to CPU contention."""
    sent = array("d")
    for r in reps:
        sent.frombytes(r["slow_sent"])
    buckets: dict[int, int] = {}
    for t in sent:
        k = int((t - start) / bucket)
        buckets[k] = buckets.get(k, 0) + 1
    top = sorted(buckets.items(), key=lambda kv: -kv[1])[:10]
    return {
        "threshold_ms": SLOW_US / 1000,
        "count": len(sent),
        "buckets_250ms": len(buckets),
        "top_buckets": [[round(k * bucket, 2), n] for k, n in top],  # [seconds into the window, count]
    }


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
        **options,
    ):
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
            join_conns=self.cfg["join_concurrency"] * self.cfg["members"] * self.procs,
        )
        return p

    def connections_needed(self) -> int:
        return self.hb_conns_total + self.cfg["join_concurrency"] * self.cfg["members"] * self.procs

    def __enter__(self):
        ctx = mp.get_context("spawn")
        ids = [f"{self.group_prefix}-{i:07d}" for i in range(self.n_groups)]
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
            "generations": sum(r["rebalances"] for r in reps),
            "errors": _merge_counts(r["join_errors"] for r in reps),
            "request_latency_ms": {
                k: (v / 1000 if isinstance(v, float) else v) for k, v in percentiles(lat, (50, 99)).items()
            },
            "load_cpu_s": sum(r["cpu_s"] for r in reps) - sum(self.cpu_at_ready),
        }

    def window(self, duration: float, start: float | None = None) -> dict:
        """Measure heartbeats sent in [start, start + duration); wait for them; -> stats."""
        start = _now() if start is None else start
        end = start + duration
        cpu0 = self._children_cpu()
        self._broadcast("window", start, end)
        reps = self._collect("window_done", duration + self.cfg["window_grace"] + 60)
        cpu1 = self._children_cpu()
        lat = _floats(r["hb_latency_us"] for r in reps)
        late = _floats(r["hb_lateness_us"] for r in reps)
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
            "unanswered": sum(r["hb_unanswered"] for r in reps),
            "due_but_not_sent": sum(r["hb_not_sent"] for r in reps),
            "load_cpu_util": (cpu1 - cpu0) / max(1e-9, _now() - start),
            "slow": _stalls(reps, start),
        }

    def burst(self, kind: str, total: int) -> dict:
        per = [total // self.procs + (1 if i < total % self.procs else 0) for i in range(self.procs)]
        for pipe, n in zip(self.pipes, per, strict=True):
            pipe.send(("burst", kind, n))
        reps = self._collect("burst_done", 600)
        lat = _floats(r["latency_us"] for r in reps)
        from bench._util import percentiles

        started = min(r["started"] for r in reps)
        ended = max(r["ended"] for r in reps)
        n = sum(r["requests"] for r in reps)
        return {
            "kind": kind,
            "requests": n,
            "seconds": ended - started,
            "requests_per_s": n / (ended - started) if ended > started else None,
            "errors": _merge_counts(r["errors"] for r in reps),
            "latency_ms": {
                k: (v / 1000 if isinstance(v, float) else v) for k, v in percentiles(lat, (50, 99)).items()
            },
            "connections": sum(r["connections"] for r in reps),
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
    ap.add_argument("--session-timeout-ms", type=int, default=DEFAULTS["session_timeout_ms"])
    ap.add_argument("--hb-interval", type=float, default=DEFAULTS["hb_interval"])
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
    ) as lg:
        joined = lg.join()
        hb = lg.window(args.duration)
    print(json.dumps({"params": lg.params(), "join": joined, "heartbeat": hb}))
    return 0


if __name__ == "__main__":
    sys.exit(cli(sys.argv[1:]))
