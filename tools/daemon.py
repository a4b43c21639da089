"""Start a real herd daemon as a subprocess on 127.0.0.1, port 0: the one launcher of the tests and
the benchmarks (``tests/`` and ``bench/`` both import it from here; bench imports nothing of tests).

    with Daemon(tmp_path / "data", "--topic", "t:3") as d:   # the tests' form
        d.bootstrap, d.address, d.port, d.proc, d.logs()
    with Daemon(fsync="never", topics=["bench:100"], isolate=True) as d:   # bench/_util.herd()
        d.pid, d.start_seconds, d.log_events("rebalance_completed")

The daemon runs ``python -m coordinator serve`` from this checkout with every ``HERD_*`` variable of
the caller's environment removed (``env`` adds the ones meant), logs JSON lines to
``<data_dir>.herd.log`` and writes its port to ``<data_dir>.port``. Ready means the daemon said
``READY=1`` on a notify socket (systemd's protocol, which herd speaks), after writing the port file;
the wait wakes up on that datagram or on the process's exit (a pidfd), never on a timer.

``isolate=True`` (the benchmarks): the daemon gets its own session, dies with this process
(``PR_SET_PDEATHSIG``: note that this is tied to the thread that started it) and stopping it kills
its whole process group (a ``wrap`` command such as py-spy included). ``wrap``: a command prefix;
``pid`` is then the daemon's own pid (the wrapper's child), so CPU readings stay the daemon's.
Without ``data_dir`` the data lives in a temporary directory removed on exit (``keep_data`` keeps it).
"""
from __future__ import annotations

import contextlib
import ctypes
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

__all__ = ["Daemon", "REPO", "die_with_parent", "stop_process_group"]

REPO = Path(__file__).resolve().parents[1]


def die_with_parent():
    """preexec_fn: SIGTERM this child when the thread that started it dies (Linux prctl)."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def stop_process_group(proc: subprocess.Popen, timeout: float = 15.0) -> int | None:
    """SIGTERM the child's process group, wait, then SIGKILL the group. Returns the exit code."""
    if proc is None:
        return None
    try:
        pgid = os.getpgid(proc.pid)
    except ProcessLookupError:
        pgid = None
    if proc.poll() is None and pgid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            pass
    if pgid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)  # stragglers (e.g. a py-spy wrapper's child)
    if proc.poll() is None:
        proc.kill()
        proc.wait(10)
    return proc.returncode


def _children(pid: int) -> list[int]:
    try:
        text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    except OSError:
        return []
    return [int(x) for x in text.split()]


