"""herd's own stalls (issue 25): the detector, the deadlines it moves, the order of socket reads and
timers after it, with the manual clock; and on uvloop with real sockets, that a readable socket is
read before the timers held by a stall run again."""
from __future__ import annotations

import asyncio
import socket
import time

import pytest
import uvloop

from coordinator.clock import ManualClock
from coordinator.config import Config, ConfigError
from coordinator.core.catalog import Catalog
from coordinator.ops import stall as stall_module
from coordinator.ops.metrics import Metrics
from coordinator.ops.stall import StallDetector
from coordinator.runtime import Runtime
from protocol import errors as E
from protocol.messages import HeartbeatRequest
from tests.coordinator.core.test_group_harness import Harness, sub
from tests.coordinator.test_runtime_shards import FakeStore

CHANGED = (("range", sub("t", "u")),)
SESSION = 10_000
STALL = 15_000


def stall(h: Harness, ms: int = STALL) -> int:
    """The clock jumps ``ms`` with nothing run (herd was away), then herd notices: -> when it is back."""
    h.clock.advance(ms)
    h.gc.on_stall(ms, h.now, h.wall)
    return h.now


# ---- the core: deadlines move by the stall ----------------------------------------------------------

def test_a_15s_stall_with_10s_sessions_expires_nobody():
    h = Harness()
    mids, gen = h.form_group("g", 3, session=SESSION)
    h.advance(1_000)
    for mid in mids:
        assert h.heartbeat("g", gen, mid).error_code == E.NONE
    back = stall(h)
    h.fire()  # timers run before the heartbeats that waited are read: still nobody is due
    assert set(h.group("g").members) == set(mids) and h.state("g") == "Stable"
    for mid in mids:  # the heartbeats that waited in the sockets
        assert h.heartbeat("g", gen, mid).error_code == E.NONE
    h.advance(SESSION - 1)
    assert set(h.group("g").members) == set(mids) and h.group("g").generation == gen
    assert h.now == back + SESSION - 1


def test_without_the_stall_notice_the_same_jump_expires_everyone():
    """The control: what a jump of the clock does when herd does not know it was away."""
    h = Harness()
    mids, gen = h.form_group("g", 3, session=SESSION)
    h.clock.advance(STALL)
    h.fire()
    assert h.state("g") == "Empty"


def test_a_member_silent_since_the_stall_expires_one_session_after_it():
    h = Harness()
    (a, b), gen = h.form_group("g", 2, session=SESSION)
    h.advance(500)
    for mid in (a, b):
        assert h.heartbeat("g", gen, mid).error_code == E.NONE  # the last heartbeats before the stall
    back = stall(h)  # a died during the stall; b is alive
    while h.now < back + SESSION - 1:
        h.advance(min(1_000, back + SESSION - 1 - h.now))
        assert h.heartbeat("g", gen, b).error_code == E.NONE
    assert a in h.group("g").members  # 9999 ms after herd came back
    h.advance(1)
    assert a not in h.group("g").members and b in h.group("g").members
    rec = h.group("g").rebalance
    assert rec.reason == "session_expired" and rec.trigger["member_id"] == a
    assert rec.stall["when"] == "after" and rec.stall["stall_ms"] == STALL
    assert rec.stall["started_after_stall_ms"] == SESSION


def test_a_stall_during_a_rebalance_neither_completes_it_early_nor_drops_a_member_about_to_rejoin():
    h = Harness()
    (a, b), gen = h.form_group("g", 2, session=SESSION, rebalance=SESSION)
    ta = h.join("g", a, session=SESSION, rebalance=SESSION, protocols=CHANGED)  # a starts a rebalance
    assert h.state("g") == "PreparingRebalance"
    h.advance(2_000)
    assert h.heartbeat("g", gen, b).error_code == E.REBALANCE_IN_PROGRESS  # b is told to rejoin
    stall(h)  # its rejoin waits in the socket while herd is away (the join timer was 8 s away)
    h.fire()
    assert h.state("g") == "PreparingRebalance" and h.reply(ta) is None  # not completed by the timer
    h.advance(8_000 - 1)
    assert h.state("g") == "PreparingRebalance" and set(h.group("g").members) == {a, b}
    tb = h.join("g", b, session=SESSION, rebalance=SESSION, protocols=CHANGED)  # the rejoin, read
    assert h.state("g") == "CompletingRebalance"
    assert h.reply(ta).generation_id == h.reply(tb).generation_id == gen + 1
    assert set(h.group("g").members) == {a, b}
    entry = h.gc.group_history("g")[-1]
    assert entry["stall"]["when"] == "during" and entry["stall"]["stall_ms"] == STALL
    assert entry["removed"] == []


