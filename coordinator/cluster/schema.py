"""The cluster's tables in PostgreSQL: created on an empty database, versioned like the log format.

Tables (all named ``herd_*`` so that herd can share a database with other software)::

    herd_meta     one row: schema_version, offsets_partitions, cluster_id, created_at.
                  A node whose herd reads an older schema version is refused with nothing changed;
                  a node started with another offsets_partitions is refused with one line.
    herd_nodes    node_id (PK), incarnation (a uuid per process start), advertised host/port, rack,
                  started_at, heartbeat_at, expires_at. A node is live while expires_at > now()
                  (the database's clock); it heartbeats by moving expires_at on.
    herd_leases   shard (PK, 0..offsets_partitions-1, every row made with the schema), owner
                  (node_id, NULL = free), incarnation (the owner's), epoch, expires_at (the
                  database's clock), acquired_at. ``epoch`` grows by one on every change of owner
                  (an acquisition; a renewal keeps it); a release sets owner NULL and keeps it.
    herd_records  (shard, key) PK, value, seq: the latest value of each key of a shard, as the
                  file log keeps it after compaction. A write is an upsert (a tombstone deletes the
                  row), so there is nothing to compact: dead row versions are PostgreSQL's (MVCC,
                  autovacuum). ``seq`` orders the rows by their last write; a shard loads ORDER BY
                  seq, which is the file log's replay order after compaction.
    herd_topics   name (PK), record (the catalog's topic value bytes), created_at: the topic
                  catalog, shared by every node (the file store keeps it in shard 0's log).
    herd_acls     key (PK: the ACL record's key, coordinator.core.auth.acls), created_at: the ACLs,
                  shared by every node (read again every lease renewal). Added to a schema v1
                  database that lacks it when a node starts (CREATE TABLE IF NOT EXISTS).

Creation and every check run in one transaction under an advisory lock, so nodes starting at once
on an empty database create the schema once.
"""
from __future__ import annotations

from dataclasses import dataclass

import asyncpg

from coordinator.cluster.errors import SchemaError

SCHEMA_VERSION = 1
_LOCK_KEY = 0x68657264  # "herd": pg_advisory_xact_lock key serialising schema creation

TABLES = ("herd_meta", "herd_nodes", "herd_leases", "herd_records", "herd_topics", "herd_acls")

_CREATE = """
CREATE TABLE herd_meta (
    singleton boolean PRIMARY KEY DEFAULT true CHECK (singleton),
    schema_version integer NOT NULL,
    offsets_partitions integer NOT NULL CHECK (offsets_partitions > 0),
    cluster_id text NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
CREATE TABLE herd_nodes (
    node_id integer PRIMARY KEY,
    incarnation uuid NOT NULL,
    host text NOT NULL,
    port integer NOT NULL,
    rack text,
    started_at timestamptz NOT NULL DEFAULT now(),
    heartbeat_at timestamptz NOT NULL DEFAULT now(),
    expires_at timestamptz NOT NULL
);
CREATE TABLE herd_leases (
    shard integer PRIMARY KEY CHECK (shard >= 0),
    owner integer,
    incarnation uuid,
    epoch bigint NOT NULL DEFAULT 0,
    expires_at timestamptz,
    acquired_at timestamptz,
    CHECK ((owner IS NULL) = (expires_at IS NULL) AND (owner IS NULL) = (incarnation IS NULL))
);
CREATE TABLE herd_records (
    shard integer NOT NULL,
    key bytea NOT NULL,
    value bytea NOT NULL,
    seq bigint NOT NULL,
    PRIMARY KEY (shard, key)
);
CREATE TABLE herd_topics (
    name text PRIMARY KEY,
    record bytea NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);
"""
_CREATE_ACLS = """
CREATE TABLE IF NOT EXISTS herd_acls (
    key bytea PRIMARY KEY,
    created_at timestamptz NOT NULL DEFAULT now()
);
"""


@dataclass(frozen=True)
class SchemaInfo:
    schema_version: int
    offsets_partitions: int
    cluster_id: str
    created: bool  # this call created the schema


async def ensure_schema(conn: asyncpg.Connection, offsets_partitions: int, cluster_id: str = "herd-cluster",
                        ) -> SchemaInfo:
    """Create the schema on a database without one; check it on a database with one. Raises
    :class:`SchemaError` (one line, nothing changed) for a newer schema version or another
    ``offsets_partitions``."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", _LOCK_KEY)
        exists = await conn.fetchval("SELECT to_regclass('herd_meta') IS NOT NULL")
        if not exists:
            present = await conn.fetch("SELECT c.relname FROM pg_class c "
                                       "WHERE c.relname = ANY($1::text[]) AND pg_table_is_visible(c.oid)",
                                       list(TABLES))
            if present:
                raise SchemaError(f"the database has herd tables ({', '.join(r[0] for r in present)}) "
                                  "but no herd_meta row: not a herd schema this node can use; refusing to touch it")
            try:
                await conn.execute(_CREATE + _CREATE_ACLS)
            except asyncpg.InsufficientPrivilegeError as exc:
                raise SchemaError(f"cannot create herd's tables: {str(exc).splitlines()[0]} "
                                  "(grant CREATE on the schema, or create them as an owner)") from None
            await conn.execute("INSERT INTO herd_meta (schema_version, offsets_partitions, cluster_id) "
                               "VALUES ($1, $2, $3)", SCHEMA_VERSION, offsets_partitions, cluster_id)
            await conn.execute("INSERT INTO herd_leases (shard) SELECT generate_series(0, $1::integer - 1)",
                               offsets_partitions)
            return SchemaInfo(SCHEMA_VERSION, offsets_partitions, cluster_id, True)
        row = await conn.fetchrow("SELECT schema_version, offsets_partitions, cluster_id FROM herd_meta")
        if row is None:
            raise SchemaError("the database's herd_meta table is empty: not a herd schema this node can use")
        if row["schema_version"] == SCHEMA_VERSION \
                and not await conn.fetchval("SELECT to_regclass('herd_acls') IS NOT NULL"):
            try:  # a v1 database made before the ACLs: the table is added, nothing else changes
                await conn.execute(_CREATE_ACLS)
            except asyncpg.InsufficientPrivilegeError as exc:
                raise SchemaError(f"cannot create herd_acls: {str(exc).splitlines()[0]}") from None
        return check_meta(row["schema_version"], row["offsets_partitions"], row["cluster_id"], offsets_partitions)


def check_meta(schema_version: int, stored_partitions: int, cluster_id: str, offsets_partitions: int) -> SchemaInfo:
    if schema_version > SCHEMA_VERSION:
        raise SchemaError(f"the database's herd schema is version {schema_version}, newer than this herd "
                          f"reads (up to {SCHEMA_VERSION}): run a newer herd; nothing was changed")
    if stored_partitions != offsets_partitions:
        raise SchemaError(f"offsets_partitions is {offsets_partitions} here but {stored_partitions} in the "
                          f"cluster's database: every node of a cluster must use {stored_partitions}")
    return SchemaInfo(schema_version, stored_partitions, cluster_id, False)
