"""coordinator/gcwatch.py: survivors of a full collection are frozen; the frozen set is walked again
once it has doubled; pauses are counted and exported."""
from __future__ import annotations

import gc

import pytest

from coordinator.ops.gcwatch import GcWatch


class FakeGc:
    """Just enough of the gc module: a frozen count that freeze() grows by the live objects."""

    def __init__(self, frozen=1000):
        self.frozen = frozen
        self.live = 0  # objects in the generations
        self.callbacks = []
        self.calls = []

    counts = 0  # get_freeze_count() calls: each is a walk of the frozen set in CPython

    def get_freeze_count(self):
        self.counts += 1
        return self.frozen

    def get_objects(self, generation):
        return [None] * self.live if generation == 1 else []

    def freeze(self):
        self.calls.append("freeze")
        self.frozen += self.live
        self.live = 0

    def unfreeze(self):
        self.calls.append("unfreeze")
        self.live += self.frozen
        self.frozen = 0

    def collection(self, generation):
        for cb in self.callbacks:
            cb("start", {"generation": generation})
        for cb in self.callbacks:
            cb("stop", {"generation": generation, "collected": 0, "uncollectable": 0})

    garbage_among_frozen = 0

    def collect(self):
        self.calls.append("collect")
        self.live -= self.garbage_among_frozen
        return self.garbage_among_frozen


def test_survivors_of_every_collection_are_frozen_and_everything_is_walked_once_the_frozen_set_doubles():
    g = FakeGc(frozen=1000)
    scheduled = []
    w = GcWatch(min_growth=100, schedule=scheduled.append, gc_module=g).install()
    g.live = 500
    g.collection(1)
    assert g.calls == ["freeze"] and g.frozen == 1500 and scheduled == []
    g.live = 10
    g.collection(0)  # the youngest generation too
    assert g.calls == ["freeze", "freeze"] and g.frozen == 1510
    g.live = 700  # 2,210 frozen > 2 * 1,000 + 100: walk everything once, soon, outside the collection
    g.collection(2)
    assert g.frozen == 2210 and scheduled == [w.walk_all]
    g.live = 5
    g.collection(1)
    assert scheduled == [w.walk_all]  # scheduled once
    g.garbage_among_frozen = 200
    scheduled.pop()()
    assert g.calls[-3:] == ["unfreeze", "collect", "freeze"] and g.frozen == 2015 and w.baseline == 2015
    assert w.walks == 1
    g.live = 300
    g.collection(2)  # growth is measured from the new baseline
    assert scheduled == [] and g.frozen == 2315
    assert w.collections == [1, 2, 2] and g.calls.count("freeze") == 6
    w.uninstall()
    assert g.callbacks == []


def test_no_freezing_when_disabled_but_pauses_are_still_counted():
    g = FakeGc()
    w = GcWatch(freeze=False, gc_module=g).install()
    g.live = 10
    g.collection(2)
    assert g.calls == [] and w.collections == [0, 0, 1] and w.seconds[2] >= 0


def test_with_the_real_gc_new_garbage_is_collected_and_frozen_objects_stay_alive():
    if gc.get_freeze_count():
        pytest.skip("another test froze objects in this process")  # pragma: no cover
    w = GcWatch(min_growth=10**9).install()
    try:
        keep = [[i] for i in range(1000)]
        gc.collect()
        frozen = gc.get_freeze_count()
        assert frozen >= 1000 and all(gc.is_tracked(x) for x in keep[:3])
        cycle = []
        cycle.append(cycle)
        del cycle
        assert gc.collect() >= 1  # created after the freeze: found
        assert [x[0] for x in keep[:3]] == [0, 1, 2]
        lines = "\n".join(w.metric_lines())
        assert 'herd_gc_collections_total{generation="2"}' in lines and "herd_gc_frozen_objects" in lines
    finally:
        w.uninstall()
        gc.unfreeze()


def test_the_frozen_set_is_not_counted_after_every_collection_only_when_it_may_have_doubled():
    g = FakeGc(frozen=1000)
    scheduled = []
    w = GcWatch(min_growth=100, schedule=scheduled.append, gc_module=g).install()
    counted = g.counts  # the baseline at start
    for _ in range(50):
        g.live = 10
        g.collection(0)
    assert g.counts == counted and w.frozen == 1500 and g.frozen == 1500  # no walk per collection
    g.frozen -= 400  # frozen objects died (reference counting): the estimate does not know
    g.live = 700  # estimate 2,200 > 2 * 1,000 + 100: count exactly once; 1,800 is no doubling
    g.collection(0)
    assert g.counts == counted + 1 and w.recounts == 1 and w.frozen == 1800 and scheduled == []
    g.live = 400  # now really 2,200
    g.collection(0)
    assert g.counts == counted + 2 and scheduled == [w.walk_all]
    assert "herd_gc_frozen_objects 2200" in "\n".join(w.metric_lines())
    w.uninstall()
