"""In-process cost of the TCP edge per Heartbeat and per OffsetCommit (no sockets, no second process).

``python -m bench.edge_micro [--quick] [--groups N] [--heartbeats N] [--commits N] [--batches 1,8,32]
[--kinds heartbeat,commit]``

Wires a real ``Runtime`` / ``GroupCoordinator`` / ``Server`` / ``Metrics`` as ``herd serve`` does
(a ``LogStore`` in a temp dir, ``fsync=never``), joins ``--groups`` one-member groups through a
``Connection`` on a fake transport, then calls ``Connection.data_received`` with prebuilt Heartbeat
(v4) frames: one frame per call, and ``batch`` frames per call (a client pipelining several
members' heartbeats on one connection). Reports the event-loop thread's CPU µs per heartbeat
(``time.thread_time``, best of ``--rounds`` passes: robust on a shared machine); the kernel's share
of a real socket is not included (``bench.server_cost`` measures the whole). The fake transport's
``write`` only counts calls and bytes.

``commit``: OffsetCommit v9 frames of 10 partitions each (one per member, as ``bench.loadgen``
sends them), fed the same way; after each read the loop runs one turn (``asyncio.sleep(0)``), which
is when the runtime writes the turn's log records (``fsync=never``: to the page cache) and the
answers leave, so the µs per commit cover decode, the shard, the log records and their ``pwrite``,
the answers, and one loop turn per read.

``cgheartbeat``: each connection's member also joins a KIP-848 consumer group of its own
(ConsumerGroupHeartbeat v1, subscribed to ``edge-topic``, 8 partitions, its assignment
acknowledged); the frames are its steady-state heartbeat (group, member id, epoch; every other
field null: nothing changes), fed as the Heartbeats are, with one loop turn after each read as for
commits (the full path's answer may leave through the runtime). ``--no-cg-fast`` turns the edge's
steady-state path off (every ConsumerGroupHeartbeat through the full dispatch): run both to compare.

``deferredjoin``: ``--joins`` connections each read one whole JoinGroup (v9, the big-group bench's
frame) while the loop turn's rebalance budget is spent (``edge/turns.py``), so each only waits for a
later turn: the edge's share of a burst of rejoins in one poll phase (the kernel's and uvloop's
read are not included).
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from bench import _util as U
from bench.loadgen import encode_frame
from coordinator import logging_setup
from coordinator.config import Config
from coordinator.core.catalog import Catalog
from coordinator.core.coordinator import GroupCoordinator
from coordinator.daemon import YOUNG_GC_THRESHOLD
from coordinator.edge.server import Connection, Server
from coordinator.ops.metrics import Metrics
from coordinator.runtime import Runtime
from coordinator.store.filelog import LogStore
from protocol import messages as m
from protocol.headers import decode_response_header

HEARTBEAT_VERSION = 4
COMMIT_VERSION = 9
COMMIT_PARTITIONS = 10
CG_VERSION = 1
CG_TOPIC = ("edge-topic", 8)
CLIENT_ID = "edge-micro"


class FakeTransport:
    def __init__(self):
        self.writes = 0
        self.bytes = 0
        self.frames: list[bytes] = []
        self.keep = True  # keep written data (joining) or only count it (measuring)
        self.closed = False

    def write(self, data) -> None:
        self.writes += 1
        self.bytes += len(data)
        if self.keep:
            self.frames.append(bytes(data))

    def get_extra_info(self, name, default=None):
        return default

    def get_write_buffer_size(self) -> int:
        return 0

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def abort(self) -> None:
        self.closed = True

    close = abort


def _responses(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        n = int.from_bytes(data[pos:pos + 4], "big", signed=True)
        out.append(data[pos + 4:pos + 4 + n])
        pos += 4 + n
    return out


async def _call(conn: Connection, tr: FakeTransport, request, version: int):
    tr.frames.clear()
    conn.data_received(bytes(encode_frame(request, version, 1, CLIENT_ID)))
    for _ in range(5000):
        if tr.frames:
            break
        await asyncio.sleep(0.001)
    else:
        raise RuntimeError(f"no answer to {request.NAME}")
    (body,) = _responses(b"".join(tr.frames))
    _, pos = decode_response_header(body, request.API_KEY, version)
    return m.RESPONSES[request.API_KEY].decode(body, version, pos)


async def _join(conn, tr, group_id: str) -> tuple[str, int]:
    join = m.JoinGroupRequest(group_id=group_id, session_timeout_ms=300_000, rebalance_timeout_ms=60_000,
                              member_id="", protocol_type="consumer",
                              protocols=[m.JoinGroupRequestProtocol(name="range", metadata=b"")])
    r = await _call(conn, tr, join, 3)  # v3: no KIP-394 round trip
    if r.error_code:
        raise RuntimeError(f"join {group_id}: error {r.error_code}")
    sync = m.SyncGroupRequest(group_id=group_id, generation_id=r.generation_id, member_id=r.member_id,
                              assignments=[m.SyncGroupRequestAssignment(member_id=r.member_id, assignment=b"")])
    s = await _call(conn, tr, sync, 3)
    if s.error_code:
        raise RuntimeError(f"sync {group_id}: error {s.error_code}")
    return r.member_id, r.generation_id


async def _cg_join(conn, tr, group_id: str, i: int) -> tuple[str, int]:
    """A consumer-protocol member of ``group_id``: join, acknowledge; -> (member id, epoch)."""
    mid = f"edge-member-{i:06d}-xxxxxx"
    r = await _call(conn, tr, m.ConsumerGroupHeartbeatRequest(
        group_id=group_id, member_id=mid, member_epoch=0, rebalance_timeout_ms=60_000,
        subscribed_topic_names=[CG_TOPIC[0]], topic_partitions=[]), CG_VERSION)
    if r.error_code or r.assignment is None or not r.assignment.topic_partitions:
        raise RuntimeError(f"consumer join {group_id}: error {r.error_code}, assignment {r.assignment}")
    owned = [m.ConsumerGroupHeartbeatRequestTopicPartitions(topic_id=tp.topic_id, partitions=tp.partitions)
             for tp in r.assignment.topic_partitions]
    a = await _call(conn, tr, m.ConsumerGroupHeartbeatRequest(
        group_id=group_id, member_id=mid, member_epoch=r.member_epoch, topic_partitions=owned), CG_VERSION)
    if a.error_code:
        raise RuntimeError(f"consumer ack {group_id}: error {a.error_code}")
    return mid, a.member_epoch


def _time(conn: Connection, reads: list[bytes], frames_per_read: int, rounds: int) -> float:
    """Best CPU µs per heartbeat over ``rounds`` passes over ``reads``."""
    best = float("inf")
    feed = conn.data_received
    for _ in range(rounds):
        t0 = time.thread_time()
        for data in reads:
            feed(data)
        dt = time.thread_time() - t0
        best = min(best, dt * 1e6 / (len(reads) * frames_per_read))
    return best


async def _time_turns(conn: Connection, reads: list[bytes], frames_per_read: int, rounds: int) -> float:
    """As :func:`_time`, with one loop turn after each read (the runtime's log flush runs then)."""
    best = float("inf")
    feed = conn.data_received
    turn = asyncio.sleep
    for _ in range(rounds):
        t0 = time.thread_time()
        for data in reads:
            feed(data)
            await turn(0)
        dt = time.thread_time() - t0
        best = min(best, dt * 1e6 / (len(reads) * frames_per_read))
    return best


def _deferred_join_cost(server: Server, n: int, rounds: int) -> dict:
    """CPU µs of one ``data_received`` holding a whole JoinGroup (v9, the big-group bench's frame)
    that waits for a later turn (this turn's rebalance budget spent, edge/turns.py), on ``n``
    connections, one read each: what a burst of rejoins costs the poll phase that reads it, besides
    the kernel's and uvloop's share. Best of ``rounds`` passes."""
    from protocol.consumer import Subscription, encode_subscription

    join = m.JoinGroupRequest(group_id="big-0", session_timeout_ms=300_000, rebalance_timeout_ms=120_000,
                              member_id="big-0-member-00000000-0000-0000-0000-000000000000",
                              group_instance_id=None, protocol_type="consumer", protocols=[
                                  m.JoinGroupRequestProtocol(name="range", metadata=encode_subscription(
                                      Subscription(topics=["bench"]), 1))])
    frame = bytes(encode_frame(join, 9, 7, "big"))
    conns = []
    for _ in range(n):
        c = Connection(server)
        c.connection_made(FakeTransport())
        conns.append(c)
    turns = server.turns
    best = float("inf")
    for _ in range(rounds):
        turns.open, turns.start = True, -1e9  # this turn's budget is spent: every join waits
        t0 = time.thread_time()
        for c in conns:
            c.data_received(frame)
        dt = time.thread_time() - t0
        best = min(best, dt * 1e6 / n)
        deferred = sum(1 for c in conns if c.turn_waiting and len(c.queue) == 1)
        if deferred != n:
            raise RuntimeError(f"{deferred} of {n} joins deferred")
        for c in conns:  # back to idle for the next pass
            c.queue.clear()
            c.queued_bytes = 0
            c.turn_waiting = False
            c._account()
        turns.waiting.clear()
    turns.open = False
    for c in conns:
        c.connection_lost(None)
    return {"us_per_request": best, "writes_per_read": 0.0, "requests": n * rounds}


def _commit_frame(group_id: str, member_id: str, generation: int, correlation_id: int) -> bytes:
    parts = [m.OffsetCommitRequestPartition(partition_index=p, committed_offset=1000 + p, committed_leader_epoch=-1,
                                            committed_metadata="") for p in range(COMMIT_PARTITIONS)]
    req = m.OffsetCommitRequest(group_id=group_id, generation_id_or_member_epoch=generation, member_id=member_id,
                                group_instance_id=None,
                                topics=[m.OffsetCommitRequestTopic(name="edge-topic", partitions=parts)])
    return bytes(encode_frame(req, COMMIT_VERSION, correlation_id, CLIENT_ID))


async def _check(conn: Connection, tr: FakeTransport, frames: list[bytes], api_key: int, version: int) -> None:
    """Send ``frames`` pipelined in one read and check every answer is error-free."""
    tr.frames.clear()
    conn.data_received(b"".join(frames))
    for _ in range(len(frames) // Connection.FRAMES_PER_TURN + 2):
        await asyncio.sleep(0)  # the rest of a burst longer than FRAMES_PER_TURN, and the log flush
    answers = _responses(b"".join(tr.frames))
    if len(answers) != len(frames):
        raise RuntimeError(f"{len(answers)} answers to {len(frames)} pipelined requests (api key {api_key})")
    for body in answers:
        _, pos = decode_response_header(body, api_key, version)
        resp = m.RESPONSES[api_key].decode(body, version, pos)
        codes = ([p.error_code for t in resp.topics for p in t.partitions] if api_key == 8
                 else [resp.error_code])
        if any(codes):
            raise RuntimeError(f"api key {api_key}: error codes {codes}")


async def run(args) -> dict:
    loop = asyncio.get_running_loop()
    logging_setup.configure("warning", "console")
    with tempfile.TemporaryDirectory(prefix="herd-edge-micro-") as tmp:
        config = Config(data_dir=tmp, fsync="never", offsets_partitions=50, initial_rebalance_delay_ms=0,
                        log_level="warning", topics=(CG_TOPIC,))
        store = LogStore(Path(tmp), config.offsets_partitions, fsync="never")
        store.open(latest_only=True)
        groups = GroupCoordinator(config.group_config(), node_id=0)
        catalog = Catalog(config, node_id=0)
        runtime = Runtime(config, groups, catalog, store)
        metrics = Metrics() if args.metrics else None
        server = Server(config, runtime, metrics)
        server.loop = loop
        server.cg_fast = args.cg_fast
        runtime.replay({})
        runtime.start(loop)
        tr = FakeTransport()
        conn = Connection(server)
        conn.connection_made(tr)
        members = [(f"edge-{i}", *await _join(conn, tr, f"edge-{i}")) for i in range(args.groups)]
        frames = [bytes(encode_frame(m.HeartbeatRequest(group_id=g, generation_id=gen, member_id=mid),
                                     HEARTBEAT_VERSION, i, CLIENT_ID))
                  for i, (g, mid, gen) in enumerate(members)]
        commits = [_commit_frame(g, mid, gen, len(members) + i) for i, (g, mid, gen) in enumerate(members)]
        cg_frames = []
        if "cgheartbeat" in args.kinds:
            for i in range(args.groups):
                gid = f"edge-cg-{i}"
                mid, epoch = await _cg_join(conn, tr, gid, i)
                cg_frames.append(bytes(encode_frame(m.ConsumerGroupHeartbeatRequest(
                    group_id=gid, member_id=mid, member_epoch=epoch), CG_VERSION, 2 * len(members) + i, CLIENT_ID)))
            await _check(conn, tr, cg_frames, 68, CG_VERSION)
        # check that they are answered without error before measuring
        await _check(conn, tr, frames, 12, HEARTBEAT_VERSION)
        await _check(conn, tr, commits, 8, COMMIT_VERSION)
        tr.keep = False
        gc.collect()
        gc.freeze()
        gc.set_threshold(YOUNG_GC_THRESHOLD, 10, 10)  # as herd serve does
        out = {}
        for kind in args.kinds:
            if kind == "deferredjoin":
                out[kind] = {"1": _deferred_join_cost(server, args.joins, args.rounds)}
                continue
            src, total = {"heartbeat": (frames, args.heartbeats), "commit": (commits, args.commits),
                          "cgheartbeat": (cg_frames, args.heartbeats)}[kind]
            by_batch = out[kind] = {}
            for batch in args.batches:
                reps = max(1, total // len(src))
                reads = [b"".join(src[i:i + batch]) for i in range(0, len(src) - batch + 1, batch)] * reps
                n_reads = len(reads)
                w0 = tr.writes
                if kind == "heartbeat":
                    us = _time(conn, reads, batch, args.rounds)
                else:
                    us = await _time_turns(conn, reads, batch, args.rounds)
                by_batch[str(batch)] = {
                    "us_per_request": us,
                    "writes_per_read": (tr.writes - w0) / (n_reads * args.rounds),
                    "requests": n_reads * batch,
                }
        runtime.shutdown()
        store.close()
        if tr.closed or conn.closed:
            raise RuntimeError("the connection was closed during the run")
        return out


def build_parser() -> argparse.ArgumentParser:
    ap = U.arg_parser("bench.edge_micro", __doc__.split("\n\n")[0], "fewer heartbeats")
    ap.add_argument("--groups", type=int, default=64, help="one-member groups joined (default 64)")
    ap.add_argument("--heartbeats", type=int, default=None, help="per pass and batch size (default 200000, "
                    "quick 50000)")
    ap.add_argument("--commits", type=int, default=None, help="per pass and batch size (default 50000, "
                    "quick 10000)")
    ap.add_argument("--kinds", default="heartbeat,commit,cgheartbeat,deferredjoin",
                    help="requests to measure (heartbeat, commit, cgheartbeat, deferredjoin)")
    ap.add_argument("--joins", type=int, default=2000, help="deferredjoin: connections, one JoinGroup read each")
    ap.add_argument("--no-cg-fast", dest="cg_fast", action="store_false",
                    help="ConsumerGroupHeartbeat always through the full dispatch (the edge's steady-state "
                         "path off)")
    ap.add_argument("--rounds", type=int, default=5, help="passes; the best is reported")
    ap.add_argument("--batches", default="1,8,32", help="frames per data_received call")
    ap.add_argument("--no-metrics", dest="metrics", action="store_false", help="Server without Metrics")
    return ap


def main(argv=None):
    args = U.parse(build_parser(), argv, sized={"heartbeats": (50_000, 200_000), "commits": (10_000, 50_000)})
    args.batches = [int(b) for b in args.batches.split(",") if b]
    args.kinds = [k for k in args.kinds.split(",") if k]
    if not args.kinds or set(args.kinds) - {"heartbeat", "commit", "cgheartbeat", "deferredjoin"}:
        raise SystemExit("--kinds: a comma-separated list of heartbeat, commit, cgheartbeat, deferredjoin")
    if any(b > min(args.groups, Connection.FRAMES_PER_TURN) for b in args.batches):
        raise SystemExit(f"every batch must be <= --groups and <= {Connection.FRAMES_PER_TURN} (one loop turn)")
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        res = runner.run(run(args))
    result = {
        "benchmark": "edge_micro",
        **U.environment(),
        "params": {"groups": args.groups, "heartbeats": args.heartbeats, "commits": args.commits,
                   "joins": args.joins, "rounds": args.rounds, "batches": args.batches, "kinds": args.kinds,
                   "metrics": args.metrics,
                   "cg_fast": args.cg_fast, "cg_version": CG_VERSION,
                   "heartbeat_version": HEARTBEAT_VERSION, "commit_version": COMMIT_VERSION,
                   "commit_partitions": COMMIT_PARTITIONS, "quick": args.quick},
        "by_kind": res,
    }
    rows = [[kind, b, f"{r['us_per_request']:.2f}", f"{r['writes_per_read']:.2f}"]
            for kind, by_batch in res.items() for b, r in by_batch.items()]
    U.emit(result, "edge cost per request (in process, fake transport, fsync=never)\n"
           + U.table(rows, ["request", "frames/read", "µs/request", "writes/read"]))


if __name__ == "__main__":
    main(sys.argv[1:])
