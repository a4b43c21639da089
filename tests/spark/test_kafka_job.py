"""A PySpark job on a real Kafka topic, herd coordinating its tasks (client.spark.KafkaGroupJob): the
small version of ``make demo-spark-kafka``. Skipped where Java 17 is absent (the spark fixture)."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.reference, pytest.mark.integration, pytest.mark.slow]

pytest.importorskip("confluent_kafka", reason="confluent-kafka is a test extra (pip install -e '.[test]')")


def test_tasks_read_the_topic_through_herd_and_a_killed_task_loses_nothing(spark, tmp_path):
    from confluent_kafka.admin import AdminClient, NewTopic

    from tools.kafka_broker import KafkaBroker
    from tools.spark_demo import Herd
    from tools.spark_kafka_demo import run_kafka_demo, summary

    records, partitions = 20_000, 8
    with KafkaBroker(tmp_path / "kafka") as broker:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        admin.create_topics([NewTopic("events", partitions, 1)])["events"].result(60)
        herd_args = ["--initial-rebalance-delay-ms", "1000", "--min-session-timeout-ms", "1000",
                     "--data-bootstrap-server", broker.bootstrap, "--lag-refresh-interval-ms", "1000",
                     "--topic", f"events:{partitions}"]
        with Herd(tmp_path, *herd_args) as herd:
            r = run_kafka_demo(spark, herd.bootstrap, broker.bootstrap, tmp_path, metrics_url=herd.metrics_url,
                               partitions=partitions, records=records, tasks=2, kill_after=5,
                               session_timeout_ms=6000, timeout_s=240, log=print, create_topic=False)
    print("\n".join(summary(r, records)))
    assert r.error is None
    c = r.check
    assert c["missing"] == 0 and c["values_missing"] == 0 and c["wrong"] == 0 and c["beyond_end"] == 0
    assert c["unique"] == records == sum(r.ends.values())
    assert r.killed_pid is not None and r.recovered_after_s is not None
    failures = sum(s["commit_failures"] for s in r.stats)
    # the duplicates are the killed task's written-but-uncommitted batch, plus batches whose commit failed
    assert c["duplicates"] >= r.killed_batch > 0
    assert c["duplicates"] == r.killed_batch or failures > 0
    assert all(r.committed.get(tp) == end for tp, end in r.ends.items())
    assert r.lag == 0  # herd's herd_group_sum_lag for the group, from the data cluster's log ends
