"""Structured Streaming progress as a herd group's offsets (client.spark.BatchProgressCommitter):
after a query has processed N micro-batches, unmodified admin clients (kafka-python,
confluent-kafka) read the group's committed offsets from herd; a query restarted without its
checkpoint resumes right after them."""
from __future__ import annotations

import json
import os
import time

import pytest

from client import TopicPartition
from client.spark import (
    BatchProgressCommitter,
    describe_group,
    ensure_topic,
    group_offsets,
    skip_committed,
    starting_offsets_json,
    with_source_position,
)
from tools.daemon import Daemon

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.slow]

TOPIC, PARTITIONS, GROUP, ROWS = "ticks", 3, "spark-ticks", 30


@pytest.fixture(scope="module")
def herd(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("herd-spark-stream") / "data") as d:
        yield d


def _write_files(src, first: int, count: int) -> None:
    """``count`` JSON files of ROWS rows each; file i holds values i*ROWS .. (i+1)*ROWS-1. The file
    source takes files in modification-time order: give them distinct, increasing times."""
    base = time.time() - 1000
    for i in range(first, first + count):
        lines = "".join(json.dumps({"value": i * ROWS + j}) + "\n" for j in range(ROWS))
        path = src / f"f{i:04d}.json"
        path.write_text(lines)
        os.utime(path, (base + i, base + i))


def _query(spark, src, committer, checkpoint, committed=None, files_per_batch=1):
    df = (spark.readStream.schema("value LONG").option("maxFilesPerTrigger", files_per_batch)
          .json(str(src)))
    df = with_source_position(df, TOPIC, PARTITIONS)  # value v -> partition v % 3, offset v // 3
    if committed is not None:
        df = skip_committed(df, committed)
    q = (df.writeStream.foreachBatch(committer).option("checkpointLocation", str(checkpoint))
         .trigger(availableNow=True).start())
    q.awaitTermination(120)
    assert not q.isActive, "the query did not finish within 120 s"
    assert q.exception() is None, q.exception()
    return q


def test_batches_are_committed_and_a_restarted_query_resumes_after_them(spark, herd, tmp_path):
    ensure_topic(herd.bootstrap, TOPIC, PARTITIONS)
    src = tmp_path / "src"
    src.mkdir()
    _write_files(src, 0, 3)
    seen: dict = {}

    def sink(df, batch_id):
        seen[batch_id] = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())

    with BatchProgressCommitter(herd.bootstrap, GROUP, process=sink) as committer:
        _query(spark, src, committer, tmp_path / "ck1")
    assert committer.batches == [0, 1, 2] and [len(seen[b]) for b in range(3)] == [ROWS] * 3
    # 90 values over 3 partitions: each partition has offsets 0..29 -> committed 30
    want = {TopicPartition(TOPIC, p): 3 * ROWS // PARTITIONS for p in range(PARTITIONS)}
    assert committer.committed == want

    # Unmodified Kafka tooling sees the group's offsets.
    from kafka.admin import KafkaAdminClient

    admin = KafkaAdminClient(bootstrap_servers=herd.bootstrap, request_timeout_ms=10000)
    try:
        got = admin.list_group_offsets({GROUP: None})[GROUP]
        groups = {g["group_id"]: g for g in admin.list_groups()}
    finally:
        admin.close()
    assert {(tp.topic, tp.partition): om.offset for tp, om in got.items()} == {
        (tp.topic, tp.partition): n for tp, n in want.items()}
    assert {om.metadata for om in got.values()} == {"spark batch 2"}
    assert groups[GROUP]["group_state"] == "Empty"  # a member-less group

    from confluent_kafka import ConsumerGroupTopicPartitions
    from confluent_kafka.admin import AdminClient

    ck = AdminClient({"bootstrap.servers": herd.bootstrap})
    fut = ck.list_consumer_group_offsets([ConsumerGroupTopicPartitions(GROUP)], request_timeout=10)[GROUP]
    res = fut.result(timeout=15)
    assert {(tp.topic, tp.partition): tp.offset for tp in res.topic_partitions} == {
        (tp.topic, tp.partition): n for tp, n in want.items()}

    assert json.loads(starting_offsets_json(herd.bootstrap, GROUP, TOPIC)) == {
        TOPIC: {str(p): 30 for p in range(PARTITIONS)}}
    assert describe_group(herd.bootstrap, GROUP)["members"] == []

    # Restart without the checkpoint (new files arrived meanwhile): the group's offsets say where
    # to resume; the replayed files are skipped and processing continues right after them.
    _write_files(src, 3, 2)
    resumed = group_offsets(herd.bootstrap, GROUP, TOPIC)
    assert resumed == want
    seen.clear()
    with BatchProgressCommitter(herd.bootstrap, GROUP, process=sink) as again:
        _query(spark, src, again, tmp_path / "ck2", committed=resumed, files_per_batch=10)
    rows = [x for b in sorted(seen) for x in seen[b]]
    for p in range(PARTITIONS):
        offs = sorted(o for q, o in rows if q == p)
        assert offs == list(range(30, 50)), (p, offs)  # no gap, nothing processed twice
    final = {TopicPartition(TOPIC, p): 5 * ROWS // PARTITIONS for p in range(PARTITIONS)}
    assert group_offsets(herd.bootstrap, GROUP, TOPIC) == final


def test_offsets_never_move_backwards_unless_allowed(herd):
    tp = TopicPartition("rewind", 0)
    ensure_topic(herd.bootstrap, "rewind", 1)
    with BatchProgressCommitter(herd.bootstrap, "rewind-g") as c:
        assert c.commit({tp: 10}, 0) == {tp: 10}
        assert c.commit({tp: 4}, 1) == {}  # a replayed older batch does not rewind the group
    with BatchProgressCommitter(herd.bootstrap, "rewind-g") as c:  # a new process learns from herd
        assert c.commit({tp: 7}, 2) == {}
        assert group_offsets(herd.bootstrap, "rewind-g", [tp]) == {tp: 10}
    with BatchProgressCommitter(herd.bootstrap, "rewind-g", allow_rewind=True) as c:
        assert c.commit({tp: 3}, 3) == {tp: 3}
    assert group_offsets(herd.bootstrap, "rewind-g", [tp]) == {tp: 3}
