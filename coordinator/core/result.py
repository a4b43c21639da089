"""The one shape of every core operation's answer: :class:`Result`."""
from __future__ import annotations

from coordinator.core.responses import as_error
from protocol import errors

__all__ = ["Result", "NO_SHARDS"]

NO_SHARDS: frozenset = frozenset()


class Result:
    """What one core operation (a request, a timer tick, a shard that stops serving, shutdown)
    produced. Handlers append to one as they go (:meth:`reply`, ``writes.append``).

    ``writes``: ``(shard_id, key, value)`` to append durably, in order (value None: a tombstone).
    ``replies``: ``(token, response)``: send only after all of this result's writes are durable.
    ``shards``: shards whose earlier pending writes these replies must not overtake (a reply that
    reads state, e.g. a follower's SyncGroup after the leader's or an OffsetFetch after a commit,
    must not be sent before that state is durable).
    ``later``: None, or the rest of the operation, cut into slices so that one big group does not
    hold the event loop (issue 31): callables ``(now_ms, wall_ms) -> Result``, each run in a later
    loop turn (by the runtime; the tests' harnesses run them at once or when told), in order; a
    slice's own Result may carry ``later`` again. A slice checks that what it answers for is still
    current (the same group object, the same generation) and does nothing otherwise."""

    __slots__ = ("writes", "replies", "shards", "later")

    def __init__(self, writes: list | None = None, replies: list | None = None, shards: frozenset = NO_SHARDS):
        self.writes: list[tuple[int, bytes, bytes | None]] = [] if writes is None else writes
        self.replies: list[tuple[object, object]] = [] if replies is None else replies
        self.shards = shards
        self.later: list | None = None

    def defer(self, more) -> None:
        """Leave ``more(now_ms, wall_ms) -> Result`` for a later loop turn (see ``later``)."""
        if self.later is None:
            self.later = [more]
        else:
            self.later.append(more)

    def reply(self, token, response) -> None:
        self.replies.append((token, response))

    def failure_replies(self, error_code: int = errors.COORDINATOR_NOT_AVAILABLE) -> list[tuple]:
        """The replies to send instead of :attr:`replies` when the writes failed: each response
        replaced by the same API's answer with ``error_code`` (valid at every version)."""
        return [(token, as_error(resp, error_code)) for token, resp in self.replies]

    def __eq__(self, other) -> bool:
        if not isinstance(other, Result):
            return NotImplemented
        return (self.writes, self.replies, self.shards) == (other.writes, other.replies, other.shards)

    __hash__ = None

    def __repr__(self) -> str:
        return f"Result(writes={self.writes!r}, replies={self.replies!r}, shards={set(self.shards)!r})"
