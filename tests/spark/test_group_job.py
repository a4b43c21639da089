"""Spark tasks as group members (client.spark.GroupJob), the small version of ``make demo-spark``:
2 tasks share 4 shards (~3,300 records); the Python worker of one task is SIGKILLed after it has
written a chunk's output but before committing it. Spark retries the task, the group recovers, and
every record is processed at least once (the killed chunk twice), with the group Empty at the end
and its committed offsets equal to the shard sizes."""
from __future__ import annotations

import json

import pytest

from client.spark import GroupJob, describe_group, group_offsets, history_dataframe, offsets_dataframe
from tools.daemon import Daemon
from tools.spark_demo import run_demo

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

SMALL = dict(partitions=4, records=800, tasks=2, chunk_size=100, delay_s=0.02, kill=True, kill_after=2,
             session_timeout_ms=3000, timeout_s=100.0)


def metrics_url(daemon) -> str:
    """The HTTP endpoint of a Daemon started with ``--metrics-port 0`` (from its JSON log)."""
    for line in daemon.logs().splitlines():
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if ev.get("event") == "metrics listening":
            return f"http://127.0.0.1:{ev['port']}"
    raise AssertionError("the daemon logged no metrics port")


@pytest.fixture(scope="module")
def herd(tmp_path_factory):
    base = tmp_path_factory.mktemp("herd-spark-job")
    with Daemon(base / "data", "--min-session-timeout-ms", "1000", "--metrics-port", "0",
                initial_rebalance_delay_ms=1000) as d:
        yield d


def _expired(history) -> list[str]:
    """client ids of the members herd expired (session timeout), from the flight recorder: either
    removed while a rebalance waited for them, or the trigger of a rebalance of a stable group."""
    out = []
    for e in history:
        who = {x["member_id"]: x.get("client_id") for x in [*e["awaited"], *e["joined"]]}
        out += [who.get(x["member_id"], x["member_id"]) for x in e["removed"]
                if x["why"] == "session_expired"]
        if e["reason"] == "session_expired" and (e.get("trigger") or {}).get("client_id"):
            out.append(e["trigger"]["client_id"])
    return out


def _common_checks(r, chunk):
    assert r.error is None, r.error
    assert r.check["missing"] == 0, r.check
    assert r.check["wrong"] == 0, r.check
    assert r.check["unique"] == sum(r.ends.values())
    # the killed member's last chunk was processed but not committed: its successor redid it
    assert r.check["duplicates"] >= chunk, r.check
    assert r.killed_pid is not None and r.recovered_after_s is not None
    assert r.final_state == "Empty"
    assert r.committed == r.ends  # committed offsets == shard sizes
    retried = [s for s in r.stats if s["spark_partition"] == 1]
    assert retried and retried[0]["attempt"] >= 1, r.stats  # Spark retried the killed task
    assert sum(s["records"] for s in r.stats) >= sum(r.ends.values()) - r.check["duplicates"]


def test_killed_dynamic_member_rebalances_and_no_record_is_missing(spark, herd, tmp_path):
    r = run_demo(spark, herd.bootstrap, tmp_path, group="job-dynamic", topic="shards-dyn", **SMALL,
                 metrics_url=metrics_url(herd))
    _common_checks(r, SMALL["chunk_size"])
    # The dead member stayed in the group until its session expired; then the group rebalanced.
    assert _expired(r.history) == ["herd-spark-p1-a0"], r.history
    # herd's view loads into Spark DataFrames
    df = offsets_dataframe(spark, herd.bootstrap, "job-dynamic", r.ends)
    assert {(row.partition, row.committed, row.lag) for row in df.collect()} == {
        (tp.partition, n, 0) for tp, n in r.ends.items()}
    # without end offsets (a streaming job has none): every committed partition, lag unknown
    df = offsets_dataframe(spark, herd.bootstrap, "job-dynamic")
    assert {(row.topic, row.partition, row.committed, row.lag) for row in df.collect()} == {
        (tp.topic, tp.partition, n, None) for tp, n in r.ends.items()}
    assert offsets_dataframe(spark, herd.bootstrap, "no-such-group").count() == 0
    hist = history_dataframe(spark, metrics_url(herd), "job-dynamic").collect()
    assert [row.reason for row in hist][0] == "initial"
    assert any(row.reason == "session_expired" or "session_expired" in (row.removed or "") for row in hist)


def test_killed_static_member_is_taken_over_by_the_retry(spark, herd, tmp_path):
    r = run_demo(spark, herd.bootstrap, tmp_path, group="job-static", topic="shards-static", static=True,
                 **{**SMALL, "session_timeout_ms": 30000}, metrics_url=metrics_url(herd))
    _common_checks(r, SMALL["chunk_size"])
    # The retry took over the same group.instance.id at once: nobody was expired (the session
    # timeout is 30 s, longer than the whole job) and the instance ids were removed at the end.
    assert _expired(r.history) == [], r.history
    assert r.recovered_after_s < 30
    ids = {s["instance_id"] for s in r.stats}
    assert ids == {"job-static-spark-0", "job-static-spark-1"}
    assert all(s["left"] for s in r.stats)


