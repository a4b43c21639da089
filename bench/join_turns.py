"""In-process cost, per loop turn, of a big classic group's join phase end and leader's SyncGroup.

``python -m bench.join_turns [--quick] [--members 10000] [--gc herd|off]``

Wires a real ``Runtime`` / ``GroupCoordinator`` / ``Server`` as ``herd serve`` does (a ``LogStore``
in a temp dir, ``fsync=never``) with one ``Connection`` per member on a fake transport (no sockets,
no second process: ``bench.big_group`` measures the whole over TCP). The group forms as that bench
forms it: member 0 alone (generation 1), the others get their ids (KIP-394), then every member
sends JoinGroup with its id; then it rebalances: every member rejoins. In both phases:

* ``first_join_read_ms``: the ``data_received`` of the first JoinGroup (the one that starts the
  join phase: in the rejoin, the rebalance), and ``worst_join_read_ms`` the longest of those before
  the last (with ``--gc herd`` usually one with a young collection in it);
* ``join_end_ms``: the ``data_received`` of the last JoinGroup, the one that ends the join phase
  (the thread's CPU time: one loop turn's worth of work);
* ``worst_turn_after_join_ms``: the longest of the loop turns that follow (the leader's answer,
  the answers in slices, the follower SyncGroups' handling);
* ``leader_sync_ms`` and ``worst_turn_after_sync_ms``: the same for the leader's SyncGroup (every
  member's assignment) and the turns after it (its record in slices, the store, the answers).

``--gc herd``: the collector as the daemon sets it (everything frozen once formed, the young
threshold ``coordinator.daemon.YOUNG_GC_THRESHOLD``, ``GcWatch`` freezing survivors); ``off``:
collections disabled during the phases, the code's own cost. Best of ``--rounds`` runs (each a
fresh runtime).
"""
from __future__ import annotations

import asyncio
import gc
import sys
import tempfile
import time
from pathlib import Path

import uvloop

from bench import _util as U
from bench.edge_micro import FakeTransport, _responses
from bench.loadgen import encode_frame
from coordinator import logging_setup
from coordinator.config import Config
from coordinator.core.catalog import Catalog
from coordinator.core.coordinator import GroupCoordinator
from coordinator.daemon import YOUNG_GC_THRESHOLD
from coordinator.edge.server import Connection, Server
from coordinator.ops.gcwatch import GcWatch
from coordinator.runtime import Runtime
from coordinator.store.filelog import LogStore
from protocol import messages as m
from protocol.consumer import Subscription, encode_subscription
from protocol.headers import decode_response_header

GROUP = "big-0"
V_JOIN, V_SYNC = 9, 5
META = encode_subscription(Subscription(topics=["bench"]), 1)
AFTER_TURNS = 600  # loop turns watched after the join end and after the leader's sync


def _join(mid: str) -> bytes:
    return bytes(encode_frame(m.JoinGroupRequest(
        group_id=GROUP, session_timeout_ms=300_000, rebalance_timeout_ms=120_000, member_id=mid,
        group_instance_id=None, protocol_type="consumer",
        protocols=[m.JoinGroupRequestProtocol(name="range", metadata=META)]), V_JOIN, 1, "big"))


def _sync(mid: str, generation: int, assignments) -> bytes:
    return bytes(encode_frame(m.SyncGroupRequest(
        group_id=GROUP, generation_id=generation, member_id=mid, group_instance_id=None, protocol_type="consumer",
        protocol_name="range", assignments=assignments), V_SYNC, 2, "big"))


def _last(tr: FakeTransport, cls, version: int):
    body = _responses(b"".join(tr.frames))[-1]
    _, pos = decode_response_header(body, cls.API_KEY, version)
    return cls.decode(body, version, pos)


async def _turns(n: int) -> float:
    """The longest of the next ``n`` loop turns (thread CPU ms)."""
    worst = 0.0
    for _ in range(n):
        t0 = time.thread_time()
        await asyncio.sleep(0)
        worst = max(worst, time.thread_time() - t0)
    return worst * 1000


async def _feed(conns, frames) -> tuple[float, float]:
    """Each connection reads its frame; a loop turn every 100 reads (as polls would). Returns the
    first read and the longest (thread CPU ms)."""
    worst = first = 0.0
    for i, ((c, _tr), f) in enumerate(zip(conns, frames, strict=True)):
        t0 = time.thread_time()
        c.data_received(f)
        took = time.thread_time() - t0
        worst = max(worst, took)
        if i == 0:
            first = took
        if i % 100 == 99:
            await asyncio.sleep(0)
    for _ in range(AFTER_TURNS):
        await asyncio.sleep(0)
    return first * 1000, worst * 1000


