"""How many GC-tracked objects herd's long-lived state holds, per member, connection and offset.

``python -m bench.gc_census [--n 1000] [--daemon 2000]``

A full collection (``GcWatch.walk_all``) walks every tracked object, so its pause is the count
below times ~0.3 us. This builds real state in-process with the tests' manual-clock harnesses (the
classic core's ``GroupCoordinator``, the KIP-848 ``ConsumerGroups``) and counts the tracked objects
reachable from the coordinator (not descending into types, modules, functions: shared code), at
``n`` and ``2n`` of each thing; the difference / n is the cost of one more, by type. Connections:
the edge's per-connection objects of a real daemon (``--conns``), counted the same way from the
server's connection set.
"""
from __future__ import annotations

import gc
import json
import sys
import types
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "coordinator" / "core"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "coordinator" / "core" / "consumer"))

_SHARED = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
           types.CodeType)


def census(root) -> Counter:
    """Tracked objects reachable from ``root`` by type name (code and classes not followed), after a
    collection (which untracks tuples of untracked items, as it does before freezing them)."""
    gc.collect()
    seen = set()
    out: Counter = Counter()
    stack = [root]
    while stack:
        o = stack.pop()
        if id(o) in seen or isinstance(o, _SHARED):
            continue
        seen.add(id(o))
        if gc.is_tracked(o):
            out[type(o).__name__] += 1
        stack.extend(gc.get_referents(o))
    return out


def per_unit(build, n: int) -> dict:
    a = census(build(n))
    b = census(build(2 * n))
    diff = {k: round((b[k] - a[k]) / n, 2) for k in set(a) | set(b) if b[k] != a[k]}
    return {"total": round(sum(diff.values()), 2),
            "by_type": dict(sorted(diff.items(), key=lambda kv: -kv[1]))}


def classic(n: int):
    from test_group_harness import Harness
    h = Harness()
    h.form_group("big", n)
    return h.gc


def classic_small(n: int):
    """``n`` members in groups of 10 (as the bench's small groups)."""
    from test_group_harness import Harness
    h = Harness()
    for g in range(n // 10):
        h.form_group(f"s{g}", 10)
    return h.gc


def offsets(n: int):
    from test_group_harness import Harness
    h = Harness()
    for g in range(n // 100):
        h.commit(f"o{g}", {("topic", p): 5 for p in range(100)})
    return h.gc


def kip848(n: int):
    from cg_harness import Client, Harness
    h = Harness(topics={"t": 64})
    for i in range(n):
        c = Client(h, member_id=f"m{i}", group="g")
        c.join()
    h.advance(1000)
    return h.groups


def daemon_census(k: int) -> dict:
    """A real daemon: tracked objects per idle connection, then per classic member (one
    connection each, formed as bench.big_group does), by type."""
    import asyncio
    import os
    import signal
    import tempfile
    import time

    from bench import _util as U
    from bench.big_group import Big
    from bench.loadgen import open_conns

    site = str(Path(__file__).resolve().parent / "gc_census_site")
    out_file = os.path.join(tempfile.mkdtemp(prefix="herd-gc-census-"), "census.json")
    env = {"HERD_GC_CENSUS": out_file, "PYTHONPATH": site}  # the launcher puts the tree first

    def take(pid):
        if os.path.exists(out_file):
            os.remove(out_file)
        os.kill(pid, signal.SIGUSR1)
        for _ in range(600):
            if os.path.exists(out_file):
                with open(out_file) as f:
                    return json.load(f)
            time.sleep(0.05)
        raise RuntimeError("no census")

    def delta(a, b, n):
        d = {t: round((b["by_type"].get(t, 0) - a["by_type"].get(t, 0)) / n, 2)
             for t in set(a["by_type"]) | set(b["by_type"])}
        d = {t: v for t, v in sorted(d.items(), key=lambda kv: -kv[1]) if abs(v) >= 0.05}
        return {"total": round((b["total"] - a["total"]) / n, 2), "by_type": d}

    res = {}
    with U.Herd(fsync="always", env=env, extra_args=["--max-connections", str(k + 100)]) as herd:
        host, port = herd.bootstrap.rsplit(":", 1)
        loop = asyncio.new_event_loop()
        time.sleep(1)
        c0 = take(herd.pid)
        res["daemon_at_start_total"] = c0["total"]
        conns = loop.run_until_complete(open_conns(host, int(port), k, "idle", parallel=200))
        time.sleep(0.5)
        c1 = take(herd.pid)
        res["idle_connection"] = delta(c0, c1, k)
        big = Big(conns, 60_000, 60_000)
        loop.run_until_complete(big.form())
        time.sleep(0.5)
        c2 = take(herd.pid)
        res["classic_member_with_its_connection_minus_idle_connection"] = delta(c1, c2, k)
        res["daemon_with_k_members_total"] = c2["total"]
        for c in conns:
            c.close() if hasattr(c, "close") else None
        loop.close()
    return res


def main(argv=None):
    from bench import _util as U

    ap = U.arg_parser("bench.gc_census", __doc__.splitlines()[0],
                      "100 of each in process and no daemon (default: 1,000, and a daemon with 2,000)")
    ap.add_argument("--n", type=int, default=None, help="members, offsets: n and 2n built in process")
    ap.add_argument("--daemon", type=int, default=None,
                    help="a real daemon with this many connections, then members (0: none)")
    args = U.parse(ap, argv, {"n": (100, 1000), "daemon": (0, 2000)})
    from coordinator import logging_setup

    logging_setup.configure("error", "console", sys.stderr)  # the harnesses' groups log each rebalance
    out = {"n": args.n, "classic_member_big_group": per_unit(classic, args.n),
           "classic_member_groups_of_10": per_unit(classic_small, args.n),
           "committed_offset": per_unit(offsets, args.n),
           "kip848_member": per_unit(kip848, args.n)}
    if args.daemon:
        out["daemon"] = daemon_census(args.daemon)
    U.emit({"bench": "gc_census", "machine": U.environment(), "run": out})


if __name__ == "__main__":
    main(sys.argv[1:])
