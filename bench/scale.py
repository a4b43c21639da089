"""Scale: G groups × M members joined and heartbeating against ONE herd daemon.

``python -m bench.scale [--quick] [--groups 10000] [--members 10] [--duration 60] [--find-max]
[--mode one|pipelined|both] [--join-mode pipelined|member] [--protocol classic|consumer|both]``

The raw-protocol load tool (``bench/loadgen.py``: asyncio on uvloop, herd's codec, ``--procs``
processes) joins every group (JoinGroup v9 with the MEMBER_ID_REQUIRED dance, SyncGroup v5 with
the leader's assignment; ``--join-concurrency`` groups at a time per process; ``--join-mode
pipelined``: lanes of one connection per member index, each round of ``--join-batch`` groups
pipelined on them, see loadgen's docstring; ``member``: one connection per joining member, one
request at a time), and each member heartbeats (v4) every 3 s from the moment its group is
complete. Once every group is complete, a ``--duration`` s measurement window starts. Heartbeats
share ``--hb-conns`` connections (default one per group, at most 10,000). ``--mode`` (recorded as
``heartbeat_mode`` in each run):

* ``one``: one heartbeat in flight per connection, a group's members spread over the interval;
* ``pipelined``: a group's members beat together, their heartbeats in one socket write, all in
  flight at once (a process hosting several members of a group, a pipelining Kafka client);
* ``both`` (default): a run of each, side by side, each with a fresh daemon.

Reported: join completion time (command to last group complete), heartbeat latency p50/p99/p99.9/
max in the window, how late heartbeats were sent (load tool saturation), error codes, members
that failed (any non-zero heartbeat error — UNKNOWN_MEMBER_ID / REBALANCE_IN_PROGRESS mean a member
expired; heartbeats unanswered or not sent by the end of the window + 15 s count as errors too),
the daemon's RSS (max of 0.5 s samples) and CPU, the load processes' CPU, and the coordinator's
own view after the window (DescribeGroups: groups not Stable, members we still count as alive
that it no longer has: ``members_expired``, counted with the failures). Error codes
answered DURING the joins (REBALANCE_IN_PROGRESS when members arrive at different times) are the
protocol working and are reported separately. Targets: 0 errors, no member expired, p99 < 20 ms,
RSS < 1.5 GB.

``--protocol consumer`` (KIP-848): the members join with ConsumerGroupHeartbeat v1 (epoch 0, a
member id of their own making, subscribed to ``bench``, 100 partitions), converge on the server's
assignment (acknowledging each new one at once), then heartbeat at the interval the server returns
(``group.consumer.heartbeat.interval.ms``, 5 s by default) with the epoch it returns, one in flight
per connection (mode ``one``; ``--hb-interval`` is the classic members' interval only); the
coordinator's view comes from ConsumerGroupDescribe (Stable, every member at the epoch we hold),
and every member leaves (epoch -1) after it. ``both``: the classic run(s) first, then the consumer
run, each on a fresh daemon, side by side in one JSON (``runs[].protocol``).

``--find-max``: for each mode, run steps of increasing member counts (``--steps``, members in
all, groups = members / M) with a fresh daemon each, stop at the first step that misses a target,
and report the largest count that met them all (``max_members_meeting_targets`` per mode).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from bench import _util as U
from bench.loadgen import LoadGen

TARGETS = {"errors": 0, "p99_ms": 20.0, "rss_mb": 1536.0}
MAX_HB_CONNS = 10_000


def _pin_tasks(pid: int, cpus: set) -> None:
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), cpus)
        except OSError:  # a thread that just ended
            pass


def _pin(daemon_pid: int, load_pids: list[int]) -> dict | None:
    """--pin: the daemon's threads on the first CPU, the load processes (and this one) on the rest,
    so the load generator does not preempt the daemon (the way a load generator on another machine
    would not). None when there is a single CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None
    daemon, load = {cpus[0]}, set(cpus[1:])
    _pin_tasks(daemon_pid, daemon)
    for pid in load_pids + [os.getpid()]:
        _pin_tasks(pid, load)
    return {"daemon_cpus": sorted(daemon), "load_cpus": sorted(load)}


