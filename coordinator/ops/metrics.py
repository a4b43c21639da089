"""Prometheus metrics and the operator HTTP endpoint.

Counters and histograms are plain Python objects updated on the event loop thread (no locks);
everything that can be computed from state (groups by state, members, log bytes) is computed
when scraped, so the request path only pays for one ``RequestStats.observe`` per request (a few
list updates, indexed by api key).

HTTP (``--metrics-port``; off by default):
  GET /metrics                      Prometheus text format 0.0.4
  GET /healthz                      liveness: "ok" (200), "starting" (200) while the log is replayed,
                                    or 503 naming the shards stopped by a log failure
  GET /readyz                       readiness: "ready" (200) once Kafka requests are served; 503 while
                                    starting, or with shards stopped by a log failure
  (a cluster node, ``readiness`` given: /healthz "ok" while the process runs, a failed shard being
  reloaded on its own; /readyz 503 with the reason while it joins or the database does not answer)
  GET /groups                       JSON: every group with state, protocol, members
  GET /groups/<group>/history       JSON: the rebalance flight recorder for that group
  GET /, /console/*, /api/*         the operator's console and its JSON (coordinator/console.py)

With ``authorizer = acl`` (``HttpEndpoint.authorizer``) every view shows only what the request's
principal may DESCRIBE (coordinator.core.auth.view): a basic-auth user ``alice`` is ``User:alice``, a
bearer token its line's principal (coordinator.ops.httpauth), without ``http_auth_file``
``User:ANONYMOUS``; the host is the peer's address. A group it may not describe answers 403,
``/metrics`` without CLUSTER DESCRIBE too.
"""
from __future__ import annotations

import asyncio
import bisect
import json
import math
import socket
import struct
import time
from urllib.parse import unquote

from coordinator import logging_setup
from coordinator.core.auth.view import EVERYTHING, View, view_for
from coordinator.core.versions import API_NAMES
from coordinator.ops.stall import STALL_BUCKETS
from coordinator.store import FSYNC_BUCKETS
from protocol.errors import error_name

_OFFSET_COMMIT = 8
ANONYMOUS = "User:ANONYMOUS"  # an HTTP request's principal without http_auth_file


def response_error(api_key: int, response) -> int:
    """The error a response reports, for ``herd_request_errors_total``: its top-level error code,
    or for an OffsetCommit its first partition's (a group-level refusal gives every partition the
    same code). APIs whose errors are per item only (DescribeGroups, DeleteGroups, ...) count 0."""
    if api_key == _OFFSET_COMMIT:
        topics = response.topics
        return topics[0].partitions[0].error_code if topics and topics[0].partitions else 0
    return getattr(response, "error_code", 0) or 0

log = logging_setup.get("herd.metrics")

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
                   30.0, 60.0)
REBALANCE_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


def _fmt(v: float) -> str:
    if v == math.inf:
        return "+Inf"
    if float(v).is_integer():
        return str(int(v))
    return repr(float(v))


def _labels(names: tuple, values: tuple, extra: str = "") -> str:
    parts = [f'{n}="{_escape(str(v))}"' for n, v in zip(names, values, strict=True)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


class Counter:
    def __init__(self, name: str, help: str, labels: tuple = ()):
        self.name, self.help, self.label_names = name, help, labels
        self.values: dict[tuple, float] = {} if labels else {(): 0}  # an unlabelled counter shows its 0

    def inc(self, *labels, by: float = 1) -> None:
        self.values[labels] = self.values.get(labels, 0) + by

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} counter"]
        for labels, v in sorted(self.values.items()):
            out.append(f"{self.name}{_labels(self.label_names, labels)} {_fmt(v)}")
        return out


class Histogram:
    def __init__(self, name: str, help: str, labels: tuple = (), buckets=LATENCY_BUCKETS):
        self.name, self.help, self.label_names = name, help, labels
        self.buckets = tuple(buckets)
        self.series: dict[tuple, list] = {}  # labels -> [bucket counts..., sum, count]

    def observe(self, value: float, *labels) -> None:
        s = self.series.get(labels)
        if s is None:
            s = self.series[labels] = [0] * (len(self.buckets) + 2)
        i = bisect.bisect_left(self.buckets, value)
        if i < len(self.buckets):
            s[i] += 1
        s[-2] += value
        s[-1] += 1

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} histogram"]
        for labels, s in sorted(self.series.items()):
            acc = 0
            for b, c in zip(self.buckets, s, strict=False):  # s ends with sum, count
                acc += c
                le = 'le="%s"' % _fmt(b)
                out.append(f"{self.name}_bucket{_labels(self.label_names, labels, le)} {acc}")
            le = 'le="+Inf"'
            out.append(f"{self.name}_bucket{_labels(self.label_names, labels, le)} {s[-1]}")
            out.append(f"{self.name}_sum{_labels(self.label_names, labels)} {_fmt(s[-2])}")
            out.append(f"{self.name}_count{_labels(self.label_names, labels)} {s[-1]}")
        return out


