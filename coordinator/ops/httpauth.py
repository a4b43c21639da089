"""The HTTP port's optional credential (``http_auth_file``): bearer tokens and basic-auth users, stored
as SHA-256 hashes. One line each, ``#`` starts a comment::

    bearer <sha256-hex of the token> [<principal>]
    basic <user> <sha256-hex of the password>

Make a hash with ``printf %s TOKEN | sha256sum``. A request is let in when its ``Authorization``
header's token (``Bearer``) or user and password (``Basic``) match a line; the hashes are compared
with ``hmac.compare_digest``. With ``authorizer = acl`` the request is then the principal's
(:meth:`HttpAuth.principal`): a basic user ``alice`` is ``User:alice``, a bearer token the principal
its line names (``User:prometheus``), or ``User:ANONYMOUS`` when it names none."""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")
ANONYMOUS = "User:ANONYMOUS"  # an unnamed bearer token's principal


class HttpAuthError(ValueError):
    """The file cannot be used: one line saying why (the daemon's StartError)."""


class HttpAuth:
    def __init__(self, bearer: list[bytes], basic: dict[str, bytes], bearer_principals: list | None = None):
        self.bearer = bearer  # SHA-256 digests of the tokens
        self.basic = basic  # user -> SHA-256 digest of the password
        # the principal each bearer line names (None: none, User:ANONYMOUS)
        self.bearer_principals = bearer_principals if bearer_principals is not None else [None] * len(bearer)

    @classmethod
    def parse(cls, text: str, where: str = "http_auth_file") -> HttpAuth:
        bearer: list[bytes] = []
        principals: list[str | None] = []
        basic: dict[str, bytes] = {}
        for no, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            kind = parts[0].lower()
            if kind == "bearer" and len(parts) in (2, 3):
                digest = parts[1]
                named = parts[2] if len(parts) == 3 else None
                if named is not None:
                    ptype, sep, pname = named.partition(":")
                    if not sep or not ptype or not pname:
                        raise HttpAuthError(f"{where} line {no}: {named!r} is not a principal (Kafka's form: "
                                            f"User:name)")
            elif kind == "basic" and len(parts) == 3:
                user, digest = parts[1], parts[2]
                if ":" in user:
                    raise HttpAuthError(f"{where} line {no}: a basic-auth user name cannot hold ':'")
                if user in basic:
                    raise HttpAuthError(f"{where} line {no}: user {user!r} listed twice")
            else:
                raise HttpAuthError(f"{where} line {no}: expected 'bearer <sha256-hex> [User:name]' or "
                                    f"'basic <user> <sha256-hex>'")
            if not _HEX64.fullmatch(digest):
                raise HttpAuthError(f"{where} line {no}: not a SHA-256 hex digest (64 hex digits; make one "
                                    f"with: printf %s SECRET | sha256sum)")
            if kind == "bearer":
                bearer.append(bytes.fromhex(digest))
                principals.append(named)
            else:
                basic[user] = bytes.fromhex(digest)
        if not bearer and not basic:
            raise HttpAuthError(f"{where} lists no credential: nobody could use the HTTP port")
        return cls(bearer, basic, principals)

    def allows(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value (None: none sent) matches a line."""
        return self.principal(authorization) is not None

    def principal(self, authorization: str | None) -> str | None:
        """The principal of an ``Authorization`` header value that matches a line (``User:<basic
        user>``, a bearer line's principal or ``User:ANONYMOUS``), None when none matches."""
        if not authorization:
            return None
        scheme, _, cred = authorization.strip().partition(" ")
        scheme, cred = scheme.lower(), cred.strip()
        if scheme == "bearer" and cred:
            digest = hashlib.sha256(cred.encode("utf-8", "surrogateescape")).digest()
            found = -1
            for i, known in enumerate(self.bearer):  # every line compared: the time does not tell which matched
                if hmac.compare_digest(digest, known) and found < 0:
                    found = i
            if found < 0:
                return None
            return self.bearer_principals[found] or ANONYMOUS
        if scheme == "basic" and cred:
            try:
                user, sep, password = base64.b64decode(cred, validate=True).partition(b":")
                name = user.decode("utf-8")
            except (binascii.Error, ValueError):  # UnicodeDecodeError too
                return None
            if not sep:
                return None
            known = self.basic.get(name)
            digest = hashlib.sha256(password).digest()
            if hmac.compare_digest(digest, known if known is not None else bytes(32)) and known is not None:
                return "User:" + name
            return None
        return None


def load_http_auth(path: str) -> HttpAuth:
    """Read and check ``http_auth_file``: HttpAuthError (one line) when it cannot be used."""
    where = f"http_auth_file {path}"
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError:
        raise HttpAuthError(f"{where}: no such file") from None
    except PermissionError:
        raise HttpAuthError(f"{where}: permission denied") from None
    except IsADirectoryError:
        raise HttpAuthError(f"{where}: is a directory") from None
    except UnicodeDecodeError:
        raise HttpAuthError(f"{where}: not UTF-8 text") from None
    except OSError as exc:
        raise HttpAuthError(f"{where}: {exc.strerror}") from None
    return HttpAuth.parse(text, where)
