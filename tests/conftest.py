"""Session-wide fixtures shared by several test directories."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """One real Apache Kafka broker (KRaft, one node, loopback) for the whole session, started on
    first use (about 7 s) and stopped at the end. Groups and topics in tests using it must have
    names of their own: the broker is shared."""
    from tests.support.kafka_broker import KafkaBroker

    with KafkaBroker(tmp_path_factory.mktemp("kafka")) as broker:
        yield broker
