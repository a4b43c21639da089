"""A Kafka client's TLS and SASL settings, its TLS context, and a sans-IO TLS layer.

Shared by every herd program that is a Kafka client: the thin client (``client/``), the admin tool
(``admin/``, via :mod:`protocol.client_properties`) and the daemon's data-cluster reader
(``coordinator/datacluster.py``, the same file as ``herd groups --command-config``). It lives in
``protocol/`` so that those three import one implementation without importing each other. Pure but
for one thing: building the TLS context reads the certificate files (once, at configuration time).

Settings have librdkafka's names (``security.protocol``, ``ssl.ca.location``, ``sasl.username``, ...;
see ``SECURITY_DEFAULTS``). ``parse_security`` checks them together and raises one ``ValueError``
for a setting that is unknown, malformed, or contradicts another (SASL without a username, an
``ssl.*`` file with a protocol that does not use TLS, a certificate file that does not load).

``TlsLayer`` wraps ``ssl.SSLObject`` over two ``MemoryBIO``: the owner feeds it the bytes read from
the socket and gets the decrypted bytes back, writes plaintext into it and sends what
``data_to_send`` returns. Every byte it decrypts is handed back at once, so a socket that is not
readable means there is nothing to decrypt either: a selector loop needs no other signal.

``split_servers`` reads a bootstrap list (``HOST:PORT,...``, listener URLs such as
``SASL_SSL://host:9093`` too) for the admin tool and the data-cluster reader, each of which words
its own error line from the :class:`BadServerList` it raises.

Passwords (``sasl.password``, ``ssl.key.password``) are kept out of every repr.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass, field

__all__ = [
    "BadServerList",
    "PROTOCOLS",
    "SECURITY_DEFAULTS",
    "SecurityConfig",
    "TlsLayer",
    "parse_security",
    "split_servers",
    "tls_failure",
]

PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")  # as protocol.sasl.MECHANISMS

SECURITY_DEFAULTS: dict[str, object] = {
    "security.protocol": "PLAINTEXT",
    "ssl.ca.location": None,  # None: the system's trusted CAs
    "ssl.certificate.location": None,  # the client's certificate (for ssl_client_auth)
    "ssl.key.location": None,
    "ssl.key.password": None,
    "ssl.endpoint.identification.algorithm": "https",  # https: check the host name; none: do not
    "enable.ssl.certificate.verification": True,
    "sasl.mechanism": "PLAIN",
    "sasl.username": None,
    "sasl.password": None,
}
# librdkafka's own spelling of sasl.mechanism
ALIASES = {"sasl.mechanisms": "sasl.mechanism"}
_SSL_FILES = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.key.password")


@dataclass
class SecurityConfig:
    protocol: str = "PLAINTEXT"
    ca_location: str | None = None
    certificate_location: str | None = None
    key_location: str | None = None
    key_password: str | None = field(default=None, repr=False)
    check_hostname: bool = True
    verify_certificates: bool = True
    sasl_mechanism: str = "PLAIN"
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)

    @property
    def uses_tls(self) -> bool:
        return self.protocol in ("SSL", "SASL_SSL")

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in ("SASL_PLAINTEXT", "SASL_SSL")

    def sasl_credentials(self) -> tuple[str, str, str] | None:
        """``(mechanism, username, password)`` when SASL is on."""
        if not self.uses_sasl:
            return None
        return self.sasl_mechanism, self.sasl_username or "", self.sasl_password or ""

    def ssl_context(self) -> ssl.SSLContext | None:
        """The client's TLS context (built once), or None without TLS."""
        if not self.uses_tls:
            return None
        ctx = self.__dict__.get("_context")
        if ctx is None:
            ctx = self.__dict__["_context"] = _build_context(self)
        return ctx

    def tls_layer(self, host: str) -> TlsLayer | None:
        ctx = self.ssl_context()
        return None if ctx is None else TlsLayer(ctx, host)

    def __getstate__(self):  # an SSLContext does not pickle: rebuilt where it is used
        state = dict(self.__dict__)
        state.pop("_context", None)
        return state


def _text(key: str, value) -> str | None:
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ValueError(f"{key} must be a string, not {type(value).__name__}")
    return value


def _bool(key: str, value) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ValueError(f"{key} must be a boolean, not {value!r}")


