"""A real Apache Kafka broker (4.x, KRaft, one node, loopback only) for the reference tests and
bench.vs_kafka. The jars come from `make reference-deps` (Maven); the node is formatted in a
temporary directory and stopped (SIGTERM, then SIGKILL) on exit.

    with KafkaBroker(tmp_dir) as kafka:
        kafka.bootstrap  # "127.0.0.1:<port>"
"""
from __future__ import annotations

import base64
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import time
import uuid
from pathlib import Path

from protocol import messages as m
from tools.rawclient import RawClient
from tools.reference import classpath, java


def _die_with_parent() -> None:
    """preexec_fn: the broker gets SIGKILL when the process that started it dies (a killed test
    run must not leave a JVM behind). Linux prctl(PR_SET_PDEATHSIG)."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)
    except OSError:
        pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
logger.coord.name = org.apache.kafka.coordinator.group
logger.coord.level = {level}
"""


class KafkaBroker:
    """One combined broker+controller node. ``overrides`` are extra server.properties lines."""

    def __init__(self, work_dir, overrides: dict[str, object] | None = None, heap: str = "512m",
                 start_timeout: float = 90.0, log_level: str = "WARN"):
        self.dir = Path(work_dir)
        self.overrides = dict(overrides or {})
        self.heap = heap
        self.start_timeout = start_timeout
        self.log_level = log_level
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None
        self.controller_port: int | None = None

    @property
    def bootstrap(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def address(self) -> tuple[str, int]:
        return ("127.0.0.1", self.port)

    @property
    def log_path(self) -> Path:
        return self.dir / "server.log"

    def _java(self, main: str, *args: str) -> list[str]:
        # The one-shot format tool starts faster with only C1; the broker gets the full JIT.
        jit = ["-XX:TieredStopAtLevel=1"] if main != "kafka.Kafka" else []
        return [java(), f"-Xmx{self.heap}", "-Xms64m", "-XX:+UseSerialGC", *jit, "-Djava.awt.headless=true",
                f"-Dlog4j2.configurationFile={self.dir / 'log4j2.properties'}", "-cp", classpath(), main, *args]

    def _write_config(self) -> Path:
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "log4j2.properties").write_text(LOG4J2.format(log=self.log_path, level=self.log_level))
        props = {
            "process.roles": "broker,controller",
            "node.id": 1,
            "controller.quorum.voters": f"1@127.0.0.1:{self.controller_port}",
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.dir / "data"),
            "num.partitions": 1,
            "offsets.topic.replication.factor": 1,
            "offsets.topic.num.partitions": 1,
            "transaction.state.log.replication.factor": 1,
            "transaction.state.log.min.isr": 1,
            "share.coordinator.state.topic.replication.factor": 1,
            "share.coordinator.state.topic.min.isr": 1,
            "group.initial.rebalance.delay.ms": 0,
            "auto.create.topics.enable": "true",
            "num.network.threads": 2,
            "num.io.threads": 2,
            "log.flush.interval.messages": 9223372036854775807,
        }
        props.update(self.overrides)
        path = self.dir / "server.properties"
        path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))
        return path

    def start(self) -> KafkaBroker:
        for _attempt in range(3):  # a free port can be taken between the probe and the bind
            self.port, self.controller_port = free_port(), free_port()
            config = self._write_config()
            data = self.dir / "data"
            if data.exists():
                shutil.rmtree(data)
            fmt = subprocess.run(self._java("kafka.tools.StorageTool", "format", f"--cluster-id={_cluster_id()}",
                                            "-c", str(config), "--ignore-formatted"),
                                 capture_output=True, text=True, timeout=120)
            if fmt.returncode != 0:
                raise RuntimeError(f"kafka storage format failed:\n{fmt.stdout}\n{fmt.stderr}")
            self._out = open(self.dir / "stdout.log", "ab")
            self.proc = subprocess.Popen(self._java("kafka.Kafka", str(config)), stdout=self._out,
                                         stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_die_with_parent)
            if self._wait_ready():
                return self
            if self.proc.poll() is None:
                self.kill()
            if "Address already in use" not in self.logs():
                break
        raise RuntimeError(f"Kafka did not start within {self.start_timeout}s:\n{self.logs()[-5000:]}")

    def restart(self) -> float:
        """Stop and start again on the same data (no format); returns seconds from the new process's
        start until FindCoordinator answers (the offsets topic is loaded: see bench.vs_kafka)."""
        self.stop()
        self._out.close()
        self._out = open(self.dir / "stdout.log", "ab")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self._java("kafka.Kafka", str(self.dir / "server.properties")),
                                     stdout=self._out, stderr=subprocess.STDOUT, start_new_session=True,
                                         preexec_fn=_die_with_parent)
        if not self._wait_ready():
            raise RuntimeError(f"Kafka did not restart within {self.start_timeout}s:\n{self.logs()[-5000:]}")
        return time.monotonic() - t0

    @property
    def pid(self) -> int:
        return self.proc.pid

    def _wait_ready(self) -> bool:
        """Until FindCoordinator for a group answers NONE (the offsets topic exists and is loaded)."""
        deadline = time.monotonic() + self.start_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                return False
            try:
                with RawClient(self.address, timeout=5) as c:
                    while time.monotonic() < deadline:
                        r = c.call(m.FindCoordinatorRequest(key="herd-probe", key_type=0), 1)
                        if r.error_code == 0:
                            return True
                        time.sleep(0.2)
            except OSError:
                time.sleep(0.2)
        return False

    def logs(self) -> str:
        out = []
        for name in ("stdout.log", "server.log"):
            try:
                out.append((self.dir / name).read_text(errors="replace"))
            except OSError:
                pass
        return "\n".join(out)

    def stop(self, timeout: float = 30.0) -> int | None:
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
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def __enter__(self) -> KafkaBroker:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
        self.kill()
        if getattr(self, "_out", None):
            self._out.close()


def _cluster_id() -> str:
    """A KRaft cluster id: 16 random bytes, URL-safe base64 without padding (Uuid.toString)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
