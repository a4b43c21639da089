"""client.spark's driver and task helpers against a real daemon, without Spark: resuming from a
group's committed partitions whatever herd's topic catalog says, failing fast on missing topics or
a daemon that cannot be reached, and saying why a commit or a lookup failed."""
from __future__ import annotations

import json
import time

import pytest

from client import GroupConsumer, TopicPartition
from client import errors as cerr
from client.spark import (
    BatchProgressCommitter,
    GroupJob,
    ensure_topic,
    group_offsets,
    partitions_for,
    run_member,
    starting_offsets_json,
)
from tools.daemon import Daemon

pytestmark = pytest.mark.integration

REFUSED = "127.0.0.1:1"  # nothing listens on port 1 of the loopback address


@pytest.fixture(scope="module")
def herd(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("spark-helpers") / "data", initial_rebalance_delay_ms=0) as d:
        yield d


def test_resuming_reads_every_committed_partition_even_of_a_topic_herd_lacks(herd):
    # A streaming query committed 4 partitions of "ticks" without creating the topic; later a
    # standard client auto-created it with 1 partition. Resuming must still see all four.
    ticks = {TopicPartition("ticks", p): 10 + p for p in range(4)}
    with BatchProgressCommitter(herd.bootstrap, "resume-q") as committer:
        assert committer.commit(ticks, 0) == ticks
    assert group_offsets(herd.bootstrap, "resume-q", "ticks") == ticks
    assert json.loads(starting_offsets_json(herd.bootstrap, "resume-q", "ticks")) == {
        "ticks": {"0": 10, "1": 11, "2": 12, "3": 13}}
    ensure_topic(herd.bootstrap, "ticks", 1)
    assert group_offsets(herd.bootstrap, "resume-q", "ticks") == ticks
    assert json.loads(starting_offsets_json(herd.bootstrap, "resume-q", ["ticks"], default="latest")) == {
        "ticks": {"0": 10, "1": 11, "2": 12, "3": 13}}
    # partitions the catalog has but the group never committed get the default
    ensure_topic(herd.bootstrap, "wide", 3)
    assert json.loads(starting_offsets_json(herd.bootstrap, "resume-q", ["wide", "none"])) == {
        "wide": {"0": -2, "1": -2, "2": -2}, "none": {}}


def _job(herd_bootstrap, topic, parts, **kw):
    return GroupJob(herd_bootstrap, f"job-{topic}", {TopicPartition(topic, p): 5 for p in parts},
                    task_timeout_s=60, **kw)


def test_a_job_over_missing_partitions_fails_at_once_naming_them(herd):
    ensure_topic(herd.bootstrap, "two", 2)
    for topic, parts, expect in (("absent", [0], "topic 'absent' does not exist"),
                                 ("two", [0, 1, 2, 3], "topic 'two' has 2 partition(s), the work covers "
                                                       "partition(s) 2, 3")):
        job = _job(herd.bootstrap, topic, parts)
        t0 = time.monotonic()
        with pytest.raises(ValueError, match="ensure_topic") as err:
            run_member(job, lambda tp, start, end: None)
        assert expect in str(err.value)
        assert time.monotonic() - t0 < 10  # not task_timeout_s
    # nothing was auto-created by the attempt
    with pytest.raises(cerr.KafkaError, match="UNKNOWN_TOPIC_OR_PARTITION"):
        partitions_for(herd.bootstrap, "absent")
    done = []
    assert run_member(_job(herd.bootstrap, "two", [0, 1]), lambda tp, s, e: done.append((tp, s, e)))["records"] == 10
    assert sorted(done) == [(TopicPartition("two", 0), 0, 5), (TopicPartition("two", 1), 0, 5)]


