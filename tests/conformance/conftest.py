"""Fixtures for the conformance tests: a real herd daemon and child-process group members."""
from __future__ import annotations

import pytest

from tests.conformance.harness import Members
from tools.daemon import Daemon

# Kafka's group.initial.rebalance.delay.ms (3000 by default), shortened. Not 0: kafka-python 3.0.12
# strands a leader whose first JoinGroup is answered before the metadata of its topic arrives (it
# assigns nothing, rejoins for the changed metadata, and if that join completes between two poll()
# calls it never runs the completion: no partitions, heartbeats off, expired, stuck at the old
# generation; seen once in CI as "kafka-python-3: [] gen=2" beside a 4-member gen 3). The delay
# holds the first generation's answer until the metadata is in, as on a default Kafka broker.
INITIAL_REBALANCE_DELAY_MS = 1000


@pytest.fixture
def herd(tmp_path):
    with Daemon(tmp_path / "data", initial_rebalance_delay_ms=INITIAL_REBALANCE_DELAY_MS) as d:
        yield d


@pytest.fixture
def members(tmp_path):
    ms = Members(tmp_path)
    try:
        yield ms
    finally:
        ms.cleanup()
