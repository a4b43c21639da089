"""The data-cluster reader: log-end offsets of the Kafka cluster that holds the partitions' data.

herd keeps the committed offsets; the log ends live in the data cluster (``data_bootstrap_server``).
:class:`DataClusterReader` is the :class:`coordinator.ops.lag.LogEndSource` the lag refresher asks:

    ends = await reader.fetch([("orders", 0), ("orders", 1), ...])   # {(topic, partition): log end}

It runs on the daemon's event loop with its own connections (never the listener's), one per broker,
each an ``asyncio.Protocol`` driving the sans-IO client connection
(:mod:`protocol.client_connection`: framing, ApiVersions negotiation and its fallbacks, SASL) over
TCP or TLS (the settings of :mod:`protocol.client_security`, read from ``data_command_config`` by
:mod:`protocol.client_properties`, the same file ``herd groups --command-config`` takes).

One ``fetch``: Metadata (from any reachable broker, bootstrap servers first until one answers) for
the topics whose leaders are unknown or older than ``metadata_max_age_ms``; then one ListOffsets
(LATEST, read-uncommitted: the high watermark) per leader broker, the brokers asked concurrently;
partitions whose leader moved (NOT_LEADER_OR_FOLLOWER, ...) get their topic's metadata again and one
more try. Every wait is bounded by the call's budget (``timeout_ms``), so a hung broker costs one
timeout, never the refresher's whole round; a connection that timed out is closed.

What it returns and raises (the refresher's contract, see :mod:`coordinator.ops.lag`):

* the log end of every partition it could read; a partition the data cluster does not have (no
  such topic, no leader) is left out and not an error: it simply has no lag;
* :class:`coordinator.ops.lag.PartialFetch` when some broker could not be asked (down, timed out,
  refused us): it carries the log ends it did read, the rest go stale, ``herd_lag_source_up`` 0;
* :class:`DataClusterError` when nothing could be read (no broker reachable for Metadata).

Reconnecting: a broker whose connection failed is not dialled again before its backoff passes
(``backoff_ms`` doubling to ``backoff_max_ms``, reset by a good handshake); meanwhile its
partitions fail fast. Backoff is measured on the injected clock (a ``ManualClock`` in tests).

Tolerance of real servers: librdkafka's mock cluster answers ApiVersions v3+ with a body that does
not decode (the connection asks again at v0, as Kafka's clients do) and Metadata v9+ with one byte
too many (responses ignore trailing bytes, as Kafka does); the versions used are the highest both
sides know, ListOffsets down to v0 (``old_style_offsets``).
"""
from __future__ import annotations

import asyncio
import ssl
import uuid

from coordinator import logging_setup
from coordinator.clock import Clock, SystemClock
from coordinator.ops.lag import PartialFetch
from protocol import errors as E
from protocol import messages as m
from protocol.client_connection import AuthenticationFailed, Connection, ConnectionBroken, Ready, Response
from protocol.client_security import BadServerList, SecurityConfig, split_servers, tls_failure
from protocol.record_batch import FETCH_MAX_VERSION, fetched_times, time_fetch

__all__ = ["DataClusterError", "DataClusterReader", "TopicsRead", "parse_servers", "reader_from_config"]

log = logging_setup.get("herd.datacluster")

CLIENT_ID = "herd-lag"
LATEST = -1
MAX_FRAME = 64 * 1024 * 1024
METADATA_TOPICS_PER_REQUEST = 1000
# a partition whose leader is elsewhere now: its topic's metadata is read again
LEADER_MOVED = frozenset({E.NOT_LEADER_OR_FOLLOWER, E.LEADER_NOT_AVAILABLE, E.UNKNOWN_LEADER_EPOCH,
                          E.FENCED_LEADER_EPOCH, E.REPLICA_NOT_AVAILABLE, E.UNKNOWN_TOPIC_OR_PARTITION})

TopicPartition = tuple[str, int]
NIL_UUID = bytes(16)


class DataClusterError(Exception):
    """The data cluster could not be read at all; ``str()`` is one line."""


