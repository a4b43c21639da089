"""The consumer's network thread over TLS and SASL, against a small scripted broker on 127.0.0.1
(TLS by ``ssl``, SASL by ``protocol.sasl``'s server side): a committed-offsets lookup goes through
both; a refused password or a certificate that does not verify fails the consumer once, with the
reason, and it does not connect again."""

from __future__ import annotations

import socket
import ssl
import threading

import pytest
import trustme

from client import GroupConsumer, TopicPartition
from client import errors as cerr
from client.connection import CLIENT_VERSIONS
from protocol import errors as E
from protocol import messages as m
from protocol.framing import FrameDecoder, frame
from protocol.headers import decode_request_header, encode_response_header
from protocol.sasl import SaslError, Users, server_mechanism

TP = TopicPartition("t", 0)
# low versions, so that the scripted answers stay simple
VERSIONS = {k: (lo, lo) for k, (lo, _) in CLIENT_VERSIONS.items()}
VERSIONS.update({18: (0, 0), 17: (0, 1), 36: (0, 2), 10: (1, 1), 9: (1, 1)})


class Broker:
    """Accepts connections until closed; each: TLS (``tls``), ApiVersions, SASL (``users``),
    FindCoordinator (itself), OffsetFetch (offset 42 for every partition)."""

    def __init__(self, tls: ssl.SSLContext | None = None, users: Users | None = None):
        self.tls, self.users = tls, users
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.connections = 0
        self.authenticated: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def close(self):
        self._stop.set()
        self._thread.join(10)
        self.listener.close()

    def _serve(self):
        while not self._stop.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            self.connections += 1
            threading.Thread(target=self._handle, args=(sock,), daemon=True).start()

    def _handle(self, sock):
        sock.settimeout(5.0)
        try:
            if self.tls is not None:
                sock = self.tls.wrap_socket(sock, server_side=True)
            self._talk(sock)
        except Exception as exc:  # a TLS failure, a client that gave up, a TLS client on plaintext
            self.errors.append(repr(exc))
        finally:
            sock.close()

    def _talk(self, sock):
        decoder, mech, authenticated = FrameDecoder(), None, self.users is None
        while not self._stop.is_set():
            data = sock.recv(65536)
            if not data:
                return
            for payload in decoder.feed(data):
                h, pos = decode_request_header(payload)
                req = m.REQUESTS[h.api_key].decode(payload, h.api_version, pos)
                if h.api_key == 18:
                    resp = m.ApiVersionsResponse(api_keys=[
                        m.ApiVersionsResponseApiVersion(api_key=k, min_version=lo, max_version=hi)
                        for k, (lo, hi) in VERSIONS.items()])
                elif h.api_key == 17:
                    mech = server_mechanism(req.mechanism, self.users)
                    resp = m.SaslHandshakeResponse(mechanisms=["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
                elif h.api_key == 36:
                    try:
                        token = mech.step(req.auth_bytes)
                    except SaslError as exc:
                        sock.sendall(self._answer(h, m.SaslAuthenticateResponse(
                            error_code=E.SASL_AUTHENTICATION_FAILED, error_message=str(exc))))
                        return  # as Kafka: the connection closes after a failed authentication
                    resp = m.SaslAuthenticateResponse(auth_bytes=token)
                    if mech.done:
                        authenticated = True
                        self.authenticated.append(mech.username)
                elif not authenticated:
                    return
                elif h.api_key == 10:
                    resp = m.FindCoordinatorResponse(node_id=1, host="127.0.0.1", port=self.port)
                elif h.api_key == 9:
                    resp = m.OffsetFetchResponse(topics=[m.OffsetFetchResponseTopic(name=t.name, partitions=[
                        m.OffsetFetchResponsePartition(partition_index=p, committed_offset=42, metadata="")
                        for p in t.partition_indexes]) for t in req.topics])
                else:
                    return
                sock.sendall(self._answer(h, resp))

    @staticmethod
    def _answer(h, resp):
        v = h.api_version
        return frame(encode_response_header(h.correlation_id, h.api_key, v) + resp.encode(v))


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
