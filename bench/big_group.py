"""A huge classic group beside many small ones (issue 31 item 4).

``python -m bench.big_group [--quick] [--target herd|kafka] [--big 5000] [--groups 1000] [--members 10] [--procs 2]``

One herd daemon (``bench._util.Herd``, ``--metrics-port 0``), or with ``--target kafka`` one real
Kafka broker (``bench._kafka.KafkaTarget``: 4.4.0, KRaft, one node, topic ``bench``, defaults but
``group.initial.rebalance.delay.ms`` 0; its ``group.max.size`` is unlimited by default). The big
group's driver and the load tool speak the plain protocol to the one node; before anything starts,
FindCoordinator for the big group and a small one must answer NONE (Kafka: offsets partitions loaded).
The raw-protocol load tool
(``bench/loadgen.py``) joins ``--groups`` small groups of ``--members`` members, which then
heartbeat every 3 s (mode ``one``). Inside one heartbeat window (``LoadGen.window(samples=True)``:
each heartbeat's send time and latency, so the window is sliced into phases), this process (asyncio
on uvloop, herd's codec) forms ONE classic group of ``--big`` members and then rebalances it:

* connections: one per big member (a JoinGroup or SyncGroup parked by the coordinator holds its
  connection: a broker handles one request of a connection at a time, so members parked together
  cannot share one), opened before the window;
* formation (as ``loadgen``'s pipelined join, at scale): member 0 joins alone (MEMBER_ID_REQUIRED,
  JoinGroup with its id, SyncGroup: generation 1, Stable); members 1..N-1 get their ids
  (MEMBER_ID_REQUIRED: pending, KIP-394); then every member sends JoinGroup with its id at once
  (the last of those writes is "the last join"); the leader's answer lists every member's metadata;
  each follower sends SyncGroup on its answer, the leader with one assignment per member. Formed =
  the last SyncGroup answer; ``formation_s`` is measured from the last join;
* rebalance: one member leaves (LeaveGroup v4), every other member rejoins with its id (as its next
  heartbeat would tell it to), the leader assigns again, all sync; measured from the LeaveGroup.
  The rejoins leave at once by default (every member in the same millisecond: the worst case, a
  burst no real group sends); ``--rejoin-spread S``: each at its own moment within S seconds
  (uniform, seeded), as members learn of a rebalance at their next heartbeat (S = 3: the Java
  consumer's default ``heartbeat.interval.ms``).

Reported per phase (baseline before the big group, formation, rebalance): the small groups'
heartbeat latency p50/p99/max of the heartbeats SENT in that phase, and how many probes of the
daemon's event-loop lag (``herd_event_loop_lag_seconds`` histogram, /metrics, scraped at each phase
boundary) were over 50 ms and 100 ms; ``herd_event_loop_lag_max_seconds`` (the largest since start)
at the end and before the big group (herd only: null on Kafka); the server's CPU seconds in each
phase (``server_cpu_s``, /proc/<pid>/stat, every thread) on both.
Targets (issue 31): small groups' heartbeat p99 < 50 ms, loop lag max < 0.1 s, formation < 10 s from the last join.

Who had the CPU (server and load share this machine's cores): each phase's ``runqueue`` gives the
seconds run and waited on a run queue (runnable, no CPU: the kernel's schedstat, sampled every
50 ms by ``bench._util.RunQueueWatch``) of the daemon's loop thread (``daemon_loop``; Kafka: every
thread, ``server_threads``), the small groups' load processes (``load``) and this process
(``driver``: the big group's members); the heartbeat window's slowest 250 ms stretches carry the
same waits (``top_buckets_runqueue_ms``). The small groups' heartbeat connections are read with
the kernel's receive timestamps with ``--kernel-stamps``: ``hb_at_kernel_ms`` per phase and
``latency_at_kernel_ms`` is each heartbeat from its send to its answer's receipt by the kernel, so
a load process that waited for a CPU before reading an answer does not count that wait against
the server (its wait between its send timestamp and the write is still counted).
``--load-nice N``: the load (this process, the load processes, and their autogroup when the
server runs in a session of its own, as herd and Kafka do here) at nice N, the server at 0.

``--trace-turns FILE``: the daemon records each loop callback's start and end
(``bench/turn_trace_site``); ``python -m bench._turn_trace FILE`` lists the longest loop iterations
and what filled them.
"""