def test_a_stall_during_a_rebalance_still_drops_a_member_that_never_rejoins_one_timeout_later():
    h = Harness()
    (a, b), gen = h.form_group("g", 2, session=SESSION, rebalance=SESSION)
    ta = h.join("g", a, session=SESSION, rebalance=SESSION, protocols=CHANGED)
    h.advance(2_000)
    stall(h)
    h.advance(8_000 - 1)
    assert h.reply(ta) is None
    h.advance(1)  # the rebalance timeout, counted without the stall
    assert h.reply(ta).generation_id == gen + 1 and set(h.group("g").members) == {a}


def test_a_pending_member_keeps_its_time_across_a_stall():
    h = Harness()
    (a,), gen = h.form_group("g", 1, session=SESSION)
    t = h.join("g", session=SESSION)  # KIP-394: an id is minted, the member must rejoin with it
    pending = h.reply(t).member_id
    assert pending in h.group("g").pending_members
    h.advance(2_000)
    assert h.heartbeat("g", gen, a).error_code == E.NONE
    stall(h)
    h.advance(SESSION - 2_000 - 1)
    assert pending in h.group("g").pending_members
    h.advance(1)
    assert pending not in h.group("g").pending_members


def test_loaded_members_get_fresh_deadlines_and_a_stall_right_after_loading_expires_nobody():
    first = Harness()
    mids, gen = first.form_group("g", 2, session=SESSION)
    second = Harness()  # a restart: the second coordinator replays what the first wrote
    second.clock.advance(60_000)
    shard = second.gc.shard_for("g")
    for _, key, value in first.writes:
        second.gc.replay(shard, key, value)
    second.gc.loaded(second.now, second.wall)
    loaded_at = second.now
    assert set(second.group("g").members) == set(mids)
    stall(second)
    second.advance(SESSION - 1)
    assert set(second.group("g").members) == set(mids)
    assert second.now == loaded_at + STALL + SESSION - 1
    second.advance(1)  # nobody heartbeated at all: one session after load, not counting the stall
    assert second.state("g") == "Empty"


# ---- the detector ------------------------------------------------------------------------------

class Boot:
    def __init__(self, clock):
        self.clock, self.suspended = clock, 0

    def __call__(self):
        return self.clock.monotonic_ms() + self.suspended


def detector(threshold=1_000, boot=False):
    clock = ManualClock(monotonic_ms=10_000)
    seen = []
    b = Boot(clock) if boot else None
    d = StallDetector(clock, threshold, on_stall=lambda *a: seen.append(a), boottime=b)
    return clock, d, seen, b


def test_the_detector_reports_a_gap_at_the_threshold_once_and_gives_it_back():
    clock, d, seen, _ = detector()
    clock.advance(999)
    assert d.check() == 0 and seen == []
    clock.advance(1_000)
    assert d.check() == 1_000
    assert seen == [(1_000, "loop", 1_000)]
    assert d.check() == 0 and len(seen) == 1  # once
    clock.advance(50)
    assert d.check() == 0
    assert d.stalls == 1


def test_a_loop_that_keeps_stalling_gets_no_more_time_back_until_it_ran_a_threshold_again():
    clock, d, seen, _ = detector()
    clock.advance(5_000)
    assert d.check() == 5_000
    for _ in range(3):  # 50 ms of running, then 1.2 s away again: an overload, not a pause
        clock.advance(50)
        assert d.check() == 0
        clock.advance(1_200)
        assert d.check() == 0
    assert seen[1:] == [(0, "loop", 1_200)] * 3 and d.stalls == 4  # still reported and counted
    for _ in range(20):  # a second of normal running
        clock.advance(50)
        assert d.check() == 0
    clock.advance(15_000)
    assert d.check() == 15_000  # a pause again: given back


def test_a_suspend_is_reported_but_nothing_is_given_back():
    clock, d, seen, boot = detector(boot=True)
    boot.suspended += 30_000  # CLOCK_BOOTTIME moved on, CLOCK_MONOTONIC did not
    clock.set_wall(clock.wall_ms() + 30_000)
    assert d.check() == 0
    assert seen == [(0, "suspend", 30_000)]


