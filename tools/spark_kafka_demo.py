"""``make demo-spark-kafka``: a PySpark job reads a real Kafka topic, herd coordinating its tasks,
and survives a hard-killed task.

    python -m tools.spark_kafka_demo [--records 200000] [--partitions 8] [--tasks 4] [--no-kill]

1. starts a real Kafka broker (tools/kafka_broker.py, the reference tests' broker; its jars come
   from ``make reference-deps``) and herd with ``--data-bootstrap-server`` pointing at it and its
   metrics endpoint on;
2. produces ``--records`` keyed records (``key-<i>`` / ``value-<i>``) over ``--partitions``
   partitions;
3. runs a ``local[N,4]`` PySpark job of N tasks, each a ``KafkaGroupConsumer`` member of one herd
   group (``client.spark.KafkaGroupJob``) reading the topic to its end offsets at the start:
   ``process(records)`` appends each batch to per-partition files (fsynced), then the positions
   are committed to herd;
4. SIGKILLs one task's Python worker mid-way -- after it wrote a batch, before its commit -- so
   its partitions move to the other members after the session timeout (and Spark retries it);
5. checks every record: each (partition, offset) of the topic and each ``value-<i>`` in the output
   (0 missing), counts the duplicates (the killed task's written-but-uncommitted batch, read again
   by its successor, plus batches whose commit failed in a rebalance) and reads herd's lag for the
   group from its metrics (``herd_group_sum_lag``, 0 at the end);
6. prints one summary. Exits 1 if a record is missing, the lag does not reach 0 or the job failed.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tools import spark_demo_common as common

REPO = Path(__file__).resolve().parents[1]


class RecordWriter:
    """``process(records)`` of the demo: one line ``<partition> <offset> <value>`` per record in
    ``out_dir/p<NNN>-pid<PID>.out``, fsynced before it returns. The victim (Spark partition
    ``kill_task``, first attempt) writes its pid to ``pid_file`` after its ``kill_after``-th batch
    and waits there to be killed: that batch is written but not committed."""

    def __init__(self, out_dir, pid_file, kill_task: int | None = 1, kill_after: int = 20):
        self.out_dir, self.pid_file = str(out_dir), str(pid_file)
        self.kill_task, self.kill_after = kill_task, kill_after
        self._info = None
        self._batches = 0
        self._files: dict = {}

    def __getstate__(self):
        return {k: self.__dict__[k] for k in ("out_dir", "pid_file", "kill_task", "kill_after")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._info, self._batches, self._files = None, 0, {}

    def on_start(self, info) -> None:
        self._info = info
        self._batches = 0

    def __call__(self, records) -> None:
        by_p: dict = {}
        for r in records:
            by_p.setdefault(r.partition, []).append(f"{r.partition} {r.offset} {r.value.decode()}\n")
        for p, lines in by_p.items():
            f = self._files.get(p)
            if f is None:
                f = self._files[p] = open(os.path.join(self.out_dir, f"p{p:03d}-pid{os.getpid()}.out"), "a")
            f.write("".join(lines))
            f.flush()
            os.fsync(f.fileno())
        self._batches += 1
        common.park_if_victim(self._info, self.kill_task, self._batches, self.kill_after, self.pid_file,
                              f"{os.getpid()} {len(records)} {sorted(by_p)}\n")


def produce(bootstrap: str, topic: str, partitions: int, records: int, create_topic: bool = True) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    if create_topic:
        admin = AdminClient({"bootstrap.servers": bootstrap})  # kept alive until the answer
        admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(60)
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, "batch.num.messages": 10000,
                  "queue.buffering.max.messages": 1000000})
    for i in range(records):
        while True:
            try:
                p.produce(topic, b"value-%d" % i, b"key-%d" % i)
                break
            except BufferError:
                p.poll(0.05)
    if p.flush(120) != 0:
        raise RuntimeError("not every record was acknowledged by the broker")


def verify(out_dir: Path, ends: dict, records: int) -> dict:
    """Every (partition, offset) below its end and every value-<i> in the output?"""
    seen: dict = {}
    values: set = set()
    wrong = 0
    rows, torn = common.read_output(out_dir)
    for key, value in rows:
        seen[key] = seen.get(key, 0) + 1
        m = re.fullmatch(r"value-(\d+)", value)
        if m is None:
            wrong += 1
        else:
            values.add(int(m.group(1)))
    want = {(tp.partition, o) for tp, end in ends.items() for o in range(end)}
    missing = sorted(want - set(seen))
    return {"expected": len(want), "unique": len(seen), "processed": sum(seen.values()),
            "duplicates": sum(c - 1 for c in seen.values()), "missing": len(missing),
            "missing_sample": missing[:10], "values_missing": records - len(values & set(range(records))),
            "beyond_end": len(set(seen) - want), "torn_lines": torn, "wrong": wrong}


def herd_lag(metrics_url: str, group: str) -> int | None:
    """``herd_group_sum_lag`` of ``group`` from herd's /metrics (None when not reported)."""
    with urllib.request.urlopen(f"{metrics_url}/metrics", timeout=10) as r:
        text = r.read().decode()
    m = re.search(r'^herd_group_sum_lag\{group="' + re.escape(group) + r'"\} (\d+)', text, re.M)
    return int(m.group(1)) if m else None