from __future__ import annotations

import asyncio
import os
import random
import sys
import threading
import time
import urllib.request

from bench import _util as U
from bench.loadgen import LoadGen, PipeConn, encode_frame, open_conns
from protocol import errors as E
from protocol import messages as m
from protocol.consumer import Assignment, Subscription, TopicPartitions, encode_assignment, encode_subscription
from protocol.headers import decode_response_header

TARGETS = {"hb_p99_ms": 50.0, "loop_lag_max_s": 0.1, "formation_s": 10.0}
_now = time.perf_counter
V_JOIN, V_SYNC, V_LEAVE = 9, 5, 4
GROUP = "big-0"


def metrics_text(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        return r.read().decode()


def loop_lag(port: int) -> dict:
    """The daemon's loop-lag histogram (cumulative counts by bucket) and its max since start."""
    out = {"buckets": {}, "max_s": None, "count": 0}
    for line in metrics_text(port).splitlines():
        if line.startswith("herd_event_loop_lag_seconds_bucket"):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out["buckets"][le] = int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("herd_event_loop_lag_seconds_count"):
            out["count"] = int(float(line.rsplit(" ", 1)[1]))
        elif line.startswith("herd_event_loop_lag_max_seconds"):
            out["max_s"] = float(line.rsplit(" ", 1)[1])
    return out


def lag_delta(a: dict, b: dict) -> dict:
    """Probes between two scrapes, and how many of them were later than 50 ms / 100 ms (None for a
    server without herd's loop-lag metric, i.e. Kafka)."""
    if a is None or b is None:
        return None
    n = b["count"] - a["count"]

    def over(le):
        return (b["count"] - b["buckets"].get(le, 0)) - (a["count"] - a["buckets"].get(le, 0))

    return {"probes": n, "over_50ms": over("0.05"), "over_100ms": over("0.1")}


def turn_trace_env(path: str) -> dict:
    """The daemon's environment for ``--trace-turns PATH``: bench/turn_trace_site on its path."""
    return {"HERD_TURN_TRACE": os.path.abspath(path),
            "HERD_TURN_TRACE_FUNCS": os.environ.get("HERD_TURN_TRACE_FUNCS", ""),
            "PYTHONPATH": os.path.join(os.path.dirname(os.path.abspath(__file__)), "turn_trace_site")}


def add_small_group_args(ap) -> None:
    """The small groups' load (bench.loadgen), shared with bench.big_consumer_group."""
    ap.add_argument("--groups", type=int, default=None, help="small groups (default 1000)")
    ap.add_argument("--members", type=int, default=10, help="members per small group")
    ap.add_argument("--procs", type=int, default=2, help="load processes for the small groups")
    ap.add_argument("--hb-interval", type=float, default=3.0)
    ap.add_argument("--kernel-stamps", action="store_true",
                    help="read the small groups' heartbeat answers with the kernel's receive time too "
                         "(hb_at_kernel_ms: leaves out the load processes' own waits for a CPU before they "
                         "read; costs the load ~7%% more CPU)")
    ap.add_argument("--load-nice", type=int, default=0,
                    help="run the load (the small groups' processes and this one, the big group's members) at "
                         "this nice value, the server at its own: the load stands for clients on other machines, "
                         "so it yields the shared cores to the server (0: no change)")
    ap.add_argument("--pin", action="store_true", help="the daemon on the first CPU, the load (this process "
                    "and the small groups' processes) on the others, as bench.scale --pin: a server with a "
                    "core of its own, its clients elsewhere")


def small_group_load(args, bootstrap: str, server_pid: int) -> tuple:
    """(Reniced, LoadGen) for the small groups, shared with bench.big_consumer_group: ``--load-nice``
    lowers this process and the load processes it starts (not the server)."""
    reniced = U.Reniced(getattr(args, "load_nice", 0), server_pid)
    load = LoadGen(bootstrap, groups=args.groups, members=args.members, procs=args.procs, group_prefix="small",
                   hb_mode="one", hb_interval=args.hb_interval, session_timeout_ms=30_000,
                   kernel_stamps=getattr(args, "kernel_stamps", False))
    return reniced, load


class HerdServer:
    """herd for the big group: ``--metrics-port 0`` (the loop lag), room for every connection,
    optionally the daemon of another revision (``--rev``)."""

    name = "herd"

    def __init__(self, args, n: int):
        from bench.abuse import TreeHerd, extract

        self.info = {}
        root = None
        if args.rev:  # the daemon from another revision of this repository (before/after runs)
            import tempfile

            self._tmp = tempfile.TemporaryDirectory(prefix="herd-big-group-")
            root = extract(args.rev, self._tmp.name)
            self.info["daemon_rev"] = args.rev
        extra = ["--metrics-port", "0", "--max-connections", str(n + args.groups + 2000)]
        env = None
        if getattr(args, "trace_turns", None):  # bench/turn_trace_site: each loop callback's cost, written at exit
            env = turn_trace_env(args.trace_turns)
            self.info["turn_trace"] = env["HERD_TURN_TRACE"]
        self.herd = TreeHerd(root, fsync=args.fsync, log_level="info", extra_args=extra, env=env)
        self.mport = None

    def __enter__(self):
        self.herd.__enter__()
        self.mport = self.herd.wait_metrics_port(30)
        self.info["data_fs"] = U.filesystem_of(self.herd.data_dir)
        return self

    def __exit__(self, *exc):
        self.herd.__exit__(*exc)

    @property
    def bootstrap(self) -> str:
        return self.herd.bootstrap

    @property
    def pid(self) -> int:
        return self.herd.pid

    def lag(self):
        return loop_lag(self.mport)

    def events(self, w0_wall: float):
        return daemon_events(self.herd, w0_wall)


class KafkaServer:
    """A real Kafka broker (``bench._kafka.KafkaTarget``: 4.4.0, KRaft, one node, topic ``bench``
    with 100 partitions, ``group.initial.rebalance.delay.ms`` 0, otherwise defaults plus
    ``--kafka-config``). No loop-lag metric: those fields are null."""

    name = "kafka"

    def __init__(self, args, n: int):
        from bench._kafka import KafkaTarget

        overrides = dict(kv.split("=", 1) for kv in (args.kafka_config or []))
        self.t = KafkaTarget("kafka", args.kafka_heap, overrides)
        self.info = {"kafka_heap": args.kafka_heap, "kafka_overrides": overrides, "kafka_version": "4.4.0"}

    def __enter__(self):
        self.t.__enter__()
        self.info["data_fs"] = U.filesystem_of(self.t._tmp.name)
        return self

    def __exit__(self, *exc):
        self.t.__exit__(*exc)

    @property
    def bootstrap(self) -> str:
        return self.t.bootstrap

    @property
    def pid(self) -> int:
        return self.t.pid

    def lag(self):
        return None

    def events(self, w0_wall: float):
        return None


SERVERS = {"herd": HerdServer, "kafka": KafkaServer}


def wait_coordinator(bootstrap: str, group: str, timeout: float = 120.0) -> float:
    """Until FindCoordinator for ``group`` answers NONE (on Kafka: its offsets partition is loaded;
    the load tool and the big group talk to the one node without asking). Returns the seconds waited."""
    from tools.rawclient import RawClient

    host, port = bootstrap.rsplit(":", 1)
    t0 = _now()
    with RawClient((host, int(port)), timeout=30) as c:
        while _now() - t0 < timeout:
            r = c.call(m.FindCoordinatorRequest(key=group, key_type=0), 1)
            if r.error_code == 0:
                return _now() - t0
            time.sleep(0.1)
    raise RuntimeError(f"no coordinator for {group} on {bootstrap} after {timeout} s")


class Big:
    """One classic group of ``n`` members, one connection each (see the module docstring)."""

    def __init__(self, conns: list[PipeConn], session_timeout_ms: int, rebalance_timeout_ms: int):
        self.conns = conns
        self.n = len(conns)
        self.ids = [""] * self.n
        self.session_timeout_ms = session_timeout_ms
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.protocols = [m.JoinGroupRequestProtocol(
            name="range", metadata=encode_subscription(Subscription(topics=["bench"]), 1))]
        self.errors: dict[str, int] = {}
        self.generation = -1
        self.leader = ""
        self.live = list(range(self.n))

    def _err(self, code):
        name = E.error_name(code) if hasattr(E, "error_name") else str(code)
        self.errors[name] = self.errors.get(name, 0) + 1

    def join_frame(self, i: int, conn: PipeConn) -> bytes:
        req = m.JoinGroupRequest(group_id=GROUP, session_timeout_ms=self.session_timeout_ms,
                                 rebalance_timeout_ms=self.rebalance_timeout_ms, member_id=self.ids[i],
                                 group_instance_id=None, protocol_type="consumer", protocols=self.protocols)
        return bytes(encode_frame(req, V_JOIN, conn.next_cid(), "big"))

    @staticmethod
    def decode(resp: bytes, cls, version: int):
        _cid, pos = decode_response_header(resp, cls.API_KEY, version)
        return cls.decode(resp, version, pos)

    async def call(self, i: int, frame: bytes, cls, version: int):
        resp, _sent, arrived = await self.conns[i].send_frame(frame)
        return self.decode(resp, cls, version), arrived

    def sync_frame(self, i: int, assignments) -> bytes:
        req = m.SyncGroupRequest(group_id=GROUP, generation_id=self.generation, member_id=self.ids[i],
                                 group_instance_id=None, protocol_type="consumer", protocol_name="range",
                                 assignments=assignments)
        return bytes(encode_frame(req, V_SYNC, self.conns[i].next_cid(), "big"))

    @staticmethod
    def assign(member_ids) -> list:
        return [m.SyncGroupRequestAssignment(member_id=mid, assignment=encode_assignment(
            Assignment(assigned_partitions=[TopicPartitions(topic="bench", partitions=[k % 100])]), 1))
            for k, mid in enumerate(member_ids)]

    async def join_sync(self, members: list[int], spread: float = 0.0) -> dict:
        """Every member in ``members`` (ids known) sends JoinGroup, then SyncGroup on its answer: at
        once, or with ``spread`` > 0 each at its own moment within that many seconds (uniform, seeded)."""
        t_first_join = _now()
        futs = []
        if spread > 0:
            rng = random.Random(len(members))
            starts = sorted(t_first_join + rng.uniform(0, spread) for _ in members)
            sent = []

            async def later(i, at):
                await asyncio.sleep(max(0.0, at - _now()))
                sent.append(_now())
                return await self.call(i, self.join_frame(i, self.conns[i]), m.JoinGroupResponse, V_JOIN)

            futs = [asyncio.ensure_future(later(i, at)) for i, at in zip(members, starts, strict=True)]
        else:
            sent = [t_first_join]
            for i in members:
                futs.append(asyncio.ensure_future(self.call(i, self.join_frame(i, self.conns[i]),
                                                            m.JoinGroupResponse, V_JOIN)))
                sent[0] = _now()
        synced = []
        leader_seen = {}
        joined = []

        async def member(i, fut):
            r, arrived = await fut
            joined.append(arrived)
            if r.error_code:
                self._err(r.error_code)
                return None
            self.generation = r.generation_id
            if r.leader == r.member_id:
                leader_seen["members"] = len(r.members)
                self.leader = r.member_id
                frame = self.sync_frame(i, self.assign([x.member_id for x in r.members]))
            else:
                frame = self.sync_frame(i, [])
            s, arrived = await self.call(i, frame, m.SyncGroupResponse, V_SYNC)
            if s.error_code:
                self._err(s.error_code)
                return None
            synced.append(arrived)
            return arrived

        await asyncio.gather(*(member(i, f) for i, f in zip(members, futs, strict=True)))
        t_done = _now()
        t_last_join = max(sent)
        return {"t_done": t_done,"t_first_join": t_first_join, "t_last_join": t_last_join,
                "t_first_join_answer": min(joined, default=None), "t_last_join_answer": max(joined, default=None),
                "t_first_sync_answer": min(synced, default=None),
                # formed: the last SyncGroup answer (if none succeeded: when the last answer came)
                "t_formed": max(synced) if len(synced) == len(members) else t_done,
                "synced": len(synced),
                "leader_saw": leader_seen.get("members"), "generation": self.generation}

    async def form(self) -> dict:
        t0 = _now()
        # member 0 alone: generation 1, Stable
        r, _ = await self.call(0, self.join_frame(0, self.conns[0]), m.JoinGroupResponse, V_JOIN)
        if r.error_code != E.MEMBER_ID_REQUIRED:
            raise RuntimeError(f"member 0: JoinGroup answered {r.error_code}")
        self.ids[0] = r.member_id
        r, _ = await self.call(0, self.join_frame(0, self.conns[0]), m.JoinGroupResponse, V_JOIN)
        if r.error_code:
            raise RuntimeError(f"member 0: JoinGroup with id answered {r.error_code}")
        self.generation = r.generation_id
        s, _ = await self.call(0, self.sync_frame(0, self.assign([self.ids[0]])), m.SyncGroupResponse, V_SYNC)
        if s.error_code:
            raise RuntimeError(f"member 0: SyncGroup answered {s.error_code}")
        # the others get their ids (pending)
        t_ids = _now()

        async def minted(i):
            r, _ = await self.call(i, self.join_frame(i, self.conns[i]), m.JoinGroupResponse, V_JOIN)
            if r.error_code != E.MEMBER_ID_REQUIRED:
                self._err(r.error_code)
            self.ids[i] = r.member_id

        await asyncio.gather(*(minted(i) for i in range(1, self.n)))
        t_ids_done = _now()
        out = await self.join_sync(list(range(self.n)))
        out.update(t_start=t0, t_ids=t_ids, t_ids_done=t_ids_done, ids_s=t_ids_done - t_ids)
        return out

    async def rebalance(self, spread: float = 0.0) -> dict:
        """One member leaves; the others rejoin at once, or (``spread`` s) each at its next
        heartbeat, as a client learns of a rebalance (REBALANCE_IN_PROGRESS) at its next heartbeat."""
        gone = self.live.pop()
        t0 = _now()
        req = m.LeaveGroupRequest(group_id=GROUP, members=[m.LeaveGroupRequestMemberIdentity(
            member_id=self.ids[gone], group_instance_id=None, reason="bench")])
        r, _ = await self.call(gone, bytes(encode_frame(req, V_LEAVE, self.conns[gone].next_cid(), "big")),
                               m.LeaveGroupResponse, V_LEAVE)
        if r.error_code:
            self._err(r.error_code)
        out = await self.join_sync(self.live, spread)
        out["t_start"] = t0
        return out


def daemon_events(herd, w0_wall: float) -> list:
    """The daemon's own reports of long pauses (loop lag, stalls, collections), seconds into the window."""
    from datetime import datetime

    out = []
    for ev in ("loop.lag", "loop.stall", "gc.pause", "gc.walked_all", "gc.checked_frozen", "gc.check_walks",
               "gc.check_failed", "edge.read_burst"):
        for e in herd.log_events(ev):
            try:
                t = datetime.fromisoformat(e["timestamp"].replace("Z", "+00:00")).timestamp() - w0_wall
            except (KeyError, ValueError):
                t = None
            ms = e.get("lag_ms", e.get("stall_ms", e.get("pause_ms", e.get("unreachable", e.get("error",
                                                                                    e.get("connections"))))))
            out.append([round(t, 2) if t is not None else None, ev, ms,
                        e.get("frozen", e.get("frozen_before", e.get("took_ms")))]
                       + ([e["fork_ms"]] if "fork_ms" in e else []))
    return sorted(out, key=lambda x: (x[0] is None, x[0] or 0))[:100]


def runqueue_in_slow_buckets(rq, w0: float, slow: dict) -> None:
    """Each of the heartbeat window's slowest 250 ms stretches, with how long each watched thread
    ran and waited for a CPU in it: [s into the window, slow heartbeats, {name: [ms run, ms waited]}]."""
    waits = rq.in_buckets(w0, [k for k, _ in slow["top_buckets"]])
    slow["top_buckets_runqueue_ms"] = [[k, n, waits[k]] for k, n in slow["top_buckets"]]


def phase_stats(samples, start: float, end: float, kernel: bool = False) -> dict | None:
    """Heartbeat latency percentiles (ms) of the beats sent in [start, end): as the load processes
    saw them, or (``kernel``) to their answers' receipt by the kernel (None if not stamped)."""
    sent, lat = samples[0], samples[1]
    if kernel:
        if len(samples) < 3:
            return None
        lat = samples[2]
    vals = [lat[k] / 1000 for k in range(len(sent)) if start <= sent[k] < end]
    return U.percentiles(vals, (50, 99))


def add_kernel_stats(phases: dict, bounds: dict, samples, rq, w0: float, hw: dict) -> None:
    """The phases' heartbeat latency to the kernel's receipt (``hb_at_kernel_ms``), and the run-queue
    waits in the slowest stretches by both measures."""
    for name, (t0, t1) in bounds.items():
        phases[name]["hb_at_kernel_ms"] = phase_stats(samples, t0, t1, kernel=True)
        phases[name]["runqueue"] = rq.between(t0, t1)
    for key in ("slow", "slow_at_kernel"):
        if key in hw:
            runqueue_in_slow_buckets(rq, w0, hw[key])


def run(args) -> dict:
    n = args.big
    target = getattr(args, "target", "herd")
    out = {"target": target, "big_members": n, "small_groups": args.groups,
           "small_members_per_group": args.members, "small_members": args.groups * args.members,
           "rejoin_spread_s": getattr(args, "rejoin_spread", 0.0)}
    with SERVERS[target](args, n) as srv:
        out.update(srv.info)
        # the small groups' and the big group's coordinator answer (Kafka: their offsets partitions loaded)
        out["coordinator_wait_s"] = max(wait_coordinator(srv.bootstrap, g) for g in (GROUP, "small-0000000"))
        nice = out["load_nice"] = getattr(args, "load_nice", 0)
        reniced, load = small_group_load(args, srv.bootstrap, srv.pid)
        with reniced, load as lg:
            out["load_params"] = lg.params()
            if args.pin:
                from bench.scale import _pin

                out["pinning"] = _pin(srv.pid, [c.pid for c in lg.children])
            out["small_join"] = {k: v for k, v in lg.join().items() if k in ("seconds", "groups_joined",
                                                                             "groups_failed", "errors")}
            loop = asyncio.new_event_loop()
            try:
                import uvloop

                loop = uvloop.new_event_loop()
            except ImportError:
                pass
            asyncio.set_event_loop(loop)
            host, port = srv.bootstrap.rsplit(":", 1)
            t = _now()
            conns = loop.run_until_complete(open_conns(host, int(port), n, "big", parallel=200))
            out["big_connect_s"] = _now() - t
            big = Big(conns, args.session_timeout_ms, args.rebalance_timeout_ms)
            # who waited for a CPU when (the daemon's loop thread, the small groups' load processes,
            # this process: the big group's members): a slow answer while the daemon was runnable
            # but not running is the machine's (2 cores shared by server and load), not the server's
            server = "daemon_loop" if target == "herd" else "server_threads"  # a JVM: all its threads
            rq = U.RunQueueWatch({server: [srv.pid], "load": [c.pid for c in lg.children], "driver": [os.getpid()]},
                                 all_threads=frozenset({"server_threads"}))
            rq.__enter__()
            w0 = _now()
            w0_wall = time.time()
            res = {}
            th = threading.Thread(target=lambda: res.update(hb=lg.window(args.window, start=w0, samples=True)))
            th.start()
            lag0 = srv.lag()  # the loop lag before the big group (the small groups' join included)
            cpu0 = U.proc_cpu_seconds(srv.pid)
            kids0 = U.proc_children_cpu_seconds(srv.pid)  # the forked GC checks it reaped
            time.sleep(args.baseline)
            lag1 = srv.lag()
            cpu1 = U.proc_cpu_seconds(srv.pid)
            kids1 = U.proc_children_cpu_seconds(srv.pid)  # the forked GC checks it reaped
            spy = None
            if args.profile:  # py-spy on the daemon for the big group's two phases
                os.makedirs(args.profile, exist_ok=True)
                spy = U.PySpy(srv.pid, os.path.join(args.profile, f"big_group-{n}.txt"), rate=args.profile_rate)
                spy.__enter__()
            formed = loop.run_until_complete(big.form())
            lag2 = srv.lag()
            cpu2 = U.proc_cpu_seconds(srv.pid)
            kids2 = U.proc_children_cpu_seconds(srv.pid)  # the forked GC checks it reaped
            time.sleep(args.settle)
            lag3 = srv.lag()
            cpu3 = U.proc_cpu_seconds(srv.pid)
            kids3 = U.proc_children_cpu_seconds(srv.pid)  # the forked GC checks it reaped
            rebal = loop.run_until_complete(big.rebalance(getattr(args, "rejoin_spread", 0.0)))
            lag4 = srv.lag()
            cpu4 = U.proc_cpu_seconds(srv.pid)
            kids4 = U.proc_children_cpu_seconds(srv.pid)  # the forked GC checks it reaped
            if spy is not None:
                spy.__exit__(None, None, None)
            t_end = _now()
            if t_end > w0 + args.window:
                out["warning"] = "the window ended before the rebalance did: raise --window"
            th.join()
            rq.__exit__(None, None, None)
            for c in conns:
                c.close()
            loop.run_until_complete(asyncio.sleep(0.1))
            loop.close()
            hb = res["hb"]
            samples = hb.pop("samples")
            out["verify_small"] = lg.verify()
            out["daemon_events"] = srv.events(w0_wall)
        if reniced.restored is False:
            out["warning_nice"] = f"this process stays at nice {nice} (lowering it needs CAP_SYS_NICE)"
        out["server_rss_mb_end"] = U.proc_rss_bytes(srv.pid) / 2**20
        out["phases"] = {
            "baseline": {"seconds": formed["t_start"] - w0, "hb_ms": phase_stats(samples, w0, formed["t_start"]),
                         "loop_lag": lag_delta(lag0, lag1), "server_cpu_s": cpu1 - cpu0},
            "formation": {"seconds": formed["t_formed"] - formed["t_start"],
                          "hb_ms": phase_stats(samples, formed["t_start"], formed["t_formed"]),
                          "loop_lag": lag_delta(lag1, lag2), "daemon_cpu_s": cpu2 - cpu1, "server_cpu_s": cpu2 - cpu1},
            "rebalance": {"seconds": rebal["t_formed"] - rebal["t_start"],
                          "hb_ms": phase_stats(samples, rebal["t_start"], rebal["t_formed"]),
                          "loop_lag": lag_delta(lag3, lag4), "daemon_cpu_s": cpu4 - cpu2,
                          "server_cpu_s": cpu4 - cpu3},
        }
        for name, (a, b) in (("baseline", (kids0, kids1)), ("formation", (kids1, kids2)),
                             ("rebalance", (kids3, kids4))):
            out["phases"][name]["server_children_cpu_s"] = round(b - a, 3)
        out["timeline_s"] = {f"{ph}_{k[2:]}": round(v - w0, 3) for ph, d in (("form", formed), ("rebal", rebal))
                             for k, v in d.items() if k.startswith("t_") and v is not None}
        out["formation_s_from_last_join"] = formed["t_formed"] - formed["t_last_join"]
        out["formation_s_from_first_join"] = formed["t_formed"] - formed["t_start"]
        out["minting_ids_s"] = formed["ids_s"]
        out["rebalance_s_from_leave"] = rebal["t_formed"] - rebal["t_start"]
        out["rebalance_s_from_last_join"] = rebal["t_formed"] - rebal["t_last_join"]
        out["big_synced"] = [formed["synced"], rebal["synced"]]
        out["leader_saw"] = [formed["leader_saw"], rebal["leader_saw"]]
        out["big_errors"] = big.errors
        out["loop_lag_max_s_before_big"] = lag0["max_s"] if lag0 else None
        out["loop_lag_max_s_end"] = lag4["max_s"] if lag4 else None
        out["heartbeat_window"] = {k: hb[k] for k in ("heartbeats", "latency_ms", "errors", "members_failed",
                                                       "unanswered", "slow", "load_stalls", "load_cpu_util",
                                                       "latency_at_kernel_ms", "slow_at_kernel") if k in hb}
        add_kernel_stats(out["phases"], {"baseline": (w0, formed["t_start"]),
                                         "formation": (formed["t_start"], formed["t_formed"]),
                                         "rebalance": (rebal["t_start"], rebal["t_formed"])},
                         samples, rq, w0, out["heartbeat_window"])
    if args.profile:
        from bench import _profile

        summary = _profile.summarize(spy.out_path, top=30)
        summary["file"] = spy.out_path
        out["profile"] = summary
        print(_profile.render(summary, f"{target} while a {n}-member group forms and rebalances"), file=sys.stderr)
    out["checks"] = checks(out)
    return out


def checks(out: dict) -> dict:
    """The issue's targets against one run's result (loop lag: None where the server has no such metric)."""
    ph = out["phases"]
    p99 = max((ph[k]["hb_ms"]["p99"] or 0.0) for k in ("formation", "rebalance"))
    at_kernel = [ph[k].get("hb_at_kernel_ms") for k in ("formation", "rebalance")]
    p99k = None if None in at_kernel else max((x["p99"] or 0.0) for x in at_kernel)
    lags = [ph[k]["loop_lag"] for k in ("formation", "rebalance")]
    lag_max = out["loop_lag_max_s_end"]
    form = out["formation_s_from_last_join"]
    complete = out["big_synced"] == [out["big_members"], out["big_members"] - 1]
    return {
        "hb_p99_ms": p99, "hb_p99_ok": p99 < TARGETS["hb_p99_ms"],
        "hb_p99_ratio": p99 / TARGETS["hb_p99_ms"],
        # the same, to the answers' receipt by the kernel: without the load processes' own waits
        # for a CPU (they share the server's cores here; a client elsewhere would not)
        "hb_p99_at_kernel_ms": p99k,
        "hb_p99_at_kernel_ok": None if p99k is None else p99k < TARGETS["hb_p99_ms"],
        "loop_lag_over_100ms_in_big_phases": None if None in lags else sum(x["over_100ms"] for x in lags),
        "loop_lag_max_s": lag_max,
        "loop_lag_ok": None if lag_max is None else lag_max < TARGETS["loop_lag_max_s"],
        "loop_lag_ratio": None if lag_max is None else lag_max / TARGETS["loop_lag_max_s"],
        "formation_s": form,
        "formation_ok": complete and form < TARGETS["formation_s"],
        "formation_ratio": form / TARGETS["formation_s"],
        "big_group_complete": complete,
        "small_errors": sum(out["heartbeat_window"]["errors"].values()) + out["heartbeat_window"]["members_failed"],
    }


def main(argv=None):
    ap = U.arg_parser("bench.big_group", __doc__.strip().splitlines()[0],
                      "a 1,000-member big group beside 100 small groups, shorter window")
    ap.add_argument("--big", type=int, default=None, help="members of the big group (default 5000)")
    add_small_group_args(ap)
    ap.add_argument("--window", type=float, default=None, help="heartbeat window, s (must cover both phases)")
    ap.add_argument("--baseline", type=float, default=6.0, help="seconds of small groups alone in the window")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds between formation and rebalance")
    ap.add_argument("--session-timeout-ms", type=int, default=300_000, help="big group members' session")
    ap.add_argument("--rebalance-timeout-ms", type=int, default=120_000)
    ap.add_argument("--rejoin-spread", type=float, default=0.0, help="rebalance: each member rejoins at its "
                    "own moment within this many seconds (a client's next heartbeat: 3 s is the Java "
                    "consumer's default interval); 0: all at once, the worst case")
    ap.add_argument("--target", choices=sorted(SERVERS), default="herd",
                    help="the server: herd (this tree's daemon, or --rev's) or a real Kafka broker")
    ap.add_argument("--fsync", default="always", help="herd's fsync mode")
    ap.add_argument("--kafka-heap", default="2g", help="the Kafka broker's -Xmx")
    ap.add_argument("--kafka-config", action="append", default=None, metavar="KEY=VALUE",
                    help="an extra server.properties line for the Kafka broker (repeatable)")
    ap.add_argument("--profile", default=None, help="directory: py-spy the daemon during the big group's phases")
    ap.add_argument("--profile-rate", type=int, default=200)
    ap.add_argument("--trace-turns", default=None, help="file: the daemon records each loop callback's "
                    "start and end (bench/turn_trace_site), written when it stops")
    ap.add_argument("--rev", default=None, help="run the daemon from this git revision (git archive), "
                    "e.g. main for a before/after comparison; default: this tree")
    args = U.parse(ap, argv, {"big": (1000, 5000), "groups": (100, 1000), "window": (25.0, 60.0)})
    if args.target != "herd" and (args.profile or args.rev or args.trace_turns or args.fsync != "always"):
        ap.error("--profile, --rev, --trace-turns and --fsync are for --target herd")
    out = {"bench": "big_group", "params": vars(args), "machine": U.environment()}
    out["run"] = run(args)
    c = out["run"]["checks"]
    ph = out["run"]["phases"]
    text = "\n".join([
        f"{args.target}: big group {args.big} beside {args.groups} x {args.members}: " + ", ".join(
            f"{k}: {v['seconds']:.2f} s hb p99 {v['hb_ms']['p99']} max {v['hb_ms']['max']} ms, "
            f"lag>100ms {(v['loop_lag'] or {}).get('over_100ms')}, cpu {v['server_cpu_s']:.2f} s"
            for k, v in ph.items()),
        f"formation from last join {c['formation_s']:.2f} s, loop lag max {c['loop_lag_max_s']} s",
    ])
    U.emit(out, text)


if __name__ == "__main__":
    main(sys.argv[1:])
