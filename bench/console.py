"""The console and lag tracking at scale: ``python -m bench.console [--groups 10000 --partitions 10]``.

Parts (``--parts``, default all):

* ``tracker`` (in-process): a GroupCoordinator holding ``groups`` x ``partitions`` committed offsets
  (each group its own topic: groups x partitions tracked partitions, the worst case), the lag
  tracker fed by a fake log-end source that answers at once. Reported: CPU per refresh (first
  refresh, and once the history is full), the RSS the tracker adds with a full history, the time
  to fold the per-group table (what the list and the metrics read) and to render the metrics in
  both ``lag_metrics`` modes (with their size).
* ``http`` (a real daemon, no data cluster): the same offsets committed over the wire, then the
  JSON endpoint's latency: ``/api/groups`` (first page; a rebuilt table, i.e. the first request
  after the 1 s cache, and a cached one; sorted by lag; filtered) and ``/api/group``.
* ``browser`` (the same daemon): headless Chromium opens the console; the time from navigation
  start to the first page of groups drawn (the page's own ``performance.mark``), 5 times.
* ``reader`` (a real Kafka broker as the data cluster, ``make reference-deps``; not in the default
  parts: it starts a JVM): ``reader_groups`` groups x ``partitions`` partitions, each group its own
  topic created on the broker with ``reader_records`` records per partition; a herd with
  ``--data-bootstrap-server`` pointing at it (the real reader: Metadata, ListOffsets per leader)
  refreshing every ``hb_refresh_ms``, the offsets committed to herd; then ``hb_groups`` x 3 members
  heartbeat for ``hb_seconds`` while the refreshes go on. Reported: the refreshes' duration and CPU
  (the daemon's own gauges), the daemon's CPU share and RSS, heartbeat latency, and the exact lag
  herd reports for one partition against what was produced.
* ``heartbeat``: heartbeat latency of ``hb_groups`` groups x 3 members (bench.loadgen) against a
  daemon holding the offsets, once without lag tracking and once with it (a fake source inside
  the daemon, ``--serve-fake``, refreshing every ``hb_refresh_ms``), same parameters.
"""
from __future__ import annotations

import asyncio
import json
import resource
import socket
import statistics
import sys
import threading
import time
import urllib.request

from bench._util import Herd, arg_parser, emit, environment, parse, percentiles, proc_cpu_seconds, proc_rss_bytes

ALL_PARTS = ("tracker", "http", "browser", "heartbeat")


# ---- a fake data cluster ---------------------------------------------------------------------------

class FakeSource:
    """Answers at once; every partition grows by 1 + (partition % 7) records per call."""

    def __init__(self):
        self.calls = 0

    async def fetch(self, partitions):
        self.calls += 1
        base = 1000 + 10 * self.calls
        return {tp: base * (1 + tp[1] % 7) for tp in partitions}


def serve_fake(argv: list[str]) -> int:
    """``herd serve`` with the fake source as its data cluster (this process only)."""
    from coordinator import cli
    from coordinator.ops import console

    console.make_source = lambda config: FakeSource()
    return cli.main(["serve", *argv])


# ---- tracker (in-process) -----------------------------------------------------------------------------

def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def commit_requests(groups: int, partitions: int):
    from protocol.messages import OffsetCommitRequest, OffsetCommitRequestPartition, OffsetCommitRequestTopic

    for g in range(groups):
        yield f"g{g:05d}", OffsetCommitRequest(
            group_id=f"g{g:05d}", generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
            retention_time_ms=-1,
            topics=[OffsetCommitRequestTopic(f"topic-{g:05d}", [
                OffsetCommitRequestPartition(p, 500 + p, -1, -1, "") for p in range(partitions)])])


