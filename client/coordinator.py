"""The consumer-group state machine (Kafka's AbstractCoordinator + ConsumerCoordinator), pure.

No sockets, no threads, no clock: every input takes ``now`` (monotonic seconds) and the machine
answers with *actions* collected in ``take_actions()``:

- ``Connect(conn, host, port)`` / ``Disconnect(conn)`` -- open or drop a logical connection;
  ``conn`` is ``"bootstrap"`` (any broker: FindCoordinator), ``"coordinator"``, or ``"leave"``
  (a second coordinator connection, opened only by ``close`` to send LeaveGroup when a JoinGroup or
  SyncGroup is parked on the first: the coordinator answers a connection's requests in order, so a
  LeaveGroup queued behind it would wait for the whole rebalance).
- ``Send(conn, request, version, tag, timeout)`` -- one request; exactly one
  ``on_response(conn, tag, response_or_exception, now)`` must follow (a stale tag is ignored).
- ``Emit(event)`` -- something for the user's thread: ``PartitionsRevoked`` (must be acknowledged
  with ``ack(seq)`` before the group goes on), ``PartitionsAssigned``, ``PartitionsLost``,
  ``JoinError`` (not fatal: raised once by the user's poll; the member joins again after a backoff),
  ``GroupFailed``.
- ``Reply(handle, value, error)`` -- the answer to a user request (commit, committed, close).
- ``Stop()`` -- closed; nothing more will happen.

Inputs: ``subscribe``, ``poll``, ``ack``, ``commit``, ``fetch_committed``, ``close`` (user side);
``on_connected``, ``on_disconnected``, ``on_response``, ``tick`` (network side); ``note_poll``
(the time of a user poll that needed no command, for the poll timer). Every step of a rebalance
that does not need the user (rejoin on a heartbeat's REBALANCE_IN_PROGRESS, SyncGroup after
JoinGroup, a new JoinGroup after a failed one, a metadata change) is taken by the network side on
its own; only revocation waits for the user's ``ack``, and a rejoin after a poll timeout for ``poll``.
``next_deadline()`` says when ``tick`` is next needed; ``snapshot()`` is an immutable summary.

``close`` works as Kafka's ``ConsumerCoordinator.close``: commits (and ``committed()`` lookups)
still pending go out first, within the close's deadline, while the member keeps heartbeating; then a
dynamic member sends LeaveGroup and waits for its answer, up to the same deadline; then ``Stop``.
Whatever is still unanswered at the deadline fails with ``KafkaTimeoutError``.

Member states (Kafka's MemberState)::

    UNJOINED --JoinGroup sent--> PREPARING_REBALANCE --joined--> COMPLETING_REBALANCE
        ^                               |                              |  SyncGroup ok
        +-- generation reset, leave ----+------------------------------+--> STABLE
    STABLE --rejoin needed (heartbeat REBALANCE_IN_PROGRESS, subscription or metadata change,
             cooperative revocation)--> (revoke callbacks acknowledged) --> PREPARING_REBALANCE

A JoinGroup or SyncGroup that fails without resetting the generation (a dropped connection, a
coordinator error, REBALANCE_IN_PROGRESS, ...) leaves the state as it is and only asks for a new
JoinGroup (Kafka's ``requestRejoin``): the member is still rebalancing, keeps its generation and
(cooperative) its partitions, and a commit meanwhile gets ``RebalanceInProgressError``. Only a lost
membership (UNKNOWN_MEMBER_ID, ILLEGAL_GENERATION, a leave) goes back to UNJOINED, where commits get
``CommitFailedError``.

Heartbeats flow in COMPLETING_REBALANCE and STABLE. Revocation is the one place the machine waits
for the user: in the eager protocol every owned partition is revoked before JoinGroup; in the
cooperative protocol (KIP-429) only partitions that move are revoked, after SyncGroup, and the
member rejoins once the user's ``on_partitions_revoked`` has returned. This is what keeps a
partition from being owned twice: nobody else is assigned it until its owner has let go.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from client import errors as cerr
from client.assignors import MemberAssignment, MemberSubscription, create_assignor
from client.config import ClientConfig
from client.heartbeat import INF, Backoff, Heartbeat
from client.types import COOPERATIVE, EAGER, OffsetAndMetadata, TopicPartition
from protocol import errors as codes
from protocol import messages as m
from protocol.consumer import (
    PROTOCOL_TYPE,
    Assignment,
    Subscription,
    SubscriptionTopicPartitions,
    TopicPartitions,
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from protocol.wire import ProtocolError

log = logging.getLogger("herd.client")

__all__ = [
    "ConsumerCoordinator",
    "MemberState",
    "BOOTSTRAP",
    "LEAVER",
    "COORDINATOR",
    "Connect",
    "Disconnect",
    "Send",
    "Emit",
    "Reply",
    "Stop",
    "PartitionsRevoked",
    "PartitionsAssigned",
    "PartitionsLost",
    "GroupFailed",
    "JoinError",
    "Snapshot",
]

BOOTSTRAP = "bootstrap"
COORDINATOR = "coordinator"
LEAVER = "leave"
_CLOSE = "close"  # the ctx of close()'s own LeaveGroup: its answer ends the close

FIND = m.FindCoordinatorRequest.API_KEY
JOIN = m.JoinGroupRequest.API_KEY
SYNC = m.SyncGroupRequest.API_KEY
HEARTBEAT = m.HeartbeatRequest.API_KEY
LEAVE = m.LeaveGroupRequest.API_KEY
COMMIT = m.OffsetCommitRequest.API_KEY
FETCH = m.OffsetFetchRequest.API_KEY
METADATA = m.MetadataRequest.API_KEY
SUBSCRIPTION_VERSION = 3

# JoinGroup/SyncGroup/Heartbeat errors after which the member cannot go on: another process owns
# its group.instance.id (KIP-345: fatal), it may not use the group, the group id is invalid, or the
# broker lacks what its configuration needs (static membership). Kafka's poll raises them too.
FATAL_GROUP_ERRORS = frozenset(
    {
        codes.FENCED_INSTANCE_ID,
        codes.GROUP_AUTHORIZATION_FAILED,
        codes.INVALID_GROUP_ID,
        codes.UNSUPPORTED_VERSION,
    }
)
# JoinGroup/SyncGroup errors Kafka's poll raises once, joining again on the next poll (they are not
# fatal there): the group may outgrow them (a member leaves a full group, the members speaking
# another protocol leave, an old static member's session ends) or the broker's configuration may
# change. The member rejoins after a backoff; the user's poll raises the error once (``JoinError``).
REJOIN_ERRORS = frozenset(
    {
        codes.GROUP_MAX_SIZE_REACHED,
        codes.INCONSISTENT_GROUP_PROTOCOL,
        codes.INVALID_SESSION_TIMEOUT,
        codes.UNRELEASED_INSTANCE_ID,
    }
)
COORDINATOR_MOVED = frozenset({codes.NOT_COORDINATOR, codes.COORDINATOR_NOT_AVAILABLE})
_REBALANCE_STEPS = ("join", "leader_metadata", "sync")  # the requests of one rebalance, in order


_REQUIRED = {
    BOOTSTRAP: (FIND,),
    COORDINATOR: (JOIN, SYNC, HEARTBEAT, LEAVE, COMMIT, FETCH, METADATA),
    LEAVER: (LEAVE,),
}


class MemberState(Enum):
    UNJOINED = "unjoined"
    PREPARING_REBALANCE = "preparing"
    COMPLETING_REBALANCE = "completing"
    STABLE = "stable"


# -- actions ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Connect:
    conn: str
    host: str
    port: int


@dataclass(frozen=True)
class Disconnect:
    conn: str
    reason: str = ""


@dataclass(frozen=True)
class Send:
    conn: str
    request: Any
    version: int
    tag: int
    timeout: float


@dataclass(frozen=True)
class Emit:
    event: Any


@dataclass(frozen=True)
class Reply:
    handle: Any
    value: Any = None
    error: BaseException | None = None


@dataclass(frozen=True)
class Stop:
    pass


# -- events for the user's thread ------------------------------------------------------------------
@dataclass(frozen=True)
class PartitionsRevoked:
    """Run ``on_partitions_revoked(partitions)``, then ``ack(seq)``. If the membership epoch moved on
    meanwhile (``epoch`` differs from the snapshot's), the partitions were lost instead."""

    seq: int
    partitions: frozenset
    epoch: int


@dataclass(frozen=True)
class PartitionsAssigned:
    seq: int
    added: frozenset
    assignment: frozenset
    generation: int
    epoch: int = 0  # the membership epoch this assignment belongs to


@dataclass(frozen=True)
class PartitionsLost:
    seq: int
    partitions: frozenset
    epoch: int = 0  # the membership epoch after the loss


@dataclass(frozen=True)
class JoinError:
    """A JoinGroup failed with an error the client does not expect: raised once by the user's
    poll (as Kafka's poll raises it); the member joins again after a backoff."""

    seq: int
    error: BaseException


@dataclass(frozen=True)
class GroupFailed:
    seq: int
    error: BaseException


@dataclass(frozen=True)
class Snapshot:
    state: str
    generation: int
    member_id: str
    leader: bool
    assignment: frozenset
    stable: bool
    epoch: int
    events: int
    subscribed: bool
    error: BaseException | None
    closed: bool
    coordinator: tuple | None
    protocol: str
    rejoin_reason: str = ""
    # Since when no coordinator connection has been ready (monotonic; None while one is), and the
    # last failed connection attempt since then ("" if none failed): the user's poll raises
    # NoBrokersAvailableError once that has lasted broker.unreachable.timeout.ms.
    unreachable_since: float | None = None
    connect_failure: str = ""


@dataclass
class _Conn:
    state: str = "down"  # down | connecting | ready
    versions: dict = field(default_factory=dict)
    next_attempt: float = 0.0
    backoff: Backoff | None = None
    target: tuple | None = None  # (host, port) being connected / connected


@dataclass
class _OffsetReq:
    kind: str  # "commit" | "fetch"
    data: dict  # commit: {tp: OffsetAndMetadata}; fetch: {tp: None}
    handle: Any
    deadline: float
    retry_at: float = 0.0
    attempts: int = 0
    last_error: BaseException | None = None
    seq: int = 0  # commit: submission order (see _superseded)
    epoch: int | None = None  # commit: the membership epoch of the user's view (see _send_commit)
    sent_as: tuple | None = None  # commit: (generation, member id) of its first attempt


@dataclass
class _Closing:
    handles: list  # close() calls to answer
    deadline: float
    leave: bool  # a dynamic member sends LeaveGroup once its offset requests are done
    leaving: bool = False  # the LeaveGroup step has begun (offset requests done, or out of time)
    waiting: bool = False  # ...and its answer is awaited


@dataclass
class _Inflight:
    conn: str
    kind: str
    ctx: Any = None
    version: int = 0


class ConsumerCoordinator:
    """See the module docstring. ``rng`` feeds the backoff jitter (tests pass a seeded one)."""

    def __init__(self, config: ClientConfig, now: float, rng=None):
        self.cfg = config
        self.group_id = config.group_id
        self.instance_id = config.group_instance_id
        self.assignors = [create_assignor(s) for s in config.partition_assignment_strategy]
        names = [a.name for a in self.assignors]
        if len(set(names)) != len(names):
            raise ValueError(f"duplicate assignor names in partition.assignment.strategy: {names}")
        self.protocol = (
            COOPERATIVE if all(COOPERATIVE in a.supported_protocols for a in self.assignors) else EAGER
        )
        self._rng = rng
        self._conns = {
            BOOTSTRAP: _Conn(
                backoff=self._backoff(config.reconnect_backoff_ms, config.reconnect_backoff_max_ms)
            ),
            COORDINATOR: _Conn(
                backoff=self._backoff(config.reconnect_backoff_ms, config.reconnect_backoff_max_ms)
            ),
            LEAVER: _Conn(backoff=self._backoff(config.reconnect_backoff_ms, config.reconnect_backoff_max_ms)),
        }
        self._boot_index = 0
        self._last_conn_problem = ""  # why the last connection dropped or could not be made
        # No coordinator reached since (None while the coordinator connection is ready), and the
        # last failed connection attempt since then: what poll's NoBrokersAvailableError reports.
        self._unreachable_since: float | None = now
        self._connect_failure = ""
        self._failing: dict[tuple, list] = {}  # (host, port) -> [failures, first at, last warning at]
        self.coordinator: tuple | None = None  # (node_id, host, port)
        self._find_backoff = self._backoff(config.retry_backoff_ms, config.retry_backoff_max_ms)
        self._next_find = now
        self._join_backoff = self._backoff(config.retry_backoff_ms, config.retry_backoff_max_ms)
        self._next_join = now

        self.state = MemberState.UNJOINED
        self.generation = -1
        self.member_id = ""
        self.leader_id = ""
        self.protocol_name: str | None = None
        self.subscription: frozenset | None = None
        self.owned: frozenset = frozenset()
        self.rejoin_needed = False
        self.rejoin_reason = ""
        self._awaiting_ack: int | None = None
        self._pending_revoke: frozenset = frozenset()  # dropped from owned on ack (eager)
        self._rejoin_after_ack = False
        self._poll_expired = False
        self.heartbeat = Heartbeat(
            config.s("session_timeout_ms"),
            config.s("heartbeat_interval_ms"),
            config.s("max_poll_interval_ms"),
            config.s("retry_backoff_ms"),
            now,
        )
        self._leader_subs: dict[str, MemberSubscription] | None = None
        self._assigned_metadata: dict[str, int] | None = None
        self._group_topics: frozenset = frozenset()
        self._next_metadata_refresh = INF
        self._metadata_inflight = False

        self._pending: list[_OffsetReq] = []
        self._commit_seq = 0
        self._latest_commit: dict[TopicPartition, int] = {}  # partition -> seq of its latest commit
        self._inflight: dict[int, _Inflight] = {}
        self._closing: _Closing | None = None
        self.closed = False
        self.error: BaseException | None = None
        self.epoch = 0
        self._seq = 0
        self._tag = 0
        self._actions: list = []
        self._wake = INF
        self._snap_key: tuple | None = None
        self._snap: Snapshot | None = None

    # ---------------------------------------------------------------------------------------------
    # plumbing
    def _backoff(self, base_ms, max_ms) -> Backoff:
        return Backoff(base_ms / 1000.0, max_ms / 1000.0, rng=self._rng)

    def take_actions(self) -> list:
        out, self._actions = self._actions, []
        return out

    def next_deadline(self) -> float:
        return self._wake

    def _wake_at(self, t: float) -> None:
        if t < self._wake:
            self._wake = t

    def _next_seq(self) -> int:
        self._seq += 1
        return self._seq

    def _emit(self, event) -> None:
        self._actions.append(Emit(event))

    def _send(self, conn: str, kind: str, request, ctx=None, timeout: float | None = None) -> int:
        self._tag += 1
        tag = self._tag
        version = self._version(conn, request.API_KEY)
        self._inflight[tag] = _Inflight(conn, kind, ctx, version)
        self._actions.append(
            Send(
                conn,
                request,
                version,
                tag,
                timeout if timeout is not None else self.cfg.s("request_timeout_ms"),
            )
        )
        return tag

    def _version(self, conn: str, api_key: int) -> int:
        v = self._conns[conn].versions.get(api_key)
        if v is None:
            raise cerr.UnsupportedVersionError(
                f"the broker does not support api key {api_key} in a version this client knows"
            )
        return v

    def _ready(self, conn: str) -> bool:
        return self._conns[conn].state == "ready"

    @property
    def coordinator_ready(self) -> bool:
        return self.coordinator is not None and self._ready(COORDINATOR)

    @property
    def stable(self) -> bool:
        return (
            self.state is MemberState.STABLE
            and not self.rejoin_needed
            and self._awaiting_ack is None
            and self.error is None
        )

    def snapshot(self) -> Snapshot:
        """The current summary; the same object as last time while nothing in it changed (the
        network thread asks after every wake-up and republishes only a new object)."""
        key = (
            self.state,
            self.generation,
            self.member_id,
            self.leader_id,
            self.owned,
            self.stable,
            self.epoch,
            self._seq,
            self.subscription,
            self.error,
            self.closed,
            self.coordinator,
            self.rejoin_reason,
            self._unreachable_since,
            self._connect_failure,
        )
        if key == self._snap_key:
            return self._snap
        self._snap_key = key
        self._snap = Snapshot(
            state=self.state.value,
            generation=self.generation,
            member_id=self.member_id,
            leader=bool(self.member_id) and self.leader_id == self.member_id,
            assignment=self.owned,
            stable=self.stable,
            epoch=self.epoch,
            events=self._seq,
            subscribed=self.subscription is not None,
            error=self.error,
            closed=self.closed,
            coordinator=self.coordinator,
            protocol=self.protocol,
            rejoin_reason=self.rejoin_reason,
            unreachable_since=self._unreachable_since,
            connect_failure=self._connect_failure,
        )
        return self._snap

    # ---------------------------------------------------------------------------------------------
    # user inputs
    def subscribe(self, topics, now: float) -> None:
        topics = frozenset(topics)
        if topics == self.subscription:
            return self._advance(now)
        self.subscription = topics
        self._poll_expired = False
        if not self.coordinator_ready:
            self._unreachable_since = now  # the wait for a coordinator starts with the subscription
            self._connect_failure = ""
        # Subscribing is the user being active: the poll timer starts now (in Kafka the join
        # happens inside poll(), which resets it first; here the join starts at once, and a stale
        # timer would have the fresh member leave again right after joining).
        self.heartbeat.poll(now)
        if self.state is not MemberState.UNJOINED:
            self._request_rejoin("subscription changed")
        self._advance(now)

    def unsubscribe(self, now: float) -> None:
        """Stop group membership. The user side has already run ``on_partitions_revoked``; the owned
        partitions are dropped silently. Dynamic members send LeaveGroup; static members do not."""
        if self.subscription is None:
            return self._advance(now)
        self.subscription = None
        self._poll_expired = False
        self.owned = frozenset()
        if self.state is not MemberState.UNJOINED or self.generation >= 0:
            self._leave_group(now, "the consumer unsubscribed")
        self.rejoin_needed = False
        self._advance(now)

    def poll(self, now: float) -> None:
        """The user polled: restart the poll timer and, after a poll-timeout leave, rejoin."""
        self.heartbeat.poll(now)
        if self._poll_expired:
            self._poll_expired = False
            self.rejoin_reason = "rejoining after the poll interval expired"
        self._advance(now)

    def note_poll(self, when: float) -> None:
        """The user polled at ``when`` without a command (a stable group's poll is answered on the
        user's side): restart the poll timer only. It does not end a poll-timeout leave; a poll then
        finds the group unstable and calls ``poll``. No ``_advance``: the caller's next input does."""
        if when > self.heartbeat.last_poll:
            self.heartbeat.poll(when)

    def ack(self, seq: int, now: float) -> None:
        if seq == self._awaiting_ack:
            self._awaiting_ack = None
            if self._pending_revoke:
                self.owned = self.owned - self._pending_revoke
                self._pending_revoke = frozenset()
            if self._rejoin_after_ack:
                self._rejoin_after_ack = False
                self._request_rejoin("rejoining after revoking partitions (cooperative)")
        self._advance(now)

    def commit(self, offsets: dict, handle, deadline: float, now: float, epoch: int | None = None) -> None:
        """Commit ``offsets``. ``epoch``: the membership epoch of the assignment the user saw when
        committing (None: do not check); a member that lost its partitions since (kicked out,
        generation reset) gets CommitFailedError instead of committing under a later generation."""
        if self.error is not None:
            self._actions.append(Reply(handle, error=self.error))
        elif self._closing is not None or self.closed:
            self._actions.append(Reply(handle, error=cerr.IllegalStateError("the consumer is closing")))
        elif not offsets:
            self._actions.append(Reply(handle, value={}))
        else:
            self._commit_seq += 1
            req = _OffsetReq("commit", dict(offsets), handle, deadline, seq=self._commit_seq, epoch=epoch)
            for tp in req.data:
                self._latest_commit[tp] = req.seq
            self._pending.append(req)
        self._advance(now)

    def fetch_committed(self, partitions, handle, deadline: float, now: float) -> None:
        parts = {TopicPartition(*tp): None for tp in partitions}
        if self.error is not None and isinstance(
            self.error, (cerr.GroupAuthorizationError, cerr.AuthenticationFailedError)
        ):
            self._actions.append(Reply(handle, error=self.error))
        elif self._closing is not None or self.closed:
            self._actions.append(Reply(handle, error=cerr.IllegalStateError("the consumer is closing")))
        elif not parts:
            self._actions.append(Reply(handle, value={}))
        else:
            self._pending.append(_OffsetReq("fetch", parts, handle, deadline))
        self._advance(now)

    def close(self, handle, deadline: float, leave: bool, now: float) -> None:
        """Close (see the module docstring): pending offset requests first, then LeaveGroup (``leave``,
        dynamic members), all within ``deadline``; ``handle`` is answered when done."""
        if self.closed:
            self._actions.append(Reply(handle))
            return
        if self._closing is not None:
            # A second close: answer it together with the first.
            self._closing.handles.append(handle)
            self._closing.deadline = min(self._closing.deadline, deadline)
            return self._advance(now)
        self._closing = _Closing([handle], deadline, leave)
        for req in self._offset_requests():
            req.deadline = min(req.deadline, deadline)
        self._advance(now)

    # ---------------------------------------------------------------------------------------------
    # network inputs
    def on_connected(self, conn: str, versions: dict, now: float) -> None:
        c = self._conns[conn]
        c.state = "ready"
        c.versions = dict(versions)
        c.backoff.reset()
        self._reached(c.target, now)
        if conn == COORDINATOR:
            self._unreachable_since = None
            self._connect_failure = ""
        if conn == LEAVER:
            if self._closing is None:
                return
            if LEAVE in c.versions:
                self._send_leave("the consumer is being closed", LEAVER, ctx=_CLOSE)
            else:
                self._finish_close()
            return
        missing = [k for k in (_REQUIRED[conn]) if k not in c.versions]
        if missing:
            names = ", ".join(m.REQUESTS[k].NAME.removesuffix("Request") for k in missing)
            self._fatal(
                cerr.UnsupportedVersionError(
                    f"the broker at {c.target} supports no version of {names} that this client knows"
                ),
                now,
            )
            return
        if conn == COORDINATOR:
            # A fresh connection to the coordinator: give the session a fresh start.
            self.heartbeat.reset_session_timeout(now)
        self._advance(now)

    def on_disconnected(self, conn: str, now: float, reason: str = "") -> None:
        c = self._conns[conn]
        was = c.state
        c.state = "down"
        c.versions = {}
        c.next_attempt = now + c.backoff.next_delay()
        self._fail_inflight(conn, cerr.KafkaConnectionError(reason or f"{conn} connection lost"), now)
        if conn == LEAVER:  # the close's own connection: close without the LeaveGroup
            self._finish_close()
            return
        self._last_conn_problem = f"{conn} connection: {reason or 'lost'}"
        if conn == COORDINATOR and was == "ready" and self._unreachable_since is None:
            self._unreachable_since = now
        if was != "ready":  # a connection attempt failed
            self._connect_failed(conn, c.target, reason or "connection lost", now)
        if conn == BOOTSTRAP:
            if was != "ready":
                self._boot_index = (self._boot_index + 1) % len(self.cfg.bootstrap_servers)
        else:
            if self.coordinator is not None:
                log.info("coordinator connection lost (%s); looking for the coordinator again", reason)
                self._mark_coordinator_unknown(now, reason or "connection lost", disconnect=False)
        self._advance(now)

    def on_auth_failed(self, conn: str, error: BaseException, now: float) -> None:
        """``conn`` could not authenticate (SASL refused, TLS certificate not verified): as Kafka's
        consumer, fail for good with ``error`` rather than reconnect with the same credentials."""
        c = self._conns[conn]
        c.state = "down"
        c.versions = {}
        c.next_attempt = now + c.backoff.next_delay()
        self._fail_inflight(conn, error, now)
        self._last_conn_problem = f"{conn} connection: {error}"
        if conn == LEAVER:
            self._finish_close()
            return
        self._fatal(error, now)
        self._advance(now)

    def on_response(self, conn: str, tag: int, response, now: float) -> None:
        entry = self._inflight.pop(tag, None)
        if entry is None:
            return self._advance(now)  # stale: its connection was dropped, or the request superseded
        handler = getattr(self, "_on_" + entry.kind)
        handler(entry, response, now)
        self._advance(now)

    def tick(self, now: float) -> None:
        self._advance(now)

    def abandon(self, error: BaseException) -> list:
        """The network thread is going away: fail every outstanding user request."""
        out = []
        for req in self._pending:
            out.append(Reply(req.handle, error=error))
        self._pending.clear()
        for tag, entry in list(self._inflight.items()):
            if entry.kind in ("commit", "fetch"):
                out.append(Reply(self._request_of(entry).handle, error=error))
                del self._inflight[tag]
        if self._closing is not None:
            for h in self._closing.handles:
                out.append(Reply(h))
            self._closing = None
        self.closed = True
        return out

    @staticmethod
    def _request_of(entry: _Inflight) -> _OffsetReq:
        return entry.ctx[0] if entry.kind == "commit" else entry.ctx

    def _offset_requests(self) -> list[_OffsetReq]:
        """Every commit and committed() lookup not yet answered: waiting, or in flight."""
        inflight = [self._request_of(e) for e in self._inflight.values() if e.kind in ("commit", "fetch")]
        return self._pending + inflight

    def _fail_inflight(self, conn: str, error: BaseException, now: float) -> None:
        for tag in [t for t, e in self._inflight.items() if e.conn == conn]:
            entry = self._inflight.pop(tag)
            getattr(self, "_on_" + entry.kind)(entry, error, now)

    # ---------------------------------------------------------------------------------------------
    # the reconcile loop
    def _advance(self, now: float) -> None:
        self._wake = INF
        if self.closed:
            return
        if self._closing is not None:
            self._advance_close(now)
            return
        self._check_timers(now)
        self._ensure_coordinator(now)
        self._maybe_heartbeat(now)
        self._send_offset_requests(now)
        self._maybe_join(now)
        self._maybe_refresh_metadata(now)

    def _needs_coordinator(self) -> bool:
        return (
            (self.error is None and self.subscription is not None)
            or bool(self._pending)
            or any(e.kind in ("commit", "fetch") for e in self._inflight.values())
        )

    def _check_timers(self, now: float) -> None:
        if self.state in (MemberState.COMPLETING_REBALANCE, MemberState.STABLE):
            if self.heartbeat.poll_timeout_expired(now):
                log.warning(
                    "consumer poll timeout expired: the time between polls exceeded "
                    "max.poll.interval.ms (%d); leaving the group",
                    self.cfg.max_poll_interval_ms,
                )
                self._leave_group(now, "consumer poll timeout has expired")
                self._poll_expired = True
                return
            self._wake_at(self.heartbeat.poll_deadline())
            if self.coordinator_ready:
                if self.heartbeat.session_timeout_expired(now):
                    self._mark_coordinator_unknown(now, "session timed out without a heartbeat response")
                else:
                    self._wake_at(self.heartbeat.session_deadline())

    def _ensure_coordinator(self, now: float) -> None:
        if not self._needs_coordinator():
            return
        if self.coordinator is None:
            boot = self._conns[BOOTSTRAP]
            if boot.state == "down":
                if now >= boot.next_attempt:
                    host, port = self.cfg.bootstrap_servers[self._boot_index]
                    boot.state = "connecting"
                    boot.target = (host, port)
                    self._actions.append(Connect(BOOTSTRAP, host, port))
                else:
                    self._wake_at(boot.next_attempt)
                return
            if boot.state != "ready":
                return
            if any(e.kind == "find" for e in self._inflight.values()):
                return
            if now < self._next_find:
                self._wake_at(self._next_find)
                return
            v = self._version(BOOTSTRAP, FIND)
            if v >= 4:
                req = m.FindCoordinatorRequest(key_type=0, coordinator_keys=[self.group_id])
            else:
                req = m.FindCoordinatorRequest(key=self.group_id, key_type=0)
            self._send(BOOTSTRAP, "find", req)
            return
        c = self._conns[COORDINATOR]
        if c.state == "down":
            if now >= c.next_attempt:
                c.state = "connecting"
                c.target = self.coordinator[1:]
                self._actions.append(Connect(COORDINATOR, self.coordinator[1], self.coordinator[2]))
            else:
                self._wake_at(c.next_attempt)

    def _mark_coordinator_unknown(self, now: float, reason: str, disconnect: bool = True) -> None:
        if self.coordinator is None:
            return
        log.info("marking the coordinator %s dead: %s", self.coordinator, reason)
        self.coordinator = None
        self._next_find = now
        c = self._conns[COORDINATOR]
        if c.state == "ready" and self._unreachable_since is None:
            self._unreachable_since = now
        if disconnect and c.state != "down":
            c.state = "down"
            c.versions = {}
            c.next_attempt = now
            self._actions.append(Disconnect(COORDINATOR, reason))
            self._fail_inflight(COORDINATOR, cerr.KafkaConnectionError(f"coordinator dropped: {reason}"), now)

    # -- reaching brokers -----------------------------------------------------------------------
    _WARN_EVERY_S = 10.0  # a broker that stays unreachable: one WARNING at first, then one per this

    def _connect_failed(self, conn: str, target, reason: str, now: float) -> None:
        """A connection attempt to ``target`` failed: say so at WARNING (as Kafka's clients do), once
        at first and then every ``_WARN_EVERY_S`` while it lasts; remember it for poll's error."""
        host, port = target if target else ("?", "?")
        role = "bootstrap server" if conn == BOOTSTRAP else "group coordinator"
        self._connect_failure = f"cannot reach the {role} {host}:{port}: {reason}"
        entry = self._failing.get(target)
        if entry is None:
            self._failing[target] = [1, now, now]
            if conn == BOOTSTRAP:
                log.warning(
                    "%s; retrying (is a broker running at that address?). poll() raises "
                    "NoBrokersAvailableError after broker.unreachable.timeout.ms (%d) without a coordinator",
                    self._connect_failure,
                    self.cfg.broker_unreachable_timeout_ms,
                )
            else:
                # the coordinator went away (a restart, or a cluster node that died): the member
                # looks it up again through the bootstrap servers; in a herd cluster its group moves
                # to a live node once the dead node's lease ends, and nothing is lost meanwhile
                log.warning(
                    "%s; finding the group's coordinator again through the bootstrap servers (a herd "
                    "cluster moves a dead node's groups to a live node once its lease ends)",
                    self._connect_failure,
                )
            return
        entry[0] += 1
        if now - entry[2] >= self._WARN_EVERY_S:
            entry[2] = now
            log.warning("%s; still retrying (%d attempts in %.0fs)", self._connect_failure, entry[0], now - entry[1])

    def _reached(self, target, now: float) -> None:
        entry = self._failing.pop(target, None)
        if entry is not None:
            log.info("reached %s:%s after %d failed attempts in %.1fs", target[0], target[1], entry[0],
                        now - entry[1])

    # -- FindCoordinator ------------------------------------------------------------------------
    def _on_find(self, entry: _Inflight, resp, now: float) -> None:
        if isinstance(resp, BaseException):
            self._find_failed(now, str(resp))
            return
        if entry.version >= 4:
            found = next((c for c in resp.coordinators if c.key == self.group_id), None)
            if found is None:
                self._find_failed(now, "FindCoordinator answered without our group")
                return
            code, node, host, port = found.error_code, found.node_id, found.host, found.port
        else:
            code, node, host, port = resp.error_code, resp.node_id, resp.host, resp.port
        if code == codes.NONE:
            self._find_backoff.reset()
            self.coordinator = (node, host, port)
            c = self._conns[COORDINATOR]
            if c.state != "down" and c.target != (host, port):
                c.state = "down"
                self._actions.append(Disconnect(COORDINATOR, "coordinator moved"))
                self._fail_inflight(COORDINATOR, cerr.KafkaConnectionError("coordinator moved"), now)
            log.info("discovered group coordinator %s:%s (node %s)", host, port, node)
        elif code == codes.GROUP_AUTHORIZATION_FAILED:
            self._fatal(cerr.error_for_code(code), now)
        else:
            self._find_failed(now, codes.error_name(code))

    def _find_failed(self, now: float, why: str) -> None:
        delay = self._find_backoff.next_delay()
        log.debug("FindCoordinator failed (%s); retrying in %.3fs", why, delay)
        self._next_find = now + delay

    # -- heartbeat ------------------------------------------------------------------------------
    def _maybe_heartbeat(self, now: float) -> None:
        if (
            self.state not in (MemberState.COMPLETING_REBALANCE, MemberState.STABLE)
            or not self.coordinator_ready
        ):
            return
        if self.heartbeat.should_heartbeat(now):
            req = m.HeartbeatRequest(
                group_id=self.group_id,
                generation_id=self.generation,
                member_id=self.member_id,
                group_instance_id=self.instance_id,
            )
            self._send(COORDINATOR, "heartbeat", req, ctx=self.generation)
            self.heartbeat.sent_heartbeat(now)
        self._wake_at(self.heartbeat.next_heartbeat_at())

    def _on_heartbeat(self, entry: _Inflight, resp, now: float) -> None:
        if isinstance(resp, BaseException):
            self.heartbeat.fail_heartbeat(now)
            return
        self.heartbeat.received_heartbeat(now)
        code = resp.error_code
        current = entry.ctx == self.generation
        if code == codes.NONE:
            return
        if code == codes.REBALANCE_IN_PROGRESS:
            if self.state is MemberState.STABLE and current:
                self._request_rejoin("the group is rebalancing (heartbeat)")
        elif code in (codes.ILLEGAL_GENERATION, codes.UNKNOWN_MEMBER_ID):
            if current and self.state is not MemberState.UNJOINED:
                self._reset_generation(
                    now,
                    f"heartbeat: {codes.error_name(code)}",
                    reset_member_id=code == codes.UNKNOWN_MEMBER_ID,
                )
        elif code == codes.FENCED_INSTANCE_ID:
            if current:
                self._fatal(cerr.FencedInstanceIdError(), now)
        elif code in COORDINATOR_MOVED:
            self._mark_coordinator_unknown(now, f"heartbeat: {codes.error_name(code)}")
        elif code == codes.GROUP_AUTHORIZATION_FAILED:
            self._fatal(cerr.GroupAuthorizationError(), now)
        else:
            log.warning("heartbeat failed: %s", codes.error_name(code))
            self.heartbeat.fail_heartbeat(now)

    # -- join -----------------------------------------------------------------------------------
    def _request_rejoin(self, reason: str) -> None:
        if not self.rejoin_needed:
            log.info("request rejoin: %s", reason)
        self.rejoin_needed = True
        self.rejoin_reason = reason

    def _maybe_join(self, now: float) -> None:
        if self.subscription is None or self.error is not None or self._poll_expired:
            return
        if self.state is not MemberState.UNJOINED and not self.rejoin_needed:
            return  # stable, or a rebalance under way
        if self._awaiting_ack is not None or not self.coordinator_ready:
            return
        if any(e.kind in _REBALANCE_STEPS for e in self._inflight.values()):
            return  # the rebalance under way ends first (a rejoin asked meanwhile follows it)
        if now < self._next_join:
            self._wake_at(self._next_join)
            return
        # Prepare: give up what must go before joining (on the user's thread; wait for the ack).
        if self.protocol == EAGER:
            revoke = self.owned
        else:
            revoke = frozenset(tp for tp in self.owned if tp.topic not in self.subscription)
        if revoke:
            seq = self._next_seq()
            self._awaiting_ack = seq
            self._pending_revoke = revoke
            self._emit(PartitionsRevoked(seq, revoke, self.epoch))
            return
        self._send_join(now)

    def _send_join(self, now: float) -> None:
        v = self._version(COORDINATOR, JOIN)
        if self.instance_id is not None and v < 5:
            self._fatal(
                cerr.UnsupportedVersionError(
                    "static membership (group.instance.id) needs JoinGroup v5+; the broker supports v%d" % v
                ),
                now,
            )
            return
        topics = sorted(self.subscription)
        owned = self._topic_partitions(self.owned, SubscriptionTopicPartitions)
        protocols = []
        for a in self.assignors:
            sub = Subscription(
                topics=topics,
                user_data=a.subscription_user_data(topics),
                owned_partitions=owned,
                generation_id=self.generation,
                rack_id=self.cfg.client_rack,
            )
            protocols.append(
                m.JoinGroupRequestProtocol(
                    name=a.name, metadata=encode_subscription(sub, SUBSCRIPTION_VERSION)
                )
            )
        reason = self.rejoin_reason or "joining the group"
        req = m.JoinGroupRequest(
            group_id=self.group_id,
            session_timeout_ms=self.cfg.session_timeout_ms,
            rebalance_timeout_ms=self.cfg.max_poll_interval_ms,
            member_id=self.member_id,
            group_instance_id=self.instance_id,
            protocol_type=PROTOCOL_TYPE,
            protocols=protocols,
            reason=reason,
        )
        timeout = max(self.cfg.s("request_timeout_ms"), self.cfg.s("max_poll_interval_ms") + 5.0)
        self._send(COORDINATOR, "join", req, timeout=timeout)
        self.state = MemberState.PREPARING_REBALANCE
        self.rejoin_needed = False
        log.info(
            "joining group %s (member %r, generation %d): %s",
            self.group_id,
            self.member_id,
            self.generation,
            reason,
        )

    @staticmethod
    def _topic_partitions(parts, cls) -> list:
        by_topic: dict[str, list[int]] = {}
        for tp in parts:
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        return [cls(topic=t, partitions=sorted(ps)) for t, ps in sorted(by_topic.items())]

    def _join_failed(self, now: float, why: str, backoff: bool = True) -> None:
        """A step of the rebalance failed: send a new JoinGroup (after a backoff). As Kafka's
        ``requestRejoin``, the state is left as it is: a member in PREPARING_REBALANCE or
        COMPLETING_REBALANCE is still rebalancing (its commits get RebalanceInProgressError), with
        its generation and, cooperative, its partitions; only a generation reset (done by the
        caller) makes it UNJOINED."""
        self._leader_subs = None
        self.rejoin_needed = True
        delay = self._join_backoff.next_delay() if backoff else 0.0
        self._next_join = now + delay
        if why:
            self.rejoin_reason = why
        log.info("rejoining in %.3fs: %s", delay, why)

    def _on_join(self, entry: _Inflight, resp, now: float) -> None:
        if self.state is not MemberState.PREPARING_REBALANCE:
            return
        if isinstance(resp, BaseException):
            self._join_failed(now, f"JoinGroup failed: {resp}")
            return
        code = resp.error_code
        name = codes.error_name(code)
        if code == codes.NONE:
            if entry.version >= 7 and resp.protocol_type not in (None, PROTOCOL_TYPE):
                self._fatal(
                    cerr.InconsistentGroupProtocolError(
                        f"JoinGroup answered protocol type {resp.protocol_type!r}"
                    ),
                    now,
                )
                return
            self._join_backoff.reset()
            self.member_id = resp.member_id
            self.generation = resp.generation_id
            self.protocol_name = resp.protocol_name
            self.leader_id = resp.leader
            self.state = MemberState.COMPLETING_REBALANCE
            self.heartbeat.reset_timeouts(now)
            log.info(
                "joined group %s generation %d as %s (%s), protocol %s",
                self.group_id,
                self.generation,
                self.member_id,
                "leader" if resp.leader == resp.member_id else "follower",
                self.protocol_name,
            )
            if resp.leader == resp.member_id and not resp.skip_assignment:
                self._lead(resp, now)
            else:
                self._send_sync([], now)
        elif code == codes.MEMBER_ID_REQUIRED:
            self.member_id = resp.member_id
            self._join_failed(now, "rejoining with the member id the coordinator gave", backoff=False)
        elif code == codes.UNKNOWN_MEMBER_ID:
            self._reset_generation(now, f"JoinGroup: {name}", reset_member_id=True)
            self._join_failed(now, f"JoinGroup: {name}", backoff=False)
        elif code == codes.ILLEGAL_GENERATION:
            self._reset_generation(now, f"JoinGroup: {name}", reset_member_id=False)
            self._join_failed(now, f"JoinGroup: {name}", backoff=False)
        elif code == codes.REBALANCE_IN_PROGRESS:
            self._join_failed(now, f"JoinGroup: {name}", backoff=False)
        elif code in COORDINATOR_MOVED:
            self._mark_coordinator_unknown(now, f"JoinGroup: {name}")
            self._join_failed(now, f"JoinGroup: {name}")
        elif code in FATAL_GROUP_ERRORS:
            self._fatal(cerr.error_for_code(code), now)
        else:
            # Retriable, one of REJOIN_ERRORS, or an error Kafka's client does not expect either
            # (it raises those from that poll and joins again on the next): rejoin after a backoff.
            if code == codes.GROUP_MAX_SIZE_REACHED:
                # The coordinator turned this member away (and forgot it): join as a new member.
                self._reset_generation(now, f"JoinGroup: {name}", reset_member_id=True)
            if not codes.is_retriable(code):
                self._join_error(code, "JoinGroup")
            self._join_failed(now, f"JoinGroup: {name}")

    def _join_error(self, code: int, api: str) -> None:
        """Raise ``code`` once from the user's poll; the member goes on (rejoins after a backoff)."""
        name = codes.error_name(code)
        log.warning("%s failed with %s; joining again after a backoff", api, name)
        self._emit(JoinError(self._next_seq(), cerr.error_for_code(code, f"{api} failed: {name}")))

    # -- leader ---------------------------------------------------------------------------------
    def _lead(self, resp, now: float) -> None:
        subs: dict[str, MemberSubscription] = {}
        for member in resp.members:
            try:
                version, sub = decode_subscription(member.metadata)
                subs[member.member_id] = MemberSubscription(
                    member_id=member.member_id,
                    topics=list(sub.topics),
                    user_data=sub.user_data,
                    owned_partitions=[
                        TopicPartition(t.topic, p) for t in sub.owned_partitions for p in t.partitions
                    ]
                    if version >= 1
                    else [],
                    generation_id=sub.generation_id if version >= 2 else -1,
                    rack_id=sub.rack_id if version >= 3 else None,
                    group_instance_id=member.group_instance_id,
                    version=version,
                )
            except ProtocolError as exc:
                log.warning(
                    "member %s sent an undecodable subscription (%s); it gets nothing", member.member_id, exc
                )
                subs[member.member_id] = MemberSubscription(
                    member_id=member.member_id, topics=[], group_instance_id=member.group_instance_id
                )
        self._leader_subs = subs
        topics = sorted({t for s in subs.values() for t in s.topics})
        self._group_topics = frozenset(topics)
        if not topics:
            self._assign_and_sync({}, now)
            return
        self._send_metadata(topics, "leader_metadata", ctx=self.generation)

    def _send_metadata(self, topics, kind: str, ctx=None) -> None:
        v = self._version(COORDINATOR, METADATA)
        req = m.MetadataRequest(
            topics=[m.MetadataRequestTopic(name=t) for t in topics],
            allow_auto_topic_creation=self.cfg.allow_auto_create_topics and v >= 4,
        )
        self._send(COORDINATOR, kind, req, ctx=ctx)

    @staticmethod
    def _partition_counts(resp) -> dict[str, int]:
        out = {}
        for t in resp.topics:
            if t.error_code == codes.NONE and t.partitions and t.name:
                out[t.name] = len(t.partitions)
        return out

    def _on_leader_metadata(self, entry: _Inflight, resp, now: float) -> None:
        if (
            self.state is not MemberState.COMPLETING_REBALANCE
            or entry.ctx != self.generation
            or self._leader_subs is None
        ):
            return
        if isinstance(resp, BaseException):
            self._join_failed(now, f"leader could not fetch metadata: {resp}")
            return
        self._assign_and_sync(self._partition_counts(resp), now)

    def _assign_and_sync(self, counts: dict[str, int], now: float) -> None:
        subs = self._leader_subs or {}
        assignor = next((a for a in self.assignors if a.name == self.protocol_name), None)
        if assignor is None:
            self._fatal(
                cerr.InconsistentGroupProtocolError(
                    f"the coordinator chose assignor {self.protocol_name!r}, which this member lacks"
                ),
                now,
            )
            return
        try:
            raw = assignor.assign(dict(counts), {k: v for k, v in subs.items()})
        except Exception as exc:  # a user-supplied assignor may fail: rejoin rather than die
            log.exception("assignor %s failed", assignor.name)
            self._join_failed(now, f"assignor {assignor.name} failed: {exc}")
            return
        result: dict[str, MemberAssignment] = {}
        for member in subs:
            a = raw.get(member, [])
            if not isinstance(a, MemberAssignment):
                a = MemberAssignment(list(a))
            a.partitions = [TopicPartition(*tp) for tp in a.partitions]
            result[member] = a
        if self.protocol == COOPERATIVE:
            self._withhold_moving_partitions(subs, result)
        self._assigned_metadata = dict(counts)
        refresh = self.cfg.s("metadata_max_age_ms")
        if self._group_topics - set(counts):
            refresh = min(
                refresh, max(1.0, self.cfg.s("retry_backoff_max_ms"))
            )  # look again for missing topics
        self._next_metadata_refresh = now + refresh
        version = min([SUBSCRIPTION_VERSION] + [max(0, s.version) for s in subs.values()])
        assignments = []
        for member, a in sorted(result.items()):
            blob = encode_assignment(
                Assignment(
                    assigned_partitions=self._topic_partitions(a.partitions, TopicPartitions),
                    user_data=a.user_data,
                ),
                min(version, 3),
            )
            assignments.append(m.SyncGroupRequestAssignment(member_id=member, assignment=blob))
        log.info(
            "leader assigned generation %d with %s: %s",
            self.generation,
            assignor.name,
            {k: len(v.partitions) for k, v in result.items()},
        )
        self._send_sync(assignments, now)

    @staticmethod
    def _withhold_moving_partitions(subs: dict[str, MemberSubscription], result: dict) -> None:
        """KIP-429 safety net for any cooperative assignor: a partition another member still claims is
        left out of this round; its owner revokes it and rejoins, and the next round assigns it."""
        claimants: dict[TopicPartition, set] = {}
        for member, sub in subs.items():
            for tp in sub.owned_partitions:
                claimants.setdefault(TopicPartition(*tp), set()).add(member)
        for member, a in result.items():
            a.partitions = [tp for tp in a.partitions if not (claimants.get(tp, set()) - {member})]

    # -- sync -----------------------------------------------------------------------------------
    def _send_sync(self, assignments: list, now: float) -> None:
        req = m.SyncGroupRequest(
            group_id=self.group_id,
            generation_id=self.generation,
            member_id=self.member_id,
            group_instance_id=self.instance_id,
            protocol_type=PROTOCOL_TYPE,
            protocol_name=self.protocol_name,
            assignments=assignments,
        )
        self._send(COORDINATOR, "sync", req, ctx=self.generation)

    def _on_sync(self, entry: _Inflight, resp, now: float) -> None:
        if self.state is not MemberState.COMPLETING_REBALANCE or entry.ctx != self.generation:
            return
        if isinstance(resp, BaseException):
            self._join_failed(now, f"SyncGroup failed: {resp}")
            return
        code = resp.error_code
        name = codes.error_name(code)
        if code == codes.NONE:
            if entry.version >= 5 and (
                resp.protocol_type not in (None, PROTOCOL_TYPE)
                or resp.protocol_name not in (None, self.protocol_name)
            ):
                self._fatal(
                    cerr.InconsistentGroupProtocolError(
                        f"SyncGroup answered {resp.protocol_type}/{resp.protocol_name}"
                    ),
                    now,
                )
                return
            try:
                _, asg = decode_assignment(resp.assignment)
            except ProtocolError as exc:
                self._join_failed(now, f"undecodable assignment: {exc}")
                return
            parts = [TopicPartition(t.topic, p) for t in asg.assigned_partitions for p in t.partitions]
            self._complete(frozenset(parts), asg.user_data, now)
        elif code == codes.REBALANCE_IN_PROGRESS:
            self._join_failed(now, f"SyncGroup: {name}", backoff=False)
        elif code in (codes.UNKNOWN_MEMBER_ID, codes.ILLEGAL_GENERATION):
            self._reset_generation(now, f"SyncGroup: {name}", reset_member_id=code == codes.UNKNOWN_MEMBER_ID)
            self._join_failed(now, f"SyncGroup: {name}", backoff=False)
        elif code in COORDINATOR_MOVED:
            self._mark_coordinator_unknown(now, f"SyncGroup: {name}")
            self._join_failed(now, f"SyncGroup: {name}")
        elif code in FATAL_GROUP_ERRORS:
            self._fatal(cerr.error_for_code(code), now)
        else:
            # Includes INVALID_REQUEST from brokers that mishandle a late follower: rejoin.
            if code in REJOIN_ERRORS:
                self._join_error(code, "SyncGroup")
            self._join_failed(now, f"SyncGroup: {name}")

    def _complete(self, assigned: frozenset, user_data, now: float) -> None:
        self.state = MemberState.STABLE
        self._join_backoff.reset()
        self._leader_subs = None
        for a in self.assignors:
            if a.name == self.protocol_name:
                try:
                    a.on_assignment(sorted(assigned), user_data, self.generation)
                except Exception:
                    log.exception("assignor %s on_assignment failed", a.name)
        if self.subscription is not None:
            stray = frozenset(tp for tp in assigned if tp.topic not in self.subscription)
            if stray:
                log.warning("assigned partitions of topics not subscribed: %s", sorted(stray))
        if self.protocol == EAGER:
            added = assigned - self.owned
            self.owned = assigned
            self._emit(PartitionsAssigned(self._next_seq(), added, assigned, self.generation, self.epoch))
        else:
            revoked = self.owned - assigned
            added = assigned - self.owned
            self.owned = assigned
            if revoked:
                seq = self._next_seq()
                self._awaiting_ack = seq
                self._pending_revoke = frozenset()
                self._rejoin_after_ack = True
                self._emit(PartitionsRevoked(seq, revoked, self.epoch))
            self._emit(PartitionsAssigned(self._next_seq(), added, assigned, self.generation, self.epoch))
        log.info(
            "group %s stable at generation %d with %d partitions",
            self.group_id,
            self.generation,
            len(assigned),
        )

    # -- reset / leave / fatal ------------------------------------------------------------------
    def _drop_owned(self, now: float) -> None:
        """Partitions are gone without a revoke: tell the user they were lost."""
        self._awaiting_ack = None
        self._pending_revoke = frozenset()
        self._rejoin_after_ack = False
        self.epoch += 1
        if self.owned:
            self._emit(PartitionsLost(self._next_seq(), self.owned, self.epoch))
            self.owned = frozenset()

    def _reset_generation(self, now: float, reason: str, reset_member_id: bool) -> None:
        log.info("resetting generation (%s)", reason)
        self.generation = -1
        if reset_member_id:
            self.member_id = ""
        self.leader_id = ""
        self.state = MemberState.UNJOINED
        self._leader_subs = None
        self._assigned_metadata = None
        self._next_metadata_refresh = INF
        self.rejoin_reason = reason
        self._drop_owned(now)

    def _send_leave(self, reason: str, conn: str = COORDINATOR, ctx=None) -> None:
        v = self._version(conn, LEAVE)
        if v >= 3:
            req = m.LeaveGroupRequest(
                group_id=self.group_id,
                members=[
                    m.LeaveGroupRequestMemberIdentity(
                        member_id=self.member_id, group_instance_id=None, reason=reason
                    )
                ],
            )
        else:
            req = m.LeaveGroupRequest(group_id=self.group_id, member_id=self.member_id)
        self._send(conn, "leave", req, ctx=ctx)

    def _leave_group(self, now: float, reason: str) -> None:
        """Leave proactively (poll timeout). Static members send nothing: only the session timeout
        removes them, so a restart within it keeps their partitions."""
        if (
            self.instance_id is None
            and self.member_id
            and self.coordinator_ready
            and self.state is not MemberState.UNJOINED
        ):
            self._send_leave(reason)
        self._reset_generation(now, reason, reset_member_id=True)

    def _on_leave(self, entry: _Inflight, resp, now: float) -> None:
        if not isinstance(resp, BaseException) and resp.error_code != codes.NONE:
            log.info("LeaveGroup answered %s", codes.error_name(resp.error_code))
        if entry.ctx == _CLOSE and self._closing is not None:
            self._finish_close()

    def _fatal(self, error: BaseException, now: float) -> None:
        if self.error is not None:
            return
        log.error("group %s: fatal error: %s", self.group_id, error)
        self.error = error
        self.state = MemberState.UNJOINED
        self._drop_owned(now)
        self._emit(GroupFailed(self._next_seq(), error))
        for req in self._pending:
            self._actions.append(Reply(req.handle, error=error))
        self._pending.clear()

    # -- close ----------------------------------------------------------------------------------
    def _advance_close(self, now: float) -> None:
        c = self._closing
        if not c.leaving:
            if now < c.deadline and self._offset_requests():
                # As Kafka's ConsumerCoordinator.close: the commits still pending go out first
                # (within the deadline); the member heartbeats meanwhile, and rejoins nothing.
                self._ensure_coordinator(now)
                self._maybe_heartbeat(now)
                self._send_offset_requests(now)
                if self._offset_requests():
                    self._wake_at(c.deadline)
                    return
            c.leaving = True
            c.waiting = self._close_leave(now)
            if self._closing is None:
                return
        if c.waiting and now < c.deadline:
            self._wake_at(c.deadline)
        else:
            self._finish_close()

    def _close_leave(self, now: float) -> bool:
        """A closing dynamic member leaves the group: True while the LeaveGroup's answer is worth
        waiting for. Out of time, it is still sent when it can go at once (best effort)."""
        c = self._closing
        if not (
            c.leave
            and self.instance_id is None
            and self.member_id
            and self.coordinator_ready
            and self.state is not MemberState.UNJOINED
        ):
            return False
        if any(e.conn == COORDINATOR and e.kind in ("join", "sync") for e in self._inflight.values()):
            # Parked in a rebalance: a LeaveGroup behind it would wait until the group completes
            # it. Leave over a second connection; the coordinator then answers the parked request
            # with UNKNOWN_MEMBER_ID, to nobody (Stop drops both connections).
            if now >= c.deadline:
                return False
            conn = self._conns[LEAVER]
            conn.state, conn.target = "connecting", self.coordinator[1:]
            self._actions.append(Connect(LEAVER, self.coordinator[1], self.coordinator[2]))
            return True
        self._send_leave("the consumer is being closed", ctx=_CLOSE)
        return now < c.deadline

    def _finish_close(self) -> None:
        if self._closing is None:
            return
        handles = self._closing.handles
        self._closing = None
        for req in self._offset_requests():
            what = "commit" if req.kind == "commit" else "committed()"
            why = f"; last error: {req.last_error}" if req.last_error else ""
            self._actions.append(
                Reply(
                    req.handle,
                    error=cerr.KafkaTimeoutError(f"{what} did not complete before close()'s deadline{why}"),
                )
            )
        self._pending.clear()
        self._inflight.clear()
        self.closed = True
        self.state = MemberState.UNJOINED
        for h in handles:
            self._actions.append(Reply(h))
        self._actions.append(Stop())

    # -- leader metadata refresh ----------------------------------------------------------------
    def _maybe_refresh_metadata(self, now: float) -> None:
        if not (
            self.state is MemberState.STABLE
            and self.leader_id == self.member_id
            and self.member_id
            and self._assigned_metadata is not None
            and self.coordinator_ready
            and not self.rejoin_needed
        ):
            return
        if self._metadata_inflight:
            return
        if now < self._next_metadata_refresh:
            self._wake_at(self._next_metadata_refresh)
            return
        self._next_metadata_refresh = now + self.cfg.s("metadata_max_age_ms")
        if self._group_topics:
            self._metadata_inflight = True
            self._send_metadata(sorted(self._group_topics), "refresh_metadata", ctx=self.generation)

    def _on_refresh_metadata(self, entry: _Inflight, resp, now: float) -> None:
        self._metadata_inflight = False
        if isinstance(resp, BaseException) or entry.ctx != self.generation or self._assigned_metadata is None:
            return
        counts = self._partition_counts(resp)
        if counts != self._assigned_metadata:
            self._request_rejoin(f"partition counts changed: {self._assigned_metadata} -> {counts}")
        elif self._group_topics - set(counts):
            self._next_metadata_refresh = now + max(1.0, self.cfg.s("retry_backoff_max_ms"))

    # -- offsets --------------------------------------------------------------------------------
    def _send_offset_requests(self, now: float) -> None:
        if not self._pending:
            return
        pending, self._pending = self._pending, []
        keep = []
        for req in pending:
            # A commit is sent at least once when the coordinator is ready, even with no time
            # left (Kafka's commitSync(Duration.ZERO) and close(0) do the same): only its retries
            # and the wait for a coordinator are bounded by the deadline.
            first_chance = req.kind == "commit" and req.attempts == 0 and self.coordinator_ready
            if now >= req.deadline and not first_chance:
                why = ""
                if req.last_error:
                    why = f"; last error: {req.last_error}"
                elif not self.coordinator_ready and self._last_conn_problem:
                    # never reached a coordinator: say why (a daemon down, a wrong bootstrap)
                    servers = ",".join(f"{h}:{p}" for h, p in self.cfg.bootstrap_servers)
                    why = f"; no coordinator reached (bootstrap {servers}; {self._last_conn_problem})"
                err = cerr.KafkaTimeoutError(f"{'commit' if req.kind == 'commit' else 'committed()'} timed out{why}")
                self._actions.append(Reply(req.handle, error=err))
                continue
            if not self.coordinator_ready or now < req.retry_at:
                keep.append(req)
                self._wake_at(req.deadline)
                if now < req.retry_at:
                    self._wake_at(req.retry_at)
                continue
            if req.kind == "commit":
                if req.attempts and self._superseded(req):
                    self._actions.append(Reply(req.handle, error=self._superseded_error(req)))
                    continue
                self._send_commit(req, now)
            else:
                self._send_fetch(req, now)
        self._pending.extend(keep)

    def _commit_generation(self, epoch: int | None = None):
        """(generation, member id, None) to commit with, or (None, None, the exception) when the
        member cannot commit now. ``epoch``: the membership epoch of the user's view (None: any)."""
        if self.subscription is None and self.generation < 0:
            return -1, "", None  # standalone commit (no group membership)
        if epoch is not None and epoch != self.epoch:
            # The member lost its partitions (and maybe rejoined) after the user's view was made:
            # committing now would write under a generation whose assignment the user has not seen,
            # over the offsets of the partitions' new owner. Kafka: CommitFailedException (it
            # answers so until the poll that runs onPartitionsLost).
            return None, None, cerr.CommitFailedError()
        if self.state is MemberState.STABLE:
            return self.generation, self.member_id, None
        if self.state in (MemberState.PREPARING_REBALANCE, MemberState.COMPLETING_REBALANCE):
            return (
                None,
                None,
                cerr.RebalanceInProgressError(
                    "the group is rebalancing; poll to complete the rebalance, then commit again"
                ),
            )
        return None, None, cerr.CommitFailedError()

    def _superseded(self, req: _OffsetReq) -> bool:
        """Has a commit submitted after ``req`` covered one of its partitions? Then ``req`` must
        not be sent again: a retry landing after the later commit would move the offset back."""
        latest = self._latest_commit
        return any(latest.get(tp, 0) > req.seq for tp in req.data)

    @staticmethod
    def _superseded_error(req: _OffsetReq) -> BaseException:
        return cerr.RetriableCommitFailedError(
            f"commit not retried after {req.last_error}: a later commit covers some of its partitions"
        )

    def _send_commit(self, req: _OffsetReq, now: float) -> None:
        gen, member, err = self._commit_generation(req.epoch)
        if err is None and req.sent_as is not None and req.sent_as != (gen, member):
            # A retry, and a rebalance completed since the first attempt: the offsets were made for
            # the assignment of that attempt's generation, and a partition may have moved since.
            # Not re-sent under the new generation; Kafka answers a commit of a stale generation
            # from a member not rebalancing with CommitFailedException.
            err = cerr.CommitFailedError(
                f"commit not retried after {req.last_error}: the group rebalanced since its first "
                f"attempt (generation {req.sent_as[0]} -> {gen}); commit again from the current assignment"
            )
        if err is not None:
            self._actions.append(Reply(req.handle, error=err))
            return
        by_topic: dict[str, list] = {}
        for tp, om in sorted(req.data.items()):
            by_topic.setdefault(tp.topic, []).append(
                m.OffsetCommitRequestPartition(
                    partition_index=tp.partition,
                    committed_offset=om.offset,
                    committed_leader_epoch=om.leader_epoch,
                    commit_timestamp=-1,
                    committed_metadata=om.metadata,
                )
            )
        request = m.OffsetCommitRequest(
            group_id=self.group_id,
            generation_id_or_member_epoch=gen,
            member_id=member,
            group_instance_id=self.instance_id if gen >= 0 else None,
            retention_time_ms=-1,
            topics=[m.OffsetCommitRequestTopic(name=t, partitions=ps) for t, ps in by_topic.items()],
        )
        req.attempts += 1
        req.sent_as = (gen, member)
        self._send(COORDINATOR, "commit", request, ctx=(req, gen))

    def _retry_or_fail(self, req: _OffsetReq, error: BaseException, now: float) -> None:
        req.last_error = error
        delay = min(
            self.cfg.s("retry_backoff_max_ms"), self.cfg.s("retry_backoff_ms") * (2 ** min(req.attempts, 10))
        )
        if req.kind == "commit" and self._superseded(req):
            self._actions.append(Reply(req.handle, error=self._superseded_error(req)))
        elif now + delay < req.deadline:
            req.retry_at = now + delay
            self._pending.append(req)
        else:
            self._actions.append(Reply(req.handle, error=error))

    def _on_commit(self, entry: _Inflight, resp, now: float) -> None:
        req, gen = entry.ctx
        if isinstance(resp, BaseException):
            self._retry_or_fail(req, cerr.KafkaConnectionError(str(resp)), now)
            return
        failed = [
            (t.name, p.partition_index, p.error_code)
            for t in resp.topics
            for p in t.partitions
            if p.error_code != codes.NONE
        ]
        if not failed:
            self._actions.append(Reply(req.handle, value=dict(req.data)))
            return
        code = failed[0][2]
        name = codes.error_name(code)
        if code in (codes.COORDINATOR_LOAD_IN_PROGRESS, codes.UNKNOWN_TOPIC_OR_PARTITION):
            self._retry_or_fail(req, cerr.error_for_code(code), now)
        elif code in COORDINATOR_MOVED or code == codes.REQUEST_TIMED_OUT:
            self._mark_coordinator_unknown(now, f"OffsetCommit: {name}")
            self._retry_or_fail(req, cerr.error_for_code(code), now)
        elif code == codes.FENCED_INSTANCE_ID:
            self._actions.append(Reply(req.handle, error=cerr.FencedInstanceIdError()))
            self._fatal(cerr.FencedInstanceIdError(), now)
        elif code == codes.REBALANCE_IN_PROGRESS:
            if self.state is MemberState.STABLE and gen == self.generation:
                self._request_rejoin("OffsetCommit: REBALANCE_IN_PROGRESS")
            self._actions.append(
                Reply(
                    req.handle,
                    error=cerr.RebalanceInProgressError(
                        "the group is rebalancing; poll to complete the rebalance, then commit again"
                    ),
                )
            )
        elif code in (codes.UNKNOWN_MEMBER_ID, codes.ILLEGAL_GENERATION):
            if gen >= 0 and gen == self.generation and self.state is not MemberState.UNJOINED:
                self._reset_generation(
                    now, f"OffsetCommit: {name}", reset_member_id=code == codes.UNKNOWN_MEMBER_ID
                )
            self._actions.append(Reply(req.handle, error=cerr.CommitFailedError()))
        else:
            detail = ", ".join(f"{t}-{p}: {codes.error_name(c)}" for t, p, c in failed[:5])
            self._actions.append(
                Reply(req.handle, error=cerr.error_for_code(code, f"commit failed ({detail})"))
            )

    def _send_fetch(self, req: _OffsetReq, now: float) -> None:
        v = self._version(COORDINATOR, FETCH)
        by_topic: dict[str, list[int]] = {}
        for tp in sorted(req.data):
            by_topic.setdefault(tp.topic, []).append(tp.partition)
        stable = self.cfg.isolation_level == "read_committed"
        if v >= 8:
            request = m.OffsetFetchRequest(
                groups=[
                    m.OffsetFetchRequestGroup(
                        group_id=self.group_id,
                        topics=[
                            m.OffsetFetchRequestTopics(name=t, partition_indexes=ps)
                            for t, ps in by_topic.items()
                        ],
                    )
                ],
                require_stable=stable,
            )
        else:
            request = m.OffsetFetchRequest(
                group_id=self.group_id,
                topics=[
                    m.OffsetFetchRequestTopic(name=t, partition_indexes=ps) for t, ps in by_topic.items()
                ],
                require_stable=stable,
            )
        req.attempts += 1
        self._send(COORDINATOR, "fetch", request, ctx=req)

    def _on_fetch(self, entry: _Inflight, resp, now: float) -> None:
        req = entry.ctx
        if isinstance(resp, BaseException):
            self._retry_or_fail(req, cerr.KafkaConnectionError(str(resp)), now)
            return
        if entry.version >= 8:
            group = next((g for g in resp.groups if g.group_id == self.group_id), None)
            if group is None:
                self._retry_or_fail(
                    req, cerr.ProtocolMismatchError("OffsetFetch answered without our group"), now
                )
                return
            top, topics = group.error_code, group.topics
        else:
            top, topics = (resp.error_code if entry.version >= 2 else codes.NONE), resp.topics
        if top != codes.NONE:
            if top in COORDINATOR_MOVED:
                self._mark_coordinator_unknown(now, f"OffsetFetch: {codes.error_name(top)}")
                self._retry_or_fail(req, cerr.error_for_code(top), now)
            elif top in (codes.COORDINATOR_LOAD_IN_PROGRESS, codes.UNSTABLE_OFFSET_COMMIT):
                self._retry_or_fail(req, cerr.error_for_code(top), now)
            else:
                self._actions.append(Reply(req.handle, error=cerr.error_for_code(top)))
            return
        out: dict[TopicPartition, OffsetAndMetadata | None] = {tp: None for tp in req.data}
        for t in topics:
            for p in t.partitions:
                tp = TopicPartition(t.name, p.partition_index)
                if tp not in out:
                    continue
                if p.error_code == codes.UNSTABLE_OFFSET_COMMIT:
                    self._retry_or_fail(req, cerr.UnstableOffsetCommitError(), now)
                    return
                if p.error_code == codes.UNKNOWN_TOPIC_OR_PARTITION:
                    continue
                if p.error_code != codes.NONE:
                    self._actions.append(Reply(req.handle, error=cerr.error_for_code(p.error_code)))
                    return
                if p.committed_offset >= 0:
                    out[tp] = OffsetAndMetadata(
                        p.committed_offset, p.metadata or "", p.committed_leader_epoch
                    )
        self._actions.append(Reply(req.handle, value=out))
