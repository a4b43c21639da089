"""One consumer process reading records of a Kafka topic, for the KafkaGroupConsumer tests and
``bench.data_path``: either a ``KafkaGroupConsumer`` (herd coordinating, ``--mode herd``) or a plain
confluent-kafka consumer subscribed through the broker's own group coordinator (``--mode plain``).

    python -m tools.kafka_member --mode herd --herd 127.0.0.1:9092 --kafka 127.0.0.1:9093 \\
        --group g --topic t --trace /tmp/m1.trace [--summary /tmp/m1.json]

The trace (one line per event, written and flushed before the event's callback returns, times from
CLOCK_MONOTONIC, which every process of the machine shares):

    A <ns> <p,p,...>                 partitions assigned (after the listener's work)
    R <ns> <p,p,...>                 partitions revoked (written before the callback returns)
    L <ns> <p,p,...>                 partitions lost
    D <ns> <p> <first> <last> <n>    a poll returned n records of partition p, first..last
    X <ns> <p> <offset> <previous>   an offset that did not follow the previous one of p
    C <ns>                           closed

SIGTERM closes the consumer (commit, revocation, leave) and exits 0; SIGKILL is the crash.
``--summary`` writes JSON at exit: records, seconds from the first to the last record, and sampled
end-to-end latencies as [monotonic s, ms] pairs (now minus the record's producer timestamp).
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from collections import Counter
from operator import attrgetter, methodcaller

_stop = False
_MSG, _PART = attrgetter("_m"), methodcaller("partition")


def _on_term(*_):
    global _stop
    _stop = True


class Trace:
    def __init__(self, path, light=False):
        self.light = light
        self.f = open(path, "a", buffering=1) if path else None
        self.last: dict[int, int] = {}

    def event(self, kind, parts):
        if self.f:
            ps = ",".join(str(p) for p in sorted(parts))
            self.f.write(f"{kind} {time.monotonic_ns()} {ps}\n")
            self.f.flush()
            os.fsync(self.f.fileno())
        if kind in "RL":
            for p in parts:
                self.last.pop(p, None)

    def batch(self, records, part, off):
        """``part`` / ``off``: the partition / offset getters of one record (a Record or a Message).
        ``light``: counts per partition only (first and last written as -1), no per-record loop in
        Python (the benchmark's form)."""
        if not self.f:
            return
        now = time.monotonic_ns()
        lines = []
        if self.light:
            counts = Counter(map(_PART, map(_MSG, records))) if records and hasattr(records[0], "_m") else \
                Counter(map(part, records))
            for p, n in counts.items():
                lines.append(f"D {now} {p} -1 -1 {n}\n")
        else:
            by_p: dict[int, list] = {}
            for r in records:
                by_p.setdefault(part(r), []).append(off(r))
            for p, offs in by_p.items():
                prev = self.last.get(p)
                for o in offs:
                    if prev is not None and o != prev + 1:
                        lines.append(f"X {now} {p} {o} {prev}\n")
                    prev = o
                self.last[p] = prev
                lines.append(f"D {now} {p} {offs[0]} {offs[-1]} {len(offs)}\n")
        self.f.write("".join(lines))
        self.f.flush()


def _barrier(path, timeout=120.0):
    deadline = time.monotonic() + timeout
    while path and not os.path.exists(path) and time.monotonic() < deadline and not _stop:
        time.sleep(0.005)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.kafka_member")
    ap.add_argument("--mode", choices=("herd", "herd-messages", "plain"), default="herd",
                    help="herd-messages: KafkaGroupConsumer.poll_messages (librdkafka's Message objects)")
    ap.add_argument("--herd", help="herd's bootstrap (mode herd)")
    ap.add_argument("--kafka", required=True, help="the data cluster's bootstrap")
    ap.add_argument("--group", required=True)
    ap.add_argument("--topic", required=True)
    ap.add_argument("--trace")
    ap.add_argument("--summary")
    ap.add_argument("--reset", default="earliest")
    ap.add_argument("--session-ms", type=int, default=6000)
    ap.add_argument("--heartbeat-ms", type=int, default=1000)
    ap.add_argument("--auto-commit-ms", type=int, default=500)
    ap.add_argument("--max-poll-records", type=int, default=500)
    ap.add_argument("--strategy", default=None, help="partition.assignment.strategy")
    ap.add_argument("--stop-after", type=int, default=0, help="exit after this many records (0: never)")
    ap.add_argument("--idle-exit", type=float, default=0.0, help="exit after this long without records")
    ap.add_argument("--sample-every", type=int, default=10, help="latency: one record in N")
    ap.add_argument("--light-trace", action="store_true", help="D lines with counts only (no offsets)")
    ap.add_argument("--wait-file", help="subscribe only once this file exists (a start barrier)")
    a = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, _on_term)
    signal.signal(signal.SIGINT, _on_term)
    trace = Trace(a.trace, a.light_trace)
    lat: list[int] = []
    count = 0
    first = last = None

    if a.mode in ("herd", "herd-messages"):
        from client import KafkaGroupConsumer

        cfg = {"auto.offset.reset": a.reset, "session.timeout.ms": a.session_ms,
               "heartbeat.interval.ms": a.heartbeat_ms, "auto.commit.interval.ms": a.auto_commit_ms,
               "max.poll.records": a.max_poll_records}
        if a.strategy:
            cfg["partition.assignment.strategy"] = a.strategy

        class Listener:
            def on_partitions_assigned(self, parts):
                trace.event("A", [tp.partition for tp in parts])

            def on_partitions_revoked(self, parts):
                trace.event("R", [tp.partition for tp in parts])

            def on_partitions_lost(self, parts):
                trace.event("L", [tp.partition for tp in parts])

        consumer = KafkaGroupConsumer(a.herd, a.group, a.kafka, cfg)
        _barrier(a.wait_file)
        consumer.subscribe([a.topic], Listener())
        poll = consumer.poll if a.mode == "herd" else consumer.poll_messages
        # the trace reads librdkafka's message under each Record, as the plain mode reads its Message:
        # the tracing costs the same in both modes (a Record's own fields are Python properties)
        _msg, _part, _off = attrgetter("_m"), methodcaller("partition"), methodcaller("offset")

        def part(r):
            return _part(_msg(r))

        def off(r):
            return _off(_msg(r))

        stamp = attrgetter("timestamp_ms")
        if a.mode == "herd-messages":
            part, off = methodcaller("partition"), methodcaller("offset")

            def stamp(m):
                return m.timestamp()[1]
    else:
        from confluent_kafka import Consumer

        conf = {"bootstrap.servers": a.kafka, "group.id": a.group, "auto.offset.reset": a.reset,
                "session.timeout.ms": a.session_ms, "heartbeat.interval.ms": a.heartbeat_ms,
                "auto.commit.interval.ms": a.auto_commit_ms, "enable.partition.eof": False}
        if a.strategy:
            conf["partition.assignment.strategy"] = a.strategy
        consumer = Consumer(conf)

        def on_assign(c, parts):
            trace.event("A", [p.partition for p in parts])

        def on_revoke(c, parts):
            trace.event("R", [p.partition for p in parts])

        def on_lost(c, parts):
            trace.event("L", [p.partition for p in parts])

        _barrier(a.wait_file)
        consumer.subscribe([a.topic], on_assign=on_assign, on_revoke=on_revoke, on_lost=on_lost)
        n = a.max_poll_records

        def poll(timeout):  # the Message objects as confluent-kafka returns them
            msgs = consumer.consume(n, 0)
            if not msgs:
                msgs = consumer.consume(1, timeout)
                if msgs and n > 1:
                    msgs += consumer.consume(n - 1, 0)
            return [m for m in msgs if m.error() is None]

        part, off = methodcaller("partition"), methodcaller("offset")

        def stamp(m):
            return m.timestamp()[1]

    idle_since = time.monotonic()
    every = max(1, a.sample_every)
    try:
        while not _stop:
            records = poll(0.2)
            if not records:
                if a.idle_exit and count and time.monotonic() - idle_since > a.idle_exit:
                    break
                continue
            now = time.monotonic()
            idle_since = now
            if first is None:
                first = now
            last = now
            wall_ms = time.time() * 1000.0
            lat.extend((now, wall_ms - stamp(r)) for r in records[::every])
            count += len(records)
            trace.batch(records, part, off)
            if a.stop_after and count >= a.stop_after:
                break
    finally:
        consumer.close()
        trace.event("C", [])
        if a.summary:
            with open(a.summary, "w") as f:
                json.dump({"records": count, "seconds": (last - first) if first and last else 0.0,
                           "first_mono": first, "last_mono": last, "latency_ms": lat}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
