"""The user side of GroupConsumer (callbacks, acks, commits, close) against a fake network thread,
plus bounded-queue and no-hang checks against an unreachable broker."""

from __future__ import annotations

import dataclasses
import threading
import time

import pytest

import client.consumer as consumer_mod
from client import GroupConsumer, IllegalStateError, KafkaTimeoutError, OffsetAndMetadata, TopicPartition
from client.coordinator import (
    GroupFailed,
    JoinError,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
    Snapshot,
)
from client.errors import FencedInstanceIdError
from client.network import NUDGE, CommitCallback

T0, T1, T2 = (TopicPartition("t", p) for p in range(3))


def snap(**kw):
    base = dict(
        state="stable",
        generation=1,
        member_id="m1",
        leader=False,
        assignment=frozenset(),
        stable=True,
        epoch=0,
        events=0,
        subscribed=True,
        error=None,
        closed=False,
        coordinator=(1, "h", 1),
        protocol="eager",
    )
    base.update(kw)
    return Snapshot(**base)


class StubCore:
    def __init__(self, net):
        self.net = net

    def __getattr__(self, name):
        def record(*args, **kw):
            self.net.calls.append((name, args[:-1]))
            self.net.kwargs.append((name, kw))
            if name == "commit":
                data, handle = args[0], args[1]
                if self.net.defer_commits:
                    self.net.deferred.append((handle, data))  # answered when the core closes
                else:
                    self.net.reply(handle, data)
            elif name == "fetch_committed":
                self.net.reply(args[1], {tp: OffsetAndMetadata(1) for tp in args[0]})
            elif name == "close":
                for handle, data in self.net.deferred:
                    self.net.reply(handle, data)
                self.net.reply(args[0], None)

        return record


class FakeNet:
    instances: list = []

    def __init__(self, core, events, name=""):
        self.core = StubCore(self)
        self.events = events
        self.snapshot = snap(subscribed=False, stable=False, state="unjoined")
        self.commands_done = 0
        self.nudge_pending = False
        self.calls = []
        self.kwargs = []
        self.alive = False
        self.commit_error = None
        self.defer_commits = False
        self.deferred = []
        self.last_poll = 0.0
        FakeNet.instances.append(self)

    def start(self):
        self.alive = True

    def submit(self, cmd):
        if not self.alive:
            return 0
        cmd(self.core, time.monotonic())
        self.commands_done += 1
        return self.commands_done

    def caught_up(self):
        return True  # submit() runs commands at once

    def reply(self, handle, value):
        if handle.future is not None:
            if self.commit_error is not None:
                handle.future.set_exception(self.commit_error)
            else:
                handle.future.set_result(value)
        if handle.callback is not None:
            self.events.put(CommitCallback(handle.callback, handle.offsets, self.commit_error))

    def join(self, timeout=None):
        self.alive = False

    def is_alive(self):
        return self.alive

    def stop(self):
        self.alive = False

    def publish(self, **kw):
        self.snapshot = dataclasses.replace(self.snapshot, **kw)
        self.events.put(NUDGE)

    def names(self):
        return [n for n, _ in self.calls]


@pytest.fixture
def fake(monkeypatch):
    FakeNet.instances.clear()
    monkeypatch.setattr(consumer_mod, "NetworkThread", FakeNet)
    c = GroupConsumer("127.0.0.1:9", "g", enable_auto_commit=True, auto_commit_interval_ms=60000)
    net = FakeNet.instances[-1]
    yield c, net
    c.close(timeout_s=1)


class Rec:
    def __init__(self, fail_on=None, consumer=None):
        self.calls = []
        self.fail_on = fail_on
        self.consumer = consumer

    def on_partitions_assigned(self, ps):
        self.calls.append(("assigned", ps))
        if self.consumer is not None:
            self.nested = self.consumer.poll(5)  # re-entrant poll: returns at once
        if self.fail_on == "assigned":
            raise RuntimeError("listener failed")

    def on_partitions_revoked(self, ps):
        self.calls.append(("revoked", ps))
        if self.fail_on == "revoked":
            raise RuntimeError("listener failed")

    def on_partitions_lost(self, ps):
        self.calls.append(("lost", ps))


