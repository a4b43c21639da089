"""Offset commits from confluent-kafka: herd (durable) against librdkafka's mock cluster (in memory).

``python -m bench.commits [--quick] [--procs 1,4] [--modes sync,async] [--outstanding 32]
[--duration S] [--partitions 10] [--fsync always]``

Each client process is one confluent-kafka ``Consumer`` that ``assign()``s 10 partitions of topic
``bench`` (100 partitions) and commits them as fast as it can for ``--duration`` seconds, after a
warm-up; offsets grow by one per commit. Each process uses its own group (a standalone consumer:
generation -1 into an Empty group, as Spark executors do). Two modes, each its own rows:

* ``sync``: ``commit(offsets=[10 TopicPartitions], asynchronous=False)``: one OffsetCommit
  request of 10 partitions, waited for, then the next. The target is about this mode.
* ``async``: ``commit(..., asynchronous=True)`` with up to ``--outstanding`` commits not yet
  confirmed per client (librdkafka pipelines them on its coordinator connection); the ``on_commit``
  callback (served by ``poll``) confirms one. Latency = from ``commit()`` to its callback.

herd (fsync=always: durable; and, for comparison, a second daemon with fsync=never, "herd-nofsync")
and the mock all run for the whole benchmark; each (target, process count) cell is measured alone,
back to back, reversing the order every round. Reported per cell:
commits/s (all processes), latency p50/p99/max in ms, errors, and the server's CPU µs per commit
(``/proc``); then the herd/mock ratio of commits/s. Target: ratio >= 1.0 with herd fsync=always.

The same run also times ``pwrite`` + ``fdatasync`` of a 300-byte record in a preallocated file on
herd's data file system (``--fsync-samples``) and reports, for each ``sync`` row, the best ratio
a durable coordinator could reach there: ``mock p50 / (mock p50 + fdatasync p50)``. A synchronous
client waits for its commit's fdatasync; even a server whose own work cost nothing beyond the
mock's would add that wait to every round trip the mock makes from memory.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import sys
import time
from array import array

from bench import _util as U

TARGET_RATIO = 1.0


def _worker(
    bootstrap: str,
    group: str,
    topic: str,
    partitions: list[int],
    duration: float,
    warmup: int,
    max_commits: int,
    barrier,
    results,
    outstanding: int = 0,
) -> None:
    """One client process; ``outstanding`` > 0: the async mode with that many commits in flight."""
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    out = {"group": group, "commits": 0, "errors": 0, "error_samples": []}
    consumer = None
    sent_at: dict[int, float] = {}  # async: offset of a commit in flight -> when commit() was called
    confirmed = array("d")  # async: latency of each confirmed commit
    failed = []

    def on_commit(err, tps):
        if not tps:
            return
        t0 = sent_at.pop(tps[0].offset, None)
        if t0 is None:
            return  # a warm-up commit
        confirmed.append(time.perf_counter() - t0)
        bad = err if err is not None else next((tp.error for tp in tps if tp.error is not None), None)
        if bad is not None:
            failed.append(str(bad))

    try:
        consumer = Consumer(
            {
                "bootstrap.servers": bootstrap,
                "group.id": group,
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "client.id": f"bench-commits-{group}",
                "socket.nagle.disable": True,
                "log_level": 3,
                "on_commit": on_commit,
            }
        )
        consumer.assign([TopicPartition(topic, p) for p in partitions])
        offset = 0
        for _ in range(warmup):  # FindCoordinator, connections, first commits
            offset += 1
            consumer.commit(
                offsets=[TopicPartition(topic, p, offset) for p in partitions], asynchronous=False
            )
        barrier.wait(60)
        lat = array("d")
        errors = 0
        cpu0 = U.self_cpu_seconds()
        started = time.perf_counter()
        stop_at = started + duration
        now = started
        if outstanding > 0:
            sent = 0
            while now < stop_at and sent < max_commits:
                while len(sent_at) < outstanding and sent < max_commits:
                    offset += 1
                    sent += 1
                    sent_at[offset] = time.perf_counter()
                    consumer.commit(offsets=[TopicPartition(topic, p, offset) for p in partitions],
                                    asynchronous=True)
                consumer.poll(0.001)  # serves on_commit
                now = time.perf_counter()
            drain_until = now + 30
            while sent_at and time.perf_counter() < drain_until:  # the commits still in flight
                consumer.poll(0.01)
            now = time.perf_counter()
            lat = confirmed
            errors = len(failed) + len(sent_at)
            out["error_samples"] = failed[:3] + (["unconfirmed after 30 s"] if sent_at else [])
        while now < stop_at and len(lat) < max_commits:
            offset += 1
            offs = [TopicPartition(topic, p, offset) for p in partitions]
            t0 = time.perf_counter()
            try:
                res = consumer.commit(offsets=offs, asynchronous=False)
                bad = [tp for tp in res or () if tp.error is not None]
                if bad:
                    errors += 1
                    if len(out["error_samples"]) < 3:
                        out["error_samples"].append(str(bad[0].error))
            except KafkaException as exc:
                errors += 1
                if len(out["error_samples"]) < 3:
                    out["error_samples"].append(str(exc))
            now = time.perf_counter()
            lat.append(now - t0)
        out.update(
            commits=len(lat),
            errors=errors,
            seconds=now - started,
            latencies=lat.tobytes(),
            client_cpu_s=U.self_cpu_seconds() - cpu0,
        )
    except Exception as exc:  # reported, never hangs the parent
        out["failure"] = f"{type(exc).__name__}: {exc}"
        try:
            barrier.abort()
        except Exception:
            pass
    finally:
        if consumer is not None:
            try:
                consumer.close()
            except Exception:
                pass
        results.put(out)


def run_cell(target: str, bootstrap: str, server_pid: int, procs: int, args, round_no: int,
             mode: str = "sync") -> dict:
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(procs + 1)
    results = ctx.Queue()
    workers = []
    stamp = f"{target}-{mode}-{procs}p-r{round_no}-{int(time.time() * 1000) % 10**8}"
    try:
        for i in range(procs):
            first = (i * args.partitions) % args.topic_partitions
            parts = [(first + k) % args.topic_partitions for k in range(args.partitions)]
            w = ctx.Process(
                target=_worker,
                daemon=True,
                args=(
                    bootstrap,
                    f"bench-commits-{stamp}-{i}",
                    args.topic,
                    parts,
                    args.duration,
                    args.warmup,
                    args.max_commits,
                    barrier,
                    results,
                    args.outstanding if mode == "async" else 0,
                ),
            )
            w.start()
            workers.append(w)
        barrier.wait(120)  # every client warmed up
        threads0 = U.proc_threads_cpu_ns(server_pid)
        t0 = time.perf_counter()
        outs = [results.get(timeout=args.duration + 120) for _ in workers]
        wall = time.perf_counter() - t0
        threads1 = U.proc_threads_cpu_ns(server_pid)
        by_thread = {name: (ns - threads0.get(name, 0)) / 1e9 for name, ns in threads1.items()}
        server_cpu_s = sum(by_thread.values())
    finally:
        for w in workers:
            w.join(30)
            if w.is_alive():
                w.kill()
                w.join(5)
    failures = [o["failure"] for o in outs if "failure" in o]
    if failures:
        raise RuntimeError(f"{target} {procs}p: client failed: {failures[0]}")
    lat = array("d")
    for o in outs:
        lat.frombytes(o["latencies"])
    commits = sum(o["commits"] for o in outs)
    seconds = max(o["seconds"] for o in outs)
    pct = U.percentiles(lat, (50, 99))
    return {
        "target": target,
        "mode": mode,
        "procs": procs,
        "round": round_no,
        "commits": commits,
        "errors": sum(o["errors"] for o in outs),
        "error_samples": [s for o in outs for s in o["error_samples"]][:3],
        "seconds": seconds,
        "commits_per_s": commits / seconds if seconds else 0.0,
        "latency_ms": {k: (v * 1000 if k not in ("count",) and v is not None else v) for k, v in pct.items()},
        "server_cpu_us_per_commit": server_cpu_s * 1e6 / commits if commits else None,
        "server_cpu_util": server_cpu_s / wall if wall else None,
        "server_cpu_us_per_commit_by_thread": {k: v * 1e6 / commits for k, v in by_thread.items() if v > 0}
        if commits
        else {},
        "client_cpu_us_per_commit": sum(o["client_cpu_s"] for o in outs) * 1e6 / commits if commits else None,
    }


def build_parser() -> argparse.ArgumentParser:
    ap = U.arg_parser("bench.commits", __doc__.split("\n\n")[0], "short runs (< 60 s in all)")
    ap.add_argument("--procs", default="1,4", help="client process counts, comma separated (default 1,4)")
    ap.add_argument("--modes", default="sync,async", help="sync and/or async commits (default sync,async)")
    ap.add_argument("--outstanding", type=int, default=32, help="async: commits in flight per client")
    ap.add_argument("--duration", type=float, default=None, help="seconds per cell (default 10, quick 3)")
    ap.add_argument("--rounds", type=int, default=None, help="rounds of every cell (default 2, quick 1)")
    ap.add_argument("--warmup", type=int, default=20, help="commits per client before timing")
    ap.add_argument("--max-commits", type=int, default=10_000_000, help="cap per client")
    ap.add_argument("--partitions", type=int, default=10, help="partitions per commit request")
    ap.add_argument("--topic", default="bench")
    ap.add_argument("--topic-partitions", type=int, default=100)
    ap.add_argument(
        "--fsync",
        default="always,never",
        help="herd fsync modes, comma separated (default always,never). 'always' is target 'herd' "
        "(durable, the one the target is about); 'never' is 'herd-nofsync' (shows the CPU ceiling)",
    )
    ap.add_argument("--herd-log-level", default="info")
    ap.add_argument("--targets", default="herd,mock", help="herd and/or mock (default herd,mock)")
    ap.add_argument("--fsync-samples", type=int, default=None,
                    help="pwrite+fdatasync timings for the durable bound (default 3000, quick 1000; 0: skip)")
    return ap


def main(argv=None):
    args = U.parse(build_parser(), argv, sized={
        "duration": (3.0, 10.0),
        "rounds": (1, 2),
        "fsync_samples": (1_000, 3_000),
    })
    procs_list = [int(x) for x in args.procs.split(",") if x]
    modes = [x for x in args.modes.split(",") if x]
    if not modes or any(x not in ("sync", "async") for x in modes):
        raise SystemExit("--modes: sync and/or async")
    fsyncs = [f for f in args.fsync.split(",") if f]
    wanted = [t for t in args.targets.split(",") if t]
    targets = []
    if "herd" in wanted:
        targets += ["herd" if f == "always" else "herd-nofsync" for f in fsyncs]
    if "mock" in wanted:
        targets.append("mock")
    env = U.environment()
    topic = f"{args.topic}:{args.topic_partitions}"
    cells = []
    import contextlib

    with contextlib.ExitStack() as stack:
        servers = {}
        herds = {}
        for t in targets:
            if t.startswith("herd"):
                h = stack.enter_context(
                    U.Herd(
                        fsync="always" if t == "herd" else "never",
                        topics=[topic],
                        log_level=args.herd_log_level,
                    )
                )
                herds[t] = h
                servers[t] = (h.bootstrap, h.pid)
            else:
                m = stack.enter_context(U.Mock(topics=[topic]))
                servers[t] = (m.bootstrap, m.pid)
        for r in range(args.rounds):
            for mode in modes:
                for procs in procs_list:
                    order = targets if r % 2 == 0 else list(reversed(targets))
                    for target in order:
                        bootstrap, pid = servers[target]
                        cell = run_cell(target, bootstrap, pid, procs, args, r, mode)
                        cells.append(cell)
                        print(
                            f"  {target:4} {mode:5} {procs}p round {r}: {cell['commits_per_s']:8.0f} commits/s "
                            f"p50 {cell['latency_ms']['p50']:.2f} ms p99 {cell['latency_ms']['p99']:.2f} ms",
                            file=sys.stderr,
                            flush=True,
                        )
        herd_rss = {t: U.proc_rss_bytes(h.pid) / 2**20 for t, h in herds.items()}
        data_fs = {t: U.filesystem_of(h.data_dir) for t, h in herds.items()}
        probe = None
        if args.fsync_samples > 0 and herds:
            from bench.floor import fdatasync_probe

            probe = fdatasync_probe(str(next(iter(herds.values())).data_dir.parent), args.fsync_samples)
    summary = []
    for mode, procs in [(mo, p) for mo in modes for p in procs_list]:
        row = {"mode": mode, "procs": procs}
        if mode == "async":
            row["outstanding"] = args.outstanding
        for target in targets:
            mine = [c for c in cells if c["target"] == target and c["procs"] == procs and c["mode"] == mode]
            row[target] = {
                "commits_per_s": statistics.median(c["commits_per_s"] for c in mine),
                "p50_ms": statistics.median(c["latency_ms"]["p50"] for c in mine),
                "p99_ms": statistics.median(c["latency_ms"]["p99"] for c in mine),
                "errors": sum(c["errors"] for c in mine),
                "server_cpu_us_per_commit": statistics.median(c["server_cpu_us_per_commit"] for c in mine),
            }
        if "herd" in row and "mock" in row and row["mock"]["commits_per_s"]:
            row["ratio_herd_over_mock"] = row["herd"]["commits_per_s"] / row["mock"]["commits_per_s"]
            row["target_ratio"] = TARGET_RATIO
            row["meets_target"] = row["ratio_herd_over_mock"] >= TARGET_RATIO and row["herd"]["errors"] == 0
        if "herd-nofsync" in row and "mock" in row and row["mock"]["commits_per_s"]:
            row["ratio_herd_nofsync_over_mock"] = (
                row["herd-nofsync"]["commits_per_s"] / row["mock"]["commits_per_s"]
            )
        if mode == "sync" and probe is not None and "mock" in row:
            mock_ms = row["mock"]["p50_ms"]
            row["durable_bound_ratio"] = mock_ms / (mock_ms + probe["latency_us"]["p50"] / 1000)
        summary.append(row)
    result = {
        "benchmark": "commits",
        **env,
        "clients": U.client_versions(),
        "params": {
            "procs": procs_list,
            "duration_s": args.duration,
            "rounds": args.rounds,
            "warmup": args.warmup,
            "partitions_per_commit": args.partitions,
            "topic": topic,
            "herd_fsync": fsyncs,
            "targets": targets,
            "herd_data_fs": data_fs,
            "herd_log_level": args.herd_log_level,
            "quick": args.quick,
            "modes": modes,
            "outstanding": args.outstanding,
            "commit_call": "Consumer.commit(offsets=[...], asynchronous=False) after assign(); async: "
            "asynchronous=True, up to `outstanding` unconfirmed (on_commit callback) per client",
            "groups": "one per client process (standalone, generation -1)",
        },
        "summary": summary,
        "fdatasync": probe,
        "cells": cells,
        "herd_rss_mb": herd_rss,
    }
    rows = []
    for s in summary:
        rows.append(
            [
                s["mode"] if s["mode"] == "sync" else f"async {s['outstanding']}",
                f"{s['procs']}p",
                *(f"{s[t]['commits_per_s']:.0f}" for t in targets),
                *(f"{s[t]['p50_ms']:.2f}/{s[t]['p99_ms']:.2f}" for t in targets),
                f"{s.get('ratio_herd_over_mock', float('nan')):.2f}",
                ">= 1.0",
                "yes" if s.get("meets_target") else "NO",
                f"{s.get('ratio_herd_nofsync_over_mock', float('nan')):.2f}",
                f"{s['durable_bound_ratio']:.2f}" if "durable_bound_ratio" in s else "-",
            ]
        )
    text = U.table(
        rows,
        [
            "mode",
            "procs",
            *(f"{t} commits/s" for t in targets),
            *(f"{t} p50/p99 ms" for t in targets),
            "herd/mock",
            "target",
            "holds",
            "nofsync/mock",
            "durable bound",
        ],
    )
    if probe is not None:
        lat = probe["latency_us"]
        text += (f"\ndurable bound: mock p50 / (mock p50 + fdatasync p50); pwrite {probe['record_bytes']} B + "
                 f"fdatasync on {probe['filesystem']}: p50 {lat['p50']:.0f} µs, p99 {lat['p99']:.0f} µs")
    U.emit(result, f"commits ({args.partitions} partitions per commit; sync: one at a time per client, "
                   f"async N: N in flight)\n" + text)


if __name__ == "__main__":
    main(sys.argv[1:])
