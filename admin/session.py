"""The admin tool's wire session: blocking connections to a Kafka-compatible cluster.

``BrokerConnection`` is one socket (TLS when configured) driven by the thin client's sans-IO
``Connection`` (framing, ApiVersions, SASL), one request at a time, every wait bounded by the
command's ``Deadline``. ``Cluster`` finds brokers, group coordinators and partition leaders from the
bootstrap servers and follows them when they move.
"""
from __future__ import annotations

import socket
import ssl
import time

from admin.errors import CliError
from protocol import acls as acl_messages
from protocol import errors as E
from protocol import messages as m
from protocol.client_connection import AuthenticationFailed, Connection, ConnectionBroken, Ready, Response
from protocol.client_security import BadServerList, SecurityConfig, split_servers, tls_failure
from protocol.record_batch import FETCH_MAX_VERSION, fetched_times, time_fetch
from protocol.wire import EncodeError

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
CLIENT_ID = "herd-admin"
_COORDINATOR_MOVED = {E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS}

_LEADER_MOVED = {E.NOT_LEADER_OR_FOLLOWER, E.LEADER_NOT_AVAILABLE, E.UNKNOWN_LEADER_EPOCH,
                 E.FENCED_LEADER_EPOCH, E.REPLICA_NOT_AVAILABLE}
_MAX_RESPONSE = 100 * 1024 * 1024
LATEST, EARLIEST = -1, -2  # ListOffsets timestamps

# APIs that only a server storing partition logs serves: DeleteRecords, OffsetForLeaderEpoch,
# AlterReplicaLogDirs, DescribeLogDirs (every Kafka broker since 1.0 serves all four). Fetch and
# Produce are no such sign: herd advertises them so that unmodified consumers run, but keeps no
# records and answers ListOffsets as for empty logs.
_LOG_APIS = (21, 23, 34, 35)
_FETCH = 1


def holds_records(versions: dict[int, tuple[int, int]]) -> bool:
    """Whether a server advertising ``versions`` (ApiVersions) stores partition data, so that its
    ListOffsets answers are real log offsets."""
    return _FETCH in versions and any(k in versions for k in _LOG_APIS)


def _error_text(code: int) -> str:
    info = E.ERRORS.get(code)
    return f"{info.name}: {info.message}" if info else E.error_name(code)


