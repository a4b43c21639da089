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

    def get_count(self):
        return (self.live, 0, 0)

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


# ---- the frozen set checked off the loop (fork_check) ----------------------------------------------

import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402

from coordinator.ops.gcwatch import fork_check  # noqa: E402


def _doubled(g, w):
    g.live = 2 * w.baseline + w.min_growth + 1 - g.frozen
    g.collection(2)


def test_a_doubling_is_checked_elsewhere_and_no_walk_happens_here_when_the_check_finds_no_garbage():
    g = FakeGc(frozen=1000)
    scheduled, checks = [], []
    w = GcWatch(min_growth=100, schedule=scheduled.append, gc_module=g, check=checks.append).install()
    _doubled(g, w)  # 2,101 frozen
    assert scheduled == [w.check_frozen] and checks == []
    scheduled.pop()()
    assert len(checks) == 1 and "unfreeze" not in g.calls
    g.live = 5
    g.collection(0)
    assert scheduled == []  # one check at a time
    checks.pop()(3)  # the child found 3 unreachable objects: <= 1% of 2,101
    assert "unfreeze" not in g.calls and w.walks == 0 and w.checks == 1 and w.baseline == 2101
    assert w.last_check == {"unreachable": 3, "frozen": 2101}
    g.live = 1000  # 3,106 < 2 * 2,101 + 100: no check yet (growth counts from the checked size)
    g.collection(2)
    assert scheduled == []
    _doubled(g, w)
    assert scheduled == [w.check_frozen]
    lines = "\n".join(w.metric_lines())
    assert "herd_gc_frozen_checks_total 1" in lines and "herd_gc_full_walks_total 0" in lines
    w.uninstall()


def test_a_check_that_timed_out_is_tried_again_later_and_nothing_is_walked_here():
    """The child runs only on a CPU nothing else wants: on a machine busy for its whole minute it
    does not answer; walking everything on the loop then would stall that busy machine's loop."""
    g = FakeGc(frozen=1000)
    scheduled, checks = [], []
    w = GcWatch(min_growth=100, schedule=scheduled.append, gc_module=g, check=checks.append).install()
    _doubled(g, w)
    scheduled.pop()()
    checks.pop()(None, None, True)  # no answer in time
    assert w.walks == 0 and "unfreeze" not in g.calls and w.timeouts == 1 and w.checks == 0
    assert "herd_gc_frozen_check_timeouts_total 1" in "\n".join(w.metric_lines())
    g.live = 1
    g.collection(0)  # the next collection: the doubling is still unchecked
    assert scheduled == [w.check_frozen]
    scheduled.pop()()
    checks.pop()(0)
    assert w.checks == 1 and w.walks == 0
    w.uninstall()


def test_a_turn_of_rebalance_work_freezes_its_young_objects_without_a_collection_and_counts_them():
    g = FakeGc(frozen=1000)
    scheduled, checks = [], []
    w = GcWatch(min_growth=100, schedule=scheduled.append, gc_module=g, check=checks.append).install()
    w.freeze_young()  # nothing new: nothing done
    assert g.calls == [] and w.young_freezes == 0
    g.live = 600
    w.freeze_young()
    assert g.calls == ["freeze"] and "collect" not in g.calls and g.frozen == 1600 and w.frozen == 1600
    assert w.young_freezes == 1 and scheduled == []
    g.live = 600  # 2,200 > 2 * 1,000 + 100: the doubling is noticed here too
    w.freeze_young()
    assert scheduled == [w.check_frozen]
    w.uninstall()


def test_freeze_young_on_the_real_gc_resets_the_young_count():
    w = GcWatch(schedule=None)
    gc.collect()
    gc.freeze()
    try:
        keep = [[] for _ in range(500)]  # tracked objects that survive
        before = gc.get_freeze_count()
        assert gc.get_count()[0] >= 500
        w.freeze_young()
        assert gc.get_count()[0] < 10 and gc.get_freeze_count() >= before + 500 and w.frozen >= w.baseline + 500
        del keep
    finally:
        gc.unfreeze()
        gc.collect()


