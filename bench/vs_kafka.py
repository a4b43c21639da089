"""herd against a real Apache Kafka broker: the same loads, in one run, against both.

``python -m bench.vs_kafka [--quick] [--loads commits,rebalance,heartbeats,startup,bigGroup]
[--commit-procs 1,4] [--commit-duration 5] [--members 50] [--hb-groups 10000] [--hb-members 10]
[--hb-duration 20] [--startup-offsets 1000000] [--big-sizes 5000,10000] [--big-groups 1000]
[--big-window 60] [--kafka-heap 2g]``

Servers (all on loopback, started and stopped here):

* ``herd``: fsync=always, a commit is acknowledged once it is fdatasynced.
* ``herd-interval``: fsync=interval (``fsync_interval_ms`` 1000): a commit is acknowledged once
  written to the OS, the log fdatasynced every second: Kafka's default guarantee. Only the commit
  load runs on it.
* ``kafka``: Apache Kafka 4.4.0 (``make reference-deps`` resolves its jars from Maven), KRaft, one
  node, defaults (``offsets.topic.num.partitions`` 50): a commit is acknowledged once written to the
  page cache of its one replica, not fsynced.
* ``kafka-flush``: the same with ``log.flush.interval.messages=1`` (``flush.messages=1`` for every
  topic, ``__consumer_offsets`` included): every append is flushed to disk before the answer, so it
  acknowledges only what is on disk, as herd does. Only the commit load runs on it.

Like against like (``like_for_like`` in the output): ``herd-interval`` against ``kafka`` (both
acknowledge from the page cache) and ``herd`` (always) against ``kafka-flush`` (both from disk).
Each of Kafka's commit cells is preceded by a discarded warm-up cell (its JIT).

Both get ``group.initial.rebalance.delay.ms`` 0 and topic ``bench`` with 100 partitions.

Loads (each row says which server; ratios are herd / kafka, > 1 = herd better, for throughput, and
kafka / herd for latencies and costs):

* ``commits``: bench.commits' synchronous cell: 1 and 4 confluent-kafka processes, each committing 10
  partitions per OffsetCommit as fast as it can for ``--commit-duration`` s (commits/s, p50/p99 ms,
  server CPU µs per commit).
* ``rebalance``: ``--members`` confluent-kafka members (eager range, session 10 s, heartbeat 1 s) in
  one group on ``bench``; time to a complete assignment after one member leaves (close()), and after
  one new member joins; the server's CPU over each rebalance.
* ``heartbeats``: bench.loadgen: ``--hb-groups`` groups × ``--hb-members`` members join over raw
  connections, then heartbeat every ``--hb-interval`` s (3) for ``--hb-duration`` s: heartbeat
  p50/p99, errors, the rate achieved against the schedule's, server CPU µs per heartbeat and RSS.
  100,000 members every 3 s (33,333/s) saturate a 2-core machine with the load tool on it: give
  them a rate it sustains instead (``--hb-interval 15``: 6,667/s, the 2,000 × 10 row's rate, with
  the members' session timeout 3 × the interval).
* ``startup``: ``--startup-offsets`` offsets committed over the wire (100 partitions per
  OffsetCommit, groups of 100 partitions), then the server restarted: seconds from process start
  until an OffsetFetch of the last group answers its offsets, and RSS after.
* ``bigGroup``: bench.big_group's load (issue 31 item 4) on ``herd`` (fsync=always, the default;
  a group's formation writes one record, so durability weighs little) and on ``kafka`` (defaults),
  a fresh server per cell, alternated herd, kafka for each of ``--big-sizes``: ``--big-groups``
  small groups x 10 members heartbeat every 3 s while one classic group of N members (one
  connection each) forms and then rebalances; the small groups' heartbeat p99/max per phase,
  formation s from the last JoinGroup, rebalance s from the LeaveGroup, the server's CPU s per phase
  and RSS after; herd's loop-lag max (Kafka has none: null). The rebalance's rejoins leave all at
  once (the worst case), or with ``--big-rejoin-spread 3`` each at its member's next heartbeat.
"""
from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from bench import _util as U
from bench._kafka import KafkaTarget

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

_now = time.perf_counter


# -- servers ------------------------------------------------------------------------------------

