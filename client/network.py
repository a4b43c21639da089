"""The one background thread: it owns every socket and the coordinator state machine.

Nothing else touches a socket or the ``ConsumerCoordinator``. The user's threads reach this thread
through exactly four things, none of which can make it wait:

- ``submit(fn)``: appends a command to a ``queue.SimpleQueue`` (unbounded; ``put`` never blocks) and
  writes a byte to a non-blocking wake-up socket (a full buffer means a wake-up is already pending,
  so the write is dropped). Commands are plain functions ``fn(core, now)`` run on this thread.
- ``snapshot``: an immutable ``Snapshot`` this thread republishes by plain attribute assignment
  (atomic in CPython); readers never lock.
- the *events* queue (another ``SimpleQueue``) this thread only ever ``put``s to: rebalance events
  for the user's thread, completed-commit callbacks, and a ``Nudge`` whenever the snapshot changes
  (coalesced: at most one waits at a time).
- ``last_poll``: a monotonic timestamp a user's ``poll`` writes (a plain float assignment) without
  waking this thread; the thread hands it to the core's poll timer (``note_poll``) each time it
  wakes, before anything can check that timer. So a poll of a stable group costs no command.

Replies travel in ``concurrent.futures.Future`` objects that are never handed to user code, so no
user callback is ever attached to them (``set_result`` would otherwise run it on this thread).

TLS (``security.protocol`` SSL / SASL_SSL) runs over the plain non-blocking socket through a
sans-IO ``TlsLayer`` (memory buffers): the bytes ``recv`` returns are decrypted at once and all of
the plaintext is handed on, so nothing waits inside an SSL object while the socket is not readable.
An authentication failure (SASL refused, a certificate that does not verify) is not retried: the
core fails the consumer with it (``on_auth_failed``), and ``poll`` raises it.

This thread blocks only in ``selector.select(timeout)``; it never takes a lock that user code can
hold, never waits for a future, and never runs user code (listeners, commit callbacks and
assignors all run elsewhere -- except an assignor, which is a pure function of its inputs). The one
lock it shares (``_handoff``) guards the shutdown hand-off of the command queue and is held for a
few non-blocking instructions on either side, with no other lock taken inside it. Hence no cycle of
waiting can include this thread, and every user call has its own timeout: no deadlock is possible.
"""

from __future__ import annotations

import errno
import logging
import queue
import selectors
import socket
import ssl
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

from client import errors as cerr
from client.coordinator import (
    Connect,
    ConsumerCoordinator,
    Disconnect,
    Emit,
    Reply,
    Send,
    Snapshot,
    Stop,
)
from protocol.client_connection import (
    CLIENT_VERSIONS,
    AuthenticationFailed,
    Connection,
    ConnectionBroken,
    Ready,
    Response,
)
from protocol.client_security import tls_failure

log = logging.getLogger("herd.client.network")

__all__ = ["NetworkThread", "Handle", "Nudge", "CommitCallback"]

INF = float("inf")
MAX_SELECT_S = 1.0
HUNG_UP = "closed by the broker"
RECV_BYTES = 256 * 1024


@dataclass(frozen=True)
class Nudge:
    """The snapshot changed (no payload: read ``NetworkThread.snapshot``)."""


NUDGE = Nudge()


@dataclass(frozen=True)
class CommitCallback:
    """An asynchronous commit finished: run ``callback(offsets, error)`` on the user's thread."""

    callback: object
    offsets: dict
    error: BaseException | None


class Handle:
    """Where a reply goes: a future the user thread waits on, and/or a callback to run at poll time."""

    __slots__ = ("future", "callback", "offsets")

    def __init__(self, future: Future | None = None, callback=None, offsets=None):
        self.future = future
        self.callback = callback
        self.offsets = offsets


class _Sock:
    __slots__ = (
        "conn_id",
        "sock",
        "proto",
        "state",
        "out",
        "inflight",
        "setup_deadline",
        "target",
        "registered",
        "tls",
    )

    def __init__(self, conn_id, sock, proto, target, setup_deadline, tls=None):
        self.conn_id = conn_id
        self.sock = sock
        self.proto = proto
        self.state = "connecting"  # connecting | handshake | ready
        self.out = bytearray()
        self.inflight: dict[int, tuple] = {}  # corr -> (tag, deadline, api_key, version)
        self.setup_deadline = setup_deadline
        self.target = target
        self.registered = 0
        self.tls = tls  # a TlsLayer, or None for PLAINTEXT / SASL_PLAINTEXT


