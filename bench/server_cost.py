"""Server CPU per request, measured inside the herd daemon process.

``python -m bench.server_cost [--quick] [--heartbeats N] [--commits N] [--fsync never,always]
[--depth N] [--profile DIR]``

For each fsync mode a fresh daemon is started; the raw-protocol load tool (``bench/loadgen.py``,
herd's own codec, 2 processes) joins ``--groups`` × ``--members`` members (session timeout 300 s, so
nothing expires), warms up, then:

1. idle: the daemon's CPU over ``--idle-seconds`` with every member joined and silent → idle rate;
2. a burst of ``--heartbeats`` Heartbeats (v4), closed loop over ``--conns`` connections, spread
   over all members;
3. a burst of ``--commits`` OffsetCommits (v9) of 10 partitions each, from the joined members
   (member id + generation), offsets increasing;

each in two modes on the same connections and daemon: ``one`` (one request in flight per
connection, as before) and ``pipelined`` (``--depth`` requests in flight per connection, default
10: the ten members of a group multiplexed on one connection, as a pipelining client such as
librdkafka or the Java client does; each answer releases the next request, and the answers of one
socket read release their successors in one write). The JSON keeps the one-in-flight results under
``heartbeat`` / ``commit`` and adds ``pipelined`` with ``depth``, ``heartbeat`` and ``commit``.

CPU per request = (daemon CPU during the burst − idle rate × burst wall time) / requests. Daemon
CPU is the sum over its threads of ``/proc/<pid>/task/*/schedstat`` (ns), so the log writer
thread's pwrite/fsync time counts; the per-thread split is reported too. The load tool's own CPU
per request is reported so a saturated client is visible. Targets: <= 10 µs per Heartbeat,
<= 25 µs per OffsetCommit.

``--profile DIR``: after the measured bursts, repeat each burst with py-spy attached (raw collapsed
stacks in DIR/<fsync>-<kind>.txt) and add the top functions to the JSON. The measured numbers never
come from a profiled run.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from bench import _util as U
from bench.loadgen import LoadGen

TARGET_US = {"heartbeat": 10.0, "commit": 25.0}


def measure(pid: int, lg: LoadGen, kind: str, count: int, idle_rate: float, depth: int = 1) -> dict:
    us0 = U.proc_user_sys_seconds(pid)
    t0 = U.proc_threads_cpu_ns(pid)
    res = lg.burst(kind, count, depth)
    t1 = U.proc_threads_cpu_ns(pid)
    us1 = U.proc_user_sys_seconds(pid)
    by_thread = {k: (v - t0.get(k, 0)) / 1e9 for k, v in t1.items()}
    cpu = sum(by_thread.values())
    n = res["requests"]
    wall = res["seconds"]
    net = cpu - idle_rate * wall
    res.update(
        daemon_cpu_s=cpu,
        idle_cpu_s=idle_rate * wall,
        daemon_cpu_us_per_request=net * 1e6 / n if n else None,
        daemon_cpu_us_per_request_by_thread={k: v * 1e6 / n for k, v in by_thread.items() if v > 0},
        daemon_cpu_util=cpu / wall if wall else None,
        # user = the Python process itself, sys = the kernel on its behalf (socket read/write, pwrite,
        # fsync); from /proc/<pid>/stat ticks (10 ms), idle not subtracted
        daemon_user_us_per_request=(us1[0] - us0[0]) * 1e6 / n if n else None,
        daemon_sys_us_per_request=(us1[1] - us0[1]) * 1e6 / n if n else None,
        target_us=TARGET_US[kind],
    )
    res["meets_target"] = (
        res["daemon_cpu_us_per_request"] is not None
        and res["daemon_cpu_us_per_request"] <= TARGET_US[kind]
        and not res["errors"]
    )
    return res


def run_mode(fsync: str, args) -> dict:
    out = {"fsync": fsync}
    with U.Herd(
        fsync=fsync,
        log_level=args.herd_log_level,
        extra_args=["--max-connections", str(args.conns + 4 * args.members * args.join_concurrency + 100)],
    ) as herd:
        out["data_fs"] = U.filesystem_of(herd.data_dir)
        with LoadGen(
            herd.bootstrap,
            groups=args.groups,
            members=args.members,
            procs=args.procs,
            hb_conns=args.conns,
            group_prefix=f"cost-{fsync}",
            hb_schedule=False,
            session_timeout_ms=300_000,
            rebalance_timeout_ms=60_000,
            join_concurrency=args.join_concurrency,
        ) as lg:
            out["load_params"] = lg.params()
            joined = lg.join()
            out["join"] = {
                k: joined[k] for k in ("seconds", "groups_joined", "groups_failed", "members_joined")
            }
            if joined["groups_failed"]:
                raise RuntimeError(f"{joined['groups_failed']} groups did not complete their join")
            for depth in (1, args.depth):  # warm up both paths, both ways
                lg.burst("heartbeat", args.warmup, depth)
                lg.burst("commit", args.warmup, depth)
            c0 = U.proc_cpu_ns(herd.pid)
            w0 = time.perf_counter()
            time.sleep(args.idle_seconds)
            idle_rate = (U.proc_cpu_ns(herd.pid) - c0) / 1e9 / (time.perf_counter() - w0)
            out["idle_cpu_util"] = idle_rate
            out["heartbeat"] = measure(herd.pid, lg, "heartbeat", args.heartbeats, idle_rate)
            out["pipelined"] = {"depth": args.depth}
            out["pipelined"]["heartbeat"] = measure(herd.pid, lg, "heartbeat", args.heartbeats, idle_rate, args.depth)
            out["commit"] = measure(herd.pid, lg, "commit", args.commits, idle_rate)
            out["pipelined"]["commit"] = measure(herd.pid, lg, "commit", args.commits, idle_rate, args.depth)
            out["rss_mb"] = U.proc_rss_bytes(herd.pid) / 2**20
            if args.profile:
                from bench import _profile

                pdir = Path(args.profile)
                pdir.mkdir(parents=True, exist_ok=True)
                out["profile"] = {}
                for depth in (1, args.depth):
                    for kind, count in (("heartbeat", args.heartbeats), ("commit", args.commits)):
                        name = kind if depth == 1 else f"{kind}-depth{depth}"
                        path = pdir / f"server_cost-{fsync}-{name}.txt"
                        with U.PySpy(herd.pid, path, rate=args.profile_rate, native=args.profile_native):
                            lg.burst(kind, count, depth)
                        summary = _profile.summarize(path, top=args.profile_top)
                        summary["file"] = str(path)
                        out["profile"][name] = summary
                        print(_profile.render(summary, f"herd {name} fsync={fsync}"), file=sys.stderr)
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = U.arg_parser("bench.server_cost", __doc__.split("\n\n")[0], "small counts (< 60 s in all)")
    ap.add_argument("--fsync", default="never,always", help="fsync modes to run (default never,always)")
    ap.add_argument("--heartbeats", type=int, default=None, help="default 100000 (quick 20000)")
    ap.add_argument("--commits", type=int, default=None, help="default 40000 (quick 5000)")
    ap.add_argument("--warmup", type=int, default=2000, help="requests of each kind before measuring")
    ap.add_argument("--groups", type=int, default=200)
    ap.add_argument("--members", type=int, default=10)
    ap.add_argument("--conns", type=int, default=200, help="load connections in all")
    ap.add_argument(
        "--depth", type=int, default=10, help="requests in flight per connection in the pipelined mode (default 10)"
    )
    ap.add_argument("--procs", type=int, default=2, help="load processes")
    ap.add_argument("--join-concurrency", type=int, default=20)
    ap.add_argument("--idle-seconds", type=float, default=None, help="idle CPU window (default 3, quick 1)")
    ap.add_argument("--herd-log-level", default="info")
    ap.add_argument("--profile", metavar="DIR", default=None, help="also profile each burst with py-spy")
    ap.add_argument("--profile-rate", type=int, default=250)
    ap.add_argument(
        "--profile-native", action="store_true", help="py-spy --native (C frames; pauses the daemon)"
    )
    ap.add_argument("--profile-top", type=int, default=25)
    return ap


def main(argv=None):
    args = U.parse(build_parser(), argv, sized={
        "heartbeats": (20_000, 100_000),
        "commits": (5_000, 40_000),
        "idle_seconds": (1.0, 3.0),
    })
    env = U.environment()
    modes = [run_mode(f, args) for f in args.fsync.split(",") if f]
    result = {
        "benchmark": "server_cost",
        **env,
        "params": {
            "heartbeats": args.heartbeats,
            "commits": args.commits,
            "warmup": args.warmup,
            "groups": args.groups,
            "members": args.members,
            "conns": args.conns,
            "pipelined_depth": args.depth,
            "procs": args.procs,
            "idle_seconds": args.idle_seconds,
            "herd_log_level": args.herd_log_level,
            "heartbeat_version": 4,
            "commit_version": 9,
            "commit_partitions": 10,
            "quick": args.quick,
            "profiled": bool(args.profile),
        },
        "targets_us": TARGET_US,
        "modes": modes,
    }
    rows = []
    for mo in modes:
        for kind, way, r in (
            ("heartbeat", "one", mo["heartbeat"]),
            ("heartbeat", f"pipelined {args.depth}", mo["pipelined"]["heartbeat"]),
            ("commit", "one", mo["commit"]),
            ("commit", f"pipelined {args.depth}", mo["pipelined"]["commit"]),
        ):
            threads = ", ".join(
                f"{k} {v:.1f}"
                for k, v in sorted(r["daemon_cpu_us_per_request_by_thread"].items(), key=lambda kv: -kv[1])
            )
            rows.append(
                [
                    mo["fsync"],
                    way,
                    kind,
                    f"{r['daemon_cpu_us_per_request']:.1f}",
                    f"<= {TARGET_US[kind]:.0f}",
                    "yes" if r["meets_target"] else "NO",
                    f"{r['requests_per_s']:.0f}",
                    f"{r['load_cpu_us_per_request']:.1f}",
                    threads,
                    f"{r['daemon_user_us_per_request']:.0f}/{r['daemon_sys_us_per_request']:.0f}",
                ]
            )
    text = U.table(
        rows,
        [
            "fsync",
            "in flight",
            "request",
            "daemon µs/req",
            "target",
            "holds",
            "req/s",
            "load µs/req",
            "by thread µs",
            "user/sys µs",
        ],
    )
    U.emit(result, "server cost per request (daemon CPU, idle subtracted)\n" + text)


if __name__ == "__main__":
    main(sys.argv[1:])
