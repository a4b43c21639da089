"""TLS / SASL settings of the thin client, the sans-IO TLS layer, and what an authentication failure
does to the consumer (fails for good, no reconnect loop)."""

from __future__ import annotations

import pickle
import ssl

import pytest
import trustme

from client import errors as cerr
from client.config import parse_config
from client.coordinator import BOOTSTRAP, GroupFailed
from client.types import OffsetAndMetadata
from protocol import messages as m
from protocol.client_security import TlsLayer, parse_security, tls_failure
from tests.client.harness import Harness, tp


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca = trustme.CA()
    server = ca.issue_cert("localhost", "127.0.0.1")
    client = ca.issue_cert("client@example")
    ca.cert_pem.write_to_path(str(d / "ca.pem"))
    client.private_key_and_cert_chain_pem.write_to_path(str(d / "client.pem"))
    client.cert_chain_pems[0].write_to_path(str(d / "client-cert.pem"))
    client.private_key_pem.write_to_path(str(d / "client-key.pem"))
    other = trustme.CA()
    other.cert_pem.write_to_path(str(d / "other-ca.pem"))
    return {"dir": d, "ca": ca, "server": server}


# -- settings ----------------------------------------------------------------------------------------


def test_defaults_are_plaintext():
    sec = parse_config("h:1", "g").security
    assert sec.protocol == "PLAINTEXT" and not sec.uses_tls and not sec.uses_sasl
    assert sec.ssl_context() is None and sec.sasl_credentials() is None


def test_kafka_and_python_names(pki):
    ca = str(pki["dir"] / "ca.pem")
    a = parse_config("h:1", "g", {"security.protocol": "sasl_ssl", "ssl.ca.location": ca,
                                  "sasl.mechanisms": "scram-sha-512", "sasl.username": "u", "sasl.password": "p"})
    b = parse_config("h:1", "g", security_protocol="SASL_SSL", ssl_ca_location=ca, sasl_mechanism="SCRAM-SHA-512",
                     sasl_username="u", sasl_password="p")
    assert a.security == b.security
    assert a.security.sasl_credentials() == ("SCRAM-SHA-512", "u", "p")
    assert a.security.ssl_context().check_hostname
    none = parse_config("h:1", "g", security_protocol="SSL", ssl_ca_location=ca,
                        ssl_endpoint_identification_algorithm="none").security
    ctx = none.ssl_context()
    assert not ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED  # still verifies the chain
    assert parse_config("SASL_SSL://h:1", "g", security_protocol="SASL_SSL", ssl_ca_location=ca,
                        sasl_username="u", sasl_password="p").bootstrap_servers == [("h", 1)]


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"security.protocol": "TLS"}, "security.protocol must be one of PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL"),
        ({"security.protocol": "SASL_PLAINTEXT"}, "SASL_PLAINTEXT needs sasl.username and sasl.password"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.username": "u"}, "needs sasl.username and sasl.password"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.username": "u", "sasl.password": "p",
          "sasl.mechanism": "GSSAPI"}, "sasl.mechanism must be one of PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
        ({"sasl.username": "u", "sasl.password": "p"}, "sasl.username and sasl.password set but security.protocol "
                                                       "is PLAINTEXT"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.username": "u", "sasl.password": "p",
          "ssl.ca.location": "/x"}, "ssl.ca.location set but security.protocol is SASL_PLAINTEXT"),
        ({"security.protocol": "SSL", "ssl.ca.location": "/nonexistent/ca.pem"},
         "ssl.ca.location '/nonexistent/ca.pem': cannot load the CA certificates"),
        ({"security.protocol": "SSL", "ssl.key.location": "/k.pem"}, "ssl.key.location needs ssl.certificate.location"),
        ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "dns"},
         "must be https or none, not 'dns'"),
        ({"security.protocol": "SSL", "enable.ssl.certificate.verification": False},
         "needs ssl.endpoint.identification.algorithm=none"),
        ({"ssl.truststore.location": "/t.jks"}, "unknown consumer config 'ssl.truststore.location'"),
        ({"bootstrap.servers": "SSL://h:1"}, "names SSL but security.protocol is PLAINTEXT"),
    ],
)
def test_bad_or_contradictory_settings_fail_at_construction(settings, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_config(settings.pop("bootstrap.servers", "h:1"), "g", settings)


def test_client_certificate_files_load_or_fail_clearly(pki):
    d = pki["dir"]
    ok = parse_config("h:1", "g", security_protocol="SSL", ssl_ca_location=str(d / "ca.pem"),
                      ssl_certificate_location=str(d / "client-cert.pem"), ssl_key_location=str(d / "client-key.pem"))
    assert ok.security.ssl_context() is not None
    with pytest.raises(ValueError, match="cannot load the client certificate and key"):
        parse_config("h:1", "g", security_protocol="SSL", ssl_certificate_location=str(d / "ca.pem"))


def test_an_encrypted_client_key_without_its_password_fails_clearly_not_a_prompt(pki):
    from cryptography.hazmat.primitives import serialization

    d = pki["dir"]
    key = serialization.load_pem_private_key((d / "client-key.pem").read_bytes(), None)
    (d / "client-key-enc.pem").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.BestAvailableEncryption(b"pw")))
    common = dict(security_protocol="SSL", ssl_ca_location=str(d / "ca.pem"),
                  ssl_certificate_location=str(d / "client-cert.pem"), ssl_key_location=str(d / "client-key-enc.pem"))
    with pytest.raises(ValueError, match="the key is encrypted: set ssl.key.password"):
        parse_config("h:1", "g", **common).security.ssl_context()
    assert parse_config("h:1", "g", ssl_key_password="pw", **common).security.ssl_context() is not None


