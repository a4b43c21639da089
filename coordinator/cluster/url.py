"""The ``store`` setting's PostgreSQL URL: parsed once, shown only redacted.

Accepted forms (libpq's URI syntax, the parts herd needs)::

    postgresql://USER[:PASSWORD]@HOST[:PORT]/DB
    postgresql://USER[:PASSWORD]@[:PORT]/DB?host=/socket/dir[&port=PORT]
    postgresql://USER@HOST:PORT/DB?sslmode=require

``postgres://`` is taken too. User, password and database are percent-decoded. PORT defaults to 5432.
Query parameters: ``host`` (a unix-socket directory, absolute), ``port``, ``sslmode`` (disable, allow,
prefer, require, verify-ca, verify-full) and ``application_name``; anything else is refused (a typo
would otherwise be silently ignored).

The password never leaves this object except through :meth:`PgURL.connect_kwargs`: ``str()``,
``repr()`` and :meth:`PgURL.redacted` show ``***`` in its place, and every parse error names the URL
in its redacted form (or not at all).
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from urllib.parse import parse_qsl, unquote

__all__ = ["PgURL", "StoreURLError", "parse_store_url", "redact"]

SCHEMES = ("postgresql://", "postgres://")
SSLMODES = ("disable", "allow", "prefer", "require", "verify-ca", "verify-full")
_PARAMS = ("host", "port", "sslmode", "application_name")


class StoreURLError(ValueError):
    """An unparsable store URL; the message is one line and carries no password."""


@dataclass(frozen=True)
class PgURL:
    user: str
    password: str | None = field(repr=False)
    host: str  # a host name / address, or an absolute unix-socket directory
    port: int
    database: str
    sslmode: str | None = None
    application_name: str | None = None

    @property
    def unix_socket(self) -> bool:
        return self.host.startswith("/")

    def redacted(self) -> str:
        """The URL for logs and messages: the password replaced by ``***``."""
        auth = _quote(self.user) + (":***" if self.password is not None else "")
        params = []
        if self.unix_socket:
            where = f":{self.port}"
            params.append(f"host={self.host}")
        else:
            host = f"[{self.host}]" if ":" in self.host else self.host
            where = f"{host}:{self.port}"
        if self.sslmode:
            params.append(f"sslmode={self.sslmode}")
        if self.application_name:
            params.append(f"application_name={self.application_name}")
        query = ("?" + "&".join(params)) if params else ""
        return f"postgresql://{auth}@{where}/{_quote(self.database)}{query}"

    def connect_kwargs(self) -> dict:
        """Keyword arguments for ``asyncpg.connect`` (no DSN string: nothing is parsed twice)."""
        kw: dict = {"host": self.host, "port": self.port, "user": self.user, "database": self.database}
        if self.password is not None:
            kw["password"] = self.password
        if self.sslmode is not None and not self.unix_socket:
            kw["ssl"] = self.sslmode
        if self.application_name:
            kw["server_settings"] = {"application_name": self.application_name}
        return kw

    def __str__(self) -> str:
        return self.redacted()


def _quote(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._~-]", lambda m: "".join(f"%{b:02X}" for b in m.group().encode()), text)


# Everything between the user's ':' and the last '@': a password with an unencoded '@' or '/' is
# hidden whole (over-hiding a query that has an '@' is the safe side).
_PASSWORD_IN_URL = re.compile(r"(://[^:/?#@]*:)(.*)(@)", re.DOTALL)


def redact(text: str) -> str:
    """``text`` with the password of any ``scheme://user:password@`` in it replaced by ``***``:
    for showing a value that may not even parse."""
    return _PASSWORD_IN_URL.sub(lambda m: m.group(1) + "***" + m.group(3), str(text))


def _port(text: str, what: str) -> int:
    if not text.isdigit() or not 1 <= int(text) <= 65535:
        raise StoreURLError(f"{what} must be a port number 1-65535, got {text!r}")
    return int(text)


def parse_store_url(text: str) -> PgURL:
    """Parse a ``postgresql://`` URL; raise :class:`StoreURLError` (one line, redacted)."""
    raw = str(text).strip()
    shown = redact(raw)
    scheme = next((s for s in SCHEMES if raw.lower().startswith(s)), None)
    if scheme is None:
        raise StoreURLError(f"store must be 'file' or postgresql://USER[:PASSWORD]@HOST:PORT/DB, got {shown!r}")
    rest = raw[len(scheme):]
    rest, _, query = rest.partition("?")
    if "#" in query or "#" in rest:
        raise StoreURLError(f"store URL {shown!r}: a '#' must be percent-encoded (%23)")
    authority, slash, path = rest.partition("/")
    if "@" in path:
        raise StoreURLError(f"store URL {shown!r}: a '/' or '@' in the user or password must be "
                            "percent-encoded (%2F, %40)")
    if not slash or not path:
        raise StoreURLError(f"store URL {shown!r} names no database (postgresql://USER@HOST:PORT/DB)")
    if "/" in path:
        raise StoreURLError(f"store URL {shown!r}: the database name has a '/' (percent-encode it as %2F)")
    userinfo, at, hostport = authority.rpartition("@")
    if not at or not userinfo:
        raise StoreURLError(f"store URL {shown!r} names no user (postgresql://USER@HOST:PORT/DB)")
    user, colon, password = userinfo.partition(":")
    user = unquote(user)
    if not user:
        raise StoreURLError(f"store URL {shown!r} names no user (postgresql://USER@HOST:PORT/DB)")
    password = unquote(password) if colon else None
    if password == "":
        password = None
    # host[:port], [v6]:port
    host, port_text = hostport, ""
    if hostport.startswith("["):
        end = hostport.find("]")
        if end < 0:
            raise StoreURLError(f"store URL {shown!r}: unclosed '[' in the host")
        host, tail = hostport[1:end], hostport[end + 1:]
        if tail and not tail.startswith(":"):
            raise StoreURLError(f"store URL {shown!r}: unexpected {tail!r} after the host")
        port_text = tail[1:]
    elif ":" in hostport:
        host, _, port_text = hostport.rpartition(":")
    host = unquote(host)
    port = _port(port_text, f"store URL {shown!r}: the port") if port_text else None
    params: dict[str, str] = {}
    try:
        pairs = parse_qsl(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise StoreURLError(f"store URL {shown!r}: cannot read the query string") from None
    for key, value in pairs:
        if key not in _PARAMS:
            raise StoreURLError(f"store URL {shown!r}: unknown parameter {key!r} (herd takes "
                                f"{', '.join(_PARAMS)})")
        if key in params:
            raise StoreURLError(f"store URL {shown!r}: parameter {key!r} given twice")
        params[key] = value
    if "host" in params:
        socket_dir = params["host"]
        if not socket_dir.startswith("/"):
            raise StoreURLError(f"store URL {shown!r}: host= must be an absolute unix-socket directory, "
                                f"got {socket_dir!r}")
        if host:
            raise StoreURLError(f"store URL {shown!r} names a host twice ({host!r} and host={socket_dir})")
        host = socket_dir
    if not host:
        raise StoreURLError(f"store URL {shown!r} names no host (postgresql://USER@HOST:PORT/DB, or "
                            "?host=/socket/dir)")
    if "port" in params:
        if port is not None:
            raise StoreURLError(f"store URL {shown!r} names a port twice")
        port = _port(params["port"], f"store URL {shown!r}: port=")
    sslmode = params.get("sslmode")
    if sslmode is not None and sslmode not in SSLMODES:
        raise StoreURLError(f"store URL {shown!r}: sslmode must be one of {', '.join(SSLMODES)}, got {sslmode!r}")
    database = unquote(path)
    return PgURL(user=user, password=password, host=host, port=port or 5432, database=database,
                 sslmode=sslmode, application_name=params.get("application_name") or None)