def assign(c, net, parts, seq=1, gen=1):
    net.events.put(PartitionsAssigned(seq, frozenset(parts), frozenset(parts), gen))
    net.publish(events=seq, assignment=frozenset(parts), stable=True, subscribed=True, state="stable")
    return c.poll(1)


def test_poll_runs_assigned_and_returns_assignment(fake):
    c, net = fake
    rec = Rec()
    c.subscribe(["t"], listener=rec)
    assert assign(c, net, [T0, T1]) == {T0, T1} == c.assignment()
    assert rec.calls == [("assigned", {T0, T1})]


def test_poll_waits_for_stable_until_timeout(fake):
    c, net = fake
    c.subscribe(["t"])
    net.publish(stable=False, subscribed=True, state="preparing")
    t0 = time.monotonic()
    assert c.poll(0.3) == frozenset()
    assert 0.25 <= time.monotonic() - t0 < 2.0


def test_revoke_runs_callback_commits_positions_then_acks(fake):
    c, net = fake
    rec = Rec()
    c.subscribe(["t"], listener=rec)
    assign(c, net, [T0, T1])
    c.seek(T0, 42)
    net.calls.clear()
    net.events.put(PartitionsRevoked(2, frozenset([T0, T1]), 0))
    net.publish(events=2, stable=False)
    order = []
    rec.on_partitions_revoked = lambda ps: order.append(("revoked", len(net.calls)))
    c.poll(0)
    names = net.names()
    # Kafka's order: positions committed first, then the listener, then the ack
    assert order == [("revoked", names.index("commit") + 1)]
    assert names.index("commit") < names.index("ack")
    commit_args = net.calls[names.index("commit")][1]
    assert commit_args[0] == {T0: OffsetAndMetadata(42)}
    assert net.calls[names.index("ack")][1] == (2,)
    assert c.assignment() == frozenset() and c.position(T0) is None


def test_stale_revoke_is_reported_as_lost(fake):
    c, net = fake
    rec = Rec()
    c.subscribe(["t"], listener=rec)
    assign(c, net, [T0])
    net.events.put(PartitionsRevoked(2, frozenset([T0]), 0))
    net.events.put(PartitionsLost(3, frozenset([T0])))
    net.publish(events=3, epoch=1, stable=False)
    c.poll(0)
    assert rec.calls[1:] == [("lost", {T0})]  # once, as lost
    assert ("ack", (2,)) in net.calls


def test_listener_exception_is_raised_after_the_ack(fake):
    c, net = fake
    c.subscribe(["t"], listener=Rec(fail_on="revoked"))
    assign(c, net, [T0])
    net.events.put(PartitionsRevoked(2, frozenset([T0]), 0))
    net.publish(events=2)
    with pytest.raises(RuntimeError, match="listener failed"):
        c.poll(0)
    assert ("ack", (2,)) in net.calls
    assert c.poll(0) == frozenset()  # raised once


def test_reentrant_poll_from_a_callback_returns_at_once(fake):
    c, net = fake
    rec = Rec(consumer=c)
    c.subscribe(["t"], listener=rec)
    t0 = time.monotonic()
    assign(c, net, [T2])
    assert time.monotonic() - t0 < 2 and rec.nested == {T2}  # the new assignment, as in Kafka


def test_lost_and_fatal_events(fake):
    c, net = fake
    rec = Rec()
    c.subscribe(["t"], listener=rec)
    assign(c, net, [T0, T1])
    net.events.put(PartitionsLost(2, frozenset([T1])))
    net.publish(events=2)
    assert c.poll(0) == {T0}
    err = FencedInstanceIdError()
    net.events.put(GroupFailed(3, err))
    net.publish(events=3, error=err)
    with pytest.raises(FencedInstanceIdError):
        c.poll(0)
    with pytest.raises(FencedInstanceIdError):
        c.commit({T0: 1})
    assert rec.calls[-2:] == [("lost", {T1}), ("lost", {T0})]


