"""herd's client against the herd daemon (a real subprocess): convergence, leave / kill -9 /
poll-timeout paths, cooperative rebalancing, static restart, and mixed groups with unmodified
third-party clients.

The daemon is started by the ``herd_daemon`` fixture below through ``tools/daemon.py``; swap
it for the project's shared daemon fixture once there is one. Everything is bounded: short
sessions, explicit deadlines, every consumer closed in ``finally``.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from client import GroupConsumer, TopicPartition
from tools.daemon import Daemon

pytestmark = pytest.mark.integration

PARTITIONS = 12
ALL = frozenset(TopicPartition("t", p) for p in range(PARTITIONS))
SESSION_MS = 2000
# The mixed-client tests: long, as three clients share this process (kafka-python's heartbeat thread
# competes with the polling loop for the GIL); on a loaded machine a 6 s session expired kafka-python
# now and then (no member is meant to expire there, and nothing waits for a session to end).
MIXED_SESSION_MS = 20000
_groups = itertools.count()


@pytest.fixture(scope="module")
def herd_daemon(tmp_path_factory):
    d = Daemon(
        tmp_path_factory.mktemp("herd") / "data",
        "--topic",
        f"t:{PARTITIONS}",
        "--min-session-timeout-ms",
        "1000",
        initial_rebalance_delay_ms=0,
        fsync="never",
    )
    d.start()
    try:
        yield d.bootstrap
    finally:
        d.stop()
        d.kill()


def group():
    return f"d-{os.getpid()}-{next(_groups)}"


def consumer(bootstrap, grp, **kw):
    cfg = dict(
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=200,
        request_timeout_ms=10000,
        default_api_timeout_ms=15000,
        retry_backoff_ms=50,
    )
    cfg.update(kw)
    return GroupConsumer(bootstrap, grp, **cfg)


def converge(consumers, expected=ALL, timeout=30.0):
    deadline = time.monotonic() + timeout
    views = []
    while time.monotonic() < deadline:
        views = [c.poll(0.02) for c in consumers]
        flat = [tp for v in views for tp in v]
        if (
            len(flat) == len(set(flat))
            and set(flat) == expected
            and len({c.generation() for c in consumers}) == 1
            and all(c.group_state()["stable"] for c in consumers)
        ):
            return views
    pytest.fail(f"no convergence in {timeout}s: {[sorted(v) for v in views]}")


@pytest.mark.parametrize("n", [1, 5, 20])
def test_members_converge(herd_daemon, n):
    g = group()
    cs = [consumer(herd_daemon, g) for _ in range(n)]
    try:
        for c in cs:
            c.subscribe(["t"])
        views = converge(cs, timeout=30)
        sizes = sorted(len(v) for v in views)
        assert sizes[-1] - sizes[0] <= 1
        c0 = cs[0]
        c0.commit({tp: 3 for tp in views[0]})
        assert all(om.offset == 3 for om in c0.committed(sorted(views[0])).values())
    finally:
        for c in cs:
            c.close(timeout_s=5)


def test_leave_hands_over_promptly(herd_daemon):
    g = group()
    cs = [consumer(herd_daemon, g, session_timeout_ms=30000, heartbeat_interval_ms=200) for _ in range(3)]
    try:
        for c in cs:
            c.subscribe(["t"])
        converge(cs)
        t0 = time.monotonic()
        cs[2].close()
        converge(cs[:2], timeout=10)
        assert time.monotonic() - t0 < 10  # LeaveGroup, not the 30 s session expiry
    finally:
        for c in cs:
            c.close(timeout_s=5)


def test_close_while_parked_in_a_rebalance_leaves_at_once(herd_daemon):
    # b's JoinGroup is parked: the rebalance waits for a, who never polls again to give up its
    # partitions (eager). herd answers a connection's requests in order, so a LeaveGroup sent
    # behind the parked JoinGroup would wait for the rebalance (here: until the close timeout).
    from client.spark import describe_group

    g = group()
    a = consumer(herd_daemon, g, partition_assignment_strategy="range")
    b = consumer(herd_daemon, g, partition_assignment_strategy="range")
    try:
        a.subscribe(["t"])
        converge([a])
        b.subscribe(["t"])
        deadline = time.monotonic() + 10
        while b.group_state()["state"] != "preparing" or describe_group(herd_daemon, g)["state"] != \
                "PreparingRebalance":
            assert time.monotonic() < deadline, (b.group_state(), describe_group(herd_daemon, g))
            time.sleep(0.05)
        t0 = time.monotonic()
        b.close(timeout_s=8)
        assert time.monotonic() - t0 < 3
        assert [x["member_id"] for x in describe_group(herd_daemon, g)["members"]] == [a.member_id()]
    finally:
        for c in (a, b):
            c.close(timeout_s=5)


CHILD = textwrap.dedent("""
    import sys, time
    sys.path.insert(0, {repo!r})
    from client import GroupConsumer
    c = GroupConsumer({boot!r}, {group!r}, session_timeout_ms={session}, heartbeat_interval_ms=200)
    c.subscribe(["t"])
    while True:
        a = c.poll(0.1)
        if a and c.group_state()["stable"]:
            print("ASSIGNED", len(a), flush=True)