def test_passwords_never_in_reprs_and_config_pickles(pki):
    cfg = parse_config("h:1", "g", security_protocol="SASL_SSL", ssl_ca_location=str(pki["dir"] / "ca.pem"),
                       sasl_username="alice", sasl_password="hunter2-secret")
    assert "hunter2-secret" not in repr(cfg) and "hunter2-secret" not in str(cfg.security)
    assert "alice" in repr(cfg.security)
    cfg.security.ssl_context()
    back = pickle.loads(pickle.dumps(cfg))  # the SSLContext is rebuilt where it is used
    assert back.security == cfg.security and back.security.ssl_context() is not None


# -- the TLS layer ---------------------------------------------------------------------------------


def _server(pki, require_client_cert=False):
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    pki["server"].configure_cert(ctx)
    if require_client_cert:
        pki["ca"].configure_trust(ctx)
        ctx.verify_mode = ssl.CERT_REQUIRED
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    return ctx.wrap_bio(inc, out, server_side=True), inc, out


def _pump(client: TlsLayer, server, s_in, s_out, rounds=10):
    """Shuttle bytes both ways; returns the plaintext the client got."""
    got = b""
    for _ in range(rounds):
        c_out = client.data_to_send()
        if c_out:
            s_in.write(c_out)
        try:
            server.do_handshake()
        except ssl.SSLWantReadError:
            pass
        except ssl.SSLError:
            pass  # the server refuses: its alert goes to the client
        s_data = s_out.read()
        if s_data:
            got += client.feed(s_data)
        if not c_out and not s_data:
            break
    return got


def _client(pki, host="127.0.0.1", **settings):
    settings = {k.replace("_", "."): v for k, v in settings.items()}
    sec = parse_security({"security.protocol": "SSL", "ssl.ca.location": str(pki["dir"] / "ca.pem"), **settings})
    return sec.tls_layer(host)


def test_tls_layer_handshake_and_data_both_ways(pki):
    client = _client(pki)
    server, s_in, s_out = _server(pki)
    client.start()
    client.write(b"written before the handshake")  # held until the session is up
    assert _pump(client, server, s_in, s_out) == b""
    assert client.handshake_done
    assert server.read(1000) == b"written before the handshake"
    server.write(b"x" * 70000)
    assert client.feed(s_out.read()) == b"x" * 70000  # all of it at once: nothing stays buffered
    client.write(b"ping")
    s_in.write(client.data_to_send())
    assert server.read(100) == b"ping"


