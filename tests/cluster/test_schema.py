"""The cluster schema against a real PostgreSQL: created once, version-checked, partitions checked,
and one clear line for a login the database refuses or a database that does not exist."""
import asyncio

import asyncpg
import pytest

from coordinator.cluster.db import connect
from coordinator.cluster.errors import SchemaError, StoreConnectError
from coordinator.cluster.schema import SCHEMA_VERSION, TABLES, ensure_schema
from coordinator.cluster.url import parse_store_url
from tools.postgres import PASSWORD


async def _snapshot(conn):
    tables = [r[0] for r in await conn.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY 1")]
    meta = dict(await conn.fetchrow("SELECT * FROM herd_meta")) if "herd_meta" in tables else None
    leases = await conn.fetchval("SELECT count(*) FROM herd_leases") if "herd_leases" in tables else None
    return tables, meta, leases


async def test_created_on_an_empty_database_then_checked(pg):
    conn = await connect(parse_store_url(pg.url))
    try:
        info = await ensure_schema(conn, 12, "c-1")
        assert (info.created, info.schema_version, info.offsets_partitions, info.cluster_id) == \
            (True, SCHEMA_VERSION, 12, "c-1")
        tables, meta, leases = await _snapshot(conn)
        assert tables == sorted(TABLES) and leases == 12
        assert (meta["schema_version"], meta["offsets_partitions"]) == (SCHEMA_VERSION, 12)
        rows = await conn.fetch("SELECT shard, owner, epoch, expires_at FROM herd_leases ORDER BY shard")
        assert [tuple(r) for r in rows] == [(s, None, 0, None) for s in range(12)]
        again = await ensure_schema(conn, 12, "other")
        assert (again.created, again.cluster_id) == (False, "c-1")
        assert await _snapshot(conn) == (tables, meta, leases)
    finally:
        await conn.close()


async def test_nodes_starting_at_once_create_it_once(pg):
    url = parse_store_url(pg.url)
    conns = [await connect(url) for _ in range(3)]
    try:
        infos = await asyncio.gather(*(ensure_schema(c, 5) for c in conns))
        assert sorted(i.created for i in infos) == [False, False, True]
        assert await conns[0].fetchval("SELECT count(*) FROM herd_leases") == 5
    finally:
        for c in conns:
            await c.close()


async def test_newer_schema_refused_changing_nothing(pg):
    conn = await connect(parse_store_url(pg.url))
    try:
        await ensure_schema(conn, 4)
        await conn.execute("UPDATE herd_meta SET schema_version = $1", SCHEMA_VERSION + 1)
        before = await _snapshot(conn)
        with pytest.raises(SchemaError) as info:
            await ensure_schema(conn, 4)
        assert str(info.value) == (f"the database's herd schema is version {SCHEMA_VERSION + 1}, newer than "
                                   f"this herd reads (up to {SCHEMA_VERSION}): run a newer herd; nothing was changed")
        assert await _snapshot(conn) == before
    finally:
        await conn.close()


async def test_other_offsets_partitions_refused_with_one_line(pg):
    conn = await connect(parse_store_url(pg.url))
    try:
        await ensure_schema(conn, 50)
        with pytest.raises(SchemaError) as info:
            await ensure_schema(conn, 30)
        assert str(info.value) == ("offsets_partitions is 30 here but 50 in the cluster's database: every node "
                                   "of a cluster must use 50")
        assert await conn.fetchval("SELECT count(*) FROM herd_leases") == 50
    finally:
        await conn.close()


async def test_foreign_tables_without_meta_are_left_alone(pg):
    conn = await connect(parse_store_url(pg.url))
    try:
        await conn.execute("CREATE TABLE herd_nodes (x int)")
        with pytest.raises(SchemaError, match="herd tables \\(herd_nodes\\) but no herd_meta row"):
            await ensure_schema(conn, 3)
        assert await conn.fetchval("SELECT to_regclass('herd_meta')") is None
    finally:
        await conn.close()


@pytest.mark.parametrize("make_url, expected", [
    (lambda pg: pg.server.tcp_url(pg.name, password="wrong-pw"),
     "the database refused the login of user 'herd' (wrong password)"),
    (lambda pg: pg.url.replace("postgres@", "nobody@"),
     "the database refused the login of user 'nobody' (role \"nobody\" does not exist)"),
    (lambda pg: pg.server.tcp_url("no_such_db"),
     "database 'no_such_db' does not exist (create it first)"),
])
async def test_refused_login_and_missing_database_are_one_line(pg, make_url, expected):
    url = parse_store_url(make_url(pg))
    with pytest.raises(StoreConnectError) as info:
        await connect(url)
    message = str(info.value)
    assert message == f"store {url.redacted()}: {expected}"
    assert "\n" not in message and PASSWORD not in message and "wrong-pw" not in message


async def test_unreachable_database_is_one_line(pg):
    import socket

    with socket.socket() as s:  # a loopback port with nobody listening
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = parse_store_url(f"postgresql://herd:{PASSWORD}@127.0.0.1:{port}/x")
    with pytest.raises(StoreConnectError) as info:
        await connect(url)
    assert str(info.value) == (f"store postgresql://herd:***@127.0.0.1:{port}/x: cannot reach the database at "
                               f"127.0.0.1:{port} (Connection refused)")


async def test_password_login_works(pg):
    conn = await connect(parse_store_url(pg.tcp_url))
    try:
        assert await conn.fetchval("SELECT current_user") == "herd"
    finally:
        await conn.close()
    assert isinstance(conn, asyncpg.Connection)
