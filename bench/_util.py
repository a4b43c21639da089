"""Shared helpers for the benchmarks (not a benchmark itself: the name starts with ``_``).

* :func:`environment` — date, machine, python, git revision: every JSON result carries it.
* :class:`Herd` / :class:`Mock` — start the herd daemon (the tests' launcher, ``tools/daemon.py``,
  with the benchmarks' defaults) / librdkafka's mock cluster as subprocesses in their own process
  group on 127.0.0.1 and always stop them (SIGTERM, then SIGKILL of the group). Both also get
  ``PR_SET_PDEATHSIG`` so they die with the benchmark even if it is killed hard.
* ``/proc`` readers: process CPU (per thread, ns resolution from ``schedstat``), RSS.
* :func:`percentiles`, :func:`emit` (one JSON object on stdout, a short table on stderr).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import platform
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tools.daemon import Daemon, die_with_parent, stop_process_group

REPO = Path(__file__).resolve().parents[1]
MOCK_TOOL = REPO.parent / "shared" / "tools" / "mock_cluster.py"
PY_SPY = Path(sys.executable).parent / "py-spy"
CLK_TCK = os.sysconf("SC_CLK_TCK")


# ---- environment -------------------------------------------------------------------------------


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "?"


def _mem_total_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024 / 1024, 1)
    except OSError:
        pass
    return None


def _git_revision() -> str | None:
    try:
        rev = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, timeout=5
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return rev + ("-dirty" if dirty else "") if rev else None
    except (OSError, subprocess.SubprocessError):
        return None


def environment() -> dict:
    return {
        "date": _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "cpu": _cpu_model(),
            "cpu_count": os.cpu_count(),
            "mem_gb": _mem_total_gb(),
            "loadavg_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "git": _git_revision(),
    }


def client_versions() -> dict:
    out = {}
    try:
        import confluent_kafka

        v, lib = confluent_kafka.version(), confluent_kafka.libversion()
        out["confluent_kafka"] = v[0] if isinstance(v, tuple) else v
        out["librdkafka"] = lib[0] if isinstance(lib, tuple) else lib
    except ImportError:
        pass
    return out


# ---- /proc -----------------------------------------------------------------------------------


def proc_cpu_seconds(pid: int) -> float:
    """utime + stime of a whole process (all threads), 1/CLK_TCK resolution."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def proc_user_sys_seconds(pid: int) -> tuple[float, float]:
    """(utime, stime) of a whole process in seconds: user space (Python) vs kernel (syscalls)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def proc_children_cpu_seconds(pid: int) -> float:
    """cutime + cstime: the CPU of a process's children it has waited for (herd's forked GC check)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[13]) + int(fields[14])) / CLK_TCK


def proc_threads_cpu_ns(pid: int) -> dict[str, int]:
    """CPU ns per thread name (``schedstat`` sum_exec_runtime; threads of one name are summed).

    Threads that already exited are not counted; the daemon's threads live as long as it does."""
    out: dict[str, int] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                ns = int(f.read().split()[0])
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
        except (OSError, ValueError, IndexError):
            continue
        if tid == str(pid):
            name = "main"  # the event loop
        elif name == "python":
            name = "other"  # threads that did not set an OS name (herd's log writer, compactor, executor)
        out[name] = out.get(name, 0) + ns
    return out


def proc_cpu_ns(pid: int) -> int:
    return sum(proc_threads_cpu_ns(pid).values())