class RequestStats:
    """``herd_requests_total`` and ``herd_request_duration_seconds``, by API, for the request path:
    per api key one list of latency bucket counts, then the sum and the count (which is also the
    requests counter). Rendered exactly as a ``Counter`` and a ``Histogram`` labelled by API name."""

    def __init__(self, api_names: dict[int, str], buckets=LATENCY_BUCKETS):
        self.api_names = api_names
        self.buckets = tuple(buckets)
        self.first_bucket = self.buckets[0]
        self.series: list[list | None] = [None] * (max(api_names) + 1)  # api key -> [buckets..., sum, count]
        self.errors: dict[tuple[int, int], int] = {}  # (api key, error code) -> answers

    def observe(self, api_key: int, seconds: float, error: int = 0) -> None:
        if error:
            key = (api_key, error)
            self.errors[key] = self.errors.get(key, 0) + 1
        s = self.series[api_key]
        if s is None:
            s = self.series[api_key] = [0] * (len(self.buckets) + 2)
        if seconds <= self.first_bucket:  # most requests: skip the search
            s[0] += 1
        else:
            i = bisect.bisect_left(self.buckets, seconds)
            if i < len(self.buckets):
                s[i] += 1
        s[-2] += seconds
        s[-1] += 1

    def _by_name(self) -> list[tuple[tuple, list]]:
        return sorted(((self.api_names.get(key, "?"),), s) for key, s in enumerate(self.series) if s is not None)

    def counter(self) -> Counter:
        c = Counter("herd_requests_total", "Requests answered, by API.", ("api",))
        for labels, s in self._by_name():
            c.inc(*labels, by=s[-1])
        return c

    def error_counter(self) -> Counter:
        c = Counter("herd_request_errors_total", "Requests answered with an error code, by API and error "
                    "(the top-level code; an OffsetCommit's first partition's; per-item errors of batched "
                    "requests are not counted).", ("api", "error"))
        for (key, code), n in self.errors.items():
            c.inc(self.api_names.get(key, "?"), error_name(code), by=n)
        return c

    def histogram(self) -> Histogram:
        h = Histogram("herd_request_duration_seconds", "Time from a request's arrival to its answer, by API.",
                      ("api",), self.buckets)
        h.series = {labels: list(s) for labels, s in self._by_name()}
        return h


class Gauge:
    """A gauge computed at scrape time: ``fn()`` returns {label tuple: value}."""

    def __init__(self, name: str, help: str, labels: tuple, fn):
        self.name, self.help, self.label_names, self.fn = name, help, labels, fn

    def render(self) -> list[str]:
        out = [f"# HELP {self.name} {self.help}", f"# TYPE {self.name} gauge"]
        try:
            values = self.fn()
        except Exception:  # a broken gauge must not break the scrape
            log.exception("gauge failed", metric=self.name)
            values = {}
        for labels, v in sorted(values.items()):
            out.append(f"{self.name}{_labels(self.label_names, labels)} {_fmt(v)}")
        return out


