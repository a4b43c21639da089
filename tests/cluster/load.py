"""Commit load against a cluster, as a client sees it: find the coordinator (any live node), commit the
next offset, count it acknowledged only on NONE, re-find on a retriable error. Bounded in time."""
from __future__ import annotations

import threading
import time

from protocol import errors as E
from protocol import messages as m
from tools.rawclient import RawClient

RETRIABLE = {E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS}


def alive(nodes):
    return [n for n in nodes if n.proc is not None and n.proc.poll() is None and n.port is not None]


def find(nodes, group: str):
    """-> the live node FindCoordinator names for ``group`` now, or None."""
    for ask in alive(nodes):
        try:
            with RawClient(ask.address, timeout=2.0) as c:
                r = c.call(m.FindCoordinatorRequest(key=group, key_type=0), 3)
        except OSError:
            continue
        if r.error_code == E.NONE:
            for n in alive(nodes):
                if n.node_id == r.node_id and n.port == r.port:
                    return n
    return None


def commit_request(group: str, offset: int, topic: str = "load", partition: int = 0):
    return m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
        m.OffsetCommitRequestTopic(name=topic, partitions=[
            m.OffsetCommitRequestPartition(partition_index=partition, committed_offset=offset)])])


def fetch_offset(nodes, group: str, topic: str = "load", partition: int = 0, timeout: float = 30.0) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        node = find(nodes, group)
        if node is not None:
            try:
                with RawClient(node.address, timeout=5.0) as c:
                    r = c.call(m.OffsetFetchRequest(group_id=group, topics=[
                        m.OffsetFetchRequestTopic(name=topic, partition_indexes=[partition])]), 5)
                if r.error_code == E.NONE:
                    return r.topics[0].partitions[0].committed_offset
            except OSError:
                pass
        time.sleep(0.05)
    raise AssertionError(f"no OffsetFetch answer for {group} within {timeout}s")


class Committer(threading.Thread):
    """Commits 1, 2, 3, ... to (group, load, 0) until stopped or ``limit_s`` passes. ``acked``: the
    highest offset acknowledged; ``codes``: every error code seen; ``unexpected``: non-retriable ones;
    ``seen``: offsets read back (OffsetFetch) after each reconnect, to check none went backwards."""

    def __init__(self, nodes, group: str, limit_s: float = 120.0):
        super().__init__(daemon=True)
        self.nodes, self.group, self.limit_s = nodes, group, limit_s
        self.acked = 0
        self.acks = 0
        self.codes: dict[int, int] = {}
        self.unexpected: list[int] = []
        self.backwards: list[tuple[int, int]] = []  # (read back, acknowledged before)
        self.stop_event = threading.Event()
        self.last_ack_at = time.monotonic()

    def stop(self) -> None:
        self.stop_event.set()
        self.join(15)

    def run(self) -> None:
        deadline = time.monotonic() + self.limit_s
        while not self.stop_event.is_set() and time.monotonic() < deadline:
            node = find(self.nodes, self.group)
            if node is None:
                time.sleep(0.05)
                continue
            try:
                with RawClient(node.address, timeout=10.0) as c:
                    r = c.call(m.OffsetFetchRequest(group_id=self.group, topics=[
                        m.OffsetFetchRequestTopic(name="load", partition_indexes=[0])]), 5)
                    if r.error_code == E.NONE:
                        got = r.topics[0].partitions[0].committed_offset
                        if self.acked > 0 and got < self.acked:
                            self.backwards.append((got, self.acked))
                    while not self.stop_event.is_set() and time.monotonic() < deadline:
                        nxt = self.acked + 1
                        resp = c.call(commit_request(self.group, nxt), 7)
                        code = resp.topics[0].partitions[0].error_code
                        if code == E.NONE:
                            self.acked = nxt
                            self.acks += 1
                            self.last_ack_at = time.monotonic()
                            continue
                        self.codes[code] = self.codes.get(code, 0) + 1
                        if code not in RETRIABLE:
                            self.unexpected.append(code)
                        break
            except OSError:
                pass
            time.sleep(0.05)