def proc_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def proc_hwm_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def machine_cpu_times() -> tuple[float, float, float]:
    """(busy, total, steal) jiffies summed over all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        parts = [int(x) for x in f.readline().split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (parts + [0] * 8)[:8]
    busy = user + nice + system + irq + softirq + steal
    return busy, busy + idle + iowait, steal


def ctx_switches(pid: int) -> tuple[int, int]:
    """(voluntary, nonvoluntary) context switches of a process's main thread. Many nonvoluntary
    switches = the process wanted the CPU and was preempted (CPU contention)."""
    vol = nonvol = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("voluntary_ctxt_switches:"):
                vol = int(line.split()[1])
            elif line.startswith("nonvoluntary_ctxt_switches:"):
                nonvol = int(line.split()[1])
    return vol, nonvol


def renice(pid: int, nice: int) -> int:
    """Set every thread of ``pid`` to ``nice`` (Linux: a nice value is per thread; threads started
    later inherit their creator's) -> the main thread's value before. Raising it is always allowed;
    lowering it again needs CAP_SYS_NICE (PermissionError)."""
    before = os.getpriority(os.PRIO_PROCESS, pid)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except ProcessLookupError:  # a thread that just ended
            pass
    return before


def autogroup(pid: int | str = "self") -> tuple[str, int] | None:
    """(name, nice) of a process's scheduling autogroup (Linux with ``sched_autogroup_enabled``: a
    session's processes share one, and CPU is shared between autogroups before nice values count
    inside one); None without autogroups."""
    try:
        with open(f"/proc/{pid}/autogroup") as f:
            name, _, nice = f.read().split()
        if open("/proc/sys/kernel/sched_autogroup_enabled").read().strip() != "1":
            return None
        return name, int(nice)
    except (OSError, ValueError):
        return None


def _set_autogroup_nice(nice: int) -> None:
    with open("/proc/self/autogroup", "w") as f:
        f.write(str(nice))


def _runqueue_main() -> None:
    """RunQueueWatch's sampling process: samples every interval until its stdin closes, then once
    more; one JSON line per sample on stdout."""
    import json
    import select

    cfg = json.loads(sys.argv[1])
    rq = RunQueueWatch(cfg["tasks"], cfg["interval"], all_threads=frozenset(cfg["all_threads"]), separate=False)
    out = sys.stdout
    poller = select.poll()
    poller.register(sys.stdin.fileno(), select.POLLIN | select.POLLHUP)
    rq.sample()
    out.write("ready\n")
    out.flush()
    while True:
        if poller.poll(cfg["interval"] * 1000):
            if not os.read(sys.stdin.fileno(), 4096):
                break
        rq.sample()
    rq.sample()
    for t, got in rq.samples:
        out.write(json.dumps([t, got]) + "\n")
    out.flush()


class Reniced:
    """``with Reniced(nice, server_pid):`` this process's threads (and the processes it starts
    meanwhile) at ``nice``, and so is its autogroup when the server has another one (a daemon started
    in its own session: otherwise the two autogroups share the CPUs equally whatever the nice values
    in them); back to what they were after (when allowed: ``restored`` says). 0: nothing changes."""

    def __init__(self, nice: int, server_pid: int | None = None):
        self.nice = nice
        self.server_pid = server_pid
        self.before = None
        self.group_before = None
        self.restored = None

    def __enter__(self):
        if self.nice:
            self.before = renice(os.getpid(), self.nice)
            mine = autogroup()
            theirs = autogroup(self.server_pid) if self.server_pid else None
            if mine is not None and theirs is not None and mine[0] != theirs[0]:
                _set_autogroup_nice(self.nice)
                self.group_before = mine[1]
        return self

    def __exit__(self, *exc):
        if self.before is not None:
            try:
                renice(os.getpid(), self.before)
                if self.group_before is not None:
                    _set_autogroup_nice(self.group_before)
                self.restored = True
            except PermissionError:  # lowering a nice value needs CAP_SYS_NICE
                self.restored = False


def task_schedstat(pid: int, tid: int | None = None) -> tuple[int, int]:
    """(ns run on a CPU, ns waited on a run queue) of one thread (the main one by default), from the
    kernel's ``schedstat``: the wait is time the thread was runnable and no CPU ran it."""
    with open(f"/proc/{pid}/task/{pid if tid is None else tid}/schedstat") as f:
        run, wait = f.read().split()[:2]
    return int(run), int(wait)