def bench_tracker(groups: int, partitions: int, history: int) -> dict:
    import gc

    from coordinator.clock import ManualClock
    from coordinator.config import Config
    from coordinator.core.coordinator import GroupCoordinator
    from coordinator.ops.console import Console

    clock = ManualClock(wall_ms=int(time.time() * 1000))
    config = Config(lag_history_size=history).validate()
    gc_ = GroupCoordinator(config.group_config())
    gc_.loaded(clock.monotonic_ms(), clock.wall_ms())
    for i, (_, req) in enumerate(commit_requests(groups, partitions)):
        gc_.handle(8, 8, req, object(), clock.monotonic_ms(), clock.wall_ms() + i)
    gc.collect()
    rss0 = _rss()
    source = FakeSource()
    console = Console(config, gc_, clock=clock, source=source, now_ms=clock.monotonic_ms)
    console.table_ttl_s = 0
    ref = console.refresher
    cpu = []
    for _ in range(history + 5):  # past a full history
        clock.advance(config.lag_refresh_interval_ms)
        asyncio.run(ref.refresh())
        cpu.append(ref.last_cpu_s)
    gc.collect()
    rss1 = _rss()
    samples = sum(len(ends) // 8 for ends, _ in console.tracker.series.values())
    t = time.process_time()
    now, rows, lags = console.table()
    table_s = time.process_time() - t
    out = {"tracked_partitions": len(console.tracker), "samples": samples,
           "refresh_cpu_s": {"first": cpu[0], "full_history": statistics.median(cpu[-5:])},
           "tracker_rss_mb_full_history": (rss1 - rss0) / 2**20,
           "bytes_per_sample": (rss1 - rss0) / max(1, samples),
           "table_fold_cpu_s": table_s}
    for mode in ("partition", "group"):
        console.config = config.replace(lag_metrics=mode)
        t = time.process_time()
        lines = console.metric_lines()
        out[f"metrics_{mode}"] = {"cpu_s": time.process_time() - t, "lines": len(lines),
                                  "bytes": sum(len(x) + 1 for x in lines)}
    return out


# ---- a real daemon loaded with offsets --------------------------------------------------------------------

def load_offsets(bootstrap: str, groups: int, partitions: int, window: int = 500) -> float:
    """Commit every group's offsets over one connection, ``window`` requests in flight."""
    from bench.loadgen import encode_frame

    host, port = bootstrap.rsplit(":", 1)
    t = time.perf_counter()
    with socket.create_connection((host, int(port))) as s:
        frames = [encode_frame(req, 8, i, "bench-console") for i, (_, req) in
                  enumerate(commit_requests(groups, partitions))]
        buf = bytearray()
        answered = 0
        sent = 0
        while answered < len(frames):
            if sent < len(frames) and sent - answered < window:
                chunk = frames[sent:sent + window - (sent - answered)]
                s.sendall(b"".join(chunk))
                sent += len(chunk)
            data = s.recv(1 << 20)
            if not data:
                raise RuntimeError("herd closed the connection while loading")
            buf += data
            while len(buf) >= 4:
                n = int.from_bytes(buf[:4], "big")
                if len(buf) < 4 + n:
                    break
                del buf[:4 + n]
                answered += 1
    return time.perf_counter() - t


def http_get(port: int, path: str) -> tuple[float, bytes]:
    t = time.perf_counter()
    with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=30) as r:
        body = r.read()
    return (time.perf_counter() - t) * 1000, body


def bench_http(port: int, n: int) -> dict:
    out = {}
    cold = []
    for _ in range(min(n, 10)):  # a rebuilt table: the first request after the 1 s cache
        time.sleep(1.05)
        cold.append(http_get(port, "/api/groups?limit=50")[0])
    out["groups_first_page_table_rebuilt_ms"] = percentiles(cold)
    for name, path in (("groups_first_page_cached_ms", "/api/groups?limit=50"),
                       ("groups_sorted_by_lag_cached_ms", "/api/groups?limit=50&sort=lag&order=desc"),
                       ("groups_filtered_cached_ms", "/api/groups?limit=50&q=g012"),
                       ("group_detail_ms", "/api/group?id=g04242")):
        http_get(port, path)
        out[name] = percentiles([http_get(port, path)[0] for _ in range(n)])
    ms, body = http_get(port, "/api/groups?limit=50")
    out["groups_first_page_bytes"] = len(body)
    out["groups_total"] = json.loads(body)["total"]
    return out


