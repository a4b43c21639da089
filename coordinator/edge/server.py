"""The TCP edge: one ``asyncio.Protocol`` per connection.

frame → header → (ApiVersions, or an unknown API/version: answered or refused here) → body →
runtime. Like a Kafka broker, a connection handles its requests one at a time and in order: a
parked request (a JoinGroup waiting for the rest of its group, a SyncGroup for the leader, a Fetch
long poll) holds its connection's later requests until it is answered. Malformed input closes
that connection only; the process never dies from input.

On a SASL listener a connection starts unauthenticated: it may send ApiVersions, SaslHandshake and
SaslAuthenticate (or, after a v0 SaslHandshake, bare SASL tokens) and nothing else; any other
request closes it, as Kafka does. A failed authentication is answered SASL_AUTHENTICATION_FAILED
and the connection closed after ``FAILED_AUTH_DELAY`` (Kafka's
connection.failed.authentication.delay.ms), which slows a password-guessing client down.

A client may pipeline: the frames of one read are handled in order (at most ``FRAMES_PER_TURN``
per event-loop turn), and the answers given meanwhile leave together in one ``transport.write``
at the end. A request whose work is done but whose answer waits for the log (an OffsetCommit
until its records are on disk) does not hold the connection: the next requests are handled (up to
``MAX_HELD`` answers waiting), so N pipelined commits share one write and one fsync instead of
taking N turns of the disk; their answers still leave in request order (``held``). A later
request handled before an earlier one's records are durable sees no state that is not: the
runtime holds every group answer that reads a shard with a write in flight until that write is
durable, and refuses it if the write fails (see ``coordinator.runtime``). The exceptions answer
from memory as they always did: a Heartbeat (it writes nothing and reads only membership), and
Metadata/FindCoordinator; if the write before such a request then fails, it may have been
answered where, handled later, it would have got COORDINATOR_NOT_AVAILABLE (the next request to
that shard gets it). A steady-state ConsumerGroupHeartbeat is also answered in place, but only when
no write of its shard is in flight (otherwise it takes the full path and waits like any other).
Closing a connection (a malformed frame, an unsupported version) first answers the requests
before the one that closes it, held ones included.
"""
from __future__ import annotations

import asyncio
import errno
import resource
import socket
import struct
import time
from collections import deque

from coordinator import logging_setup
from coordinator.core.versions import API_NAMES, API_VERSIONS, SUPPORTED, api_versions_response
from coordinator.edge.budget import MemoryBudget
from coordinator.edge.turns import Turns
from coordinator.ops.metrics import HTTP_MAX_CONNECTIONS, HTTP_RESERVE, response_error
from protocol import acls as acl_messages
from protocol import errors as E
from protocol import fastpath, produce
from protocol import messages as m
from protocol.framing import FrameDecoder
from protocol.headers import read_request_header
from protocol.sasl import SaslError, server_mechanism
from protocol.wire import EncodeError, ProtocolError

log = logging_setup.get("herd.server")
_SIZE = struct.Struct(">i")
_FRAME_HEAD = struct.Struct(">ii")  # frame size (filled in last), correlation id
_REQUESTS = {**m.REQUESTS, **acl_messages.REQUESTS}
_now = time.perf_counter

# api key -> by version, what follows the correlation id in our response header
_HEADER_TAIL = fastpath.header_tails(SUPPORTED)

_HeartbeatResponse = m.HeartbeatResponse
_HeartbeatRequest = m.HeartbeatRequest
_heartbeat_tail = fastpath.heartbeat_tail
_encode_heartbeat_body = fastpath.encode_heartbeat_body
_parse_steady = fastpath.parse_steady_consumer_heartbeat
_steady_answer = fastpath.steady_consumer_heartbeat_answer
_OffsetCommitResponse = m.OffsetCommitResponse
_encode_offset_commit = fastpath.encode_offset_commit_response
_decode_commit = fastpath.decode_offset_commit_request
_decode_sync = fastpath.decode_sync_group_request
OFFSET_COMMIT = m.OffsetCommitRequest.API_KEY
HEARTBEAT = 12
JOIN_GROUP = m.JoinGroupRequest.API_KEY
# A DescribeGroups (ConsumerGroupDescribe) answer over this many members (and groups) is encoded this
# many a loop turn (Connection._encode_in_turns): one for every group of a coordinator
# (`kafka-consumer-groups --describe --all-groups`) took ~20 ms to encode per 1,000 groups of 10
# (bench/RESULTS.md 15.10).
ENCODE_SLICE_MEMBERS = 2048
_SLICED_ANSWERS = {m.DescribeGroupsRequest.API_KEY: m.DescribeGroupsResponse,
                   m.ConsumerGroupDescribeRequest.API_KEY: m.ConsumerGroupDescribeResponse}
SYNC_GROUP = m.SyncGroupRequest.API_KEY
PENDING_IDS_KEPT = 32  # MEMBER_ID_REQUIRED ids remembered per connection (normally one at a time)
CONSUMER_GROUP_HEARTBEAT = m.ConsumerGroupHeartbeatRequest.API_KEY
SASL_HANDSHAKE = m.SaslHandshakeRequest.API_KEY
SASL_AUTHENTICATE = m.SaslAuthenticateRequest.API_KEY
_SASL_APIS = frozenset({SASL_HANDSHAKE, SASL_AUTHENTICATE})
FAILED_AUTH_DELAY = 0.1  # seconds between a failed authentication's answer and the close
# The largest frame a connection may send before it has authenticated (Kafka's
# sasl.server.max.receive.size): ApiVersions and SASL tokens are small, and a client that has not
# proved who it is must not make herd buffer max_frame_size bytes (8 MiB) per connection.
SASL_MAX_RECEIVE_SIZE = 512 * 1024
TLS_HANDSHAKE_TIMEOUT = 10.0
REFUSED_LOG_INTERVAL = 10.0  # seconds between "too many connections" warnings
REARM_PER_TURN = 128  # held-back connections read again per loop turn (Server.hold_back)
CLOSE_PER_TURN = 256  # connections whose client closed, closed by us per loop turn (Server.close_soon)
BURST_LOG_INTERVAL = 1.0  # seconds between "reading held back" lines
# Log lines about what a client sent: its fields cut to LOG_FIELD_MAX characters, and at most
# LOG_BURST lines of a kind per peer address every LOG_WINDOW_S seconds (the rest counted in
# herd_log_suppressed_total and summed up in the next line of that kind and peer): one client must
# not be able to write megabytes of log a second.
# descriptors herd needs besides its client connections: the HTTP side (its cap and reserve), the
# listeners, the log files (two per shard at most while compacting), the database, the data cluster
FD_OVERHEAD = 64
LOG_FIELD_MAX = 256
LOG_BURST = 5
LOG_WINDOW_S = 10.0
LOG_LIMITER_KEYS = 10_000  # (kind, address) windows kept; past it the oldest are forgotten


def _clip(value):
    """A client-controlled log field, at most LOG_FIELD_MAX characters."""
    if isinstance(value, bytes):
        value = value[:LOG_FIELD_MAX].decode("latin-1")
    if isinstance(value, str) and len(value) > LOG_FIELD_MAX:
        return f"{value[:LOG_FIELD_MAX]}...({len(value)} chars)"
    return value