class RunQueueWatch:
    """How long watched threads waited for a CPU, sampled every ``interval`` s in a process of its
    own (``separate``, the default: a thread of a busy load process would sample only when that
    process's GIL and CPU let it) or a thread.

    ``tasks`` maps a name to the pids whose main threads it sums (the daemon's event loop; the load
    processes); for a name in ``all_threads`` every thread of those pids (a JVM). On a machine whose
    cores the server shares with its load, a slow answer in a moment when the server's loop thread
    was runnable but not running (run-queue wait) is the machine's doing, not the server's:
    ``between`` and ``in_buckets`` say how much of a stretch that was."""

    def __init__(self, tasks: dict[str, list[int]], interval: float = 0.05, clock=time.perf_counter,
                 all_threads: frozenset = frozenset(), separate: bool = True):
        import threading

        self.tasks = tasks
        self.all_threads = all_threads
        self.separate = separate
        self._proc = None
        self.interval = interval
        self.clock = clock
        self.samples: list[tuple[float, dict[str, tuple[int, int]]]] = []  # (t, name -> (run ns, wait ns))
        self._last: dict[tuple[str, int, int], tuple[int, int]] = {}  # a thread that exits keeps its last
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def sample(self) -> None:
        now = self.clock()
        got = {}
        for name, pids in self.tasks.items():
            last = self._last
            for pid in pids:
                try:
                    tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")] if name in self.all_threads else [pid]
                except OSError:
                    continue  # exited: its threads' last samples stand
                for tid in tids:
                    try:
                        last[name, pid, tid] = task_schedstat(pid, tid)
                    except (OSError, ValueError):
                        pass  # exited: its last sample stands
            run = wait = 0
            for (n, _, _), (r, w) in last.items():
                if n == name:
                    run += r
                    wait += w
            got[name] = (run, wait)
        self.samples.append((now, got))

    def _run(self):
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(self.interval)

    def __enter__(self):
        if not self.separate:
            self._thread.start()
            return self
        import json
        import subprocess

        cfg = {"tasks": self.tasks, "interval": self.interval, "all_threads": sorted(self.all_threads)}
        self._proc = subprocess.Popen([sys.executable, "-c", "from bench._util import _runqueue_main; _runqueue_main()",
                                       json.dumps(cfg)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      cwd=str(REPO), preexec_fn=die_with_parent)
        if self._proc.stdout.readline() != b"ready\n":  # its first sample is taken
            raise RuntimeError("the run-queue sampler did not start")
        return self

    def __exit__(self, *exc):
        if self._proc is None:
            self._stop.set()
            self._thread.join(5)
            self.sample()
            return
        import json

        proc, self._proc = self._proc, None
        out, _ = proc.communicate(timeout=30)  # closing its stdin stops it; it takes a last sample
        for line in out.splitlines():
            t, got = json.loads(line)
            self.samples.append((t, {name: tuple(v) for name, v in got.items()}))

    def _at(self, t: float) -> dict[str, tuple[int, int]] | None:
        """The last sample taken at or before ``t`` (the first one if none)."""
        import bisect

        if not self.samples:
            return None
        i = bisect.bisect_right([s[0] for s in self.samples], t) - 1
        return self.samples[max(i, 0)][1]

    def between(self, t0: float, t1: float) -> dict[str, dict[str, float]]:
        """Per name: seconds run and waited between the samples nearest ``t0`` and ``t1``."""
        a, b = self._at(t0), self._at(t1)
        if a is None or b is None:
            return {}
        return {name: {"run_s": round((b[name][0] - a[name][0]) / 1e9, 3),
                       "runqueue_wait_s": round((b[name][1] - a[name][1]) / 1e9, 3)} for name in b if name in a}

    def in_buckets(self, start: float, keys: list[float], bucket: float = 0.25) -> dict[float, dict[str, list]]:
        """[ms run, ms waited for a CPU] of each name in the ``bucket``-second stretches that begin
        ``keys`` seconds after ``start`` (e.g. a heartbeat window's slowest buckets)."""
        out = {}
        for k in keys:
            d = self.between(start + k, start + k + bucket)
            out[k] = {name: [round(v["run_s"] * 1000, 1), round(v["runqueue_wait_s"] * 1000, 1)]
                      for name, v in d.items()}
        return out


class MachineLoad:
    """``with MachineLoad(pid) as m: ...; m.result()`` — whole-machine CPU busy/steal share and the
    process's involuntary context switches over the block: how contended the CPUs were."""

    def __init__(self, pid: int | None = None):
        self.pid = pid
        self.out: dict = {}

    def __enter__(self):
        self.t0 = time.perf_counter()
        self.m0 = machine_cpu_times()
        self.c0 = ctx_switches(self.pid) if self.pid else None
        return self

    def __exit__(self, *exc):
        b1, t1, s1 = machine_cpu_times()
        b0, t0, s0 = self.m0
        wall = time.perf_counter() - self.t0
        self.out = {
            "machine_cpu_busy": (b1 - b0) / (t1 - t0) if t1 > t0 else None,
            "machine_cpu_steal": (s1 - s0) / (t1 - t0) if t1 > t0 else None,
        }
        if self.pid:
            try:
                v1, n1 = ctx_switches(self.pid)
                self.out["daemon_involuntary_switches_per_s"] = (n1 - self.c0[1]) / wall if wall else None
            except OSError:
                pass

    def result(self) -> dict:
        return self.out


class StallProbe:
    """A thread in this (mostly idle) process that sleeps ``period`` s in a loop and records every
    wake-up later than ``threshold`` s: the machine (not the daemon) stalling — CPU contention
    from other work. ``summary(start)`` buckets the stalls like the load tool's slow heartbeats,
    so the two can be compared."""

    def __init__(self, period: float = 0.005, threshold: float = 0.03):
        import threading

        self.period = period
        self.threshold = threshold
        self.stalls: list[tuple[float, float]] = []  # (when it should have woken, overshoot s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            t0 = time.perf_counter()
            time.sleep(self.period)
            over = time.perf_counter() - t0 - self.period
            if over > self.threshold and len(self.stalls) < 100_000:
                self.stalls.append((t0 + self.period, over))

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def summary(self, start: float, end: float, bucket: float = 0.25) -> dict:
        mine = [(t, o) for t, o in self.stalls if start <= t < end]
        buckets = sorted({int((t - start) / bucket) for t, _ in mine})
        return {
            "threshold_ms": self.threshold * 1000,
            "count": len(mine),
            "max_ms": max((o for _, o in mine), default=0.0) * 1000,
            "total_ms": sum(o for _, o in mine) * 1000,
            "buckets_250ms": [round(b * bucket, 2) for b in buckets[:40]],
        }


def send_while_read(pending: dict, seconds: float, pause: float = 0.001, drop_failed: bool = True) -> dict:
    """Send ``pending`` (non-blocking socket -> the list of byte strings still to send) for up to
    ``seconds``, each socket as far as its peer reads; -> ``pending``, what is left: the sockets the
    peer stopped reading. A socket whose send fails is dropped (``drop_failed``) or the error raised."""
    end = time.monotonic() + seconds
    while pending and time.monotonic() < end:
        for s in list(pending):
            parts = pending[s]
            try:
                n = s.send(parts[0])
            except BlockingIOError:
                continue
            except OSError:
                if not drop_failed:
                    raise
                del pending[s]
                continue
            parts[0] = parts[0][n:]
            if not parts[0]:
                parts.pop(0)
            if not parts:
                del pending[s]
        time.sleep(pause)
    return pending


def self_cpu_seconds() -> float:
    t = os.times()
    return t.user + t.system


# ---- subprocess handling ----------------------------------------------------------------------


class Herd(Daemon):
    """The one launcher (``tools/daemon.py``) with the benchmarks' defaults: ``with Herd(fsync="always")
    as h: h.bootstrap, h.pid``. Its own session, dies with the benchmark, stopped with its process
    group; a ``bench:100`` topic, INFO logs, data in a temp dir under ``default_tmp_root()`` unless
    ``data_dir`` is given; ``wrap`` (e.g. py-spy) keeps ``pid`` the daemon's own."""

    def __init__(self, *, topics=("bench:100",), log_level: str = "info", start_timeout: float = 120.0,
                 tmp_root=None, **kw):
        super().__init__(topics=topics, log_level=log_level, start_timeout=start_timeout, isolate=True,
                         tmp_root=tmp_root or default_tmp_root(), **kw)


class Mock:
    """``with Mock(topics=["bench:100"]) as m: m.bootstrap, m.pid`` — librdkafka's mock cluster."""

    def __init__(
        self,
        topics=("bench:100",),
        initial_rebalance_delay_ms: int = 0,
        max_seconds: int = 3600,
        start_timeout: float = 30.0,
    ):
        self.topics = list(topics)
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.max_seconds = max_seconds
        self.start_timeout = start_timeout
        self.proc = None
        self.pid = None
        self.bootstrap = None

    def start(self) -> Mock:
        if not MOCK_TOOL.exists():
            raise RuntimeError(f"mock cluster tool not found at {MOCK_TOOL}")
        cmd = [
            sys.executable,
            str(MOCK_TOOL),
            "--initial-rebalance-delay-ms",
            str(self.initial_rebalance_delay_ms),
        ]
        for t in self.topics:
            cmd += ["--topic", t]
        help_text = _mock_help()
        if "--max-seconds" in help_text:
            cmd += ["--max-seconds", str(self.max_seconds)]
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        self.pid = self.proc.pid
        ready, _, _ = select.select([self.proc.stdout], [], [], self.start_timeout)
        line = self.proc.stdout.readline().strip() if ready else ""
        if not line:
            self.stop()
            raise RuntimeError("mock cluster printed no bootstrap address")
        self.bootstrap = line.split(",")[0]
        return self

    def stop(self):
        if self.proc is not None:
            stop_process_group(self.proc)
            if self.proc.stdout:
                self.proc.stdout.close()

    def __enter__(self):
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc):
        self.stop()


