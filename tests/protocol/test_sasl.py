"""protocol/sasl.py: PLAIN and SCRAM, client against server and against RFC 7677's example."""
from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from protocol import sasl
from protocol.sasl import SaslError, Users, client_mechanism, server_mechanism

USERS = Users({"alice": "alice-secret", "b,o=b": "p:a ss", "user": "pencil"})


def run(mech: str, user: str, password: str, users: Users = USERS):
    """The exchange as SaslAuthenticate carries it; -> (server, client)."""
    client = client_mechanism(mech, user, password)
    server = server_mechanism(mech, users)
    token = client.first()
    while True:
        answer = server.step(token)
        token = client.step(answer)
        if token is None:
            break
    return server, client


@pytest.mark.parametrize("mech", sasl.MECHANISMS)
@pytest.mark.parametrize("user,password", [("alice", "alice-secret"), ("b,o=b", "p:a ss")])
def test_client_and_server_agree(mech, user, password):
    server, client = run(mech, user, password)
    assert server.done and client.done and server.username == user


@pytest.mark.parametrize("mech", sasl.MECHANISMS)
@pytest.mark.parametrize("user,password", [("alice", "wrong"), ("mallory", "alice-secret"), ("alice", "")])
def test_wrong_credentials_fail_without_saying_which(mech, user, password):
    with pytest.raises(SaslError, match="Authentication failed") as exc:
        run(mech, user, password)
    assert "alice-secret" not in str(exc.value)