def test_a_wall_clock_step_is_not_a_stall_but_is_logged(monkeypatch):
    clock, d, seen, _ = detector()
    logged = []
    monkeypatch.setattr(stall_module.log, "warning", lambda event, **kw: logged.append((event, kw)))
    clock.set_wall(clock.wall_ms() - 3_600_000)  # NTP stepped the clock back an hour
    assert d.check() == 0 and seen == []
    assert [(e, kw["step_ms"]) for e, kw in logged] == [("clock.wall_step", -3_600_000)]


def test_threshold_zero_turns_detection_off_and_small_thresholds_are_refused():
    clock, d, seen, _ = detector(threshold=0)
    clock.advance(60_000)
    assert d.check() == 0 and seen == []
    with pytest.raises(ConfigError, match="stall_threshold_ms"):
        Config(stall_threshold_ms=50).validate()
    assert Config(stall_threshold_ms=0).validate().stall_threshold_ms == 0
    assert Config().stall_threshold_ms == 1_000


def test_stall_metrics_follow_prometheus_histogram_conventions():
    metrics = Metrics()
    text = metrics.render()
    assert "herd_stalls_total 0" in text and 'herd_stall_seconds_bucket{le="+Inf"} 0' in text
    metrics.on_stall(15_000, "loop")
    text = metrics.render()
    assert "# TYPE herd_stalls_total counter" in text and "herd_stalls_total 1" in text
    assert "# TYPE herd_stall_seconds histogram" in text
    assert 'herd_stall_seconds_bucket{le="10"} 0' in text and 'herd_stall_seconds_bucket{le="15"} 1' in text
    assert "herd_stall_seconds_sum 15" in text and "herd_stall_seconds_count 1" in text


# ---- the runtime: detection in the timer callback, sockets before timers ----------------------------

def runtime_around(h: Harness) -> Runtime:
    config = h.config.replace(stall_threshold_ms=1_000)
    rt = Runtime(config, h.gc, Catalog(config, node_id=0), FakeStore(list(range(config.offsets_partitions))),
                 clock=h.clock)
    rt.replay({})  # every shard active
    return rt


def stalled_group():
    """A 3-member group on a started runtime whose clock then jumps STALL with nothing run: ->
    the harness, the runtime, the member ids, the generation and the stalls its listener saw."""
    h = Harness()
    rt = runtime_around(h)
    mids, gen = h.form_group("g", 3, session=SESSION)
    rt.start(asyncio.get_running_loop())
    stalls = []
    rt.stall_listeners.append(lambda ms, kind: stalls.append((ms, kind)))
    rt.stall.reset()
    h.clock.advance(STALL)
    return h, rt, mids, gen, stalls


async def test_the_runtime_notices_the_stall_in_its_timer_callback_and_holds_timers_until_io():
    h, rt, mids, gen, stalls = stalled_group()
    rt._fire()  # what the loop runs first on its way back: the core's timer, long overdue
    assert stalls == [(STALL, "loop")] and rt._held
    assert set(h.group("g").members) == set(mids)
    rt.arm(force=True)  # a request handled meanwhile does not re-arm the timer either
    assert rt._timer is None
    for mid in mids:  # the heartbeats read from the sockets in that turn
        req = HeartbeatRequest(group_id="g", generation_id=gen, member_id=mid)
        assert rt.heartbeat(3, req) == E.NONE
    for _ in range(3):
        await asyncio.sleep(0)
    assert not rt._held and rt._timer is not None  # timers run again, at the moved deadlines
    h.clock.advance(SESSION - 1)
    rt._fire()
    assert set(h.group("g").members) == set(mids) and h.group("g").generation == gen
    rt.shutdown()


async def test_a_heartbeat_handled_before_the_timers_after_a_stall_is_not_given_the_stall_twice():
    """Back from a pause, libuv reads the sockets before its timers run: a Heartbeat that waited in
    the kernel notices the stall itself, so its member's deadline is one session from now, not one
    session plus the pause (the conformance test's member killed in the pause expired 25 s after
    herd came back instead of 10)."""
    h, rt, mids, gen, stalls = stalled_group()
    # the first thing handled: member 0's heartbeat, sent before its client died in the pause
    req = HeartbeatRequest(group_id="g", generation_id=gen, member_id=mids[0])
    assert rt.heartbeat(3, req) == E.NONE
    assert stalls == [(STALL, "loop")] and rt._held
    for _ in range(3):
        await asyncio.sleep(0)
    assert not rt._held
    h.clock.advance(SESSION - 1)
    rt.stall.reset()  # the manual clock's jump is time that passed, not another stall
    rt._fire()
    assert set(h.group("g").members) == set(mids)  # everyone had the pause given back
    h.clock.advance(2)
    rt.stall.reset()
    rt._fire()
    # one session after that heartbeat: gone with the others (not one session plus the pause)
    assert mids[0] not in h.group("g").members
    rt.shutdown()


