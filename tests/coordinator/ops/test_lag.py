"""The lag tracker: samples, offset and time lag by interpolation, bounded history, staleness, and
the refresher's handling of a failing, slow or partial source (fake sources, the manual clock)."""
from __future__ import annotations

import asyncio

import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.clock import ManualClock
from coordinator.ops.lag import LagRefresher, LagTracker, LogEndSource, time_at

T0 = 1_700_000_000_000
TP = ("orders", 0)


def tracker_with(points, history=30):
    tr = LagTracker(history=history, stale_after_ms=60_000)
    for end, at in points:
        tr.observe({TP: end}, at)
    return tr


def test_offset_lag_is_log_end_minus_committed_and_never_negative():
    tr = tracker_with([(100, T0)])
    assert tr.lag(TP, 40, T0)[:2] == (100, 60)
    assert tr.lag(TP, 100, T0)[:3] == (100, 0, 0)
    assert tr.lag(TP, 150, T0)[:3] == (100, 0, 0)  # past the log end (recreated topic): caught up
    assert tr.lag(("other", 0), 5, T0) == (None, None, None, True)  # never sampled: unknown, no invented lag


def test_time_lag_interpolates_between_the_samples_that_bracket_the_committed_offset():
    # log end 0 at T0, 1000 at T0+10s, 3000 at T0+20s: offset 500 was reached at T0+5s,
    # 2000 at T0+15s
    tr = tracker_with([(0, T0), (1000, T0 + 10_000), (3000, T0 + 20_000)])
    now = T0 + 20_000
    assert tr.lag(TP, 500, now) == (3000, 2500, 15_000, False)
    assert tr.lag(TP, 2000, now)[2] == 5_000
    assert tr.lag(TP, 1000, now)[2] == 10_000  # exactly on a sample
    assert tr.lag(TP, 3000, now)[2] == 0


def test_time_lag_grows_while_nothing_is_committed():
    tr = tracker_with([(0, T0), (1000, T0 + 10_000)])
    lags = []
    for k in range(1, 4):
        now = T0 + 10_000 + k * 30_000
        tr.observe({TP: 1000}, now)  # nothing new produced either
        lags.append(tr.lag(TP, 500, now)[2])
    assert lags == [35_000, 65_000, 95_000]


def test_a_flat_run_keeps_its_first_and_latest_point_and_time_lag_uses_the_latest_moment():
    tr = tracker_with([(100, T0), (200, T0 + 1000), (200, T0 + 2000), (200, T0 + 3000), (200, T0 + 4000)])
    assert tr.samples(TP) == [(100, T0), (200, T0 + 1000), (200, T0 + 4000)]
    tr.observe({TP: 300}, T0 + 5000)
    # committed 200: the log end sat at 200 until T0+4000 and moved on after: the oldest
    # unconsumed record is newer than that
    assert tr.lag(TP, 200, T0 + 5000)[2] == 1000
    assert tr.lag(TP, 250, T0 + 5000)[2] == 500


def test_older_than_the_history_is_extrapolated_along_its_rate():
    tr = tracker_with([(1000, T0), (2000, T0 + 10_000)], history=2)
    # 100 offsets per second: offset 500 was the log end 5 s before the first sample
    assert tr.lag(TP, 500, T0 + 10_000)[2] == 15_000
    # one sample only, or a history that never moved: unknown rather than invented
    assert tracker_with([(1000, T0)]).lag(TP, 500, T0)[2] is None
    assert tracker_with([(1000, T0), (1000, T0 + 5000)]).lag(TP, 500, T0 + 5000)[2] is None


def test_history_is_bounded_and_slides():
    tr = LagTracker(history=4)
    for k in range(10):
        tr.observe({TP: k * 10}, T0 + k * 1000)
    assert tr.samples(TP) == [(60, T0 + 6000), (70, T0 + 7000), (80, T0 + 8000), (90, T0 + 9000)]