async def _phase(conns, ids: list[str], gc_mode: str) -> dict:
    for _c, tr in conns:
        tr.frames.clear()
    if gc_mode == "off":
        gc.collect()
        gc.disable()
    first_join, worst_join = await _feed(conns[:-1], [_join(mid) for mid in ids[:-1]])
    c, _tr = conns[-1]
    t0 = time.thread_time()
    c.data_received(_join(ids[-1]))  # ends the join phase
    out = {"first_join_read_ms": first_join, "worst_join_read_ms": worst_join,
           "join_end_ms": (time.thread_time() - t0) * 1000, "worst_turn_after_join_ms": await _turns(AFTER_TURNS)}
    answers = [_last(tr, m.JoinGroupResponse, V_JOIN) for _c, tr in conns]
    if any(a.error_code for a in answers):
        raise RuntimeError(f"JoinGroup errors: {sorted({a.error_code for a in answers})}")
    leader = next(i for i, a in enumerate(answers) if a.leader == a.member_id)
    generation = answers[leader].generation_id
    listed = [x.member_id for x in answers[leader].members]
    if len(listed) != len(conns):
        raise RuntimeError(f"the leader's answer lists {len(listed)} of {len(conns)} members")
    followers = [i for i in range(len(conns)) if i != leader]
    for i in followers:
        conns[i][1].frames.clear()
    await _feed([conns[i] for i in followers], [_sync(ids[i], generation, []) for i in followers])
    c, tr = conns[leader]
    tr.frames.clear()
    frame = _sync(ids[leader], generation, [m.SyncGroupRequestAssignment(member_id=x, assignment=b"\0\1")
                                            for x in listed])
    t0 = time.thread_time()
    c.data_received(frame)
    out["leader_sync_ms"] = (time.thread_time() - t0) * 1000
    out["worst_turn_after_sync_ms"] = await _turns(AFTER_TURNS)
    if gc_mode == "off":
        gc.enable()
    synced = [_last(tr, m.SyncGroupResponse, V_SYNC) for _c, tr in conns]
    if any(s.error_code for s in synced):
        raise RuntimeError(f"SyncGroup errors: {sorted({s.error_code for s in synced})}")
    out["generation"] = generation
    return out


async def _run_once(n: int, gc_mode: str) -> dict:
    loop = asyncio.get_running_loop()
    with tempfile.TemporaryDirectory(prefix="herd-join-turns-") as tmp:
        config = Config(data_dir=tmp, fsync="never", offsets_partitions=50, initial_rebalance_delay_ms=0,
                        log_level="warning")
        store = LogStore(Path(tmp), config.offsets_partitions, fsync="never")
        store.open(latest_only=True)
        runtime = Runtime(config, GroupCoordinator(config.group_config(), node_id=0), Catalog(config, node_id=0),
                          store)
        server = Server(config, runtime, None)
        server.loop = loop
        runtime.replay({})
        runtime.start(loop)
        conns = []
        for _ in range(n):
            tr = FakeTransport()
            c = Connection(server)
            c.connection_made(tr)
            conns.append((c, tr))
        # member 0 alone: generation 1, Stable
        c0, tr0 = conns[0]
        c0.data_received(_join(""))
        await asyncio.sleep(0)
        id0 = _last(tr0, m.JoinGroupResponse, V_JOIN).member_id
        c0.data_received(_join(id0))
        for _ in range(100):
            if _last(tr0, m.JoinGroupResponse, V_JOIN).generation_id > 0:
                break
            await asyncio.sleep(0.001)
        r0 = _last(tr0, m.JoinGroupResponse, V_JOIN)
        c0.data_received(_sync(id0, r0.generation_id, [m.SyncGroupRequestAssignment(member_id=id0, assignment=b"")]))
        await asyncio.sleep(0)
        # the others get their ids (pending)
        await _feed(conns[1:], [_join("")] * (n - 1))
        ids = [id0] + [_last(tr, m.JoinGroupResponse, V_JOIN).member_id for _c, tr in conns[1:]]
        watch = None
        if gc_mode == "herd":
            gc.collect()
            gc.freeze()
            old = gc.get_threshold()
            gc.set_threshold(YOUNG_GC_THRESHOLD, 10, 10)
            watch = GcWatch().install()  # no schedule: freezes survivors, never walks
        try:
            out = {"formation": await _phase(conns, ids, gc_mode), "rejoin": await _phase(conns, ids, gc_mode)}
        finally:
            if watch is not None:
                watch.uninstall()
                gc.set_threshold(*old)
                gc.unfreeze()
        runtime.shutdown()
        store.close()
        return out


def run(args) -> dict:
    best: dict = {}
    for _ in range(args.rounds):
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            res = runner.run(_run_once(args.members, args.gc))
        for phase, vals in res.items():
            b = best.setdefault(phase, {})
            for k, v in vals.items():
                b[k] = v if k == "generation" else round(min(b.get(k, v), v), 2)
        gc.collect()
    return best


def main(argv=None):
    ap = U.arg_parser("bench.join_turns", __doc__.split("\n\n")[0], "1,000 members")
    ap.add_argument("--members", type=int, default=None, help="members of the group (default 10000)")
    ap.add_argument("--gc", choices=("herd", "off"), default="herd")
    ap.add_argument("--rounds", type=int, default=3, help="fresh runs; the best of each figure is reported")
    args = U.parse(ap, argv, {"members": (1000, 10000)})
    logging_setup.configure("warning", "console")
    res = run(args)
    result = {"benchmark": "join_turns", **U.environment(),
              "params": {"members": args.members, "gc": args.gc, "rounds": args.rounds,
                         "young_gc_threshold": YOUNG_GC_THRESHOLD, "quick": args.quick},
              "phases": res}
    rows = [[ph, f"{v['first_join_read_ms']:.1f}", f"{v['worst_join_read_ms']:.1f}",
             f"{v['join_end_ms']:.1f}", f"{v['worst_turn_after_join_ms']:.1f}", f"{v['leader_sync_ms']:.1f}",
             f"{v['worst_turn_after_sync_ms']:.1f}"] for ph, v in res.items()]
    U.emit(result, f"{args.members} members, gc {args.gc}: thread CPU ms (best of {args.rounds})\n" + U.table(
        rows, ["phase", "first join read", "worst join read", "join end", "worst turn after", "leader sync",
               "worst turn after"]))


if __name__ == "__main__":
    main(sys.argv[1:])
