"""Fixtures of the differential harness: herd and a real Kafka broker, one of each for the session,
configured alike where both have the setting."""
from __future__ import annotations

import pytest

from tests.reference.differential import Run, compare
from tools.daemon import Daemon

# Settings both servers get, so a script sees the same bounds on both.
GROUP_MAX_SIZE = 4
SHARED = {
    # Kafka's name: (value, herd's flag)
    "group.max.size": (GROUP_MAX_SIZE, "--group-max-size"),
    "group.initial.rebalance.delay.ms": (0, "--initial-rebalance-delay-ms"),
    "group.min.session.timeout.ms": (6000, "--min-session-timeout-ms"),
    "group.max.session.timeout.ms": (1800000, "--max-session-timeout-ms"),
    "offset.metadata.max.bytes": (4096, "--offset-metadata-max-bytes"),
}


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory):
    """One real Apache Kafka broker (KRaft, one node, loopback) for the whole session, started on
    first use (about 7 s) and stopped at the end. Names in scripts carry a per-run token: the
    broker is shared."""
    from tools.kafka_broker import KafkaBroker

    overrides = {k: v for k, (v, _) in SHARED.items() if k != "group.initial.rebalance.delay.ms"}
    with KafkaBroker(tmp_path_factory.mktemp("kafka"), overrides) as broker:
        yield broker


@pytest.fixture(scope="session")
def herd_ref(tmp_path_factory):
    args = [a for k, (v, flag) in SHARED.items() if k != "group.initial.rebalance.delay.ms"
            for a in (flag, v)]
    with Daemon(tmp_path_factory.mktemp("herd-ref") / "data", *args, initial_rebalance_delay_ms=0) as d:
        yield d


@pytest.fixture
def differential(herd_ref, kafka_broker):
    """``differential(script) -> (herd_run, kafka_run, diffs)``"""
    runs = []

    def run(script):
        h = Run(herd_ref.address, "herd")
        k = Run(kafka_broker.address, "kafka")
        runs.extend((h, k))
        script(h)
        script(k)
        return h, k, compare(h, k)

    yield run
    for r in runs:
        r.close()
