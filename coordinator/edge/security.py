"""The listener's security: a TLS context and the SASL users, built once at start-up.

``security_protocol`` names Kafka's listener protocols: PLAINTEXT, SSL (TLS), SASL_PLAINTEXT
(SASL, no TLS: the password crosses the network in the clear with PLAIN) and SASL_SSL. herd has one
listener. What a SASL connection may send before it has authenticated, and how it authenticates,
is in :mod:`coordinator.edge.server`; the mechanisms are :mod:`protocol.sasl`.

Every problem with the files is one line (:class:`SecurityError`), raised before the port opens.
"""
from __future__ import annotations

import os
import ssl
import stat
from dataclasses import dataclass

from coordinator import logging_setup
from protocol.sasl import Users

log = logging_setup.get("herd.security")


class SecurityError(Exception):
    """A TLS or SASL file that cannot be used: one line for the operator."""


@dataclass
class Security:
    protocol: str
    ssl_context: ssl.SSLContext | None
    users: Users | None
    mechanisms: list[str]

    @property
    def sasl(self) -> bool:
        return self.users is not None


def load(config) -> Security:
    tls = config.security_protocol in ("SSL", "SASL_SSL")
    sasl = config.security_protocol.startswith("SASL_")
    return Security(
        protocol=config.security_protocol,
        ssl_context=server_context(config) if tls else None,
        users=load_users(config.sasl_users_file) if sasl else None,
        mechanisms=config.enabled_mechanisms,
    )


class _KeyNeedsPassword(Exception):
    pass


def _no_password():
    """OpenSSL asks for an encrypted key's pass phrase on the terminal unless given a callback: a
    daemon must fail with one line instead of waiting for keyboard input."""
    raise _KeyNeedsPassword


def server_context(config) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # Kafka's ssl.enabled.protocols: TLSv1.2,TLSv1.3
    try:
        ctx.load_cert_chain(config.ssl_certfile, config.ssl_keyfile,
                            config.ssl_key_password if config.ssl_key_password is not None else _no_password)
    except _KeyNeedsPassword:
        raise SecurityError("the private key is encrypted: set ssl_key_password (HERD_SSL_KEY_PASSWORD)") from None
    except FileNotFoundError as exc:
        raise SecurityError(f"cannot read {exc.filename or config.ssl_certfile}: no such file") from None
    except PermissionError as exc:
        raise SecurityError(f"cannot read {exc.filename or config.ssl_certfile}: permission denied") from None
    except ssl.SSLError as exc:
        what = "ssl_certfile/ssl_keyfile" if config.ssl_keyfile else "ssl_certfile"
        raise SecurityError(f"{what}: not a usable PEM certificate and private key "
                            f"({exc.reason or exc}); a key with a password needs ssl_key_password") from None
    if config.ssl_cafile:
        try:
            ctx.load_verify_locations(cafile=config.ssl_cafile)
        except (OSError, ssl.SSLError) as exc:
            reason = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
            raise SecurityError(f"ssl_cafile {config.ssl_cafile}: {reason}") from None
    ctx.verify_mode = {"none": ssl.CERT_NONE, "requested": ssl.CERT_OPTIONAL,
                       "required": ssl.CERT_REQUIRED}[config.ssl_client_auth]
    return ctx


def load_users(path: str) -> Users:
    try:
        with open(path, encoding="utf-8") as f:
            st = os.fstat(f.fileno())
            text = f.read()
    except FileNotFoundError:
        raise SecurityError(f"sasl_users_file {path}: no such file") from None
    except PermissionError:
        raise SecurityError(f"sasl_users_file {path}: permission denied") from None
    except IsADirectoryError:
        raise SecurityError(f"sasl_users_file {path}: is a directory") from None
    except UnicodeDecodeError:
        raise SecurityError(f"sasl_users_file {path}: not UTF-8 text") from None
    try:
        users = Users.parse(text, f"sasl_users_file {path}")
    except ValueError as exc:
        raise SecurityError(str(exc)) from None
    if not len(users):
        raise SecurityError(f"sasl_users_file {path} lists no users: nobody could connect")
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("the SASL users file is readable by other users; chmod 600 it", path=path)
    return users
