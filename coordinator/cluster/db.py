"""Connecting to the store's database, with every failure turned into one clear line."""
from __future__ import annotations

import os
import socket

import asyncpg

from coordinator.cluster.errors import DB_ERRORS, StoreConnectError
from coordinator.cluster.url import PgURL

CONNECT_TIMEOUT_S = 10.0


def _where(url: PgURL) -> str:
    return f"{url.host} (unix socket, port {url.port})" if url.unix_socket else f"{url.host}:{url.port}"


def describe_connect_error(url: PgURL, exc: BaseException) -> str:
    """One line for a failed connection attempt (no password: the URL is shown redacted)."""
    shown = url.redacted()
    if isinstance(exc, asyncpg.InvalidPasswordError):
        return f"store {shown}: the database refused the login of user {url.user!r} (wrong password)"
    if isinstance(exc, asyncpg.InvalidAuthorizationSpecificationError):
        return f"store {shown}: the database refused the login of user {url.user!r} ({_first_line(exc)})"
    if isinstance(exc, asyncpg.InvalidCatalogNameError):
        return f"store {shown}: database {url.database!r} does not exist (create it first)"
    if isinstance(exc, asyncpg.TooManyConnectionsError):
        return f"store {shown}: the database has no free connection ({_first_line(exc)})"
    if isinstance(exc, asyncpg.CannotConnectNowError):
        return f"store {shown}: the database is not accepting connections yet ({_first_line(exc)})"
    if isinstance(exc, TimeoutError):
        return f"store {shown}: no answer from {_where(url)} within {CONNECT_TIMEOUT_S:g} s"
    if isinstance(exc, socket.gaierror):
        return f"store {shown}: cannot resolve host {url.host!r} ({exc.strerror or exc})"
    if isinstance(exc, OSError):
        reason = os.strerror(exc.errno) if exc.errno else (exc.strerror or _first_line(exc))
        return f"store {shown}: cannot reach the database at {_where(url)} ({reason})"
    return f"store {shown}: cannot connect ({type(exc).__name__}: {_first_line(exc)})"


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


async def connect(url: PgURL, *, timeout: float = CONNECT_TIMEOUT_S, **kwargs) -> asyncpg.Connection:
    """A new connection, or :class:`StoreConnectError` with one line. ``kwargs`` go to asyncpg
    (e.g. ``command_timeout``)."""
    try:
        return await asyncpg.connect(**{**url.connect_kwargs(), **kwargs}, timeout=timeout)
    except DB_ERRORS as exc:
        raise StoreConnectError(describe_connect_error(url, exc)) from None
