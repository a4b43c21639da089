"""coordinator/looplag.py: the probe's histogram, quantiles and exposition."""
from __future__ import annotations

from coordinator.ops.looplag import BUCKETS, LoopLag


def test_observations_land_in_buckets_and_quantiles_are_bucket_bounds():
    lag = LoopLag()
    assert lag.quantile(0.5) is None and lag.summary()["samples"] == 0
    for v in [0.0005] * 98 + [0.03, 3.0]:
        lag.observe(v)
    assert lag.quantile(0.5) == 0.001 and lag.quantile(0.99) == 0.05 and lag.quantile(1.0) == 3.0
    s = lag.summary()
    assert s["samples"] == 100 and s["max_ms"] == 3000.0 and s["p50_le_ms"] == 1.0
    lines = lag.metric_lines()
    assert 'herd_event_loop_lag_seconds_bucket{le="0.001"} 98' in lines
    assert 'herd_event_loop_lag_seconds_bucket{le="+Inf"} 100' in lines
    assert "herd_event_loop_lag_max_seconds 3.0" in lines
    assert len([ln for ln in lines if "_bucket" in ln]) == len(BUCKETS) + 1


class ManualLoop:
    """call_later records the callback; the test runs it (no real time passes)."""

    def __init__(self):
        self.pending = []

    def call_later(self, delay, fn):
        self.pending.append((delay, fn))
        return self

    def cancel(self):
        self.pending.clear()


def test_the_probe_measures_a_blocked_loop_on_a_manual_clock():
    now = [100.0]
    loop = ManualLoop()
    lag = LoopLag(interval=0.01, clock=lambda: now[0]).start(loop)
    (delay, tick), = loop.pending
    assert delay == 0.01
    loop.pending.clear()
    now[0] += 0.01  # on time
    tick()
    now[0] += 0.01 + 0.2  # the loop was busy 200 ms past the probe's due time
    loop.pending.pop()[1]()
    assert sum(lag.counts) == 2 and lag.counts[0] == 1 and abs(lag.max - 0.2) < 1e-9
    lag.stop()
    assert loop.pending == []


def test_a_lag_as_long_as_a_stall_is_left_to_the_stall_detector_to_log(monkeypatch):
    from coordinator.ops import looplag

    logged = []
    monkeypatch.setattr(looplag.log, "warning", lambda event, **kw: logged.append((event, kw)))
    lag = looplag.LoopLag(warn_s=0.25, stall_s=1.0)
    lag.observe(0.5)
    lag.observe(15.0)  # a stall: logged once, by coordinator.ops.stall, as loop.stall
    assert logged == [("loop.lag", {"lag_ms": 500.0})]
    assert sum(lag.counts) == 2 and lag.max == 15.0  # both still measured
    quiet = looplag.LoopLag(warn_s=0.25)
    quiet.observe(15.0)
    assert len(logged) == 2
