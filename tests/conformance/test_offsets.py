"""Offset commits and committed() round-trip through herd for each unmodified client.

Each client commits twice: as a subscribed group member (OffsetCommit with its generation and
member id) and as a standalone assign()-mode consumer (generation -1 into an Empty group, the way
Spark jobs commit). The offsets written by one client are then read back by the other two.
"""
from __future__ import annotations

import asyncio
import time

import pytest

from tests.conformance.harness import HEARTBEAT_MS, SESSION_MS, create_topic, wait_until

pytestmark = pytest.mark.conformance

TOPIC_PARTITIONS = 3
ASSIGN_TIMEOUT = 30.0
T = 10000  # ms, kafka-python call timeouts


def kafka_python_poll_until_assigned(consumer, n, timeout=ASSIGN_TIMEOUT):
    """poll() until `n` partitions are assigned, with no pause between polls.

    kafka-python 3.0.12 quirk: when the leader's first JoinGroup completes before the metadata of
    its subscribed topic arrives, it assigns nothing and rejoins because its metadata snapshot
    changed. That rejoin is not recorded in `rejoin_needed`, so if the JoinGroup/SyncGroup task
    finishes while no poll() is waiting on it, need_rejoin() is already False at the next poll and
    join_group_async never runs its completion: the member stays un-STABLE with heartbeats
    disabled and no partitions until herd expires its session. Polling without gaps closes the
    window. (herd's initial rebalance delay of 0 in tests makes the first join beat the metadata.)
    """
    deadline = time.monotonic() + timeout
    while len(consumer.assignment()) != n:
        assert time.monotonic() < deadline, f"kafka-python got {consumer.assignment()} after {timeout}s"
        consumer.poll(timeout_ms=500)


def kafka_python_roundtrip(bootstrap, group, topic):
    from kafka import KafkaConsumer, TopicPartition
    from kafka.structs import OffsetAndMetadata

    tp = [TopicPartition(topic, p) for p in range(TOPIC_PARTITIONS)]
    common = dict(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                  session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS)
    c = KafkaConsumer(topic, **common)
    try:
        # Poll back to back, never sleeping between polls: kafka-python 3.0.12 strands a leader
        # whose metadata-triggered rejoin completes while no poll() is running (see
        # kafka_python_poll_until_assigned).
        kafka_python_poll_until_assigned(c, 3)
        assert c.committed(tp[0], timeout_ms=T) is None
        c.commit({tp[0]: OffsetAndMetadata(5, "kp-meta", -1), tp[1]: OffsetAndMetadata(7, "", -1)},
                 timeout_ms=T)
        assert c.committed(tp[0], timeout_ms=T) == 5
        assert c.committed(tp[0], metadata=True, timeout_ms=T).metadata == "kp-meta"
        assert c.committed(tp[1], timeout_ms=T) == 7
        assert c.committed(tp[2], timeout_ms=T) is None
    finally:
        c.close()

    standalone = KafkaConsumer(**common)
    try:
        standalone.assign(tp)
        assert standalone.committed(tp[0], timeout_ms=T) == 5
        standalone.commit({tp[2]: OffsetAndMetadata(11, "standalone", -1)}, timeout_ms=T)
        assert standalone.committed(tp[2], metadata=True, timeout_ms=T) == OffsetAndMetadata(
            11, "standalone", -1)
        assert standalone.committed(tp[1], timeout_ms=T) == 7
    finally:
        standalone.close()


def aiokafka_roundtrip(bootstrap, group, topic):
    from aiokafka import AIOKafkaConsumer, TopicPartition
    from aiokafka.structs import OffsetAndMetadata

    tp = [TopicPartition(topic, p) for p in range(TOPIC_PARTITIONS)]
    common = dict(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False,
                  session_timeout_ms=SESSION_MS, heartbeat_interval_ms=HEARTBEAT_MS)

    async def main():
        c = AIOKafkaConsumer(topic, **common)
        await c.start()
        try:
            deadline = time.monotonic() + ASSIGN_TIMEOUT
            while len(c.assignment()) != 3:
                assert time.monotonic() < deadline, "aiokafka was not assigned all partitions"
                await c.getmany(timeout_ms=100)
            assert await c.committed(tp[0]) is None
            await c.commit({tp[0]: OffsetAndMetadata(5, "aio-meta"), tp[1]: OffsetAndMetadata(7, "")})
            assert await c.committed(tp[0]) == 5
            assert await c.committed(tp[1]) == 7
            assert await c.committed(tp[2]) is None
        finally:
            await c.stop()

        standalone = AIOKafkaConsumer(**common)
        await standalone.start()
        try:
            standalone.assign(tp)
            assert await standalone.committed(tp[0]) == 5
            await standalone.commit({tp[2]: OffsetAndMetadata(11, "standalone")})
            assert await standalone.committed(tp[2]) == 11
            assert await standalone.committed(tp[1]) == 7
        finally:
            await standalone.stop()

    asyncio.run(asyncio.wait_for(main(), 60))


