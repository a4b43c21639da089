"""The consumer's network thread over TLS and SASL, against a small scripted broker on 127.0.0.1
(TLS by ``ssl``, SASL by ``protocol.sasl``'s server side): a committed-offsets lookup goes through
both; a refused password or a certificate that does not verify fails the consumer once, with the
reason, and it does not connect again."""

from __future__ import annotations

import ssl

import pytest
import trustme

from client import GroupConsumer, TopicPartition
from client import errors as cerr
from protocol.sasl import Users
from tests.support.secure_broker import Broker

TP = TopicPartition("t", 0)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    trustme.CA().cert_pem.write_to_path(str(d / "other-ca.pem"))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("localhost", "127.0.0.1").configure_cert(server)
    return d, server


@pytest.fixture(scope="module")
def localhost_only(pki):
    """A server whose certificate names localhost, not 127.0.0.1."""
    d, _ = pki
    ca = trustme.CA()
    ca.cert_pem.write_to_path(str(d / "ca2.pem"))
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ca.issue_cert("localhost").configure_cert(server)
    return str(d / "ca2.pem"), server


@pytest.fixture
def brokers():
    started = []

    def start(**kw):
        b = Broker(**kw)
        started.append(b)
        return b

    yield start
    for b in started:
        b.close()


def consumer(broker, **config):
    return GroupConsumer(f"127.0.0.1:{broker.port}", "g", enable_auto_commit=False, reconnect_backoff_ms=10,
                         reconnect_backoff_max_ms=50, **config)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_committed_over_tls_and_sasl(pki, brokers, mechanism):
    d, server_ctx = pki
    b = brokers(tls=server_ctx, users=Users({"alice": "s3cret"}))
    c = consumer(b, security_protocol="SASL_SSL", ssl_ca_location=str(d / "ca.pem"), sasl_mechanism=mechanism,
                 sasl_username="alice", sasl_password="s3cret")
    try:
        got = c.committed([TP], timeout_s=10)
    finally:
        c.close(2)
    assert got[TP].offset == 42
    assert b.authenticated and set(b.authenticated) == {"alice"}


def test_committed_over_tls_only(pki, brokers):
    d, server_ctx = pki
    b = brokers(tls=server_ctx)
    c = consumer(b, security_protocol="SSL", ssl_ca_location=str(d / "ca.pem"))
    try:
        assert c.committed([TP], timeout_s=10)[TP].offset == 42
    finally:
        c.close(2)


def test_wrong_password_fails_once_with_the_brokers_reason(brokers):
    b = brokers(users=Users({"alice": "s3cret"}))
    c = consumer(b, security_protocol="SASL_PLAINTEXT", sasl_username="alice", sasl_password="wrong")
    try:
        c.subscribe(["t"])
        with pytest.raises(cerr.AuthenticationFailedError, match="Invalid username or password") as info:
            c.poll(10)
        assert not info.value.retriable
        with pytest.raises(cerr.AuthenticationFailedError):
            c.committed([TP], timeout_s=5)
        with pytest.raises(cerr.AuthenticationFailedError):
            c.poll(0.5)  # it stays failed, and does not connect again meanwhile
    finally:
        c.close(2)
    assert b.connections == 1


def test_certificate_that_does_not_verify_fails_once_and_says_so(pki, brokers):
    d, server_ctx = pki
    b = brokers(tls=server_ctx)
    c = consumer(b, security_protocol="SSL", ssl_ca_location=str(d / "other-ca.pem"))
    try:
        c.subscribe(["t"])
        with pytest.raises(cerr.SslAuthenticationError, match="TLS certificate verification of 127.0.0.1:.* failed"):
            c.poll(10)
        with pytest.raises(cerr.SslAuthenticationError):
            c.poll(0.5)
    finally:
        c.close(2)
    assert b.connections == 1


def test_host_name_check(localhost_only, brokers):
    ca, server_ctx = localhost_only
    b = brokers(tls=server_ctx)
    for algo, ok in (("https", False), ("none", True)):
        c = GroupConsumer(f"127.0.0.1:{b.port}", "g", enable_auto_commit=False, security_protocol="SSL",
                          ssl_ca_location=ca, ssl_endpoint_identification_algorithm=algo)
        try:
            if ok:  # the chain is still verified, the name is not
                assert c.committed([TP], timeout_s=10)[TP].offset == 42
            else:
                with pytest.raises(cerr.SslAuthenticationError, match="IP address mismatch|Hostname mismatch"):
                    c.committed([TP], timeout_s=10)
        finally:
            c.close(2)


def test_tls_client_to_a_plaintext_listener_is_retried_with_a_hint(brokers):
    b = brokers()
    c = consumer(b, security_protocol="SSL")
    try:
        with pytest.raises((cerr.KafkaTimeoutError, cerr.SslAuthenticationError)) as info:
            c.committed([TP], timeout_s=2)
    finally:
        c.close(2)
    assert "TLS" in str(info.value), str(info.value)
    print(info.value)