def logged_metrics_port(logs, timeout: float = 10.0) -> int:
    """The HTTP port in a daemon's "metrics listening" JSON log line, ``logs()`` returning its log
    so far; waits up to ``timeout`` seconds for the line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in logs().splitlines():
            if '"metrics listening"' in line:
                try:
                    return json.loads(line)["port"]
                except (ValueError, KeyError):
                    continue
        time.sleep(0.02)
    raise RuntimeError("the daemon did not log its metrics port")


class Daemon:
    """One herd daemon process; see the module docstring. ``with`` starts it (unless already
    spawned) and always stops it (SIGTERM, then SIGKILL)."""

    def __init__(self, data_dir=None, *args, extra_args=(), env=None, topics=(), fsync="always",
                 initial_rebalance_delay_ms=0, log_level=None, wrap=None, start_timeout=30.0,
                 isolate=False, tmp_root=None, keep_data=False):
        self.extra_args = [str(a) for a in (*args, *extra_args)]
        self.env = env or {}
        self.topics = list(topics)
        self.fsync = fsync
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.log_level = log_level
        self.wrap = list(wrap or [])
        self.start_timeout = start_timeout
        self.isolate = isolate
        self.keep_data = keep_data or data_dir is not None
        self._tmp = None
        if data_dir is None:
            self._tmp = tempfile.TemporaryDirectory(prefix="herd-daemon-", dir=tmp_root)
            data_dir = Path(self._tmp.name) / "data"
        self.data_dir = Path(data_dir)
        self.proc: subprocess.Popen | None = None
        self.pid: int | None = None
        self.port: int | None = None
        self.start_seconds: float | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.herd.log"
        self._log = None
        self._notify: socket.socket | None = None
        self._started = 0.0

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def port_file(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.port"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "coordinator", "serve", "--host", "127.0.0.1", "--port", "0",
               "--data-dir", str(self.data_dir), "--port-file", str(self.port_file),
               "--initial-rebalance-delay-ms", str(self.initial_rebalance_delay_ms),
               "--fsync", self.fsync, "--log-format", "json"]
        if self.log_level is not None:
            cmd += ["--log-level", self.log_level]
        for t in self.topics:
            cmd += ["--topic", t]
        return self.wrap + cmd + self.extra_args

    def start(self) -> Daemon:
        self.spawn()
        return self.wait_ready()

    def spawn(self) -> Daemon:
        """Start the process without waiting for it to be ready (see :meth:`wait_ready`)."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.port_file.unlink(missing_ok=True)
        env = {k: v for k, v in os.environ.items() if not k.startswith("HERD_")}
        env.update(self.env)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        if self._log is not None:
            self._log.close()
        self._log = open(self.log_path, "ab")
        if self._notify is not None:
            self._notify.close()
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind("\0herd-daemon-%d-%d" % (os.getpid(), id(self)))
        env["NOTIFY_SOCKET"] = "@" + self._notify.getsockname()[1:].decode()
        extra = {"start_new_session": True, "preexec_fn": die_with_parent} if self.isolate else {}
        self._started = time.perf_counter()
        self.proc = subprocess.Popen(self.command(), stdout=self._log, stderr=subprocess.STDOUT, cwd=str(REPO),
                                     env=env, **extra)
        self.pid = self.proc.pid
        return self

    def wait_ready(self) -> Daemon:
        with self._notify as notify:
            if self._wait_ready(notify):
                self.start_seconds = time.perf_counter() - self._started
                self.port = int(self.port_file.read_text())
                if self.wrap:  # the daemon is the wrapper's child
                    for _ in range(200):
                        kids = _children(self.proc.pid)
                        if kids:
                            self.pid = kids[0]
                            break
                        time.sleep(0.01)
                return self
        if self.proc.poll() is not None:
            raise RuntimeError(f"herd exited with {self.proc.returncode} during start-up:\n{self.logs()[-3000:]}")
        self.stop() if self.isolate else self.kill()
        raise RuntimeError(f"herd did not start within {self.start_timeout}s:\n{self.logs()[-3000:]}")

    def _wait_ready(self, notify: socket.socket) -> bool:
        """Until READY=1 arrives (True), the daemon exits or start_timeout passes (False). The
        child's exit is seen through a pidfd, so nothing here wakes up on a timer."""
        pidfd = os.pidfd_open(self.proc.pid)
        try:
            with selectors.DefaultSelector() as sel:
                sel.register(notify, selectors.EVENT_READ)
                sel.register(pidfd, selectors.EVENT_READ)
                deadline = time.monotonic() + self.start_timeout
                while (left := deadline - time.monotonic()) > 0:
                    for key, _ in sel.select(left):
                        if key.fileobj is notify:
                            if b"READY=1" in notify.recv(4096).split(b"\n"):
                                return True
                        else:
                            return False  # exited
                return False
        finally:
            os.close(pidfd)

    def logs(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_events(self, event: str) -> list[dict]:
        """The JSON log lines whose event is ``event``."""
        out = []
        for line in self.logs().splitlines():
            if f'"{event}"' not in line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("event") == event:
                out.append(obj)
        return out

    def wait_metrics_port(self, timeout: float = 10.0) -> int:
        """The HTTP port the daemon logged (``--metrics-port 0``), see :func:`logged_metrics_port`."""
        return logged_metrics_port(self.logs, timeout)

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait (then SIGKILL); returns the exit code (None if it had to be killed,
        unless isolated: then the code the kill gave)."""
        if self.proc is None:
            return None
        if self.isolate:
            try:
                if self.wrap and self.pid and self.pid != self.proc.pid:
                    # stop the daemon first so the wrapper (py-spy) can write its output
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(self.pid, signal.SIGTERM)
                    try:
                        self.proc.wait(60)
                    except subprocess.TimeoutExpired:
                        pass
                return stop_process_group(self.proc, timeout)
            finally:
                self._close_log()
        if self.proc.poll() is not None:
            return self.proc.returncode
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def restart(self) -> Daemon:
        self.stop()
        return self.start()

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def cleanup(self) -> None:
        """Remove the temporary data directory (when there is one and keep_data is off); with
        ``HERD_BENCH_LOGS=DIR`` in the environment, copy the daemon's log there first."""
        keep = os.environ.get("HERD_BENCH_LOGS")
        if keep and self.log_path.exists():
            import shutil

            Path(keep).mkdir(parents=True, exist_ok=True)
            shutil.copy(self.log_path, Path(keep) / f"herd-{self.pid}.log")
        if self._tmp is not None and not self.keep_data:
            self._tmp.cleanup()
            self._tmp = None

    def __enter__(self):
        if self.proc is not None:  # ``with Daemon(...).spawn() as d``
            return self
        try:
            return self.start()
        except BaseException:
            self.stop()
            self._close_files()
            self.cleanup()
            raise

    def _close_files(self) -> None:
        self._close_log()
        if self._notify is not None:
            self._notify.close()

    def __exit__(self, *exc):
        try:
            self.stop()
            self.kill()
        finally:
            self._close_files()
            self.cleanup()