def test_async_commit_callback_runs_on_the_polling_thread(fake):
    c, net = fake
    c.subscribe(["t"])
    assign(c, net, [T0])
    seen = []
    c.commit(
        {T0: (5, "m")},
        sync=False,
        callback=lambda offsets, err: seen.append((threading.current_thread(), offsets, err)),
    )
    assert seen == []
    c.poll(0)
    assert seen == [(threading.current_thread(), {T0: OffsetAndMetadata(5, "m")}, None)]


def test_commit_defaults_to_positions_and_validates(fake):
    c, net = fake
    c.subscribe(["t"])
    assign(c, net, [T0, T1])
    c.seek(T1, 9, "md")
    assert c.commit() == {T1: OffsetAndMetadata(9, "md")}
    with pytest.raises(IllegalStateError):
        c.seek(T2, 1)
    for bad in ({T0: -1}, {T0: "x"}, {("t", -1): 1}):
        with pytest.raises(ValueError):
            c.commit(bad)


def test_sync_commit_callback_gets_error_and_raises(fake):
    c, net = fake
    net.commit_error = KafkaTimeoutError("nope")
    got = []
    with pytest.raises(KafkaTimeoutError):
        c.commit({T0: 1}, callback=lambda o, e: got.append(e))
    assert isinstance(got[0], KafkaTimeoutError)


def test_close_revokes_commits_and_is_idempotent(fake):
    c, net = fake
    rec = Rec()
    c.subscribe(["t"], listener=rec)
    assign(c, net, [T0])
    c.seek(T0, 3)
    c.close()
    assert rec.calls[-1] == ("revoked", {T0})
    names = net.names()
    assert names.index("commit") < names.index("close")
    c.close()
    with pytest.raises(IllegalStateError):
        c.poll(0)


def test_committed_returns_offsets(fake):
    c, net = fake
    assert c.committed([T0, ("t", 1)]) == {T0: OffsetAndMetadata(1), T1: OffsetAndMetadata(1)}


def test_config_dict_and_keywords(monkeypatch):
    FakeNet.instances.clear()
    monkeypatch.setattr(consumer_mod, "NetworkThread", FakeNet)
    a = GroupConsumer("h:1", "g", {"session.timeout.ms": 7000})
    b = GroupConsumer("h:1", "g", **{"session.timeout.ms": 7000})
    c = GroupConsumer("h:1", "g", session_timeout_ms=7000)
    assert a.config == b.config == c.config and a.config.session_timeout_ms == 7000
    for x in (a, b, c):
        x.close()


def test_close_from_another_thread_ends_a_long_poll(fake):
    c, net = fake
    c.subscribe(["t"])
    net.publish(stable=False, subscribed=True, state="preparing")
    done = []
    t = threading.Thread(target=lambda: done.append(c.poll(30)))
    t.start()
    for _ in range(5000):  # until the poll is waiting (it holds the poll lock), at most ~5 s
        if c._poll_lock.locked():
            break
        t.join(0.001)
    assert c._poll_lock.locked() and t.is_alive()
    t0 = time.monotonic()
    c.close(timeout_s=5)
    t.join(5)
    assert done == [frozenset()] and time.monotonic() - t0 < 3


# -- poll of a stable group: answered on the user's side (no command for the network thread) --------


def test_stable_poll_submits_no_command_and_records_the_poll_time(fake):
    c, net = fake
    rec = Rec()
    c.subscribe(["t"], listener=rec)
    assign(c, net, [T0, T1])
    net.calls.clear()
    net.last_poll = 0.0
    t0 = time.monotonic()
    for timeout in (0, 0.5, 30):
        assert c.poll(timeout) == {T0, T1}
    assert time.monotonic() - t0 < 5  # a stable group's poll returns at once, whatever the timeout
    assert net.calls == []  # nothing submitted to the network thread
    assert net.last_poll >= t0  # ...but the poll timer saw the polls
    assert rec.calls == [("assigned", {T0, T1})]


def test_poll_runs_pending_callbacks_without_a_command(fake):
    c, net = fake
    c.subscribe(["t"])
    assign(c, net, [T0])
    seen = []
    c.commit({T0: 5}, sync=False, callback=lambda offsets, err: seen.append(err))
    net.calls.clear()
    assert c.poll(0) == {T0} and seen == [None]
    assert "poll" not in net.names()


