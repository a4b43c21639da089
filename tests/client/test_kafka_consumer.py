"""KafkaGroupConsumer without a broker: the missing optional dependency, the split of its settings
(the rest runs against a real broker: tests/integration/test_kafka_group_consumer.py)."""
from __future__ import annotations

import sys

import pytest

from client.kafka_consumer import Record, split_config


def test_a_clear_error_without_confluent_kafka(monkeypatch):
    """Simulated missing dependency (import confluent_kafka raises ImportError): the constructor
    names the extra, and importing the client still works."""
    monkeypatch.setitem(sys.modules, "confluent_kafka", None)
    from client import KafkaGroupConsumer

    with pytest.raises(ImportError, match=r"pip install 'herd\[kafka\]'"):
        KafkaGroupConsumer("127.0.0.1:9", "g", "127.0.0.1:9")


def test_settings_are_split_between_herd_the_consumer_and_the_data_cluster(tmp_path):
    props = tmp_path / "client.properties"
    props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-256\n"
                     'sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required '
                     'username="u" password="p";\n')
    group, ours, data = split_config(
        {"session.timeout.ms": 6000, "auto.offset.reset": "smallest", "data.ssl.ca.location": "/ca.pem"},
        {"max_poll_records": "20", "fetch_max_wait_ms": 10, "isolation_level": "read_committed",
         "data_command_config": str(props), "data_sasl_username": "override"})
    assert group == {"session.timeout.ms": 6000, "isolation_level": "read_committed"}
    assert ours == {"auto.offset.reset": "earliest", "max.poll.records": 20}
    assert data["ssl.ca.location"] == "/ca.pem" and data["fetch.max.wait.ms"] == 10
    assert data["isolation.level"] == "read_committed"
    assert data["security.protocol"] == "SASL_PLAINTEXT" and data["sasl.mechanism"] == "SCRAM-SHA-256"
    assert data["sasl.username"] == "override" and data["sasl.password"] == "p"  # explicit data.* wins


@pytest.mark.parametrize("bad", [{"auto.offset.reset": "sometimes"}, {"max.poll.records": 0},
                                 {"max_poll_records": "many"}])
def test_bad_settings_are_one_clear_error(bad):
    with pytest.raises(ValueError, match="auto.offset.reset|max.poll.records"):
        split_config(bad, {})


def test_record_reads_its_fields_from_the_message_and_behaves_like_a_tuple():
    r = Record.of("t", 1, 5, b"k", b"v", 1000, [("h", b"1")])
    assert (r.topic, r.partition, r.offset, r.key, r.value, r.timestamp_ms, r.headers) == \
        ("t", 1, 5, b"k", b"v", 1000, [("h", b"1")])
    topic, partition, offset, *_ = r
    assert (topic, partition, offset, r[3], len(r)) == ("t", 1, 5, b"k", 7)
    assert r == Record.of("t", 1, 5, b"k", b"v", 1000, [("h", b"1")]) != Record.of("t", 1, 6, b"k", b"v")
    assert r._asdict()["value"] == b"v" and "offset=5" in repr(r)
    assert not hasattr(r, "__dict__")
