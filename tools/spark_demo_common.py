"""What the two PySpark demos (tools/spark_demo.py, tools/spark_kafka_demo.py) share: a Spark job
run on a thread while the driver SIGKILLs one task's Python worker and watches its partitions move,
the victim's side of that (``park_if_victim``), reading the per-partition output files back, and the
per-task lines of the summaries, the work dir and the end of ``main``."""
from __future__ import annotations

import os
import shutil
import signal
import tempfile
import threading
import time
from contextlib import contextmanager
from pathlib import Path


def park_if_victim(info, kill_task: int | None, count: int, kill_after: int, pid_file: str, line: str) -> None:
    """In a task's ``process``: if this is the victim (Spark partition ``kill_task``, first
    attempt) at its ``kill_after``-th call, write ``line`` (its pid first) to ``pid_file`` and wait
    to be killed there: that call's output is written but not committed."""
    if (kill_task is not None and info is not None and info.spark_partition == kill_task
            and info.attempt == 0 and count == kill_after):
        tmp = pid_file + ".tmp"
        with open(tmp, "w") as pf:
            pf.write(line)
        os.replace(tmp, pid_file)
        time.sleep(120)  # the driver SIGKILLs this process here


def read_output(out_dir: Path) -> tuple[list, int]:
    """The ``<partition> <offset> <value>`` lines of the output files as ``((partition, offset),
    value)`` rows, and how many lines were torn (the last line of a killed writer)."""
    rows, torn = [], 0
    for path in sorted(out_dir.glob("p*.out")):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit():
                torn += 1
                continue
            rows.append(((int(parts[0]), int(parts[1])), parts[2]))
    return rows, torn


class KilledJob:
    """``job.run(spark, proc, tasks)`` on a thread of its own, bounded by ``timeout_s``; the
    driver kills the victim (``kill``) and waits for its partitions to move (``wait_moved``)."""

    def __init__(self, job, spark, proc, tasks: int, timeout_s: float, name: str):
        self.timeout_s = timeout_s
        self._box: dict = {}
        self.start = time.monotonic()
        self.deadline = self.start + timeout_s
        self.thread = threading.Thread(target=self._run, args=(job, spark, proc, tasks), name=name, daemon=True)
        self.thread.start()

    def _run(self, job, spark, proc, tasks) -> None:
        try:
            self._box["stats"] = job.run(spark, proc, tasks, on_start=proc.on_start)
        except BaseException as exc:  # reported by the main thread
            self._box["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"

    def _running(self) -> bool:
        return self.thread.is_alive() and time.monotonic() < self.deadline

    def victim_line(self, pid_file: Path) -> list[str] | None:
        """The victim's pid-file line, split, once it is waiting to be killed (None if it never is)."""
        while not pid_file.exists() and self._running():
            time.sleep(0.05)
        return pid_file.read_text().split() if pid_file.exists() else None

    def kill(self, bootstrap: str, group: str, kill_task: int, pid: int):
        """SIGKILL the victim's worker ``pid``; ``(member client id, its partitions, their committed
        offsets before the kill, when it was killed)``."""
        from client.spark import describe_group, group_offsets

        victim = f"herd-spark-p{kill_task}-a0"
        try:
            members = describe_group(bootstrap, group)["members"]
        except Exception:
            members = []
        vparts = next((mm["assignment"] for mm in members if mm["client_id"] == victim), [])
        before = group_offsets(bootstrap, group, vparts) if vparts else {}
        os.kill(pid, signal.SIGKILL)
        return victim, vparts, before, time.monotonic()

    def wait_moved(self, bootstrap: str, group: str, vparts: list, before: dict, ends: dict) -> bool:
        """Until the first commit that moves one of the victim's partitions again (True), or the
        job ends or times out (False)."""
        from client.spark import group_offsets

        while vparts and self._running():
            now = group_offsets(bootstrap, group, vparts)
            if any(now.get(tp, 0) > before.get(tp, 0) or now.get(tp, 0) >= ends[tp] for tp in vparts):
                return True
            time.sleep(0.1)
        return False

    def finish(self, result) -> None:
        """Wait for the job; set ``result``'s ``job_seconds``, ``error`` and ``stats``."""
        self.thread.join(max(1.0, self.deadline - time.monotonic()))
        result.job_seconds = time.monotonic() - self.start
        if self.thread.is_alive():
            result.error = f"the Spark job did not finish within {self.timeout_s:.0f}s"
        else:
            result.error = self._box.get("error")
            result.stats = self._box.get("stats", [])


def recovery(r) -> str:
    """How long the killed member's partitions stayed without progress, for a summary."""
    return f"{r.recovered_after_s:.1f} s" if r.recovered_after_s is not None else "not measured"


def partitions_done(r) -> int:
    """How many partitions of the work the group committed at their end."""
    return sum(1 for tp, n in r.ends.items() if r.committed.get(tp) == n)


def closing_lines(r, unit: str, ok: str, failed: str) -> list[str]:
    """The end of a summary: a line per task (``unit``, "chunks" or "batches", names its calls of
    ``process``), then the job's time and ``ok`` or ``failed``."""
    lines = [f"  task {s['spark_partition']}      attempt {s['attempt']}: {s['records']} records in "
             f"{s[unit]} {unit}, generations {s['generations']}, {s['commit_failures']} failed "
             f"commits, {s['seconds']:.1f} s" for s in sorted(r.stats, key=lambda s: s["spark_partition"])]
    lines.append(f"  job         {r.job_seconds:.1f} s; " + (ok if r.ok else failed))
    return lines


def print_summary(lines: list[str], t0: float, ok: bool) -> int:
    """Print a demo's summary and its total time; the exit status."""
    for line in lines:
        print(line)
    print(f"  total       {time.monotonic() - t0:.1f} s")
    return 0 if ok else 1


@contextmanager
def demo_workdir(keep: str | None, prefix: str):
    """``--workdir`` (kept), else a temporary directory removed at the end."""
    workdir = Path(keep) if keep else Path(tempfile.mkdtemp(prefix=prefix))
    workdir.mkdir(parents=True, exist_ok=True)
    try:
        yield workdir
    finally:
        if not keep:
            shutil.rmtree(workdir, ignore_errors=True)