def test_a_task_against_an_unreachable_daemon_fails_saying_so(monkeypatch):
    # The driver's check (what GroupJob.run does before it starts any task) fails at once. A task
    # retries for connect_retry_s (herd may be restarting as tasks start), then fails saying so.
    t0 = time.monotonic()
    with pytest.raises(cerr.KafkaConnectionError, match="cannot reach any bootstrap server"):
        _job(REFUSED, "t", [0]).check_topics()
    assert time.monotonic() - t0 < 10
    import client.spark as spark_mod

    clock = _ManualTime()
    monkeypatch.setattr(spark_mod, "time", clock)
    t0 = clock.now
    with pytest.raises(cerr.KafkaConnectionError, match="cannot reach any bootstrap server .* for 30"):
        run_member(_job(REFUSED, "t", [0], connect_retry_s=30), lambda tp, start, end: None)
    assert 25 <= clock.now - t0 <= 31


def test_a_task_started_while_herd_restarts_waits_for_it(tmp_path, monkeypatch):
    # herd restarting (a deploy, a crash and systemd's restart) just as tasks start, or as Spark
    # retries one: a task used to fail at once, and Spark's retries, as quick, failed the same
    # way, aborting the job over a restart of a few seconds.
    import threading

    import client.spark as spark_mod

    with Daemon(tmp_path / "data") as d:
        ensure_topic(d.bootstrap, "restarting", 1)
        port = d.port
    refused = threading.Event()
    real = spark_mod._bootstrap_broker

    def watched(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        except cerr.KafkaConnectionError:
            refused.set()
            raise

    monkeypatch.setattr(spark_mod, "_bootstrap_broker", watched)
    job = GroupJob(f"127.0.0.1:{port}", "restarting-job", {TopicPartition("restarting", 0): 10}, chunk_size=5,
                   task_timeout_s=60, config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
    out, done = [], []
    t = threading.Thread(target=lambda: out.append(run_member(job, lambda tp, a, b: done.append((a, b)))))
    t.start()  # herd is down: the task starts and is refused, then herd comes back
    try:
        assert refused.wait(30)
        with Daemon(tmp_path / "data", "--port", str(port)) as d:  # the same data dir and port
            t.join(60)
            assert out and out[0]["records"] == 10 and done == [(0, 5), (5, 10)]
            assert group_offsets(d.bootstrap, "restarting-job", "restarting") == {
                TopicPartition("restarting", 0): 10}
    finally:
        t.join(10)


def test_a_lookup_that_times_out_says_no_coordinator_was_reached():
    with GroupConsumer(f"PLAINTEXT://{REFUSED}", "g", {"enable.auto.commit": False}) as c:
        with pytest.raises(cerr.KafkaTimeoutError) as err:
            c.committed([TopicPartition("t", 0)], timeout_s=1.0)
    text = str(err.value)
    assert "no coordinator reached" in text and REFUSED in text and "ECONNREFUSED" in text


def test_the_committer_says_a_group_with_members_is_not_the_querys_own(herd):
    ensure_topic(herd.bootstrap, "busy", 1)
    with GroupConsumer(herd.bootstrap, "busy-group", {"enable.auto.commit": False}) as member:
        member.subscribe(["busy"])
        deadline = time.monotonic() + 30
        while not member.poll(0.2):
            assert time.monotonic() < deadline, "the member got no assignment"
        with BatchProgressCommitter(herd.bootstrap, "busy-group") as committer:
            with pytest.raises(cerr.CommitFailedError, match="busy-group has active members"):
                committer.commit({TopicPartition("busy", 0): 3}, 1)


def test_a_job_over_some_partitions_of_a_topic_shares_them_between_its_members(tmp_path):
    # Work on partitions 0 and 1 of a 4-partition topic. Under the range assignor the first member
    # got 0 and 1 (all the work) and the second 2 and 3 (none of it); the job's assignor deals out
    # only the job's partitions.

    with Daemon(tmp_path / "data", initial_rebalance_delay_ms=1500) as d:  # both join generation 1
        ensure_topic(d.bootstrap, "wide4", 4)
        job = GroupJob(d.bootstrap, "subset-job", {TopicPartition("wide4", p): 20 for p in (0, 1)},
                       chunk_size=5, task_timeout_s=60,
                       config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
        out = _two_members(job)
        assert sorted(out) == [0, 1]
        assert sorted(tuple(s["partitions"]) for s in out.values()) == [("wide4-0",), ("wide4-1",)]
        assert group_offsets(d.bootstrap, "subset-job", "wide4") == {
            TopicPartition("wide4", 0): 20, TopicPartition("wide4", 1): 20}


class _ManualTime:
    """Stands in for the ``time`` module of client.spark: ``monotonic()`` is a manual clock that the
    test moves; ``sleep`` moves it instead of sleeping."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_a_task_making_progress_is_not_stopped_by_task_timeout(herd, monkeypatch):
    # task_timeout_s bounds a task that makes no progress. A job that simply takes longer than it
    # (each chunk 4 s here, 5 chunks, timeout 10 s) used to fail every task with TimeoutError
    # "work not finished after 10s", though it was committing a chunk every 4 s.
    import client.spark as spark_mod

    clock = _ManualTime()
    monkeypatch.setattr(spark_mod, "time", clock)
    ensure_topic(herd.bootstrap, "long", 1)
    tp = TopicPartition("long", 0)
    job = GroupJob(herd.bootstrap, "long-job", {tp: 50}, chunk_size=10, task_timeout_s=10)
    done = []

    def process(tp, start, end):
        clock.advance(4.0)
        done.append((start, end))

    stats = run_member(job, process)
    assert done == [(0, 10), (10, 20), (20, 30), (30, 40), (40, 50)]
    assert stats["records"] == 50 and group_offsets(herd.bootstrap, "long-job", [tp]) == {tp: 50}


def test_a_task_waiting_for_work_that_makes_no_progress_times_out(herd, monkeypatch):
    # The work of partition 1 is held by a member that never commits (a plain consumer of the
    # group, so the group uses range): the job's member finishes partition 0, then gives up after
    # task_timeout_s without progress, saying so.
    import threading

    import client.spark as spark_mod

    clock = _ManualTime()
    monkeypatch.setattr(spark_mod, "time", clock)

    class IdleTicks(GroupConsumer):  # each idle wait of the job's member moves the clock 5 s
        def poll(self, timeout_s=None):
            if timeout_s:
                clock.advance(5.0)
            return super().poll(timeout_s)

    monkeypatch.setattr(spark_mod, "GroupConsumer", IdleTicks)
    ensure_topic(herd.bootstrap, "held", 2)
    ends = {TopicPartition("held", 0): 20, TopicPartition("held", 1): 20}
    stop = threading.Event()
    holder = GroupConsumer(herd.bootstrap, "held-job", {"enable.auto.commit": False, "client.id": "zz-holder",
                                                         "partition.assignment.strategy": ["range"],
                                                         "session.timeout.ms": 10000})
    holder.subscribe(["held"])

    def keep_polling():
        while not stop.is_set():
            holder.poll(0.2)

    t = threading.Thread(target=keep_polling)
    t.start()
    try:
        deadline = time.monotonic() + 30
        while not holder.assignment():
            assert time.monotonic() < deadline, "the holder got no assignment"
            time.sleep(0.05)
        job = GroupJob(herd.bootstrap, "held-job", ends, chunk_size=10, task_timeout_s=30,
                       poll_timeout_s=0.1, config={"session.timeout.ms": 10000})
        done = []
        with pytest.raises(TimeoutError, match="no progress for 30"):
            run_member(job, lambda tp, s, e: done.append((tp.partition, s, e)))
        assert done == [(0, 0, 10), (0, 10, 20)]  # its own partition was done first
    finally:
        stop.set()
        t.join(10)
        holder.close(5)


def test_a_resumed_job_is_shared_by_the_records_left_not_by_the_partition_sizes(tmp_path):
    # A job resumed after a failure (or the next run of an incremental job): partition 0 is done,
    # 1-3 are not. The assignor balanced the partitions' sizes: one member got partition 0 (1000
    # records, all committed) and the other all of the work left, 300 records, alone.

    with Daemon(tmp_path / "data", initial_rebalance_delay_ms=1500) as d:  # both join generation 1
        ensure_topic(d.bootstrap, "resumed", 4)
        ends = {TopicPartition("resumed", 0): 1000, **{TopicPartition("resumed", p): 100 for p in (1, 2, 3)}}
        with BatchProgressCommitter(d.bootstrap, "resumed-job") as first_run:
            first_run.commit({TopicPartition("resumed", 0): 1000})
        job = GroupJob(d.bootstrap, "resumed-job", ends, chunk_size=50, task_timeout_s=60,
                       config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500})
        out = _two_members(job)
        assert sorted(out) == [0, 1]
        assert all(s["generations"] == [1] for s in out.values()), out  # one assignment, no rebalance
        assert sorted(s["records"] for s in out.values()) == [100, 200], out
        assert group_offsets(d.bootstrap, "resumed-job", "resumed") == ends


def _two_members(job) -> dict:
    """Run two members of ``job`` at once (each waits for the other to start): -> {index: summary}."""
    import threading

    started = threading.Barrier(2, timeout=20)
    out = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, run_member(
        job, lambda tp, a, b: None, i, on_start=lambda info: started.wait()))) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return out


def test_a_member_rides_through_herd_restarting_while_it_joins(tmp_path, caplog, monkeypatch):
    # A member whose group is not stable when herd goes away gets NoBrokersAvailableError from
    # poll once broker.unreachable.timeout.ms passes (what a new user pointed at a wrong port
    # needs to see); a Spark task must not fail on it while herd restarts: it keeps trying, bounded
    # by its own task_timeout_s.
    import logging
    import threading

    caplog.set_level(logging.INFO, logger="herd.client.spark")
    real_committed = GroupConsumer.committed
    # the task's lookups wait up to 30 s for herd; 1 s here, so that its polls come sooner
    monkeypatch.setattr(GroupConsumer, "committed",
                        lambda self, parts, timeout_s=None: real_committed(self, parts, timeout_s=1.0))
    with Daemon(tmp_path / "data", initial_rebalance_delay_ms=3000) as d:  # the first join waits 3 s
        ensure_topic(d.bootstrap, "bouncing", 1)
        port = d.port
        job = GroupJob(d.bootstrap, "bouncing-job", {TopicPartition("bouncing", 0): 10}, chunk_size=5,
                       task_timeout_s=30, config={"session.timeout.ms": 6000, "heartbeat.interval.ms": 500,
                                                  "broker.unreachable.timeout.ms": 300,
                                                  "reconnect.backoff.max.ms": 100})
        joining = threading.Event()
        out, done = [], []
        t = threading.Thread(target=lambda: out.append(
            run_member(job, lambda tp, a, b: done.append((a, b)), on_start=lambda info: joining.set())))
        t.start()
        assert joining.wait(30)
        time.sleep(0.5)  # its JoinGroup waits in herd's initial rebalance delay
    try:  # herd is down: the member is refused, and its polls raise NoBrokersAvailableError
        deadline = time.monotonic() + 20
        while not any("no group coordinator reached" in r.getMessage() for r in caplog.records) and \
                time.monotonic() < deadline:
            time.sleep(0.1)
        assert any("no group coordinator reached" in r.getMessage() for r in caplog.records)
        assert t.is_alive()
        with Daemon(tmp_path / "data", "--port", str(port)) as d:  # back, on the same port and data
            t.join(60)
            assert out and out[0]["records"] == 10 and done == [(0, 5), (5, 10)]
            assert group_offsets(d.bootstrap, "bouncing-job", "bouncing") == {TopicPartition("bouncing", 0): 10}
    finally:
        t.join(10)
