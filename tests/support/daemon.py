"""Start the real herd daemon as a subprocess on 127.0.0.1, port 0, for integration tests."""
from __future__ import annotations

import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class Daemon:
    """``with Daemon(tmp_path) as d: d.bootstrap`` — stops (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, data_dir, *extra_args, env=None, initial_rebalance_delay_ms=0,
                 fsync="always", start_timeout=30.0):
        self.data_dir = Path(data_dir)
        self.extra_args = [str(a) for a in extra_args]
        self.env = env or {}
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.fsync = fsync
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.log_path = self.data_dir.parent / f"{self.data_dir.name}.herd.log"

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    def start(self) -> Daemon:
        self.spawn()
        return self.wait_ready()

    def spawn(self) -> Daemon:
        """Start the process without waiting for it to be ready (see :meth:`wait_ready`)."""
        port_file = self.port_file
        if port_file.exists():
            port_file.unlink()
        env = dict(os.environ)
        env.pop("HERD_PORT", None)
        env.update(self.env)
        env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "coordinator", "serve", "--host", "127.0.0.1", "--port", "0",
               "--data-dir", str(self.data_dir), "--port-file", str(port_file),
               "--initial-rebalance-delay-ms", str(self.initial_rebalance_delay_ms),
               "--fsync", self.fsync, "--log-format", "json", *self.extra_args]
        if getattr(self, "_log", None) is not None:
            self._log.close()
        self._log = open(self.log_path, "ab")
        # The daemon says READY=1 on a notify socket once it listens (systemd's protocol), after
        # writing the port file: wait_ready waits for that datagram, or for the process to exit.
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind("\0herd-test-%d-%d" % (os.getpid(), id(self)))
        env["NOTIFY_SOCKET"] = "@" + self._notify.getsockname()[1:].decode()
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(REPO), env=env)
        return self

    @property
    def port_file(self) -> Path:
        return self.data_dir.parent / f"{self.data_dir.name}.port"

    def wait_ready(self) -> Daemon:
        with self._notify as notify:
            if self._wait_ready(notify):
                self.port = int(self.port_file.read_text())
                return self
        if self.proc.poll() is not None:
            raise RuntimeError(f"herd exited with {self.proc.returncode} during start-up:\n{self.logs()}")
        self.kill()
        raise RuntimeError(f"herd did not start within {self.start_timeout}s:\n{self.logs()}")

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

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM and wait; returns the exit code."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else None
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

    def __enter__(self):
        return self.start() if self.proc is None else self  # ``with Daemon(...).spawn() as d``

    def __exit__(self, *exc):
        self.stop()
        if self.proc is not None and self.proc.poll() is None:
            self.kill()
        self._log.close()
        self._notify.close()