class Metrics:
    def __init__(self):
        self.started = time.time()
        self.request_stats = RequestStats(API_NAMES)
        self.rebalance_seconds = Histogram("herd_rebalance_duration_seconds",
                                           "Duration of completed rebalances (start to stable).",
                                           buckets=REBALANCE_BUCKETS)
        self.connections_total = Counter("herd_connections_accepted_total", "Connections accepted.")
        self.connections_refused = Counter("herd_connections_refused_total",
                                           "Connections closed at once: max_connections reached.")
        self.connections_closed = Counter("herd_connections_closed_total", "Connections closed by herd, by why "
                                          "(sasl_handshake_timeout: not authenticated in time).", ("reason",))
        self.authentications = Counter("herd_sasl_authentications_total",
                                       "SASL authentications, by mechanism and result (ok, failed).",
                                       ("mechanism", "result"))
        self.authorization_failures = Counter(
            "herd_authorization_failures_total",
            "Requests or parts of requests refused by the ACL authorizer, by resource type and operation.",
            ("resource_type", "operation"))
        self.stalls = Counter("herd_stalls_total", "Times herd itself stalled (its loop or process did not run for "
                              "stall_threshold_ms or more, or the system was suspended); members got the time back.")
        self.stall_seconds = Histogram("herd_stall_seconds", "Length of herd's own stalls.", buckets=STALL_BUCKETS)
        self.stall_seconds.series[()] = [0] * (len(STALL_BUCKETS) + 2)  # shown before the first stall
        self.replay_seconds = 0.0
        self.replay_records = 0
        self.gauges: list[Gauge] = []
        self.collectors: list = []  # () -> list of exposition lines, run at scrape time

    def on_stall(self, stall_ms: int, kind: str) -> None:
        """A Runtime stall listener: count it and observe its length."""
        self.stalls.inc()
        self.stall_seconds.observe(stall_ms / 1000)

    def gauge(self, name: str, help: str, labels: tuple, fn) -> None:
        self.gauges.append(Gauge(name, help, labels, fn))

    def render(self) -> str:
        lines: list[str] = []
        for part in self.render_parts():
            lines += part
        return "\n".join(lines) + "\n"

    def render_parts(self):
        """The exposition lines, a metric or a collector at a time (a generator of lists): the HTTP
        endpoint yields to the loop between parts."""
        requests = self.request_stats
        for metric in (requests.counter(), requests.error_counter(), requests.histogram(),
                       self.rebalance_seconds, self.connections_total, self.connections_refused,
                       self.connections_closed, self.authentications, self.authorization_failures,
                       self.stalls, self.stall_seconds):
            yield metric.render()
        yield [
            "# HELP herd_shard_replay_seconds Time spent replaying the logs at start-up.",
            "# TYPE herd_shard_replay_seconds gauge",
            f"herd_shard_replay_seconds {_fmt(self.replay_seconds)}",
            "# HELP herd_replayed_records Records replayed at start-up.",
            "# TYPE herd_replayed_records gauge",
            f"herd_replayed_records {self.replay_records}",
            "# HELP herd_start_time_seconds Unix time the daemon started.",
            "# TYPE herd_start_time_seconds gauge",
            f"herd_start_time_seconds {_fmt(round(self.started, 3))}",
        ]
        for g in self.gauges:
            yield g.render()
        for collect in self.collectors:
            try:
                lines = collect()
            except Exception:  # a broken collector must not break the scrape
                log.exception("metrics collector failed")
                continue
            yield lines


# The HTTP side serves operators, not clients: it must never hold the loop nor grow without bound
# whatever its peers do (a scrape of 20,000 groups, 150 clients that never read their answer).
HTTP_MAX_CONNECTIONS = 128  # served at once; past it only /healthz and /readyz, for HTTP_RESERVE more
HTTP_RESERVE = 16
HTTP_HEADER_TIMEOUT = 10.0  # seconds to send the request head (slowloris)
HTTP_RESERVE_HEADER_TIMEOUT = 2.0  # the same for a connection over the cap
HTTP_WRITE_TIMEOUT = 10.0  # seconds the peer may read nothing while an answer waits for it
HTTP_WRITE_HIGH = 64 * 1024  # transport write buffer: pause (wait for the peer) above this
SLICE_S = 0.002  # CPU an answer may take in one loop turn before it lets the loop poll its sockets
SLICE_BYTES = 64 * 1024  # bytes an answer produces per slice (written, then the peer is waited for)
# bytes one connection can make herd hold: the transport's buffer up to its high-water mark, plus
# one slice written past it before waiting
HTTP_MAX_BUFFERED = HTTP_WRITE_HIGH + SLICE_BYTES
# the page loads only its own files and talks only to this endpoint; every answer carries these
SECURITY_HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                               "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
_SECURITY_HEAD = "".join(f"{k}: {v}\r\n" for k, v in SECURITY_HEADERS.items())


def _header(head: bytes, name: bytes) -> str | None:
    """The value of header ``name`` (lower case) in a request head, or None."""
    for line in head.split(b"\r\n")[1:]:
        key, sep, value = line.partition(b":")
        if sep and key.strip().lower() == name:
            return value.strip().decode("latin-1")
    return None


