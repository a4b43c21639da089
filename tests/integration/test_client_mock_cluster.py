"""herd's client against a Kafka server herd did not write: librdkafka's mock cluster.

The mock's known defects (../shared/tools/README.md) are handled by the client, not copied:
ApiVersions v3+ answers are malformed (the client negotiates down), a follower's late SyncGroup gets
INVALID_REQUEST (the client rejoins), LeaveGroup v3+ answers lack the members list (ignored), and
every rebalance after the first waits session.timeout - 1 s (sessions here are short). The mock also
advertises JoinGroup v6 and SyncGroup v4 but cannot parse them (it hangs up); the client lowers an
API's version for a broker that hangs up on a request it never answered, and these tests also pin
the versions up front (``api.versions.max``) so each test does not pay a rebalance to learn that.
"""

from __future__ import annotations

import itertools
import os
import random
import subprocess
import sys
import threading
import time

import pytest

from client import (
    CommitFailedError,
    GroupConsumer,
    IllegalStateError,
    KafkaTimeoutError,
    OffsetAndMetadata,
    RebalanceInProgressError,
    TopicPartition,
)
from tests.support.shared import require_shared

SESSION_MS = 2000  # the mock delays every rebalance after the first by session - 1 s
PARTITIONS = 6
ALL = frozenset(TopicPartition("t", p) for p in range(PARTITIONS))
_groups = itertools.count()


