"""``make demo-spark``: Spark tasks as herd group members survive a hard-killed member.

    python -m tools.spark_demo [--partitions 8] [--records 5000] [--tasks 2] [--static] [--no-kill]

1. starts herd on 127.0.0.1, port 0 (with its HTTP endpoint on port 0 for the flight recorder);
2. generates a dataset: one shard file per topic partition (offset = line number);
3. runs a PySpark job (``local[N,4]``: failed tasks are retried) whose N tasks are members of one
   consumer group (``client.spark.GroupJob``): each processes chunks of its assigned shards,
   appends the results to per-partition output files and commits the chunk's end offset;
4. SIGKILLs the Python worker of one task mid-way -- after it has written a chunk's output but
   before committing it -- and measures how long its partitions stay without progress;
5. checks the output: every record processed at least once, none missing (the killed member's last
   chunk is processed again by its successor: those are the duplicates);
6. loads herd's view of the group into Spark DataFrames (committed offsets and lag, members, the
   rebalance history from ``/groups/<g>/history``) and prints them with a summary.

Exits 1 if any record is missing (or the job failed), 0 otherwise. The tests in tests/spark run a
small version of this through ``run_demo``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from dataclasses import dataclass, field
from pathlib import Path

from client import TopicPartition
from client.spark import (
    GroupJob,
    describe_group,
    ensure_topic,
    fetch_history,
    group_offsets,
    history_dataframe,
    members_dataframe,
    offsets_dataframe,
)
from tools import spark_demo_common as common

REPO = Path(__file__).resolve().parents[1]


# ---- Spark ----------------------------------------------------------------------------------------

def spark_session(app: str = "herd-spark-demo", master: str = "local[2,4]", quiet: bool = True,
                  extra: dict | None = None):
    """A local SparkSession set up as DESIGN.md says: workers run this interpreter (they import
    herd), everything on 127.0.0.1, no UI. ``local[N,F]`` retries a failed task up to F-1 times."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession

    b = (SparkSession.builder.master(master).appName(app)
         .config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false")
         .config("spark.driver.host", "127.0.0.1")
         .config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.sql.shuffle.partitions", "2")
         .config("spark.default.parallelism", "2")
         .config("spark.python.worker.reuse", "true")
         .config("spark.speculation", "false"))
    log_conf = None
    if quiet:  # Spark's start-up chatter too, not only what follows setLogLevel
        with tempfile.NamedTemporaryFile("w", suffix=".properties", prefix="herd-log4j2-", delete=False) as f:
            f.write(_QUIET_LOG4J2)
            log_conf = f.name
        b = b.config("spark.driver.extraJavaOptions", f"-Dlog4j2.configurationFile=file:{log_conf}")
    for k, v in (extra or {}).items():
        b = b.config(k, v)
    try:
        spark = b.getOrCreate()
    finally:
        if log_conf:
            os.unlink(log_conf)
    if quiet:
        spark.sparkContext.setLogLevel("OFF")
    return spark