def parse_security(values: dict) -> SecurityConfig:
    """``values``: Kafka names (missing ones take ``SECURITY_DEFAULTS``) -> a checked config."""
    v = dict(SECURITY_DEFAULTS)
    for key, value in values.items():
        name = ALIASES.get(key, key)
        if name not in SECURITY_DEFAULTS:
            raise ValueError(f"unknown security setting {key!r}")
        v[name] = value
    proto = str(v["security.protocol"] or "PLAINTEXT").upper()
    if proto not in PROTOCOLS:
        raise ValueError(f"security.protocol must be one of {', '.join(PROTOCOLS)}, not {v['security.protocol']!r}")
    algo = str(v["ssl.endpoint.identification.algorithm"] or "none").lower()
    if algo not in ("https", "none"):
        raise ValueError(f"ssl.endpoint.identification.algorithm must be https or none, not {algo!r}")
    mech = str(v["sasl.mechanism"] or "PLAIN").upper()
    cfg = SecurityConfig(
        protocol=proto,
        ca_location=_text("ssl.ca.location", v["ssl.ca.location"]),
        certificate_location=_text("ssl.certificate.location", v["ssl.certificate.location"]),
        key_location=_text("ssl.key.location", v["ssl.key.location"]),
        key_password=_text("ssl.key.password", v["ssl.key.password"]),
        check_hostname=algo == "https",
        verify_certificates=_bool("enable.ssl.certificate.verification", v["enable.ssl.certificate.verification"]),
        sasl_mechanism=mech,
        sasl_username=_text("sasl.username", v["sasl.username"]),
        sasl_password=v["sasl.password"],
    )
    if cfg.sasl_password is not None and not isinstance(cfg.sasl_password, str):
        raise ValueError("sasl.password must be a string")
    if cfg.uses_sasl:
        if mech not in SASL_MECHANISMS:
            raise ValueError(f"sasl.mechanism must be one of {', '.join(SASL_MECHANISMS)}, not {mech!r}")
        if cfg.sasl_username is None or cfg.sasl_password is None:
            raise ValueError(f"security.protocol {proto} needs sasl.username and sasl.password")
    else:
        given = [k for k in ("sasl.username", "sasl.password") if v[k] is not None]
        if given:
            raise ValueError(f"{' and '.join(given)} set but security.protocol is {proto}: use SASL_SSL or "
                             f"SASL_PLAINTEXT to authenticate")
    if not cfg.uses_tls:
        given = [k for k in _SSL_FILES if v[k]]
        if given:
            raise ValueError(f"{', '.join(given)} set but security.protocol is {proto}: use SSL or SASL_SSL "
                             f"for TLS")
    else:
        if cfg.key_location and not cfg.certificate_location:
            raise ValueError("ssl.key.location needs ssl.certificate.location (the client's certificate)")
        if cfg.key_password and not cfg.certificate_location:
            raise ValueError("ssl.key.password needs ssl.certificate.location and ssl.key.location")
        if cfg.check_hostname and not cfg.verify_certificates:
            raise ValueError("enable.ssl.certificate.verification=false needs "
                             "ssl.endpoint.identification.algorithm=none")
        cfg.ssl_context()  # a file that does not load fails here, not at the first connection
    return cfg


def _build_context(cfg: SecurityConfig) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # TLS 1.2+, verifies certificates and host names
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = cfg.check_hostname
    ctx.verify_mode = ssl.CERT_REQUIRED if cfg.verify_certificates else ssl.CERT_NONE
    try:
        if cfg.ca_location:
            ctx.load_verify_locations(cafile=cfg.ca_location)
        else:
            ctx.load_default_certs(ssl.Purpose.SERVER_AUTH)
    except (OSError, ssl.SSLError) as exc:
        raise ValueError(f"ssl.ca.location {cfg.ca_location!r}: cannot load the CA certificates: "
                         f"{exc.strerror or exc}") from None
    if cfg.certificate_location:
        try:
            ctx.load_cert_chain(cfg.certificate_location, cfg.key_location,
                                cfg.key_password if cfg.key_password is not None else _no_password)
        except _KeyNeedsPassword:
            raise ValueError(f"ssl.key.location {cfg.key_location or cfg.certificate_location!r}: the key is "
                             "encrypted: set ssl.key.password") from None
        except (OSError, ssl.SSLError) as exc:
            raise ValueError(
                f"ssl.certificate.location {cfg.certificate_location!r} / ssl.key.location "
                f"{cfg.key_location!r}: cannot load the client certificate and key: {exc.strerror or exc}"
            ) from None
    return ctx


class _KeyNeedsPassword(Exception):
    pass


