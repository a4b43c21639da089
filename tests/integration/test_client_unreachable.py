"""The thin client against an unreachable broker: real sockets, real timeouts."""
from __future__ import annotations

import socket
import time

import pytest

from client import GroupConsumer, KafkaTimeoutError, TopicPartition

pytestmark = pytest.mark.integration

T0 = TopicPartition("t", 0)


def _closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def test_unreachable_broker_calls_time_out_and_queue_stays_bounded():
    port = _closed_port()
    c = GroupConsumer(f"127.0.0.1:{port}", "g", reconnect_backoff_ms=20, reconnect_backoff_max_ms=50)
    try:
        t0 = time.monotonic()
        with pytest.raises(KafkaTimeoutError):
            c.commit({T0: 1}, timeout_s=0.3)
        with pytest.raises(KafkaTimeoutError):
            c.committed([T0], timeout_s=0.3)
        assert time.monotonic() - t0 < 3
        for _ in range(500):  # a caller that never polls
            c.commit({T0: 1}, sync=False)
        time.sleep(0.2)
        assert c._events.qsize() <= 2
        c.subscribe(["t"])
        assert c.poll(0.2) == frozenset()
    finally:
        t0 = time.monotonic()
        c.close(timeout_s=2)
        assert time.monotonic() - t0 < 4
    assert not c._net.is_alive()