class HerdTarget:
    def __init__(self, name: str = "herd", fsync: str = "always", max_connections: int = 10_000):
        """``max_connections``: herd's own limit (10,000 by default; Kafka's ``max.connections`` is
        unlimited), raised to what the loads open."""
        self.name = name
        self.herd = U.Herd(fsync=fsync, topics=("bench:100",), initial_rebalance_delay_ms=0,
                           log_level="warning", extra_args=["--max-connections", str(max_connections)])

    def __enter__(self):
        self.herd.__enter__()
        return self

    def __exit__(self, *exc):
        self.herd.__exit__(*exc)

    @property
    def bootstrap(self) -> str:
        return self.herd.bootstrap

    @property
    def pid(self) -> int:
        return self.herd.pid

    def restart(self) -> float:
        self.herd.stop()
        t0 = time.monotonic()
        self.herd.start()
        return time.monotonic() - t0



def server_usage(pid: int) -> dict:
    return {"cpu_ns": U.proc_cpu_ns(pid), "rss_mb": U.proc_rss_bytes(pid) / 2**20}


# -- loads --------------------------------------------------------------------------------------

def load_commits(t, args) -> list[dict]:
    from bench import commits

    cargs = SimpleNamespace(partitions=10, topic="bench", topic_partitions=100, duration=args.commit_duration,
                            warmup=20, max_commits=10_000_000, outstanding=0)
    rows = []
    for procs in args.commit_procs:
        r = commits.run_cell(t.name, t.bootstrap, t.pid, procs, cargs, 1, "sync")
        keep = ("target", "procs", "commits", "errors", "commits_per_s", "latency_ms", "server_cpu_us_per_commit")
        rows.append({k: r[k] for k in keep} | {"server_rss_mb": U.proc_rss_bytes(t.pid) / 2**20})
        print(f"  {t.name} commits {procs}p: {r['commits_per_s']:.0f}/s p50 {r['latency_ms'].get('p50')}",
              file=sys.stderr, flush=True)
    return rows