def _no_password():
    """Without a callback OpenSSL would ask for an encrypted key's pass phrase on the terminal."""
    raise _KeyNeedsPassword


class TlsLayer:
    """One client TLS session over memory buffers (see the module docstring)."""

    def __init__(self, context: ssl.SSLContext, server_hostname: str):
        self._in = ssl.MemoryBIO()
        self._out = ssl.MemoryBIO()
        self._obj = context.wrap_bio(self._in, self._out, server_side=False, server_hostname=server_hostname)
        self._pending = bytearray()  # plaintext written before the handshake finished
        self.handshake_done = False
        self.closed = False  # the peer ended the TLS session (close_notify or EOF)

    def start(self) -> None:
        """Begin the handshake (the ClientHello is then in ``data_to_send``)."""
        self._handshake()

    def _handshake(self) -> None:
        try:
            self._obj.do_handshake()
        except ssl.SSLWantReadError:
            return
        self.handshake_done = True
        if self._pending:
            data = bytes(self._pending)
            self._pending.clear()
            self._obj.write(data)

    def write(self, data: bytes) -> None:
        if not data:
            return
        if not self.handshake_done:
            self._pending += data
        else:
            self._obj.write(data)

    def feed(self, data: bytes) -> bytes:
        """Bytes read from the socket (``b""``: EOF) -> the plaintext they complete. Raises
        ``ssl.SSLError`` when the handshake or the session fails."""
        if data:
            self._in.write(data)
        else:
            self._in.write_eof()
        if not self.handshake_done:
            self._handshake()
            if not self.handshake_done:
                return b""
        out = bytearray()
        while True:
            try:
                chunk = self._obj.read(256 * 1024)
            except ssl.SSLWantReadError:
                break
            except ssl.SSLZeroReturnError:
                self.closed = True
                break
            if not chunk:
                self.closed = True
                break
            out += chunk
        return bytes(out)

    def data_to_send(self) -> bytes:
        return self._out.read()


def tls_failure(exc: ssl.SSLError, host: str, port: int) -> tuple[bool, str]:
    """``(fatal, message)`` for a TLS error while setting up a connection. Fatal: the certificate
    did not verify, or the broker refused ours -- trying again cannot help."""
    where = f"{host}:{port}"
    if isinstance(exc, ssl.SSLCertVerificationError):
        return True, (f"TLS certificate verification of {where} failed: "
                      f"{exc.verify_message or exc.reason} (check ssl.ca.location and "
                      f"ssl.endpoint.identification.algorithm)")
    reason = exc.reason or ""
    if "ALERT" in reason:
        return True, (f"the broker at {where} refused the TLS handshake ({reason.lower()}): check "
                      f"ssl.certificate.location / ssl.key.location")
    if "WRONG_VERSION_NUMBER" in reason or "RECORD_LAYER" in reason:
        return True, f"the broker at {where} does not speak TLS ({reason.lower()}): check security.protocol"
    return False, f"TLS failed with {where}: {exc}"


class BadServerList(ValueError):
    """A bootstrap list that does not parse: ``named`` is the protocol a listener URL ``item``
    names when it is not the expected one; else ``item`` is an invalid address (None: the list is
    empty)."""

    def __init__(self, item: str | None, named: str | None = None):
        self.item, self.named = item, named
        super().__init__(f"{item!r} names {named}" if named else
                         f"invalid address {item!r}: expected HOST:PORT" if item is not None else "no servers")


def split_servers(text: str, protocol: str = "PLAINTEXT", default_port: int | None = None) -> list[tuple[str, int]]:
    """``HOST:PORT[,HOST:PORT]`` (``[v6]:PORT``; a listener URL ``PROTO://HOST:PORT`` whose
    protocol must be ``protocol``) -> ``[(host, port), ...]``. A HOST alone takes ``default_port``
    if given. Raises :class:`BadServerList`."""
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        scheme, sep, rest = item.partition("://")
        if sep:  # a listener URL, e.g. SASL_SSL://host:9093
            if scheme.upper() != protocol:
                raise BadServerList(item, scheme.upper())
            item = rest
        if item.startswith("["):
            host, _, port = item[1:].partition("]")
            port = port.removeprefix(":")
        else:
            host, sep, port = item.rpartition(":")
            if not sep and default_port is not None:
                host, port = item, str(default_port)
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise BadServerList(item)
        out.append((host, int(port)))
    if not out:
        raise BadServerList(None)
    return out