def confluent_roundtrip(bootstrap, group, topic):
    from confluent_kafka import Consumer, TopicPartition

    common = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False,
              "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": HEARTBEAT_MS,
              "log_level": 3}

    def committed(c, p):
        (res,) = c.committed([TopicPartition(topic, p)], timeout=10)
        assert res.error is None, res
        return res

    c = Consumer(common)
    try:
        c.subscribe([topic])
        wait_until(lambda: c.poll(0.1) is None and len(c.assignment()) == 3, ASSIGN_TIMEOUT,
                   "confluent to be assigned all partitions")
        assert committed(c, 0).offset < 0  # OFFSET_INVALID: nothing committed yet
        c.commit(offsets=[TopicPartition(topic, 0, 5, metadata="ck-meta"), TopicPartition(topic, 1, 7)],
                 asynchronous=False)
        assert committed(c, 0).offset == 5
        assert committed(c, 0).metadata == "ck-meta"
        assert committed(c, 1).offset == 7
        assert committed(c, 2).offset < 0
    finally:
        c.close()

    standalone = Consumer(common)
    try:
        standalone.assign([TopicPartition(topic, p) for p in range(TOPIC_PARTITIONS)])
        assert committed(standalone, 0).offset == 5
        res = standalone.commit(offsets=[TopicPartition(topic, 2, 11, metadata="standalone")],
                                asynchronous=False)
        assert [r.error for r in res] == [None]
        assert committed(standalone, 2).offset == 11
        assert committed(standalone, 2).metadata == "standalone"
        assert committed(standalone, 1).offset == 7
    finally:
        standalone.close()


ROUNDTRIPS = {"kafka-python": kafka_python_roundtrip, "aiokafka": aiokafka_roundtrip,
              "confluent": confluent_roundtrip}


def read_committed(client, bootstrap, group, topic) -> dict[int, int | None]:
    """Committed offsets of every partition, read by a standalone consumer of `client`."""
    if client == "kafka-python":
        from kafka import KafkaConsumer, TopicPartition

        c = KafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
        try:
            return {p: c.committed(TopicPartition(topic, p), timeout_ms=T) for p in range(TOPIC_PARTITIONS)}
        finally:
            c.close()
    if client == "aiokafka":
        from aiokafka import AIOKafkaConsumer, TopicPartition

        async def main():
            c = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group, enable_auto_commit=False)
            await c.start()
            try:
                return {p: await c.committed(TopicPartition(topic, p)) for p in range(TOPIC_PARTITIONS)}
            finally:
                await c.stop()

        return asyncio.run(asyncio.wait_for(main(), 30))
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "log_level": 3})
    try:
        res = c.committed([TopicPartition(topic, p) for p in range(TOPIC_PARTITIONS)], timeout=10)
        return {r.partition: (r.offset if r.offset >= 0 else None) for r in res}
    finally:
        c.close()


@pytest.mark.parametrize("client", list(ROUNDTRIPS))
def test_commit_and_committed_roundtrip(herd, client):
    topic, group = f"offsets-{client}", f"offsets-{client}"
    create_topic(herd.bootstrap, topic, TOPIC_PARTITIONS)
    ROUNDTRIPS[client](herd.bootstrap, group, topic)
    # What one client committed, every client reads back the same.
    for reader in ROUNDTRIPS:
        assert read_committed(reader, herd.bootstrap, group, topic) == {0: 5, 1: 7, 2: 11}, reader
