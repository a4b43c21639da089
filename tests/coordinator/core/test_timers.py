"""Keyed lazy timers and the clocks."""
import random

import pytest

from coordinator.clock import Clock, ManualClock, SystemClock
from coordinator.core.timers import Timers


def test_manual_clock_moves_both_clocks_and_never_backwards():
    c = ManualClock(monotonic_ms=5, wall_ms=1000)
    assert isinstance(c, Clock)
    assert c.advance(10) == 15
    assert (c.monotonic_ms(), c.wall_ms()) == (15, 1010)
    with pytest.raises(ValueError):
        c.advance(-1)
    c.set_wall(5)
    assert (c.monotonic_ms(), c.wall_ms()) == (15, 5)


def test_system_clock_is_a_clock():
    c = SystemClock()
    assert isinstance(c, Clock)
    a = c.monotonic_ms()
    assert c.monotonic_ms() >= a
    assert c.wall_ms() > 1_600_000_000_000


def test_schedule_fire_in_deadline_order():
    t = Timers()
    t.schedule("b", 20)
    t.schedule("a", 10)
    t.schedule("c", 30)
    assert t.next_deadline() == 10
    assert t.expired(9) == []
    assert t.expired(20) == ["a", "b"]
    assert t.next_deadline() == 30
    assert "c" in t and "a" not in t
    assert t.expired(100) == ["c"]
    assert t.next_deadline() is None and len(t) == 0


def test_schedule_replaces_earlier_and_later():
    t = Timers()
    t.schedule("k", 10)
    t.schedule("k", 50)  # later: lazy, no push
    assert t.deadline("k") == 50
    assert t.next_deadline() == 50  # settled: the early entry is re-armed
    assert t.expired(49) == []
    t.schedule("k", 5)  # earlier: pushes
    assert t.next_deadline() == 5
    assert t.expired(5) == ["k"]
    assert t.expired(1000) == []  # the superseded entry is stale, not a second firing


def test_cancel_and_reschedule():
    t = Timers()
    t.schedule("k", 10)
    assert t.cancel("k") is True
    assert t.cancel("k") is False
    assert t.next_deadline() is None
    t.schedule("k", 10)  # same deadline as the stale entry
    assert t.expired(10) == ["k"]
    assert t.expired(10) == []
    t.schedule("k", 20)
    t.cancel("k")
    t.schedule("k", 30)
    assert t.expired(25) == []
    assert t.expired(30) == ["k"]


def test_heartbeats_do_not_grow_the_heap():
    """Moving a deadline later is O(1): 100 members heartbeating 1000 times add no heap entries
    beyond one re-arm per member per session timeout."""
    t = Timers()
    for m in range(100):
        t.schedule(("hb", "g", m), 10_000)
    for now in range(1, 1001):
        for m in range(100):
            t.schedule(("hb", "g", m), now * 10 + 10_000)
    assert t.heap_size() == 100
    assert t.expired(10_000) == []  # re-armed lazily
    assert t.heap_size() == 100
    assert t.next_deadline() == 1000 * 10 + 10_000


def test_pop_expired_lets_handlers_change_timers():
    t = Timers()
    t.schedule("a", 1)
    t.schedule("b", 2)
    assert t.pop_expired(5) == "a"
    t.cancel("b")
    t.schedule("c", 3)
    assert t.pop_expired(5) == "c"
    assert t.pop_expired(5) is None


def test_random_operations_match_a_model():
    rng = random.Random(7)
    t = Timers()
    model: dict = {}
    now = 0
    for _ in range(5000):
        op = rng.random()
        key = rng.randrange(30)
        if op < 0.5:
            d = now + rng.randrange(0, 100)
            t.schedule(key, d)
            model[key] = d
        elif op < 0.65:
            assert t.cancel(key) == (key in model)
            model.pop(key, None)
        elif op < 0.8:
            expect = min(model.values()) if model else None
            assert t.next_deadline() == expect
        else:
            now += rng.randrange(0, 30)
            fired = t.expired(now)
            due = sorted((d, k) for k, d in model.items() if d <= now)
            assert sorted(fired) == sorted(k for _, k in due)
            assert [model[k] for k in fired] == sorted(model[k] for k in fired)
            for k in fired:
                del model[k]
        assert len(t) == len(model)


def test_pop_expired_and_next_check_leave_entries_that_are_not_due_alone():
    t = Timers()
    for i in range(1000):
        t.schedule(("hb", i), 100 + i)  # armed at 100..1099
    for i in range(1000):
        t.schedule(("hb", i), 10_000 + i)  # every deadline extended lazily (the heartbeat case)
    assert t.next_check() == 100 and t.next_deadline() == 10_000
    t2 = Timers()
    for i in range(1000):
        t2.schedule(("hb", i), 100 + i)
        t2.schedule(("hb", i), 10_000 + i)
    assert t2.pop_expired(149) is None  # re-arms only the 50 entries armed at or before 149
    assert t2.next_check() == 150
    assert sorted(t2._armed.values())[:3] == [150, 151, 152] and max(t2._armed.values()) == 10_049
    assert t2.expired(10_002) == [("hb", 0), ("hb", 1), ("hb", 2)]
    assert t2.next_check() == 10_003 and len(t2) == 997


def test_a_budget_stops_pop_expired_with_work_still_due():
    t = Timers()
    for i in range(100):
        t.schedule(("hb", i), 10)
        t.schedule(("hb", i), 1000 + i)  # extended: each needs a re-arm when it comes due
    t.steps = 0
    assert t.pop_expired(20, limit=30) is None and t.steps == 30
    assert t.next_check() == 10  # still due: the caller must come back
    t.steps = 0
    assert t.pop_expired(20, limit=1000) is None and t.steps == 70
    assert t.next_check() == 1000


def test_shift_moves_every_deadline_and_keeps_lazy_and_stale_entries_right():
    t = Timers()
    pushes = []
    t.schedule("a", 100)
    t.schedule("b", 200)
    t.schedule("c", 300)
    t.schedule("a", 150)  # lazily extended: its heap entry stays at 100
    t.schedule("c", 50)  # moved earlier: the entry at 300 is stale
    t.schedule("d", 400)
    t.cancel("d")  # stale too
    t.on_push = lambda: pushes.append(1)
    t.shift(1_000)
    assert pushes == []  # nothing moved earlier
    assert (t.deadline("a"), t.deadline("b"), t.deadline("c"), t.deadline("d")) == (1_150, 1_200, 1_050, None)
    assert t.expired(1_049) == []
    assert t.next_deadline() == 1_050
    assert t.expired(1_150) == ["c", "a"]
    assert t.expired(10_000) == ["b"]
    assert len(t) == 0
    t.shift(0)
    t.schedule("e", 5)
    t.shift(-10)  # never backwards
    assert t.deadline("e") == 5
