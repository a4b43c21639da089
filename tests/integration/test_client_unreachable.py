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


def test_poll_says_no_broker_was_reached_and_keeps_trying_until_one_is(tmp_path, caplog):
    # A wrong port: poll returned an empty assignment forever, the only trace an INFO log line.
    # Now: a WARNING naming the address and the error at once, NoBrokersAvailableError from poll
    # after broker.unreachable.timeout.ms, and the consumer still reconnecting, so a loop that
    # catches it gets its partitions once a broker listens there (a restart).
    import logging

    from client import NoBrokersAvailableError
    from tools.daemon import Daemon

    caplog.set_level(logging.WARNING, logger="herd.client")
    port = _closed_port()
    c = GroupConsumer(f"127.0.0.1:{port}", "g", broker_unreachable_timeout_ms=500,
                      reconnect_backoff_ms=20, reconnect_backoff_max_ms=100)
    try:
        c.subscribe(["t"])
        t0 = time.monotonic()
        assert c.poll(0.1) == frozenset()  # within the timeout: an empty assignment, as before
        with pytest.raises(NoBrokersAvailableError) as err:
            for _ in range(20):
                c.poll(0.2)
        assert 0.5 <= time.monotonic() - t0 < 3
        assert isinstance(err.value, KafkaTimeoutError)
        assert f"cannot reach the bootstrap server 127.0.0.1:{port}: connect failed: ECONNREFUSED" in str(err.value)
        warned = [r for r in caplog.records if r.levelno == logging.WARNING and f"127.0.0.1:{port}" in r.getMessage()]
        assert warned and "ECONNREFUSED" in warned[0].getMessage()
        with Daemon(tmp_path / "data", "--port", str(port)):  # a broker starts at that address
            deadline = time.monotonic() + 30
            assigned = frozenset()
            while not assigned and time.monotonic() < deadline:
                assigned = c.poll(0.5)
            assert assigned == {T0}
            assert c.poll(0.0) == {T0}  # reached: no error any more
            c.close(timeout_s=5)
    finally:
        c.close(timeout_s=2)
