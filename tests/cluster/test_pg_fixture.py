"""The PostgreSQL fixture itself: a fresh empty database per test, both URL forms reach it."""
import asyncpg


async def test_fresh_database_over_socket_and_tcp(pg):
    conn = await asyncpg.connect(pg.url)
    try:
        assert await conn.fetchval("SELECT current_database()") == pg.name
        assert await conn.fetchval("SELECT count(*) FROM pg_tables WHERE schemaname = 'public'") == 0
        await conn.execute("CREATE TABLE mine (x int)")
    finally:
        await conn.close()
    conn = await asyncpg.connect(pg.tcp_url)
    try:
        assert await conn.fetchval("SELECT current_user") == "herd"
        assert await conn.fetchval("SELECT to_regclass('mine') IS NOT NULL")
    finally:
        await conn.close()


async def test_each_test_gets_its_own_database(pg):
    conn = await asyncpg.connect(pg.url)
    try:
        assert await conn.fetchval("SELECT to_regclass('mine')") is None
    finally:
        await conn.close()