def bench_browser(port: int, runs: int) -> dict:
    from tools.browser import Browser, missing

    reason = missing()
    if reason:
        return {"skipped": reason}
    marks, walls = [], []
    with Browser() as b:
        for _ in range(runs):
            b.goto("about:blank")
            t = time.perf_counter()
            b.goto(f"http://127.0.0.1:{port}/")
            b.wait_for("performance.getEntriesByName('herd:first-render').length > 0", 30_000)
            walls.append((time.perf_counter() - t) * 1000)
            marks.append(b.eval("performance.getEntriesByName('herd:first-render')[0].startTime"))
            rows = b.eval("document.querySelectorAll('tr.group-row').length")
    return {"first_page_rendered_ms": percentiles(marks), "driver_wall_ms": percentiles(walls),
            "rows_drawn": rows}


def bench_heartbeat(args) -> dict:
    from bench.loadgen import LoadGen

    out = {}
    lag_args = ["--data-bootstrap-server", "fake:9092", "--lag-refresh-interval-ms", str(args.hb_refresh_ms),
                "--lag-metrics", args.hb_lag_metrics]
    variants = [(f"{'with' if lag else 'without'}_lag_tracking{'_and_operator' if polled else ''}",
                 lag_args if lag else [], "fake" if lag else None, polled)
                for polled in (False, True) for lag in (False, True)
                if args.hb_variants == "all" or (polled, lag) == (False, True)]
    for label, extra, launcher, polled in variants:
        herd = Herd(fsync="never", topics=("bench:10",), extra_args=["--metrics-port", "0", *extra])
        if launcher:
            herd.command = _fake_command(herd)
        with herd:
            load_offsets(herd.bootstrap, args.groups, args.partitions)
            mport = herd.wait_metrics_port(30)
            cpu0, t0 = proc_cpu_seconds(herd.pid), time.monotonic()
            with LoadGen(herd.bootstrap, groups=args.hb_groups, members=3, procs=1,
                         group_prefix=f"hb-{label}", session_timeout_ms=60_000, rebalance_timeout_ms=60_000) as lg:
                lg.join()
                # an operator's setup meanwhile: Prometheus scrapes every 15 s, a console open
                # on the group list polls every 3 s
                stop = threading.Event()
                scrapes: list[float] = []

                def operator(stop=stop, mport=mport, scrapes=scrapes):
                    n = 0
                    while not stop.wait(3.0 if n else 0.5):
                        path = "/metrics" if n % 5 == 0 else "/api/groups?limit=50&sort=lag&order=desc"
                        ms, _ = http_get(mport, path)
                        if path == "/metrics":
                            scrapes.append(ms)
                        n += 1

                t = threading.Thread(target=operator, daemon=True)
                if polled:
                    t.start()
                try:
                    hb = lg.window(args.hb_seconds)
                finally:
                    stop.set()
                    if polled:
                        t.join(60)
            cpu = proc_cpu_seconds(herd.pid) - cpu0
            wall = time.monotonic() - t0
            text = http_get(mport, "/metrics")[1].decode()
            refreshes = [ln for ln in text.splitlines() if ln.startswith("herd_lag_refreshes_total")]
            out[label] = {"heartbeat_latency_ms": hb["latency_ms"], "errors": hb.get("errors"),
                          "daemon_cpu_fraction": cpu / wall, "rss_mb": proc_rss_bytes(herd.pid) / 2**20,
                          "lag_refreshes": int(refreshes[0].split()[1]) if refreshes else 0,
                          "metrics_scrape_ms": percentiles(scrapes), "metrics_bytes": len(text),
                          "loop_lag_max_s": _sample(text, "herd_event_loop_lag_max_seconds"),
                          "loop_lag_over_100ms": _sample(text, 'herd_event_loop_lag_seconds_bucket{le="+Inf"}')
                          - _sample(text, 'herd_event_loop_lag_seconds_bucket{le="0.1"}'),
                          "gc_pause_s": sum(float(ln.split()[-1]) for ln in text.splitlines()
                                            if ln.startswith("herd_gc_pause_seconds_total"))}
    return out


