"""The edge's limits that need no socket: the log limiter (per kind and address, a burst per
window, what was suppressed reported with the next line), the accept-failure handler."""
from __future__ import annotations

import errno

from coordinator.config import Config
from coordinator.edge.server import LOG_FIELD_MAX, LogLimiter, Server, _clip
from coordinator.ops.metrics import Metrics


def test_log_limiter_allows_a_burst_per_kind_and_address_then_counts():
    lim = LogLimiter(burst=3, window_s=10.0)
    assert [lim.allow("malformed", "10.0.0.1", 0.0) for _ in range(5)] == [0, 0, 0, None, None]
    assert lim.allow("malformed", "10.0.0.2", 0.1) == 0  # another address: its own budget
    assert lim.allow("idle", "10.0.0.1", 0.2) == 0  # another kind: its own budget
    assert lim.suppressed == {"malformed": 2}
    assert lim.allow("malformed", "10.0.0.1", 9.9) is None
    assert lim.allow("malformed", "10.0.0.1", 10.0) == 3  # a new window: the line says 3 were dropped
    assert lim.allow("malformed", "10.0.0.1", 10.1) == 0
    assert 'herd_log_suppressed_total{kind="malformed"} 3' in lim.metric_lines()


def test_log_limiter_forgets_old_addresses_past_its_size():
    from coordinator.edge import server as S

    lim = LogLimiter(burst=1, window_s=10.0)
    for i in range(S.LOG_LIMITER_KEYS + 5):
        lim.allow("malformed", f"h{i}", 0.0)
    assert len(lim.windows) <= S.LOG_LIMITER_KEYS


def test_clip():
    assert _clip("a" * 10) == "a" * 10
    long = _clip("x" * 40000)
    assert long.startswith("x" * LOG_FIELD_MAX) and len(long) < LOG_FIELD_MAX + 32 and "40000" in long
    assert _clip(None) is None and _clip(7) == 7


class _Runtime:
    def attach_edge(self, edge):
        pass


def test_an_accept_out_of_descriptors_is_counted_and_logged_once_per_window(capsys):
    import asyncio

    server = Server(Config().validate(), _Runtime(), Metrics())
    loop = asyncio.new_event_loop()
    try:
        server.loop = loop
        for _ in range(20):
            server._exception_handler(loop, {"message": "socket.accept() out of system resource",
                                             "exception": OSError(errno.EMFILE, "Too many open files")})
    finally:
        loop.close()
    assert server.accept_failures == 20
    assert "herd_accept_failures_total 20" in server.metric_lines()
    assert server.log_limiter.suppressed == {"accept_failed": 20 - server.log_limiter.burst}