@dataclass
class KafkaDemoResult:
    ends: dict
    check: dict = field(default_factory=dict)
    stats: list = field(default_factory=list)
    error: str | None = None
    killed_pid: int | None = None
    killed_batch: int = 0
    victim_partitions: list = field(default_factory=list)
    recovered_after_s: float | None = None
    job_seconds: float = 0.0
    lag: int | None = None
    committed: dict = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (self.error is None and self.check.get("missing") == 0 and self.check.get("values_missing") == 0
                and self.check.get("wrong") == 0 and self.lag == 0)


def run_kafka_demo(spark, herd_bootstrap: str, kafka_bootstrap: str, workdir: Path, *, metrics_url: str | None,
                   group: str = "spark-kafka-demo", topic: str = "events", partitions: int = 8,
                   records: int = 200_000, tasks: int = 4, max_poll_records: int = 500, kill: bool = True,
                   kill_after: int = 20, session_timeout_ms: int = 6000, timeout_s: float = 300.0,
                   log=print, create_topic: bool = True) -> KafkaDemoResult:
    from client.spark import KafkaGroupJob, group_offsets

    workdir = Path(workdir)
    out_dir = workdir / "out"
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir(parents=True)
    pid_file = workdir / "victim.pid"
    pid_file.unlink(missing_ok=True)
    t0 = time.monotonic()
    produce(kafka_bootstrap, topic, partitions, records, create_topic)
    log(f"t={time.monotonic() - t0:5.1f}s  produced {records} keyed records to {topic} ({partitions} partitions) "
        f"on the Kafka broker {kafka_bootstrap}")
    job = KafkaGroupJob(herd_bootstrap, group, kafka_bootstrap, [topic], max_poll_records=max_poll_records,
                        task_timeout_s=timeout_s,
                        config={"session.timeout.ms": session_timeout_ms,
                                "heartbeat.interval.ms": max(100, session_timeout_ms // 6)})
    ends = job.resolve()
    result = KafkaDemoResult(ends=ends)
    proc = RecordWriter(out_dir, pid_file, kill_task=1 if kill and tasks > 1 else None, kill_after=kill_after)
    log(f"job: {tasks} Spark tasks as KafkaGroupConsumer members of herd group '{group}' (session timeout "
        f"{session_timeout_ms} ms), up to {max_poll_records} records per batch, to the end offsets "
        f"{sum(ends.values())} records")
    run = common.KilledJob(job, spark, proc, tasks, timeout_s, "spark-kafka-job")
    if proc.kill_task is not None:
        victim_line = run.victim_line(pid_file)
        if victim_line is not None:
            pid, batch = (int(x) for x in victim_line[:2])
            victim, vparts, before, kill_at = run.kill(herd_bootstrap, group, proc.kill_task, pid)
            result.killed_pid, result.killed_batch = pid, batch
            result.victim_partitions = [str(tp) for tp in vparts]
            log(f"t={kill_at - t0:5.1f}s  SIGKILL python worker {pid} (Spark task {proc.kill_task}, member {victim}) "
                f"holding {', '.join(map(str, vparts)) or '?'}, its last batch of {batch} records written, "
                f"not committed")
            if run.wait_moved(herd_bootstrap, group, vparts, before, ends):
                result.recovered_after_s = time.monotonic() - kill_at
                log(f"t={time.monotonic() - t0:5.1f}s  its partitions move again "
                    f"({result.recovered_after_s:.1f}s after the kill)")
    run.finish(result)
    log(f"t={time.monotonic() - t0:5.1f}s  Spark job " + ("finished" if result.error is None else
                                                         f"FAILED: {result.error}"))
    result.check = verify(out_dir, ends, records)
    try:
        result.committed = group_offsets(herd_bootstrap, group, list(ends))
    except Exception as exc:
        log(f"could not read the group's offsets: {exc}")
    if metrics_url:
        lag_deadline = time.monotonic() + 30
        while time.monotonic() < lag_deadline:  # herd reads the log ends every lag_refresh_interval_ms
            try:
                result.lag = herd_lag(metrics_url, group)
            except OSError as exc:
                log(f"could not read herd's metrics: {exc}")
            if result.lag == 0:
                break
            time.sleep(0.5)
    return result


def summary(r: KafkaDemoResult, records: int) -> list[str]:
    c = r.check
    lines = ["", "summary"]
    lines.append(f"  records     {records} produced, {c['expected']} offsets in {len(r.ends)} partitions; processed "
                 f"{c['processed']}: {c['unique']} distinct, {c['missing']} missing, {c['values_missing']} values "
                 f"missing, {c['duplicates']} duplicates" + (f", {c['wrong']} WRONG" if c["wrong"] else ""))
    failures = sum(s["commit_failures"] for s in r.stats)
    if r.killed_pid:
        lines.append(f"  kill        worker pid {r.killed_pid} (partitions {', '.join(r.victim_partitions)}); "
                     f"its partitions moved after {common.recovery(r)}")
    explained = r.killed_batch if r.killed_pid else 0
    why = (f"exactly the killed task's last batch ({r.killed_batch} records: written, not committed, read again "
           f"by the next owner)" if c["duplicates"] == explained and r.killed_pid else
           "none expected" if c["duplicates"] == explained else
           f"the killed task's last batch ({explained} records) and {c['duplicates'] - explained} more from the "
           f"{failures} commit(s) that failed in rebalances (those batches are read again by the next owner)")
    lines.append(f"  duplicates  {c['duplicates']}: {why}")
    done = common.partitions_done(r)
    lines.append(f"  group       {done}/{len(r.ends)} partitions committed at their end offsets; herd's lag for the "
                 f"group (herd_group_sum_lag): {r.lag}")
    failed = f"FAILED: {r.error or ''} missing {c['missing']} {c['missing_sample']}, lag {r.lag}"
    return lines + common.closing_lines(r, "batches", "OK: every record processed at least once, lag 0", failed)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.spark_kafka_demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--records", type=int, default=200_000)
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--tasks", type=int, default=4, help="Spark tasks = group members (local[N,4])")
    ap.add_argument("--max-poll-records", type=int, default=500)
    ap.add_argument("--kill-after", type=int, default=20, help="the victim's batch after which it is killed")
    ap.add_argument("--session-timeout-ms", type=int, default=6000)
    ap.add_argument("--no-kill", action="store_true")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--workdir", help="keep the output, Kafka's and herd's data here (default: a temp dir)")
    ap.add_argument("--spark-logs", action="store_true")
    args = ap.parse_args(argv)
    from tools.kafka_broker import KafkaBroker
    from tools.spark_demo import Herd, spark_session

    with common.demo_workdir(args.workdir, "herd-spark-kafka-demo-") as workdir:
        t0 = time.monotonic()
        with KafkaBroker(workdir / "kafka") as broker:
            print(f"Kafka broker on {broker.bootstrap} after {time.monotonic() - t0:.1f}s", flush=True)
            herd_args = ["--initial-rebalance-delay-ms", "1000", "--min-session-timeout-ms", "1000",
                         "--data-bootstrap-server", broker.bootstrap, "--lag-refresh-interval-ms", "1000",
                         "--topic", f"events:{args.partitions}"]
            # the topic exists in the data cluster before herd starts (herd may read it from there)
            from confluent_kafka.admin import AdminClient, NewTopic

            admin = AdminClient({"bootstrap.servers": broker.bootstrap})
            admin.create_topics([NewTopic("events", args.partitions, 1)])["events"].result(60)
            with Herd(workdir, *herd_args) as herd:
                print(f"herd on {herd.bootstrap} (metrics {herd.metrics_url}), data cluster {broker.bootstrap}",
                      flush=True)
                spark = spark_session("herd-spark-kafka-demo", master=f"local[{args.tasks},4]",
                                      quiet=not args.spark_logs)
                try:
                    print(f"Spark {spark.version} {spark.sparkContext.master} up after "
                          f"{time.monotonic() - t0:.1f}s", flush=True)
                    r = run_kafka_demo(spark, herd.bootstrap, broker.bootstrap, workdir, metrics_url=herd.metrics_url,
                                       partitions=args.partitions, records=args.records, tasks=args.tasks,
                                       max_poll_records=args.max_poll_records, kill=not args.no_kill,
                                       kill_after=args.kill_after, session_timeout_ms=args.session_timeout_ms,
                                       timeout_s=args.timeout, log=lambda s: print(s, flush=True),
                                       create_topic=False)
                    return common.print_summary(summary(r, args.records), t0, r.ok)
                finally:
                    spark.stop()


if __name__ == "__main__":
    sys.exit(main())
