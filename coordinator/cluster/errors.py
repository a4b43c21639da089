"""The cluster's typed failures. Every message is one line and never holds the store's password.

Phase 2 maps them onto the store interface's failure types (``coordinator.store``):
:class:`StoreUnavailableError` is an I/O failure (make it a ``ShardFailedError``; the runtime
answers COORDINATOR_NOT_AVAILABLE, retriable, and reloads the shard with a fresh epoch once the
database is back instead of keeping it down until a restart), :class:`OwnershipLostError` is
fencing (make it a ``ShardFencedError``: the shard is not ours any more, answer NOT_COORDINATOR and
unload it).
"""
from __future__ import annotations


class ClusterError(Exception):
    """Base class of herd's cluster errors."""


class StoreConnectError(ClusterError):
    """The database cannot be reached, refuses the login or does not exist (start-up: one line)."""


class SchemaError(ClusterError):
    """The database's herd schema cannot be used by this node (a newer version, another
    ``offsets_partitions``); nothing was changed."""


class DuplicateNodeError(ClusterError):
    """Another live node of the cluster already has this ``node_id``."""


class StoreUnavailableError(ClusterError):
    """A write (or load) failed in or on the way to the database: retriable. The shard's later
    writes fail too until it is loaded again, so no write lands after one that failed."""

    def __init__(self, message: str, shard_id: int | None = None):
        super().__init__(message)
        self.shard_id = self.shard = shard_id


class OwnershipLostError(ClusterError):
    """The shard's lease is not held with the epoch the write carried (another node took it, or it
    lapsed): the write was refused by the database and nothing of it was written."""

    def __init__(self, shard_id: int, epoch: int | None = None, message: str | None = None):
        super().__init__(message or f"shard {shard_id}: ownership lost (epoch {epoch} is not the lease's)")
        self.shard_id = self.shard = shard_id  # .shard: the Store interface's errors' name
        self.epoch = epoch