def test_poll_auto_commits_on_the_quiet_path(fake):
    c, net = fake
    c.subscribe(["t"])
    assign(c, net, [T0])
    c.seek(T0, 7)
    net.calls.clear()
    c._next_auto_commit = 0.0  # the auto-commit interval has passed
    c.poll(0)
    [commit] = [args for name, args in net.calls if name == "commit"]
    assert commit[0] == {T0: OffsetAndMetadata(7)}


def test_poll_takes_the_slow_path_while_a_command_is_pending(fake, monkeypatch):
    c, net = fake
    c.subscribe(["t"])
    assign(c, net, [T0])
    net.calls.clear()
    monkeypatch.setattr(net, "caught_up", lambda: False)  # e.g. a subscribe() not yet run
    assert c.poll(0) == {T0}
    assert net.names() == ["poll"]


def assigned_quietly(c, net) -> Rec:
    """Subscribe with a recording listener, get T0 assigned, forget the commands so far."""
    rec = Rec()
    c.subscribe(["t"], listener=rec)
    assign(c, net, [T0])
    net.calls.clear()
    return rec


def test_poll_of_a_rebalancing_group_submits_a_poll(fake):
    c, net = fake
    rec = assigned_quietly(c, net)
    net.events.put(PartitionsRevoked(2, frozenset([T0]), 0))
    net.publish(events=2, stable=False, state="stable")
    c.poll(0)
    assert rec.calls[-1] == ("revoked", {T0})
    assert {"ack", "poll"} <= set(net.names())


def test_poll_after_a_poll_timeout_leave_submits_the_rejoining_poll(fake):
    c, net = fake
    rec = assigned_quietly(c, net)
    # The network thread found the poll timer expired: it left the group (partitions lost).
    net.events.put(PartitionsLost(2, frozenset([T0])))
    net.publish(events=2, stable=False, state="unjoined", generation=-1, member_id="", assignment=frozenset())
    assert c.poll(0) == frozenset()
    assert rec.calls[-1] == ("lost", {T0})
    assert "poll" in net.names()  # core.poll ends the poll-timeout leave: the member rejoins


def test_a_commit_in_the_revocation_listener_during_close_goes_through(fake):
    """The usual pattern (commit in on_partitions_revoked) works in close(), as in Kafka."""
    c, net = fake
    seen = []

    class Committer:
        def on_partitions_revoked(self, ps):
            seen.append(c.commit({T0: 77}))

    c.subscribe(["t"], listener=Committer())
    assign(c, net, [T0])
    net.calls.clear()
    c.close()
    assert seen == [{T0: OffsetAndMetadata(77)}]
    names = net.names()
    assert names.count("commit") == 1 and names.index("commit") < names.index("close")
    with pytest.raises(IllegalStateError):
        c.commit({T0: 78})


@pytest.mark.parametrize("timeout_s", [2, 0])
@pytest.mark.parametrize("revoke_pending", [False, True], ids=["assigned", "revocation-pending"])
def test_close_bounds_its_auto_commit_by_its_own_timeout(fake, timeout_s, revoke_pending):
    """Also a revocation not yet polled when close() runs (drained by close); with no time left the
    commit is still made (the core sends it once)."""
    c, net = fake
    c.subscribe(["t"])
    assign(c, net, [T0])
    c.seek(T0, 9)
    if revoke_pending:
        net.events.put(PartitionsRevoked(2, frozenset([T0]), 0))
    net.calls.clear()
    t0 = time.monotonic()
    c.close(timeout_s=timeout_s)
    assert net.names().count("commit") == 1
    data, handle, deadline = net.calls[net.names().index("commit")][1]
    assert data == {T0: OffsetAndMetadata(9)} and deadline <= t0 + timeout_s + 0.5


def test_commits_carry_the_membership_epoch_of_the_view(fake):
    c, net = fake
    c.subscribe(["t"])
    assign(c, net, [T0, T1])
    c.commit({T0: 1})
    assert net.kwargs[-1] == ("commit", {"epoch": 0})
    net.events.put(PartitionsLost(2, frozenset([T0, T1]), 1))
    net.publish(events=2, epoch=1, stable=False, state="unjoined")
    c.poll(0)
    c.commit({T0: 2})
    assert net.kwargs[-1] == ("commit", {"epoch": 1})
    net.events.put(PartitionsAssigned(3, frozenset([T1]), frozenset([T1]), 2, 1))
    net.publish(events=3, epoch=1, stable=True, state="stable", assignment=frozenset([T1]))
    c.poll(1)
    c.seek(T1, 5)
    c.commit()
    assert net.kwargs[-1] == ("commit", {"epoch": 1}) and net.calls[-1][1][0] == {T1: OffsetAndMetadata(5)}


