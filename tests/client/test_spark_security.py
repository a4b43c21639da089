"""client/spark.py: a job's TLS / SASL settings reach every connection its helpers open (executors
included: the job pickles with them), and the password never shows in a repr."""

from __future__ import annotations

import pickle

import pytest

import client.spark as spark
from client import errors as cerr
from client.types import TopicPartition

SASL = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "etl",
        "sasl.password": "never-printed"}


class Refused(Exception):
    pass


@pytest.fixture
def brokers(monkeypatch):
    seen = []

    def fake(host, port, timeout_s, client_id="herd-spark", security=None):
        seen.append((host, port, security))
        raise cerr.AuthenticationFailedError("refused")  # stop there: what matters is what it was given

    monkeypatch.setattr(spark, "_Broker", fake)
    return seen


def test_job_settings_reach_the_helpers_connections(brokers):
    job = spark.GroupJob("SASL_PLAINTEXT://h1:9092,h2:9092", "g", {TopicPartition("t", 0): 10}, config=SASL)
    with pytest.raises(cerr.AuthenticationFailedError):
        job.check_topics()
    # an authentication failure is not worth trying the next bootstrap server for
    assert len(brokers) == 1
    host, port, security = brokers[0]
    assert (host, port) == ("h1", 9092)
    assert security.sasl_credentials() == ("SCRAM-SHA-256", "etl", "never-printed")
    for call in (
        lambda: spark.remove_static_members(job.bootstrap, "g", ["i"], config=job.config),
        lambda: spark.all_group_offsets(job.bootstrap, "g", config=job.config),
        lambda: spark.describe_group(job.bootstrap, "g", config=job.config),
        lambda: spark.ensure_topic(job.bootstrap, "t", 1, config=job.config),
        lambda: spark.starting_offsets_json(job.bootstrap, "g", "t", config=job.config),
    ):
        brokers.clear()
        with pytest.raises(cerr.AuthenticationFailedError):
            call()
        assert brokers[0][2].sasl_username == "etl"


def test_the_password_is_not_in_reprs_and_travels_pickled():
    job = spark.GroupJob("h:1", "g", {TopicPartition("t", 0): 10}, config=dict(SASL, **{"session.timeout.ms": 10000}))
    assert "never-printed" not in repr(job)
    back = pickle.loads(pickle.dumps(job))
    assert back.config["sasl.password"] == "never-printed"


def test_a_listener_url_that_contradicts_the_config_fails_at_once():
    with pytest.raises(ValueError, match="names SASL_SSL but security.protocol is PLAINTEXT"):
        spark.partitions_for("SASL_SSL://h:1", "t")