""")


def test_kill_9_member_expires_after_session(herd_daemon):
    from tools.daemon import REPO

    g = group()
    c = consumer(herd_daemon, g)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD.format(repo=str(REPO), boot=herd_daemon, group=g, session=SESSION_MS)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(iter(child.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        c.subscribe(["t"])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # keep polling: the rebalance needs us too
            mine = c.poll(0.05)
            if lines and 0 < len(mine) < PARTITIONS and c.group_state()["stable"]:
                break
        assert lines and 0 < len(c.assignment()) < PARTITIONS, "the child never shared the partitions"
        child.send_signal(signal.SIGKILL)
        child.wait(5)
        t0 = time.monotonic()
        converge([c], timeout=20)
        assert time.monotonic() - t0 >= SESSION_MS / 1000 * 0.5  # only the session timeout removes it
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(5)
        c.close(timeout_s=5)


def test_poll_timeout_member_leaves_and_rejoins(herd_daemon):
    g = group()
    lazy = consumer(herd_daemon, g, max_poll_interval_ms=1500)
    busy = consumer(herd_daemon, g)
    try:
        for c in (lazy, busy):
            c.subscribe(["t"])
        converge([lazy, busy])
        t0 = time.monotonic()
        while time.monotonic() - t0 < 3.0:  # only busy polls
            busy.poll(0.05)
        assert busy.assignment() == ALL and lazy.generation() == -1
        converge([lazy, busy])  # lazy polls again: it rejoins
    finally:
        lazy.close(timeout_s=5)
        busy.close(timeout_s=5)


def test_cooperative_incremental_rebalance_never_owns_twice(herd_daemon):
    g = group()
    lock = threading.Lock()
    owners: dict = {}
    overlaps = []
    revocations = []

    class Track:
        def __init__(self, name):
            self.name = name

        def on_partitions_assigned(self, ps):
            with lock:
                for tp in ps:
                    if owners.get(tp, self.name) != self.name:
                        overlaps.append((tp, owners[tp], self.name))
                    owners[tp] = self.name

        def on_partitions_revoked(self, ps):
            with lock:
                revocations.append((self.name, len(ps)))
                for tp in ps:
                    if owners.get(tp) == self.name:
                        del owners[tp]

        on_partitions_lost = on_partitions_revoked

    cs = []
    try:
        for i in range(4):
            c = consumer(herd_daemon, g, partition_assignment_strategy="cooperative-sticky")
            c.subscribe(["t"], listener=Track(f"c{i}"))
            cs.append(c)
            views = converge(cs)
            assert sorted(len(v) for v in views)[-1] - sorted(len(v) for v in views)[0] <= 1
        cs.pop(0).close()
        converge(cs)
        assert overlaps == []
        # Incremental: no member ever revoked everything it had to let one partition go.
        assert all(n < PARTITIONS for _, n in revocations if _ != "c0")
    finally:
        for c in cs:
            c.close(timeout_s=5)


def test_static_member_restart_keeps_partitions_without_rebalance(herd_daemon):
    g = group()
    other = consumer(herd_daemon, g, session_timeout_ms=10000)
    static = consumer(herd_daemon, g, group_instance_id="static-1", session_timeout_ms=10000)
    try:
        other.subscribe(["t"])
        static.subscribe(["t"])
        views = converge([other, static])
        gen = other.generation()
        before = views[1]
        static.close()
        static = consumer(herd_daemon, g, group_instance_id="static-1", session_timeout_ms=10000)
        static.subscribe(["t"])
        deadline = time.monotonic() + 10
        while static.poll(0.05) != before and time.monotonic() < deadline:
            pass
        assert static.assignment() == before
        assert static.generation() == gen and other.generation() == gen
    finally:
        other.close(timeout_s=5)
        static.close(timeout_s=5)


# -- interop with unmodified clients --------------------------------------------------------------


def _confluent(bootstrap, g):
    ck = pytest.importorskip("confluent_kafka")
    c = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": g,
            "partition.assignment.strategy": "range",
            "session.timeout.ms": MIXED_SESSION_MS,
            "heartbeat.interval.ms": 300,
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "log_level": 3,
        }
    )
    c.subscribe(["t"])
    return c


def _kafka_python(bootstrap, g):
    kp = pytest.importorskip("kafka")
    from kafka.coordinator.assignors.range import RangePartitionAssignor

    c = kp.KafkaConsumer(
        bootstrap_servers=bootstrap,
        group_id=g,
        session_timeout_ms=MIXED_SESSION_MS,
        heartbeat_interval_ms=300,
        enable_auto_commit=False,
        partition_assignment_strategy=[RangePartitionAssignor],
        metadata_max_age_ms=1000,
    )
    # The topic's metadata before the first JoinGroup: kafka-python 3.0.12 as leader otherwise
    # assigns nothing ("No partition metadata for topic t") and rejoins when the metadata comes,
    # a rejoin it can strand (see _KafkaPythonPoller).
    assert c.partitions_for_topic("t") == set(range(PARTITIONS))
    c.subscribe(["t"])
    return _KafkaPythonPoller(c)


class _KafkaPythonPoller:
    """A kafka-python consumer polled back to back on a thread of its own, with long polls, as an
    application's poll loop does. kafka-python 3.0.12 strands a member whose metadata-triggered
    rejoin is still in flight when a poll() times out (its next poll finds need_rejoin() False and
    never runs the join's completion: no heartbeats, no partitions, until herd expires its session;
    see tests/conformance/test_offsets.py). Polled for 50 ms in turn with the other two clients,
    this test failed about one run in eight (in CI, and reproduced with kafka-python's debug log);
    with the metadata fetched before the first join (no such rejoin) and 1 s polls here, none in
    50 runs of the three orders."""

    def __init__(self, consumer):
        self.consumer = consumer
        self.view: frozenset = frozenset()
        self.changed = threading.Event()  # set when ``view`` changes
        self.stop = threading.Event()
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, name="kafka-python-poll", daemon=True)
        self.thread.start()

    def _run(self):
        try:
            while not self.stop.is_set():
                self.consumer.poll(timeout_ms=1000)
                view = frozenset(TopicPartition(tp.topic, tp.partition) for tp in self.consumer.assignment())
                if view != self.view:
                    self.view = view
                    self.changed.set()
        except BaseException as exc:  # noqa: BLE001 - reported by assignment()
            self.error = exc
        finally:
            self.consumer.close()

    def assignment(self) -> frozenset:
        if self.error is not None:
            raise self.error
        return self.view

    def close(self):
        self.stop.set()
        self.thread.join(30)


@pytest.mark.parametrize("first", ["herd", "confluent", "kafka-python"])
def test_mixed_group_converges_whoever_leads(herd_daemon, first):
    g = group()
    makers = {
        "herd": lambda: _herd(herd_daemon, g),
        "confluent": lambda: _confluent(herd_daemon, g),
        "kafka-python": lambda: _kafka_python(herd_daemon, g),
    }
    order = [first] + [k for k in makers if k != first]
    members = {}
    try:
        members[first] = makers[first]()
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10 and not _assignment(first, members[first]):
            _poll(first, members[first])
        for name in order[1:]:
            members[name] = makers[name]()
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            for name, c in members.items():
                _poll(name, c)
            views = {name: _assignment(name, c) for name, c in members.items()}
            flat = [tp for v in views.values() for tp in v]
            if set(flat) == ALL and len(flat) == len(set(flat)) and all(views.values()):
                break
        else:
            pytest.fail(f"mixed group did not converge: {views}")
    finally:
        for c in members.values():
            try:
                c.close()
            except Exception:  # noqa: BLE001
                pass


def _herd(bootstrap, g):
    c = consumer(
        bootstrap,
        g,
        session_timeout_ms=MIXED_SESSION_MS,
        heartbeat_interval_ms=300,
        partition_assignment_strategy="range",
    )
    c.subscribe(["t"])
    return c


def _poll(name, c):
    if name == "herd":
        c.poll(0.05)
    elif name == "confluent":
        c.poll(0.05)
    else:  # kafka-python polls on its own thread (_KafkaPythonPoller): wait for a change of its view
        c.changed.wait(0.05)
        c.changed.clear()


def _assignment(name, c) -> frozenset:
    if name in ("herd", "kafka-python"):
        return c.assignment()
    return frozenset(TopicPartition(tp.topic, tp.partition) for tp in c.assignment())


def test_a_member_removed_while_busy_cannot_commit_over_its_lost_partitions(herd_daemon):
    """A is removed from the group (an admin's LeaveGroup for its member id) while its user thread
    is busy; the background thread rejoins on its own, but a commit from the old view fails with
    CommitFailedError (as Kafka's commitSync would) instead of writing under the new generation.
    After a poll has run on_partitions_lost and the new assignment, commits work again."""
    from client.errors import CommitFailedError
    from protocol import messages as m
    from tools.rawclient import RawClient

    g = group()
    lost = []

    class Listener:
        def on_partitions_lost(self, ps):
            lost.append(ps)

    a = consumer(herd_daemon, g)
    try:
        a.subscribe(["t"], listener=Listener())
        converge([a])
        a.seek(TopicPartition("t", 0), 100)
        old_member, old_gen = a.member_id(), a.generation()
        host, port = herd_daemon.rsplit(":", 1)
        with RawClient((host, int(port))) as admin:
            r = admin.call(m.LeaveGroupRequest(group_id=g, members=[
                m.LeaveGroupRequestMemberIdentity(member_id=old_member, reason="removed by test")]), 4)
            assert r.error_code == 0 and r.members[0].error_code == 0
        deadline = time.monotonic() + 20  # the background thread notices (heartbeat) and rejoins
        while not (a.member_id() not in ("", old_member) and a.group_state()["state"] == "stable"):
            assert time.monotonic() < deadline, a.group_state()
            time.sleep(0.02)  # the real background thread and daemon: nothing to wait on but its state
        assert a.generation() > old_gen and TopicPartition("t", 0) in a.assignment()  # the old view
        with pytest.raises(CommitFailedError):
            a.commit()
        assert a.committed([TopicPartition("t", 0)])[TopicPartition("t", 0)] is None
        converge([a])  # the poll runs on_partitions_lost, then the new assignment
        assert lost and TopicPartition("t", 0) in lost[0]
        a.commit({TopicPartition("t", 0): 7})
        assert a.committed([TopicPartition("t", 0)])[TopicPartition("t", 0)].offset == 7
    finally:
        a.close(timeout_s=5)


def test_close_sends_a_pending_async_commit_and_runs_its_callback(herd_daemon):
    """As Kafka's close: an async commit made just before close() is sent (not failed unsent),
    and its callback runs before close() returns."""
    g = group()
    tp = TopicPartition("t", 0)
    seen = []
    a = consumer(herd_daemon, g, enable_auto_commit=False)
    try:
        a.subscribe(["t"])
        converge([a])
        a.commit({tp: 1})
        a.commit({tp: 77}, sync=False, callback=lambda offsets, error: seen.append((offsets, error)))
    finally:
        a.close(timeout_s=5)
    assert len(seen) == 1 and seen[0][1] is None and seen[0][0][tp].offset == 77
    b = consumer(herd_daemon, g)
    try:
        assert b.committed([tp])[tp].offset == 77
    finally:
        b.close(timeout_s=5)


def _own_daemon(tmp_path, *extra):
    d = Daemon(tmp_path / "data", "--topic", f"t:{PARTITIONS}", "--min-session-timeout-ms", "1000", *extra,
               initial_rebalance_delay_ms=0, fsync="never")
    return d.start()


def test_a_full_group_is_raised_once_by_poll_and_joined_once_there_is_room(tmp_path):
    """GROUP_MAX_SIZE_REACHED is not fatal: as Kafka's, the poll after a refused JoinGroup raises
    it, and the member joins again (after a backoff) until the group has room."""
    from client.errors import GroupMaxSizeReachedError

    d = _own_daemon(tmp_path, "--group-max-size", "1")
    g = group()
    a = consumer(d.bootstrap, g)
    b = consumer(d.bootstrap, g)
    try:
        a.subscribe(["t"])
        converge([a])
        b.subscribe(["t"])
        with pytest.raises(GroupMaxSizeReachedError):
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                b.poll(0.2)
        a.close(timeout_s=5)
        deadline = time.monotonic() + 20
        while True:
            assert time.monotonic() < deadline, b.group_state()
            try:
                if b.poll(0.2) == ALL:
                    break
            except GroupMaxSizeReachedError:
                pass  # a JoinGroup refused before a left
    finally:
        for c in (a, b):
            c.close(timeout_s=5)
        d.stop()
        d.kill()


def test_close_with_the_daemon_down_is_bounded_even_when_the_listener_commits(tmp_path):
    """The listener's commit (default.api.timeout.ms 60 s here) is bounded by close's timeout."""
    from client.errors import KafkaTimeoutError

    d = _own_daemon(tmp_path)
    g = group()
    outcome = []
    a = consumer(d.bootstrap, g, default_api_timeout_ms=60000, reconnect_backoff_ms=20,
                 reconnect_backoff_max_ms=100)

    class Listener:
        def on_partitions_revoked(self, ps):
            try:
                a.commit({tp: 99 for tp in ps})
                outcome.append("committed")
            except KafkaTimeoutError as exc:
                outcome.append(exc)

    try:
        a.subscribe(["t"], listener=Listener())
        for tp in converge([a])[0]:
            a.seek(tp, 10)
        d.proc.kill()
        d.proc.wait(10)
        t0 = time.monotonic()
        a.close(timeout_s=2)
        assert time.monotonic() - t0 < 5  # was 2 s + 60 s
        assert len(outcome) == 1 and isinstance(outcome[0], KafkaTimeoutError)
    finally:
        a.close(timeout_s=2)
        d.kill()