class _Turns:
    """One answer's slice per loop turn, whoever asks: ten clients fetching ``/groups`` in a loop
    cost the loop one ``SLICE_S`` between two polls of its sockets, not ten."""

    def __init__(self):
        self.lock = asyncio.Lock()

    async def run(self, it, out: list) -> bool:
        """Move pieces from ``it`` to ``out`` for at most a slice: -> True once ``it`` is done."""
        async with self.lock:
            clock = time.perf_counter
            deadline = clock() + SLICE_S
            size = 0
            for piece in it:
                out.append(piece)
                size += len(piece)
                if size >= SLICE_BYTES or clock() >= deadline:
                    return False
            return True


class HttpEndpoint:
    """A small HTTP/1.1 server (one request per connection) for /metrics and the JSON views.

    Bounded whatever the peers do: at most ``max_connections`` served at once (a few more for the
    health checks: ``HTTP_RESERVE``), 431 for a request head over ``max_request`` bytes, 10 s to send
    it; every answer's body is produced in slices (``SLICE_S`` of CPU, ``SLICE_BYTES``) with a loop
    turn between them, one slice at a time across all connections (``_Turns``), written as it is
    produced (chunked) and never more than ``HTTP_MAX_BUFFERED`` ahead of the peer: a peer that reads
    nothing for ``HTTP_WRITE_TIMEOUT`` is dropped."""

    def __init__(self, metrics: Metrics, groups_view, history_view, max_request=8192, failed_shards=None,
                 readiness=None, max_connections: int = HTTP_MAX_CONNECTIONS):
        self.metrics = metrics
        self.groups_view = groups_view  # () -> iterable of JSON-able groups (a generator: streamed)
        self.history_view = history_view  # (group_id) -> JSON-able or None
        self.failed_shards = failed_shards  # () -> [shard ids stopped after a log write failure]
        self.readiness = readiness  # a cluster node's: () -> None (ready) or why not
        self.console = None  # coordinator.ops.console.Console: GET /, /console/*, /api/*
        self.max_request = max_request
        self.max_connections = max_connections
        self.server = None
        self.open = 0  # connections being served
        self.turns = _Turns()
        self.write_timeout = HTTP_WRITE_TIMEOUT
        self.oversized = 0  # request heads refused with 431
        self.auth = None  # coordinator.ops.httpauth.HttpAuth (http_auth_file): all but the health checks need it
        self.auth_failures = 0  # requests answered 401
        self.authorizer = None  # coordinator.core.auth.acl.Authorizer (authorizer = acl): views filtered by it
        self.forbidden = 0  # requests answered 403 (authorizer = acl)
        self._rendering: asyncio.Future | None = None  # a /metrics render shared by concurrent scrapes
        self._metrics_lines = None
        self._listing: asyncio.Future | None = None  # a /groups listing shared by concurrent requests
        self._groups_chunks = None
        self.refused = Counter("herd_http_connections_refused_total",
                               "HTTP connections closed at once: the endpoint's connection cap was reached.")
        self.dropped = Counter("herd_http_clients_dropped_total", "HTTP answers abandoned, by why: the peer read "
                               "nothing for the write timeout (write_timeout), or its connection broke (error).",
                               ("reason",))
        # False while herd starts (the log is replayed): /healthz says "starting", /readyz, /metrics
        # and the views answer 503 (the group state is not whole yet)
        self.ready = True
        metrics.collectors.append(self._metric_lines)

    def _metric_lines(self) -> list[str]:
        return (self.refused.render() + self.dropped.render()
                + ["# HELP herd_http_oversized_headers_total Requests answered 431: a head over the size limit.",
                   "# TYPE herd_http_oversized_headers_total counter",
                   f"herd_http_oversized_headers_total {self.oversized}"]
                + (["# HELP herd_http_auth_failures_total HTTP requests answered 401: no or a wrong credential "
                    "(http_auth_file).", "# TYPE herd_http_auth_failures_total counter",
                    f"herd_http_auth_failures_total {self.auth_failures}"] if self.auth is not None else [])
                + (["# HELP herd_http_forbidden_total HTTP requests answered 403: the principal may not "
                    "describe what it asked for (authorizer = acl).", "# TYPE herd_http_forbidden_total counter",
                    f"herd_http_forbidden_total {self.forbidden}"] if self.authorizer is not None else [])
                + [f"# HELP herd_http_connections HTTP connections being served (cap {self.max_connections}).",
                   "# TYPE herd_http_connections gauge", f"herd_http_connections {self.open}"])

    async def bind(self, host: str, port: int) -> int:
        """Listen without serving yet (a busy port is found before the logs are replayed)."""
        self.server = await asyncio.start_server(self._client, host, port, start_serving=False,
                                                 limit=self.max_request)
        return self.server.sockets[0].getsockname()[1]

    async def start(self, host: str | None = None, port: int | None = None) -> int:
        if self.server is None:
            await self.bind(host, port)
        await self.server.start_serving()
        return self.server.sockets[0].getsockname()[1]

    def close(self) -> None:
        if self.server is not None:
            self.server.close()

    async def _client(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.open >= self.max_connections + HTTP_RESERVE:
            self.refused.inc()
            writer.transport.abort()
            return
        reserve = self.open >= self.max_connections  # over the cap: health checks only
        self.open += 1
        transport = writer.transport
        try:
            transport.set_write_buffer_limits(high=HTTP_WRITE_HIGH)
            method = "GET"
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), timeout=HTTP_RESERVE_HEADER_TIMEOUT
                                              if reserve else HTTP_HEADER_TIMEOUT)
            except asyncio.LimitOverrunError:
                self.oversized += 1
                await self._answer(writer, "GET", True, 431, "text/plain", b"request header fields too large\n",
                                   lingering=reader)
                return
            else:
                line = head.split(b"\r\n", 1)[0].decode("latin-1")
                parts = line.split()
                http11 = len(parts) < 3 or parts[2] != "HTTP/1.0"
                if len(parts) < 2 or parts[0] not in ("GET", "HEAD"):
                    answer = (405, "text/plain", b"only GET is supported\n")
                else:
                    method, target = parts[0], parts[1]
                    path = target.split("?", 1)[0]
                    health = path in ("/healthz", "/readyz")
                    principal = ANONYMOUS
                    if not health and self.auth is not None:
                        principal = self.auth.principal(_header(head, b"authorization"))
                    if reserve and not health:
                        self.refused.inc()
                        answer = (503, "text/plain", b"too many HTTP connections\n")
                    elif principal is None:
                        self.auth_failures += 1
                        answer = (401, "text/plain", b"authentication required\n",
                                  {"WWW-Authenticate": 'Basic realm="herd"'})
                    else:
                        view = EVERYTHING if health else self.view(principal, writer)
                        if path == "/metrics":
                            if self.ready and view.metrics:  # (refused: nothing rendered for it)
                                await self._prepare_metrics()
                        elif path == "/groups" and self.ready and view.all_groups:
                            await self._prepare_groups()
                        elif self.console is not None and self.ready:
                            await self.console.prepare_for(target, view)
                        answer = self.route(target, view)
            await self._answer(writer, method, http11, *answer)
        except TimeoutError:
            self.dropped.inc("write_timeout")
            _reset_on_close(transport)
        except (asyncio.IncompleteReadError, ConnectionError, UnicodeDecodeError):
            pass
        except Exception:
            log.exception("metrics endpoint error")
        finally:
            self.open -= 1
            transport.abort()  # the answer is written (or abandoned): nothing is left to flush

    async def _answer(self, writer, method: str, http11: bool, status: int, ctype: str, body, more=None,
                      lingering=None) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in more.items() if k not in SECURITY_HEADERS) if more else ""
        streamed = not isinstance(body, (bytes, bytearray))
        if streamed:
            length = "Transfer-Encoding: chunked\r\n" if http11 else ""
        else:
            length = f"Content-Length: {len(body)}\r\n"
        writer.write(f"HTTP/1.1 {status} {_REASONS.get(status, 'OK')}\r\nContent-Type: {ctype}\r\n"
                     f"{length}{_SECURITY_HEAD}{extra}Connection: close\r\n\r\n".encode())
        if method == "HEAD":
            pass
        elif not streamed:
            writer.write(body)
        else:
            chunked = http11
            it = iter(body)
            done = False
            while not done:
                pieces: list = []
                done = await self.turns.run(it, pieces)
                if pieces:
                    data = b"".join(pieces)
                    writer.write(b"%x\r\n%b\r\n" % (len(data), data) if chunked else data)
                await asyncio.sleep(0)  # the loop polls its sockets between two slices of this answer
                await self._drain(writer)
            if chunked:
                writer.write(b"0\r\n\r\n")
        await self._drain(writer)
        if lingering is not None:
            # the peer may still be sending what we did not read: closing now would reset the
            # connection and lose the answer; end our side, then read and drop a bounded amount
            writer.write_eof()
            end = asyncio.get_running_loop().time() + HTTP_RESERVE_HEADER_TIMEOUT
            left = 1 << 20
            while left > 0:
                remaining = end - asyncio.get_running_loop().time()
                if remaining <= 0:
                    break
                try:
                    chunk = await asyncio.wait_for(lingering.read(65536), remaining)
                except (TimeoutError, ConnectionError):
                    break
                if not chunk:
                    break
                left -= len(chunk)
        # the transport closes once its buffer is written (a graceful end, so no reset loses it)
        writer.transport.close()
        if writer.transport.get_write_buffer_size():
            await self._drain_closing(writer)

    async def _drain(self, writer) -> None:
        """Wait until the peer has taken what is buffered past the high-water mark: TimeoutError if
        it takes nothing for ``write_timeout`` seconds."""
        transport = writer.transport
        if transport.is_closing():
            raise ConnectionResetError
        if transport.get_write_buffer_size():
            # drain() waits while the transport is paused (over HTTP_WRITE_HIGH, until under a
            # quarter of it); in between it returns at once
            await asyncio.wait_for(writer.drain(), self.write_timeout)

    async def _drain_closing(self, writer) -> None:
        """After close(): give the last bytes ``write_timeout`` to leave, then abort."""
        transport = writer.transport
        deadline = asyncio.get_running_loop().time() + self.write_timeout
        size = transport.get_write_buffer_size()
        while size and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.05)
            new = transport.get_write_buffer_size()
            if new < size:
                deadline = asyncio.get_running_loop().time() + self.write_timeout
            size = new
        if size:
            raise TimeoutError

    async def _prepare_metrics(self) -> None:
        """Render /metrics a part at a time (a loop turn between collectors), once for all the
        scrapes that arrive while it is rendered."""
        if self._rendering is None:
            self._rendering = asyncio.ensure_future(self._render_in_parts())
        self._metrics_lines = await asyncio.shield(self._rendering)

    async def _prepare_groups(self) -> None:
        """List the groups as JSON a slice at a time, once for all the requests that arrive while it
        is listed (ten clients fetching /groups in a loop cost one listing at a time, and 150 that
        never read share one copy of it)."""
        if self._listing is None:
            self._listing = asyncio.ensure_future(self._list_in_slices())
        self._groups_chunks = await asyncio.shield(self._listing)

    async def _list_in_slices(self) -> list[bytes]:
        try:
            chunks: list[bytes] = []
            it = _json_array(self.groups_view())
            done = False
            while not done:
                done = await self.turns.run(it, chunks)
                await asyncio.sleep(0)
            return chunks
        finally:
            self._listing = None

    async def _render_in_parts(self) -> list[str]:
        try:
            console = self.console
            if console is not None:
                await console.prepare_for("/metrics")
            lines: list[str] = []
            it = self.metrics.render_parts()
            done = False
            while not done:
                parts: list = []
                if console is not None:  # its collector takes the table and lines just prepared
                    console.mark_prepared()
                done = await self.turns.run(it, parts)
                for p in parts:
                    lines += p
                await asyncio.sleep(0)
            return lines
        finally:
            self._rendering = None

    def view(self, principal: str, writer) -> View:
        """What ``principal`` may see (everything without an authorizer): the one question the HTTP
        views ask the authorizer (coordinator.core.auth.view)."""
        if self.authorizer is None:
            return EVERYTHING
        peer = writer.get_extra_info("peername")
        return view_for(self.authorizer, principal, str(peer[0]) if peer else "")

    def route(self, target: str, view: View = EVERYTHING) -> tuple:
        """``(status, content type, body)``, or with a 4th item: extra headers. A body that is not
        bytes is an iterable of bytes: streamed, a slice at a time. ``view``: what the request's
        principal may see (authorizer = acl)."""
        raw_path, _, query = target.partition("?")
        path = unquote(raw_path)
        if path in ("/healthz", "/readyz") and self.readiness is not None and self.ready:
            if path == "/healthz":
                return 200, "text/plain", b"ok\n"
            why = self.readiness()
            return (503, "text/plain", f"{why}\n".encode()) if why else (200, "text/plain", b"ready\n")
        if path in ("/healthz", "/readyz"):
            failed = self.failed_shards() if self.failed_shards is not None else []
            if failed:  # those groups get COORDINATOR_NOT_AVAILABLE until a restart replays the log
                return 503, "text/plain", (f"unhealthy: {len(failed)} shard(s) stopped after a log write "
                                           f"failure: {', '.join(map(str, failed))}; restart herd\n").encode()
            if path == "/healthz":  # alive: a restart during the replay would only start it again
                return 200, "text/plain", b"ok\n" if self.ready else b"starting: replaying the log\n"
            if self.ready:
                return 200, "text/plain", b"ready\n"
        if not self.ready:
            return 503, "text/plain", b"not ready: starting (replaying the log)\n"
        if path == "/metrics":
            if not view.metrics:
                self.forbidden += 1
                return 403, "text/plain", (f"{view.principal} may not read /metrics: it needs DESCRIBE on the "
                                           "cluster (authorizer = acl)\n").encode()
            lines, self._metrics_lines = self._metrics_lines, None
            if lines is None:  # called directly (tests): rendered here
                lines = [x for part in self.metrics.render_parts() for x in part]
            return 200, "text/plain; version=0.0.4; charset=utf-8", _lines_body(lines)
        if path == "/groups":
            if not view.all_groups:  # listed for this principal alone, as ListGroups filters
                return 200, "application/json", _json_array(g for g in self.groups_view() if view.group(g["group_id"]))
            chunks, self._groups_chunks = self._groups_chunks, None
            return 200, "application/json", iter(chunks) if chunks is not None else _json_array(self.groups_view())
        if path.startswith("/groups/") and path.endswith("/history"):
            group = path[len("/groups/"):-len("/history")]
            if not view.group(group):
                self.forbidden += 1
                return 403, "application/json", _json(group_forbidden(view, group))
            hist = self.history_view(group)
            if hist is None:
                return 404, "application/json", _json({"error": f"unknown group {group}"})
            return 200, "application/json", _json(hist)
        if self.console is not None:
            answer = self.console.route(path, query, view)
            if answer is not None:
                if answer[0] == 403:
                    self.forbidden += 1
                return answer
        return 404, "text/plain", b"not found\n"


