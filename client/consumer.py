"""``GroupConsumer``: the blocking, thread-safe user API of herd's thin Kafka group client.

It is the group-membership and offset half of a Kafka consumer (no fetching of records)::

    from client import GroupConsumer, TopicPartition

    with GroupConsumer("127.0.0.1:9092", "my-group", session_timeout_ms=10000) as consumer:
        consumer.subscribe(["events"], listener=MyListener())
        while running:
            for tp in consumer.poll(1.0):          # drives the group; returns the assignment
                ...process tp from consumer.committed([tp])[tp] onwards...  (it paces the loop:
                poll returns at once when the group is stable; there are no records to wait for)
                consumer.seek(tp, next_offset)      # mark progress (committed by auto-commit)
            consumer.commit({tp: 42})               # or commit explicitly, any time

Configuration: Kafka consumer config names in a dict (``{"session.timeout.ms": 10000}``, given as
the third argument or unpacked with ``**``) or as Pythonic keywords (``session_timeout_ms=10000``).
See ``client/config.py`` for the list and defaults (Kafka's).

Offsets. The consumer keeps a *position* per assigned partition: the next offset to process,
which you set with ``seek(tp, offset[, metadata])`` once the records before it are done and read
with ``position(tp)``. ``commit()`` with no arguments commits the positions of every assigned
partition; ``commit({tp: offset})`` or ``commit({tp: (offset, "metadata")})`` commits exactly what
you pass, whether or not you use positions (this is what a Spark task does). With
``enable.auto.commit`` (default true) ``poll`` commits changed positions asynchronously every
``auto.commit.interval.ms``, and positions are committed synchronously before partitions are
revoked (before your ``on_partitions_revoked`` runs, as Kafka does: a commit made there is the last
word) and on ``close`` (bounded by its timeout; the listener may still commit there). ``close``
also sends the asynchronous commits still pending (within its timeout) and runs their callbacks
before it returns; a commit or ``committed()`` call made during ``close`` gets no more time than
the close has left. Positions of
partitions that leave the assignment are forgotten. Without a subscription, commits are standalone
(generation -1, as Kafka allows for a group with no members).

Commit order and zombies. A commit that fails with a retriable error is retried until its timeout,
but never after a later commit of one of its partitions was made (that would move the offset back):
it then fails with ``RetriableCommitFailedError``. A commit carries the membership the caller's
assignment came from: once the member has lost its partitions (kicked out, session expired,
generation reset), commits fail with ``CommitFailedError`` until a ``poll`` has run
``on_partitions_lost``, even though the background thread may already have rejoined, so a member
never commits over the new owner of a partition. A commit retried after a rebalance completed is
not re-sent under the new generation (``CommitFailedError``, or ``RebalanceInProgressError`` while
the next rebalance is under way). During a rebalance -- including while a JoinGroup or SyncGroup
lost to a dropped connection is retried, when the member keeps its partitions -- commits fail with
``RebalanceInProgressError``.

``poll(timeout_s)`` runs the group on the caller's side: it runs due rebalance-listener callbacks
(``on_partitions_revoked`` / ``on_partitions_assigned`` / ``on_partitions_lost``, on the polling
thread, in order) and callbacks of finished asynchronous commits, then returns as soon as the group
is stable and every callback has run, or when ``timeout_s`` runs out; it returns the assignment as
the listener has seen it. The background thread keeps heartbeating between polls and takes every
step of a rebalance that does not need the user on its own (rejoining when a heartbeat reports a
rebalance, JoinGroup → SyncGroup, retries); only revocation waits for a poll to run the callback.
So a poll of a stable group with nothing due is answered on the calling thread, without waking the
background thread (it only records the poll time). A member that does not poll for
``max.poll.interval.ms`` leaves the group (its partitions are *lost*) and rejoins at its next
poll. In the eager protocol every rebalance revokes all partitions first; in the cooperative one
(``partition.assignment.strategy=cooperative-sticky``) only partitions that move are revoked.
Either way a partition is assigned elsewhere only after its revocation callback
here has returned (or after this member is gone from the group).

Threads: every method may be called from any thread. One thread at a time runs callbacks (a
``poll`` that finds another thread polling waits for it, up to its own timeout). Every blocking
call has a timeout (``default.api.timeout.ms`` unless given), so none can hang forever; see
``client/network.py`` for why none can deadlock. Listener callbacks may call ``commit``,
``committed``, ``seek``, ``position`` and ``assignment``; a ``poll`` from inside a callback
returns the assignment without running anything.

A broker that cannot be reached (nothing listening at the bootstrap address, a coordinator
address that does not route) is logged at WARNING, naming the address and the error, at the first
failed attempt and every 10 s while it lasts; the consumer keeps reconnecting. A ``poll`` that ends
without a stable group raises ``NoBrokersAvailableError`` (a ``KafkaTimeoutError``, not fatal) once
no coordinator has been reached for ``broker.unreachable.timeout.ms`` (default 30000): catch it to
keep waiting (a broker restarting), or let it end the program (a wrong address). A member already
in a stable group keeps its partitions through an outage, and its polls do not raise.

Errors (``client.errors``): ``CommitFailedError`` (the member lost its generation: rejoin via
``poll`` and reprocess from the committed offsets), ``RebalanceInProgressError`` (commit during a
rebalance: poll, then commit again), ``FencedInstanceIdError`` (another process took this
``group.instance.id``: fatal), ``KafkaTimeoutError``, ``IllegalStateError``; fatal group errors are
raised by ``poll`` and every later call, while a JoinGroup error the group may outgrow (e.g.
``GroupMaxSizeReachedError``) is raised once by ``poll`` and the member joins again after a backoff.
An exception from a listener callback is raised by the ``poll`` that ran it, after the rebalance
step it belongs to has been acknowledged. Closing or unsubscribing during a rebalance (or without a
generation) runs ``on_partitions_lost`` rather than ``on_partitions_revoked``, as Kafka does.

Static membership: with ``group.instance.id`` set, ``close()`` does not send LeaveGroup; a restart
within ``session.timeout.ms`` gets the same partitions back without a rebalance.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import weakref
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout

from client import errors as cerr
from client.config import parse_config
from client.coordinator import (
    ConsumerCoordinator,
    GroupFailed,
    JoinError,
    MemberState,
    PartitionsAssigned,
    PartitionsLost,
    PartitionsRevoked,
)
from client.network import NUDGE, CommitCallback, Handle, NetworkThread, Nudge
from client.types import OffsetAndMetadata, TopicPartition

log = logging.getLogger("herd.client")

__all__ = ["GroupConsumer", "RebalanceListener"]

_REBALANCING = frozenset({MemberState.PREPARING_REBALANCE.value, MemberState.COMPLETING_REBALANCE.value})


class RebalanceListener:
    """Optional base class for listeners; any object with some of these methods will do."""

    def on_partitions_revoked(self, revoked: frozenset) -> None:
        pass

    def on_partitions_assigned(self, assigned: frozenset) -> None:
        pass

    def on_partitions_lost(self, lost: frozenset) -> None:
        # As Kafka: by default, losing partitions is handled like revoking them.
        self.on_partitions_revoked(lost)


class _Cmd:
    """A command for the network thread; ``handle`` lets a dying thread fail its caller."""

    __slots__ = ("fn", "handle")

    def __init__(self, fn, handle: Handle | None = None):
        self.fn = fn
        self.handle = handle

    def __call__(self, core, now):
        self.fn(core, now)


def _tp(value) -> TopicPartition:
    if isinstance(value, TopicPartition):
        return value
    topic, partition = value
    if not isinstance(topic, str) or not isinstance(partition, int) or partition < 0:
        raise ValueError(f"not a topic partition: {value!r}")
    return TopicPartition(topic, partition)


def _offset(value) -> OffsetAndMetadata:
    if isinstance(value, OffsetAndMetadata):
        om = value
    elif isinstance(value, int) and not isinstance(value, bool):
        om = OffsetAndMetadata(value)
    elif isinstance(value, tuple) and 1 <= len(value) <= 3:
        om = OffsetAndMetadata(*value)
    else:
        raise ValueError(f"an offset is an int, (int, metadata) or OffsetAndMetadata, not {value!r}")
    if not isinstance(om.offset, int) or om.offset < 0:
        raise ValueError(f"offsets are non-negative integers, not {om.offset!r}")
    if om.metadata is None:
        om = om._replace(metadata="")
    if not isinstance(om.metadata, str):
        raise ValueError("offset metadata is a string")
    return om


class GroupConsumer:
    """A Kafka consumer-group member without fetching. See the module docstring."""

    def __init__(
        self, bootstrap_servers=None, group_id: str | None = None, config: dict | None = None, **kwargs
    ):
        self._config = parse_config(bootstrap_servers, group_id, config, **kwargs)
        cfg = self._config
        self._events: queue.SimpleQueue = queue.SimpleQueue()
        core = ConsumerCoordinator(cfg, time.monotonic())
        self._net = NetworkThread(core, self._events, name=f"herd-consumer-{cfg.group_id}")
        self._lock = threading.Lock()  # user-side state (view, positions); never held while waiting
        self._poll_lock = threading.Lock()  # one thread at a time runs callbacks
        self._local = threading.local()
        self._listener = None
        self._view: frozenset = frozenset()
        self._view_epoch = 0  # the membership epoch ``_view`` belongs to (commits carry it)
        self._positions: dict[TopicPartition, OffsetAndMetadata] = {}
        self._last_committed: dict[TopicPartition, OffsetAndMetadata] = {}
        self._processed = 0
        self._callback_errors: list[BaseException] = []
        self._subscribed = False
        self._topics: frozenset = frozenset()
        self._closing = False  # close() has begun: its revocation callback may still commit
        self._close_deadline = float("inf")  # close()'s deadline bounds the commits it makes
        self._closed = False
        self._next_auto_commit = time.monotonic() + cfg.s("auto_commit_interval_ms")
        self._net.start()
        # A consumer dropped without close() must not keep a thread (and a group member) alive.
        self._finalizer = weakref.finalize(self, self._net.stop)

    # -- context manager -------------------------------------------------------------------------
    def __enter__(self) -> GroupConsumer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- plumbing ----------------------------------------------------------------------------------
    @property
    def config(self):
        return self._config

    def _snapshot(self):
        return self._net.snapshot

    def _check_open(self) -> None:
        if self._closed:
            raise cerr.IllegalStateError("the consumer is closed")
        err = self._net.snapshot.error
        if err is not None:
            raise err

    def _submit(self, fn, handle: Handle | None = None) -> int:
        seq = self._net.submit(_Cmd(fn, handle))
        if not seq:
            raise cerr.IllegalStateError("the consumer is closed")
        return seq

    def _default_timeout(self, timeout_s) -> float:
        t = self._config.s("default_api_timeout_ms") if timeout_s is None else max(0.0, float(timeout_s))
        if self._closing:
            # close(timeout_s) bounds what its revocation callback does (Kafka: the close timer).
            t = min(t, max(0.0, self._close_deadline - time.monotonic()))
        return t

    def _call(self, fn_factory, timeout_s: float, what: str):
        """Submit a request carrying a future and wait for it, at most ``timeout_s`` (+ a little)."""
        fut: Future = Future()
        handle = Handle(fut)
        self._submit(fn_factory(handle), handle)
        try:
            return fut.result(timeout_s + 1.0)
        except FutureTimeout:
            raise cerr.KafkaTimeoutError(f"{what} did not complete within {timeout_s:.3f}s") from None

    # -- subscription ------------------------------------------------------------------------------
    def subscribe(self, topics, listener=None) -> None:
        """Join the group for ``topics`` (an iterable of names, or one name). ``listener`` gets
        ``on_partitions_revoked`` / ``on_partitions_assigned`` / ``on_partitions_lost`` (any subset)."""
        self._check_open()
        if isinstance(topics, str):
            topics = [topics]
        topics = frozenset(topics)
        if not topics:
            return self.unsubscribe()
        for t in topics:
            if not isinstance(t, str) or not t:
                raise ValueError(f"not a topic name: {t!r}")
        with self._lock:
            self._listener = listener
            self._subscribed = True
            self._topics = topics
        self._submit(lambda core, now: core.subscribe(topics, now))

    def subscription(self) -> frozenset:
        """The topics subscribed to."""
        return self._topics

    def unsubscribe(self) -> None:
        """Revoke every partition (callbacks run here), commit positions if auto-commit is on, and
        leave the group (dynamic members)."""
        self._check_open()
        with self._hold_poll_lock(self._default_timeout(None)) as held:
            if held:
                self._drain_events()
            self._give_up_assignment()
        with self._lock:
            self._subscribed = False
            self._topics = frozenset()
        self._submit(lambda core, now: core.unsubscribe(now))

    # -- poll --------------------------------------------------------------------------------------
    def poll(self, timeout_s: float = 0.0) -> frozenset:
        """Drive the group: run due callbacks, wait (up to ``timeout_s``) for a stable group, and
        return the current assignment as a frozenset of TopicPartition."""
        if getattr(self._local, "in_callback", False):
            self._net.last_poll = time.monotonic()  # a long callback that polls stays in the group
            return self._view
        if self._closed or self._closing:
            raise cerr.IllegalStateError("the consumer is closed")
        now = time.monotonic()
        net = self._net
        net.last_poll = now  # the poll timer (max.poll.interval.ms); the network thread reads it
        deadline = now + max(0.0, float(timeout_s))
        # A stable group with nothing pending: answered here, without a command (the network
        # thread rejoins on its own when the group rebalances; see client/network.py).
        if self._poll_lock.acquire(False):
            try:
                if self._poll_quietly():
                    self._raise_callback_errors()
                    return self._view
            finally:
                self._poll_lock.release()
        my_seq = self._submit(lambda core, now: core.poll(now))
        with self._hold_poll_lock(max(0.0, deadline - time.monotonic())) as held:
            if not held:
                self._check_open()
                return self._view
            while True:
                if self._closing:  # closed from another thread
                    break
                net.last_poll = time.monotonic()  # a long poll is still a poll (poll timer)
                self._drain_events()
                self._maybe_auto_commit()
                seen = net.commands_done
                snap = net.snapshot
                if snap.error is not None:
                    self._raise_callback_errors()
                    raise snap.error
                if snap.closed:
                    raise cerr.IllegalStateError("the consumer's network thread has stopped")
                if seen >= my_seq and (
                    not snap.subscribed or (snap.stable and self._processed >= snap.events)
                ):
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                try:
                    ev = self._events.get(timeout=min(remaining, 1.0))
                except queue.Empty:
                    if remaining <= 1.0:
                        break
                    continue
                self._handle_event(ev)
        self._raise_callback_errors()
        self._raise_if_unreachable()
        return self._view

    def _raise_if_unreachable(self) -> None:
        """After a poll that ends without a stable group: NoBrokersAvailableError if no coordinator
        has been reached for broker.unreachable.timeout.ms while connection attempts fail."""
        snap = self._net.snapshot
        since = snap.unreachable_since
        if not snap.subscribed or snap.stable or since is None or not snap.connect_failure:
            return
        waited = time.monotonic() - since
        limit = self._config.s("broker_unreachable_timeout_ms")
        if waited < limit:
            return
        servers = ",".join(f"{h}:{p}" for h, p in self._config.bootstrap_servers)
        raise cerr.NoBrokersAvailableError(
            f"no group coordinator reached for {waited:.1f}s (broker.unreachable.timeout.ms="
            f"{self._config.broker_unreachable_timeout_ms}): {snap.connect_failure}. Is a broker running at "
            f"{servers}? The consumer keeps trying: poll again to go on waiting."
        )

    def _poll_quietly(self) -> bool:
        """With the poll lock held: run what is due; True if the group is stable (or there is no
        subscription), every event is handled and every command submitted has taken effect."""
        self._drain_events()
        self._maybe_auto_commit()
        net = self._net
        if not net.caught_up():  # e.g. subscribe() or an ack not yet run: take the slow path
            return False
        snap = net.snapshot  # read after caught_up(): at least as new as the commands
        if snap.error is not None or snap.closed or self._closing:
            return False
        if snap.subscribed:
            return snap.stable and self._processed >= snap.events and self._events.empty()
        return self._events.empty()

    class _Held:
        def __init__(self, lock, timeout):
            self.lock = lock
            self.timeout = timeout
            self.held = False

        def __enter__(self):
            self.held = (
                self.lock.acquire(timeout=self.timeout) if self.timeout > 0 else self.lock.acquire(False)
            )
            return self.held

        def __exit__(self, *exc):
            if self.held:
                self.lock.release()

    def _hold_poll_lock(self, timeout: float):
        return self._Held(self._poll_lock, timeout)

    def _drain_events(self) -> None:
        while True:
            try:
                ev = self._events.get_nowait()
            except queue.Empty:
                return
            self._handle_event(ev)

    def _handle_event(self, ev) -> None:
        t = type(ev)
        if t is Nudge:
            self._net.nudge_pending = False
            return
        if t is CommitCallback:
            if ev.error is None and ev.offsets:
                self._note_committed(ev.offsets)
            self._run_callback(ev.callback, ev.offsets, ev.error)
            return
        if t is PartitionsRevoked:
            snap = self._net.snapshot
            with self._lock:
                parts = ev.partitions & self._view
            if parts:
                if snap.epoch != ev.epoch:
                    self._listener_call("on_partitions_lost", parts)
                else:
                    # As Kafka (onJoinPrepare): positions first, then the listener, whose own
                    # commit is then the last word.
                    self._commit_before_revoke(parts)
                    self._listener_call("on_partitions_revoked", parts)
                self._forget(parts)
            seq = ev.seq
            self._submit(lambda core, now: core.ack(seq, now))
        elif t is PartitionsAssigned:
            with self._lock:
                gone = self._view - ev.assignment
            if gone:  # defensive: never expected, the core revokes or loses first
                self._listener_call("on_partitions_lost", gone)
                self._forget(gone)
            with self._lock:
                self._view = frozenset(ev.assignment)
                self._view_epoch = ev.epoch
            self._listener_call("on_partitions_assigned", ev.added)
        elif t is PartitionsLost:
            with self._lock:
                parts = ev.partitions & self._view
            if parts:
                self._listener_call("on_partitions_lost", parts)
                self._forget(parts)
            with self._lock:
                self._view_epoch = ev.epoch  # commits from now on belong to the membership after the loss
        elif t is JoinError:
            self._callback_errors.append(ev.error)  # raised once by this poll; the member rejoins
        elif t is GroupFailed:
            with self._lock:
                parts = self._view
            if parts:
                self._listener_call("on_partitions_lost", parts)
                self._forget(parts)
        seq = getattr(ev, "seq", None)
        if seq is not None and seq > self._processed:
            self._processed = seq

    def _forget(self, parts) -> None:
        with self._lock:
            self._view = self._view - parts
            for tp in parts:
                self._positions.pop(tp, None)
                self._last_committed.pop(tp, None)

    def _listener_call(self, method: str, parts) -> None:
        listener = self._listener
        fn = getattr(listener, method, None) if listener is not None else None
        if fn is None and method == "on_partitions_lost" and listener is not None:
            fn = getattr(listener, "on_partitions_revoked", None)  # Kafka's default for lost
        if fn is None:
            return
        self._run_callback(fn, frozenset(parts))

    def _run_callback(self, fn, *args) -> None:
        self._local.in_callback = True
        try:
            fn(*args)
        except Exception as exc:
            log.exception("consumer callback %r failed", fn)
            self._callback_errors.append(exc)
        finally:
            self._local.in_callback = False

    def _raise_callback_errors(self) -> None:
        if self._callback_errors:
            first = self._callback_errors[0]
            self._callback_errors.clear()
            raise first

    # -- positions and commits ---------------------------------------------------------------------
    def assignment(self) -> frozenset:
        """The partitions assigned to this member (as of the last poll)."""
        return self._view

    def seek(self, partition, offset: int, metadata: str = "") -> None:
        """Set the position (next offset to process) of an assigned partition."""
        tp = _tp(partition)
        om = _offset((offset, metadata))
        with self._lock:
            if tp not in self._view:
                raise cerr.IllegalStateError(f"{tp} is not assigned to this consumer")
            self._positions[tp] = om

    def position(self, partition) -> int | None:
        """The position set with ``seek`` (None when none was set)."""
        om = self._positions.get(_tp(partition))
        return None if om is None else om.offset

    def positions(self) -> dict:
        with self._lock:
            return {tp: om.offset for tp, om in self._positions.items()}

    def commit(self, offsets=None, sync: bool = True, callback=None, timeout_s: float | None = None):
        """Commit ``offsets`` (dict TopicPartition -> int | (int, metadata) | OffsetAndMetadata), or
        every assigned partition's position when None.

        ``sync=True`` waits (up to ``timeout_s``, default ``default.api.timeout.ms``) and returns the
        committed dict, raising on failure; ``callback(offsets, error)`` is also called. With
        ``sync=False`` it returns at once and ``callback(offsets, error)`` runs on a later poll."""
        self._check_open()
        return self._commit(offsets, sync, callback, timeout_s)

    def _commit(self, offsets, sync, callback, timeout_s):
        if offsets is None:
            with self._lock:
                data = {tp: om for tp, om in self._positions.items() if tp in self._view}
                epoch = self._view_epoch
        else:
            data = {_tp(tp): _offset(v) for tp, v in dict(offsets).items()}
            epoch = self._view_epoch
        timeout = self._default_timeout(timeout_s)
        if not sync:
            handle = Handle(None, callback, data)
            self._submit(lambda core, now: core.commit(data, handle, now + timeout, now, epoch=epoch), handle)
            return None
        try:
            result = self._call(
                lambda h: lambda core, now: core.commit(data, h, now + timeout, now, epoch=epoch), timeout, "commit"
            )
        except cerr.KafkaError as exc:
            if callback is not None:
                self._run_callback(callback, data, exc)
            raise
        self._note_committed(data)
        if callback is not None:
            self._run_callback(callback, data, None)
            self._raise_callback_errors()
        return result

    def _note_committed(self, data: dict) -> None:
        with self._lock:
            for tp, om in data.items():
                if tp in self._view:
                    self._last_committed[tp] = om

    def _commit_before_revoke(self, parts) -> None:
        """Commit the positions of ``parts`` that changed, synchronously: within request.timeout.ms,
        and within close()'s deadline while closing."""
        if not self._config.enable_auto_commit:
            return
        with self._lock:
            data = {
                tp: om
                for tp, om in self._positions.items()
                if tp in parts and self._last_committed.get(tp) != om
            }
        if not data:
            return
        try:
            timeout = min(self._config.s("request_timeout_ms"), max(0.0, self._close_deadline - time.monotonic()))
            self._commit(data, True, None, timeout)  # sent at least once, even with no time left
        except cerr.KafkaError as exc:
            log.warning("commit before revocation failed: %s", exc)

    def _maybe_auto_commit(self) -> None:
        if not self._config.enable_auto_commit:
            return
        now = time.monotonic()
        if now < self._next_auto_commit:
            return
        self._next_auto_commit = now + self._config.s("auto_commit_interval_ms")
        if not self._net.snapshot.stable:
            return
        with self._lock:
            data = {
                tp: om
                for tp, om in self._positions.items()
                if tp in self._view and self._last_committed.get(tp) != om
            }
        if data:

            def done(offsets, error):
                if error is not None:
                    log.warning("auto-commit failed: %s", error)

            self._commit(data, False, done, None)

    def committed(self, partitions, timeout_s: float | None = None) -> dict:
        """The committed offsets: dict TopicPartition -> OffsetAndMetadata, or None where none."""
        self._check_open()
        if isinstance(partitions, TopicPartition):
            partitions = [partitions]
        parts = [_tp(p) for p in partitions]
        timeout = self._default_timeout(timeout_s)
        return self._call(
            lambda h: lambda core, now: core.fetch_committed(parts, h, now + timeout, now),
            timeout,
            "committed()",
        )

    # -- group state -------------------------------------------------------------------------------
    def generation(self) -> int:
        """The current generation id (-1 when not in a group)."""
        return self._net.snapshot.generation

    def member_id(self) -> str:
        """This member's id ("" when not in a group)."""
        return self._net.snapshot.member_id

    def group_state(self) -> dict:
        """A summary for logs and tests: state, generation, member id, leader, stable, protocol."""
        s = self._net.snapshot
        return {
            "state": s.state,
            "generation": s.generation,
            "member_id": s.member_id,
            "leader": s.leader,
            "stable": s.stable,
            "protocol": s.protocol,
            "coordinator": s.coordinator,
            "assignment": sorted(self._view),
        }

    # -- close -------------------------------------------------------------------------------------
    def _give_up_assignment(self) -> None:
        """Before leaving: commit positions (auto-commit), then run on_partitions_revoked; or, as
        Kafka's onLeavePrepare, on_partitions_lost when the member has no generation or is in the
        middle of a rebalance (the partitions may already be another member's)."""
        with self._lock:
            parts = self._view
        if not parts:
            return
        snap = self._net.snapshot
        if snap.generation < 0 or not snap.member_id or snap.state in _REBALANCING:
            self._listener_call("on_partitions_lost", parts)
        else:
            if self._config.enable_auto_commit and snap.error is None and snap.stable:
                self._commit_before_revoke(parts)
            self._listener_call("on_partitions_revoked", parts)
        self._forget(parts)

    def close(self, timeout_s: float = 30.0) -> None:
        """Leave the group (dynamic members) and stop the background thread; idempotent. Runs
        on_partitions_revoked for the current assignment (on_partitions_lost during a rebalance)
        and commits positions if auto-commit is on; asynchronous commits still pending are sent
        before the LeaveGroup, and their callbacks run here (with KafkaTimeoutError for those
        ``timeout_s`` did not leave time for). A commit or committed() call from the listener gets
        no more than what is left of ``timeout_s``."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._lock:
            if self._closing:
                return
            self._close_deadline = deadline
            self._closing = True  # the consumer stays usable for the revocation callback (Kafka)
        self._events.put(NUDGE)  # a poll waiting in another thread returns now
        try:
            if not getattr(self._local, "in_callback", False):
                with self._hold_poll_lock(max(0.0, deadline - time.monotonic())) as held:
                    if held:
                        self._drain_events()
                        self._give_up_assignment()
        except Exception as exc:
            log.warning("error while closing: %s", exc)
        finally:
            self._closed = True
            try:
                fut: Future = Future()
                handle = Handle(fut)
                remaining = max(0.0, deadline - time.monotonic())
                if self._net.submit(
                    _Cmd(lambda core, now: core.close(handle, now + remaining, True, now), handle)
                ):
                    try:
                        fut.result(remaining + 0.5)
                    except Exception:
                        pass
            finally:
                self._net.join(max(0.0, deadline - time.monotonic()) + 0.5)
                if self._net.is_alive():
                    self._net.stop()
                    self._net.join(1.0)
                self._finalizer.detach()
        self._run_commit_callbacks(deadline)
        self._callback_errors.clear()

    def _run_commit_callbacks(self, deadline: float) -> None:
        """After close: run the callbacks of the asynchronous commits, every one answered by now
        (Kafka's close runs invokeCompletedOffsetCommitCallbacks; the commits it had no time for
        never get theirs, here they get their KafkaTimeoutError). Rebalance events left are moot."""
        if getattr(self._local, "in_callback", False):  # closed from a callback: run them here
            self._drain_commit_callbacks()
            return
        with self._hold_poll_lock(max(0.5, deadline - time.monotonic())) as held:
            if held:
                self._drain_commit_callbacks()
            else:
                log.warning("close: another thread kept running callbacks; commit callbacks not run")

    def _drain_commit_callbacks(self) -> None:
        while True:
            try:
                ev = self._events.get_nowait()
            except queue.Empty:
                return
            if type(ev) is CommitCallback:
                self._run_callback(ev.callback, ev.offsets, ev.error)
