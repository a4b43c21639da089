"""A member's whole poll loop (Metadata, ListOffsets, Fetch, Heartbeat, ...) runs without herd
rejecting or dropping any of its requests: after a few seconds of polling, herd has logged no
malformed frame or other warning, and the member's connections were never closed under it.

Group membership alone does not show this: the group coordinator connection is separate, so a
member whose Fetch or ListOffsets connection keeps being dropped still joins and gets partitions,
but can never read from them. (librdkafka also re-bootstraps on such drops and marks its
coordinator dead for a moment; a close() in that window sends no LeaveGroup.)"""
from __future__ import annotations

import time

import pytest

from tests.conformance.harness import all_partitions, create_topic, herd_warnings, wait_converged

pytestmark = pytest.mark.conformance


def _summary(rec: dict) -> str:
    detail = rec.get("error") or (rec.get("exception") or "").strip().splitlines()[-1:]
    return f"{rec['event']}: {detail if isinstance(detail, str) else ''.join(detail)}"


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka", "confluent"])
def test_poll_loop_is_clean(herd, members, client):
    topic = f"wire-{client}"
    create_topic(herd.bootstrap, topic, 2)
    m = members.start(client, herd.bootstrap, f"wire-{client}", [topic], f"wire-{client}")
    wait_converged([m], all_partitions(topic, 2), 30)
    time.sleep(3)  # several fetch round trips (fetch.wait.max 100 ms) and heartbeats
    assert m.alive(), m.stderr_tail()
    assert m.stop() == 0, m.stderr_tail()
    warnings = herd_warnings(herd)
    problems = sorted({_summary(w) for w in warnings})  # one entry per distinct problem
    assert problems == [], f"herd logged {len(warnings)} warnings/errors: {problems}"


def test_kafka_python_default_version_negotiation(herd):
    """kafka-python with no api_version pin infers the broker version from herd's ApiVersions;
    it must come out new enough for the group features the other tests rely on (KIP-394 member
    ids, KIP-345 static membership: Kafka 2.3+), so those tests exercise the modern versions."""
    from kafka import KafkaConsumer

    c = KafkaConsumer(bootstrap_servers=herd.bootstrap, group_id="negotiation")
    try:
        assert c.config["api_version"] >= (2, 3), c.config["api_version"]
    finally:
        c.close()