def bench_reader(args) -> dict:
    """The real reader against a real Kafka broker (small parameters: the broker is a 512 MB JVM)."""
    import tempfile

    from bench.loadgen import LoadGen

    try:
        from confluent_kafka import Producer
        from confluent_kafka.admin import AdminClient, NewTopic

        from tools.kafka_broker import KafkaBroker
    except ImportError as exc:
        return {"skipped": f"needs confluent-kafka and the reference jars (make reference-deps): {exc}"}
    groups, partitions = args.reader_groups, args.partitions
    topics = [f"topic-{g:05d}" for g in range(groups)]
    out: dict = {"groups": groups, "partitions": partitions, "tracked_partitions": groups * partitions}
    with tempfile.TemporaryDirectory(prefix="herd-bench-kafka-") as tmp, KafkaBroker(tmp) as kafka:
        admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
        t = time.perf_counter()
        for i in range(0, len(topics), 50):
            for f in admin.create_topics([NewTopic(n, partitions, 1) for n in topics[i:i + 50]]).values():
                f.result(120)
        out["kafka_topics_created_s"] = time.perf_counter() - t
        producer = Producer({"bootstrap.servers": kafka.bootstrap, "linger.ms": 5})
        for n in topics:
            for p in range(partitions):
                for _ in range(args.reader_records):
                    while True:
                        try:
                            producer.produce(n, b"x", partition=p)
                            break
                        except BufferError:  # the producer's queue is full: let it send
                            producer.poll(0.05)
            producer.poll(0)
        assert producer.flush(120) == 0
        herd = Herd(fsync="never", topics=("bench:10",), extra_args=[
            "--metrics-port", "0", "--data-bootstrap-server", kafka.bootstrap,
            "--lag-refresh-interval-ms", str(args.hb_refresh_ms), "--lag-metrics", args.hb_lag_metrics])
        with herd:
            load_offsets(herd.bootstrap, groups, partitions)  # committed 500 + p (see commit_requests)
            mport = herd.wait_metrics_port(30)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # every partition sampled once
                lag = json.loads(http_get(mport, "/api/groups?limit=1")[1])["lag"]
                if lag.get("last_success_ms") and lag.get("partitions") == groups * partitions:
                    break
                time.sleep(0.2)
            refreshes0 = lag.get("refreshes", 0)
            cpu0, t0 = proc_cpu_seconds(herd.pid), time.monotonic()
            with LoadGen(herd.bootstrap, groups=args.hb_groups, members=3, procs=1, group_prefix="hb-reader",
                         session_timeout_ms=60_000, rebalance_timeout_ms=60_000) as lg:
                lg.join()
                durations, cpus = [], []
                stop = threading.Event()

                def watch():
                    seen = None
                    while not stop.wait(0.25):
                        st = json.loads(http_get(mport, "/api/groups?limit=1")[1])["lag"]
                        if st.get("refreshes") != seen:
                            seen = st.get("refreshes")
                            durations.append(st["last_duration_s"] * 1000)
                            cpus.append(st["last_cpu_s"] * 1000)

                w = threading.Thread(target=watch, daemon=True)
                w.start()
                try:
                    hb = lg.window(args.hb_seconds)
                finally:
                    stop.set()
                    w.join(30)
            cpu = proc_cpu_seconds(herd.pid) - cpu0
            wall = time.monotonic() - t0
            text = http_get(mport, "/metrics")[1].decode()
            detail = json.loads(http_get(mport, "/api/group?id=g00000")[1])
            p0 = next(p for p in detail["partitions"] if p["partition"] == 0)
            out.update({
                "refresh_ms": percentiles(durations), "refresh_cpu_ms": percentiles(cpus),
                "refreshes_during_window": int(_sample(text, "herd_lag_refreshes_total")) - refreshes0,
                "refresh_failures": int(_sample(text, "herd_lag_refresh_failures_total")),
                "source_up": int(_sample(text, "herd_lag_source_up")),
                "heartbeat_latency_ms": hb["latency_ms"], "heartbeat_errors": hb.get("errors"),
                "daemon_cpu_fraction": cpu / wall, "rss_mb": proc_rss_bytes(herd.pid) / 2**20,
                "lag_check": {"log_end": p0["log_end"], "committed": p0["committed"], "lag": p0["lag"],
                              "expected_lag": args.reader_records - 500 if args.reader_records > 500 else 0},
            })
    return out


