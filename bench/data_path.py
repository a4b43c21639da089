"""The data path: records read from a real Kafka broker by N ``KafkaGroupConsumer`` members with herd
coordinating the group, against N plain confluent-kafka consumers whose group the broker itself
coordinates, on the same topic of the same broker (issue 29).

``python -m bench.data_path [--quick] [--records 1000000] [--partitions 8] [--ns 1,4] [--rate 5000]
[--latency-seconds 10] [--value-bytes 100] [--session-ms 6000] [--kafka-heap 1g]``

One Kafka 4.x broker (tools/kafka_broker.py, ``make reference-deps``) and one herd daemon
(``--data-bootstrap-server`` the broker, fsync=always), both with group.initial.rebalance.delay.ms
3000 so that N members started together join one generation. Members are processes
(``tools.kafka_member``), ``max.poll.records`` 500 (the same batch for the plain consumer's
``consume``), auto-commit every 5 s, eager range assignment. For each mode and N:

* ``records_per_s``: ``--records`` records (``--value-bytes`` each, keyed) are produced first; the N
  members subscribe together (a start barrier) from the earliest offset; records / seconds from the
  first record any member returned to the moment the last of them was returned.
* ``latency_ms``: then ``--rate`` records/s are produced for ``--latency-seconds``: p50/p99/max of
  (time a member's poll returned it) - (its timestamp), the first and every 5th record of each
  batch sampled. The topics use LogAppendTime: the timestamp is the broker's append, so this is the
  broker-to-application latency, the producer's queueing left out.
* ``herd_cpu_s`` (herd mode): the daemon's CPU seconds over both phases; ``broker_cpu_s``: the
  broker's (it serves the fetches in both modes, and the group in plain mode); ``members_cpu_s``.
* ``--messages``: also N members reading with ``KafkaGroupConsumer.poll_messages`` (librdkafka's
  ``Message`` objects as they are, no ``Record`` per record), mode ``herd-messages``.
* ``failover_s`` (N = 4): while ``--rate`` records/s are produced, one member is SIGKILLed; seconds
  from its death until another member returns a record of one of its partitions, with the same
  session timeout (``--session-ms``) for both coordinators.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from bench import _util as U

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

DELAY_MS = 3000


def create_topic(bootstrap, name, partitions):
    """The topic with LogAppendTime timestamps: a record's timestamp is the broker's append, so the
    latency measured is the consumer side's (broker to poll), not the producer's queueing."""
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(name, partitions, 1, config={"message.timestamp.type": "LogAppendTime"})],
                        operation_timeout=30)[name].result(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        md = admin.list_topics(name, timeout=10).topics[name]
        if md.error is None and len(md.partitions) == partitions and all(p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.1)
    raise RuntimeError(f"topic {name} not ready on {bootstrap}")


def produce_bulk(bootstrap, topic, count, value_bytes):
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000,
                  "queue.buffering.max.messages": 1000000, "compression.type": "none"})
    value = b"x" * value_bytes
    for i in range(count):
        while True:
            try:
                p.produce(topic, value, b"k%d" % i)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120) != 0:
        raise RuntimeError("records not all acknowledged")


class RateProducer(threading.Thread):
    """``rate`` records/s in 1 ms slices, linger 1 ms."""

    def __init__(self, bootstrap, topic, rate, value_bytes):
        super().__init__(daemon=True)
        from confluent_kafka import Producer

        self.p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 1})
        self.topic, self.rate, self.value = topic, rate, b"y" * value_bytes
        self.stop_ev = threading.Event()
        self.sent = 0

    def run(self):
        t0 = time.monotonic()
        i = 0
        while not self.stop_ev.is_set():
            due = int((time.monotonic() - t0) * self.rate)
            while i < due:
                self.p.produce(self.topic, self.value, b"r%d" % i)
                i += 1
            self.p.poll(0)
            time.sleep(0.001)
        self.p.flush(30)
        self.sent = i

    def stop(self):
        self.stop_ev.set()
        self.join(60)


class Group:
    """N member processes of one mode, with traces and summaries in ``tmp``."""

    def __init__(self, tmp: Path, mode, n, herd_bootstrap, kafka, topic, group, session_ms, reset="earliest",
                 sample_every=5):
        self.tmp, self.mode, self.n = tmp, mode, n
        self.barrier = tmp / f"{group}.go"
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.procs = []
        for i in range(n):
            cmd = [sys.executable, "-m", "tools.kafka_member", "--mode", mode, "--kafka", kafka, "--group", group,
                   "--topic", topic, "--trace", str(tmp / f"{group}.{i}.trace"), "--summary",
                   str(tmp / f"{group}.{i}.json"), "--reset", reset, "--session-ms", str(session_ms),
                   "--heartbeat-ms", str(max(100, session_ms // 6)), "--auto-commit-ms", "5000",
                   "--max-poll-records", "500", "--sample-every", str(sample_every), "--strategy", "range",
                   "--wait-file", str(self.barrier), "--light-trace"]
            if mode.startswith("herd"):
                cmd += ["--herd", herd_bootstrap]
            self.procs.append(subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=open(tmp / f"{group}.{i}.out", "wb"),
                                               stderr=subprocess.STDOUT))
        self.group = group

    def go(self):
        time.sleep(1.5)  # imports and connections: the barrier only orders the subscriptions
        self.barrier.touch()

    def trace(self, i):
        path = self.tmp / f"{self.group}.{i}.trace"
        return [line.split() for line in path.read_text().splitlines()] if path.exists() else []

    def batches(self):
        """[(ns, member, partition, n)] of every D line, in time order."""
        out = []
        for i in range(self.n):
            for ev in self.trace(i):
                if ev[0] == "D":
                    out.append((int(ev[1]), i, int(ev[2]), int(ev[5])))
        out.sort()
        return out

    def owned(self, i):
        parts = set()
        for ev in self.trace(i):
            ps = {int(p) for p in ev[2].split(",") if p} if len(ev) > 2 else set()
            if ev[0] == "A":
                parts |= ps
            elif ev[0] in "RL":
                parts -= ps
        return parts

    def wait_records(self, total, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            b = self.batches()
            if sum(x[3] for x in b) >= total:
                return b
            for i, p in enumerate(self.procs):
                if p.poll() is not None:
                    raise RuntimeError(f"member {i} exited: {(self.tmp / f'{self.group}.{i}.out').read_text()[-2000:]}")
            time.sleep(0.2)
        raise RuntimeError(f"{self.mode} N={self.n}: not {total} records within {timeout}s")

    def wait_assigned(self, timeout=60):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(self.owned(i) for i in range(self.n)):
                return
            time.sleep(0.1)
        raise RuntimeError(f"{self.mode} N={self.n}: members not all assigned within {timeout}s")

    def cpu(self):
        total = 0.0
        for p in self.procs:
            try:
                total += U.proc_cpu_seconds(p.pid)
            except OSError:
                pass
        return total

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in self.procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)

    def summaries(self):
        import json

        out = []
        for i in range(self.n):
            path = self.tmp / f"{self.group}.{i}.json"
            if path.exists():
                out.append(json.loads(path.read_text()))
        return out


def run_cell(args, mode, n, herd, broker, tmp, cell):
    topic = f"dp-{cell}"
    produce_bulk(broker.bootstrap, topic, args.records, args.value_bytes)
    herd_pid = herd.pid
    g = Group(tmp, mode, n, herd.bootstrap, broker.bootstrap, topic, f"g-{cell}", args.session_ms)
    try:
        herd_cpu0, broker_cpu0 = U.proc_cpu_seconds(herd_pid), U.proc_cpu_seconds(broker.pid)
        g.go()
        batches = g.wait_records(args.records, timeout=600)
        t_first = batches[0][0]
        count = 0
        for ns, _i, _p, k in batches:
            count += k
            if count >= args.records:
                t_done = ns
                break
        seconds = (t_done - t_first) / 1e9
        # latency phase
        lat_start = time.monotonic()
        prod = RateProducer(broker.bootstrap, topic, args.rate, args.value_bytes)
        prod.start()
        time.sleep(args.latency_seconds)
        prod.stop()
        g.wait_records(args.records + prod.sent, timeout=120)
        members_cpu = g.cpu()
        herd_cpu = U.proc_cpu_seconds(herd_pid) - herd_cpu0
        broker_cpu = U.proc_cpu_seconds(broker.pid) - broker_cpu0
    finally:
        g.stop()
    lats = [ms for s in g.summaries() for (t, ms) in s["latency_ms"] if t >= lat_start]
    row = {"mode": mode, "n": n, "records": args.records, "seconds": seconds,
           "records_per_s": args.records / seconds if seconds > 0 else None,
           "latency_ms": U.percentiles(lats, (50, 99)), "latency_records": prod.sent,
           "broker_cpu_s": broker_cpu, "members_cpu_s": members_cpu}
    if mode.startswith("herd"):
        row["herd_cpu_s"] = herd_cpu
    return row


def failover(args, mode, herd, broker, tmp, cell):
    topic = f"dp-fo-{cell}"
    g = Group(tmp, mode, 4, herd.bootstrap, broker.bootstrap, topic, f"g-fo-{cell}", args.session_ms,
              reset="latest", sample_every=1000)
    prod = RateProducer(broker.bootstrap, topic, args.rate, args.value_bytes)
    try:
        g.go()
        g.wait_assigned()
        prod.start()
        g.wait_records(args.rate, timeout=60)  # flowing to every member
        victim_parts = g.owned(0)
        g.procs[0].send_signal(signal.SIGKILL)
        g.procs[0].wait(10)
        dead_ns = time.monotonic_ns()
        deadline = time.monotonic() + args.session_ms / 1000 * 3 + 30
        flowing = None
        while time.monotonic() < deadline and flowing is None:
            for ns, i, p, _k in g.batches():
                if i != 0 and p in victim_parts and ns > dead_ns:
                    flowing = ns
                    break
            time.sleep(0.05)
        if flowing is None:
            raise RuntimeError(f"{mode}: the killed member's partitions did not flow again")
        return {"mode": mode, "session_ms": args.session_ms, "partitions_moved": len(victim_parts),
                "failover_s": (flowing - dead_ns) / 1e9}
    finally:
        prod.stop()
        g.procs[0] = subprocess.Popen(["true"])  # the killed one is gone: nothing to stop
        g.stop()


def summarize(rows: list) -> list:
    """Per mode and N: the runs' median, lowest and highest records/s, and herd's median over plain's."""
    import statistics

    by: dict = {}
    for r in rows:
        if r["records_per_s"]:
            by.setdefault((r["mode"], r["n"]), []).append(r["records_per_s"])
    out = []
    for (mode, n), rates in sorted(by.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        out.append({"mode": mode, "n": n, "runs": len(rates), "median_records_per_s": statistics.median(rates),
                    "min_records_per_s": min(rates), "max_records_per_s": max(rates)})
    plain = {x["n"]: x["median_records_per_s"] for x in out if x["mode"] == "plain"}
    for x in out:
        if x["mode"] != "plain" and plain.get(x["n"]):
            x["vs_plain_median"] = round(x["median_records_per_s"] / plain[x["n"]], 3)
    return out


def main(argv=None):
    ap = U.arg_parser("bench.data_path", __doc__.splitlines()[0],
                      "200,000 records, 5 s of latency load")
    ap.add_argument("--records", type=int, default=None)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--ns", default="1,4")
    ap.add_argument("--rate", type=int, default=5000)
    ap.add_argument("--latency-seconds", type=float, default=None)
    ap.add_argument("--value-bytes", type=int, default=100)
    ap.add_argument("--session-ms", type=int, default=6000)
    ap.add_argument("--kafka-heap", default="1g")
    ap.add_argument("--no-failover", action="store_true")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run every cell this many times, the order alternating; the summary gives each "
                         "mode's median records/s and its spread, and the ratio of the medians")
    ap.add_argument("--messages", action="store_true",
                    help="also N members reading with KafkaGroupConsumer.poll_messages (librdkafka's Message objects)")
    args = U.parse(ap, argv, {"records": (200_000, 1_000_000), "latency_seconds": (5.0, 10.0)})
    ns = [int(x) for x in args.ns.split(",")]
    from tools.kafka_broker import KafkaBroker

    result = {"bench": "data_path", "params": vars(args), **U.environment(), "client_versions": U.client_versions()}
    rows, fails = [], []
    with tempfile.TemporaryDirectory(prefix="bench-data-path-", dir=U.default_tmp_root()) as tmpd:
        tmp = Path(tmpd)
        overrides = {"group.initial.rebalance.delay.ms": DELAY_MS, "num.network.threads": 3, "num.io.threads": 4,
                     "group.min.session.timeout.ms": 1000}
        with KafkaBroker(tmp / "kafka", overrides, heap=args.kafka_heap, start_timeout=180) as broker:
            # the topics exist in the data cluster before herd starts; --topic gives herd their
            # partition counts when it does not read them from the data cluster itself
            # the order alternates (plain first for the first N) so that neither side always runs first
            one = [(n, mode) for i, n in enumerate(ns) for mode in (("plain", "herd") if i % 2 == 0 else
                                                                     ("herd", "plain"))]
            if args.messages:
                one += [(n, "herd-messages") for n in ns]
            cells = []
            for r in range(max(1, args.repeat)):
                cells += one if r % 2 == 0 else one[::-1]
            topics = [f"dp-{i + 1}" for i in range(len(cells))]
            topics += [f"dp-fo-{len(cells) + i + 1}" for i in range(2)]
            for t in topics:
                create_topic(broker.bootstrap, t, args.partitions)
            with U.Herd(fsync="always", topics=[f"{t}:{args.partitions}" for t in topics],
                        initial_rebalance_delay_ms=DELAY_MS, log_level="warning",
                        extra_args=["--data-bootstrap-server", broker.bootstrap, "--min-session-timeout-ms", "1000"]
                        ) as herd:
                cell = 0
                for n, mode in cells:
                    cell += 1
                    print(f"data_path: {mode} N={n}", file=sys.stderr, flush=True)
                    rows.append(run_cell(args, mode, n, herd, broker, tmp, cell))
                if not args.no_failover:
                    for mode in ("herd", "plain"):
                        cell += 1
                        print(f"data_path: failover {mode}", file=sys.stderr, flush=True)
                        fails.append(failover(args, mode, herd, broker, tmp, cell))
    summary = summarize(rows)
    if max(1, args.repeat) == 1:
        for n in ns:
            p = next(r for r in rows if r["mode"] == "plain" and r["n"] == n)
            for h in (r for r in rows if r["mode"].startswith("herd") and r["n"] == n):
                h["vs_plain_records_per_s"] = h["records_per_s"] / p["records_per_s"] if p["records_per_s"] else None
    result["throughput_latency"] = rows
    result["summary"] = summary
    result["failover"] = fails
    text = U.table([[r["mode"], r["n"], round(r["records_per_s"] or 0), r["latency_ms"]["p50"], r["latency_ms"]["p99"],
                     r.get("herd_cpu_s"), r["broker_cpu_s"], r["members_cpu_s"]] for r in rows],
                   ["mode", "N", "records/s", "p50 ms", "p99 ms", "herd cpu s", "broker cpu s", "members cpu s"])
    if args.repeat > 1:
        text += "\n" + U.table([[x["mode"], x["n"], x["runs"], round(x["median_records_per_s"]),
                                 round(x["min_records_per_s"]), round(x["max_records_per_s"]),
                                 x.get("vs_plain_median")] for x in summary],
                                ["mode", "N", "runs", "median rec/s", "min", "max", "vs plain (medians)"])
    if fails:
        text += "\n" + U.table([[f["mode"], f["session_ms"], f["failover_s"]] for f in fails],
                               ["failover", "session ms", "s to flowing"])
    U.emit(result, text)
    return None


if __name__ == "__main__":
    main(sys.argv[1:])