def group_forbidden(view: View, group: str) -> dict:
    """The 403 answer for a group the principal may not describe (whether or not it exists: as
    Kafka's DescribeGroups answers GROUP_AUTHORIZATION_FAILED before looking the group up)."""
    return {"error": "not authorized to describe group", "error_code": "GROUP_AUTHORIZATION_FAILED",
            "group_id": group, "principal": view.principal}


def _reset_on_close(transport) -> None:
    """Close with a reset: the kernel drops what the peer did not read instead of keeping it (up to
    the socket's send buffer, megabytes) for a peer that reads nothing."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except (OSError, AttributeError):
            pass


def _json(obj) -> bytes:
    return (json.dumps(obj, indent=2, default=str) + "\n").encode()


def _json_array(items, step: int = 64):
    """A JSON array, ``step`` items at a time (a generator of bytes)."""
    dumps = json.dumps
    sep = b"[\n"
    batch: list = []
    for item in items:
        batch.append(item)
        if len(batch) == step:
            yield sep + dumps(batch, default=str)[1:-1].encode()
            sep, batch = b",\n", []
    if batch:
        yield sep + dumps(batch, default=str)[1:-1].encode()
        sep = b",\n"
    yield b"[]\n" if sep == b"[\n" else b"\n]\n"


def _lines_body(lines: list[str], step: int = 500):
    """Exposition lines, ``step`` at a time (a generator of bytes)."""
    for i in range(0, len(lines), step):
        yield ("\n".join(lines[i:i + step]) + "\n").encode()


_REASONS = {200: "OK", 400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
            405: "Method Not Allowed", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


def _family(name: str, kind: str, help: str, samples) -> list[str]:
    out = [f"# HELP {name} {help}", f"# TYPE {name} {kind}"]
    for labels, value in samples:
        out.append(f"{name}{labels} {_fmt(value)}")
    return out


def install_collectors(metrics: Metrics, groups, store, server) -> None:
    """Scrape-time views of the group coordinator, the log store and the server."""

    def group_lines() -> list[str]:
        snap = groups.snapshot_stats()
        counters = snap["counters"]
        lines = _family("herd_groups", "gauge", "Groups by state.",
                        [(f'{{state="{s}"}}', n) for s, n in sorted(snap["groups_by_state"].items())])
        lines += _family("herd_group_members", "gauge", "Members of all groups.", [("", snap["members"])])
        lines += _family("herd_group_pending_members", "gauge", "Members that must rejoin with their "
                         "assigned id (KIP-394).", [("", snap["pending_members"])])
        lines += _family("herd_parked_requests", "gauge", "JoinGroup/SyncGroup requests waiting for a "
                         "rebalance to complete.", [("", snap["parked_requests"])])
        lines += _family("herd_committed_offsets", "gauge", "Committed offsets held.", [("", snap["offsets"])])
        lines += _family("herd_failed_shards", "gauge", "Shards stopped after a log write failure.",
                         [("", len(snap["failed_shards"]))])
        prefix = "rebalances_completed_reason_"
        lines += _family("herd_rebalances_total", "counter", "Completed rebalances, by what started them.",
                         [(f'{{reason="{k[len(prefix):]}"}}', v) for k, v in sorted(counters.items())
                          if k.startswith(prefix)])
        lines += _family("herd_offset_commits_total", "counter", "Partition offsets committed.",
                         [("", counters.get("offset_commits", 0))])
        lines += _family("herd_offsets_expired_total", "counter", "Offsets removed by retention.",
                         [("", counters.get("offsets_expired", 0))])
        lines += _family("herd_groups_deleted_total", "counter", "Groups removed: by DeleteGroups (why=\"deleted\") "
                         "or when their last offset expired (why=\"expired\").",
                         [('{why="deleted"}', counters.get("groups_deleted", 0)),
                          ('{why="expired"}', counters.get("groups_expired", 0))])
        lines += _family("herd_offsets_deleted_total", "counter", "Partition offsets removed by OffsetDelete.",
                         [("", counters.get("offsets_deleted", 0))])
        outcome = "rebalances_"
        lines += _family("herd_rebalance_outcomes_total", "counter", "Rebalances ended, by outcome (stable, "
                         "empty: completed; the others did not complete).",
                         [(f'{{outcome="{k[len(outcome):]}"}}', v) for k, v in sorted(counters.items())
                          if k.startswith(outcome) and not k.startswith(("rebalances_completed_reason_",
                                                                          "rebalances_started"))])
        removed = "members_removed_"
        lines += _family("herd_members_removed_total", "counter", "Members removed, by why.",
                         [(f'{{why="{k[len(removed):]}"}}', v) for k, v in sorted(counters.items())
                          if k.startswith(removed)])
        lines += _family("herd_consumer_groups", "gauge", "KIP-848 consumer groups by state.",
                         [(f'{{state="{s}"}}', n) for s, n in sorted(snap["consumer_groups_by_state"].items())])
        lines += _family("herd_consumer_group_members", "gauge", "Members of all consumer groups.",
                         [("", snap["consumer_members"])])
        lines += _family("herd_consumer_heartbeats_total", "counter", "ConsumerGroupHeartbeat requests handled "
                         "(joins, heartbeats and leaves).", [("", counters.get("consumer_heartbeats", 0))])
        lines += _family("herd_consumer_group_epoch_bumps_total", "counter", "Consumer group epoch or "
                         "target assignment moves (the flight recorder has why).",
                         [("", counters.get("consumer_group_epoch_bumps", 0))])
        return lines

    def log_lines() -> list[str]:
        stats = store.stats()
        lines = _family("herd_log_bytes", "gauge", "Size of each shard's log file.",
                        [(f'{{shard="{s.shard}"}}', s.bytes) for s in stats])
        lines += _family("herd_log_fsyncs_total", "counter", "fsyncs of appended log data.",
                         [("", sum(s.fsyncs for s in stats))])
        lines += _family("herd_log_fsync_seconds_total", "counter", "Time spent in those fsyncs "
                         "(rate of this over rate of herd_log_fsyncs_total is the mean fsync latency).",
                         [("", round(sum(s.fsync_seconds for s in stats), 6))])
        fsync = Histogram("herd_log_fsync_duration_seconds", "fdatasync latency of appended log data.",
                          buckets=FSYNC_BUCKETS)
        counts = [sum(col) for col in zip(*(s.fsync_buckets for s in stats), strict=True)] or \
            [0] * (len(FSYNC_BUCKETS) + 1)  # no shard (a cluster node that owns none yet)
        # the count from the same snapshot as the buckets (a sync thread may count one meanwhile)
        fsync.series[()] = counts[:-1] + [round(sum(s.fsync_seconds for s in stats), 6), sum(counts)]
        lines += fsync.render()
        lines += _family("herd_log_compactions_total", "counter", "Log compactions.",
                         [("", sum(s.compactions for s in stats))])
        return lines

    def server_lines() -> list[str]:
        return _family("herd_connections", "gauge", "Open client connections.", [("", len(server.connections))])

    metrics.collectors += [group_lines, log_lines, server_lines]

    def rebalance_done(entry: dict) -> None:
        if entry.get("duration_ms") is not None:
            metrics.rebalance_seconds.observe(entry["duration_ms"] / 1000)

    groups.rebalance_listeners.append(rebalance_done)