def _handshake_error(client, server, s_in, s_out):
    client.start()
    with pytest.raises(ssl.SSLError) as info:
        _pump(client, server, s_in, s_out)
    return info.value


def test_tls_verification_failures_are_fatal_and_say_so(pki):
    other_ca = str(pki["dir"] / "other-ca.pem")
    exc = _handshake_error(_client(pki, ssl_ca_location=other_ca), *_server(pki))
    fatal, why = tls_failure(exc, "127.0.0.1", 9093)
    assert fatal and why.startswith("TLS certificate verification of 127.0.0.1:9093 failed")
    assert "check ssl.ca.location" in why
    exc = _handshake_error(_client(pki, host="wrong.example"), *_server(pki))
    fatal, why = tls_failure(exc, "wrong.example", 9093)
    assert fatal and "Hostname mismatch" in why
    # the same name with the check off
    client = _client(pki, host="wrong.example", ssl_endpoint_identification_algorithm="none")
    server, s_in, s_out = _server(pki)
    client.start()
    _pump(client, server, s_in, s_out)
    assert client.handshake_done


def test_broker_refusing_our_certificate_is_fatal(pki):
    client = _client(pki)  # no client certificate
    server, s_in, s_out = _server(pki, require_client_cert=True)
    client.start()
    with pytest.raises(ssl.SSLError) as info:
        _pump(client, server, s_in, s_out)
        server.write(b"x")  # TLS 1.3: the client learns of the refusal after its own handshake
        client.feed(s_out.read())
    fatal, why = tls_failure(info.value, "h", 1)
    assert fatal and "refused the TLS handshake" in why, why


def test_tls_to_a_plaintext_listener_says_so(pki):
    client = _client(pki)
    client.start()
    client.data_to_send()
    with pytest.raises(ssl.SSLError) as info:
        client.feed(b"\x00\x00\x00\x10" + b"\x00" * 16)  # a Kafka frame, not a TLS record
    fatal, why = tls_failure(info.value, "h", 1)
    assert fatal and "does not speak TLS" in why and "security.protocol" in why


# -- the consumer on an authentication failure --------------------------------------------------------


def test_auth_failure_fails_the_consumer_without_reconnecting():
    h = Harness()
    h.call("subscribe", ["t"])
    assert [c.conn for c in h.connects] == [BOOTSTRAP]
    h.connects.clear()
    err = cerr.AuthenticationFailedError("SASL PLAIN authentication of 'u' failed: Invalid username or password")
    h.core.on_auth_failed(BOOTSTRAP, err, h.now)
    h.pump()
    [ev] = h.take_events(GroupFailed)
    assert ev.error is err and h.core.snapshot().error is err
    assert not err.retriable and err.code == 58
    h.tick(60.0)
    assert h.connects == [] and h.sends == []  # no reconnect loop
    h.call("commit", {tp("t", 0): OffsetAndMetadata(1)}, object(), h.now + 5)
    h.call("fetch_committed", [tp("t", 0)], object(), h.now + 5)
    assert [r.error for r in h.take_replies()] == [err, err]
    h.tick(60.0)
    assert h.connects == []


def test_tls_failure_on_the_coordinator_connection_is_fatal_too():
    h = Harness().stable_member(parts=[tp("t", 0)])
    h.take_events()
    err = cerr.SslAuthenticationError("TLS certificate verification of c1:9092 failed")
    h.core.on_auth_failed("coordinator", err, h.now)
    h.pump()
    assert isinstance(h.take_events()[-1], GroupFailed)
    assert isinstance(err, cerr.AuthenticationFailedError) and err.code is None and not err.retriable
    h.tick(30.0)
    assert h.pending(m.HeartbeatRequest) == [] and h.connects == []