_MOCK_HELP = None


def _mock_help() -> str:
    global _MOCK_HELP
    if _MOCK_HELP is None:
        try:
            _MOCK_HELP = MOCK_TOOL.read_text()
        except OSError:
            _MOCK_HELP = ""
    return _MOCK_HELP


def default_tmp_root() -> str:
    """Where data dirs go: ``$HERD_BENCH_TMP`` or the system temp dir. Results report its file
    system (:func:`filesystem_of`): on a tmpfs, fsync costs nothing and "durable" numbers lie."""
    return os.environ.get("HERD_BENCH_TMP") or tempfile.gettempdir()


def filesystem_of(path) -> str:
    """The file-system type holding ``path`` (from /proc/mounts), e.g. ``ext4`` or ``tmpfs``."""
    path = os.path.realpath(path)
    best, kind = "", "?"
    try:
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and (path == parts[1] or path.startswith(parts[1].rstrip("/") + "/")):
                if len(parts[1]) > len(best):
                    best, kind = parts[1], parts[2]
    except OSError:
        pass
    return kind


# ---- py-spy --------------------------------------------------------------------------------------


class PySpy:
    """Attach py-spy to ``pid`` for the duration of a ``with`` block; writes raw collapsed stacks."""

    def __init__(self, pid: int, out_path, rate: int = 250, native: bool = False, threads: bool = False):
        self.pid = pid
        self.out_path = str(out_path)
        self.rate = rate
        self.native = native
        self.threads = threads
        self.proc = None

    def __enter__(self):
        if not PY_SPY.exists():
            raise RuntimeError(f"py-spy not found at {PY_SPY} (pip install py-spy into the venv)")
        cmd = [
            str(PY_SPY),
            "record",
            "--pid",
            str(self.pid),
            "--format",
            "raw",
            "-o",
            self.out_path,
            "--rate",
            str(self.rate),
            "--duration",
            "600",
        ]
        cmd.append("--native" if self.native else "--nonblocking")
        if self.threads:
            cmd.append("--threads")
        self.proc = subprocess.Popen(
            cmd,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        time.sleep(0.5)  # let it attach
        return self

    def __exit__(self, *exc):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # py-spy writes its output on Ctrl-C
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                stop_process_group(self.proc)
        if self.proc is not None and self.proc.stderr:
            self.proc.stderr.close()


class Sampler:
    """Samples a process's RSS and CPU every ``interval`` s in a background thread."""

    def __init__(self, pid: int, interval: float = 0.5):
        import threading

        self.pid = pid
        self.interval = interval
        self.samples: list[tuple[float, int, float]] = []  # (t, rss bytes, cpu s)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            try:
                self.samples.append((time.perf_counter(), proc_rss_bytes(self.pid), proc_cpu_seconds(self.pid)))
            except OSError:
                return
            self._stop.wait(self.interval)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)

    def max_rss(self) -> int:
        return max((s[1] for s in self.samples), default=0)

    def cpu_util(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, _, c0), (t1, _, c1) = self.samples[0], self.samples[-1]
        return (c1 - c0) / (t1 - t0) if t1 > t0 else None

    def max_cpu_util(self, span: float = 5.0, first: int = 0) -> float | None:
        """Highest CPU utilisation over any ``span``-second stretch of the samples from ``first`` on."""
        samples = self.samples[first:]
        best = None
        j = 0
        for i, (t1, _, c1) in enumerate(samples):
            while j < i and t1 - samples[j][0] > span:
                j += 1
            t0, _, c0 = samples[max(0, j - 1)] if j else samples[0]
            if t1 - t0 >= span * 0.8:
                u = (c1 - c0) / (t1 - t0)
                best = u if best is None or u > best else best
        return best