def load_rebalance(t, args) -> dict:
    from bench.rebalance import Member, wait_complete

    group = f"vs-rebalance-{t.name}-{int(time.time() * 1000) % 10**8}"
    conf = {"bootstrap.servers": t.bootstrap, "group.id": group, "session.timeout.ms": 10000,
            "heartbeat.interval.ms": 1000, "partition.assignment.strategy": "range", "enable.auto.commit": False,
            "socket.nagle.disable": True, "log_level": 3, "max.poll.interval.ms": 300000}
    members = [Member(i, dict(conf, **{"client.id": f"vs-{i}"}), "bench") for i in range(args.members)]
    out = {"target": t.name, "members": args.members}
    extra = None
    try:
        t0 = _now()
        for mb in members:
            mb.start()
        got = wait_complete(members, t0, 100, 120, 1.0)
        out["start_to_stable_s"] = None if got is None else got - t0
        if got is None:
            return out
        live = list(members)
        victim = live.pop(len(live) // 2)
        cpu0 = U.proc_cpu_ns(t.pid)
        victim.stop_requested.set()
        while victim.close_started is None and victim.is_alive():
            time.sleep(0.0005)
        t_leave = victim.close_started or _now()
        done = wait_complete(live, t_leave, 100, 60, 1.0)
        out["leave_to_complete_s"] = None if done is None else done - t_leave
        out["leave_server_cpu_ms"] = (U.proc_cpu_ns(t.pid) - cpu0) / 1e6
        extra = Member(args.members, dict(conf, **{"client.id": "vs-new"}), "bench")
        cpu0 = U.proc_cpu_ns(t.pid)
        t_join = _now()
        extra.start()
        done = wait_complete(live + [extra], t_join, 100, 60, 1.0)
        out["join_to_complete_s"] = None if done is None else done - t_join
        out["join_server_cpu_ms"] = (U.proc_cpu_ns(t.pid) - cpu0) / 1e6
        out["server_rss_mb"] = U.proc_rss_bytes(t.pid) / 2**20
    finally:
        for mb in members + ([extra] if extra else []):
            mb.stop_requested.set()
        for mb in members + ([extra] if extra else []):
            mb.join(30)
    print(f"  {t.name} rebalance: leave {out.get('leave_to_complete_s')} join {out.get('join_to_complete_s')}",
          file=sys.stderr, flush=True)
    return out


def load_heartbeats(t, args) -> dict:
    from bench.loadgen import LoadGen

    with LoadGen(t.bootstrap, args.hb_groups, args.hb_members, procs=2,
                 group_prefix=f"vs-hb-{t.name}-{int(time.time()) % 10**6}", hb_interval=args.hb_interval,
                 session_timeout_ms=max(30_000, int(args.hb_interval * 3000))) as lg:
        joined = lg.join()
        cpu0 = U.proc_cpu_ns(t.pid)
        hb = lg.window(args.hb_duration)
        cpu = (U.proc_cpu_ns(t.pid) - cpu0) / 1e9
    out = {"target": t.name, "groups": args.hb_groups, "members": args.hb_members,
           "join_s": joined.get("seconds") if isinstance(joined, dict) else None,
           "groups_complete": joined.get("groups_complete") if isinstance(joined, dict) else None,
           "hb_interval_s": args.hb_interval,
           "schedule_per_s": args.hb_groups * args.hb_members / args.hb_interval,
           "heartbeats": hb["heartbeats"], "heartbeats_per_s": hb["heartbeats_per_s"],
           "latency_ms": hb["latency_ms"], "errors": hb["errors"], "members_failed": hb["members_failed"],
           "unanswered": hb["unanswered"],
           "load_stalls": hb.get("load_stalls"), "load_cpu_util": hb.get("load_cpu_util"),
           "server_cpu_us_per_heartbeat": cpu * 1e6 / hb["heartbeats"] if hb["heartbeats"] else None,
           "server_rss_mb": U.proc_rss_bytes(t.pid) / 2**20}
    print(f"  {t.name} heartbeats: {out['heartbeats_per_s']:.0f}/s {out['latency_ms']}", file=sys.stderr, flush=True)
    return out


def _commit_offsets(bootstrap: str, n_offsets: int, conns: int = 4, window: int = 32) -> tuple[float, int]:
    """n_offsets over the wire: groups of 100 partitions of topic bench, one OffsetCommit v8 each,
    ``window`` requests in flight per connection. Returns (seconds, groups)."""
    from protocol import messages as m
    from tools.rawclient import RawClient

    groups = max(1, n_offsets // 100)
    host, port = bootstrap.split(":")
    errors = []

    def worker(k: int):
        with RawClient((host, int(port)), timeout=120) as c:
            pending = []
            for g in range(k, groups, conns):
                req = m.OffsetCommitRequest(group_id=f"vs-start-{g:07d}", generation_id_or_member_epoch=-1, topics=[
                    m.OffsetCommitRequestTopic(name="bench", partitions=[
                        m.OffsetCommitRequestPartition(partition_index=p, committed_offset=g + p, committed_metadata="")
                        for p in range(100)])])
                pending.append(c.send(req, 8))
                if len(pending) >= window:
                    r = c.receive(8, 8, pending.pop(0))
                    if any(p.error_code for t in r.topics for p in t.partitions):
                        errors.append(r)
            for cid in pending:
                c.receive(8, 8, cid)

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(k,)) for k in range(conns)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    if errors:
        raise RuntimeError(f"commit errors: {errors[0]}")
    return time.monotonic() - t0, groups


def _fetch_ready(bootstrap: str, group: str, timeout: float = 600) -> float:
    from protocol import messages as m
    from tools.rawclient import RawClient

    host, port = bootstrap.split(":")
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            with RawClient((host, int(port)), timeout=30) as c:
                while time.monotonic() - t0 < timeout:
                    r = c.call(m.OffsetFetchRequest(group_id=group, topics=None), 7)
                    if r.error_code == 0 and sum(len(t.partitions) for t in r.topics) == 100:
                        return time.monotonic()
                    time.sleep(0.05)
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"{group} not readable after {timeout}s")


