"""The pure decisions of cluster membership: which shards a node takes or gives up, and until when it
may serve a shard (self-fencing). No I/O, no clock reads: callers pass ``now`` (monotonic ms).

Sharing (:func:`targets`, :func:`plan`): the live nodes, sorted by node_id, share the shards evenly
(``n // k`` each, the first ``n % k`` nodes one more). A node over its share releases the excess
(its highest shard ids), a node under it takes free shards (no owner, or a lease lapsed by the
database's clock) up to its share, each node starting its search at a different point of the ring
so that nodes taking shards at once rarely want the same ones (a lost race costs one retry: the
acquisition is conditional in the database). A shard whose owner has died but whose lease has not
lapsed is nobody's to take until it does. When a node joins, the others are over their share and
release; when one leaves or dies, the others are under theirs and take its shards.

Self-fencing (:class:`LeaseTable`): a lease taken or renewed by a request SENT at local monotonic
time ``t`` expires in the database at (its clock at execution) + ``lease_ms``, which is no earlier
than ``t + lease_ms`` in real time. The node serves the shard only until ``t + lease_ms - margin``:
it stops before the lease can lapse, whatever happens to its renewals. The margin covers the clocks'
rate difference and the time between deciding to stop and having stopped.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


def targets(live_nodes: Iterable[int], num_shards: int) -> dict[int, int]:
    """node_id -> how many shards it should own."""
    nodes = sorted(set(live_nodes))
    if not nodes:
        return {}
    base, extra = divmod(num_shards, len(nodes))
    return {node: base + (1 if rank < extra else 0) for rank, node in enumerate(nodes)}


@dataclass(frozen=True)
class LeaseView:
    """A lease row as the database showed it: ``owner`` (None = free) and whether it is still live
    by the database's clock (``expires_at > now()``)."""
    owner: int | None
    live: bool


@dataclass(frozen=True)
class Plan:
    release: tuple[int, ...] = ()
    acquire: tuple[int, ...] = ()


def plan(node_id: int, live_nodes: Sequence[int], leases: Mapping[int, LeaseView], num_shards: int,
         mine: Iterable[int] | None = None) -> Plan:
    """What ``node_id`` should do now. ``mine``: the shards it holds (default: the live leases the
    view names it the owner of)."""
    share = targets(live_nodes, num_shards)
    held = sorted(mine) if mine is not None else sorted(
        s for s, v in leases.items() if v.owner == node_id and v.live)
    target = share.get(node_id, 0)
    if len(held) > target:
        return Plan(release=tuple(held[target:]))
    want = target - len(held)
    if want <= 0:
        return Plan()
    free = [s for s in range(num_shards) if s not in held and _free(leases.get(s))]
    if not free:
        return Plan()
    ranks = sorted(share)
    start = (ranks.index(node_id) * num_shards) // len(ranks) if node_id in share else 0
    free.sort(key=lambda s: (s - start) % num_shards)
    return Plan(acquire=tuple(free[:want]))


def _free(view: LeaseView | None) -> bool:
    return view is None or view.owner is None or not view.live


class LeaseTable:
    """The leases this node holds and until when it may serve each (monotonic ms)."""

    def __init__(self, lease_ms: int, margin_ms: int | None = None, renew_every_ms: int | None = None):
        if lease_ms <= 0:
            raise ValueError("lease_ms must be positive")
        self.lease_ms = lease_ms
        self.margin_ms = margin_ms if margin_ms is not None else max(lease_ms // 5, 1)
        self.renew_every_ms = renew_every_ms if renew_every_ms is not None else max(lease_ms // 3, 1)
        if not 0 < self.margin_ms < lease_ms:
            raise ValueError("margin_ms must be between 0 and lease_ms")
        if not 0 < self.renew_every_ms < lease_ms - self.margin_ms:
            raise ValueError("renew_every_ms must be shorter than lease_ms - margin_ms")
        self._epochs: dict[int, int] = {}
        self._until: dict[int, int] = {}

    def held(self) -> dict[int, int]:
        """shard -> epoch of every lease held (serving or not yet found expired)."""
        return dict(self._epochs)

    def epoch(self, shard: int) -> int | None:
        return self._epochs.get(shard)

    def granted(self, shard: int, epoch: int, sent_ms: int) -> None:
        """The database gave us ``shard`` with ``epoch`` by a request sent at ``sent_ms``."""
        self._epochs[shard] = epoch
        self._until[shard] = sent_ms + self.lease_ms - self.margin_ms

    def renewed(self, shards: Iterable[int], sent_ms: int) -> None:
        until = sent_ms + self.lease_ms - self.margin_ms
        for shard in shards:
            if shard in self._epochs:
                self._until[shard] = max(self._until[shard], until)

    def drop(self, shard: int) -> int | None:
        """Forget ``shard`` (released or lost); -> its epoch."""
        self._until.pop(shard, None)
        return self._epochs.pop(shard, None)

    def valid(self, shard: int, now_ms: int) -> bool:
        """May this node serve ``shard`` now?"""
        until = self._until.get(shard)
        return until is not None and now_ms < until

    def until(self, shard: int) -> int | None:
        return self._until.get(shard)

    def expired(self, now_ms: int) -> list[int]:
        """Drop and return the shards this node must stop serving now (their renewal is overdue)."""
        out = sorted(s for s, until in self._until.items() if now_ms >= until)
        for shard in out:
            self.drop(shard)
        return out

    def next_deadline(self) -> int | None:
        return min(self._until.values(), default=None)
