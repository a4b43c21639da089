"""Lag in seconds for a backlog older than herd's log-end history (issue 33 item 8): the history is
flat (nothing produced since herd started), so interpolation has nothing to bracket the committed
offset with; the refresher then asks the source for the timestamp of the record at the committed
offset, a bounded number per round, cached per (partition, offset). Fake sources, the manual clock."""
from __future__ import annotations

import asyncio

from coordinator.clock import ManualClock
from coordinator.ops.lag import EXTRAPOLATED, INTERPOLATED, RECORD, LagRefresher, LagTracker

T0 = 1_700_000_000_000
PRODUCED = T0 - 3_600_000  # the backlog's records were written an hour before herd started
TOPIC = "orders"
COMMITTED = {(TOPIC, 0): 90, (TOPIC, 1): 80, (TOPIC, 2): 70, (TOPIC, 3): 60}


class FakeData:
    """Log ends (100 each, produced once) and a record time per offset: record ``o`` of partition
    ``p`` written at PRODUCED + 1000 * o + p."""

    def __init__(self, partitions=4, end=100):
        self.ends = {(TOPIC, p): end for p in range(partitions)}
        self.lookups: list[dict] = []
        self.fail: Exception | None = None
        self.hang = False

    async def fetch(self, partitions):
        return {tp: self.ends[tp] for tp in partitions if tp in self.ends}

    async def record_times(self, offsets):
        self.lookups.append(dict(offsets))
        if self.fail is not None:
            raise self.fail
        if self.hang:
            await asyncio.Event().wait()
        return {tp: (PRODUCED + 1000 * off + tp[1] if off < self.ends.get(tp, 0) else None)
                for tp, off in offsets.items()}


def refresher(data, committed=COMMITTED, **kw):
    clock = ManualClock(wall_ms=T0)
    tr = LagTracker(stale_after_ms=10_000_000, record_cache_size=kw.pop("cache", 10_000))
    ref = LagRefresher(tr, data, lambda: [sorted(committed)], clock, interval_ms=30_000, **kw)
    return clock, tr, ref


def read_all(tr, now, committed=COMMITTED):
    """What the console's fold does on every table build: the lag of each committed offset."""
    return {tp: tr.lag_with_method(tp, off, now) for tp, off in committed.items()}


def backlog_read():
    """One partition committed at 90 whose record time a reader wanted, read on the next round:
    -> data, committed, clock, tracker, refresher."""
    data = FakeData(partitions=1)
    committed = {(TOPIC, 0): 90}
    clock, tr, ref = refresher(data, committed)
    asyncio.run(ref.refresh())
    read_all(tr, clock.wall_ms(), committed)
    clock.advance(30_000)
    asyncio.run(ref.refresh())
    return data, committed, clock, tr, ref


def test_a_flat_history_has_no_time_lag_until_the_record_time_is_read_then_it_is_exact():
    data = FakeData()
    clock, tr, ref = refresher(data)
    assert asyncio.run(ref.refresh())
    clock.advance(30_000)
    assert asyncio.run(ref.refresh())  # two samples, both 100: flat
    now = clock.wall_ms()
    first = read_all(tr, now)
    assert {tp: v[:2] for tp, v in first.items()} == {tp: (100, 100 - off) for tp, off in COMMITTED.items()}
    assert all(v[2] is None and v[4] is None for v in first.values())  # today's gap: nothing to say
    assert data.lookups == []  # asked only on the round after a reader wanted them, never inline
    clock.advance(30_000)
    assert asyncio.run(ref.refresh())
    assert data.lookups == [COMMITTED]  # one batched lookup for the four partitions
    now = clock.wall_ms()
    after = read_all(tr, now)
    for tp, off in COMMITTED.items():
        end, lag, lag_ms, stale, method = after[tp]
        assert (end, lag, method, stale) == (100, 100 - off, RECORD, False)
        assert lag_ms == now - (PRODUCED + 1000 * off + tp[1])
    # the lag in seconds keeps growing with the clock, from the cache: no new lookup
    clock.advance(30_000)
    assert asyncio.run(ref.refresh())
    later = read_all(tr, clock.wall_ms())
    assert all(later[tp][2] == after[tp][2] + 30_000 for tp in COMMITTED)
    assert len(data.lookups) == 1 and ref.status()["record_times_found"] == 4


def test_a_new_committed_offset_is_looked_up_again_and_a_moving_history_interpolates():
    data, committed, clock, tr, ref = backlog_read()
    assert read_all(tr, clock.wall_ms(), committed)[(TOPIC, 0)][4] == RECORD
    committed[(TOPIC, 0)] = 95  # the consumer moved a little, still inside the old backlog
    assert read_all(tr, clock.wall_ms(), committed)[(TOPIC, 0)][2] is None  # not read yet
    clock.advance(30_000)
    asyncio.run(ref.refresh())
    assert data.lookups[-1] == {(TOPIC, 0): 95}
    assert read_all(tr, clock.wall_ms(), committed)[(TOPIC, 0)][2] == clock.wall_ms() - (PRODUCED + 95_000)
    # records produced after herd started: an offset within the history is interpolated, not looked up
    data.ends[(TOPIC, 0)] = 200
    clock.advance(30_000)
    asyncio.run(ref.refresh())
    committed[(TOPIC, 0)] = 150
    lookups = len(data.lookups)
    _, lag, lag_ms, _, method = read_all(tr, clock.wall_ms(), committed)[(TOPIC, 0)]
    assert (lag, method) == (50, INTERPOLATED) and lag_ms == 15_000
    clock.advance(30_000)
    asyncio.run(ref.refresh())
    assert len(data.lookups) == lookups