def load_startup(t, args) -> dict:
    cpu0 = U.proc_cpu_ns(t.pid)
    secs, groups = _commit_offsets(t.bootstrap, args.startup_offsets)
    commit_cpu = (U.proc_cpu_ns(t.pid) - cpu0) / 1e9
    t0 = time.monotonic()
    ready_s = t.restart()
    served = _fetch_ready(t.bootstrap, f"vs-start-{groups - 1:07d}") - t0
    out = {"target": t.name, "offsets": groups * 100, "commit_s": secs,
           "server_cpu_us_per_100_partition_commit": commit_cpu * 1e6 / groups,
           "restart_to_listening_s": ready_s, "restart_to_offsets_served_s": served,
           "server_rss_mb_after_start": U.proc_rss_bytes(t.pid) / 2**20}
    print(f"  {t.name} startup: {out['restart_to_offsets_served_s']:.2f}s", file=sys.stderr, flush=True)
    return out


def big_group_cell(target: str, big: int, args) -> dict:
    """One bench.big_group run (a fresh server) and its summary: the columns the bigGroup row compares."""
    from bench import big_group

    ns = SimpleNamespace(target=target, big=big, groups=args.big_groups, members=10, procs=2, hb_interval=3.0,
                         window=args.big_window, baseline=6.0, settle=3.0, session_timeout_ms=300_000,
                         rebalance_timeout_ms=120_000, fsync="always", pin=False, profile=None, profile_rate=200,
                         rev=None, kafka_heap=args.kafka_heap, kafka_config=None,
                         rejoin_spread=args.big_rejoin_spread, load_nice=args.big_load_nice)
    r = big_group.run(ns)
    out = big_group_summary(r)
    out["detail"] = r
    print(f"  {target} bigGroup {big}: formation {out['formation_s']:.2f} s rebalance {out['rebalance_s']:.2f} s, "
          f"hb p99 {out['formation_hb_p99_ms']} / {out['rebalance_hb_p99_ms']} ms, cpu "
          f"{out['formation_server_cpu_s']:.2f} / {out['rebalance_server_cpu_s']:.2f} s", file=sys.stderr, flush=True)
    return out


def big_group_summary(r: dict) -> dict:
    ph, c, hw = r["phases"], r["checks"], r["heartbeat_window"]
    out = {"target": r["target"], "big_members": r["big_members"], "small_groups": r["small_groups"],
           "small_members": r["small_members"], "baseline_hb_p99_ms": ph["baseline"]["hb_ms"]["p99"]}
    for k in ("formation", "rebalance"):
        out[f"{k}_hb_p99_ms"] = ph[k]["hb_ms"]["p99"]
        out[f"{k}_hb_p99_at_kernel_ms"] = (ph[k].get("hb_at_kernel_ms") or {}).get("p99")
        out[f"{k}_server_runqueue_wait_s"] = sum(v["runqueue_wait_s"] for name, v in ph[k].get("runqueue", {}).items()
                                                 if name in ("daemon_loop", "server_threads")) or None
        out[f"{k}_hb_max_ms"] = ph[k]["hb_ms"]["max"]
        out[f"{k}_server_cpu_s"] = ph[k]["server_cpu_s"]
    out.update(formation_s=r["formation_s_from_last_join"], rebalance_s=r["rebalance_s_from_leave"],
               rebalance_s_from_last_join=r["rebalance_s_from_last_join"],
               rejoin_spread_s=r["rejoin_spread_s"],
               minting_ids_s=r["minting_ids_s"], baseline_server_cpu_s=ph["baseline"]["server_cpu_s"],
               loop_lag_max_s=r["loop_lag_max_s_end"], hb_p99_ms=c["hb_p99_ms"], hb_p99_ok=c["hb_p99_ok"],
               hb_p99_at_kernel_ms=c.get("hb_p99_at_kernel_ms"), load_nice=r.get("load_nice", 0),
               formation_ok=c["formation_ok"], big_group_complete=c["big_group_complete"],
               big_errors=r["big_errors"], small_errors=c["small_errors"], unanswered=hw["unanswered"],
               load_cpu_util=hw["load_cpu_util"], server_rss_mb_end=r["server_rss_mb_end"])
    return out


