"""The cluster's typed failures. Every message is one line and never holds the store's password.

The two failures of a write are the store interface's types (``coordinator.store``), so the
runtime needs no cluster-specific code to tell them apart: :class:`StoreUnavailableError` is a
``ShardFailedError`` (an I/O failure: the runtime answers COORDINATOR_NOT_AVAILABLE, retriable,
and asks the lease manager to reload the shard with a fresh epoch once the database is back
instead of keeping it down until a restart), :class:`OwnershipLostError` is a
``ShardFencedError`` (the shard is not ours any more: NOT_COORDINATOR, unloaded).
"""
from __future__ import annotations

import asyncpg

from coordinator.store import ShardFailedError, ShardFencedError

# What a database call can raise when the database, the connection or the driver's state is not
# well (asyncpg's InternalClientError, "another operation is in progress", is not an InterfaceError)
DB_ERRORS = (asyncpg.PostgresError, asyncpg.InterfaceError, asyncpg.InternalClientError, OSError, TimeoutError)


class ClusterError(Exception):
    """Base class of herd's cluster errors."""


class StoreConnectError(ClusterError):
    """The database cannot be reached, refuses the login or does not exist (start-up: one line)."""


class SchemaError(ClusterError):
    """The database's herd schema cannot be used by this node (a newer version, another
    ``offsets_partitions``); nothing was changed."""


class DuplicateNodeError(ClusterError):
    """Another live node of the cluster already has this ``node_id``."""


class StoreUnavailableError(ClusterError, ShardFailedError):
    """A write (or load) failed in or on the way to the database: retriable. The shard's later
    writes fail too until it is loaded again, so no write lands after one that failed."""

    def __init__(self, message: str, shard_id: int | None = None):
        Exception.__init__(self, message)
        self.shard_id = self.shard = shard_id
        self.cause = None


class OwnershipLostError(ClusterError, ShardFencedError):
    """The shard's lease is not held with the epoch the write carried (another node took it, or it
    lapsed): the write was refused by the database and nothing of it was written."""

    def __init__(self, shard_id: int, epoch: int | None = None, message: str | None = None):
        Exception.__init__(self, message or f"shard {shard_id}: ownership lost (epoch {epoch} is not the lease's)")
        self.shard_id = self.shard = shard_id  # .shard: the Store interface's errors' name
        self.epoch = epoch