def test_wait_for_offsets_and_describe_without_spark(herd, tmp_path):
    """The driver-side helpers on a job run by plain threads (no Spark): wait() returns once the
    work is committed, and times out naming what is missing."""
    import threading

    from client import TopicPartition
    from client.spark import ensure_topic, run_member

    ensure_topic(herd.bootstrap, "plain", 3)
    ends = {TopicPartition("plain", 0): 30, TopicPartition("plain", 1): 45, TopicPartition("plain", 2): 0}
    job = GroupJob(herd.bootstrap, "plain-job", ends, chunk_size=10, task_timeout_s=60,
                   config={"session.timeout.ms": 3000, "heartbeat.interval.ms": 500})
    with pytest.raises(TimeoutError, match="plain-0 at None of 30"):
        job.wait(timeout_s=0.5)
    seen = []
    out = []
    threads = [threading.Thread(target=lambda i=i: out.append(run_member(
        job, lambda tp, a, b: seen.append((tp, a, b)), i))) for i in range(2)]
    for t in threads:
        t.start()
    assert job.wait(timeout_s=60) == {**ends, TopicPartition("plain", 2): None}  # an empty shard
    for t in threads:
        t.join(30)
    assert sorted(x for tp, a, b in seen for x in range(a, b) if tp.partition == 0) == list(range(30))
    assert len(out) == 2 and all(s["left"] for s in out)
    assert describe_group(herd.bootstrap, "plain-job")["state"] == "Empty"
    assert group_offsets(herd.bootstrap, "plain-job", "plain") == {tp: n for tp, n in ends.items() if n}


def test_a_failed_task_closes_its_member_and_a_static_retry_takes_over(herd):
    """No Spark needed: ``run_member`` closes the member in ``finally``. A dynamic member leaves at
    once (the group does not wait 30 s for its session); a static one stays, and the retry of the
    same Spark partition takes over its partitions without a rebalance."""
    from client import TopicPartition
    from client.spark import _LIVE, ensure_topic, run_member

    ensure_topic(herd.bootstrap, "fail", 2)
    ends = {TopicPartition("fail", 0): 20, TopicPartition("fail", 1): 20}
    cfg = {"session.timeout.ms": 30000, "heartbeat.interval.ms": 1000}

    def boom(tp, start, end):
        raise RuntimeError("task failed")

    dynamic = GroupJob(herd.bootstrap, "fail-dynamic", ends, chunk_size=10, config=cfg, task_timeout_s=60)
    with pytest.raises(RuntimeError, match="task failed"):
        run_member(dynamic, boom, 0)
    assert describe_group(herd.bootstrap, "fail-dynamic")["state"] == "Empty"
    assert not list(_LIVE)

    static = GroupJob(herd.bootstrap, "fail-static", ends, chunk_size=10, config=cfg, task_timeout_s=60,
                      static_membership=True)
    with pytest.raises(RuntimeError, match="task failed"):
        run_member(static, boom, 3, attempt=0)
    g = describe_group(herd.bootstrap, "fail-static")
    assert g["state"] == "Stable"
    assert [m["group_instance_id"] for m in g["members"]] == ["fail-static-spark-3"]
    done = []
    stats = run_member(static, lambda tp, a, b: done.append((tp, a, b)), 3, attempt=1)
    assert stats["generations"] == [1]  # the same generation: no rebalance for the takeover
    assert sorted(done) == [(tp, a, a + 10) for tp in sorted(ends) for a in (0, 10)]
    assert stats["left"] and describe_group(herd.bootstrap, "fail-static")["state"] == "Empty"
    assert group_offsets(herd.bootstrap, "fail-static", "fail") == ends


def test_the_demo_check_finds_missing_wrong_and_duplicate_records(tmp_path):
    """The demo exits non-zero when a record is missing: its checker must see one."""
    from tools.spark_demo import DemoResult, make_dataset, verify

    ends = make_dataset(tmp_path / "data", "t", 2, 10)
    out = tmp_path / "out"
    out.mkdir()
    lines = {tp.partition: (tmp_path / "data" / f"shard-{tp.partition:03d}.txt").read_text().splitlines()
             for tp in ends}
    import zlib

    def row(p, o):
        return f"{p} {o} {zlib.crc32(lines[p][o].encode()):08x}\n"

    (out / "p000-pid1.out").write_text("".join(row(0, o) for o in range(ends[("t", 0)])) + "0 3")
    (out / "p001-pid1.out").write_text("".join(row(1, o) for o in range(5)))
    (out / "p001-pid2.out").write_text("".join(row(1, o) for o in range(4, ends[("t", 1)]) if o != 7)
                                       + "1 7 deadbeef\n")
    c = verify(tmp_path / "data", out, ends)
    assert (c["missing"], c["missing_sample"], c["duplicates"], c["wrong"], c["torn_lines"]) == (
        1, [(1, 7)], 1, 1, 1)
    assert not DemoResult(ends=ends, check=c, stats=[]).ok
    c["missing"] = c["wrong"] = 0
    assert DemoResult(ends=ends, check=c, stats=[]).ok