_QUIET_LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = stderr
appender.console.type = Console
appender.console.name = stderr
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
"""


# ---- the dataset and its processing ---------------------------------------------------------------

def make_dataset(data_dir: Path, topic: str, partitions: int, records: int) -> dict:
    """One shard file per partition, uneven sizes around ``records``; returns {tp: size}."""
    data_dir.mkdir(parents=True, exist_ok=True)
    ends = {}
    for p in range(partitions):
        n = records + (p * 37) % max(1, records // 5)
        with open(data_dir / f"shard-{p:03d}.txt", "w") as f:
            for o in range(n):
                f.write(f"{p}:{o}:{zlib.crc32(f'{topic}/{p}/{o}'.encode()):08x}\n")
        ends[TopicPartition(topic, p)] = n
    return ends


class ShardProcessor:
    """``process(tp, start, end)`` for the demo's members: reads lines [start, end) of the shard,
    appends ``partition offset crc`` lines to its own output file for that partition (per process, so
    two writers never interleave) and flushes them before returning (then the chunk is committed).

    The victim (Spark partition ``kill_task``, first attempt) writes its pid to ``pid_file`` after
    the output of its ``kill_after``-th chunk and waits there to be killed: that chunk is processed
    but not committed, so its successor processes it again."""

    def __init__(self, data_dir, out_dir, pid_file, delay_s: float = 0.0, kill_task: int | None = 1,
                 kill_after: int = 3):
        self.data_dir, self.out_dir, self.pid_file = str(data_dir), str(out_dir), str(pid_file)
        self.delay_s, self.kill_task, self.kill_after = delay_s, kill_task, kill_after
        self._info = None
        self._chunks = 0
        self._lines: dict = {}
        self._files: dict = {}

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k in (
            "data_dir", "out_dir", "pid_file", "delay_s", "kill_task", "kill_after")}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._info, self._chunks, self._lines, self._files = None, 0, {}, {}

    def on_start(self, info) -> None:
        self._info = info
        self._chunks = 0

    def _shard(self, p: int) -> list[str]:
        lines = self._lines.get(p)
        if lines is None:
            with open(os.path.join(self.data_dir, f"shard-{p:03d}.txt")) as f:
                lines = self._lines[p] = f.read().splitlines()
        return lines

    def __call__(self, tp, start: int, end: int) -> None:
        lines = self._shard(tp.partition)
        f = self._files.get(tp.partition)
        if f is None:
            path = os.path.join(self.out_dir, f"p{tp.partition:03d}-pid{os.getpid()}.out")
            f = self._files[tp.partition] = open(path, "a")
        out = []
        for o in range(start, end):
            p, off, crc = lines[o].split(":")
            out.append(f"{p} {off} {zlib.crc32(lines[o].encode()):08x}\n")
        f.write("".join(out))
        f.flush()
        os.fsync(f.fileno())
        self._chunks += 1
        if self.delay_s:
            time.sleep(self.delay_s)
        common.park_if_victim(self._info, self.kill_task, self._chunks, self.kill_after, self.pid_file,
                              f"{os.getpid()} {tp.topic} {tp.partition} {end}\n")


def verify(data_dir: Path, out_dir: Path, ends: dict) -> dict:
    """Is every (partition, offset) of the dataset in the output, with the right checksum?"""
    want = {}
    for tp in ends:
        with open(data_dir / f"shard-{tp.partition:03d}.txt") as f:
            for o, line in enumerate(f.read().splitlines()):
                want[(tp.partition, o)] = f"{zlib.crc32(line.encode()):08x}"
    seen: dict = {}
    wrong = 0
    rows, torn = common.read_output(out_dir)
    for key, crc in rows:
        if want.get(key) != crc:
            wrong += 1
            continue
        seen[key] = seen.get(key, 0) + 1
    missing = sorted(k for k in want if k not in seen)
    return {"expected": len(want), "unique": len(seen), "processed": sum(seen.values()),
            "duplicates": sum(c - 1 for c in seen.values()), "missing": len(missing),
            "missing_sample": missing[:10], "torn_lines": torn, "wrong": wrong}


# ---- the run ----------------------------------------------------------------------------------------

@dataclass
class DemoResult:
    ends: dict
    check: dict
    stats: list
    error: str | None = None
    killed_pid: int | None = None
    victim_partitions: list = field(default_factory=list)
    kill_at: float | None = None
    recovered_after_s: float | None = None
    job_seconds: float = 0.0
    final_state: str | None = None
    committed: dict = field(default_factory=dict)
    history: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.error is None and self.check["missing"] == 0 and self.check["wrong"] == 0


def run_demo(spark, bootstrap: str, workdir: Path, *, group: str = "spark-demo", topic: str = "shards",
             partitions: int = 8, records: int = 5000, tasks: int = 2, chunk_size: int = 250,
             delay_s: float = 0.1, kill: bool = True, kill_after: int = 3, static: bool = False,
             session_timeout_ms: int = 6000, heartbeat_interval_ms: int | None = None,
             metrics_url: str | None = None, timeout_s: float = 180.0, log=print) -> DemoResult:
    """Generate, run the job, kill a member, verify. Needs a running herd at ``bootstrap``."""
    workdir = Path(workdir)
    data_dir, out_dir = workdir / "data", workdir / "out"
    for d in (data_dir, out_dir):
        shutil.rmtree(d, ignore_errors=True)
    out_dir.mkdir(parents=True)
    pid_file = workdir / "victim.pid"
    pid_file.unlink(missing_ok=True)
    ends = make_dataset(data_dir, topic, partitions, records)
    ensure_topic(bootstrap, topic, partitions)
    hb = heartbeat_interval_ms or max(100, session_timeout_ms // 6)
    job = GroupJob(bootstrap, group, ends, static_membership=static, chunk_size=chunk_size,
                   task_timeout_s=timeout_s,
                   config={"session.timeout.ms": session_timeout_ms, "heartbeat.interval.ms": hb,
                           "partition.assignment.strategy": ["range"]})
    proc = ShardProcessor(data_dir, out_dir, pid_file, delay_s=delay_s,
                          kill_task=1 if kill and tasks > 1 else None, kill_after=kill_after)
    log(f"dataset: {len(ends)} shards, {job.total_records} records; job: {tasks} Spark tasks as "
        f"{'static' if static else 'dynamic'} members of group '{group}' (session timeout "
        f"{session_timeout_ms} ms), chunks of {chunk_size}")
    result = DemoResult(ends=ends, check={}, stats=[])
    run = common.KilledJob(job, spark, proc, tasks, timeout_s, "spark-job")
    t0 = run.start
    if proc.kill_task is not None:
        victim_line = run.victim_line(pid_file)
        if victim_line is not None:
            pid = int(victim_line[0])
            victim, vparts, before, result.kill_at = run.kill(bootstrap, group, proc.kill_task, pid)
            result.killed_pid = pid
            result.victim_partitions = [str(tp) for tp in vparts]
            log(f"t={result.kill_at - t0:5.1f}s  SIGKILL python worker {pid} (Spark task {proc.kill_task}, "
                f"member {victim}) holding {', '.join(map(str, vparts)) or '?'} "
                f"at offsets {', '.join(str(before.get(tp, 0)) for tp in vparts)}")
            # recovered: the first commit that moves one of the victim's partitions again
            if run.wait_moved(bootstrap, group, vparts, before, ends):
                result.recovered_after_s = time.monotonic() - result.kill_at
                owners = {}
                try:
                    for mm in describe_group(bootstrap, group)["members"]:
                        for tp in mm["assignment"]:
                            owners[tp] = mm["group_instance_id"] or mm["client_id"]
                except Exception:
                    pass
                log(f"t={time.monotonic() - t0:5.1f}s  the killed member's partitions move again "
                    f"({result.recovered_after_s:.1f}s after the kill), now owned by "
                    f"{', '.join(sorted({owners.get(tp, '?') for tp in vparts}))}")
    run.finish(result)
    outcome = "finished" if result.error is None else f"FAILED: {result.error}"
    log(f"t={result.job_seconds:5.1f}s  Spark job {outcome}")
    result.check = verify(data_dir, out_dir, ends)
    try:
        result.committed = group_offsets(bootstrap, group, list(ends))
        result.final_state = describe_group(bootstrap, group)["state"]
    except Exception as exc:
        log(f"could not read the group back: {exc}")
    if metrics_url:
        try:
            result.history = fetch_history(metrics_url, group)
        except Exception as exc:
            log(f"could not read the flight recorder: {exc}")
    return result


# ---- printing ---------------------------------------------------------------------------------------

def show_group(spark, bootstrap: str, group: str, ends: dict, metrics_url: str | None) -> None:
    from pyspark.sql import functions as F

    print(f"\nherd's view of group '{group}', loaded into Spark DataFrames:")
    offsets = offsets_dataframe(spark, bootstrap, group, ends)
    offsets.orderBy("partition").select("topic", "partition", "committed", "end_offset", "lag",
                                        "metadata").show(len(ends), truncate=False)
    total = offsets.agg(F.sum("end_offset").alias("records"), F.sum("committed").alias("committed"),
                        F.sum("lag").alias("lag")).first()
    print(f"  total: {total['committed']} of {total['records']} records committed, lag {total['lag']}")
    members_dataframe(spark, bootstrap, group).select("state", "client_id", "group_instance_id",
                                                      "assignment").show(truncate=False)
    if metrics_url:
        hist = history_dataframe(spark, metrics_url, group)
        print("rebalance history (herd flight recorder, GET /groups/<g>/history):")
        hist.select("from_generation", "generation", "reason", "trigger", "outcome", "duration_ms",
                    "members", "not_rejoined").show(truncate=False)


def summary(r: DemoResult, history: list) -> list[str]:
    c = r.check
    rebalances = [e for e in history if e.get("outcome") != "in_progress"]
    lines = ["", "summary"]
    lines.append(f"  records     {c['expected']} in {len(r.ends)} shards; processed {c['processed']}: "
                 f"{c['unique']} distinct, {c['duplicates']} duplicates, {c['missing']} missing"
                 + (f", {c['wrong']} WRONG" if c["wrong"] else ""))
    if r.killed_pid:
        lines.append(f"  kill        worker pid {r.killed_pid} (partitions "
                     f"{', '.join(r.victim_partitions)}); seconds to recover: {common.recovery(r)}")
    if history:
        reasons: dict = {}
        for e in rebalances:
            reasons[e.get("reason")] = reasons.get(e.get("reason"), 0) + 1
        why = ", ".join(f"{k} x{v}" for k, v in reasons.items())
        lines.append(f"  rebalances  {len(rebalances)} ({why})")
    else:
        gens = sorted({g for s in r.stats for g in s["generations"]})
        lines.append(f"  rebalances  generations seen by the surviving tasks: {gens}")
    done = common.partitions_done(r)
    lines.append(f"  group       {r.final_state}; {done}/{len(r.ends)} partitions committed at their "
                 f"shard size")
    failed = f"FAILED: {r.error or ''} {c['missing']} records missing {c['missing_sample']}"
    return lines + common.closing_lines(r, "chunks", "OK: every record processed at least once", failed)


# ---- herd as a subprocess ---------------------------------------------------------------------------

class Herd:
    """herd on 127.0.0.1, port 0, with its HTTP endpoint on port 0; stopped on exit."""

    def __init__(self, workdir: Path, *args: str):
        self.workdir, self.args = Path(workdir), list(args)
        self.proc = None
        self.port = self.metrics_port = None

    def __enter__(self):
        port_file, log = self.workdir / "herd.port", self.workdir / "herd.log"
        port_file.unlink(missing_ok=True)
        self._log = open(log, "ab")
        env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "coordinator", "serve", "--host", "127.0.0.1", "--port", "0",
             "--data-dir", str(self.workdir / "herd-data"), "--port-file", str(port_file),
             "--metrics-port", "0", "--log-format", "json", *self.args],
            stdout=self._log, stderr=subprocess.STDOUT, cwd=str(REPO), env=env)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"herd exited during start-up:\n{log.read_text()}")
            if port_file.exists() and port_file.read_text().strip():
                self.port = int(port_file.read_text())
                for line in log.read_text().splitlines():
                    try:
                        ev = json.loads(line)
                    except ValueError:
                        continue
                    if ev.get("event") == "metrics listening":
                        self.metrics_port = ev["port"]
                return self
            time.sleep(0.05)
        self.__exit__()
        raise RuntimeError("herd did not start within 30 s")

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str | None:
        return f"http://127.0.0.1:{self.metrics_port}" if self.metrics_port else None

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tools.spark_demo", description=__doc__.split("\n\n")[0])
    ap.add_argument("--partitions", type=int, default=8, help="topic partitions = dataset shards")
    ap.add_argument("--records", type=int, default=5000, help="records per shard (about)")
    ap.add_argument("--tasks", type=int, default=2, help="Spark tasks = group members (local[N,4])")
    ap.add_argument("--chunk", type=int, default=250, help="records per process() call and commit")
    ap.add_argument("--delay", type=float, default=0.12, help="seconds of 'work' per chunk")
    ap.add_argument("--session-timeout-ms", type=int, default=6000)
    ap.add_argument("--static", action="store_true", help="static membership keyed to the Spark partition")
    ap.add_argument("--no-kill", action="store_true", help="do not kill a member")
    ap.add_argument("--timeout", type=float, default=240.0, help="give up after this many seconds")
    ap.add_argument("--workdir", help="keep the dataset, output and herd's data here (default: a temp dir)")
    ap.add_argument("--spark-logs", action="store_true", help="show Spark's own log output")
    args = ap.parse_args(argv)

    with common.demo_workdir(args.workdir, "herd-spark-demo-") as workdir:
        t0 = time.monotonic()
        herd_args = ["--initial-rebalance-delay-ms", "1000", "--min-session-timeout-ms", "1000"]
        with Herd(workdir, *herd_args) as herd:
            print(f"herd listening on {herd.bootstrap} (flight recorder at {herd.metrics_url}); "
                  f"work dir {workdir}")
            spark = spark_session(master=f"local[{args.tasks},4]", quiet=not args.spark_logs)
            try:
                print(f"Spark {spark.version} {spark.sparkContext.master} up after "
                      f"{time.monotonic() - t0:.1f}s")
                r = run_demo(spark, herd.bootstrap, workdir, partitions=args.partitions,
                             records=args.records, tasks=args.tasks, chunk_size=args.chunk,
                             delay_s=args.delay, kill=not args.no_kill, static=args.static,
                             session_timeout_ms=args.session_timeout_ms,
                             metrics_url=herd.metrics_url, timeout_s=args.timeout,
                             log=lambda s: print(s, flush=True))
                show_group(spark, herd.bootstrap, "spark-demo", r.ends, herd.metrics_url)
                return common.print_summary(summary(r, r.history), t0, r.ok)
            finally:
                spark.stop()

if __name__ == "__main__":
    sys.exit(main())