def test_a_log_end_going_back_starts_over_and_out_of_order_samples_are_ignored():
    tr = tracker_with([(100, T0), (200, T0 + 1000)])
    tr.observe({TP: 150}, T0 + 500)  # older than the newest sample
    assert tr.samples(TP) == [(100, T0), (200, T0 + 1000)]
    tr.observe({TP: 5}, T0 + 2000)  # topic recreated
    assert tr.samples(TP) == [(5, T0 + 2000)]


def test_staleness_follows_the_newest_sample_and_recovers():
    tr = tracker_with([(100, T0)])
    assert tr.lag(TP, 50, T0 + 60_000)[3] is False
    assert tr.lag(TP, 50, T0 + 60_001)[3] is True
    assert tr.is_stale(TP, T0 + 60_001)
    tr.observe({TP: 120}, T0 + 70_000)
    # 50 is older than the history: 20 offsets in 70 s put it 175 s before the first sample
    assert tr.lag(TP, 50, T0 + 70_000) == (120, 70, 245_000, False)
    assert not tr.is_stale(TP, T0 + 70_000)


def test_retain_drops_partitions_no_longer_committed():
    tr = LagTracker()
    tr.observe({("a", 0): 1, ("a", 1): 2, ("b", 0): 3}, T0)
    assert tr.retain({("a", 1)}) == 2
    assert list(tr.series) == [("a", 1)]


@given(st.lists(st.tuples(st.integers(0, 1000), st.integers(1, 10_000)), min_size=1, max_size=40),
       st.integers(0, 60_000))
def test_time_at_is_monotonic_in_the_committed_offset_and_within_the_samples(steps, committed):
    ends, times, end, at = [], [], 0, T0
    for produced, dt in steps:
        end += produced
        at += dt
        ends.append(end)
        times.append(at)
    tr = LagTracker(history=64)
    for e, t in zip(ends, times, strict=True):
        tr.observe({TP: e}, t)
    kept = tr.samples(TP)
    ends, times = [e for e, _ in kept], [t for _, t in kept]
    est = time_at(ends, times, committed)
    later = time_at(ends, times, committed + 1)
    if est is not None and later is not None:
        assert est <= later + 1e-6  # a larger committed offset was reached no earlier
    if est is not None and committed >= ends[0]:
        assert times[0] <= est <= times[-1]


# ---- the refresher ---------------------------------------------------------------------------------

class FakeSource:
    def __init__(self, ends):
        self.ends = dict(ends)
        self.calls: list[list] = []
        self.fail: Exception | None = None
        self.hang = False

    async def fetch(self, partitions):
        self.calls.append(list(partitions))
        if self.fail is not None:
            raise self.fail
        if self.hang:
            await asyncio.Event().wait()  # never answers
        return {tp: self.ends[tp] for tp in partitions if tp in self.ends}


def run(coro):
    return asyncio.run(coro)


def test_fake_source_is_a_log_end_source():
    assert isinstance(FakeSource({}), LogEndSource)


def test_refresher_samples_committed_partitions_in_batches():
    clock = ManualClock(wall_ms=T0)
    parts = {("t", p) for p in range(7)}
    src = FakeSource({("t", p): 100 + p for p in range(7)})
    tr = LagTracker()
    ref = LagRefresher(tr, src, lambda: [sorted(parts)], clock, interval_ms=30_000, batch_size=3)
    assert run(ref.refresh()) is True
    assert [len(c) for c in src.calls] == [3, 3, 1]
    assert tr.log_end(("t", 6)) == 106
    assert ref.up and ref.last_success_ms == T0
    parts.discard(("t", 6))  # its last offset was deleted: no longer tracked
    clock.advance(30_000)
    run(ref.refresh())
    assert tr.log_end(("t", 6)) is None and len(tr) == 6