def _addr(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_servers(text: str, flag: str = "--bootstrap-server", protocol: str = "PLAINTEXT") -> list[tuple[str, int]]:
    try:
        return split_servers(text, protocol, default_port=9092)
    except BadServerList as exc:
        if exc.named:
            raise CliError(f"{flag} {exc.item!r} names {exc.named} but security.protocol is {protocol} "
                           f"(set it in --command-config)") from None
        if exc.item is None:
            raise CliError(f"{flag} is empty") from None
        raise CliError(f"invalid {flag} {exc.item!r}: expected HOST:PORT") from None


class AuthError(CliError):
    """The server refused this tool's credentials or certificate (or it would not verify): no
    other server of the cluster is tried, they would refuse too."""


class Deadline:
    def __init__(self, seconds: float):
        self.seconds = seconds
        self.at = time.monotonic() + seconds

    def remaining(self) -> float:
        return self.at - time.monotonic()

    def check(self, what: str) -> float:
        left = self.remaining()
        if left <= 0:
            raise CliError(f"timed out after {self.seconds:g}s {what}")
        return left


class BrokerConnection:
    """One blocking connection: TLS if configured, then the sans-IO ``Connection``'s handshake
    (ApiVersions, SASL), then one request at a time. Every wait is bounded by the deadline."""

    def __init__(self, host: str, port: int, deadline: Deadline, node_id: int | None = None,
                 security: SecurityConfig | None = None):
        self.host, self.port, self.node_id = host, port, node_id
        security = security or SecurityConfig()
        self.deadline = deadline
        self.address = _addr(host, port)
        self.versions: dict[int, tuple[int, int]] = {}
        self._conn = Connection(client_id=CLIENT_ID, max_frame_size=_MAX_RESPONSE,
                                sasl=security.sasl_credentials(), software=(CLIENT_ID, "1"))
        timeout = deadline.check(f"connecting to {self.address}")
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except TimeoutError:
            raise CliError(f"timed out after {deadline.seconds:g}s connecting to {self.address}") from None
        except OSError as exc:
            raise CliError(f"cannot connect to {self.address}: {_strerror(exc)}") from None
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            ctx = security.ssl_context()
            if ctx is not None:
                self._tls(ctx)
            self._conn.initiate()
            ready = self._until(lambda ev: isinstance(ev, Ready))
            self.versions = dict(ready.broker_versions)
        except BaseException:
            self.close()
            raise

    def _tls(self, ctx: ssl.SSLContext) -> None:
        try:
            self.sock.settimeout(self.deadline.check(f"connecting to {self.address} (TLS)"))
            self.sock = ctx.wrap_socket(self.sock, server_hostname=self.host)
        except ssl.SSLError as exc:
            raise self._tls_error(exc) from None
        except TimeoutError:
            raise CliError(f"timed out after {self.deadline.seconds:g}s in the TLS handshake with "
                           f"{self.address}") from None
        except OSError as exc:
            raise CliError(f"TLS handshake with {self.address} failed: {_strerror(exc)} (is it a TLS "
                           f"listener? check security.protocol)") from None

    def _tls_error(self, exc: ssl.SSLError) -> CliError:
        fatal, why = tls_failure(exc, self.host, self.port)
        return AuthError(why) if fatal else CliError(why)

    def _auth_error(self, exc: AuthenticationFailed) -> AuthError:
        """The SASL refusals, worded for this tool: the server named first."""
        if exc.reason == "no_sasl":
            return AuthError(f"{self.address} does not offer SASL authentication: is its listener "
                             f"SASL_PLAINTEXT or SASL_SSL? (check security.protocol)")
        if exc.reason == "mechanism":
            return AuthError(f"{self.address} does not enable SASL mechanism {exc.mechanism} (it enables: "
                             f"{', '.join(exc.enabled) or 'none'}); check sasl.mechanism")
        if exc.reason == "not_sasl_listener":
            return AuthError(f"{self.address}'s listener does not take SASL (SaslHandshake: ILLEGAL_SASL_STATE): "
                             f"check security.protocol")
        if exc.reason == "handshake":
            return AuthError(f"{self.address} refused SaslHandshake: {_error_text(exc.error_code)}")
        why = exc.broker_message or (_error_text(exc.error_code) if exc.error_code is not None else str(exc))
        return AuthError(f"{self.address}: SASL {exc.mechanism} authentication of {exc.username!r} failed: {why}")

    def version(self, cls, max_version: int | None = None) -> int:
        """The highest version of ``cls``'s API both sides support (at most ``max_version``)."""
        theirs = self.versions.get(cls.API_KEY)
        name = cls.NAME.removesuffix("Request")
        if theirs is None:
            raise CliError(f"{self.address} does not support {name}")
        v = min(theirs[1], cls.MAX_VERSION, cls.MAX_VERSION if max_version is None else max_version)
        if v < max(theirs[0], cls.MIN_VERSION):
            raise CliError(f"{self.address} supports {name} v{theirs[0]}-{theirs[1]}, "
                           f"this tool v{cls.MIN_VERSION}-{cls.MAX_VERSION}")
        return v

    def call(self, build, max_version: int | None = None):
        """``build(version) -> request``; returns ``(response, version)``."""
        probe = build(None)
        version = self.version(type(probe), max_version)
        req = build(version)
        name = type(req).NAME.removesuffix("Request")
        try:
            corr = self._conn.send(req, version)
        except EncodeError as exc:
            raise CliError(f"cannot encode {name} v{version}: {exc}") from None
        resp = self._until(lambda ev: isinstance(ev, Response) and ev.correlation_id == corr)
        if resp.error is not None:
            raise CliError(f"malformed {name} v{version} response from {self.address}: {resp.error}")
        return resp.message, version

    def _waiting_for(self) -> str:
        awaited = self._conn.awaiting()
        if not awaited:
            return "the server"
        key = awaited[0][1]
        return (m.REQUESTS.get(key) or acl_messages.REQUESTS[key]).NAME.removesuffix("Request")

    def _until(self, done):
        """Send what the connection has queued and read until an event satisfies ``done``."""
        while True:
            name = self._waiting_for()
            what = f"waiting for {self.address} ({name})"
            try:
                out = self._conn.data_to_send()
                if out:
                    self.sock.settimeout(self.deadline.check(what))
                    self.sock.sendall(out)
                self.sock.settimeout(self.deadline.check(what))
                chunk = self.sock.recv(1 << 20)
            except TimeoutError:
                raise CliError(f"timed out after {self.deadline.seconds:g}s {what}") from None
            except ssl.SSLError as exc:  # TLS 1.3: a refused client certificate shows up at the first read
                raise self._tls_error(exc) from None
            except OSError as exc:
                raise CliError(f"connection to {self.address} failed during {name}: {_strerror(exc)}") from None
            if not chunk:
                raise CliError(f"{self.address} closed the connection during {name}")
            try:
                events = self._conn.receive(chunk)
            except AuthenticationFailed as exc:
                raise self._auth_error(exc) from None
            except ConnectionBroken as exc:
                if exc.frame_size is not None:
                    raise CliError(f"{self.address} sent a {name} response of {exc.frame_size} bytes: "
                                   "is it a Kafka server?") from None
                raise CliError(f"{self.address} broke the connection during {name}: {exc}") from None
            for ev in events:
                if done(ev):
                    return ev

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _strerror(exc: OSError) -> str:
    if isinstance(exc, socket.gaierror):
        return exc.strerror or str(exc)
    return exc.strerror or str(exc) or type(exc).__name__


class Cluster:
    """Connections to one Kafka-compatible cluster, found from its bootstrap servers."""

    def __init__(self, servers: list[tuple[str, int]], deadline: Deadline, security: SecurityConfig | None = None):
        self.servers = servers
        self.deadline = deadline
        self.security = security or SecurityConfig()
        self.conns: dict[object, BrokerConnection] = {}
        self.brokers: dict[int, tuple[str, int]] = {}
        self.coordinators: dict[str, int] = {}
        self._bootstrap: BrokerConnection | None = None

    def close(self) -> None:
        for c in self.conns.values():
            c.close()
        self.conns.clear()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def any(self) -> BrokerConnection:
        if self._bootstrap is not None:
            return self._bootstrap
        problems = []
        for host, port in self.servers:
            try:
                conn = BrokerConnection(host, port, self.deadline, security=self.security)
            except AuthError:
                raise
            except CliError as exc:
                problems.append(str(exc))
                continue
            self.conns[("bootstrap", host, port)] = conn
            self._bootstrap = conn
            return conn
        if len(problems) == 1:
            raise CliError(problems[0])
        raise CliError("cannot connect to any bootstrap server: " + "; ".join(problems))

    def holds_records(self) -> bool:
        """False for a coordinator that keeps no records (herd): its log offsets mean nothing."""
        return holds_records(self.any().versions)

    def node(self, node_id: int) -> BrokerConnection:
        conn = self.conns.get(node_id)
        if conn is not None:
            return conn
        if node_id not in self.brokers:
            self.metadata([])
        if node_id not in self.brokers:
            raise CliError(f"broker {node_id} is not in the cluster metadata")
        host, port = self.brokers[node_id]
        boot = self._bootstrap
        if boot is not None and (boot.host, boot.port) == (host, port):
            conn = boot
            if conn.node_id is None:
                conn.node_id = node_id
        else:
            conn = BrokerConnection(host, port, self.deadline, node_id, self.security)
        self.conns[node_id] = conn
        return conn

    def _forget(self, node_id: int) -> None:
        conn = self.conns.pop(node_id, None)
        if conn is not None and conn is not self._bootstrap:
            conn.close()

    # -- Metadata ---------------------------------------------------------------------------------

    def metadata(self, topics: list[str] | None) -> dict[str, dict]:
        """Brokers (remembered) and, for ``topics`` (None: every topic), ``{topic: {"error": code,
        "partitions": {p: leader}}}``. Never creates topics."""
        def build(v):
            # every topic: null, or an empty list at v0; no topics (brokers only): an empty list, which
            # v0 answers with every topic (harmless). Topics are never auto-created (v4+ can say so).
            req = m.MetadataRequest(topics=([] if v == 0 else None) if topics is None else
                                    [m.MetadataRequestTopic(name=t) for t in topics])
            if v is not None and v >= 4:
                req.allow_auto_topic_creation = False
            return req
        resp, v = self.any().call(build)
        self.brokers = {b.node_id: (b.host, b.port) for b in resp.brokers}
        out = {}
        for t in resp.topics:
            out[t.name] = {"error": t.error_code,
                           "partitions": {p.partition_index: p.leader_id for p in t.partitions}}
        return out

    def partitions_of(self, topics: list[str]) -> dict[str, list[int]]:
        """Partition numbers of each topic; CliError for a topic the cluster does not have."""
        md = self.metadata(sorted(set(topics)))
        out = {}
        for t in topics:
            info = md.get(t)
            if info is None or info["error"] == E.UNKNOWN_TOPIC_OR_PARTITION:
                raise CliError(f"topic '{t}' does not exist")
            if info["error"] != E.NONE:
                raise CliError(f"cannot read the metadata of topic '{t}': {_error_text(info['error'])}")
            out[t] = sorted(info["partitions"])
        return out

    # -- groups ----------------------------------------------------------------------------------

    def coordinator(self, group: str) -> BrokerConnection:
        node_id = self.coordinators.get(group)
        if node_id is not None:
            return self.node(node_id)
        while True:
            def build(v):
                if v is not None and v >= 4:
                    return m.FindCoordinatorRequest(key_type=0, coordinator_keys=[group])
                return m.FindCoordinatorRequest(key=group, key_type=0)
            resp, v = self.any().call(build)
            if v >= 4:
                if not resp.coordinators:
                    raise CliError(f"FindCoordinator for group '{group}' returned no coordinator")
                c = resp.coordinators[0]
                code, msg, node_id, host, port = c.error_code, c.error_message, c.node_id, c.host, c.port
            else:
                code, msg = resp.error_code, getattr(resp, "error_message", None)
                node_id, host, port = resp.node_id, resp.host, resp.port
            if code in _COORDINATOR_MOVED:
                self._backoff(f"finding the coordinator of group '{group}' ({E.error_name(code)})")
                continue
            if code != E.NONE:
                raise CliError(f"cannot find the coordinator of group '{group}': "
                               f"{msg or _error_text(code)}")
            self.brokers[node_id] = (host, port)
            try:
                conn = self.node(node_id)
            except AuthError:
                raise
            except CliError as exc:
                # the named coordinator is down: in a herd cluster its shards move to a live node
                # once its lease ends, and FindCoordinator names that node from then on
                self._forget(node_id)
                if self.deadline.remaining() <= 0.2:
                    raise CliError(
                        f"the coordinator of group '{group}' is node {node_id} at {_addr(host, port)}, "
                        f"which cannot be reached ({exc}); if herd runs as a cluster, a dead node's "
                        f"groups move to a live node once its lease ends: try again in a few seconds "
                        f"or give a longer --timeout") from None
                self._backoff(f"finding the coordinator of group '{group}' (node {node_id} at "
                              f"{_addr(host, port)} cannot be reached)")
                continue
            self.coordinators[group] = node_id
            return conn

    def group_call(self, group: str, build, error_of):
        """Send a group request to ``group``'s coordinator; follow it when it moves."""
        while True:
            conn = self.coordinator(group)
            resp, v = conn.call(build)
            code = error_of(resp, v)
            if code in _COORDINATOR_MOVED:
                self.coordinators.pop(group, None)
                self._backoff(f"waiting for the coordinator of group '{group}' ({E.error_name(code)})")
                continue
            return resp, v, conn

    def _backoff(self, what: str) -> None:
        left = self.deadline.check(what)
        time.sleep(min(0.1, max(left, 0)))
        self.deadline.check(what)

    def list_groups(self, states: list[str], types: list[str] | None = None) -> list[dict]:
        """Every group of every broker: group, protocol_type, state (None before ListGroups v4) and
        type (``classic`` / ``consumer``; None before v5). ``types`` filters by type (v5+; older
        servers know only classic groups, so the filter is applied here)."""
        self.metadata([])
        seen: dict[str, dict] = {}
        for node_id in sorted(self.brokers):  # each broker lists the groups it coordinates (a cluster: fan out)
            conn = self.node(node_id)
            while True:
                resp, v = conn.call(lambda v: m.ListGroupsRequest(
                    states_filter=list(states) if v is not None and v >= 4 else [],
                    types_filter=list(types or []) if v is not None and v >= 5 else []))
                if resp.error_code != E.COORDINATOR_LOAD_IN_PROGRESS:
                    break
                self._backoff(f"listing the groups of {conn.address} (it is loading them)")
            if resp.error_code != E.NONE:
                raise CliError(f"ListGroups failed on {conn.address}: {_error_text(resp.error_code)}")
            for g in resp.groups:
                gtype = (g.group_type or None) if v >= 5 else None
                if types and v < 5 and "classic" not in types:
                    continue
                seen[g.group_id] = {"group": g.group_id, "protocol_type": g.protocol_type,
                                    "state": g.group_state if v >= 4 else None, "type": gtype}
        return sorted(seen.values(), key=lambda g: g["group"])

    def describe_consumer_group(self, group: str):
        """KIP-848: the group as ConsumerGroupDescribe sees it, with its coordinator; ``(None,
        conn)`` when the server does not serve that API or the group is not a consumer group
        (then DescribeGroups describes it)."""
        conn = self.coordinator(group)
        if m.ConsumerGroupDescribeRequest.API_KEY not in conn.versions:
            return None, conn

        def error_of(resp, v):
            return resp.groups[0].error_code if resp.groups else E.NONE
        resp, v, conn = self.group_call(group, lambda v: m.ConsumerGroupDescribeRequest(group_ids=[group]),
                                        error_of)
        d = resp.groups[0] if resp.groups else None
        if d is None or d.error_code == E.GROUP_ID_NOT_FOUND:
            return None, conn
        if d.error_code != E.NONE:
            raise CliError(f"cannot describe group '{group}': {_error_text(d.error_code)}")
        return d, conn

    def describe_group(self, group: str):
        def error_of(resp, v):
            return resp.groups[0].error_code if resp.groups else E.NONE
        resp, v, conn = self.group_call(group, lambda v: m.DescribeGroupsRequest(groups=[group]), error_of)
        if not resp.groups:
            raise CliError(f"DescribeGroups for '{group}' returned nothing")
        d = resp.groups[0]
        if d.error_code == E.GROUP_ID_NOT_FOUND:
            d.group_state = "Dead"
        elif d.error_code != E.NONE:
            raise CliError(f"cannot describe group '{group}': {_error_text(d.error_code)}")
        return d, conn

    def committed(self, group: str) -> dict[tuple[str, int], dict]:
        """Every committed offset of ``group``: {(topic, partition): {offset, leader_epoch, metadata}}."""
        def build(v):
            if v is not None and v >= 8:
                return m.OffsetFetchRequest(groups=[m.OffsetFetchRequestGroup(group_id=group, topics=None)])
            # null topics (all) from v2; v0/v1 can only ask for named partitions
            return m.OffsetFetchRequest(group_id=group, topics=None if v is None or v >= 2 else [])

        def error_of(resp, v):
            if v >= 8:
                return resp.groups[0].error_code if resp.groups else E.NONE
            return resp.error_code if v >= 2 else E.NONE
        resp, v, _ = self.group_call(group, build, error_of)
        code = error_of(resp, v)
        if code == E.GROUP_ID_NOT_FOUND:
            return {}
        if code != E.NONE:
            raise CliError(f"cannot fetch the offsets of group '{group}': {_error_text(code)}")
        topics = (resp.groups[0].topics if resp.groups else []) if v >= 8 else resp.topics
        out = {}
        for t in topics:
            for p in t.partitions:
                if p.error_code != E.NONE:
                    if p.error_code in (E.UNKNOWN_TOPIC_OR_PARTITION,):
                        continue
                    raise CliError(f"cannot fetch the offset of {t.name}-{p.partition_index} for group "
                                   f"'{group}': {_error_text(p.error_code)}")
                if p.committed_offset < 0:
                    continue
                out[(t.name, p.partition_index)] = {
                    "offset": p.committed_offset,
                    "leader_epoch": None if p.committed_leader_epoch < 0 else p.committed_leader_epoch,
                    "metadata": p.metadata}
        return out

    def commit(self, group: str, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int]:
        """Commit as a non-member (generation -1, no member id); returns {tp: error code}."""
        by_topic: dict[str, list] = {}
        for (t, p), off in sorted(offsets.items()):
            by_topic.setdefault(t, []).append(m.OffsetCommitRequestPartition(
                partition_index=p, committed_offset=off, committed_leader_epoch=-1, commit_timestamp=-1,
                committed_metadata=""))

        def build(v):
            return m.OffsetCommitRequest(
                group_id=group, generation_id_or_member_epoch=-1, member_id="", group_instance_id=None,
                retention_time_ms=-1, topics=[m.OffsetCommitRequestTopic(name=t, partitions=ps)
                                              for t, ps in by_topic.items()])

        def error_of(resp, v):
            codes = {p.error_code for t in resp.topics for p in t.partitions}
            moved = codes & _COORDINATOR_MOVED
            return next(iter(moved)) if moved else E.NONE
        resp, v, _ = self.group_call(group, build, error_of)
        return {(t.name, p.partition_index): p.error_code for t in resp.topics for p in t.partitions}

    def delete_group(self, group: str) -> int:
        def error_of(resp, v):
            return resp.results[0].error_code if resp.results else E.NONE
        resp, v, _ = self.group_call(group, lambda v: m.DeleteGroupsRequest(groups_names=[group]), error_of)
        return error_of(resp, v)

    def delete_offsets(self, group: str, parts: dict[str, list[int]]):
        def build(v):
            return m.OffsetDeleteRequest(group_id=group, topics=[
                m.OffsetDeleteRequestTopic(name=t, partitions=[m.OffsetDeleteRequestPartition(p) for p in ps])
                for t, ps in parts.items()])
        resp, v, _ = self.group_call(group, build, lambda resp, v: resp.error_code)
        return resp.error_code, {(t.name, p.partition_index): p.error_code
                                 for t in resp.topics for p in t.partitions}

    # -- ListOffsets -------------------------------------------------------------------------------

    def list_offsets(self, partitions, timestamp: int) -> dict[tuple[str, int], int | None]:
        """The offset for ``timestamp`` (LATEST, EARLIEST or epoch ms) of each partition, asked of
        its leader; None where unknown (no such topic, no leader, no message at that time)."""
        partitions = sorted(set(partitions))
        out: dict[tuple[str, int], int | None] = dict.fromkeys(partitions)
        if not partitions:
            return out
        todo = partitions
        for _attempt in range(3):
            md = self.metadata(sorted({t for t, _ in todo}))
            by_leader: dict[int, list] = {}
            for t, p in todo:
                leader = md.get(t, {}).get("partitions", {}).get(p)
                if leader is not None and leader >= 0:
                    by_leader.setdefault(leader, []).append((t, p))
            retry = []
            for leader, tps in sorted(by_leader.items()):
                topics: dict[str, list] = {}
                for t, p in tps:
                    topics.setdefault(t, []).append(m.ListOffsetsRequestListOffsetsPartition(
                        partition_index=p, current_leader_epoch=-1, timestamp=timestamp, max_num_offsets=1))
                conn = self.node(leader)
                req_topics = [m.ListOffsetsRequestListOffsetsTopic(name=t, partitions=ps)
                              for t, ps in topics.items()]
                resp, v = conn.call(lambda v, req_topics=req_topics: m.ListOffsetsRequest(
                    replica_id=-1, isolation_level=0, topics=req_topics))
                for rt in resp.topics:
                    for rp in rt.partitions:
                        tp = (rt.name, rp.partition_index)
                        if rp.error_code in _LEADER_MOVED:
                            retry.append(tp)
                            continue
                        if rp.error_code != E.NONE:
                            continue
                        if v == 0:
                            off = rp.old_style_offsets[0] if rp.old_style_offsets else -1
                        else:
                            off = rp.offset
                        out[tp] = off if off >= 0 else None
            if not retry:
                break
            for leader in list(by_leader):
                self._forget(leader)
            todo = retry
            self._backoff("waiting for partition leaders")
        return out


    # -- record timestamps -------------------------------------------------------------------------

    def record_times(self, offsets: dict[tuple[str, int], int]) -> dict[tuple[str, int], int | None]:
        """The timestamp (epoch ms) of the record at each offset, read with Fetch from its leader
        (None where it cannot be read: no such record, a log without v2 batches, a broker that does
        not answer Fetch). Best effort: a failing leader only leaves its partitions None."""
        out: dict[tuple[str, int], int | None] = dict.fromkeys(offsets)
        if not offsets:
            return out
        md = self.metadata(sorted({t for t, _ in offsets}))
        by_leader: dict[int, dict[tuple[str, int], int]] = {}
        for (t, p), off in sorted(offsets.items()):
            leader = md.get(t, {}).get("partitions", {}).get(p)
            if leader is not None and leader >= 0:
                by_leader.setdefault(leader, {})[(t, p)] = off
        for leader, tps in sorted(by_leader.items()):
            try:
                resp, _ = self.node(leader).call(time_fetch(tps), max_version=FETCH_MAX_VERSION)
            except AuthError:
                raise
            except CliError:
                self._forget(leader)
                continue
            out.update(fetched_times(resp, tps))
        return out