def run_once(groups: int, args, hb_mode: str, label: str = "", protocol: str = "classic") -> dict:
    hb_conns = args.hb_conns or min(groups, MAX_HB_CONNS)
    consumer = protocol == "consumer"
    out = {
        "protocol": protocol,
        "variant": "consumer" if consumer else hb_mode,
        "heartbeat_mode": hb_mode,
        "join_mode": args.join_mode,
        "groups": groups,
        "members_per_group": args.members,
        "members": groups * args.members,
    }
    profile_path = None
    lanes = (args.join_concurrency if args.join_mode == "member" or consumer
             else -(-args.join_concurrency // args.join_batch))
    join_pool = args.procs * lanes * args.members
    extra = ["--max-connections", str(hb_conns + join_pool + 200)]
    t_start = time.perf_counter()
    with U.Herd(fsync=args.fsync, log_level=args.herd_log_level, extra_args=extra) as herd:
        out["daemon_start_s"] = herd.start_seconds
        out["data_fs"] = U.filesystem_of(herd.data_dir)
        out["rss_idle_mb"] = U.proc_rss_bytes(herd.pid) / 2**20
        with (
            U.Sampler(herd.pid) as sampler,
            LoadGen(
                herd.bootstrap,
                groups=groups,
                members=args.members,
                procs=args.procs,
                hb_conns=hb_conns,
                group_prefix=f"scale-{'cg' if consumer else hb_mode}{label}",
                protocol=protocol,
                hb_mode=hb_mode,
                join_mode=args.join_mode,
                join_batch=args.join_batch,
                session_timeout_ms=args.session_timeout_ms,
                rebalance_timeout_ms=args.rebalance_timeout_ms,
                hb_interval=args.hb_interval,
                hb_slip=args.hb_slip,
                join_concurrency=args.join_concurrency,
                join_timeout=args.join_timeout,
            ) as lg,
        ):
            out["load_params"] = lg.params()
            out["pinning"] = _pin(herd.pid, [c.pid for c in lg.children]) if args.pin else None
            cpu0 = U.proc_cpu_seconds(herd.pid)
            t0 = time.perf_counter()
            out["join"] = lg.join()
            out["join"]["daemon_cpu_s"] = U.proc_cpu_seconds(herd.pid) - cpu0
            out["rss_after_join_mb"] = U.proc_rss_bytes(herd.pid) / 2**20
            n_join_samples = len(sampler.samples)
            cpu1 = U.proc_cpu_seconds(herd.pid)
            w0 = time.perf_counter()
            load = U.MachineLoad(herd.pid)
            load.__enter__()
            probe = U.StallProbe().__enter__()
            if args.profile:
                profile_path = f"{args.profile}/scale-{groups * args.members}.txt"
                import pathlib

                pathlib.Path(args.profile).mkdir(parents=True, exist_ok=True)
                with U.PySpy(herd.pid, profile_path, rate=args.profile_rate, native=args.profile_native):
                    out["heartbeat"] = lg.window(args.duration, start=w0)
            else:
                out["heartbeat"] = lg.window(args.duration, start=w0)
            load.__exit__(None, None, None)
            probe.__exit__(None, None, None)
            out["heartbeat"].update(load.result())
            # stalls seen by an idle probe thread in this process: the whole machine stalling
            out["heartbeat"]["machine_stalls"] = probe.summary(w0, w0 + args.duration)
            out["heartbeat"]["daemon_cpu_util"] = (U.proc_cpu_seconds(herd.pid) - cpu1) / (time.perf_counter() - w0)
            out["heartbeat"]["daemon_cpu_util_max_5s"] = sampler.max_cpu_util(5.0, first=n_join_samples)
            # the coordinator's own view: which groups are Stable, which members it still has
            out["verify"] = lg.verify()
            if consumer:
                out["leave"] = lg.leave()
            out["rss_end_mb"] = U.proc_rss_bytes(herd.pid) / 2**20
            out["rss_hwm_mb"] = U.proc_hwm_bytes(herd.pid) / 2**20
        out["rss_max_sampled_mb"] = sampler.max_rss() / 2**20
        out["total_s"] = time.perf_counter() - t_start
        out["join_to_window_end_s"] = time.perf_counter() - t0
    hb = out["heartbeat"]
    p99 = hb["latency_ms"]["p99"]
    errors = sum(hb["errors"].values()) + hb["unanswered"] + hb["due_but_not_sent"]
    errors += sum(out.get("leave", {}).get("errors", {}).values())
    expired = out["verify"]["members_missing"]
    failed = hb["members_failed"] + out["join"]["groups_failed"] * args.members + expired
    rss = max(out["rss_hwm_mb"], out["rss_max_sampled_mb"])
    out["checks"] = {
        "errors": errors,
        "members_failed": failed,
        "members_expired": expired,
        "groups_not_stable": out["verify"]["groups"] - out["verify"]["groups_stable_complete"],
        "p99_ms": p99,
        "rss_mb": rss,
        "errors_ok": errors == 0 and failed == 0 and out["verify"]["groups"] == out["verify"]["groups_stable_complete"],
        "p99_ok": p99 is not None and p99 < TARGETS["p99_ms"],
        "rss_ok": rss < TARGETS["rss_mb"],
    }
    out["meets_targets"] = all(out["checks"][k] for k in ("errors_ok", "p99_ok", "rss_ok"))
    if profile_path:
        from bench import _profile

        summary = _profile.summarize(profile_path, top=args.profile_top)
        summary["file"] = profile_path
        out["profile"] = summary
        print(_profile.render(summary, f"herd under scale ({out['members']} members)"), file=sys.stderr)
    return out


def _row(r: dict) -> list:
    hb = r["heartbeat"]
    lat = hb["latency_ms"]
    return [
        r.get("variant", r["heartbeat_mode"]),
        r["members"],
        r["groups"],
        f"{r['join']['seconds']:.1f}",
        f"{lat['p50']:.2f}" if lat["p50"] is not None else "-",
        f"{lat['p99']:.2f}" if lat["p99"] is not None else "-",
        f"{lat['max']:.1f}" if lat["max"] is not None else "-",
        r["checks"]["errors"],
        r["checks"]["members_failed"],
        r["checks"]["members_expired"],
        f"{r['checks']['rss_mb']:.0f}",
        f"{hb['daemon_cpu_util']:.2f}",
        f"{hb['load_cpu_util']:.2f}",
        f"{hb['lateness_ms']['p99'] or 0:.1f}",
        "yes" if r["meets_targets"] else "NO",
    ]


HEADER = [
    "protocol/hb",
    "members",
    "groups",
    "join s",
    "hb p50 ms",
    "p99 ms",
    "max ms",
    "errors",
    "failed",
    "expired",
    "RSS MB",
    "daemon cpu",
    "load cpu",
    "late p99 ms",
    "targets",
]


def build_parser() -> argparse.ArgumentParser:
    ap = U.arg_parser("bench.scale", __doc__.split("\n\n")[0], "500 groups × 10, 20 s window (< 45 s per mode)")
    ap.add_argument(
        "--mode",
        choices=("one", "pipelined", "both"),
        default="both",
        help="heartbeats: one in flight per connection, a group's beats pipelined in one write, or both",
    )
    ap.add_argument("--protocol", choices=("classic", "consumer", "both"), default="classic",
                    help="classic groups (JoinGroup/SyncGroup/Heartbeat), KIP-848 consumer groups "
                         "(ConsumerGroupHeartbeat; heartbeat mode one), or both side by side")
    ap.add_argument("--join-mode", choices=("pipelined", "member"), default="pipelined")
    ap.add_argument("--join-batch", type=int, default=25, help="pipelined join: groups per round per lane")
    ap.add_argument("--groups", type=int, default=None, help="default 10000 (quick 500)")
    ap.add_argument("--members", type=int, default=10, help="members per group")
    ap.add_argument(
        "--duration",
        type=float,
        default=None,
        help="measurement window, s (default 60; quick 20; --find-max steps 30)",
    )
    ap.add_argument("--procs", type=int, default=2, help="load processes (keep <= 2-3 on 2 cores)")
    ap.add_argument("--pin", action="store_true",
                    help="daemon on the first CPU, load processes on the others (no preemption of the "
                         "daemon by its own load generator; recorded as 'pinning')")
    ap.add_argument(
        "--hb-conns",
        type=int,
        default=None,
        help=f"heartbeat connections (default min(groups, {MAX_HB_CONNS}))",
    )
    ap.add_argument(
        "--join-concurrency",
        type=int,
        default=50,
        help="groups joining at once per process (pipelined: join-concurrency / join-batch lanes)",
    )
    ap.add_argument("--join-timeout", type=float, default=600.0)
    ap.add_argument("--session-timeout-ms", type=int, default=30_000)
    ap.add_argument("--rebalance-timeout-ms", type=int, default=60_000)
    ap.add_argument("--hb-interval", type=float, default=3.0)
    ap.add_argument("--hb-slip", action="store_true",
                    help="a late heartbeat moves its member's schedule (one Java client's rule); default: "
                         "each member keeps its phase (see bench.loadgen.next_due)")
    ap.add_argument("--fsync", default="always", choices=("always", "never"))
    ap.add_argument("--herd-log-level", default="info")
    ap.add_argument("--find-max", action="store_true", help="step the member count up; report the largest passing")
    ap.add_argument(
        "--steps",
        default=None,
        help="members per step for --find-max (default 10000,20000,30000,50000,75000,100000; quick 2000,5000,10000)",
    )
    ap.add_argument("--profile", metavar="DIR", default=None, help="profile the daemon with py-spy in the window")
    ap.add_argument("--profile-rate", type=int, default=100)
    ap.add_argument("--profile-native", action="store_true")
    ap.add_argument("--profile-top", type=int, default=30)
    return ap


def main(argv=None):
    args = U.parse(build_parser(), argv, sized={"groups": (500, 10_000)})
    if args.duration is None:
        args.duration = 20.0 if args.quick else (30.0 if args.find_max else 60.0)
    modes = ["one", "pipelined"] if args.mode == "both" else [args.mode]
    # (protocol, heartbeat mode) runs; the consumer protocol beats one in flight per connection
    variants = [("classic", mo) for mo in modes] if args.protocol in ("classic", "both") else []
    if args.protocol in ("consumer", "both"):
        variants.append(("consumer", "one"))
    env = U.environment()
    params = {k: v for k, v in vars(args).items() if k not in ("profile_top",)}
    params["heartbeat_modes"] = modes
    params["runs"] = [f"{p}/{mo}" for p, mo in variants]
    result = {"benchmark": "scale", **env, "params": params, "targets": TARGETS}
    title = "scale (targets: 0 errors, no member expired, p99 < 20 ms, RSS < 1.5 GB)\n"
    if args.find_max:
        steps = [
            int(x)
            for x in (
                args.steps or ("2000,5000,10000" if args.quick else "10000,20000,30000,50000,75000,100000")
            ).split(",")
        ]
        runs = []
        names = ["consumer" if p == "consumer" else mo for p, mo in variants]
        best = {n: None for n in names}
        failing = {n: None for n in names}
        # the modes take turns at each step (same machine conditions, side by side); a mode stops
        # at its first step that misses a target
        for i, members in enumerate(steps):
            for name, (proto, mo) in zip(names, variants, strict=True):
                if failing[name] is not None:
                    continue
                r = run_once(max(1, members // args.members), args, mo, label=f"-s{i}", protocol=proto)
                runs.append(r)
                print(U.table([_row(r)], HEADER), file=sys.stderr, flush=True)
                if r["meets_targets"]:
                    best[name] = r["members"]
                else:
                    failing[name] = r["members"]
        result.update(
            mode="find-max",
            runs=runs,
            max_members_meeting_targets=best,
            first_failing=failing,
        )
        text = U.table([_row(r) for r in runs], HEADER) + "\nlargest member count meeting the targets: " + ", ".join(
            f"{n} {best[n]}" for n in names
        )
    else:
        runs = []
        for proto, mo in variants:
            runs.append(run_once(args.groups, args, mo, label="", protocol=proto))
            print(U.table([_row(runs[-1])], HEADER), file=sys.stderr, flush=True)
        result.update(mode="single", runs=runs, meets_targets={r["variant"]: r["meets_targets"] for r in runs})
        if len(runs) == 1:
            result["run"] = runs[0]
        text = U.table([_row(r) for r in runs], HEADER)
    U.emit(result, title + text)


if __name__ == "__main__":
    main(sys.argv[1:])