def test_rfc7677_example_server_side():
    """RFC 7677 section 3, with the server's nonce and salt fixed."""
    users = Users({"user": "pencil"})
    server = server_mechanism("SCRAM-SHA-256", users)
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    users._scram[("SCRAM-SHA-256", "user")] = sasl.scram_credential("SCRAM-SHA-256", "pencil", salt, 4096)
    server_nonce = "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
    orig = sasl._nonce
    sasl._nonce = lambda: server_nonce
    try:
        first = server.step(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO")
    finally:
        sasl._nonce = orig
    assert first == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = server.step(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                        b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="
    assert server.done and server.username == "user"


def test_rfc7677_example_client_side():
    client = sasl._ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    assert client.first() == b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO"
    final = client.step(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    assert final == (b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,"
                     b"p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    forged = sasl._ScramClient("SCRAM-SHA-256", "user", "pencil", nonce="rOprNGfwEbeRWgbNEkqO")
    forged.first()
    forged.step(b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
    with pytest.raises(SaslError, match="does not verify"):  # a server that does not know the password
        forged.step(b"v=" + base64.b64encode(b"\0" * 32))
    with pytest.raises(SaslError, match="bad-password"):
        forged.step(b"e=bad-password")
    assert client.step(b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=") is None and client.done


def test_scram_server_refuses_a_replayed_or_tampered_final_message():
    client = client_mechanism("SCRAM-SHA-512", "alice", "alice-secret")
    server = server_mechanism("SCRAM-SHA-512", USERS)
    final = client.step(server.step(client.first()))
    without_proof, _, proof = final.rpartition(b",p=")
    with pytest.raises(SaslError, match="nonce mismatch"):
        server.step(b"c=biws,r=other,p=" + proof)
    server2 = server_mechanism("SCRAM-SHA-512", USERS)
    client2 = client_mechanism("SCRAM-SHA-512", "alice", "alice-secret")
    server2.step(client2.first())
    with pytest.raises(SaslError, match="invalid credentials"):  # a proof made for another exchange
        server2.step(b"c=biws,r=" + server2.nonce.encode() + b",p=" + proof)


def test_scram_server_accepts_the_old_librdkafka_nonce_as_kafka_does():
    """librdkafka 1.x (Debian's kcat) sends r=<its nonce><the server's r> in its final message;
    Kafka checks endsWith, not equality, so herd does too. The proof still has to verify."""
    server = server_mechanism("SCRAM-SHA-256", USERS)
    cnonce = "abc123"
    bare = f"n=alice,r={cnonce}"
    server_first = server.step(("n,," + bare).encode()).decode()
    attrs = dict(x.split("=", 1) for x in server_first.split(","))
    salted = hashlib.pbkdf2_hmac("sha256", b"alice-secret", base64.b64decode(attrs["s"]), int(attrs["i"]))
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    stored = hashlib.sha256(client_key).digest()
    without_proof = f"c=biws,r={cnonce}{attrs['r']}"  # the doubled client nonce
    auth = f"{bare},{server_first},{without_proof}".encode()
    proof = sasl._xor(client_key, hmac.digest(stored, auth, "sha256"))
    final = server.step(f"{without_proof},p={base64.b64encode(proof).decode()}".encode())
    assert final.startswith(b"v=") and server.done


@pytest.mark.parametrize("first", [
    b"p=tls-unique,,n=alice,r=abc",  # channel binding asked
    b"n,,n=alice,r=abc,tokenauth=true",  # a delegation token: herd has none
    b"n,,m=ext,n=alice,r=abc",
    b"n,,r=abc",
    b"garbage",
    b"\xff\xfe",
    b"n,a=bob,n=alice,r=abc",  # authorization id of another user
])
def test_scram_server_refuses_bad_first_messages(first):
    with pytest.raises(SaslError):
        server_mechanism("SCRAM-SHA-256", USERS).step(first)


@pytest.mark.parametrize("token", [b"alice\0alice-secret", b"\0alice\0alice-secret\0x", b"bob\0alice\0alice-secret",
                                   b"\0\0alice-secret", b"\0alice\0", b"\xff\0alice\0alice-secret"])
def test_plain_server_refuses_malformed_tokens(token):
    with pytest.raises(SaslError):
        server_mechanism("PLAIN", USERS).step(token)


def test_plain_accepts_its_own_authorization_id():
    server = server_mechanism("PLAIN", USERS)
    assert server.step(b"alice\0alice\0alice-secret") == b"" and server.username == "alice"
    with pytest.raises(SaslError, match="complete"):
        server.step(b"\0alice\0alice-secret")


def test_scram_client_refuses_a_weak_or_foreign_server_first():
    c = client_mechanism("SCRAM-SHA-256", "alice", "x")
    c.first()
    with pytest.raises(SaslError, match="iterations"):
        c.step(f"r={c.nonce}srv,s=AAAA,i=1".encode())
    c = client_mechanism("SCRAM-SHA-256", "alice", "x")
    c.first()
    with pytest.raises(SaslError):
        c.step(b"r=notmynonce,s=AAAA,i=4096")


def test_unknown_mechanisms_and_reprs():
    with pytest.raises(ValueError, match="GSSAPI"):
        server_mechanism("GSSAPI", USERS)
    with pytest.raises(ValueError, match="OAUTHBEARER"):
        client_mechanism("OAUTHBEARER", "u", "p")
    for mech in sasl.MECHANISMS:
        assert "s3cret" not in repr(client_mechanism(mech, "u", "s3cret"))


def test_users_file_parsing():
    users = Users.parse("# herd users\n\nalice:alice-secret\n  bob : has:colons and spaces \n")
    assert users.check_password("alice", "alice-secret")
    assert users.check_password("bob ", "") is False
    assert users.check_password("bob", " has:colons and spaces ")
    assert not users.check_password("carol", "")
    for bad, what in [("alice", "line 1: expected user:password"), (":pw", "line 1"),
                      ("a:x\na:y", "line 2: user 'a' is listed twice"), ("a:", "empty password")]:
        with pytest.raises(ValueError, match=what):
            Users.parse(bad)


def test_scram_credentials_are_derived_once_per_user():
    users = Users({"alice": "pw"})
    a = users.scram("SCRAM-SHA-256", "alice")
    assert users.scram("SCRAM-SHA-256", "alice") is a
    assert users.scram("SCRAM-SHA-512", "alice") is not a and users.scram("SCRAM-SHA-256", "x") is None


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=200), st.sampled_from(sasl.MECHANISMS))
def test_any_token_gets_an_answer_or_a_sasl_error(token, mech):
    server = server_mechanism(mech, USERS)
    for _ in range(2):
        try:
            server.step(token)
        except SaslError:
            return