class LogLimiter:
    """Rate limits of client-caused log lines, per kind and peer address."""

    def __init__(self, metrics=None, burst: int = LOG_BURST, window_s: float = LOG_WINDOW_S):
        self.metrics = metrics
        self.burst, self.window_s = burst, window_s
        self.windows: dict[tuple[str, str], list] = {}  # -> [window start, lines, suppressed]
        self.suppressed: dict[str, int] = {}  # kind -> lines not written

    def allow(self, kind: str, host: str, now: float) -> int | None:
        """None: suppress this line (counted); else the number suppressed since the last one."""
        key = (kind, host)
        w = self.windows.get(key)
        if w is None or now - w[0] >= self.window_s:
            before = w[2] if w is not None else 0
            if w is not None:
                del self.windows[key]  # re-inserted last: the dict stays in order of use
            elif len(self.windows) >= LOG_LIMITER_KEYS:
                for old in list(self.windows)[:LOG_LIMITER_KEYS // 10]:
                    del self.windows[old]
            self.windows[key] = [now, 1, 0]
            return before
        if w[1] < self.burst:
            w[1] += 1
            return 0
        w[2] += 1
        self.suppressed[kind] = self.suppressed.get(kind, 0) + 1
        return None

    def metric_lines(self) -> list[str]:
        out = ["# HELP herd_log_suppressed_total Log lines about clients' requests not written (rate limit per "
               "kind and peer address).", "# TYPE herd_log_suppressed_total counter"]
        out += [f'herd_log_suppressed_total{{kind="{k}"}} {n}' for k, n in sorted(self.suppressed.items())]
        return out


def _decode_whole(cls, frame: bytes, pos: int, version: int):
    """The request body at ``pos``, which must end the frame: Kafka fails a request with bytes
    after its body (``RequestContext.parseRequest``: an InvalidRequestException, and the broker
    closes the connection), so a frame that decodes with bytes to spare is malformed here too."""
    request, end = cls.decode_from(frame, pos, version)
    if end != len(frame):
        raise ProtocolError(f"{cls.NAME} v{version}: {len(frame) - end} bytes after the request body")
    return request


class _Encoded:
    """An answer whose body is already encoded (Connection._encode_in_turns)."""

    __slots__ = ("body",)
    error_code = 0  # for herd_request_errors_total: the describes have per-group errors only

    def __init__(self, body: bytes | bytearray):
        self.body = body


def _encode_body(out: bytearray, response, version: int) -> None:
    """Append the encoded response. A plain HeartbeatResponse (no throttle, no unknown tagged
    fields: what herd sends) is the same few bytes for a given version and error code: cached. An
    OffsetCommit answer: ``fastpath.encode_offset_commit_response`` (None: the generic way)."""
    kind = type(response)
    if kind is _Encoded:
        out += response.body
        return
    if kind is _OffsetCommitResponse:
        body = _encode_offset_commit(response, version)
        if body is not None:
            out += body
            return
    elif kind is _HeartbeatResponse and not response.throttle_time_ms and not response.unknown_tagged_fields:
        out += _encode_heartbeat_body(version, response.error_code)
        return
    response.encode_into(out, version)


class Reply:
    """The token a request travels with: ``reply(response)`` answers it on its connection."""

    __slots__ = ("conn", "correlation_id", "api_key", "api_version", "request", "timer", "started", "held",
                 "data", "amend", "topic_filter")

    def __init__(self, conn, correlation_id, api_key, api_version, request):
        self.started = _now()
        self.conn = conn
        self.correlation_id = correlation_id
        self.api_key = api_key
        self.api_version = api_version
        self.request = request
        self.timer = None
        self.held = False  # done, its answer waits for the log (hold())
        self.data = None  # the encoded answer, while it waits for earlier ones (Connection.held)
        self.amend = None  # the authorization gate's: puts refused parts back into the answer
        self.topic_filter = None  # the gate's: topic -> may the client DESCRIBE it (regex subscriptions)

    def reply(self, response) -> None:
        self.conn.send_response(self, response)

    def park(self, timer) -> None:
        """The answer comes when ``timer`` fires (cancelled if the connection closes first)."""
        self.timer = timer

    def hold(self) -> None:
        """The request is done; its answer waits for the store (the runtime calls this before
        dispatch returns): the connection handles its next request meanwhile, and the answer
        leaves in request order once given."""
        self.held = True

    def __repr__(self):
        return f"Reply({API_NAMES.get(self.api_key)} v{self.api_version} #{self.correlation_id})"


class Connection(asyncio.Protocol):
    def __init__(self, server: Server):
        self.server = server
        self.runtime = server.runtime
        self.decoder = FrameDecoder(server.config.max_frame_size)
        self.transport = None
        self.peer = "?"
        self.host = "?"
        self.client_host = ""
        self.max_pending = server.config.max_pending_bytes_per_connection
        self.queue: deque[bytes | None] = deque()  # None: a malformed frame, see malformed()
        self.queued_bytes = 0
        self.inflight: Reply | None = None  # a parked request: nothing after it is handled yet
        # Answers that must wait for an earlier one, in request order: Reply tokens held for the
        # log (``data`` set once released) and the encoded answers given after them (bytes).
        self.held: deque = deque()
        # While ``processing`` the answers produced collect in ``out`` and leave in one
        # transport.write at the end (a client that pipelines N requests costs one send, not N).
        self.processing = False
        self.out = bytearray()
        self.closed = False
        self.pending_ids: list[tuple[str, str]] | None = None  # MEMBER_ID_REQUIRED ids handed out here
        self.paused = False
        self.write_paused = False  # the transport's write buffer is over its high-water mark
        self.resume_scheduled = False
        self.turn_waiting = False  # its next request (a rebalance one) waits for a loop turn (edge/turns.py)
        self.turn_pass = False
        # Its next request is likely a rebalance one (fresh, its last request was one, or a
        # Heartbeat answered with an error): held back in a burst (Server.hold_back)
        self.rejoin_likely = True
        self.held_back = False  # not read from until Server._rearm's turn for it
        self.rearmed = False  # read again by Server._rearm: its waiting request is not a new burst
        self.dirty = False  # in server.dirty: answers released in a batch, written at its end
        self.closing = False  # close() waits for the answers in ``held``, then aborts
        self.last_active = 0.0
        self.accounted = 0  # bytes counted in server.budget for this connection
        self.memory_paused = False  # not reading: herd's buffered bytes are over max_buffered_bytes
        self.memory_granted = False  # resumed by the budget: the frame being read is admitted
        self.registered = False
        self.auth_timer = None  # closes a connection that has not authenticated in time
        # SASL listener: until authenticated every frame goes to authenticate()
        self.unauthenticated = server.security is not None and server.security.sasl
        self.sasl = None  # the ServerMechanism chosen by SaslHandshake
        self.sasl_raw = False  # after a v0 SaslHandshake the tokens come as bare frames
        self.principal = None  # the authenticated user
        # Kafka's principal (User:name; User:ANONYMOUS until SASL or a client certificate says
        # otherwise), the client's address as ACL hosts name it, and the gate's GROUP READ
        # decisions for the fast paths (coordinator.core.auth.gate)
        self.kafka_principal = "User:ANONYMOUS"
        self.client_ip = ""
        self.authz_cache: dict = {}
        if self.unauthenticated:
            self.decoder.max_frame_size = min(self.decoder.max_frame_size, SASL_MAX_RECEIVE_SIZE)

    # ---- asyncio callbacks ---------------------------------------------------------------------

    def connection_made(self, transport):
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if peer:
            self.peer = f"{peer[0]}:{peer[1]}"
            self.client_host = f"/{peer[0]}"
            self.host = str(peer[0])
            self.client_ip = peer[0]
        if self.server.gate is not None and self.server.principal_rules is not None:
            from coordinator.core.auth.principal import NoMatchingRule, tls_principal
            try:
                self.kafka_principal = tls_principal(self.server.principal_rules,
                                                     transport.get_extra_info("peercert"))
            except NoMatchingRule as exc:  # Kafka fails the authentication
                log.warning("no ssl_principal_mapping_rules rule maps the client certificate; closing",
                            peer=self.peer, reason=str(exc))
                self.closed = True
                transport.abort()
                return
        sock = transport.get_extra_info("socket")
        if sock is not None:
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        self.last_active = self.server.loop.time()
        why = self.server.register(self)
        if why is not None:
            self.server.refused(self.peer, why)
            self.closed = True
            transport.abort()
            return
        if self.unauthenticated:
            self.auth_timer = self.server.loop.call_later(self.server.config.sasl_handshake_timeout_ms / 1000,
                                                          self._auth_deadline)

    def _auth_deadline(self) -> None:
        """sasl_handshake_timeout_ms passed and the connection has not authenticated: closed."""
        self.auth_timer = None
        if self.closed or not self.unauthenticated:
            return
        self.server.client_log("info", "sasl_handshake_timeout", self.host,
                               "not authenticated within sasl_handshake_timeout_ms; closing connection",
                               peer=self.peer, timeout_ms=self.server.config.sasl_handshake_timeout_ms)
        if self.server.metrics is not None:
            self.server.metrics.connections_closed.inc("sasl_handshake_timeout")
        self.close()
        if not self.closed:  # answers still held: nothing an unauthenticated client waits for matters
            self._abort()

    def _minted(self, group_id: str, member_id: str) -> None:
        """A JoinGroup on this connection was answered MEMBER_ID_REQUIRED: remember the id (the last
        PENDING_IDS_KEPT) so that the group stops waiting for it if this connection closes first."""
        if self.closed:  # answered after its connection closed: nobody will ever use the id
            self.runtime.forget_pending([(group_id, member_id)])
            return
        if self.pending_ids is None:
            self.pending_ids = []
        self.pending_ids.append((group_id, member_id))
        if len(self.pending_ids) > PENDING_IDS_KEPT:
            del self.pending_ids[0]

    def eof_received(self):
        """The client closed its side (it sends nothing more). uvloop would close the transport at
        once, and the close() system calls of every connection whose EOF one poll phase read would
        then run in the next loop turn: 10,000 clients gone at once held the loop 0.2-0.3 s (bench
        RESULTS 15.9). So the connection is done here (nothing more is handled or answered, as on
        uvloop's own close) and its transport closed in a later turn, CLOSE_PER_TURN a turn
        (``Server.close_soon``). TLS transports close as before (their EOF cannot be kept open)."""
        if self.server.tls:
            return None
        self.closed = True
        self.server.close_soon(self)
        return True

    def connection_lost(self, exc):
        self.closed = True
        if self.pending_ids:  # member ids handed out here that no client can come back with now
            pending, self.pending_ids = self.pending_ids, None
            try:
                self.runtime.forget_pending(pending)
            except Exception:  # our bug: logged; the ids still expire at their session timeout
                log.exception("cannot forget the pending member ids of a closed connection", peer=self.peer)
        if self.auth_timer is not None:
            self.auth_timer.cancel()
            self.auth_timer = None
        self.server.unregister(self)
        if self.inflight is not None and self.inflight.timer is not None:
            self.inflight.timer.cancel()
        self.inflight = None  # a parked request answered later finds nobody (and no Reply<->Connection cycle)
        self.held.clear()
        self.queue.clear()
        self.out = bytearray()

    def data_received(self, data):
        if self.closed or self.closing:
            return
        server = self.server
        self.last_active = server.loop.time()
        frames, error = self.decoder.split(data)
        if error is not None:
            self.malformed(frames, error)
            return
        if frames:
            self.memory_granted = False  # the admitted frame is read: the next one asks again
            if len(frames) == 1 and not self.queue and not self.processing and self._ready():
                frame = frames[0]
                if not server.turns.defers(self, frame):
                    self.handle_one(frame)  # the common case: no queue round trip
                else:  # a rebalance request after this turn's budget: queued until its turn
                    # (a burst of thousands of rejoins is read in one poll phase: this path is
                    # kept short, the pause check and the accounting in one step)
                    self.queued_bytes += len(frame)
                    self.queue.append(frame)
                    if self.rearmed:  # held back in a burst and read again: paced already
                        self.rearmed = False
                    else:
                        server.turns.read_deferred()
            else:
                for f in frames:
                    self.queued_bytes += len(f)
                self.queue.extend(frames)
                if not self.processing and self._ready():
                    self.process()
        if self.closed:
            return
        written = self.transport.get_write_buffer_size()  # asked once for both
        self._maybe_pause(written)
        self._account(written)

    def _account(self, written: int | None = None) -> None:
        """Report this connection's buffered bytes (requests, the frame being read at its whole
        announced size, unsent answers: ``written``, the transport's if not given) to the server's
        budget (max_buffered_bytes)."""
        if self.closed:
            return
        if written is None:
            written = self.transport.get_write_buffer_size()
        # a connection paused for memory holds what it read, not the frame it announced
        frame = self.decoder.buffered if self.memory_paused else self.decoder.reserved
        new = self.queued_bytes + frame + written
        delta = new - self.accounted
        if delta:
            self.accounted = new
            self.server.buffered_change(self, delta)

    def memory_pause(self) -> None:
        if not self.memory_paused and not self.closed:
            self.memory_paused = True
            if not self.paused:
                self.paused = True
                self.transport.pause_reading()
            self._account()

    def memory_resume(self) -> None:
        self.memory_paused = False
        self._maybe_resume()
        self._account()

    def _pending(self, written: int | None = None) -> int:
        if written is None:
            written = self.transport.get_write_buffer_size()
        return self.queued_bytes + self.decoder.buffered + written

    def _maybe_pause(self, written: int | None = None) -> None:
        if not self.paused and not self.closed and (self.write_paused or self._pending(written) > self.max_pending):
            self.paused = True
            self.transport.pause_reading()

    # asyncio flow control: the peer does not read our answers fast enough
    def pause_writing(self):
        self.write_paused = True
        self._maybe_pause()

    def resume_writing(self):
        self.write_paused = False
        if self.queue and not self.processing and self._ready():
            self.process()
        else:
            self._maybe_resume()
        self._account()

    def _continue(self) -> None:
        self.resume_scheduled = False
        if self.queue and not self.processing and self._ready():
            self.process()

    def resume_turn(self) -> None:
        """Its waiting rebalance request's turn has come (edge/turns.py)."""
        if self.queue and not self.processing and self._ready():
            self.process()

    def _ready(self) -> bool:
        """May the next request be handled now?"""
        return self.inflight is None and len(self.held) < self.MAX_HELD and not self.closed \
            and not self.closing and not self.write_paused

    # ---- requests ----------------------------------------------------------------------------

    FRAMES_PER_TURN = 32
    MAX_HELD = 64  # answers waiting for the log (or behind one) before the connection stops reading

    def process(self) -> None:
        """Handle queued frames: at most FRAMES_PER_TURN per event-loop turn (fairness between
        connections), none while the peer is not reading our answers (write backpressure). The
        answers given meanwhile leave together at the end."""
        self.processing = True
        budget = self.FRAMES_PER_TURN
        try:
            while self.queue and self._ready():
                if budget == 0:
                    if not self.resume_scheduled:
                        self.resume_scheduled = True
                        self.server.loop.call_soon(self._continue)
                    break
                if self.queue[0] is not None and self.server.turns.defers(self, self.queue[0]):
                    break  # a rebalance request waits for a later loop turn (edge/turns.py)
                budget -= 1
                frame = self.queue.popleft()
                if frame is None:  # the end of a malformed stream
                    self.fail("malformed frame", self.decoder.error)
                    break
                self.queued_bytes -= len(frame)
                self.handle(frame)
        finally:
            self.processing = False
        self.flush()
        self._maybe_resume()
        self._account()

    def handle_one(self, frame: bytes) -> None:
        """``process`` for a single frame that arrived on an idle connection."""
        self.processing = True
        try:
            self.handle(frame)
        finally:
            self.processing = False
        self.flush()
        self._maybe_resume()

    def _maybe_resume(self) -> None:
        if self.paused and not self.closed and not self.closing and not self.write_paused \
                and not self.memory_paused and not self.held_back and self.decoder.error is None \
                and self._pending() <= self.max_pending // 2:
            self.paused = False
            self.transport.resume_reading()

    def handle(self, frame: bytes) -> None:
        if self.sasl_raw:  # a bare token after a v0 SaslHandshake, answered bare
            self.raw_sasl_token(frame)
            return
        try:
            api_key, version, correlation_id, client_id, _, pos = read_request_header(frame)
        except ProtocolError as exc:
            self.fail("malformed request header", exc)
            return
        if api_key == API_VERSIONS:
            self.api_versions(version, correlation_id, frame, pos)
            return
        if self.unauthenticated:
            self.authenticate(api_key, version, correlation_id, client_id, frame, pos)
            return
        rng = SUPPORTED.get(api_key)
        if rng is None or not rng[0] <= version <= rng[1]:
            # Kafka closes the connection for an API or version it does not serve.
            self.server.client_log("warning", "unsupported_version", self.host,
                                   "unsupported api or version; closing connection", peer=self.peer,
                                   client_id=client_id, api_key=api_key, api_version=version,
                                   api=API_NAMES.get(api_key))
            self.close()
            return
        if api_key == HEARTBEAT:
            self.heartbeat(version, correlation_id, client_id, frame, pos)
            return
        if api_key == CONSUMER_GROUP_HEARTBEAT:
            if self.server.cg_fast and self.consumer_heartbeat_steady(version, correlation_id, client_id, frame, pos):
                return
            if self.server.turns.defers_late(self):  # the full path is rebalance work: it waits for a turn
                self.queue.appendleft(frame)
                self.queued_bytes += len(frame)
                return
        if api_key == produce.API_KEY:
            self.produce(version, correlation_id, client_id, frame, pos)
            return
        if api_key in _SASL_APIS:
            self.sasl_not_expected(api_key, version, correlation_id, client_id, frame, pos)
            return
        cls = _REQUESTS[api_key]
        # the shortcuts for the usual shapes (protocol/fastpath.py); None: the codec's way
        request = (_decode_commit(frame, pos, version) if api_key == OFFSET_COMMIT
                   else _decode_sync(frame, pos, version) if api_key == SYNC_GROUP else None)
        if request is None:
            try:
                request = _decode_whole(cls, frame, pos, version)
            except ProtocolError as exc:
                self.fail(f"malformed {cls.NAME} v{version}", exc, client_id=client_id)
                return
        token = self.inflight = Reply(self, correlation_id, api_key, version, request)
        gate = self.server.gate
        if gate is not None:  # the one authorization point (coordinator/core/auth/gate.py)
            refusal, token.amend = gate.check(self.kafka_principal, self.client_ip, api_key, version, request, token)
            if refusal is not None:
                self.send_response(token, refusal)
                return
        try:
            self.runtime.dispatch(token, api_key, version, request, client_id or "", self.client_host)
        except Exception:  # our bug: log it with context, drop this connection, keep serving
            log.exception("error handling request", peer=self.peer, client_id=_clip(client_id),
                          api=cls.NAME, api_version=version)
            self.close()
            return
        if token.held and self.inflight is token:  # done, its answer waits for the log: go on
            self.inflight = None
            self.held.append(token)

    def heartbeat(self, version: int, correlation_id: int, client_id: str | None, frame: bytes, pos: int) -> None:
        """The most frequent request, answered in place (it writes nothing and waits for nothing):
        no Reply token, no response object, the answer's bytes cached per (version, error code).
        Called while processing, so the answer joins ``out`` in request order."""
        started = _now()
        try:
            request = _decode_whole(_HeartbeatRequest, frame, pos, version)
        except ProtocolError as exc:
            self.fail(f"malformed Heartbeat v{version}", exc, client_id=client_id)
            return
        try:
            gate = self.server.gate
            if gate is not None and not gate.group_read(self.authz_cache, self.kafka_principal, self.client_ip,
                                                        request.group_id):
                code = E.GROUP_AUTHORIZATION_FAILED
            else:
                code = self.runtime.heartbeat(version, request)
        except Exception:  # our bug: log it with context, drop this connection, keep serving
            log.exception("error handling request", peer=self.peer, client_id=_clip(client_id), api="Heartbeat",
                          api_version=version)
            self.close()
            return
        if (code != 0) != self.rejoin_likely:  # REBALANCE_IN_PROGRESS, UNKNOWN_MEMBER_ID, ...: it rejoins next
            if code:
                self.server.turns.rejoin_likely(self)
            else:
                self.server.turns.unlikely(self)
        tail = _heartbeat_tail(version, code)
        if self.held:  # behind an answer that waits for the log
            self.held.append(_FRAME_HEAD.pack(len(tail) + 4, correlation_id) + tail)
        else:
            out = self.out
            out += _FRAME_HEAD.pack(len(tail) + 4, correlation_id)
            out += tail
        metrics = self.server.metrics
        if metrics is not None:
            metrics.request_stats.observe(HEARTBEAT, _now() - started, code)

    def consumer_heartbeat_steady(self, version: int, correlation_id: int, client_id: str | None, frame: bytes,
                                  pos: int) -> bool:
        """A ConsumerGroupHeartbeat that changes nothing, answered in place, as a Heartbeat is: ->
        False (nothing done) unless it is one. The frame must be exactly a group id and a member
        id (compact strings of 1-126 bytes), an epoch > 0 and every other field null
        (``protocol.fastpath.parse_steady_consumer_heartbeat``), and the member Stable at its
        group's assignment epoch with nothing to write or to wait for (see
        Runtime.consumer_heartbeat_steady); then the session deadline moves and the answer is the
        full path's: member id, epoch, interval, no assignment. Anything else (a join, an
        acknowledgement, a leave, an error to answer, a malformed frame) takes the full path."""
        steady = _parse_steady(frame, pos, version)
        if steady is None:
            return False  # the full path's decoder says what it is
        group_id, member_id, epoch, member_span = steady
        gate = self.server.gate
        if gate is not None and not gate.group_read(self.authz_cache, self.kafka_principal, self.client_ip,
                                                    group_id):
            return False  # the full path refuses it
        started = _now()
        try:
            interval = self.runtime.consumer_heartbeat_steady(group_id, member_id, epoch, client_id or "",
                                                              self.client_host)
        except Exception:  # our bug: log it with context, drop this connection, keep serving
            log.exception("error handling request", peer=self.peer, client_id=_clip(client_id),
                          api="ConsumerGroupHeartbeat", api_version=version)
            self.close()
            return True
        if interval is None:
            return False
        if self.rejoin_likely:
            self.server.turns.unlikely(self)
        body = _steady_answer(frame, member_span, epoch, interval)
        answer = _FRAME_HEAD.pack(len(body) + 4, correlation_id) + body
        if self.held:  # behind an answer that waits for the log
            self.held.append(answer)
        else:
            self.out += answer
        metrics = self.server.metrics
        if metrics is not None:
            metrics.request_stats.observe(CONSUMER_GROUP_HEARTBEAT, _now() - started, 0)
        return True

    def produce(self, version: int, correlation_id: int, client_id: str | None, frame: bytes, pos: int) -> None:
        """herd stores no records: every partition gets INVALID_REQUEST (acks=0: no answer)."""
        try:
            request = produce.decode_request(frame, pos, version)
        except ProtocolError as exc:
            self.fail("malformed Produce", exc, client_id=client_id)
            return
        if request.acks == 0:
            return
        token = self.inflight = Reply(self, correlation_id, produce.API_KEY, version, request)
        self.send_response(token, produce.ProduceResponse(
            request, E.INVALID_REQUEST, "herd is a consumer-group coordinator and stores no records"))

    def api_versions(self, version: int, correlation_id: int, frame: bytes, pos: int) -> None:
        lo, hi = SUPPORTED[API_VERSIONS]
        token = self.inflight = Reply(self, correlation_id, API_VERSIONS, version, None)
        if not lo <= version <= hi:
            # KIP-511: answer in v0 format with our ApiVersions range so the client can retry lower.
            token.api_version = 0
            resp = m.ApiVersionsResponse(error_code=E.UNSUPPORTED_VERSION, api_keys=[
                m.ApiVersionsResponseApiVersion(api_key=API_VERSIONS, min_version=lo, max_version=hi)])
            self.send_response(token, resp)
            return
        try:
            _decode_whole(m.ApiVersionsRequest, frame, pos, version)
        except ProtocolError:
            self.send_response(token, api_versions_response(E.INVALID_REQUEST))
            return
        self.send_response(token, self.server.api_versions_cache)

    # ---- SASL ----------------------------------------------------------------------------------

    def raw_sasl_token(self, frame: bytes) -> None:
        answer = self._sasl_step(frame, None)
        if answer is not None:
            self.out += _SIZE.pack(len(answer))
            self.out += answer

    def authenticate(self, api_key: int, version: int, correlation_id: int, client_id, frame: bytes,
                     pos: int) -> None:
        """A request (not ApiVersions) of a connection that has not authenticated yet."""
        if api_key not in _SASL_APIS:
            self.server.client_log("warning", "unauthenticated_request", self.host,
                                   "request before SASL authentication; closing connection", peer=self.peer,
                                   client_id=client_id, api=API_NAMES.get(api_key, api_key))
            self.close()
            return
        lo, hi = SUPPORTED[api_key]
        cls = _REQUESTS[api_key]
        if not lo <= version <= hi:
            self.server.client_log("warning", "unsupported_version", self.host,
                                   "unsupported api or version; closing connection", peer=self.peer,
                                   client_id=client_id, api=cls.NAME, api_version=version)
            self.close()
            return
        try:
            request = _decode_whole(cls, frame, pos, version)
        except ProtocolError as exc:
            self.fail(f"malformed {cls.NAME} v{version}", exc, client_id=client_id)
            return
        token = self.inflight = Reply(self, correlation_id, api_key, version, request)
        if api_key == SASL_HANDSHAKE:
            self._sasl_handshake(token, request.mechanism, client_id)
            return
        if self.sasl is None:
            self.send_response(token, m.SaslAuthenticateResponse(
                error_code=E.ILLEGAL_SASL_STATE, error_message="SaslAuthenticate before SaslHandshake"))
            self._close_after_failed_auth()
            return
        answer = self._sasl_step(request.auth_bytes, token)
        if answer is not None:
            self.send_response(token, m.SaslAuthenticateResponse(auth_bytes=answer, session_lifetime_ms=0))

    def _sasl_handshake(self, token: Reply, mechanism: str, client_id) -> None:
        security = self.server.security
        enabled = security.mechanisms
        if self.sasl is not None:
            self.send_response(token, m.SaslHandshakeResponse(error_code=E.ILLEGAL_SASL_STATE, mechanisms=enabled))
            self._close_after_failed_auth()
            return
        if mechanism not in enabled:
            self.server.client_log("warning", "unsupported_mechanism", self.host,
                                   "unsupported SASL mechanism; closing connection", peer=self.peer,
                                   client_id=client_id, mechanism=mechanism, enabled=",".join(enabled))
            self.send_response(token, m.SaslHandshakeResponse(error_code=E.UNSUPPORTED_SASL_MECHANISM,
                                                              mechanisms=enabled))
            self._close_after_failed_auth()
            return
        self.sasl = server_mechanism(mechanism, security.users)
        self.sasl_raw = token.api_version == 0
        self.send_response(token, m.SaslHandshakeResponse(mechanisms=enabled))

    def _sasl_step(self, client_token: bytes, token: Reply | None) -> bytes | None:
        """Feed the mechanism; -> the answer token, or None when the connection failed (answered
        and closing)."""
        mech = self.sasl
        metrics = self.server.metrics
        try:
            answer = mech.step(client_token)
        except SaslError as exc:
            self.server.client_log("info", "authentication_failed", self.host, "SASL authentication failed",
                                   peer=self.peer, mechanism=mech.name, user=mech.username, reason=str(exc))
            if metrics is not None:
                metrics.authentications.inc(mech.name, "failed")
            if token is not None:
                self.send_response(token, m.SaslAuthenticateResponse(
                    error_code=E.SASL_AUTHENTICATION_FAILED, error_message=str(exc)))
            self._close_after_failed_auth()
            return None
        if mech.done:
            self.unauthenticated = False
            if self.auth_timer is not None:
                self.auth_timer.cancel()
                self.auth_timer = None
            self.sasl_raw = False
            self.principal = mech.username
            self.kafka_principal = "User:" + mech.username
            # from the next read on (frames already split came under the pre-authentication
            # limit; Kafka's clients wait for this answer before they send another request)
            self.decoder.max_frame_size = self.server.config.max_frame_size
            log.debug("SASL authenticated", peer=self.peer, mechanism=mech.name, user=_clip(mech.username))
            if metrics is not None:
                metrics.authentications.inc(mech.name, "ok")
        return answer

    def _close_after_failed_auth(self) -> None:
        """Answer, read nothing more, and close after FAILED_AUTH_DELAY (gracefully, so the answer
        is not lost to a reset when the client sent more behind the refused request)."""
        self.flush()
        self.inflight = None
        self.queue.clear()
        self.queued_bytes = 0
        self.closing = True
        if not self.paused:
            self.paused = True
            self.transport.pause_reading()
        self.server.loop.call_later(FAILED_AUTH_DELAY, self._finish_failed_auth)

    def _finish_failed_auth(self) -> None:
        if self.closed:
            return
        self.flush()
        self.closed = True
        self.closing = False
        self.transport.close()

    def sasl_not_expected(self, api_key: int, version: int, correlation_id: int, client_id, frame: bytes,
                          pos: int) -> None:
        """SaslHandshake/SaslAuthenticate on a connection without SASL or already authenticated:
        ILLEGAL_SASL_STATE, as Kafka answers (herd does not re-authenticate, KIP-368)."""
        cls = _REQUESTS[api_key]
        try:
            _decode_whole(cls, frame, pos, version)
        except ProtocolError as exc:
            self.fail(f"malformed {cls.NAME} v{version}", exc, client_id=client_id)
            return
        token = self.inflight = Reply(self, correlation_id, api_key, version, None)
        if api_key == SASL_HANDSHAKE:
            security = self.server.security
            enabled = security.mechanisms if security is not None and security.sasl else []
            self.send_response(token, m.SaslHandshakeResponse(error_code=E.ILLEGAL_SASL_STATE, mechanisms=enabled))
        else:
            self.send_response(token, m.SaslAuthenticateResponse(
                error_code=E.ILLEGAL_SASL_STATE,
                error_message="SaslAuthenticate request received after successful authentication"
                if self.principal is not None else "this listener does not use SASL"))

    # ---- responses ---------------------------------------------------------------------------

    def send_response(self, token: Reply, response) -> None:
        if token.api_key == JOIN_GROUP and response.error_code == E.MEMBER_ID_REQUIRED and response.member_id:
            self._minted(token.request.group_id, response.member_id)
        elif token.api_key in _SLICED_ANSWERS and token is self.inflight \
                and type(response) is _SLICED_ANSWERS[token.api_key] and not response.unknown_tagged_fields \
                and not self.closed:
            if token.amend is not None:
                response, token.amend = token.amend(response), None
            if len(response.groups) + sum(len(g.members) for g in response.groups) > ENCODE_SLICE_MEMBERS:
                self._encode_in_turns(token, response, 0, bytearray())
                return
        if token is self.inflight:
            self.inflight = None
            waits = bool(self.held)  # behind an answer that waits for the log
            if waits:
                self.held.append(token)
        elif token.held and token.data is None and token.conn is self and self.held:
            waits = True  # released by the log: leaves once the answers before it have
        else:
            return  # the connection moved on (closed and cleaned up); drop the late answer
        if self.closed:
            return
        version = token.api_version
        if token.amend is not None:
            response = token.amend(response)
        out = token.data = bytearray() if waits else self.out
        start = len(out)
        out += _FRAME_HEAD.pack(0, token.correlation_id)
        out += _HEADER_TAIL[token.api_key][version]
        try:
            _encode_body(out, response, version)
        except EncodeError:
            del out[start:]
            log.exception("cannot encode response", peer=self.peer, response=type(response).__name__,
                          api_version=version)
            self.close()
            return
        _SIZE.pack_into(out, start, len(out) - start - 4)
        metrics = self.server.metrics
        if metrics is not None:
            metrics.request_stats.observe(token.api_key, _now() - token.started,
                                          response_error(token.api_key, response))
        if waits:
            self._release_held()
        if not self.processing:  # an answer released later (after a log write, a rebalance, a wait)
            server = self.server
            if server.holding:  # more answers come in this batch: write once, at its end
                if not self.dirty:
                    self.dirty = True
                    server.dirty.append(self)
            else:
                self.released()

    def _encode_in_turns(self, token: Reply, response, start: int, body: bytearray) -> None:
        """Encode a big DescribeGroups (ConsumerGroupDescribe) answer ENCODE_SLICE_MEMBERS members
        (and groups) a loop turn, then send it. The request stays in flight meanwhile, so nothing
        after it on this connection is handled before its answer leaves."""
        if token is not self.inflight or self.closed:
            return  # the connection closed meanwhile
        groups, version, cls = response.groups, token.api_version, type(response)
        if start == 0:
            body += fastpath.list_answer_frame(cls, len(groups), version, response.throttle_time_ms)[0]
        end, budget = start, ENCODE_SLICE_MEMBERS
        while end < len(groups) and budget > 0:
            budget -= 1 + len(groups[end].members)
            end += 1
        try:
            body += fastpath.encode_list_entries(cls, groups[start:end], version)
        except EncodeError:
            log.exception("cannot encode response", peer=self.peer, response=type(response).__name__,
                          api_version=version)
            self.close()
            return
        if end < len(groups):
            self.server.loop.call_soon(self._encode_in_turns, token, response, end, body)
            return
        body += fastpath.list_answer_frame(cls, len(groups), version, response.throttle_time_ms)[1]
        self.send_response(token, _Encoded(body))  # the bytearray itself: no copy of a big answer

    def released(self) -> None:
        """Write what was released while no request was being handled; go on with the queue."""
        self.dirty = False
        if self.closed:
            return
        self.flush()
        if self.closing:
            if not self.held:
                self._abort()
            return
        if self.queue and self._ready():
            self.process()
        else:
            self._maybe_resume()
        self._account()

    def _release_held(self) -> None:
        """Move the answers at the head of ``held`` that are ready to ``out``."""
        held, out = self.held, self.out
        while held:
            head = held[0]
            if type(head) is Reply:
                if head.data is None:
                    return
                out += head.data
                head.data = None
            else:
                out += head
            held.popleft()

    def flush(self) -> None:
        """Write the answers collected in ``out`` (in request order: one request in flight)."""
        if self.out:
            self.transport.write(self.out)
            self.out = bytearray()  # the transport may keep the one it was given

    # ---- closing -----------------------------------------------------------------------------

    def malformed(self, frames: list[bytes], error: ProtocolError) -> None:
        """An invalid size prefix: the stream cannot be followed past it. The requests before it
        (``frames``, and any still queued) are answered first, as a broker reading one request at
        a time would; then the connection closes. Nothing more is read."""
        if not self.paused:
            self.paused = True
            self.transport.pause_reading()
        if not frames and not self.queue and not self.processing and self._ready():
            self.fail("malformed frame", error)
            return
        for f in frames:
            self.queued_bytes += len(f)
        self.queue.extend(frames)
        self.queue.append(None)  # process() closes the connection when it reaches this
        if not self.processing and self._ready():
            self.process()

    def fail(self, what: str, exc: Exception, **kw) -> None:
        self.server.client_log("warning", "malformed", self.host, f"{what}; closing connection", peer=self.peer,
                               error=str(exc), **kw)
        self.close()

    def close(self) -> None:
        """Close after answering every request before the one that closes the connection: those
        whose answers wait for the log are answered first (nothing more is read meanwhile)."""
        if self.closed or self.closing:
            return
        self.flush()
        self.inflight = None  # a parked request: dropped, as a broker closing the connection does
        self.queue.clear()
        self.queued_bytes = 0
        if self.held:
            self.closing = True
            if not self.paused:
                self.paused = True
                self.transport.pause_reading()
            return
        self._abort()

    def _abort(self) -> None:
        self.closed = True
        self.closing = False
        self.held.clear()
        self.transport.abort()


class Server:
    def __init__(self, config, runtime, metrics=None, security=None, *, gate=None, principal_rules=None):
        self.config = config
        self.runtime = runtime
        self.metrics = metrics
        self.security = security  # coordinator.security.Security, None: PLAINTEXT
        # authorizer = acl: the authorization point (coordinator.core.auth.gate.Gate) and the
        # ssl_principal_mapping_rules for TLS client certificates (None: not a TLS listener)
        self.gate = gate
        self.principal_rules = principal_rules
        self.loop: asyncio.AbstractEventLoop | None = None
        self.connections: set[Connection] = set()
        self.server: asyncio.base_events.Server | None = None
        self.api_versions_cache = api_versions_response()
        # ConsumerGroupHeartbeats that change nothing answered at the edge (False: all dispatched)
        self.cg_fast = True
        self._idle_timer = None
        self.port = None
        self.refused_total = 0
        self._refused_logged_at = float("-inf")
        self._refused_logged_total = 0
        # While the runtime releases a batch of answers (what one fsync made durable), each
        # connection's answers collect and leave in one write at the end (begin/end_batch).
        self.holding = False
        self.dirty: list[Connection] = []
        self.log_limiter = LogLimiter(metrics)
        self.max_connections = config.max_connections  # lowered at start if the open-file limit is lower
        self.per_ip: dict[str, int] = {}
        self.refused_per_ip = 0
        # max_buffered_bytes: what every connection holds, counted as it changes (Connection._account)
        self.budget = MemoryBudget(config.buffered_bytes_limit, self._call_soon)
        self.accept_failures = 0
        # rebalance requests yield to the rest when a loop turn is long (edge/turns.py); a burst
        # of them holds back the connections likely to send more (hold_back)
        self.turns = Turns(self._call_soon)
        self.turns.on_burst = self.hold_back
        self.held_back: deque[Connection] = deque()
        self.rearm_per_turn = REARM_PER_TURN
        self.tls = security is not None and security.ssl_context is not None
        self.to_close: deque[Connection] = deque()  # their client closed; closed by us in turns
        self.close_per_turn = CLOSE_PER_TURN
        self.close_scheduled = False
        self.rearm_scheduled = False
        self.read_bursts = 0
        self.held_back_total = 0
        self._burst_logged_at = float("-inf")
        if metrics is not None:
            metrics.collectors.append(self.log_limiter.metric_lines)
            metrics.collectors.append(self.metric_lines)
        runtime.attach_edge(self)

    def client_log(self, level: str, kind: str, host: str, event: str, **fields) -> None:
        """A log line about what a client sent: fields clipped, rate-limited per kind and address."""
        now = self.loop.time() if self.loop is not None else time.monotonic()
        suppressed = self.log_limiter.allow(kind, host, now)
        if suppressed is None:
            return
        if suppressed:
            fields["suppressed_before"] = suppressed
        getattr(log, level)(event, **{k: _clip(v) for k, v in fields.items()})

    def begin_batch(self) -> None:
        self.holding = True

    def end_batch(self) -> None:
        self.holding = False
        dirty, self.dirty = self.dirty, []
        for conn in dirty:
            try:
                conn.released()
            except Exception:  # our bug: log it, drop that connection, keep the others going
                conn.dirty = False
                log.exception("error writing released answers", peer=conn.peer)
                conn._abort()

    def register(self, conn: Connection) -> str | None:
        """None: served; else why not (``max_connections`` or ``max_connections_per_ip``)."""
        if len(self.connections) >= self.max_connections:
            return "max_connections"
        host = conn.host
        n = self.per_ip.get(host, 0)
        if n >= self.config.max_connections_per_ip:
            return "max_connections_per_ip"
        self.per_ip[host] = n + 1
        conn.registered = True
        self.connections.add(conn)
        if conn.rejoin_likely:
            self.turns.likely.add(conn)
        if self.metrics is not None:
            self.metrics.connections_total.inc()
        return None

    def refused(self, peer: str, why: str = "max_connections") -> None:
        """A connection over ``max_connections`` (or ``max_connections_per_ip``): counted, and
        logged at most once per REFUSED_LOG_INTERVAL seconds (a client retrying in a loop must not
        flood the log)."""
        self.refused_total += 1
        if why == "max_connections_per_ip":
            self.refused_per_ip += 1
        if self.metrics is not None:
            self.metrics.connections_refused.inc()
        now = self.loop.time()
        if now >= self._refused_logged_at + REFUSED_LOG_INTERVAL:
            limit = self.max_connections if why == "max_connections" else self.config.max_connections_per_ip
            log.warning("too many connections; refusing", peer=peer, limit=limit, setting=why,
                        refused_since_last=self.refused_total - self._refused_logged_total)
            self._refused_logged_at, self._refused_logged_total = now, self.refused_total

    def unregister(self, conn: Connection) -> None:
        self.connections.discard(conn)
        self.turns.likely.discard(conn)
        if conn.registered:
            conn.registered = False
            n = self.per_ip.get(conn.host, 1) - 1
            if n > 0:
                self.per_ip[conn.host] = n
            else:
                self.per_ip.pop(conn.host, None)
        if conn.accounted:
            self.buffered_change(conn, -conn.accounted)
            conn.accounted = 0

    def close_soon(self, conn: Connection) -> None:
        """Close ``conn``'s transport in a later loop turn, ``close_per_turn`` a turn (see
        Connection.eof_received)."""
        self.to_close.append(conn)
        if not self.close_scheduled:
            self.close_scheduled = True
            self._call_soon(self._close_some)

    def _close_some(self) -> None:
        queue = self.to_close
        for _ in range(min(len(queue), self.close_per_turn)):
            transport = queue.popleft().transport
            if transport is not None:
                transport.close()  # what uvloop does at an EOF: connection_lost follows next turn
        if queue:
            self._call_soon(self._close_some)
        else:
            self.close_scheduled = False

    def hold_back(self) -> None:
        """A burst of rebalance requests is being read (edge/turns.py: ``hold_back_after`` of them
        read and deferred in this poll phase): stop reading every connection likely to send one
        next that has not yet (``rejoin_likely``, nothing parked or waiting), so that libuv's poll
        phase ends and the loop turns; ``_rearm`` reads them again, ``rearm_per_turn`` per turn.
        Their requests wait in the kernel meanwhile; nothing is lost or reordered."""
        started = _now()
        held = self.held_back
        before = len(held)
        for conn in self.turns.likely:
            if conn.rejoin_likely and not conn.paused and conn.inflight is None and not conn.turn_waiting \
                    and not conn.closed and not conn.closing:
                conn.held_back = conn.paused = True
                conn.transport.pause_reading()
                held.append(conn)
        n = len(held) - before
        self.read_bursts += 1
        self.held_back_total += n
        now = self.loop.time()
        if now >= self._burst_logged_at + BURST_LOG_INTERVAL:
            self._burst_logged_at = now
            log.info("edge.read_burst", connections=n, took_ms=round((_now() - started) * 1000, 1),
                     deferred_reads=self.turns.deferred_reads, rearm_per_turn=self.rearm_per_turn)
        if held and not self.rearm_scheduled:
            self.rearm_scheduled = True
            self.loop.call_soon(self._rearm)

    def _rearm(self) -> None:
        """Read again the next ``rearm_per_turn`` held-back connections (one loop turn)."""
        self.rearm_scheduled = False
        held = self.held_back
        n = self.rearm_per_turn
        while held and n:
            conn = held.popleft()
            n -= 1
            conn.held_back = False
            conn.rearmed = True
            conn._maybe_resume()
        if held:
            self.rearm_scheduled = True
            self.loop.call_soon(self._rearm)

    def buffered_change(self, conn: Connection, delta: int) -> None:
        self.budget.change(conn, delta)

    def _call_soon(self, callback) -> None:
        self.loop.call_soon(callback)

    def metric_lines(self) -> list[str]:
        budget = self.budget
        paused = budget.paused_count()
        return [
            "# HELP herd_buffered_bytes Bytes buffered for all connections (requests, frames being read at "
            "their announced size, unsent answers).", "# TYPE herd_buffered_bytes gauge",
            f"herd_buffered_bytes {budget.total}",
            "# HELP herd_buffered_bytes_limit max_buffered_bytes.", "# TYPE herd_buffered_bytes_limit gauge",
            f"herd_buffered_bytes_limit {budget.limit}",
            "# HELP herd_connections_paused_for_memory Connections not read from: the buffered bytes are over "
            "max_buffered_bytes.", "# TYPE herd_connections_paused_for_memory gauge",
            f"herd_connections_paused_for_memory {paused}",
            "# HELP herd_memory_pauses_total Times a connection stopped being read from for max_buffered_bytes.",
            "# TYPE herd_memory_pauses_total counter", f"herd_memory_pauses_total {budget.pauses}",
            "# HELP herd_memory_forced_grants_total Times the first paused connection was let read its frame "
            "over max_buffered_bytes because only paused connections held bytes (no deadlock).",
            "# TYPE herd_memory_forced_grants_total counter", f"herd_memory_forced_grants_total {budget.forced}",
            "# HELP herd_connections_refused_per_ip_total Connections closed at once: max_connections_per_ip.",
            "# TYPE herd_connections_refused_per_ip_total counter",
            f"herd_connections_refused_per_ip_total {self.refused_per_ip}",
            "# HELP herd_accept_failures_total Connections that could not be accepted (no file descriptor "
            "left, ...).", "# TYPE herd_accept_failures_total counter",
            f"herd_accept_failures_total {self.accept_failures}",
            "# HELP herd_rebalance_requests_deferred_total Rebalance requests (JoinGroup, SyncGroup, LeaveGroup) "
            "that waited for a later loop turn: the turn's budget for them was spent.",
            "# TYPE herd_rebalance_requests_deferred_total counter",
            f"herd_rebalance_requests_deferred_total {self.turns.deferred_total}",
            "# HELP herd_read_bursts_total Loop turns that read so many rebalance requests at once (a mass "
            "rejoin) that the connections likely to send more were held back.",
            "# TYPE herd_read_bursts_total counter", f"herd_read_bursts_total {self.read_bursts}",
            "# HELP herd_connections_held_back_total Connections not read from for a few loop turns in a "
            "burst of rebalance requests (read again a few hundred per turn).",
            "# TYPE herd_connections_held_back_total counter",
            f"herd_connections_held_back_total {self.held_back_total}",
            "# HELP herd_connections_limit The connection cap in force (max_connections, or lower to fit the "
            "open-file limit).", "# TYPE herd_connections_limit gauge",
            f"herd_connections_limit {self.max_connections}",
        ]

    def check_fd_limit(self) -> None:
        """Compare RLIMIT_NOFILE with what max_connections needs; raise the soft limit when the hard
        one allows, else serve fewer connections (one warning) so that accepting never runs out of
        descriptors and /healthz keeps its own."""
        need = self.config.max_connections + HTTP_MAX_CONNECTIONS + HTTP_RESERVE + FD_OVERHEAD \
            + 2 * self.config.offsets_partitions
        try:
            soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        except (ValueError, OSError):
            return
        if soft == resource.RLIM_INFINITY or soft >= need:
            return
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        if target > soft:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
                soft = target
            except (ValueError, OSError):
                pass
        if soft >= need:
            log.info("raised the open-file limit for max_connections", soft_limit=soft)
            return
        self.max_connections = max(1, self.config.max_connections - (need - soft))
        log.warning("the open-file limit is below what max_connections needs: serving fewer connections "
                    "(raise `ulimit -n` or lower max_connections)", open_file_limit=soft, needed=need,
                    max_connections=self.config.max_connections, serving_at_most=self.max_connections)

    def _exception_handler(self, loop, context) -> None:
        """Count (and log, rate-limited) an accept that failed for lack of descriptors; the rest
        goes to the default handler."""
        exc = context.get("exception")
        if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
            self.accept_failures += 1
            self.client_log("warning", "accept_failed", "-", "cannot accept a connection", error=str(exc),
                            message=context.get("message", ""))
            return
        loop.default_exception_handler(context)

    async def bind(self) -> tuple[str, int]:
        self.loop = asyncio.get_running_loop()
        self.check_fd_limit()
        if self.loop.get_exception_handler() is None:
            self.loop.set_exception_handler(self._exception_handler)
        ctx = self.security.ssl_context if self.security is not None else None
        self.server = await self.loop.create_server(
            lambda: Connection(self), self.config.host, self.config.port,
            start_serving=False, reuse_address=True, backlog=1024, ssl=ctx,
            ssl_handshake_timeout=TLS_HANDSHAKE_TIMEOUT if ctx is not None else None)
        addr = self.server.sockets[0].getsockname()
        self.port = addr[1]
        return addr[0], addr[1]

    async def start(self) -> None:
        await self.server.start_serving()
        self._schedule_idle_check()

    def _schedule_idle_check(self) -> None:
        interval = max(0.05, min(self.config.connections_max_idle_ms / 1000 / 4, 30.0))
        self._idle_timer = self.loop.call_later(interval, self._idle_check)

    def _idle_check(self) -> None:
        limit = self.config.connections_max_idle_ms / 1000
        now = self.loop.time()
        for conn in list(self.connections):
            if conn.inflight is None and not conn.held and now - conn.last_active > limit:
                self.client_log("info", "idle", conn.host, "closing idle connection", peer=conn.peer,
                                idle_s=round(now - conn.last_active, 1))
                conn.close()
        self._schedule_idle_check()

    def stop_accepting(self) -> None:
        if self.server is not None:
            self.server.close()
        if self._idle_timer is not None:
            self._idle_timer.cancel()

    def close_all(self) -> None:
        while self.to_close:
            conn = self.to_close.popleft()
            if conn.transport is not None:
                conn.transport.close()
        for conn in list(self.connections):
            if conn.transport is not None and not conn.closed:
                conn.closed = True
                conn.transport.close()