def big_group_ratios(h: dict, k: dict) -> dict:
    """kafka / herd for one size's two summaries (> 1: herd better; None where either is missing or 0).
    The formation and rebalance times compare only groups that both completed (a failed SyncGroup
    ends a formation early: e.g. Kafka's group record over ``message.max.bytes``)."""
    keys = ("hb_p99_ms", "formation_hb_p99_ms", "rebalance_hb_p99_ms", "formation_hb_max_ms", "rebalance_hb_max_ms",
            "formation_s", "rebalance_s", "formation_server_cpu_s", "rebalance_server_cpu_s", "server_rss_mb_end")
    both = bool(h.get("big_group_complete") and k.get("big_group_complete"))
    out = {x: ratio(k.get(x), h.get(x)) for x in keys if both or x not in ("formation_s", "rebalance_s")}
    out["both_complete"] = both
    return out


# -- main ---------------------------------------------------------------------------------------

def ratio(a, b):
    return None if not a or not b else a / b


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m bench.vs_kafka", description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small parameters (a few minutes in all)")
    ap.add_argument("--loads", default="commits,rebalance,heartbeats,startup,bigGroup")
    ap.add_argument("--commit-procs", default="1,4")
    ap.add_argument("--commit-duration", type=float, default=None, help="seconds per cell (default 10, quick 3)")
    ap.add_argument("--members", type=int, default=50)
    ap.add_argument("--hb-groups", type=int, default=None, help="default 10000, quick 500")
    ap.add_argument("--hb-members", type=int, default=10)
    ap.add_argument("--hb-duration", type=float, default=None, help="default 20, quick 6")
    ap.add_argument("--hb-interval", type=float, default=3.0, help="heartbeats: seconds between a member's "
                    "heartbeats (its session timeout: 3x, at least 30 s)")
    ap.add_argument("--startup-offsets", type=int, default=None, help="default 1000000, quick 100000")
    ap.add_argument("--big-sizes", default=None, help="bigGroup: members of the big group, comma-separated "
                    "(default 5000,10000, quick 1000)")
    ap.add_argument("--big-groups", type=int, default=None, help="bigGroup: small groups of 10 (default 1000, "
                    "quick 100)")
    ap.add_argument("--big-window", type=float, default=None, help="bigGroup: heartbeat window s (default 60, "
                    "quick 25)")
    ap.add_argument("--big-rejoin-spread", type=float, default=0.0, help="bigGroup: the rebalance's rejoins "
                    "spread over this many seconds (each member at its next heartbeat); 0: all at once")
    ap.add_argument("--big-load-nice", type=int, default=0, help="bigGroup: the load at this nice value, the "
                    "server at its own (bench.big_group --load-nice); 0: no change")
    ap.add_argument("--kafka-heap", default="2g")
    return ap


