"""The HTTP port's optional credential (``http_auth_file``): bearer tokens and basic-auth users, stored
as SHA-256 hashes. One line each, ``#`` starts a comment::

    bearer <sha256-hex of the token>
    basic <user> <sha256-hex of the password>

Make a hash with ``printf %s TOKEN | sha256sum``. A request is let in when its ``Authorization``
header's token (``Bearer``) or user and password (``Basic``) match a line; the hashes are compared
with ``hmac.compare_digest``."""
from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re

_HEX64 = re.compile(r"[0-9a-fA-F]{64}")


class HttpAuthError(ValueError):
    """The file cannot be used: one line saying why (the daemon's StartError)."""


class HttpAuth:
    def __init__(self, bearer: list[bytes], basic: dict[str, bytes]):
        self.bearer = bearer  # SHA-256 digests of the tokens
        self.basic = basic  # user -> SHA-256 digest of the password

    @classmethod
    def parse(cls, text: str, where: str = "http_auth_file") -> HttpAuth:
        bearer: list[bytes] = []
        basic: dict[str, bytes] = {}
        for no, raw in enumerate(text.splitlines(), 1):
            line = raw.split("#", 1)[0].strip()
            if not line:
                continue
            parts = line.split()
            kind = parts[0].lower()
            if kind == "bearer" and len(parts) == 2:
                digest = parts[1]
            elif kind == "basic" and len(parts) == 3:
                user, digest = parts[1], parts[2]
                if ":" in user:
                    raise HttpAuthError(f"{where} line {no}: a basic-auth user name cannot hold ':'")
                if user in basic:
                    raise HttpAuthError(f"{where} line {no}: user {user!r} listed twice")
            else:
                raise HttpAuthError(f"{where} line {no}: expected 'bearer <sha256-hex>' or "
                                    f"'basic <user> <sha256-hex>'")
            if not _HEX64.fullmatch(digest):
                raise HttpAuthError(f"{where} line {no}: not a SHA-256 hex digest (64 hex digits; make one "
                                    f"with: printf %s SECRET | sha256sum)")
            if kind == "bearer":
                bearer.append(bytes.fromhex(digest))
            else:
                basic[user] = bytes.fromhex(digest)
        if not bearer and not basic:
            raise HttpAuthError(f"{where} lists no credential: nobody could use the HTTP port")
        return cls(bearer, basic)

    def allows(self, authorization: str | None) -> bool:
        """Whether an ``Authorization`` header value (None: none sent) matches a line."""
        if not authorization:
            return False
        scheme, _, cred = authorization.strip().partition(" ")
        scheme, cred = scheme.lower(), cred.strip()
        if scheme == "bearer" and cred:
            digest = hashlib.sha256(cred.encode("utf-8", "surrogateescape")).digest()
            ok = False
            for known in self.bearer:  # every line compared: the time does not tell which matched
                ok |= hmac.compare_digest(digest, known)
            return ok
        if scheme == "basic" and cred:
            try:
                user, sep, password = base64.b64decode(cred, validate=True).partition(b":")
                name = user.decode("utf-8")
            except (binascii.Error, ValueError):  # UnicodeDecodeError too
                return False
            if not sep:
                return False
            known = self.basic.get(name)
            digest = hashlib.sha256(password).digest()
            return hmac.compare_digest(digest, known if known is not None else bytes(32)) and known is not None
        return False


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