def parse_servers(text: str, protocol: str = "PLAINTEXT") -> list[tuple[str, int]]:
    """``HOST:PORT[,HOST:PORT]`` (a listener URL such as ``SASL_SSL://host:9093`` too, whose protocol
    must be ``protocol``) -> addresses. ``ValueError`` with one line."""
    try:
        return split_servers(text, protocol)
    except BadServerList as exc:
        if exc.named:
            raise ValueError(f"data_bootstrap_server {exc.item!r} names {exc.named} but the data cluster's "
                             f"security.protocol is {protocol} (set it in data_command_config)") from None
        if exc.item is None:
            raise ValueError("data_bootstrap_server is empty") from None
        raise ValueError(f"data_bootstrap_server: invalid address {exc.item!r}: expected HOST:PORT") from None


def _addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class _BrokerConnection(asyncio.Protocol):
    """One connection to one broker: the sans-IO ``Connection`` over an asyncio transport.
    Requests are pipelined (Kafka answers a connection's requests in order); each waits on its own
    future, resolved by correlation id."""

    def __init__(self, address: str, security: SecurityConfig):
        self.address = address
        self.conn = Connection(client_id=CLIENT_ID, max_frame_size=MAX_FRAME, sasl=security.sasl_credentials(),
                               software=(CLIENT_ID, "1"))
        self.transport: asyncio.Transport | None = None
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.waiting: dict[int, asyncio.Future] = {}
        self.versions: dict[int, tuple[int, int]] = {}
        self.closed = False
        self.failure: str | None = None

    # -- asyncio.Protocol -------------------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        self.conn.initiate()
        self._flush()

    def data_received(self, data: bytes) -> None:
        try:
            events = self.conn.receive(data)
        except AuthenticationFailed as exc:
            self._fail(f"{self.address}: {exc}")
            return
        except ConnectionBroken as exc:
            if exc.frame_size is not None:
                self._fail(f"{self.address} sent a response of {exc.frame_size} bytes: is it a Kafka broker?")
            else:
                self._fail(f"{self.address} broke the connection: {exc}")
            return
        for ev in events:
            if isinstance(ev, Ready):
                self.versions = dict(ev.broker_versions)
                if not self.ready.done():
                    self.ready.set_result(True)
            elif isinstance(ev, Response):
                fut = self.waiting.pop(ev.correlation_id, None)
                if fut is not None and not fut.done():  # (a cancelled caller's answer is dropped)
                    fut.set_result(ev)
        self._flush()  # SASL steps queue more bytes

    def connection_lost(self, exc) -> None:
        why = f"{self.address} closed the connection" if exc is None else f"connection to {self.address} lost: {exc}"
        self._fail(why)

    # -- use --------------------------------------------------------------------------------------
    def _flush(self) -> None:
        out = self.conn.data_to_send()
        if out and self.transport is not None and not self.closed:
            self.transport.write(out)

    def _fail(self, why: str) -> None:
        if self.failure is None:
            self.failure = why
        err = DataClusterError(self.failure)
        if not self.ready.done():
            self.ready.set_exception(err)
            self.ready.exception()  # retrieved: nobody may be awaiting it any more
        for fut in self.waiting.values():
            if not fut.done():
                fut.set_exception(err)
        self.waiting.clear()
        self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            if self.transport is not None:
                self.transport.close()

    def version(self, cls) -> int:
        theirs = self.versions.get(cls.API_KEY)
        name = cls.NAME.removesuffix("Request")
        if theirs is None:
            raise DataClusterError(f"{self.address} does not support {name}")
        v = min(theirs[1], cls.MAX_VERSION)
        if v < max(theirs[0], cls.MIN_VERSION):
            raise DataClusterError(f"{self.address} supports {name} v{theirs[0]}-{theirs[1]}, herd "
                                   f"v{cls.MIN_VERSION}-{cls.MAX_VERSION}")
        return v

    async def call(self, request, version: int, timeout: float):
        """The decoded response; ``DataClusterError`` on failure or timeout (the connection is then
        closed: a broker that let one request time out is not trusted with the next)."""
        if self.closed:
            raise DataClusterError(self.failure or f"connection to {self.address} closed")
        name = request.NAME.removesuffix("Request")
        corr = self.conn.send(request, version)
        fut = asyncio.get_running_loop().create_future()
        self.waiting[corr] = fut
        self._flush()
        try:
            resp = await asyncio.wait_for(fut, max(timeout, 0.001))
        except TimeoutError:
            self._fail(f"{self.address} did not answer {name} within {timeout * 1000:.0f} ms")
            raise DataClusterError(self.failure) from None
        finally:
            self.waiting.pop(corr, None)
        if resp.error is not None:
            raise DataClusterError(f"malformed {name} v{version} response from {self.address}: {resp.error}")
        return resp.message