def test_poll_from_inside_a_callback_restarts_the_poll_timer(fake):
    c, net = fake
    seen = []

    class Slow:
        def on_partitions_assigned(self, ps):
            net.last_poll = 0.0
            c.poll(0)  # a long callback keeps the member alive by polling
            seen.append(net.last_poll)

    c.subscribe(["t"], listener=Slow())
    assign(c, net, [T0])
    assert seen and seen[0] > 0.0


def test_an_unexpected_join_error_is_raised_once_by_poll(fake):
    from client.errors import KafkaError
    c, net = fake
    c.subscribe(["t"])
    net.events.put(JoinError(1, KafkaError("JoinGroup failed: UNKNOWN_SERVER_ERROR", code=-1)))
    net.publish(events=1, stable=False, subscribed=True, state="unjoined")
    with pytest.raises(KafkaError, match="UNKNOWN_SERVER_ERROR"):
        c.poll(0)
    net.publish(stable=True, state="stable")
    assert c.poll(0) == frozenset()  # once: the member goes on


# ---- close and unsubscribe ---------------------------------------------------------------------


def test_close_runs_the_callbacks_of_async_commits_that_complete_during_close(fake):
    """As Kafka's close (invokeCompletedOffsetCommitCallbacks): the callback of an async commit the
    core answers while closing runs on the closing thread before close() returns."""
    c, net = fake
    c.subscribe(["t"])
    assign(c, net, [T0])
    net.defer_commits = True
    seen = []
    c.commit({T0: 77}, sync=False, callback=lambda o, e: seen.append((o, e, threading.current_thread())))
    assert seen == []
    c.close(timeout_s=2)
    assert seen == [({T0: OffsetAndMetadata(77)}, None, threading.current_thread())]


@pytest.mark.parametrize("call", ["commit", "committed"])
def test_calls_from_the_revocation_listener_during_close_are_bounded_by_its_timeout(fake, call):
    """close(timeout_s=2) with the listener committing (default.api.timeout.ms: 60 s): the listener's
    call gets at most what is left of the 2 s, so close stays bounded (it took 65 s, daemon down)."""
    c, net = fake

    class Listener:
        def on_partitions_revoked(self, ps):
            if call == "commit":
                c.commit({T0: 5})
            else:
                c.committed([T0])

    c.subscribe(["t"], listener=Listener())
    assign(c, net, [T0])
    net.calls.clear()
    t0 = time.monotonic()
    c.close(timeout_s=2)
    [args] = [a for n, a in net.calls if n == ("commit" if call == "commit" else "fetch_committed")]
    assert args[2] <= t0 + 2.5  # (offsets or partitions, handle, deadline)


@pytest.mark.parametrize(
    "snapshot",
    [
        dict(state="preparing", stable=False),
        dict(state="completing", stable=False, generation=2),
        dict(state="unjoined", stable=False, generation=-1, member_id=""),
    ],
    ids=["preparing", "completing", "no-generation"],
)
@pytest.mark.parametrize("how", ["close", "unsubscribe"])
def test_giving_up_the_assignment_during_a_rebalance_reports_it_lost(fake, snapshot, how):
    """As Kafka's onLeavePrepare: with no generation, or a rebalance in progress, the partitions may
    be someone else's already: on_partitions_lost, and no commit of the positions first."""
    c, net = fake
    rec = Rec()
    c.subscribe(["t"], listener=rec)
    assign(c, net, [T0])
    c.seek(T0, 4)
    net.publish(**snapshot)
    net.calls.clear()
    getattr(c, how)()
    assert rec.calls[-1] == ("lost", {T0}) and ("revoked", {T0}) not in rec.calls
    assert "commit" not in net.names()
