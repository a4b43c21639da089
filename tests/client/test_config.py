"""Configuration: Kafka names and Pythonic keywords."""

from __future__ import annotations

import pytest

from client.config import parse_bootstrap, parse_config


def test_kafka_names_and_keywords_are_equivalent():
    a = parse_config("h:1", "g", {"session.timeout.ms": 6000, "enable.auto.commit": "false"})
    b = parse_config("h:1", "g", session_timeout_ms=6000, enable_auto_commit=False)
    assert a == b and a.session_timeout_ms == 6000 and a.enable_auto_commit is False


def test_group_id_from_config_and_defaults():
    c = parse_config(None, None, {"bootstrap.servers": "a:1,b:2", "group.id": "gg"})
    assert c.group_id == "gg" and c.bootstrap_servers == [("a", 1), ("b", 2)]
    assert c.partition_assignment_strategy == ["range", "cooperative-sticky"]
    assert c.max_poll_interval_ms == 300000 and c.heartbeat_interval_ms == 3000


def test_strategy_as_string_list_or_instance():
    assert parse_config(
        "h:1", "g", partition_assignment_strategy="sticky, range"
    ).partition_assignment_strategy == ["sticky", "range"]


@pytest.mark.parametrize(
    "kw",
    [
        {"sesion_timeout_ms": 1},
        {"session_timeout_ms": "x"},
        {"heartbeat_interval_ms": 10000, "session_timeout_ms": 10000},
        {"isolation_level": "dirty"},
    ],
)
def test_bad_config_is_rejected(kw):
    with pytest.raises(ValueError):
        parse_config("h:1", "g", **kw)


def test_group_id_required():
    with pytest.raises(ValueError):
        parse_config("h:1", None)


def test_bootstrap_forms():
    assert parse_bootstrap(["a:1", ("b", 2), "c"]) == [("a", 1), ("b", 2), ("c", 9092)]
    assert parse_bootstrap("[::1]:9093") == [("::1", 9093)]
    with pytest.raises(ValueError):
        parse_bootstrap("")


def test_api_version_caps_by_name_or_key():
    c = parse_config("h:1", "g", api_versions_max={"JoinGroup": 5, 14: 3})
    assert c.api_versions_max == {11: 5, 14: 3}
    with pytest.raises(ValueError):
        parse_config("h:1", "g", api_versions_max={"Nope": 1})


def test_bootstrap_listener_urls_and_bad_ports():
    # copied from server.properties or a Spark kafka.bootstrap.servers setting
    assert parse_bootstrap("PLAINTEXT://h1:9092, plaintext://[::1]:9093") == [("h1", 9092), ("::1", 9093)]
    # a listener URL's protocol must be security.protocol's
    assert parse_bootstrap("SSL://h:9093", "SSL") == [("h", 9093)]
    assert parse_bootstrap("sasl_ssl://h:9093,SASL_SSL://g:1", "SASL_SSL") == [("h", 9093), ("g", 1)]
    with pytest.raises(ValueError, match="names SSL but security.protocol is PLAINTEXT: set security.protocol=SSL"):
        parse_bootstrap("SSL://h:9093")
    with pytest.raises(ValueError, match="names SASL_PLAINTEXT but security.protocol is SASL_SSL"):
        parse_bootstrap("SASL_SSL://h:1,SASL_PLAINTEXT://g:2", "SASL_SSL")
    with pytest.raises(ValueError, match="unknown security protocol 'HTTP'"):
        parse_bootstrap("HTTP://h:1")
    for bad in ("h:9092x", "h:0", "h:70000", "h:"):
        with pytest.raises(ValueError, match=r"bootstrap server .*the port must be a number from 1 to 65535"):
            parse_bootstrap(bad)


def test_a_short_session_timeout_names_the_default_heartbeat_and_what_to_set():
    # The user set only session.timeout.ms: the message must name the setting they did not set,
    # its default, and a value that works (it used to say only "heartbeat.interval.ms must be
    # lower than session.timeout.ms").
    with pytest.raises(ValueError) as err:
        parse_config("h:1", "g", session_timeout_ms=1000)
    msg = str(err.value)
    assert "session.timeout.ms=1000" in msg and "not set" in msg and "default is 3000" in msg
    assert "heartbeat_interval_ms=333" in msg
    assert "group.min.session.timeout.ms (6000 by default" in msg  # herd would refuse 1000 anyway
    parse_config("h:1", "g", session_timeout_ms=1000, heartbeat_interval_ms=333)  # the advice works
    with pytest.raises(ValueError) as err:
        parse_config("h:1", "g", {"session.timeout.ms": 7000, "heartbeat.interval.ms": 8000})
    assert str(err.value) == ("heartbeat.interval.ms=8000 must be lower than session.timeout.ms=7000: set it to "
                              "about a third of the session timeout or less, e.g. heartbeat_interval_ms=2333")
