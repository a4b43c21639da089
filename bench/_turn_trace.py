"""The longest event-loop iterations in a turn trace (``bench.big_group --trace-turns FILE``).

``python -m bench._turn_trace FILE [--top 20] [--after S]``

The daemon, started with ``bench/turn_trace_site`` on its path, records every loop callback it
wraps: ``R`` a socket read (``Connection.data_received``, with the API key of the frame it starts
with), ``T`` the rebalance-request FIFO's turn (``edge/turns.py``), ``S`` a fan-out slice, ``L``
a later slice of a big group's work (``Result.later``), ``F``/``D`` the store's flush and drain,
``C`` a connection's deferred processing, ``X`` the core's timers; and inside those, ``H`` each
request handled for over 1 ms (by API key) and ``Q`` each call over 1 ms of a function named in
$HERD_TURN_TRACE_FUNCS (``module:Class.method``, comma-separated), and ``G`` each garbage
collection over 1 ms (by generation: count, ms, objects freed), listed per iteration; then the
five loop-lag probes that ran latest (``P``, over 20 ms late) and the longest iterations within
their lag. An iteration starts when a callback follows a read (uvloop runs call_soon callbacks,
then polls the sockets) or after a gap of over 1 ms. Printed: each of the longest iterations' span
and busy time, and per kind (reads per API key) the calls and milliseconds, as JSON lines.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict


def iterations(events: list) -> list[list]:
    events = sorted(events, key=lambda e: e[1])
    its, cur, prev = [], [], None
    for e in events:
        if cur and ((prev[0] == "R" and e[0] != "R") or e[1] - prev[2] > 0.001):
            its.append(cur)
            cur = []
        cur.append(e)
        prev = e
    if cur:
        its.append(cur)
    return its


def summary(it: list, t_first: float) -> dict:
    by: dict = defaultdict(lambda: [0, 0.0])
    for kind, t0, t1, extra in it:
        key = kind if kind != "R" else f"R{extra}"
        by[key][0] += 1
        by[key][1] += t1 - t0
    return {"t_s": round(it[0][1] - t_first, 3), "span_ms": round((it[-1][2] - it[0][1]) * 1000, 1),
            "busy_ms": round(sum(t1 - t0 for _, t0, t1, _ in it) * 1000, 1),
            "by_kind": {k: [v[0], round(v[1] * 1000, 1)] for k, v in sorted(by.items(), key=lambda kv: -kv[1][1])}}


def inner(events: list, it: list, names: dict) -> dict:
    """The requests over 1 ms ("H", by API key) handled inside iteration ``it``."""
    start, end = it[0][1], it[-1][2]
    by: dict = defaultdict(lambda: [0, 0.0])
    freed: dict = defaultdict(int)
    for kind, t0, t1, extra in events:
        if start <= t0 <= end:
            key = (f"H{extra}" if kind == "H" else f"G{extra % 10}" if kind == "G"
                   else "Q:" + names.get(str(extra), "?"))
            if kind == "G":  # collections: also what they freed
                freed[key] += extra // 10
            by[key][0] += 1
            by[key][1] += t1 - t0
    return {k: [v[0], round(v[1] * 1000, 1)] + ([freed[k]] if k in freed else [])
            for k, v in sorted(by.items(), key=lambda kv: -kv[1][1])}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--after", type=float, default=0.0, help="skip iterations in the first S seconds (start-up)")
    args = ap.parse_args(argv)
    with open(args.file) as f:
        events = [json.loads(line) for line in f]
    try:
        with open(args.file + ".names.json") as f:
            names = json.load(f)
    except FileNotFoundError:
        names = {}
    handled = [e for e in events if e[0] in ("H", "Q", "G")]
    probes = [e for e in events if e[0] == "P"]
    events = [e for e in events if e[0] not in ("H", "Q", "G", "P")]
    if not events:
        return
    for e in events:
        if e[0] == "L":  # a later slice: named by its function
            e[0], e[3] = "L:" + names.get(str(e[3]), "?").replace(".<locals>", ""), 0
    t_first = min(e[1] for e in events)
    rows = []
    for it in iterations(events):
        r = summary(it, t_first)
        r["_it"], r["_t0"] = it, it[0][1]
        rows.append(r)
    every = rows
    rows = [r for r in rows if r["t_s"] >= args.after]
    for r in sorted(rows, key=lambda r: -r["span_ms"])[:args.top]:
        it = r.pop("_it")
        found = inner(handled, it, names)
        if found:
            r["requests_over_1ms"] = found
        print(json.dumps(r))
    for t, lag_us in sorted(((e[1], e[3]) for e in probes if e[1] - t_first >= args.after), key=lambda x: -x[1])[:5]:
        # a late loop-lag probe: the iterations in the lag before it ran, longest first
        before = [r for r in every if t - lag_us / 1e6 - 0.001 <= r["_t0"] <= t]
        print(json.dumps({"probe_late_ms": round(lag_us / 1000, 1), "t_s": round(t - t_first, 3),
                          "iterations_in_it": [{k: v for k, v in r.items() if not k.startswith("_")}
                                               for r in sorted(before, key=lambda r: -r["span_ms"])[:3]]}))


if __name__ == "__main__":
    main()