# ---- statistics and output ----------------------------------------------------------------------


def percentiles(values, ps=(50, 99)) -> dict:
    """Nearest-rank percentiles of ``values`` (any iterable of numbers) plus max, count, mean."""
    data = sorted(values)
    n = len(data)
    out = {"count": n}
    if not n:
        for p in ps:
            out[f"p{p}"] = None
        out["max"] = None
        out["mean"] = None
        return out
    for p in ps:
        k = max(0, min(n - 1, int(round(p / 100 * n + 0.5)) - 1))
        out[f"p{p}"] = data[k]
    out["max"] = data[-1]
    out["mean"] = sum(data) / n
    return out


def rounded(obj, digits: int = 3):
    if isinstance(obj, float):
        return round(obj, digits)
    if isinstance(obj, dict):
        return {k: rounded(v, digits) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [rounded(v, digits) for v in obj]
    return obj


def table(rows: list[list], header: list[str]) -> str:
    cells = [[str(c) for c in header]] + [[("" if c is None else str(c)) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for r in cells:
        padded = [c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True))]
        lines.append("  ".join(padded))
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def emit(result: dict, text: str | None = None) -> dict:
    """Print the result as ONE JSON line on stdout and an optional human table on stderr."""
    if text:
        print(text, file=sys.stderr, flush=True)
    if isinstance(result.get("machine"), dict):
        # other work on a shared machine shows here; compare with loadavg_at_start
        result["machine"]["loadavg_at_end"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(rounded(result), sort_keys=False), flush=True)
    return result


def quick_from_env() -> bool:
    """``make bench`` runs every module's ``main()`` without arguments; ``HERD_BENCH_QUICK=1`` makes
    those runs use the ``--quick`` parameters."""
    return os.environ.get("HERD_BENCH_QUICK", "") not in ("", "0", "false", "no")


def arg_parser(prog: str, description: str, quick: str) -> argparse.ArgumentParser:
    """Where every benchmark's parser starts: ``python -m bench.NAME``, its description, and
    ``--quick`` (``quick`` says what it shortens)."""
    ap = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    ap.add_argument("--quick", action="store_true", help=quick)
    return ap


def parse(parser, argv, sized: dict | None = None):
    """Parse ``argv`` (None: defaults, as when ``python -m bench`` calls ``main()``), applying
    ``HERD_BENCH_QUICK`` when no argv is given. ``sized``: ``{dest: (quick, full)}``, the value an
    option left unset (None) takes with and without ``--quick``."""
    if argv is None:
        argv = ["--quick"] if quick_from_env() else []
    args = parser.parse_args(argv)
    for dest, (quick, full) in (sized or {}).items():
        if getattr(args, dest) is None:
            setattr(args, dest, quick if args.quick else full)
    return args
