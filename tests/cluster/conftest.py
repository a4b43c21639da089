"""A real PostgreSQL for the cluster tests: one server per session, a fresh database per test."""
from __future__ import annotations

import atexit
from types import SimpleNamespace

import pytest

from tools.postgres import PgServer


@pytest.fixture(scope="session")
def pg_server():
    server = PgServer()
    atexit.register(server.cleanup)  # a test run that dies still stops its server
    server.start()
    yield server
    server.cleanup()


@pytest.fixture
def pg(pg_server):
    """This test's own empty database: ``pg.url`` (unix socket, trust), ``pg.tcp_url`` (password),
    ``pg.name``, ``pg.server``."""
    name = pg_server.create_database()
    return SimpleNamespace(name=name, url=pg_server.url(name), tcp_url=pg_server.tcp_url(name), server=pg_server)