def main(argv=None):
    args = U.parse(build_parser(), argv)
    q = args.quick
    args.commit_procs = [int(x) for x in str(args.commit_procs).split(",") if x]
    args.commit_duration = args.commit_duration or (3 if q else 10)
    args.hb_groups = args.hb_groups or (500 if q else 10000)
    args.hb_duration = args.hb_duration or (6 if q else 20)
    args.startup_offsets = args.startup_offsets or (100_000 if q else 1_000_000)
    args.big_sizes = [int(x) for x in str(args.big_sizes or ("1000" if q else "5000,10000")).split(",") if x]
    args.big_groups = args.big_groups or (100 if q else 1000)
    args.big_window = args.big_window or (25.0 if q else 60.0)
    loads = [x for x in args.loads.split(",") if x]
    env = U.environment()
    runs: dict[str, dict] = {}
    # the heartbeat load opens one connection per group plus its join connections: herd's default
    # limit (10,000) would refuse the last of them at 10,000 groups, Kafka's has none
    conns = max(10_000, args.hb_groups + 2_000)
    targets = [("herd", HerdTarget, ("herd", "always", conns)),
               ("herd-interval", HerdTarget, ("herd-interval", "interval", conns)),
               ("kafka", KafkaTarget, ("kafka", args.kafka_heap, {})),
               ("kafka-flush", KafkaTarget, ("kafka-flush", args.kafka_heap, {"log.flush.interval.messages": 1}))]
    for name, cls, cargs in targets:
        these = ["commits"] if name in ("kafka-flush", "herd-interval") else loads
        these = [x for x in these if x in loads and x != "bigGroup"]
        if not these:
            continue
        with cls(*cargs) as t:
            r = runs[name] = {"idle_rss_mb": U.proc_rss_bytes(t.pid) / 2**20}
            for load in these:
                if load == "commits" and name.startswith("kafka"):
                    load_commits(t, args)  # warm-up (Kafka's JIT), discarded
                r[load] = globals()[f"load_{load}"](t, args)
    if "bigGroup" in loads:  # a fresh server per cell (its own metrics port and connection limit on herd)
        for big in args.big_sizes:
            for name in ("herd", "kafka"):
                runs.setdefault(name, {}).setdefault("bigGroup", []).append(big_group_cell(name, big, args))
    # ratios: herd against each Kafka
    ratios = {}
    h = runs.get("herd", {})
    for kname in ("kafka", "kafka-flush"):
        k = runs.get(kname, {})
        rr = {}
        for hc, kc in zip(h.get("commits", []), k.get("commits", []), strict=False):
            rr[f"commits_{hc['procs']}p_per_s"] = ratio(hc["commits_per_s"], kc["commits_per_s"])
            rr[f"commits_{hc['procs']}p_p99"] = ratio(kc["latency_ms"].get("p99"), hc["latency_ms"].get("p99"))
            rr[f"commits_{hc['procs']}p_cpu"] = ratio(kc["server_cpu_us_per_commit"], hc["server_cpu_us_per_commit"])
        if "rebalance" in h and "rebalance" in k:
            for x in ("leave_to_complete_s", "join_to_complete_s", "leave_server_cpu_ms", "join_server_cpu_ms"):
                rr[f"rebalance_{x}"] = ratio(k["rebalance"].get(x), h["rebalance"].get(x))
        if "heartbeats" in h and "heartbeats" in k:
            for p in ("p50", "p99"):
                rr[f"heartbeat_{p}"] = ratio(k["heartbeats"]["latency_ms"].get(p), h["heartbeats"]["latency_ms"].get(p))
            kh, hh = k["heartbeats"], h["heartbeats"]
            rr["heartbeat_cpu"] = ratio(kh["server_cpu_us_per_heartbeat"], hh["server_cpu_us_per_heartbeat"])
            rr["heartbeat_rss"] = ratio(kh["server_rss_mb"], hh["server_rss_mb"])
        if "startup" in h and "startup" in k:
            rr["startup_offsets_served"] = ratio(k["startup"]["restart_to_offsets_served_s"],
                                                 h["startup"]["restart_to_offsets_served_s"])
            rr["startup_rss"] = ratio(k["startup"]["server_rss_mb_after_start"],
                                      h["startup"]["server_rss_mb_after_start"])
        for hb, kb in zip(h.get("bigGroup", []), k.get("bigGroup", []), strict=False):
            rr[f"bigGroup_{hb['big_members']}"] = big_group_ratios(hb, kb)
        if rr:
            ratios[f"herd_vs_{kname}"] = rr
    like = {}
    for hname, kname in (("herd-interval", "kafka"), ("herd", "kafka-flush")):
        hc_all, kc_all = runs.get(hname, {}).get("commits", []), runs.get(kname, {}).get("commits", [])
        for hc, kc in zip(hc_all, kc_all, strict=False):
            like[f"{hname}_vs_{kname}_commits_{hc['procs']}p"] = {
                "herd_per_s": hc["commits_per_s"], "kafka_per_s": kc["commits_per_s"],
                "throughput": ratio(hc["commits_per_s"], kc["commits_per_s"]),
                "herd_p99_ms": hc["latency_ms"].get("p99"), "kafka_p99_ms": kc["latency_ms"].get("p99"),
                "p99": ratio(kc["latency_ms"].get("p99"), hc["latency_ms"].get("p99")),
                "herd_cpu_us": hc["server_cpu_us_per_commit"], "kafka_cpu_us": kc["server_cpu_us_per_commit"],
                "cpu": ratio(kc["server_cpu_us_per_commit"], hc["server_cpu_us_per_commit"])}
    result = {"benchmark": "vs_kafka", **env, "data_filesystem": U.filesystem_of(U.default_tmp_root()),
              "clients": U.client_versions(), "kafka_version": "4.4.0",
              "params": {k: v for k, v in vars(args).items()}, "runs": runs,
              "ratios (>1: herd better)": ratios, "like_for_like (>1: herd better)": like}
    return U.emit(result)


if __name__ == "__main__":
    main(sys.argv[1:])