class _Peer:
    """What the reader knows of one broker address: its connection and its backoff."""

    __slots__ = ("conn", "failures", "retry_at", "last_error", "connecting")

    def __init__(self):
        self.conn: _BrokerConnection | None = None
        self.failures = 0
        self.retry_at = 0  # monotonic ms before which it is not dialled again
        self.last_error: str | None = None
        self.connecting: asyncio.Future | None = None


class DataClusterReader:
    """The log-end source over a real Kafka cluster. See the module docstring."""

    def __init__(self, servers: list[tuple[str, int]], security: SecurityConfig | None = None, *,
                 timeout_ms: int = 10_000, backoff_ms: int = 200, backoff_max_ms: int = 10_000,
                 metadata_max_age_ms: int = 300_000, clock: Clock | None = None):
        if not servers:
            raise ValueError("no bootstrap servers")
        self.servers = list(servers)
        self.security = security or SecurityConfig()
        self.timeout_ms = timeout_ms
        self.backoff_ms = backoff_ms
        self.backoff_max_ms = backoff_max_ms
        self.metadata_max_age_ms = metadata_max_age_ms
        self.clock = clock or SystemClock()
        self.peers: dict[tuple[str, int], _Peer] = {}
        self.brokers: dict[int, tuple[str, int]] = {}  # node id -> address, from Metadata
        self.leaders: dict[str, dict[int, int]] = {}  # topic -> partition -> leader node id
        self.leaders_at: dict[str, int] = {}  # topic -> monotonic ms its leaders were read
        self.topic_errors: dict[str, int] = {}  # topic -> the error Metadata gave (other than unknown)
        self.cluster_id = ""  # the data cluster's, from Metadata
        self.stats = {"connects": 0, "connect_failures": 0, "metadata_requests": 0, "list_offsets_requests": 0,
                      "fetch_requests": 0}

    def __repr__(self) -> str:
        return f"<DataClusterReader {','.join(_addr(h, p) for h, p in self.servers)} {self.security.protocol}>"

    # -- connections ------------------------------------------------------------------------------
    def _peer(self, address: tuple[str, int]) -> _Peer:
        peer = self.peers.get(address)
        if peer is None:
            peer = self.peers[address] = _Peer()
        return peer

    async def _connection(self, address: tuple[str, int], budget: _Budget) -> _BrokerConnection:
        peer = self._peer(address)
        conn = peer.conn
        if conn is not None and not conn.closed:
            return conn
        if peer.connecting is not None:  # another leader's request is already dialling it
            return await asyncio.shield(peer.connecting)
        now = self.clock.monotonic_ms()
        if now < peer.retry_at:
            raise DataClusterError(f"{_addr(*address)}: not retried for {peer.retry_at - now} ms after: "
                                   f"{peer.last_error}")
        peer.connecting = asyncio.get_running_loop().create_future()
        try:
            conn = await self._connect(address, budget)
        except DataClusterError as exc:
            self._failed(address, str(exc))
            peer.connecting.set_exception(exc)
            peer.connecting.exception()
            raise
        except BaseException:  # cancelled by the refresher's timeout
            peer.connecting.cancel()
            raise
        else:
            peer.connecting.set_result(conn)
        finally:
            peer.connecting = None
        if peer.failures:
            log.info("data cluster broker reachable again", broker=_addr(*address), after_failures=peer.failures)
        peer.conn, peer.failures, peer.retry_at, peer.last_error = conn, 0, 0, None
        return conn

    async def _connect(self, address: tuple[str, int], budget: _Budget) -> _BrokerConnection:
        host, port = address
        where = _addr(host, port)
        loop = asyncio.get_running_loop()
        ctx = self.security.ssl_context()
        self.stats["connects"] += 1
        timeout = budget.left(where, "connecting")
        try:
            async with asyncio.timeout(timeout):
                _, proto = await loop.create_connection(
                    lambda: _BrokerConnection(where, self.security), host, port, ssl=ctx,
                    server_hostname=host if ctx is not None else None,
                    ssl_handshake_timeout=timeout if ctx is not None else None)
                try:
                    await proto.ready
                except BaseException:
                    proto.close()
                    raise
        except TimeoutError:
            raise DataClusterError(f"timed out after {timeout * 1000:.0f} ms connecting to {where}") from None
        except ssl.SSLError as exc:
            raise DataClusterError(tls_failure(exc, host, port)[1]) from None
        except OSError as exc:
            raise DataClusterError(f"cannot connect to {where}: {exc.strerror or exc}") from None
        return proto

    def _failed(self, address: tuple[str, int], why: str) -> None:
        peer = self._peer(address)
        if peer.conn is not None:
            peer.conn.close()
            peer.conn = None
        if peer.failures == 0:
            log.warning("data cluster broker unreachable: its partitions' lag goes stale", broker=_addr(*address),
                        error=why)
        peer.failures += 1
        peer.last_error = why
        self.stats["connect_failures"] += 1
        delay = min(self.backoff_max_ms, self.backoff_ms * (1 << min(peer.failures - 1, 20)))
        peer.retry_at = self.clock.monotonic_ms() + delay

    async def _call(self, address: tuple[str, int], build, budget: _Budget, max_version: int | None = None,
                    min_version: int | None = None):
        """``build(version) -> request`` sent to ``address``; ``(response, version)``."""
        conn = await self._connection(address, budget)
        probe = build(None)
        version = conn.version(type(probe))
        if max_version is not None:
            version = min(version, max_version)
        if min_version is not None and version < min_version:
            raise DataClusterError(f"{conn.address} supports {type(probe).NAME} up to v{version}, "
                                   f"herd needs v{min_version}")
        req = build(version)
        try:
            return await conn.call(req, version, budget.left(conn.address, type(req).NAME)), version
        except DataClusterError as exc:
            if conn.closed:
                self._failed(address, str(exc))
            raise

    def close(self) -> None:
        for peer in self.peers.values():
            if peer.conn is not None:
                peer.conn.close()
                peer.conn = None

    # -- metadata ---------------------------------------------------------------------------------
    def _metadata_candidates(self) -> list[tuple[str, int]]:
        """Where to ask Metadata: a connected broker, then the known brokers, then the bootstrap servers."""
        candidates = []
        for addr, peer in self.peers.items():
            if peer.conn is not None and not peer.conn.closed:
                candidates.append(addr)
        candidates += [a for a in self.brokers.values() if a not in candidates]
        candidates += [a for a in self.servers if a not in candidates]
        return candidates

    async def _metadata_call(self, chunk: list[str] | None, budget: _Budget):
        """One Metadata (``chunk`` None: every topic) from the first broker that answers; the
        response. ``DataClusterError`` when none does."""
        problems = []

        def build(v):
            req = m.MetadataRequest(topics=None if chunk is None else [m.MetadataRequestTopic(name=t) for t in chunk])
            if v is not None and v >= 4:
                req.allow_auto_topic_creation = False
            if v == 0 and chunk is None:
                req.topics = []  # v0: an empty list asks for every topic
            return req

        for addr in self._metadata_candidates():
            try:
                self.stats["metadata_requests"] += 1
                resp, _ = await self._call(addr, build, budget)
            except DataClusterError as exc:
                problems.append(str(exc))
                continue
            self._learn(resp)
            return resp
        raise DataClusterError("no data cluster broker answered Metadata: " + "; ".join(problems[-3:]))

    def _learn(self, resp) -> None:
        """Brokers and leaders from a Metadata response."""
        self.brokers = {b.node_id: (b.host, b.port) for b in resp.brokers} or self.brokers
        if resp.cluster_id:
            self.cluster_id = resp.cluster_id
        now = self.clock.monotonic_ms()
        for t in resp.topics:
            self.leaders_at.pop(t.name, None)
            if t.error_code != E.NONE:
                # UNKNOWN_TOPIC_OR_PARTITION: the cluster has no such topic, so it has no lag (not a
                # failure); anything else (no leader yet, not authorized) is one: asked again next time
                self.leaders.pop(t.name, None)
                if t.error_code == E.UNKNOWN_TOPIC_OR_PARTITION:
                    self.topic_errors.pop(t.name, None)
                else:
                    self.topic_errors[t.name] = t.error_code
                continue
            self.topic_errors.pop(t.name, None)
            leaders = self.leaders[t.name] = {p.partition_index: p.leader_id for p in t.partitions}
            if all(leader >= 0 for leader in leaders.values()):
                self.leaders_at[t.name] = now  # a partition without a leader: asked again next time

    async def _metadata(self, topics: list[str], budget: _Budget) -> None:
        """Read the leaders of ``topics`` from the first broker that answers: a connected one, then
        the known brokers, then the bootstrap servers. ``DataClusterError`` when none does."""
        for i in range(0, len(topics), METADATA_TOPICS_PER_REQUEST):
            await self._metadata_call(topics[i:i + METADATA_TOPICS_PER_REQUEST], budget)

    # -- topics (the catalog) ---------------------------------------------------------------------
    async def topics(self, names: list[str] | None = None, timeout_ms: int | None = None) -> TopicsRead:
        """The data cluster's topics: every one (``names`` None) or those named. -> ``TopicsRead``:
        ``found`` {name: (topic id, partition count)}, ``unknown`` (names it does not have),
        ``errors`` {name: error code} (a topic it has but cannot describe now: no leader yet, not
        authorized). Internal topics (its own ``__consumer_offsets``) are left out. A cluster too old
        for topic ids (Metadata v9 and below) gets ids derived from its cluster id and the name, the
        same on every herd node. ``DataClusterError`` when no broker answers."""
        budget = _Budget(self.timeout_ms if timeout_ms is None else timeout_ms)
        out = TopicsRead()
        chunks = [None] if names is None else [names[i:i + METADATA_TOPICS_PER_REQUEST]
                                               for i in range(0, len(names), METADATA_TOPICS_PER_REQUEST)]
        for chunk in chunks:
            resp = await self._metadata_call(chunk, budget)
            for t in resp.topics:
                if t.name is None:
                    continue
                if t.error_code == E.UNKNOWN_TOPIC_OR_PARTITION:
                    out.unknown.add(t.name)
                elif t.error_code != E.NONE:
                    out.errors[t.name] = t.error_code
                elif not t.is_internal:
                    count = max((p.partition_index for p in t.partitions), default=-1) + 1
                    tid = t.topic_id
                    if not tid or tid == NIL_UUID:
                        tid = uuid.uuid5(uuid.NAMESPACE_URL, f"herd-topic:{self.cluster_id}:{t.name}").bytes
                    out.found[t.name] = (tid, count)
            if chunk is not None:
                seen = set(out.found) | out.unknown | set(out.errors)
                out.unknown.update(n for n in chunk if n not in seen)
        return out

    # -- log ends ---------------------------------------------------------------------------------
    async def fetch(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        budget = _Budget(self.timeout_ms)
        out: dict[TopicPartition, int] = {}
        errors: list[str] = []
        todo = list(dict.fromkeys(partitions))
        for attempt in range(2):
            now = self.clock.monotonic_ms()
            topics = sorted({t for t, _ in todo})
            stale = [t for t in topics if now - self.leaders_at.get(t, -10**15) > self.metadata_max_age_ms]
            if stale:
                await self._metadata(stale, budget)  # raises when no broker answers at all
            by_leader: dict[int, list[TopicPartition]] = {}
            leaderless = 0
            for tp in todo:
                leader = self.leaders.get(tp[0], {}).get(tp[1])
                if leader is None:  # no such topic or partition on the data cluster: no lag, no error
                    if tp[0] in self.topic_errors:
                        leaderless += 1
                    continue
                if leader >= 0 and leader in self.brokers:
                    by_leader.setdefault(leader, []).append(tp)
                else:
                    leaderless += 1
            if leaderless and attempt == 0:
                codes = sorted({E.error_name(c) for c in self.topic_errors.values()}) or ["no leader"]
                errors.append(f"{leaderless} partitions have no leader to ask ({', '.join(codes)})")
            results = await asyncio.gather(*(self._list_offsets(node, tps, budget)
                                             for node, tps in by_leader.items()), return_exceptions=True)
            moved: list[TopicPartition] = []
            for tps, res in zip(by_leader.values(), results, strict=True):
                if isinstance(res, BaseException):
                    if not isinstance(res, DataClusterError):
                        raise res
                    errors.append(str(res))
                    # the broker may be gone for good: its topics' leaders are read again next time
                    for t in {t for t, _ in tps}:
                        self.leaders_at.pop(t, None)
                    continue
                ends, again = res
                out.update(ends)
                moved += again
            if not moved or attempt == 1:
                break
            for t in {t for t, _ in moved}:
                self.leaders_at.pop(t, None)
            todo = moved
        if errors:
            raise PartialFetch(out, errors[0] if len(errors) == 1 else f"{errors[0]} (and {len(errors) - 1} more)")
        return out

    async def _list_offsets(self, node: int, tps, budget: _Budget, isolation: int = 0):
        """``({tp: log end}, [tps whose leader moved])`` from one leader: ``tps`` a list of partitions
        (their LATEST offset) or a dict {tp: timestamp}; with a dict the answer is
        ``({tp: (error, timestamp, offset)}, moved)``, every error but a moved leader kept."""
        specs = tps if isinstance(tps, dict) else dict.fromkeys(tps, LATEST)
        topics: dict[str, list[int]] = {}
        for t, p in specs:
            topics.setdefault(t, []).append(p)

        def build(v):
            return m.ListOffsetsRequest(
                replica_id=-1, isolation_level=isolation, timeout_ms=int(budget.remaining() * 1000),
                topics=[m.ListOffsetsRequestListOffsetsTopic(name=t, partitions=[
                    m.ListOffsetsRequestListOffsetsPartition(partition_index=p, current_leader_epoch=-1,
                                                             timestamp=specs[(t, p)], max_num_offsets=1)
                    for p in ps]) for t, ps in topics.items()])

        self.stats["list_offsets_requests"] += 1
        resp, v = await self._call(self.brokers[node], build, budget)
        ends: dict = {}
        moved: list[TopicPartition] = []
        detailed = isinstance(tps, dict)
        for rt in resp.topics:
            for rp in rt.partitions:
                tp = (rt.name, rp.partition_index)
                if tp not in specs:
                    continue
                if v == 0:
                    off, ts = (rp.old_style_offsets[0] if rp.old_style_offsets else -1), -1
                else:
                    off, ts = rp.offset, rp.timestamp
                if detailed:  # the answer stands unless the next try (its leader moved) gives another
                    ends[tp] = (rp.error_code, ts, off)
                if rp.error_code in LEADER_MOVED:
                    moved.append(tp)
                    continue
                if not detailed and rp.error_code == E.NONE and off >= 0:
                    ends[tp] = off
        return ends, moved

    async def list_offsets(self, specs: dict[TopicPartition, int], isolation: int = 0,
                           timeout_ms: int | None = None) -> dict[TopicPartition, tuple[int, int, int]]:
        """ListOffsets as the data cluster answers it: ``specs`` {(topic, partition): timestamp}
        (-1 latest, -2 earliest, -3 max timestamp, or a time in ms) -> {tp: (error code, timestamp,
        offset)} for every partition asked. One request per leader broker, the brokers asked
        concurrently, a moved leader looked up again once, all within ``timeout_ms``. A partition
        whose leader could not be asked (down, timed out, no leader) gets LEADER_NOT_AVAILABLE (a
        client retries it after refreshing its metadata); one the cluster does not have,
        UNKNOWN_TOPIC_OR_PARTITION. Never raises for the data cluster's failures."""
        budget = _Budget(self.timeout_ms if timeout_ms is None else timeout_ms)
        out: dict[TopicPartition, tuple[int, int, int]] = {}
        todo = dict(specs)
        for attempt in range(2):
            now = self.clock.monotonic_ms()
            topics = sorted({t for t, _ in todo})
            stale = [t for t in topics if now - self.leaders_at.get(t, -10**15) > self.metadata_max_age_ms]
            if stale:
                try:
                    await self._metadata(stale, budget)
                except DataClusterError as exc:
                    log.debug("list offsets: no metadata", error=str(exc))
                    break
            by_leader: dict[int, dict] = {}
            for tp, ts in todo.items():
                leader = self.leaders.get(tp[0], {}).get(tp[1])
                if leader is None and tp[0] not in self.topic_errors:
                    out[tp] = (E.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)
                elif leader is not None and leader >= 0 and leader in self.brokers:
                    by_leader.setdefault(leader, {})[tp] = ts
            results = await asyncio.gather(*(self._list_offsets(node, tps, budget, isolation)
                                             for node, tps in by_leader.items()), return_exceptions=True)
            moved: dict = {}
            for tps, res in zip(by_leader.values(), results, strict=True):
                if isinstance(res, BaseException):
                    if not isinstance(res, DataClusterError):
                        raise res
                    log.debug("list offsets: a leader could not be asked", error=str(res))
                    for t in {t for t, _ in tps}:
                        self.leaders_at.pop(t, None)
                    continue
                answers, again = res
                out.update(answers)
                for tp in again:
                    moved[tp] = todo[tp]
            if not moved or attempt == 1:
                break
            for t in {t for t, _ in moved}:
                self.leaders_at.pop(t, None)
            todo = moved
        for tp in specs:
            if tp not in out:
                out[tp] = (E.LEADER_NOT_AVAILABLE, -1, -1)
        return out


    # -- record timestamps ------------------------------------------------------------------------
    async def record_times(self, offsets: dict[TopicPartition, int],
                           timeout_ms: int | None = None) -> dict[TopicPartition, int | None]:
        """The timestamp (epoch ms) of the record at each committed offset: one Fetch per leader
        broker (the brokers asked concurrently), within ``timeout_ms`` (the reader's timeout by
        default) in all. None where it cannot be read: no such record (compacted or deleted, past
        the log end), no leader, a broker that fails or is late, a log without v2 batches. Never
        raises for the data cluster's failures: the caller (lag in seconds when the log-end history
        cannot answer) simply has no time for those partitions this round."""
        out: dict[TopicPartition, int | None] = dict.fromkeys(offsets)
        if not offsets:
            return out
        budget = _Budget(self.timeout_ms if timeout_ms is None else timeout_ms)
        now = self.clock.monotonic_ms()
        stale = sorted({t for t, _ in offsets
                        if now - self.leaders_at.get(t, -10**15) > self.metadata_max_age_ms})
        if stale:
            try:
                await self._metadata(stale, budget)
            except DataClusterError as exc:
                log.debug("record times: no metadata", error=str(exc))
                return out
        by_leader: dict[int, dict[TopicPartition, int]] = {}
        for tp, off in offsets.items():
            leader = self.leaders.get(tp[0], {}).get(tp[1])
            if leader is not None and leader >= 0 and leader in self.brokers and off >= 0:
                by_leader.setdefault(leader, {})[tp] = off
        results = await asyncio.gather(*(self._record_times(node, tps, budget) for node, tps in by_leader.items()),
                                       return_exceptions=True)
        for tps, res in zip(by_leader.values(), results, strict=True):
            if isinstance(res, BaseException):
                if not isinstance(res, DataClusterError):
                    raise res
                log.debug("record times: a leader could not be asked", error=str(res))
                for t in {t for t, _ in tps}:
                    self.leaders_at.pop(t, None)
                continue
            out.update(res)
        return out

    async def _record_times(self, node: int, offsets: dict[TopicPartition, int], budget: _Budget) -> dict:
        """One Fetch (no wait) from one leader at each offset -> {tp: record time or None}."""
        self.stats["fetch_requests"] += 1
        # v4+ (record batches) by topic name: topic ids replace the names from v13
        resp, _ = await self._call(self.brokers[node], time_fetch(offsets), budget, max_version=FETCH_MAX_VERSION,
                                   min_version=4)
        return fetched_times(resp, offsets)


class TopicsRead:
    """What :meth:`DataClusterReader.topics` read."""

    __slots__ = ("found", "unknown", "errors")

    def __init__(self):
        self.found: dict[str, tuple[bytes, int]] = {}
        self.unknown: set[str] = set()
        self.errors: dict[str, int] = {}


class _Budget:
    """One fetch's time: every wait takes what is left of it."""

    __slots__ = ("at",)

    def __init__(self, ms: int):
        self.at = asyncio.get_running_loop().time() + ms / 1000

    def remaining(self) -> float:
        return max(0.0, self.at - asyncio.get_running_loop().time())

    def left(self, where: str, what: str) -> float:
        left = self.remaining()
        if left <= 0:
            raise DataClusterError(f"out of time before {what} with {where}")
        return left


def reader_from_config(config, timeout_ms: int) -> DataClusterReader:
    """The reader for ``data_bootstrap_server`` and ``data_command_config``; ``ValueError`` with one
    line for a file or an address that cannot be used."""
    from protocol.client_properties import load_command_config

    security = SecurityConfig()
    if config.data_command_config:
        try:
            security, ignored = load_command_config(config.data_command_config, "data_command_config")
        except OSError as exc:
            raise ValueError(f"data_command_config {config.data_command_config}: {exc.strerror or exc}") from None
        if ignored:
            log.info("data_command_config: settings that do not apply to herd's data-cluster reader",
                     ignored=ignored)
    servers = parse_servers(config.data_bootstrap_server, security.protocol)
    return DataClusterReader(servers, security, timeout_ms=timeout_ms)