def _sample(text: str, name: str) -> float:
    """The value of the sample named exactly ``name`` (labels included) in an exposition."""
    for ln in text.splitlines():
        if ln.rsplit(" ", 1)[0] == name:
            return float(ln.rsplit(" ", 1)[1])
    return float("nan")


def _fake_command(herd: Herd):
    base = Herd.command

    def command():
        cmd = base(herd)
        i = cmd.index("coordinator")
        return cmd[:i] + ["bench.console", "--serve-fake"] + cmd[i + 2:]  # drop "coordinator serve"
    return command


def main(argv=None):
    ap = arg_parser("bench.console", "console and lag tracking at scale",
                    quick="1,000 groups, short windows (make bench with HERD_BENCH_QUICK)")
    ap.add_argument("--groups", type=int, default=10_000)
    ap.add_argument("--partitions", type=int, default=10)
    ap.add_argument("--history", type=int, default=30)
    ap.add_argument("--requests", type=int, default=50, help="per JSON endpoint measured")
    ap.add_argument("--browser-runs", type=int, default=5)
    ap.add_argument("--hb-groups", type=int, default=300)
    ap.add_argument("--hb-seconds", type=float, default=20.0)
    ap.add_argument("--hb-refresh-ms", type=int, default=2000)
    ap.add_argument("--hb-lag-metrics", default="partition", choices=("partition", "group"))
    ap.add_argument("--hb-variants", default="all", choices=("all", "lag-only"))
    ap.add_argument("--reader-groups", type=int, default=100, help="groups (topics) of the reader part")
    ap.add_argument("--reader-records", type=int, default=600, help="records per partition, reader part")
    ap.add_argument("--parts", default=",".join(ALL_PARTS),
                    help=f"comma-separated, of {', '.join(ALL_PARTS)} and reader (a real Kafka broker)")
    args = parse(ap, argv)
    if args.quick:
        args.groups, args.requests, args.browser_runs, args.hb_groups, args.hb_seconds = 1000, 20, 2, 100, 5.0
    parts = [p for p in args.parts.split(",") if p]
    result = {"bench": "console", "params": {k: v for k, v in vars(args).items()}, "environment": environment()}
    if "tracker" in parts:
        result["tracker"] = bench_tracker(args.groups, args.partitions, args.history)
    if "http" in parts or "browser" in parts:
        with Herd(fsync="never", topics=("bench:10",), extra_args=["--metrics-port", "0"]) as herd:
            result["load_seconds"] = load_offsets(herd.bootstrap, args.groups, args.partitions)
            mport = herd.wait_metrics_port(30)
            result["daemon_rss_mb_loaded"] = proc_rss_bytes(herd.pid) / 2**20
            if "http" in parts:
                result["http"] = bench_http(mport, args.requests)
            if "browser" in parts:
                result["browser"] = bench_browser(mport, args.browser_runs)
    if "heartbeat" in parts:
        result["heartbeat"] = bench_heartbeat(args)
    if "reader" in parts:
        result["reader"] = bench_reader(args)
    emit(result)
    return None


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-fake":
        sys.exit(serve_fake(sys.argv[2:]))
    sys.exit(main(sys.argv[1:]))