def test_a_doubling_is_checked_only_after_the_check_delay():
    """The daemon's setting: the check of a doubling waits check_delay_s on the loop (the ramp-up
    that doubled the frozen set, a big group forming, is not slowed by the fork and the walk)."""
    g = FakeGc(frozen=1000)
    scheduled, checks, timers = [], [], []
    w = GcWatch(min_growth=100, schedule=scheduled.append, gc_module=g, check=checks.append, check_delay_s=30.0,
                call_later=lambda delay, fn: timers.append((delay, fn))).install()
    _doubled(g, w)
    assert len(scheduled) == 1 and scheduled[0] != w.check_frozen
    scheduled.pop()()  # on the loop: a timer, no check yet
    assert timers == [(30.0, w.check_frozen)] and checks == []
    g.live = 3000
    g.collection(0)  # more growth meanwhile: still that one check pending
    assert scheduled == [] and len(timers) == 1
    timers.pop()[1]()
    assert len(checks) == 1
    checks.pop()(0, g.frozen)  # counted when it ran: the growth since the doubling included
    assert w.checks == 1 and w.baseline == g.frozen and w.walks == 0
    w.uninstall()


def test_with_a_check_the_frozen_set_is_never_counted_here_and_a_high_estimate_costs_only_the_check():
    """The check counts the frozen set in the child: an estimate that erred high (frozen objects
    died) is corrected from that count with no walk here and no baseline moved; a real doubling is
    then checked from the exact count."""
    g = FakeGc(frozen=1000)
    scheduled, checks = [], []
    w = GcWatch(min_growth=100, schedule=scheduled.append, gc_module=g, check=checks.append).install()
    counted = g.counts  # the baseline at start
    g.frozen -= 400  # frozen objects died (reference counting): the estimate does not know
    g.live = 1101  # estimate 2,101 > 2 * 1,000 + 100, truly 1,701
    g.collection(0)
    assert g.counts == counted and scheduled == [w.check_frozen]  # no count here: the check is scheduled
    scheduled.pop()()
    g.live = 50
    g.collection(0)  # 50 more frozen while the child works
    checks.pop()(0, 1701)  # the child: nothing unreachable, 1,701 frozen when it forked
    assert w.frozen == 1751 and w.baseline == 1000 and w.checks == 0 and w.recounts == 1
    assert g.counts == counted and "unfreeze" not in g.calls
    g.live = 400  # 2,151 > 2,100: a real doubling
    g.collection(0)
    assert scheduled == [w.check_frozen]
    scheduled.pop()()
    checks.pop()(5, 2151)
    assert w.checks == 1 and w.baseline == 2151 and w.last_check == {"unreachable": 5, "frozen": 2151}
    assert g.counts == counted and w.walks == 0
    w.uninstall()


@pytest.mark.parametrize("found", [22, None])  # more than 1% of the frozen set, or no answer
def test_garbage_found_by_the_check_or_a_failed_check_means_a_walk_of_everything_here(found):
    g = FakeGc(frozen=1000)
    scheduled, checks = [], []
    w = GcWatch(min_growth=100, schedule=scheduled.append, gc_module=g, check=checks.append).install()
    _doubled(g, w)
    scheduled.pop()()
    g.garbage_among_frozen = 22
    checks.pop()(found)
    assert g.calls[-3:] == ["unfreeze", "collect", "freeze"] and w.walks == 1 and w.checks == 0
    assert w.baseline == 2101 - 22 == g.frozen
    _doubled(g, w)
    assert scheduled == [w.check_frozen]  # checks go on after the walk
    w.uninstall()


def test_a_check_that_cannot_start_falls_back_to_the_walk():
    g = FakeGc(frozen=1000)
    scheduled = []

    def refuse(_done):
        raise OSError("fork refused")

    w = GcWatch(min_growth=100, schedule=scheduled.append, gc_module=g, check=refuse).install()
    _doubled(g, w)
    scheduled.pop()()
    assert g.calls[-3:] == ["unfreeze", "collect", "freeze"] and w.walks == 1
    w.uninstall()