@pytest.fixture(scope="module")
def mock_cluster():
    mock = require_shared("tools", "mock_cluster.py")  # ../shared: a fresh clone skips
    try:
        import confluent_kafka  # noqa: F401
    except ImportError:
        pytest.skip("confluent_kafka is not installed (needed by the mock cluster)")
    proc = subprocess.Popen(
        [
            sys.executable,
            str(mock),
            "--topic",
            f"t:{PARTITIONS}",
            "--initial-rebalance-delay-ms",
            "0",
            "--max-seconds",
            "300",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline().strip()
        if not line:
            # the mock exists and confluent_kafka imports: a mock that dies at start is a failure of
            # this run (it used to turn every test of the module into a skip)
            proc.kill()
            _, err = proc.communicate(timeout=10)
            pytest.fail(f"the mock cluster exited at start (code {proc.returncode}): {err[-2000:]}")
        assert line.startswith("127.0.0.1:"), line
        yield line
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def consumer(bootstrap, group, **kw):
    cfg = dict(
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=300,
        request_timeout_ms=10000,
        default_api_timeout_ms=15000,
        retry_backoff_ms=50,
        api_versions_max={"JoinGroup": 5, "SyncGroup": 3},
    )
    cfg.update(kw)
    return GroupConsumer(bootstrap, group, **cfg)


def new_group(prefix="g"):
    return f"{prefix}-{os.getpid()}-{next(_groups)}"


def converge(consumers, expected=ALL, timeout=30.0):
    """Poll all until their assignments are disjoint, complete and from one stable generation."""
    deadline = time.monotonic() + timeout
    views = []
    while time.monotonic() < deadline:
        views = [c.poll(0.05) for c in consumers]
        flat = [tp for v in views for tp in v]
        if (
            len(flat) == len(set(flat))
            and set(flat) == expected
            and len({c.generation() for c in consumers}) == 1
            and all(c.group_state()["stable"] for c in consumers)
        ):
            return views
    pytest.fail(
        f"no convergence in {timeout}s: {[sorted(v) for v in views]} {[c.group_state() for c in consumers]}"
    )


class Recorder:
    def __init__(self):
        self.calls = []
        self.lock = threading.Lock()

    def on_partitions_revoked(self, ps):
        with self.lock:
            self.calls.append(("revoked", frozenset(ps)))

    def on_partitions_assigned(self, ps):
        with self.lock:
            self.calls.append(("assigned", frozenset(ps)))

    def on_partitions_lost(self, ps):
        with self.lock:
            self.calls.append(("lost", frozenset(ps)))


def test_one_member_group_assigns_everything_and_commits(mock_cluster):
    rec = Recorder()
    with consumer(mock_cluster, new_group()) as c:
        c.subscribe(["t"], listener=rec)
        [view] = converge([c], timeout=20)
        assert view == ALL == c.assignment()
        assert c.generation() >= 1 and c.member_id()
        assert rec.calls == [("assigned", ALL)]
        offsets = {TopicPartition("t", p): 100 + p for p in range(PARTITIONS)}
        offsets[TopicPartition("t", 0)] = (7, "meta-0")
        c.commit(offsets)
        got = c.committed(sorted(ALL))
        assert got[TopicPartition("t", 0)].offset == 7 and got[TopicPartition("t", 0)].metadata == "meta-0"
        assert all(got[TopicPartition("t", p)].offset == 100 + p for p in range(1, PARTITIONS))
        # Positions + commit() with no arguments; async commit with a callback run at poll time.
        c.seek(TopicPartition("t", 1), 555)
        c.commit()
        assert c.committed([TopicPartition("t", 1)])[TopicPartition("t", 1)].offset == 555
        done = []
        c.commit({TopicPartition("t", 2): 77}, sync=False, callback=lambda o, e: done.append((o, e)))
        deadline = time.monotonic() + 10
        while not done and time.monotonic() < deadline:
            c.poll(0.1)
        assert done and done[0][1] is None and done[0][0] == {TopicPartition("t", 2): OffsetAndMetadata(77)}
    assert rec.calls[-1] == ("revoked", ALL)  # close revokes


def test_three_member_group_disjoint_complete_and_commits(mock_cluster):
    group = new_group()
    cs = [consumer(mock_cluster, group, client_id=f"c{i}") for i in range(3)]
    try:
        for c in cs:
            c.subscribe(["t"])
        views = converge(cs, timeout=40)
        assert all(len(v) == 2 for v in views)  # range: 6 partitions over 3 members
        assert len({c.member_id() for c in cs}) == 3
        for c, v in zip(cs, views, strict=True):
            c.commit({tp: 1000 + tp.partition for tp in v})
        got = cs[0].committed(sorted(ALL))
        assert {tp: om.offset for tp, om in got.items()} == {tp: 1000 + tp.partition for tp in ALL}
    finally:
        for c in cs:
            c.close()


def test_member_leaving_hands_partitions_over_with_callbacks(mock_cluster):
    group = new_group()
    recs = [Recorder(), Recorder()]
    cs = [consumer(mock_cluster, group, partition_assignment_strategy="roundrobin") for _ in range(2)]
    try:
        for c, r in zip(cs, recs, strict=True):
            c.subscribe(["t"], listener=r)
        converge(cs, timeout=40)
        cs[1].close()
        [view] = converge(cs[:1], timeout=30)
        assert view == ALL
        # Eager: every rebalance revokes everything first, then assigns.
        kinds = [k for k, _ in recs[0].calls]
        assert kinds[-2:] == ["revoked", "assigned"] and recs[0].calls[-1][1] == ALL
        assert recs[1].calls[-1][0] == "revoked"  # close revoked the leaver's partitions
    finally:
        for c in cs:
            c.close()


def test_cooperative_rebalance_never_owns_a_partition_twice(mock_cluster):
    group = new_group()
    stop = threading.Event()
    owners: dict = {}
    overlap = []
    lock = threading.Lock()

    class Tracker:
        def __init__(self, name):
            self.name = name

        def on_partitions_assigned(self, ps):
            with lock:
                for tp in ps:
                    if owners.get(tp) not in (None, self.name):
                        overlap.append((tp, owners[tp], self.name))
                    owners[tp] = self.name

        def on_partitions_revoked(self, ps):
            with lock:
                for tp in ps:
                    if owners.get(tp) == self.name:
                        del owners[tp]

        on_partitions_lost = on_partitions_revoked

    cs = []
    try:
        first = consumer(mock_cluster, group, partition_assignment_strategy="cooperative-sticky")
        cs.append(first)
        first.subscribe(["t"], listener=Tracker("a"))
        converge(cs, timeout=20)
        second = consumer(mock_cluster, group, partition_assignment_strategy="cooperative-sticky")
        cs.append(second)
        second.subscribe(["t"], listener=Tracker("b"))
        views = converge(cs, timeout=40)
        assert sorted(len(v) for v in views) == [3, 3]
        assert first.group_state()["protocol"] == "cooperative"
        assert overlap == []
    finally:
        stop.set()
        for c in cs:
            c.close()


def test_poll_timeout_leaves_and_next_poll_rejoins(mock_cluster):
    rec = Recorder()
    with consumer(mock_cluster, new_group(), max_poll_interval_ms=1500) as c:
        c.subscribe(["t"], listener=rec)
        converge([c], timeout=20)
        gen = c.generation()
        time.sleep(2.2)  # no poll for longer than max.poll.interval.ms
        assert c.generation() == -1 and c.member_id() == ""
        [view] = converge([c], timeout=20)
        assert view == ALL and c.generation() > gen
        kinds = [k for k, _ in rec.calls]
        assert kinds == ["assigned", "lost", "assigned"]


def test_static_member_closes_without_leaving(mock_cluster):
    group = new_group()
    a = consumer(mock_cluster, group, group_instance_id="static-a")
    b = consumer(mock_cluster, group)
    try:
        a.subscribe(["t"])
        converge([a], timeout=20)
        b.subscribe(["t"])
        converge([a, b], timeout=40)
        gen = b.generation()
        closed_at = time.monotonic()
        a.close()
        # No LeaveGroup: the group rebalances only once the static member's session has expired.
        while b.generation() == gen and time.monotonic() - closed_at < 20:
            b.poll(0.05)
        assert time.monotonic() - closed_at >= SESSION_MS / 1000 - 0.2
        [view] = converge([b], timeout=30)
        assert view == ALL
    finally:
        a.close()
        b.close()


def test_public_api_from_many_threads_during_rebalances_never_hangs(mock_cluster):
    """Hammer poll/commit/assignment/committed/seek from several threads while members come and go."""
    group = new_group("hammer")
    cs = [
        consumer(mock_cluster, group, enable_auto_commit=True, auto_commit_interval_ms=200) for _ in range(2)
    ]
    for c in cs:
        c.subscribe(["t"])
    allowed = (CommitFailedError, RebalanceInProgressError, IllegalStateError)
    bound = 20.0  # every call returns well within this
    failures, slow, counts = [], [], {"calls": 0}
    stop = threading.Event()
    lock = threading.Lock()

    def worker(c, seed):
        rnd = random.Random(seed)
        while not stop.is_set():
            op = rnd.choice(
                [
                    "poll",
                    "poll",
                    "commit",
                    "commit_async",
                    "assignment",
                    "committed",
                    "seek",
                    "position",
                    "state",
                ]
            )
            t0 = time.monotonic()
            try:
                if op == "poll":
                    c.poll(rnd.choice([0, 0.05, 0.2]))
                elif op == "commit":
                    view = c.assignment()
                    if view:
                        c.commit({tp: rnd.randrange(1000) for tp in view}, timeout_s=10)
                elif op == "commit_async":
                    c.commit({TopicPartition("t", rnd.randrange(PARTITIONS)): 1}, sync=False)
                elif op == "assignment":
                    c.assignment()
                elif op == "committed":
                    c.committed([TopicPartition("t", rnd.randrange(PARTITIONS))], timeout_s=10)
                elif op == "seek":
                    view = sorted(c.assignment())
                    if view:
                        c.seek(rnd.choice(view), rnd.randrange(1000))
                elif op == "position":
                    c.position(TopicPartition("t", 0))
                else:
                    c.generation(), c.member_id(), c.group_state()
            except allowed:
                pass
            except Exception as exc:  # noqa: BLE001 - recorded and asserted below
                with lock:
                    failures.append((op, repr(exc)))
            elapsed = time.monotonic() - t0
            with lock:
                counts["calls"] += 1
                if elapsed > bound:
                    slow.append((op, elapsed))

    threads = [
        threading.Thread(target=worker, args=(c, 10 * i + j), daemon=True)
        for i, c in enumerate(cs)
        for j in range(3)
    ]
    for t in threads:
        t.start()
    survivors_converged = False
    try:
        # Rebalances: a third member joins and leaves, twice.
        for _ in range(2):
            extra = consumer(mock_cluster, group)
            extra.subscribe(["t"])
            end = time.monotonic() + 2.5
            while time.monotonic() < end:
                extra.poll(0.2)
            extra.close(timeout_s=5)
            time.sleep(1.5)
        converge(cs, timeout=30)  # polled concurrently by the workers too
        survivors_converged = True
    finally:
        stop.set()
        for t in threads:
            t.join(bound + 5)
        hung = [t for t in threads if t.is_alive()]
        for c in cs:
            t0 = time.monotonic()
            c.close(timeout_s=5)
            assert time.monotonic() - t0 < 10
    assert not hung, "a thread is stuck in a consumer call"
    assert failures == [] and slow == []
    assert counts["calls"] > 100 and survivors_converged


def test_commit_and_committed_without_subscription(mock_cluster):
    """A standalone commit (generation -1) into a group with no members, as Spark jobs do."""
    with consumer(mock_cluster, new_group("standalone")) as c:
        tp = TopicPartition("t", 4)
        c.commit({tp: 12})
        assert c.committed([tp])[tp].offset == 12
        with pytest.raises(KafkaTimeoutError):
            c.committed([tp], timeout_s=0)
