"""The sans-IO connection's SASL handshake: ApiVersions, SaslHandshake v1, SaslAuthenticate until the
mechanism is done, then Ready; every refusal is an ``AuthenticationFailed`` with the broker's reason."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest

from protocol import errors as E
from protocol import messages as m
from protocol.client_connection import AuthenticationFailed, Connection, ConnectionBroken, Ready
from protocol.framing import frame
from protocol.headers import encode_response_header
from tests.client.harness import requests_in


def answer(header, response):
    v = header.api_version
    return frame(encode_response_header(header.correlation_id, header.api_key, v) + response.encode(v))


def broker(extra=None):
    versions = {18: 3, 10: 4, 11: 9, 12: 4, 14: 5, 13: 5, 8: 9, 9: 9, 3: 12, **(extra or {})}
    return m.ApiVersionsResponse(
        api_keys=[m.ApiVersionsResponseApiVersion(api_key=k, min_version=0, max_version=v) for k, v in versions.items()]
    )


SASL_BROKER = broker({17: 1, 36: 2})  # SaslHandshake v0-1, SaslAuthenticate v0-2


def api_versions_done(conn: Connection, resp=SASL_BROKER):
    conn.initiate()
    [(h, _)] = requests_in(conn.data_to_send())
    assert h.api_key == 18
    return conn.receive(answer(h, resp))


def next_request(conn: Connection, api_key: int):
    [(h, req)] = requests_in(conn.data_to_send())
    assert h.api_key == api_key
    return h, req


def test_plain_handshake_then_ready():
    conn = Connection(client_id="me", sasl=("PLAIN", "alice", "s3cret"))
    assert api_versions_done(conn) == []  # no Ready before authentication
    assert not conn.ready
    with pytest.raises(ConnectionBroken):  # nothing else may go out before it
        conn.send(m.HeartbeatRequest(), 0)
    h, req = next_request(conn, 17)
    assert h.api_version == 1 and req.mechanism == "PLAIN"
    assert conn.receive(answer(h, m.SaslHandshakeResponse(mechanisms=["PLAIN"]))) == []
    h, req = next_request(conn, 36)
    assert h.api_version == 2  # the highest both know
    assert req.auth_bytes == b"\0alice\0s3cret"
    assert conn.in_flight == []  # the handshake's requests are not the user's
    [ready] = conn.receive(answer(h, m.SaslAuthenticateResponse(auth_bytes=b"")))
    assert isinstance(ready, Ready) and conn.ready and ready.versions[11] == 9
    assert "s3cret" not in repr(conn)


def test_sasl_authenticate_version_follows_the_broker():
    old = broker({17: 1, 36: 0})
    conn = Connection(sasl=("PLAIN", "a", "b"))
    api_versions_done(conn, old)
    h, _ = next_request(conn, 17)
    conn.receive(answer(h, m.SaslHandshakeResponse(mechanisms=["PLAIN"])))
    h, _ = next_request(conn, 36)
    assert h.api_version == 0
    assert isinstance(conn.receive(answer(h, m.SaslAuthenticateResponse()))[0], Ready)


def test_wrong_password_raises_the_brokers_message():
    conn = Connection(sasl=("PLAIN", "alice", "wrong"))
    api_versions_done(conn)
    h, _ = next_request(conn, 17)
    conn.receive(answer(h, m.SaslHandshakeResponse(mechanisms=["PLAIN"])))
    h, _ = next_request(conn, 36)
    resp = m.SaslAuthenticateResponse(
        error_code=E.SASL_AUTHENTICATION_FAILED, error_message="Authentication failed: Invalid username or password"
    )
    with pytest.raises(AuthenticationFailed, match="PLAIN authentication of 'alice' failed: Authentication "
                       "failed: Invalid username or password"):
        conn.receive(answer(h, resp))
    assert not conn.ready


def test_mechanism_the_broker_does_not_enable():
    conn = Connection(sasl=("SCRAM-SHA-512", "a", "b"))
    api_versions_done(conn)
    h, req = next_request(conn, 17)
    assert req.mechanism == "SCRAM-SHA-512"
    resp = m.SaslHandshakeResponse(error_code=E.UNSUPPORTED_SASL_MECHANISM, mechanisms=["PLAIN", "SCRAM-SHA-256"])
    with pytest.raises(AuthenticationFailed, match=r"does not enable SASL mechanism SCRAM-SHA-512 \(it enables: "
                       r"PLAIN, SCRAM-SHA-256\)"):
        conn.receive(answer(h, resp))


def test_broker_without_sasl():
    conn = Connection(sasl=("PLAIN", "a", "b"))
    with pytest.raises(AuthenticationFailed, match="does not offer SASL authentication"):
        api_versions_done(conn, broker())


def test_handshake_error_other_than_mechanism():
    conn = Connection(sasl=("PLAIN", "a", "b"))
    api_versions_done(conn)
    h, _ = next_request(conn, 17)
    with pytest.raises(AuthenticationFailed, match=r"listener does not take SASL .*ILLEGAL_SASL_STATE.*check "
                       "security.protocol"):
        conn.receive(answer(h, m.SaslHandshakeResponse(error_code=E.ILLEGAL_SASL_STATE)))


class _Scripted:
    """A stand-in mechanism: ``first`` then one token per server token, as listed."""

    def __init__(self, tokens, fail_on=None):
        self.name, self.done, self.tokens, self.seen, self.fail_on = "X", False, list(tokens), [], fail_on

    def first(self):
        return self.tokens.pop(0)

    def step(self, server_token):
        from protocol.sasl import SaslError

        self.seen.append(server_token)
        if server_token == self.fail_on:
            raise SaslError("server signature does not verify")
        if not self.tokens:
            self.done = True
            return None
        return self.tokens.pop(0)


def test_multi_step_exchange_and_client_side_verification_failure():
    mech = _Scripted([b"c1", b"c2"])
    conn = Connection(sasl=("SCRAM-SHA-256", "u", "p"), mechanism_factory=lambda *a: mech)
    api_versions_done(conn)
    h, _ = next_request(conn, 17)
    conn.receive(answer(h, m.SaslHandshakeResponse(mechanisms=["SCRAM-SHA-256"])))
    h, req = next_request(conn, 36)
    assert req.auth_bytes == b"c1"
    assert conn.receive(answer(h, m.SaslAuthenticateResponse(auth_bytes=b"s1"))) == []
    h, req = next_request(conn, 36)
    assert req.auth_bytes == b"c2"
    [ready] = conn.receive(answer(h, m.SaslAuthenticateResponse(auth_bytes=b"s2")))
    assert isinstance(ready, Ready) and mech.seen == [b"s1", b"s2"]

    bad = _Scripted([b"c1"], fail_on=b"forged")
    conn = Connection(sasl=("SCRAM-SHA-256", "u", "p"), mechanism_factory=lambda *a: bad)
    api_versions_done(conn)
    h, _ = next_request(conn, 17)
    conn.receive(answer(h, m.SaslHandshakeResponse(mechanisms=["SCRAM-SHA-256"])))
    h, _ = next_request(conn, 36)
    with pytest.raises(AuthenticationFailed, match="server signature does not verify"):
        conn.receive(answer(h, m.SaslAuthenticateResponse(auth_bytes=b"forged")))


def _scram_server(name: str, password: str, client_first: bytes, salt=b"salty", iterations=4096):
    """RFC 5802's server side, written out here to check the client mechanism's messages."""
    h = hashlib.sha256 if name == "SCRAM-SHA-256" else hashlib.sha512
    bare = client_first.decode().split(",", 2)[2]
    attrs = dict(kv.split("=", 1) for kv in bare.split(","))
    nonce = attrs["r"] + "srv"
    server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={iterations}"

    def final(client_final: bytes) -> bytes:
        without_proof, proof = client_final.decode().rsplit(",p=", 1)
        salted = hashlib.pbkdf2_hmac(h().name, password.encode(), salt, iterations)
        client_key = hmac.new(salted, b"Client Key", h).digest()
        stored = h(client_key).digest()
        message = f"{bare},{server_first},{without_proof}".encode()
        signature = hmac.new(stored, message, h).digest()
        if bytes(a ^ b for a, b in zip(base64.b64decode(proof), signature, strict=True)) != client_key:
            return None
        server_key = hmac.new(salted, b"Server Key", h).digest()
        return b"v=" + base64.b64encode(hmac.new(server_key, message, h).digest())

    return server_first.encode(), final


@pytest.mark.parametrize("name", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_scram_exchange_with_protocol_sasl(name):
    conn = Connection(sasl=(name, "bob", "pässword"))
    api_versions_done(conn)
    h, _ = next_request(conn, 17)
    conn.receive(answer(h, m.SaslHandshakeResponse(mechanisms=[name])))
    h, req = next_request(conn, 36)
    server_first, final = _scram_server(name, "pässword", req.auth_bytes)
    assert conn.receive(answer(h, m.SaslAuthenticateResponse(auth_bytes=server_first))) == []
    h, req = next_request(conn, 36)
    server_final = final(req.auth_bytes)
    assert server_final is not None  # the client's proof verifies
    [ready] = conn.receive(answer(h, m.SaslAuthenticateResponse(auth_bytes=server_final)))
    assert isinstance(ready, Ready)
    # a server that does not know the password cannot forge its final message
    conn = Connection(sasl=(name, "bob", "pässword"))
    api_versions_done(conn)
    h, _ = next_request(conn, 17)
    conn.receive(answer(h, m.SaslHandshakeResponse(mechanisms=[name])))
    h, req = next_request(conn, 36)
    server_first, _ = _scram_server(name, "other", req.auth_bytes)
    conn.receive(answer(h, m.SaslAuthenticateResponse(auth_bytes=server_first)))
    h, req = next_request(conn, 36)
    with pytest.raises(AuthenticationFailed):
        conn.receive(answer(h, m.SaslAuthenticateResponse(auth_bytes=b"v=" + base64.b64encode(b"x" * 32))))


def test_refusals_carry_their_facts_for_a_tool_that_words_them_itself():
    # herd groups (admin/session.py) names the server first in its own words: it reads these
    conn = Connection(sasl=("PLAIN", "a", "b"))
    with pytest.raises(AuthenticationFailed) as info:
        api_versions_done(conn, broker())
    assert (info.value.reason, info.value.mechanism, info.value.username) == ("no_sasl", "PLAIN", "a")

    conn = Connection(sasl=("SCRAM-SHA-512", "a", "b"))
    api_versions_done(conn)
    h, _ = next_request(conn, 17)
    with pytest.raises(AuthenticationFailed) as info:
        conn.receive(answer(h, m.SaslHandshakeResponse(error_code=E.UNSUPPORTED_SASL_MECHANISM,
                                                       mechanisms=["PLAIN", "SCRAM-SHA-256"])))
    assert (info.value.reason, info.value.enabled) == ("mechanism", ("PLAIN", "SCRAM-SHA-256"))

    for code, reason in ((E.ILLEGAL_SASL_STATE, "not_sasl_listener"), (E.UNKNOWN_SERVER_ERROR, "handshake")):
        conn = Connection(sasl=("PLAIN", "a", "b"))
        api_versions_done(conn)
        h, _ = next_request(conn, 17)
        with pytest.raises(AuthenticationFailed) as info:
            conn.receive(answer(h, m.SaslHandshakeResponse(error_code=code)))
        assert (info.value.reason, info.value.error_code) == (reason, code)

    conn = Connection(sasl=("PLAIN", "alice", "wrong"))
    api_versions_done(conn)
    h, _ = next_request(conn, 17)
    conn.receive(answer(h, m.SaslHandshakeResponse(mechanisms=["PLAIN"])))
    h, _ = next_request(conn, 36)
    with pytest.raises(AuthenticationFailed) as info:
        conn.receive(answer(h, m.SaslAuthenticateResponse(error_code=E.SASL_AUTHENTICATION_FAILED,
                                                          error_message="bad password")))
    assert (info.value.reason, info.value.username, info.value.error_code, info.value.broker_message) == (
        "refused", "alice", E.SASL_AUTHENTICATION_FAILED, "bad password")