async def test_the_probe_alone_notices_a_stall():
    h = Harness()
    rt = runtime_around(h)
    rt.start(asyncio.get_running_loop())
    stalls = []
    rt.stall_listeners.append(lambda ms, kind: stalls.append((ms, kind)))
    h.clock.advance(2_000)
    await asyncio.sleep(0.12)  # the probe looks every 50 ms
    assert stalls == [(2_000, "loop")]
    rt.shutdown()


def test_on_uvloop_a_readable_socket_is_read_before_held_timers_run_again():
    """The stall happens in a timer callback (a blocking sleep: the loop really stalls) while the
    peer writes; the runtime holds its timers; the read callback must come before the release."""
    order: list[str] = []

    class Reader(asyncio.Protocol):
        def data_received(self, data):
            order.append("read")

    async def main():
        loop = asyncio.get_running_loop()
        assert isinstance(loop, uvloop.Loop)
        h = Harness()
        rt = runtime_around(h)
        rt.start(loop)
        rt.arm = lambda force=False: order.append("timers")  # what _release_hold calls
        ours, peer = socket.socketpair()
        transport, _ = await loop.create_connection(Reader, sock=ours)
        done = loop.create_future()

        def stalled():
            time.sleep(0.2)  # the loop is away...
            peer.send(b"heartbeat")  # ...while a member writes
            time.sleep(0.2)
            rt.hold_timers()  # what _on_stall does once it notices
            loop.call_later(0.05, done.set_result, None)

        loop.call_later(0.01, stalled)
        await done
        transport.close()
        peer.close()
        rt.stall.stop()

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main())
    assert order == ["read", "timers"]


# ---- a client that gave its session up during the stall (librdkafka) ----------------------------------

def given_up_group(n=3):
    h = Harness()
    mids, gen = h.form_group("g", n, session=SESSION)  # member i joined as client "c<i>"
    return h, mids, gen


def test_a_member_whose_client_rejoins_without_its_id_after_the_stall_is_removed_at_once():
    h, old, gen = given_up_group()
    h.advance(500)
    stall(h)
    for mid in old:  # the heartbeats sent before the client gave up: answered, they are in time
        assert h.heartbeat("g", gen, mid).error_code == E.NONE
    new = []
    for i in range(3):  # then each client joins again without a member id (librdkafka: SESSTMOUT)
        new.append(h.join_dynamic("g", session=SESSION, client_id=f"c{i}")[0])
        assert old[i] not in h.group("g").members
    assert set(h.group("g").members) == set(new)  # nobody waits for the old ids' moved deadlines
    assert h.gc.stats["members_removed_rejoined_as_new"] == 3
    first = [e for e in h.gc.group_history("g") if e["reason"] == "rejoined_as_new"][0]
    assert first["trigger"]["member_id"] == old[0] and first["stall"]["when"] == "after"
    removed = [r for e in h.gc.group_history("g") for r in e["removed"]]
    assert sorted(r["member_id"] for r in removed if r["why"] == "rejoined_as_new") == sorted(old[1:])
    for _ in range(3):  # the new members rejoin as the rebalance asks: it completes, no timer needed
        if h.state("g") != "PreparingRebalance":
            break
        for mid in new:
            if h.group("g").members[mid].join is None:
                h.join("g", mid, session=SESSION, client_id=f"c{new.index(mid)}")
    assert h.state("g") == "CompletingRebalance" and set(h.group("g").members) == set(new)


