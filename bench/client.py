"""Thin client vs confluent-kafka vs kafka-python: group join, leave and idle cost against ONE herd.

``python -m bench.client [--quick] [--members 50] [--libs herd,confluent,kafka-python] [--idle-s 20]``

One herd daemon (``--initial-rebalance-delay-ms 0``, fsync ``never`` by default) with topic
``bench`` (100 partitions). For each client library, one after the other, a *child process*
(``python -m bench.client --child LIB``) runs N members of a group of its own, each member a thread
with its own consumer (``session.timeout.ms`` 10000, ``heartbeat.interval.ms`` 1000, eager
``range`` assignor, no auto-commit) polling in a loop every ``--poll-ms`` (``poll(interval)``, then
sleeping whatever is left of the interval: herd's ``poll`` returns at once when the group is
stable). Libraries: herd's ``client.GroupConsumer``; confluent-kafka ``Consumer``; kafka-python
``KafkaConsumer``. By default every assigned partition is paused at once (``--fetch`` disables
that), so confluent-kafka and kafka-python do not fetch records and all three do group work only.

Each member records its own view: the assignment (its rebalance-listener callback: herd
``on_partitions_assigned``, confluent ``on_assign``, kafka-python ``on_partitions_assigned``; eager,
so each callback carries the full assignment) and when it got it; herd members also report
``generation()`` and kafka-python members ``generation_if_stable()`` (confluent does not expose one).
*Stable complete*: every live member holds an assignment received after the event being timed,
together they own all 100 partitions exactly once, generations (where known) are equal, and no
member receives another assignment for ``--settle`` s.

1. start → stable: from creating the first consumer to the last member's callback of the first
   stable complete assignment.
2. idle CPU: with the group stable, the parent reads ``/proc/<child>/stat`` utime+stime over
   ``--idle-s`` (default 20 s, quick 8 s) and reports CPU seconds per member-hour
   (``cpu / idle_s * 3600 / members``; the child's main thread sleeps meanwhile, so this is the
   members' polling + heartbeating). herd's own CPU over the same window is reported too, and the
   client's CPU split by thread (``schedstat``): the members' own threads (poll loop: ``poll``,
   callbacks, the sleep between polls) vs every other thread (the library's: herd's network
   thread per consumer, librdkafka's, kafka-python's heartbeat thread; plus the idle main thread).
3. leave → stable: one member is closed (LeaveGroup); time from the start of ``close()`` to the
   last survivor's callback of the stable complete assignment among the survivors.

The machine is shared (2 cores): the parent records machine CPU busy/steal over each idle window.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import select
import subprocess
import sys
import threading
import time

from bench import _util as U

_now = time.perf_counter
LIBS = ("herd", "confluent", "kafka-python")


# ---- child side: members ---------------------------------------------------------------------


class Member(threading.Thread):
    """One consumer in its own thread: poll loop, assignment recorded from the listener callback."""

    def __init__(self, lib: str, idx: int, args):
        super().__init__(name=f"{lib}-member-{idx}", daemon=True)
        self.lib = lib
        self.idx = idx
        self.args = args
        self.lock = threading.Lock()
        self.assignment: frozenset | None = None
        self.assigned_at = 0.0
        self.assigns = 0
        self.consumer = None
        self.stop_requested = threading.Event()
        self.ready = threading.Event()
        self.close_started = None
        self.closed_at = None
        self.error = None

    # -- callbacks ---------------------------------------------------------------------------------
    def _got(self, parts):
        with self.lock:
            self.assignment = frozenset(parts)
            self.assigned_at = _now()
            self.assigns += 1

    def _lost(self):
        with self.lock:
            self.assignment = None

    def snapshot(self):
        with self.lock:
            return self.assignment, self.assigned_at

    def generation(self):
        c = self.consumer
        if c is None:
            return None
        try:
            if self.lib == "herd":
                return c.generation()
            if self.lib == "kafka-python":
                g = c._coordinator.generation_if_stable()  # private, best effort
                return None if g is None else g.generation_id
        except Exception:
            return None
        return None

    # -- construction per library --------------------------------------------------------------
    def _make(self):
        a = self.args
        cid = f"bench-client-{self.lib}-{self.idx}"
        if self.lib == "herd":
            from client import GroupConsumer

            me = self

            class Listener:
                def on_partitions_revoked(self, revoked):
                    me._lost()

                def on_partitions_assigned(self, assigned):
                    me._got(tp.partition for tp in assigned)

                def on_partitions_lost(self, lost):
                    me._lost()

            c = GroupConsumer(
                a.bootstrap,
                a.group,
                {
                    "session.timeout.ms": a.session_timeout_ms,
                    "heartbeat.interval.ms": a.heartbeat_interval_ms,
                    "partition.assignment.strategy": a.assignor,
                    "enable.auto.commit": False,
                    "client.id": cid,
                },
            )
            c.subscribe([a.topic], listener=Listener())
            return c
        if self.lib == "confluent":
            from confluent_kafka import Consumer

            c = Consumer(
                {
                    "bootstrap.servers": a.bootstrap,
                    "group.id": a.group,
                    "client.id": cid,
                    "session.timeout.ms": a.session_timeout_ms,
                    "heartbeat.interval.ms": a.heartbeat_interval_ms,
                    "partition.assignment.strategy": a.assignor,
                    "enable.auto.commit": False,
                    "auto.offset.reset": "latest",
                    "socket.nagle.disable": True,
                    "log_level": 3,
                }
            )

            def on_assign(consumer, partitions):
                if not a.fetch:
                    consumer.assign(partitions)
                    if partitions:
                        consumer.pause(partitions)
                self._got(p.partition for p in partitions)

            def on_revoke(consumer, partitions):
                self._lost()

            c.subscribe([a.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_revoke)
            return c
        if self.lib == "kafka-python":
            import logging

            from kafka import ConsumerRebalanceListener, KafkaConsumer

            logging.getLogger("kafka").setLevel(logging.CRITICAL)
            me = self

            class Listener(ConsumerRebalanceListener):
                def on_partitions_revoked(self, revoked):
                    me._lost()

                def on_partitions_assigned(self, assigned):
                    if not a.fetch and assigned:
                        me.consumer.pause(*assigned)
                    me._got(tp.partition for tp in assigned)

            assignor = {
                "range": "RangePartitionAssignor",
                "roundrobin": "RoundRobinPartitionAssignor",
                "cooperative-sticky": "StickyPartitionAssignor",
            }[a.assignor]
            import kafka.coordinator.assignors.range as _r
            import kafka.coordinator.assignors.roundrobin as _rr

            classes = {"RangePartitionAssignor": _r.RangePartitionAssignor,
                       "RoundRobinPartitionAssignor": _rr.RoundRobinPartitionAssignor}
            c = KafkaConsumer(
                bootstrap_servers=a.bootstrap,
                group_id=a.group,
                client_id=cid,
                session_timeout_ms=a.session_timeout_ms,
                heartbeat_interval_ms=a.heartbeat_interval_ms,
                partition_assignment_strategy=(classes[assignor],),
                enable_auto_commit=False,
                auto_offset_reset="latest",
            )
            self.consumer = c
            c.subscribe([a.topic], listener=Listener())
            return c
        raise ValueError(self.lib)

    def _poll(self, c, timeout_s: float):
        if self.lib == "herd":
            c.poll(timeout_s)
        elif self.lib == "confluent":
            c.poll(timeout_s)
        else:
            c.poll(timeout_ms=int(timeout_s * 1000))

    def run(self):
        c = None
        interval = self.args.poll_ms / 1000
        try:
            c = self._make()
            self.consumer = c
            self.ready.set()
            deadline = time.monotonic() + 3600  # bounded
            while not self.stop_requested.is_set() and time.monotonic() < deadline:
                t = time.monotonic()
                self._poll(c, interval)
                left = interval - (time.monotonic() - t)
                if left > 0:
                    self.stop_requested.wait(left)
        except Exception as exc:
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            self.ready.set()
            if c is not None:
                self.close_started = _now()
                with contextlib.suppress(Exception):
                    c.close()
                self.closed_at = _now()


def complete_since(members, since: float, partitions: int):
    """-> time the last member got its part, if the live members hold a complete assignment all
    received after ``since`` on one generation (where known); else None."""
    seen = 0
    latest = 0.0
    union = set()
    gens = set()
    for mb in members:
        asg, at = mb.snapshot()
        if asg is None or at < since:
            return None
        seen += len(asg)
        union |= asg
        latest = max(latest, at)
        g = mb.generation()
        if mb.lib in ("herd", "kafka-python"):
            gens.add(g)
    if seen != partitions or len(union) != partitions:
        return None
    if gens and (len(gens) != 1 or None in gens):
        return None
    return latest


def wait_complete(members, since: float, partitions: int, timeout: float, settle: float):
    deadline = _now() + timeout
    while _now() < deadline:
        got = complete_since(members, since, partitions)
        if got is not None:
            counts = [mb.assigns for mb in members]
            stable_until = _now() + settle
            ok = True
            while _now() < stable_until:
                time.sleep(0.01)
                if [mb.assigns for mb in members] != counts or complete_since(members, since, partitions) is None:
                    ok = False
                    break
            if ok:
                return got
            continue
        time.sleep(0.005)
    return None


def _say(obj):
    print(json.dumps(obj), flush=True)


def child_main(args):
    """Runs in the child process: start members, report, wait for the parent's commands."""
    lib = args.child
    members = [Member(lib, i, args) for i in range(args.members)]
    try:
        t0 = _now()
        for mb in members:
            mb.start()
        for mb in members:
            mb.ready.wait(30)
        errs = [mb.error for mb in members if mb.error]
        if errs:
            _say({"phase": "error", "error": errs[0]})
            return
        got = wait_complete(members, t0, args.topic_partitions, args.timeout, args.settle)
        gens = sorted({g for g in (mb.generation() for mb in members) if g is not None})
        _say(
            {
                "phase": "stable",
                "start_to_stable_s": None if got is None else got - t0,
                "assigns_until_stable": sum(mb.assigns for mb in members),
                "generations": gens,
                "member_tids": [mb.native_id for mb in members],
            }
        )
        line = sys.stdin.readline().strip()  # the parent measures idle CPU meanwhile
        if line == "leave" and got is not None:
            victim = members[len(members) // 2]
            live = [mb for mb in members if mb is not victim]
            victim.stop_requested.set()
            deadline = time.monotonic() + 30
            while victim.close_started is None and victim.is_alive() and time.monotonic() < deadline:
                time.sleep(0.0005)
            t_leave = victim.close_started or _now()
            done = wait_complete(live, t_leave, args.topic_partitions, args.timeout, args.settle)
            victim.join(30)
            _say(
                {
                    "phase": "left",
                    "leave_to_stable_s": None if done is None else done - t_leave,
                    "close_s": None if victim.closed_at is None else victim.closed_at - t_leave,
                    "generations": sorted({g for g in (mb.generation() for mb in live) if g is not None}),
                }
            )
            sys.stdin.readline()
    finally:
        t = _now()
        for mb in members:
            mb.stop_requested.set()
        for mb in members:
            mb.join(30)
        _say({"phase": "done", "close_all_s": _now() - t, "alive": sum(mb.is_alive() for mb in members)})


# ---- parent side -----------------------------------------------------------------------------


class Child:
    def __init__(self, lib: str, bootstrap: str, group: str, args):
        cmd = [
            sys.executable, "-m", "bench.client", "--child", lib, "--bootstrap", bootstrap,
            "--group", group, "--members", str(args.members), "--topic", args.topic,
            "--topic-partitions", str(args.topic_partitions),
            "--session-timeout-ms", str(args.session_timeout_ms),
            "--heartbeat-interval-ms", str(args.heartbeat_interval_ms),
            "--assignor", args.assignor, "--poll-ms", str(args.poll_ms),
            "--settle", str(args.settle), "--timeout", str(args.timeout),
        ] + (["--fetch"] if args.fetch else [])
        env = dict(os.environ)
        env["PYTHONPATH"] = str(U.REPO) + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            cwd=str(U.REPO), env=env, start_new_session=True, preexec_fn=U.die_with_parent,
        )

    def read(self, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            r, _, _ = select.select([self.proc.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not r:
                break
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError(f"child exited ({self.proc.poll()})")
            with contextlib.suppress(ValueError):
                return json.loads(line)
        raise RuntimeError("child did not answer in time")

    def send(self, cmd: str):
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def stop(self):
        with contextlib.suppress(Exception):
            self.proc.stdin.close()
        U.stop_process_group(self.proc, timeout=40)


def _tasks_cpu(pid: int) -> dict[int, float]:
    """CPU seconds per thread of a process (``schedstat``, ns resolution)."""
    out = {}
    with contextlib.suppress(OSError):
        for tid in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                    out[int(tid)] = int(f.read().split()[0]) / 1e9
    return out


def run_lib(lib: str, herd, args) -> dict:
    group = f"bench-client-{lib}-{int(time.time() * 1000) % 10**8}"
    out = {"lib": lib, "members": args.members, "group": group}
    child = Child(lib, herd.bootstrap, group, args)
    try:
        msg = child.read(args.timeout + 60)
        if msg.get("phase") == "error":
            out["error"] = msg["error"]
            return out
        out["start_to_stable_s"] = msg["start_to_stable_s"]
        out["assigns_until_stable"] = msg["assigns_until_stable"]
        out["generations_at_stable"] = msg["generations"]
        if msg["start_to_stable_s"] is not None:
            pid = child.proc.pid
            c0, h0 = U.proc_user_sys_seconds(pid), U.proc_cpu_seconds(herd.pid)
            rss0 = U.proc_rss_bytes(pid)
            t0s = _tasks_cpu(pid)
            with U.MachineLoad() as load:
                t0 = time.perf_counter()
                time.sleep(args.idle_s)
                wall = time.perf_counter() - t0
            c1, h1 = U.proc_user_sys_seconds(pid), U.proc_cpu_seconds(herd.pid)
            t1s = _tasks_cpu(pid)
            tids = set(msg.get("member_tids") or ())
            loop = sum(t1s[t] - t0s[t] for t in tids if t in t0s and t in t1s)
            rest = sum(t1s[t] - t0s[t] for t in t1s if t in t0s and t not in tids)
            user, sys_ = c1[0] - c0[0], c1[1] - c0[1]
            cpu = user + sys_
            out["idle"] = {
                "window_s": wall,
                "client_cpu_s": cpu,
                "client_user_s": user,
                "client_sys_s": sys_,
                "client_cpu_s_per_member_hour": cpu / wall * 3600 / args.members,
                "client_cpu_share_of_one_core": cpu / wall,
                # The split by thread: the members' own threads (the poll loop: poll, listener
                # callbacks, the sleep between polls) vs the library's threads (herd: one network
                # thread per consumer; librdkafka and kafka-python: theirs) plus the idle main thread.
                "client_member_threads_cpu_s_per_member_hour": loop / wall * 3600 / args.members,
                "client_library_threads_cpu_s_per_member_hour": rest / wall * 3600 / args.members,
                "client_rss_mb": rss0 / 1e6,
                "herd_cpu_s": h1 - h0,
                "herd_cpu_s_per_member_hour": (h1 - h0) / wall * 3600 / args.members,
                **load.result(),
            }
            child.send("leave")
            msg = child.read(args.timeout + 40)
            out["leave_to_stable_s"] = msg.get("leave_to_stable_s")
            out["leave_close_s"] = msg.get("close_s")
            out["generations_after_leave"] = msg.get("generations")
            child.send("stop")
            with contextlib.suppress(RuntimeError):
                msg = child.read(45)
                out["close_all_s"] = msg.get("close_all_s")
        out["incomplete"] = out.get("start_to_stable_s") is None or out.get("leave_to_stable_s") is None
    except RuntimeError as exc:
        out["error"] = str(exc)
        out["incomplete"] = True
    finally:
        child.stop()
    return out


def versions() -> dict:
    out = {"herd_client": None}
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        out["herd_client"] = version("herd")
    out.update(U.client_versions())
    with contextlib.suppress(ImportError):
        import confluent_kafka

        v = confluent_kafka.version()  # a str in 2.16 (U.client_versions' [0] then gives "2")
        out["confluent_kafka"] = v if isinstance(v, str) else v[0]
        lv = confluent_kafka.libversion()
        out["librdkafka"] = lv if isinstance(lv, str) else lv[0]
    with contextlib.suppress(ImportError):
        import kafka

        out["kafka_python"] = kafka.__version__
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = U.arg_parser("bench.client", __doc__.split("\n\n")[0], "10 members, 8 s idle window (< 60 s in all)")
    ap.add_argument("--members", type=int, default=None, help="members per library (default 50, quick 10)")
    ap.add_argument("--idle-s", type=float, default=None, help="idle CPU window (default 20, quick 8)")
    ap.add_argument("--libs", default=",".join(LIBS))
    ap.add_argument("--session-timeout-ms", type=int, default=10_000)
    ap.add_argument("--heartbeat-interval-ms", type=int, default=1_000)
    ap.add_argument("--assignor", default="range", choices=("range", "roundrobin"))
    ap.add_argument("--poll-ms", type=int, default=100, help="each member's poll-loop period")
    ap.add_argument("--fetch", action="store_true", help="do not pause assigned partitions")
    ap.add_argument("--topic", default="bench")
    ap.add_argument("--topic-partitions", type=int, default=100)
    ap.add_argument(
        "--settle", type=float, default=None, help="a complete assignment must hold this long (default 1, quick 0.5)"
    )
    ap.add_argument("--timeout", type=float, default=60.0, help="give up waiting for an assignment after this")
    ap.add_argument("--fsync", default="never", choices=("always", "never"))
    ap.add_argument("--herd-log-level", default="warning")
    # child-process mode (internal)
    ap.add_argument("--child", choices=LIBS, help=argparse.SUPPRESS)
    ap.add_argument("--bootstrap", help=argparse.SUPPRESS)
    ap.add_argument("--group", help=argparse.SUPPRESS)
    return ap


def main(argv=None):
    args = U.parse(build_parser(), argv, sized={"members": (10, 50), "idle_s": (8.0, 20.0), "settle": (0.5, 1.0)})
    if args.child:
        child_main(args)
        return
    libs = [x for x in args.libs.split(",") if x]
    for lib in libs:
        if lib not in LIBS:
            raise SystemExit(f"unknown library {lib}")
    env = U.environment()
    runs = {}
    with U.Herd(
        fsync=args.fsync,
        topics=[f"{args.topic}:{args.topic_partitions}"],
        initial_rebalance_delay_ms=0,
        log_level=args.herd_log_level,
    ) as herd:
        for lib in libs:
            r = runs[lib] = run_lib(lib, herd, args)
            print(
                f"  {lib}: start→stable {r.get('start_to_stable_s')}, leave→stable {r.get('leave_to_stable_s')}, "
                f"idle cpu/member-h {r.get('idle', {}).get('client_cpu_s_per_member_hour')}"
                + (f" ERROR {r['error']}" if r.get("error") else ""),
                file=sys.stderr,
                flush=True,
            )
    result = {
        "benchmark": "client",
        **env,
        "clients": versions(),
        "params": {k: v for k, v in vars(args).items() if k not in ("child", "bootstrap", "group")},
        "runs": runs,
    }

    def fmt(x, d=3):
        return "-" if x is None else f"{x:.{d}f}"

    rows = [
        [
            lib,
            fmt(r.get("start_to_stable_s")),
            fmt(r.get("leave_to_stable_s")),
            fmt(r.get("idle", {}).get("client_cpu_s_per_member_hour"), 2),
            fmt(r.get("idle", {}).get("client_member_threads_cpu_s_per_member_hour"), 2),
            fmt(r.get("idle", {}).get("client_library_threads_cpu_s_per_member_hour"), 2),
            fmt(r.get("idle", {}).get("herd_cpu_s_per_member_hour"), 2),
            fmt(r.get("idle", {}).get("machine_cpu_busy"), 2),
        ]
        for lib, r in runs.items()
    ]
    U.emit(
        result,
        f"client ({args.members} members per library, one herd)\n"
        + U.table(
            rows,
            [
                "library",
                "start→stable s",
                "leave→stable s",
                "client cpu s/member-h",
                "(member thr",
                "library thr)",
                "herd cpu s/member-h",
                "machine busy",
            ],
        ),
    )


if __name__ == "__main__":
    main(sys.argv[1:])
