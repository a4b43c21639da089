"""Real groups in a real daemon for the console tests and the screenshots: members of the thin
client (``client.GroupConsumer``), a member-less writer, a group that emptied, and a group id that
is HTML."""
from __future__ import annotations

import http.client
import time

from client import GroupConsumer, TopicPartition
from tools.daemon import logged_metrics_port

HOSTILE = '<img src=x onerror="window.__pwned=1">&amp;"\'/x'


def metrics_port(d, timeout: float = 10.0) -> int:
    """The daemon's HTTP port from its log (anything with ``logs()``)."""
    return logged_metrics_port(d.logs, timeout)


def get(port: int, path: str) -> tuple[int, dict, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


def member(bootstrap: str, group: str, client_id: str, topics=("orders",)) -> GroupConsumer:
    c = GroupConsumer(bootstrap, group, client_id=client_id, session_timeout_ms=6000, heartbeat_interval_ms=500,
                      enable_auto_commit=False)
    c.subscribe(list(topics))
    return c


def poll_until(consumers, pred, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for c in consumers:
            c.poll(0.05)
        if pred():
            return
    raise AssertionError("the group did not settle in time")


def stable(consumers, partitions: int) -> bool:
    owned = [c.assignment() for c in consumers]
    return sum(len(a) for a in owned) == partitions and all(owned)


def commit_standalone(bootstrap: str, group: str, offsets: dict) -> None:
    """Offsets committed by a writer that never joins (generation -1, as Spark jobs do)."""
    with GroupConsumer(bootstrap, group, client_id=f"{group}-writer", enable_auto_commit=False) as c:
        c.commit({TopicPartition(t, p): off for (t, p), off in offsets.items()})


def build(bootstrap: str) -> dict:
    """billing: 2 live members of orders (4 partitions) with commits; audit: a member-less writer;
    reports: joined, committed, left (Empty); plus a group whose id is HTML. Returns the live
    consumers by name (close them)."""
    commit_standalone(bootstrap, "audit", {("orders", 0): 120, ("orders", 1): 80, ("payments", 0): 7})
    commit_standalone(bootstrap, HOSTILE, {("orders", 0): 1})
    reports = member(bootstrap, "reports", "reports-1")
    poll_until([reports], lambda: stable([reports], 4))
    reports.commit({TopicPartition("orders", p): 10 * p for p in range(4)})
    reports.close()
    a = member(bootstrap, "billing", "billing-1")
    b = member(bootstrap, "billing", "billing-2")
    poll_until([a, b], lambda: stable([a, b], 4))
    a.commit({tp: 100 + tp.partition for tp in a.assignment()})
    b.commit({tp: 200 + tp.partition for tp in b.assignment()})
    return {"billing-1": a, "billing-2": b}
