"""herd cluster nodes as real processes (``herd serve --store postgresql://...``) on loopback, port 0."""
from __future__ import annotations

import signal
import time
from pathlib import Path

from protocol import messages as m
from tools.daemon import Daemon
from tools.rawclient import RawClient

FIND_COORDINATOR_V = 3
METADATA_V = 9


class Node(Daemon):
    """One node; the store URL goes in HERD_STORE (never on the command line: ``ps`` shows flags)."""

    def __init__(self, tmp_path: Path, node_id: int, url: str, *extra, lease_ms: int = 2000,
                 offsets_partitions: int = 12, initial_rebalance_delay_ms: int = 0, env=None, **kw):
        super().__init__(tmp_path / f"node{node_id}", "--node-id", node_id, "--shard-lease-ms", lease_ms,
                         "--offsets-partitions", offsets_partitions, *extra,
                         env={"HERD_STORE": url, **(env or {})},
                         initial_rebalance_delay_ms=initial_rebalance_delay_ms, **kw)
        self.node_id = node_id

    def pause(self) -> None:
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        self.proc.send_signal(signal.SIGCONT)

    def client(self, timeout: float = 10.0) -> RawClient:
        return RawClient(self.address, timeout=timeout)


def find_coordinator(address, group: str, timeout: float = 10.0):
    with RawClient(address, timeout=timeout) as c:
        return c.call(m.FindCoordinatorRequest(key=group, key_type=0), FIND_COORDINATOR_V)


def metadata(address, topics=None):
    with RawClient(address) as c:
        req = m.MetadataRequest(topics=topics, allow_auto_topic_creation=True)
        return c.call(req, METADATA_V)


def coordinator_of(nodes, group: str, timeout: float = 20.0, via=None):
    """-> the node that FindCoordinator names for ``group`` once it answers NONE (asked of ``via``,
    default every node in turn); that node must be one of ``nodes``."""
    deadline = time.monotonic() + timeout
    alive = [n for n in nodes if n.proc is not None and n.proc.poll() is None]
    i = 0
    last = None
    while time.monotonic() < deadline:
        ask = via or alive[i % len(alive)]
        i += 1
        try:
            last = find_coordinator(ask.address, group, timeout=5.0)
        except OSError as exc:
            last = exc
        else:
            if last.error_code == 0:
                for n in nodes:
                    if n.node_id == last.node_id and n.port == last.port:
                        return n
        time.sleep(0.05)
    raise AssertionError(f"no coordinator for {group!r} within {timeout}s: last answer {last}")