class NetworkThread(threading.Thread):
    def __init__(
        self,
        core: ConsumerCoordinator,
        events: queue.SimpleQueue,
        clock=time.monotonic,
        name: str = "herd-consumer-network",
    ):
        super().__init__(name=name, daemon=True)
        self.core = core
        self.events = events
        self.clock = clock
        self.cfg = core.cfg
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.snapshot: Snapshot = core.snapshot()
        self.crashed: BaseException | None = None
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._wake_w.setblocking(False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._socks: dict[str, _Sock] = {}
        self._io_deadline = INF  # no socket deadline before this (see _check_deadlines)
        self._stop_requested = False
        self._stopped = False
        self._core_stopped = False
        # Per broker address: api key -> highest version to use, lowered when the broker hangs up on
        # a request at a version it never answered (a broker that advertises a version it cannot
        # parse, e.g. librdkafka's mock and JoinGroup v6). And what it did answer.
        self._caps: dict[tuple, dict[int, int]] = {}
        self._config_caps = dict(core.cfg.api_versions_max)
        self._answered: dict[tuple, set] = {}
        self._submitted = 0
        self._ran = 0
        self.commands_done = 0
        self.nudge_pending = False
        self.last_poll = core.heartbeat.last_poll  # written by user threads (see the module doc)
        self._synced_poll = self.last_poll
        self._handoff = threading.Lock()

    # -- user-thread side (non-blocking) -------------------------------------------------------
    def submit(self, fn) -> int:
        """Queue ``fn(core, now)`` for this thread; return its sequence number (0: thread stopped).

        ``commands_done`` reaches that number once the command ran and ``snapshot`` reflects it."""
        with self._handoff:
            if self._stopped:
                return 0
            self._submitted += 1
            seq = self._submitted
            self.commands.put(fn)
        self.wake()
        return seq

    def caught_up(self) -> bool:
        """True when every command submitted so far has run and ``snapshot`` reflects it."""
        submitted = self._submitted  # read before commands_done: _publish sets that one last
        return self.commands_done >= submitted

    def wake(self) -> None:
        try:
            self._wake_w.send(b"\0")
        except (BlockingIOError, InterruptedError):
            pass  # a wake-up is already pending
        except OSError:
            pass  # closed: the thread is gone

    def stop(self) -> None:
        """Ask the thread to exit at once (no LeaveGroup). Safe from any thread, never blocks."""
        self._stop_requested = True
        self.wake()

    # -- the loop --------------------------------------------------------------------------------
    def run(self) -> None:
        try:
            while not self._stop_requested and not self._core_stopped:
                now = self.clock()
                self._sync_poll()
                self._run_commands(now)
                if now >= self._io_deadline:
                    self._check_deadlines(now)
                if now >= self.core.next_deadline():  # else every input since has advanced it
                    self.core.tick(now)
                self._execute(now)
                if self._core_stopped:
                    break
                self._publish()
                timeout = min(MAX_SELECT_S, max(0.0, self._next_wake() - self.clock()))
                ready = self._sel.select(timeout)
                if ready:
                    self._sync_poll()
                for key, mask in ready:
                    if key.data is None:
                        self._drain_wake()
                    else:
                        self._on_io(key.data, mask, self.clock())
                        self._execute(self.clock())
                        if self._core_stopped:
                            break
        except BaseException as exc:  # a bug: fail loudly, but never leave the user hanging
            log.exception("consumer network thread crashed")
            self.crashed = exc
        finally:
            self._shutdown()

    def _sync_poll(self) -> None:
        lp = self.last_poll
        if lp != self._synced_poll:
            self._synced_poll = lp
            self.core.note_poll(lp)

    def _next_wake(self) -> float:
        return min(self.core.next_deadline(), self._io_deadline)

    def _run_commands(self, now: float) -> None:
        if self.commands.empty():
            return
        while True:
            try:
                fn = self.commands.get_nowait()
            except queue.Empty:
                return
            self._ran += 1
            try:
                fn(self.core, now)
            except Exception as exc:  # a malformed command fails its caller, not this thread
                log.exception("consumer command failed")
                handle = getattr(fn, "handle", None)
                if isinstance(handle, Handle):
                    self._reply(Reply(handle, error=exc))
            self._execute(now)

    def _execute(self, now: float) -> bool:
        """Carry out the core's actions (which may lead to more). True once the core stopped."""
        stopped = False
        while True:
            actions = self.core.take_actions()
            if not actions:
                return stopped
            for a in actions:
                t = type(a)
                if t is Send:
                    self._do_send(a, now)
                elif t is Emit:
                    self.events.put(a.event)
                elif t is Reply:
                    self._reply(a)
                elif t is Connect:
                    self._do_connect(a, now)
                elif t is Disconnect:
                    self._drop(a.conn, a.reason, notify=False, now=now)
                elif t is Stop:
                    stopped = True
                    self._core_stopped = True

    def _publish(self) -> None:
        snap = self.core.snapshot()
        changed = snap is not self.snapshot and snap != self.snapshot
        if changed:
            self.snapshot = snap
        if changed or self.commands_done != self._ran:
            self.commands_done = self._ran
            # At most one Nudge waits in the queue (a consumer that never polls must not grow it):
            # the user side clears the flag when it takes the Nudge, then reads the snapshot, which
            # was published above, before the flag was tested -- so no change goes unnoticed.
            if not self.nudge_pending:
                self.nudge_pending = True
                self.events.put(NUDGE)

    def _reply(self, a: Reply) -> None:
        h = a.handle
        if not isinstance(h, Handle):
            return
        if h.future is not None and not h.future.done():
            if a.error is not None:
                h.future.set_exception(a.error)
            else:
                h.future.set_result(a.value)
        if h.callback is not None:
            self.events.put(CommitCallback(h.callback, h.offsets, a.error))

    # -- sockets -----------------------------------------------------------------------------------
    def _do_connect(self, a: Connect, now: float) -> None:
        self._drop(a.conn, "reconnecting", notify=False, now=now)
        try:
            infos = socket.getaddrinfo(a.host, a.port, 0, socket.SOCK_STREAM)
            family, stype, proto, _, addr = infos[0]
            sock = socket.socket(family, stype, proto)
        except OSError as exc:
            self.core.on_disconnected(a.conn, now, f"cannot resolve {a.host}:{a.port}: {exc}")
            return
        sock.setblocking(False)
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
        err = sock.connect_ex(addr)
        if err not in (0, errno.EINPROGRESS, errno.EWOULDBLOCK, errno.EAGAIN):
            sock.close()
            self.core.on_disconnected(
                a.conn, now, f"connect to {a.host}:{a.port} failed: {errno.errorcode.get(err, err)}"
            )
            return
        security = self.cfg.security
        proto = Connection(
            client_id=self.cfg.client_id,
            max_frame_size=self.cfg.max_frame_bytes,
            sasl=security.sasl_credentials(),
        )
        try:
            tls = security.tls_layer(a.host)
        except (ValueError, ssl.SSLError) as exc:
            sock.close()
            self._auth_failed(a.conn, (a.host, a.port), cerr.SslAuthenticationError(str(exc)), now)
            return
        s = _Sock(
            a.conn, sock, proto, (a.host, a.port), now + self.cfg.s("socket_connection_setup_timeout_ms"), tls
        )
        self._socks[a.conn] = s
        self._io_deadline = min(self._io_deadline, s.setup_deadline)
        self._register(s, selectors.EVENT_WRITE)

    def _register(self, s: _Sock, mask: int) -> None:
        if mask == s.registered:
            return
        if s.registered == 0:
            self._sel.register(s.sock, mask, s)
        elif mask == 0:
            self._sel.unregister(s.sock)
        else:
            self._sel.modify(s.sock, mask, s)
        s.registered = mask

    def _interest(self, s: _Sock) -> None:
        mask = selectors.EVENT_READ
        if s.out or s.state == "connecting":
            mask |= selectors.EVENT_WRITE
        if s.state == "connecting":
            mask = selectors.EVENT_WRITE
        self._register(s, mask)

    def _drop(self, conn_id: str, reason: str, notify: bool, now: float) -> None:
        s = self._socks.pop(conn_id, None)
        if s is None:
            return
        try:
            if s.registered:
                self._sel.unregister(s.sock)
        except (KeyError, ValueError, OSError):
            pass
        try:
            s.sock.close()
        except OSError:
            pass
        error = cerr.KafkaConnectionError(
            f"{conn_id} connection to {s.target[0]}:{s.target[1]} closed: {reason}"
        )
        if reason == HUNG_UP and s.state == "ready":
            self._lower_versions(s)
        for tag, *_ in list(s.inflight.values()):
            self.core.on_response(conn_id, tag, error, now)
        s.inflight.clear()
        if notify:
            log.info("%s connection to %s:%s closed: %s", conn_id, s.target[0], s.target[1], reason)
            self.core.on_disconnected(conn_id, now, reason)

    def _do_send(self, a: Send, now: float) -> None:
        s = self._socks.get(a.conn)
        if s is None or s.state != "ready":
            self.core.on_response(a.conn, a.tag, cerr.KafkaConnectionError(f"{a.conn} is not connected"), now)
            return
        try:
            corr = s.proto.send(a.request, a.version)
        except Exception as exc:  # an encode error is a bug on our side: fail that request only
            log.exception("cannot encode %s v%d", type(a.request).__name__, a.version)
            self.core.on_response(a.conn, a.tag, exc, now)
            return
        s.inflight[corr] = (a.tag, now + a.timeout, a.request.API_KEY, a.version)
        if now + a.timeout < self._io_deadline:
            self._io_deadline = now + a.timeout
        self._pull(s)
        self._flush(s, now)

    def _pull(self, s: _Sock) -> None:
        """Move what the protocol queued to the socket's buffer (through TLS when on)."""
        data = s.proto.data_to_send()
        if s.tls is None:
            s.out += data
            return
        s.tls.write(data)
        s.out += s.tls.data_to_send()

    def _auth_failed(self, conn_id: str, target, error: BaseException, now: float) -> None:
        log.error("%s connection to %s:%s: %s", conn_id, target[0], target[1], error)
        self._drop(conn_id, str(error), notify=False, now=now)
        self.core.on_auth_failed(conn_id, error, now)

    def _flush(self, s: _Sock, now: float) -> None:
        if s.out and s.state != "connecting":
            try:
                n = s.sock.send(s.out)
                del s.out[:n]
            except (BlockingIOError, InterruptedError):
                pass
            except OSError as exc:
                self._drop(s.conn_id, f"send failed: {exc}", notify=True, now=now)
                return
        if self._socks.get(s.conn_id) is s:
            self._interest(s)

    def _on_io(self, s: _Sock, mask: int, now: float) -> None:
        if self._socks.get(s.conn_id) is not s:
            return
        if s.state == "connecting":
            if mask & selectors.EVENT_WRITE:
                err = s.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if err:
                    self._drop(
                        s.conn_id, f"connect failed: {errno.errorcode.get(err, err)}", notify=True, now=now
                    )
                    return
                s.state = "handshake"
                if s.tls is not None:
                    s.tls.start()  # the ClientHello; ApiVersions waits in the layer until it is done
                s.proto.initiate()
                self._pull(s)
                self._flush(s, now)
            return
        if mask & selectors.EVENT_READ:
            try:
                data = s.sock.recv(RECV_BYTES)
            except (BlockingIOError, InterruptedError):
                data = None
            except OSError as exc:
                self._drop(s.conn_id, f"recv failed: {exc}", notify=True, now=now)
                return
            if data == b"":
                if s.tls is not None and not s.tls.handshake_done:
                    why = f"{HUNG_UP} during the TLS handshake (is its listener SSL or SASL_SSL?)"
                    self._drop(s.conn_id, why, notify=True, now=now)
                elif s.tls is not None and s.state == "handshake" and not self.cfg.security.certificate_location:
                    # TLS 1.3: a broker that wants a client certificate refuses it after the client's
                    # side of the handshake; one that closes without its alert looks like this.
                    why = (f"{HUNG_UP} right after the TLS handshake (does it require a client certificate? "
                           f"see ssl.certificate.location)")
                    self._drop(s.conn_id, why, notify=True, now=now)
                else:
                    self._drop(s.conn_id, HUNG_UP, notify=True, now=now)
                return
            if data and s.tls is not None:
                try:
                    data = s.tls.feed(data)
                except ssl.SSLError as exc:
                    fatal, why = tls_failure(exc, *s.target)
                    if fatal and s.state != "ready":
                        self._auth_failed(s.conn_id, s.target, cerr.SslAuthenticationError(why), now)
                    else:
                        self._drop(s.conn_id, why, notify=True, now=now)
                    return
                s.out += s.tls.data_to_send()  # the handshake's next flight
                if s.tls.closed and not data:
                    self._drop(s.conn_id, HUNG_UP, notify=True, now=now)
                    return
            if data:
                try:
                    events = s.proto.receive(data)
                except AuthenticationFailed as exc:
                    self._auth_failed(s.conn_id, s.target, cerr.AuthenticationFailedError(str(exc)), now)
                    return
                except ConnectionBroken as exc:
                    self._drop(s.conn_id, str(exc), notify=True, now=now)
                    return
                # The handshake may have queued a retry at a lower ApiVersions version, or the next
                # SASL token.
                self._pull(s)
                for ev in events:
                    if self._socks.get(s.conn_id) is not s:
                        return
                    if isinstance(ev, Ready):
                        s.state = "ready"
                        versions = dict(ev.versions)
                        for caps in (self._config_caps, self._caps.get(s.target, {})):
                            for key, cap in caps.items():
                                if key in versions:
                                    versions[key] = min(versions[key], cap)
                                    if versions[key] < s.proto.broker_versions.get(key, (0, 0))[0]:
                                        del versions[key]
                        self.core.on_connected(s.conn_id, versions, now)
                    elif isinstance(ev, Response):
                        entry = s.inflight.pop(ev.correlation_id, None)
                        if entry is not None:
                            if ev.error is None:
                                self._answered.setdefault(s.target, set()).add((ev.api_key, ev.api_version))
                            result = ev.error if ev.error is not None else ev.message
                            self.core.on_response(s.conn_id, entry[0], result, now)
                    self._execute(now)
        if self._socks.get(s.conn_id) is s and (mask & selectors.EVENT_WRITE or s.out):
            self._flush(s, now)

    def _lower_versions(self, s: _Sock) -> None:
        answered = self._answered.get(s.target, set())
        for _, _, api_key, version in s.inflight.values():
            if (api_key, version) in answered:
                continue
            lowest = max(
                CLIENT_VERSIONS.get(api_key, (0, 0))[0],
                (s.proto.broker_versions or {}).get(api_key, (0, 0))[0],
            )
            if version - 1 >= lowest:
                caps = self._caps.setdefault(s.target, {})
                if caps.get(api_key, version) >= version:
                    caps[api_key] = version - 1
                    log.warning(
                        "broker %s:%s hung up on api key %d v%d without answering; using v%d from now on",
                        s.target[0],
                        s.target[1],
                        api_key,
                        version,
                        version - 1,
                    )

    def _check_deadlines(self, now: float) -> None:
        """Drop connections past their setup or request deadline; recompute ``_io_deadline``, the
        earliest such deadline (kept no later than the truth in between: a send lowers it, an
        answer leaves it early, so at worst this runs once more than needed)."""
        for s in list(self._socks.values()):
            if s.state != "ready" and now >= s.setup_deadline:
                self._drop(s.conn_id, "connection setup timed out", notify=True, now=now)
                continue
            if any(entry[1] <= now for entry in s.inflight.values()):
                self._drop(s.conn_id, "request timed out", notify=True, now=now)
        t = INF
        for s in self._socks.values():
            if s.state != "ready":
                t = min(t, s.setup_deadline)
            for entry in s.inflight.values():
                t = min(t, entry[1])
        self._io_deadline = t

    def _drain_wake(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except (BlockingIOError, InterruptedError, OSError):
            pass

    # -- shutdown --------------------------------------------------------------------------------
    def _shutdown(self) -> None:
        with self._handoff:
            self._stopped = True
        error = (
            cerr.IllegalStateError("the consumer is closed")
            if self.crashed is None
            else cerr.KafkaError(f"the consumer's network thread crashed: {self.crashed!r}")
        )
        # Commands that will never run: answer whatever they were waiting for.
        while True:
            try:
                fn = self.commands.get_nowait()
            except queue.Empty:
                break
            handle = getattr(fn, "handle", None)
            if isinstance(handle, Handle):
                self._reply(Reply(handle, error=error))
        try:
            for a in self.core.abandon(error):
                self._reply(a)
        except Exception:
            log.exception("abandoning the coordinator failed")
        for conn_id in list(self._socks):
            s = self._socks.pop(conn_id)
            try:
                s.sock.close()
            except OSError:
                pass
        try:
            snap = self.core.snapshot()
            if self.crashed is not None and snap.error is None:
                from dataclasses import replace

                snap = replace(snap, error=error)
            self.snapshot = snap
        except Exception:
            pass
        self.commands_done = self._submitted
        self.events.put(NUDGE)
        try:
            self._sel.close()
        except Exception:
            pass
        for s in (self._wake_r, self._wake_w):
            try:
                s.close()
            except OSError:
                pass