def test_a_new_member_from_another_client_or_after_the_window_removes_nobody():
    h, old, gen = given_up_group(2)
    stall(h)
    h.join_dynamic("g", session=SESSION, client_id="c0", host="/10.0.0.2")  # same client id, other host
    h.join_dynamic("g", session=SESSION, client_id="c9")
    assert set(old) <= set(h.group("g").members)
    h2, old2, gen2 = given_up_group(2)
    stall(h2)
    for _ in range(SESSION // 1_000 + 1):
        h2.advance(1_000)
        for mid in old2:
            h2.heartbeat("g", gen2, mid)
    h2.join_dynamic("g", session=SESSION, client_id="c0")  # after the window: as Kafka, beside the old one
    assert set(old2) <= set(h2.group("g").members)
    h3, old3, gen3 = given_up_group(2)
    h3.join_dynamic("g", session=SESSION, client_id="c0")  # no stall at all: as Kafka
    assert set(old3) <= set(h3.group("g").members)


def test_only_members_of_the_stall_are_looked_up_and_the_lookup_is_dropped_after_its_window():
    """The stall indexes the group's dynamic members then by client (a newcomer's JoinGroup looks
    its client up instead of scanning every member): a member that joined after the stall from the
    same client is never taken for one that gave up, and once the window has passed for all of them
    the index is dropped (it holds no removed member for ever)."""
    h, old, gen = given_up_group(1)
    stall(h)
    g = h.group("g")
    assert g.stalled_clients is not None and [m.member_id for m in g.stalled_clients[1][("c0", "/10.0.0.1")]] == old
    first, _t = h.join_dynamic("g", session=SESSION, client_id="c0")  # c0 gave up: its old member goes
    assert old[0] not in g.members and first in g.members
    second, _t = h.join_dynamic("g", session=SESSION, client_id="c0")  # again: nobody of the stall left
    assert first in g.members and second in g.members
    for _ in range(SESSION // 1_000 + 1):
        h.advance(1_000)
    h.join_dynamic("g", session=SESSION, client_id="c7")
    assert g.stalled_clients is None


# ---- a busy or loaded machine is not a pause (issue 33 item 9) -------------------------------------

class Sched:
    """A stand-in for the loop thread's run + run-queue time (schedstat), in ms."""

    def __init__(self):
        self.ms = 0

    def __call__(self):
        return self.ms


def test_a_gap_the_loop_thread_spent_running_or_waiting_for_a_cpu_gives_nothing_back():
    clock = ManualClock(monotonic_ms=10_000)
    seen, sched = [], Sched()
    d = StallDetector(clock, 1_000, on_stall=lambda *a: seen.append(a), sched=sched)
    d.reset()
    clock.advance(1_500)
    sched.ms += 1_450  # ran or was runnable for all but 50 ms: a loaded machine, not a pause
    assert d.check() == 0
    assert seen == [(0, "busy", 1_500)]  # reported (the sockets are read first), nothing given back
    clock.advance(15_000)
    sched.ms += 20  # a SIGSTOP: neither running nor runnable
    assert d.check() == 14_980  # the time away is given back, not the time it ran
    assert seen[-1] == (14_980, "loop", 15_000)


def test_a_pause_right_after_a_busy_gap_is_still_given_back():
    clock = ManualClock(monotonic_ms=10_000)
    seen, sched = [], Sched()
    d = StallDetector(clock, 1_000, on_stall=lambda *a: seen.append(a), sched=sched)
    d.reset()
    clock.advance(1_200)
    sched.ms += 1_200
    assert d.check() == 0
    clock.advance(50)
    sched.ms += 50
    assert d.check() == 0
    clock.advance(8_000)
    assert d.check() == 8_000
    assert [k for _, k, _ in seen] == ["busy", "loop"]


def test_the_real_loop_thread_spinning_is_busy_and_sleeping_is_a_pause():
    """With the real clock and the kernel's schedstat: a loop thread held by its own CPU work is
    late, not paused; one blocked in the kernel (as under SIGSTOP, a frozen VM, a stalled disk) is
    paused and gets the time back."""
    import time as _time

    from coordinator.clock import SystemClock
    from coordinator.ops.stall import thread_sched_ms

    if thread_sched_ms() is None:
        pytest.skip("this kernel has no /proc/thread-self/schedstat (the detector then counts every gap)")
    seen = []
    d = StallDetector(SystemClock(), 300, on_stall=lambda *a: seen.append(a))
    d.reset()
    end = _time.monotonic() + 0.6
    while _time.monotonic() < end:  # herd's own CPU work holding the loop
        pass
    assert d.check() == 0
    assert [k for _, k, _ in seen] == ["busy"]
    _time.sleep(0.6)  # away: not running, not runnable
    given = d.check()
    assert [k for _, k, _ in seen] == ["busy", "loop"]
    assert 450 <= given <= seen[-1][2]
