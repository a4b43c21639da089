"""The real Kafka broker the benchmarks measure herd against (``bench.vs_kafka``,
``bench.big_group --target kafka``): Apache Kafka 4.4.0 from the reference fixture
(``tools/kafka_broker.py``), KRaft, one node, topic ``bench`` with 100 partitions."""
from __future__ import annotations

import tempfile
import time

from bench import _util as U


class KafkaTarget:
    def __init__(self, name: str, heap: str, overrides: dict):
        from tools.kafka_broker import KafkaBroker

        self.name = name
        self._tmp = tempfile.TemporaryDirectory(prefix=f"bench-{name}-", dir=U.default_tmp_root())
        base = {"offsets.topic.num.partitions": 50, "group.initial.rebalance.delay.ms": 0,
                "num.network.threads": 3, "num.io.threads": 8}
        base.update(overrides)
        self.broker = KafkaBroker(self._tmp.name, base, heap=heap, start_timeout=180)

    def __enter__(self):
        self.broker.start()
        create_topic(self.bootstrap, "bench", 100)
        return self

    def __exit__(self, *exc):
        self.broker.__exit__(*exc)
        self._tmp.cleanup()

    @property
    def bootstrap(self) -> str:
        return self.broker.bootstrap

    @property
    def pid(self) -> int:
        return self.broker.pid

    def restart(self) -> float:
        return self.broker.restart()


def create_topic(bootstrap: str, name: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 3})
    admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=30)[name].result(timeout=60)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        md = admin.list_topics(name, timeout=10).topics[name]
        if md.error is None and len(md.partitions) == partitions and all(
                p.leader >= 0 for p in md.partitions.values()):
            return
        time.sleep(0.1)
    raise RuntimeError(f"topic {name} not ready on {bootstrap}")
