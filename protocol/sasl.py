"""SASL mechanisms as Kafka uses them, both sides, sans-IO: tokens in, tokens out.

PLAIN (RFC 4616) and SCRAM-SHA-256 / SCRAM-SHA-512 (RFC 5802, RFC 7677; no channel binding, as
Kafka). The daemon runs a :class:`ServerMechanism` per authenticating connection; herd's clients
run a :class:`ClientMechanism`. The tokens travel in SaslAuthenticate requests (or, after a v0
SaslHandshake, as bare size-prefixed frames); this module never sees the framing.

Errors are :class:`SaslError`; its message is what the server tells the client (Kafka's wording
where Kafka has one), so it never says whether the user or the password was wrong.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass

__all__ = [
    "MECHANISMS",
    "SaslError",
    "ClientMechanism",
    "ServerMechanism",
    "client_mechanism",
    "server_mechanism",
    "ScramCredential",
    "Users",
]

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
SCRAM_ITERATIONS = 4096  # Kafka's minimum (and kafka-configs' default)
_GS2_HEADER = "n,,"  # no channel binding, no authorization id


class SaslError(Exception):
    """Authentication failed, or the peer broke the mechanism's exchange."""


# ---- credentials (server side) ---------------------------------------------------------------


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def scram_credential(mechanism: str, password: str, salt: bytes | None = None,
                     iterations: int = SCRAM_ITERATIONS) -> ScramCredential:
    algo = _HASHES[mechanism]
    salt = os.urandom(24) if salt is None else salt
    salted = hashlib.pbkdf2_hmac(algo, password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", algo)
    return ScramCredential(salt, iterations, hashlib.new(algo, client_key).digest(),
                           hmac.digest(salted, b"Server Key", algo))


class Users:
    """user name -> password, with SCRAM credentials derived once per user and mechanism (4096
    PBKDF2 rounds are milliseconds: not paid again for every connection)."""

    def __init__(self, passwords: dict[str, str]):
        self._passwords = dict(passwords)
        self._scram: dict[tuple[str, str], ScramCredential] = {}

    def __len__(self) -> int:
        return len(self._passwords)

    def check_password(self, user: str, password: str) -> bool:
        known = self._passwords.get(user)
        # compared in constant time, and a password compared even for an unknown user
        ok = hmac.compare_digest((known if known is not None else "\0").encode(), password.encode())
        return ok and known is not None

    def scram(self, mechanism: str, user: str) -> ScramCredential | None:
        key = (mechanism, user)
        cred = self._scram.get(key)
        if cred is None:
            password = self._passwords.get(user)
            if password is None:
                return None
            cred = self._scram[key] = scram_credential(mechanism, password)
        return cred

    @classmethod
    def parse(cls, text: str, source: str = "users file") -> Users:
        """``user:password`` per line; blank lines and ``#`` comments skipped. The password is
        everything after the first colon (it may contain colons and spaces)."""
        out: dict[str, str] = {}
        for n, raw in enumerate(text.splitlines(), 1):
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            user, sep, password = raw.strip("\r\n").lstrip().partition(":")
            if not sep or not user.strip():
                raise ValueError(f"{source} line {n}: expected user:password")
            user = user.strip()
            if user in out:
                raise ValueError(f"{source} line {n}: user {user!r} is listed twice")
            if not password:
                raise ValueError(f"{source} line {n}: user {user!r} has an empty password")
            out[user] = password
        return cls(out)


# ---- SCRAM message helpers --------------------------------------------------------------------


def _escape(name: str) -> str:
    return name.replace("=", "=3D").replace(",", "=2C")


def _unescape(name: str) -> str:
    out, i = [], 0
    while i < len(name):
        if name[i] == "=":
            code = name[i:i + 3]
            if code == "=3D":
                out.append("=")
            elif code == "=2C":
                out.append(",")
            else:
                raise SaslError("Invalid user name: bad escape")
            i += 3
        else:
            out.append(name[i])
            i += 1
    return "".join(out)


def _attributes(message: str, extensions: bool = False) -> dict[str, str]:
    """key=value,... -> dict (the first of a repeated key). Keys are one letter, except Kafka's
    extensions (``tokenauth=true``) in a client first message (``extensions``)."""
    out = {}
    for part in message.split(","):
        key, sep, value = part.partition("=")
        if not sep or not key or (len(key) != 1 and not extensions):
            raise SaslError(f"Invalid SCRAM message: {message[:100]!r}")
        out.setdefault(key, value)
    return out


def _text(token: bytes) -> str:
    try:
        return token.decode()
    except UnicodeDecodeError:
        raise SaslError("Invalid SCRAM message: not UTF-8") from None


def _nonce() -> str:
    return base64.b64encode(os.urandom(24)).decode().rstrip("=").replace("+", "-").replace("/", "_")


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


# ---- server side ------------------------------------------------------------------------------


class ServerMechanism:
    name: str
    done: bool = False
    username: str | None = None

    def step(self, token: bytes) -> bytes:
        """The answer to the client's ``token``; ``done`` once authenticated. SaslError when the
        client failed to authenticate (its message is for the client)."""
        raise NotImplementedError


class _PlainServer(ServerMechanism):
    name = "PLAIN"

    def __init__(self, users: Users):
        self.users = users

    def step(self, token: bytes) -> bytes:
        if self.done:
            raise SaslError("Unexpected SASL token: authentication is complete")
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise SaslError("Invalid SASL/PLAIN response: expected 3 tokens")
        try:
            authzid, user, password = (p.decode() for p in parts)
        except UnicodeDecodeError:
            raise SaslError("Invalid SASL/PLAIN response: not UTF-8") from None
        if not user:
            raise SaslError("Authentication failed: username not specified")
        if not password:
            raise SaslError("Authentication failed: password not specified")
        if authzid and authzid != user:
            raise SaslError("Authentication failed: Client requested an authorization id that is "
                            "different from username")
        if not self.users.check_password(user, password):
            raise SaslError("Authentication failed: Invalid username or password")
        self.username, self.done = user, True
        return b""


class _ScramServer(ServerMechanism):
    def __init__(self, name: str, users: Users):
        self.name = name
        self.users = users
        self.algo = _HASHES[name]
        self.state = "first"
        self.cred: ScramCredential | None = None

    def step(self, token: bytes) -> bytes:
        if self.state == "first":
            return self._first(_text(token))
        if self.state == "final":
            return self._final(_text(token))
        raise SaslError("Unexpected SASL token: authentication is complete")

    def _first(self, message: str) -> bytes:
        gs2, sep, bare = message.partition(",")
        authzid, sep2, bare = bare.partition(",")
        if not sep or not sep2 or gs2 not in ("n", "y"):
            raise SaslError("Invalid SCRAM client first message (channel binding is not supported)")
        attrs = _attributes(bare, extensions=True)
        if "m" in attrs or "n" not in attrs or "r" not in attrs:
            raise SaslError("Invalid SCRAM client first message")
        # Kafka's ClientFirstMessage pattern: a nonce of one or more printable characters, no comma
        nonce = attrs["r"]
        if not nonce or any(not 0x21 <= ord(c) <= 0x7E for c in nonce):
            raise SaslError("Invalid SCRAM client first message: the client nonce must be printable and not empty")
        user = _unescape(attrs["n"])
        extensions = {k: v for k, v in attrs.items() if k not in ("n", "r")}
        if authzid and _unescape(authzid[2:] if authzid.startswith("a=") else authzid) != user:
            raise SaslError("Authentication failed: Client requested an authorization id that is "
                            "different from username")
        # Kafka's one extension, tokenauth, asks for a delegation token: herd has none.
        if extensions:
            raise SaslError("Authentication failed: Unsupported extensions")
        cred = self.users.scram(self.name, user)
        if cred is None:
            raise SaslError("Authentication failed: Invalid user credentials")
        self.cred, self.username = cred, user
        self.nonce = attrs["r"] + _nonce()
        self.client_first_bare = bare
        self.server_first = (f"r={self.nonce},s={base64.b64encode(cred.salt).decode()},"
                             f"i={cred.iterations}")
        self.state = "final"
        return self.server_first.encode()

    def _final(self, message: str) -> bytes:
        without_proof, sep, proof_part = message.rpartition(",p=")
        if not sep:
            raise SaslError("Invalid SCRAM client final message")
        attrs = _attributes(without_proof)
        # Kafka checks that the nonce ENDS with the server's (not RFC 5802's equality): librdkafka
        # before 2.x sends its own nonce again in front of it, and Kafka accepts that client. The
        # proof covers this message as sent, and the server's fresh part is still required.
        if not attrs.get("r", "").endswith(self.nonce):
            raise SaslError("Invalid SCRAM client final message: nonce mismatch")
        if attrs.get("c") not in ("biws", "eSws"):  # base64 of "n,," and "y,,"
            raise SaslError("Invalid SCRAM client final message: channel binding is not supported")
        try:
            proof = base64.b64decode(proof_part, validate=True)
        except ValueError:
            raise SaslError("Invalid SCRAM client final message: bad proof") from None
        cred = self.cred
        auth_message = f"{self.client_first_bare},{self.server_first},{without_proof}".encode()
        signature = hmac.digest(cred.stored_key, auth_message, self.algo)
        if len(proof) != len(signature) or not hmac.compare_digest(
                hashlib.new(self.algo, _xor(proof, signature)).digest(), cred.stored_key):
            raise SaslError("Authentication failed during authentication due to invalid credentials "
                            f"with SASL mechanism {self.name}")
        self.state, self.done = "done", True
        server_signature = hmac.digest(cred.server_key, auth_message, self.algo)
        return b"v=" + base64.b64encode(server_signature)


def server_mechanism(name: str, users: Users) -> ServerMechanism:
    if name == "PLAIN":
        return _PlainServer(users)
    if name in _HASHES:
        return _ScramServer(name, users)
    raise ValueError(f"unknown SASL mechanism {name!r} (herd has {', '.join(MECHANISMS)})")


# ---- client side ------------------------------------------------------------------------------


class ClientMechanism:
    name: str
    done: bool = False

    def first(self) -> bytes:
        raise NotImplementedError

    def step(self, server_token: bytes) -> bytes | None:
        raise NotImplementedError


class _PlainClient(ClientMechanism):
    name = "PLAIN"

    def __init__(self, username: str, password: str):
        self.username, self.password = username, password

    def first(self) -> bytes:
        return b"\0" + self.username.encode() + b"\0" + self.password.encode()

    def step(self, server_token: bytes) -> bytes | None:
        self.done = True
        return None

    def __repr__(self):
        return f"<PLAIN client {self.username!r}>"  # never the password


class _ScramClient(ClientMechanism):
    def __init__(self, name: str, username: str, password: str, nonce: str | None = None):
        self.name, self.username, self._password = name, username, password
        self.algo = _HASHES[name]
        self.nonce = nonce or _nonce()
        self.state = "first"

    def first(self) -> bytes:
        self.client_first_bare = f"n={_escape(self.username)},r={self.nonce}"
        self.state = "server-first"
        return (_GS2_HEADER + self.client_first_bare).encode()

    def step(self, server_token: bytes) -> bytes | None:
        message = _text(server_token)
        if self.state == "server-first":
            return self._server_first(message)
        if self.state == "server-final":
            attrs = _attributes(message)
            if "e" in attrs:
                raise SaslError(f"SCRAM authentication failed: {attrs['e']}")
            try:
                signature = base64.b64decode(attrs.get("v", ""), validate=True)
            except ValueError:
                signature = b""
            if not hmac.compare_digest(signature, self.server_signature):
                raise SaslError("SCRAM authentication failed: the server's signature does not verify")
            self.state, self.done = "done", True
            return None
        raise SaslError("Unexpected SASL token: authentication is complete")

    def _server_first(self, message: str) -> bytes:
        attrs = _attributes(message)
        nonce, salt, iterations = attrs.get("r", ""), attrs.get("s"), attrs.get("i", "")
        if not nonce.startswith(self.nonce) or len(nonce) == len(self.nonce) or salt is None:
            raise SaslError("Invalid SCRAM server first message")
        if not iterations.isdigit() or int(iterations) < SCRAM_ITERATIONS:
            raise SaslError(f"Invalid SCRAM server first message: iterations {iterations!r}")
        try:
            salt_bytes = base64.b64decode(salt, validate=True)
        except ValueError:
            raise SaslError("Invalid SCRAM server first message: bad salt") from None
        salted = hashlib.pbkdf2_hmac(self.algo, self._password.encode(), salt_bytes, int(iterations))
        client_key = hmac.digest(salted, b"Client Key", self.algo)
        stored_key = hashlib.new(self.algo, client_key).digest()
        without_proof = f"c={base64.b64encode(_GS2_HEADER.encode()).decode()},r={nonce}"
        auth_message = f"{self.client_first_bare},{message},{without_proof}".encode()
        proof = _xor(client_key, hmac.digest(stored_key, auth_message, self.algo))
        self.server_signature = hmac.digest(hmac.digest(salted, b"Server Key", self.algo),
                                            auth_message, self.algo)
        self.state = "server-final"
        return f"{without_proof},p={base64.b64encode(proof).decode()}".encode()

    def __repr__(self):
        return f"<{self.name} client {self.username!r}>"  # never the password


def client_mechanism(name: str, username: str, password: str) -> ClientMechanism:
    if name == "PLAIN":
        return _PlainClient(username, password)
    if name in _HASHES:
        return _ScramClient(name, username, password)
    raise ValueError(f"unknown SASL mechanism {name!r} (herd has {', '.join(MECHANISMS)})")