class _Sends:
    """Garbage in a cycle whose finalizer writes to a socket (as a leaked connection might)."""

    def __init__(self, sock):
        self.sock = sock
        self.me = self

    def __del__(self):
        try:
            self.sock.send(b"x")
        except OSError:
            pass


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork_check needs os.fork")
def test_fork_check_counts_garbage_among_frozen_objects_in_a_child_that_cannot_touch_the_parents_sockets():
    a, b = socket.socketpair()
    b.setblocking(False)
    answered = threading.Event()
    results = []

    def schedule(fn):  # the loop's call_soon_threadsafe: here, run on the test's thread after the wait
        results.append(fn)
        answered.set()

    gc.collect()
    gc.freeze()
    try:
        garbage = [_Sends(a) for _ in range(50)]
        cycles = [[] for _ in range(200)]
        for c in cycles:
            c.append(c)
        gc.freeze()  # frozen: no collection here will find them
        frozen = gc.get_freeze_count()
        del garbage, cycles, c
        found = []
        fork_check(schedule)(lambda unreachable, exact: found.append((unreachable, exact)))
        assert answered.wait(60), "the child did not answer"
        results.pop()()
        assert found and found[0][0] >= 250  # the child saw the cycles among the frozen objects
        # and counted the frozen set: the two lists died by refcount, and a few frozen temporaries
        # of this frame's calls since
        assert frozen - 20 <= found[0][1] <= frozen - 2
        # ... while the parent still holds them (only the two lists, not in cycles, died by refcount)
        assert gc.get_freeze_count() == frozen - 2
        with pytest.raises(BlockingIOError):
            b.recv(10)  # the finalizers that ran in the child could not write to the parent's socket
        a.send(b"ok")  # and the parent's sockets still work
        assert b.recv(10) == b"ok"
    finally:
        gc.unfreeze()
        gc.collect()
        a.close()
        b.close()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork_check needs os.fork")
def test_fork_check_answers_when_its_pipe_is_above_descriptor_1024():
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if max(soft, hard) < 1100:
        pytest.skip("the open-file limit is under 1,100")  # pragma: no cover
    if soft < 1100:
        resource.setrlimit(resource.RLIMIT_NOFILE, (1100, hard))
    held = []
    try:
        while True:  # the daemon with 10,000 connections: every new descriptor is far above 1,024
            fd = os.open(os.devnull, os.O_RDONLY)
            held.append(fd)
            if fd >= 1030:
                break
        answered = threading.Event()
        results, found = [], []
        fork_check(lambda fn: (results.append(fn), answered.set()))(lambda u, exact: found.append((u, exact)))
        assert answered.wait(60), "no answer"
        results.pop()()
        assert found and isinstance(found[0][0], int) and isinstance(found[0][1], int)  # not a failed check
    finally:
        for fd in held:
            os.close(fd)
        if soft < 1100:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork_check needs os.fork")
def test_fork_check_walks_at_a_lower_cpu_priority_than_the_loop():
    """The child's walk is background work: it runs CHECK_NICE above the daemon's nice value and
    under SCHED_IDLE (here a gc module whose collect() answers the child's own nice and policy)."""
    from coordinator.ops import gcwatch

    class NiceGc:
        callbacks: list = []

        @staticmethod
        def get_freeze_count():
            return 7

        @staticmethod
        def unfreeze():
            pass

        @staticmethod
        def collect():
            idle = hasattr(os, "SCHED_IDLE") and os.sched_getscheduler(0) == os.SCHED_IDLE
            return os.getpriority(os.PRIO_PROCESS, 0) * 10 + idle

    mine = os.getpriority(os.PRIO_PROCESS, 0)
    answered = threading.Event()
    results, found = [], []
    fork_check(lambda fn: (results.append(fn), answered.set()), gc_module=NiceGc)(
        lambda u, exact: found.append((u, exact)))
    assert answered.wait(60), "no answer"
    results.pop()()
    idle = int(hasattr(os, "SCHED_IDLE") and sys.platform.startswith("linux"))  # and where it exists, SCHED_IDLE
    assert found == [(min(19, mine + gcwatch.CHECK_NICE) * 10 + idle, 7)]
    assert os.getpriority(os.PRIO_PROCESS, 0) == mine  # the parent (the loop) unchanged


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork_check needs os.fork")
def test_fork_check_kills_a_child_that_does_not_answer_in_time_and_says_it_timed_out():
    class SlowGc:
        callbacks: list = []

        @staticmethod
        def get_freeze_count():
            return 1

        @staticmethod
        def unfreeze():
            pass

        @staticmethod
        def collect():
            import time as _t

            _t.sleep(30)  # a child that gets no CPU, as far as the parent can tell
            return 0

    answered = threading.Event()
    results, found = [], []
    fork_check(lambda fn: (results.append(fn), answered.set()), timeout_s=0.3, gc_module=SlowGc)(
        lambda *a: found.append(a))
    assert answered.wait(20), "no answer"
    results.pop()()
    assert found == [(None, None, True)]