def test_an_offset_older_than_a_moving_history_is_extrapolated_until_its_record_time_is_read():
    data = FakeData(partitions=1)
    committed = {(TOPIC, 0): 50}
    clock, tr, ref = refresher(data, committed)
    asyncio.run(ref.refresh())
    data.ends[(TOPIC, 0)] = 160
    clock.advance(30_000)
    asyncio.run(ref.refresh())  # 100 -> 160 in 30 s: 2 offsets a second
    _, _, lag_ms, _, method = read_all(tr, clock.wall_ms(), committed)[(TOPIC, 0)]
    assert method == EXTRAPOLATED and lag_ms == 55_000  # a guess: 50 offsets before 100 at 2/s
    clock.advance(30_000)
    asyncio.run(ref.refresh())
    _, _, lag_ms, _, method = read_all(tr, clock.wall_ms(), committed)[(TOPIC, 0)]
    assert method == RECORD and lag_ms == clock.wall_ms() - (PRODUCED + 50_000)  # the record's own time


def test_lookups_per_round_are_bounded_and_the_rest_wait_their_turn():
    data = FakeData(partitions=10)
    committed = {(TOPIC, p): 10 for p in range(10)}
    clock, tr, ref = refresher(data, committed, record_lookups=3)
    asyncio.run(ref.refresh())
    found = []
    for _ in range(5):
        read_all(tr, clock.wall_ms(), committed)
        clock.advance(30_000)
        asyncio.run(ref.refresh())
        found.append(sum(1 for v in read_all(tr, clock.wall_ms(), committed).values() if v[4] == RECORD))
    assert [len(x) for x in data.lookups] == [3, 3, 3, 1]
    assert found == [3, 6, 9, 10, 10]
    assert len({tp for x in data.lookups for tp in x}) == 10  # each partition asked once


def test_the_cache_is_bounded_least_recently_used_first():
    data = FakeData(partitions=4)
    clock, tr, ref = refresher(data, cache=2)
    asyncio.run(ref.refresh())
    read_all(tr, clock.wall_ms())
    clock.advance(30_000)
    asyncio.run(ref.refresh())
    assert len(tr.record_ms) == 2  # 4 read, 2 kept
    assert len(tr.wanted) <= 2
    kept = {tp for tp, _ in tr.record_ms}
    assert all(tr.lag_with_method(tp, COMMITTED[tp], clock.wall_ms())[4] == RECORD for tp in kept)


def test_a_failing_or_hanging_lookup_never_fails_the_round_and_is_asked_again():
    data = FakeData(partitions=1)
    committed = {(TOPIC, 0): 90}
    clock, tr, ref = refresher(data, committed, timeout_ms=50)
    asyncio.run(ref.refresh())
    data.fail = ConnectionError("leader down")
    for hang in (False, True):
        data.hang = hang
        read_all(tr, clock.wall_ms(), committed)
        clock.advance(30_000)
        assert asyncio.run(ref.refresh()) is True  # log ends read: the round is good
        assert ref.up and read_all(tr, clock.wall_ms(), committed)[(TOPIC, 0)][2] is None
        data.fail = None
    assert ref.record_lookup_failures == 2
    data.hang = False
    clock.advance(30_000)
    asyncio.run(ref.refresh())
    assert read_all(tr, clock.wall_ms(), committed)[(TOPIC, 0)][4] == RECORD
    assert len(data.lookups) == 3


def test_a_record_the_source_cannot_read_leaves_no_time_lag_and_a_recreated_log_forgets_the_cache():
    data, committed, clock, tr, ref = backlog_read()
    assert tr.record_ms  # read
    data.ends[(TOPIC, 0)] = 40  # the topic recreated: the old record time means nothing now
    clock.advance(30_000)
    asyncio.run(ref.refresh())
    assert not tr.record_ms
    committed[(TOPIC, 0)] = 10
    data.ends[(TOPIC, 0)] = 40
    read_all(tr, clock.wall_ms(), committed)  # 10 < 40 and the history is one point: wanted

    async def none(offsets):
        data.lookups.append(dict(offsets))
        return dict.fromkeys(offsets)  # deleted by retention, say

    data.record_times = none
    clock.advance(30_000)
    asyncio.run(ref.refresh())
    assert data.lookups[-1] == {(TOPIC, 0): 10}
    assert read_all(tr, clock.wall_ms(), committed)[(TOPIC, 0)][2] is None and not tr.record_ms


def test_a_source_without_record_times_is_left_as_it_was():
    class LogEndsOnly:
        async def fetch(self, partitions):
            return dict.fromkeys(partitions, 100)

    clock, tr, ref = refresher(LogEndsOnly())
    asyncio.run(ref.refresh())
    read_all(tr, clock.wall_ms())
    clock.advance(30_000)
    assert asyncio.run(ref.refresh()) is True
    assert all(v[2] is None for v in read_all(tr, clock.wall_ms()).values())