def test_a_failing_source_marks_lag_stale_and_it_recovers():
    clock = ManualClock(wall_ms=T0)
    src = FakeSource({TP: 100})
    tr = LagTracker(stale_after_ms=60_000)
    ref = LagRefresher(tr, src, lambda: [[TP]], clock, interval_ms=30_000)
    assert run(ref.refresh())
    src.fail = ConnectionError("data cluster down")
    for _ in range(3):
        clock.advance(30_000)
        assert run(ref.refresh()) is False
    assert not ref.up and ref.consecutive_failures == 3 and "data cluster down" in ref.last_error
    end, lag, _, stale = tr.lag(TP, 40, clock.wall_ms())
    assert (end, lag, stale) == (100, 60, True)  # the last known values, marked stale
    src.fail = None
    src.ends[TP] = 130
    clock.advance(30_000)
    assert run(ref.refresh()) is True
    assert ref.up and ref.last_error is None
    assert tr.lag(TP, 40, clock.wall_ms())[1:4:2] == (90, False)


def test_a_hanging_source_is_cut_by_the_timeout_and_other_tasks_run_meanwhile():
    clock = ManualClock(wall_ms=T0)
    src = FakeSource({TP: 100})
    src.hang = True
    tr = LagTracker()
    ref = LagRefresher(tr, src, lambda: [[TP]], clock, interval_ms=30_000, timeout_ms=50)

    async def main():
        ticks = 0

        async def other():  # stands for the loop's other work (group requests)
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0)

        t = asyncio.ensure_future(other())
        ok = await ref.refresh()
        t.cancel()
        return ok, ticks

    ok, ticks = run(main())
    assert ok is False and "timed out" in ref.last_error
    assert ticks > 10
    assert tr.log_end(TP) is None


def test_partitions_the_source_does_not_know_stay_unknown():
    clock = ManualClock(wall_ms=T0)
    src = FakeSource({("t", 0): 5})
    tr = LagTracker()
    ref = LagRefresher(tr, src, lambda: [[("t", 0)], [("gone", 0)]], clock)
    assert run(ref.refresh())
    assert tr.log_end(("gone", 0)) is None and tr.log_end(("t", 0)) == 5


def test_answers_for_partitions_not_asked_are_dropped():
    clock = ManualClock(wall_ms=T0)

    class Chatty(FakeSource):
        async def fetch(self, partitions):
            return {("t", 0): 1, ("unasked", 0): 9}

    tr = LagTracker()
    run(LagRefresher(tr, Chatty({}), lambda: [[("t", 0)]], clock).refresh())
    assert list(tr.series) == [("t", 0)]


def test_run_loop_refreshes_on_its_interval_and_stops():
    clock = ManualClock(wall_ms=T0)
    src = FakeSource({TP: 1})
    ref = LagRefresher(LagTracker(), src, lambda: [[TP]], clock, interval_ms=1)

    async def main():
        ref.start()
        for _ in range(200):
            if len(src.calls) >= 3:
                break
            await asyncio.sleep(0.005)
        task = ref.task
        ref.stop()
        await asyncio.wait([task], timeout=10.0)  # a bound for a hung test only: done at the next turn
        assert task.done()  # stop() ends the task, not only the next round
        stopped_at = len(src.calls)
        for _ in range(10):  # ten intervals later: no more refreshes
            await asyncio.sleep(0.005)
        return stopped_at

    stopped_at = run(main())
    assert stopped_at >= 3
    assert len(src.calls) == stopped_at


def test_samples_are_invisible_to_the_cyclic_gc():
    import gc

    tr = tracker_with([(100, T0), (200, T0 + 1000)])
    gc.collect()
    assert not any(gc.is_tracked(x) for x in (tr.series[TP], *tr.series[TP], TP))


@pytest.mark.parametrize("history", [0, 1])
def test_history_needs_two_samples(history):
    with pytest.raises(ValueError):
        LagTracker(history=history)
