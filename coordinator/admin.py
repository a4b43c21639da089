"""``herd groups``: operate on the consumer groups of any Kafka-compatible server.

The same information and options as Kafka's ``kafka-consumer-groups.sh``, spoken over the Kafka
protocol, so it works against herd and against a real Kafka cluster alike::

    herd groups list            [--state [STATE ...]]
    herd groups describe        GROUP... | --all-groups  [--members [--verbose] | --state]
    herd groups offsets         GROUP
    herd groups reset-offsets   GROUP... | --all-groups  (--topic T[:P,P..]... | --all-topics)
                                (--to-earliest | --to-latest | --to-offset N | --shift-by N |
                                 --to-datetime ISO8601 | --by-duration PnDTnHnMnS | --to-current)
                                [--dry-run | --execute] [--no-clamp] [--export]
    herd groups reset-offsets   [GROUP... | --all-groups] --from-file FILE.csv [--dry-run | --execute]
    herd groups delete          --group G [--group G ...]
    herd groups delete-offsets  --group G --topic T[:P,P..] [--topic ...]
    herd groups history         GROUP --http HOST:PORT

Common options: ``--bootstrap-server HOST:PORT[,HOST:PORT]`` (default ``$HERD_BOOTSTRAP`` or
127.0.0.1:9092), ``--data-bootstrap-server`` (where the partitions live, for log-end offsets and
timestamp lookups; default: the bootstrap server), ``--timeout SECONDS`` (the whole command,
default 10), ``--output table|json``, ``--command-config FILE`` (TLS and SASL for every
connection, as Kafka's tool: a client properties file, see ``coordinator/command_config.py``).

How it talks to the server, as Kafka's admin client does: bootstrap, ApiVersions on every connection
(each request uses the highest version both sides support), Metadata for the brokers and the
partition leaders, FindCoordinator to route group requests to the group's coordinator, ListGroups to
every broker, DescribeGroups / OffsetFetch / OffsetCommit / DeleteGroups / OffsetDelete to the
coordinator, ListOffsets to the partition leaders. Coordinator moves (NOT_COORDINATOR,
COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS) are retried until the deadline.

herd keeps no partition data. It advertises Fetch and Produce (consumers need them) and answers
ListOffsets as for empty logs, but serves none of the APIs of a server that stores logs
(``holds_records``), so against it log ends are unknown: ``describe`` shows LOG-END-OFFSET and LAG
as "-", and ``reset-offsets`` refuses what needs them (--to-latest, --to-datetime, --by-duration,
--to-current of a partition without a commit) and does not clamp. ``--data-bootstrap-server``
points those lookups at the cluster that holds the data. A log end below the committed offset
(a truncated log) also shows LAG "-", never a negative number.

reset-offsets plans every group before it commits any: a group it refuses (active, or no plan can
be made for it) is reported and the others are reset, as Kafka's tool does; the exit code is 2 if
any group was not reset.

``history`` reads the flight recorder of a herd daemon from its HTTP endpoint
(``herd serve --metrics-port``): per rebalance, what started it, who was waited for and how long,
the protocol, the members and each phase's duration.
"""
from __future__ import annotations

import argparse
import csv
import datetime as dt
import json
import os
import re
import socket
import ssl
import struct
import sys
import time
import urllib.error
import urllib.parse
import urllib.request

from client.security import SecurityConfig, tls_failure
from coordinator.cli import CliError
from protocol import errors as E
from protocol import messages as m
from protocol.consumer import decode_assignment
from protocol.framing import frame
from protocol.headers import decode_response_header, encode_request_header
from protocol.wire import EncodeError, ProtocolError

__all__ = ["add_parser", "Cluster", "BrokerConnection"]

DEFAULT_BOOTSTRAP = "127.0.0.1:9092"
CLIENT_ID = "herd-admin"
STATES = ("Empty", "Stable", "PreparingRebalance", "CompletingRebalance", "Dead")
INACTIVE = ("Empty", "Dead")
_COORDINATOR_MOVED = {E.NOT_COORDINATOR, E.COORDINATOR_NOT_AVAILABLE, E.COORDINATOR_LOAD_IN_PROGRESS}
_LEADER_MOVED = {E.NOT_LEADER_OR_FOLLOWER, E.LEADER_NOT_AVAILABLE, E.UNKNOWN_LEADER_EPOCH,
                 E.FENCED_LEADER_EPOCH, E.REPLICA_NOT_AVAILABLE}
_MAX_RESPONSE = 100 * 1024 * 1024
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
LATEST, EARLIEST = -1, -2  # ListOffsets timestamps
INT64_MAX = (1 << 63) - 1
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
    out = []
    for item in text.split(","):
        item = item.strip()
        if not item:
            continue
        scheme, sep, rest = item.partition("://")
        if sep:  # a listener URL, e.g. SASL_SSL://host:9093
            if scheme.upper() != protocol:
                raise CliError(f"{flag} {item!r} names {scheme.upper()} but security.protocol is {protocol} "
                               f"(set it in --command-config)")
            item = rest
        if item.startswith("["):
            host, _, rest = item[1:].partition("]")
            port = rest.removeprefix(":")
        else:
            host, sep, port = item.rpartition(":")
            if not sep:
                host, port = item, "9092"
        if not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise CliError(f"invalid {flag} {item!r}: expected HOST:PORT")
        out.append((host, int(port)))
    if not out:
        raise CliError(f"{flag} is empty")
    return out


class AuthError(CliError):
    """The server refused this tool's credentials or certificate (or it would not verify): no
    other server of the cluster is tried, they would refuse too."""


# ---- the wire ------------------------------------------------------------------------------------

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
    """One blocking connection: ApiVersions on connect, then one request at a time."""

    def __init__(self, host: str, port: int, deadline: Deadline, node_id: int | None = None,
                 security: SecurityConfig | None = None):
        self.host, self.port, self.node_id = host, port, node_id
        security = security or SecurityConfig()
        self.deadline = deadline
        self.address = _addr(host, port)
        self.correlation_id = 0
        self.versions: dict[int, tuple[int, int]] = {}
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
            self._negotiate()
            if security.uses_sasl:
                self._authenticate(*security.sasl_credentials())
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

    # SASL as Kafka's clients: after ApiVersions, SaslHandshake v1 names the mechanism, then
    # SaslAuthenticate carries its tokens until it is done.
    def _authenticate(self, mechanism: str, username: str, password: str) -> None:
        from protocol.sasl import SaslError, client_mechanism

        hs = self.versions.get(m.SaslHandshakeRequest.API_KEY)
        auth = self.versions.get(m.SaslAuthenticateRequest.API_KEY)
        if hs is None or hs[1] < 1 or auth is None:
            raise AuthError(f"{self.address} does not offer SASL authentication: is its listener "
                            f"SASL_PLAINTEXT or SASL_SSL? (check security.protocol)")
        data = self._roundtrip(m.SaslHandshakeRequest(mechanism=mechanism), 1, "SaslHandshake")
        pos = self._body_pos(data, m.SaslHandshakeRequest.API_KEY, 1, "SaslHandshake")
        resp = self._decode(m.SaslHandshakeResponse, data, 1, pos, "SaslHandshake")
        if resp.error_code == E.UNSUPPORTED_SASL_MECHANISM:
            raise AuthError(f"{self.address} does not enable SASL mechanism {mechanism} (it enables: "
                            f"{', '.join(resp.mechanisms) or 'none'}); check sasl.mechanism")
        if resp.error_code == E.ILLEGAL_SASL_STATE:
            raise AuthError(f"{self.address}'s listener does not take SASL (SaslHandshake: ILLEGAL_SASL_STATE): "
                            f"check security.protocol")
        if resp.error_code != E.NONE:
            raise AuthError(f"{self.address} refused SaslHandshake: {_error_text(resp.error_code)}")
        mech = client_mechanism(mechanism, username, password)
        version = min(auth[1], m.SaslAuthenticateRequest.MAX_VERSION)
        token = mech.first()
        while token is not None:
            req = m.SaslAuthenticateRequest(auth_bytes=token)
            data = self._roundtrip(req, version, "SaslAuthenticate")
            pos = self._body_pos(data, req.API_KEY, version, "SaslAuthenticate")
            resp = self._decode(m.SaslAuthenticateResponse, data, version, pos, "SaslAuthenticate")
            if resp.error_code != E.NONE:
                why = resp.error_message or _error_text(resp.error_code)
                raise AuthError(f"{self.address}: SASL {mechanism} authentication of {username!r} failed: {why}")
            try:
                token = mech.step(bytes(resp.auth_bytes or b""))
            except SaslError as exc:
                raise AuthError(f"{self.address}: SASL {mechanism} authentication of {username!r} failed: "
                                f"{exc}") from None

    # ApiVersions: ask at our highest version; a server that does not know it answers v0 with
    # UNSUPPORTED_VERSION and its range, and we ask again at the highest version it knows.
    def _negotiate(self) -> None:
        version = m.ApiVersionsRequest.MAX_VERSION
        for _ in range(2):
            req = (m.ApiVersionsRequest(client_software_name=CLIENT_ID, client_software_version="1")
                   if version >= 3 else m.ApiVersionsRequest())
            data = self._roundtrip(req, version, "ApiVersions")
            pos = self._body_pos(data, m.ApiVersionsRequest.API_KEY, version, "ApiVersions")
            code = _I16.unpack_from(data, pos)[0] if len(data) >= pos + 2 else None
            body_version = 0 if code == E.UNSUPPORTED_VERSION else version
            resp = self._decode(m.ApiVersionsResponse, data, body_version, pos, "ApiVersions")
            theirs = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
            if resp.error_code == E.UNSUPPORTED_VERSION and 18 in theirs:
                version = min(theirs[18][1], m.ApiVersionsRequest.MAX_VERSION)
                continue
            if resp.error_code != E.NONE:
                raise CliError(f"{self.address} refused ApiVersions: {_error_text(resp.error_code)}")
            self.versions = theirs
            return
        raise CliError(f"{self.address} did not agree on an ApiVersions version")

    def version(self, cls) -> int:
        """The highest version of ``cls``'s API both sides support."""
        theirs = self.versions.get(cls.API_KEY)
        name = cls.NAME.removesuffix("Request")
        if theirs is None:
            raise CliError(f"{self.address} does not support {name}")
        v = min(theirs[1], cls.MAX_VERSION)
        if v < max(theirs[0], cls.MIN_VERSION):
            raise CliError(f"{self.address} supports {name} v{theirs[0]}-{theirs[1]}, "
                           f"this tool v{cls.MIN_VERSION}-{cls.MAX_VERSION}")
        return v

    def call(self, build):
        """``build(version) -> request``; returns ``(response, version)``."""
        probe = build(None)
        version = self.version(type(probe))
        req = build(version)
        name = type(req).NAME.removesuffix("Request")
        data = self._roundtrip(req, version, name)
        pos = self._body_pos(data, req.API_KEY, version, name)
        return self._decode(m.RESPONSES[req.API_KEY], data, version, pos, name), version

    def _body_pos(self, data: bytes, api_key: int, version: int, name: str) -> int:
        try:
            return decode_response_header(data, api_key, version)[1]
        except ProtocolError as exc:
            raise CliError(f"malformed {name} v{version} response from {self.address}: {exc}") from None

    def _decode(self, cls, data, version, pos, name):
        try:
            return cls.decode(data, version, pos)
        except ProtocolError as exc:
            raise CliError(f"malformed {name} v{version} response from {self.address}: {exc}") from None

    def _roundtrip(self, req, version: int, name: str) -> bytes:
        self.correlation_id += 1
        out = bytearray()
        encode_request_header(out, req.API_KEY, version, self.correlation_id, CLIENT_ID)
        try:
            req.encode_into(out, version)
        except EncodeError as exc:
            raise CliError(f"cannot encode {name} v{version}: {exc}") from None
        what = f"waiting for {self.address} ({name})"
        try:
            self.sock.settimeout(self.deadline.check(what))
            self.sock.sendall(frame(bytes(out)))
            size, = _I32.unpack(self._read(4, what, name))
            if not 0 <= size <= _MAX_RESPONSE:
                raise CliError(f"{self.address} sent a {name} response of {size} bytes: "
                               "is it a Kafka server?")
            data = self._read(size, what, name)
        except TimeoutError:
            raise CliError(f"timed out after {self.deadline.seconds:g}s {what}") from None
        except ssl.SSLError as exc:  # TLS 1.3: a refused client certificate shows up at the first read
            raise self._tls_error(exc) from None
        except OSError as exc:
            raise CliError(f"connection to {self.address} failed during {name}: {_strerror(exc)}") from None
        cid, = _I32.unpack_from(data, 0) if len(data) >= 4 else (None,)
        if cid != self.correlation_id:
            raise CliError(f"{self.address} answered {name} with correlation id {cid}, "
                           f"expected {self.correlation_id}")
        return data

    def _read(self, n: int, what: str, name: str) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            self.sock.settimeout(self.deadline.check(what))
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise CliError(f"{self.address} closed the connection during {name}")
            buf += chunk
        return bytes(buf)

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
            self.coordinators[group] = node_id
            return self.node(node_id)

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

    def list_groups(self, states: list[str]) -> list[dict]:
        self.metadata([])
        seen: dict[str, dict] = {}
        for node_id in sorted(self.brokers):
            conn = self.node(node_id)
            resp, v = conn.call(lambda v: m.ListGroupsRequest(
                states_filter=list(states) if v is not None and v >= 4 else []))
            if resp.error_code != E.NONE:
                raise CliError(f"ListGroups failed on {conn.address}: {_error_text(resp.error_code)}")
            for g in resp.groups:
                seen[g.group_id] = {"group": g.group_id, "protocol_type": g.protocol_type,
                                    "state": g.group_state if v >= 4 else None}
        return sorted(seen.values(), key=lambda g: g["group"])

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


# ---- the commands --------------------------------------------------------------------------------

def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--bootstrap-server", metavar="HOST:PORT[,HOST:PORT]",
                   default=os.environ.get("HERD_BOOTSTRAP") or DEFAULT_BOOTSTRAP,
                   help="the coordinator's cluster (default: $HERD_BOOTSTRAP or %(default)s)")
    p.add_argument("--data-bootstrap-server", metavar="HOST:PORT[,HOST:PORT]",
                   default=os.environ.get("HERD_DATA_BOOTSTRAP") or None,
                   help="the cluster holding the partitions, asked for log-end/earliest offsets and "
                        "timestamps (default: $HERD_DATA_BOOTSTRAP or the bootstrap server). herd holds no "
                        "data: point this at your Kafka cluster to see real lag")
    p.add_argument("--timeout", type=_seconds, default=10.0, metavar="SECONDS",
                   help="give up after this long (the whole command; default %(default)s)")
    p.add_argument("--output", choices=("table", "json"), default="table",
                   help="table (aligned columns, default) or json (stable keys, for scripts)")
    p.add_argument("--command-config", metavar="FILE", default=None,
                   help="client properties for every connection (TLS, SASL), as Kafka's tool: "
                        "security.protocol, sasl.mechanism, sasl.jaas.config, ssl.truststore.location "
                        "(PEM), or librdkafka's ssl.ca.location, sasl.username, ...")


def _seconds(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < v <= 86400:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 86400 seconds, got {text}")
    return v


def _offset_arg(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if not -INT64_MAX - 1 <= v <= INT64_MAX:
        raise argparse.ArgumentTypeError(f"out of range: {text} (offsets are 64-bit, at most {INT64_MAX})")
    return v


class _Parser(argparse.ArgumentParser):
    """Argument errors as one line and exit 2 (argparse prints the usage first by default), also
    for unrecognized arguments (which argparse would hand up to the top-level parser)."""

    def error(self, message):
        self.exit(2, f"herd: error: {self.prog}: {message} (see --help)\n")

    def parse_known_args(self, args=None, namespace=None):
        ns, extras = super().parse_known_args(args, namespace)
        if extras:
            self.error(f"unrecognized arguments: {' '.join(extras)}")
        return ns, extras


def add_parser(sub) -> None:
    groups = sub.add_parser(
        "groups", help="list, describe, reset and delete consumer groups (any Kafka-compatible server)",
        description="Operate on the consumer groups of herd or of any Kafka cluster, like "
                    "kafka-consumer-groups.sh. See the 'Operating herd' section of README.md.")
    groups.error = lambda message: _Parser.error(groups, message)  # one line here too
    gsub = groups.add_subparsers(dest="groups_command", required=True, metavar="COMMAND",
                                 parser_class=_Parser)

    p = gsub.add_parser("list", help="list groups", description="List the groups of every broker.")
    p.add_argument("--state", nargs="*", metavar="STATE", default=None,
                   help="show each group's state; with states, only groups in those states "
                        f"({', '.join(STATES[:-1])})")
    _common(p)
    p.set_defaults(func=cmd_list)

    p = gsub.add_parser("describe", help="offsets, lag and owners of each partition; --members; --state",
                        description="Describe groups: by default one row per partition with the "
                                    "committed offset, log-end offset, lag and the member that owns it.")
    _group_args(p)
    view = p.add_mutually_exclusive_group()
    view.add_argument("--members", action="store_true", help="one row per member")
    view.add_argument("--state", action="store_true", help="the group's coordinator, strategy, state, size")
    view.add_argument("--offsets", action="store_true", help="one row per partition (the default)")
    p.add_argument("--verbose", action="store_true", help="with --members: each member's partitions")
    _common(p)
    p.set_defaults(func=cmd_describe)

    p = gsub.add_parser("offsets", help="a group's committed offsets",
                        description="Show a group's committed offsets (no log-end lookups).")
    p.add_argument("group", metavar="GROUP")
    _common(p)
    p.set_defaults(func=cmd_offsets)

    p = gsub.add_parser("reset-offsets", help="plan (default) or --execute new committed offsets",
                        description="Reset the committed offsets of inactive groups (Empty or unknown). "
                                    "Prints the plan; commits it only with --execute.")
    _group_args(p)
    scope = p.add_mutually_exclusive_group()  # required, unless --from-file: checked in cmd_reset
    scope.add_argument("--topic", action="append", metavar="TOPIC[:P,P,...]",
                       help="a topic, or some of its partitions (repeatable)")
    scope.add_argument("--all-topics", action="store_true", help="every topic the group has offsets for")
    spec = p.add_mutually_exclusive_group(required=True)
    spec.add_argument("--to-earliest", action="store_true", help="the earliest offset")
    spec.add_argument("--to-latest", action="store_true", help="the log-end offset")
    spec.add_argument("--to-offset", type=_offset_arg, metavar="N", help="offset N")
    spec.add_argument("--shift-by", type=_offset_arg, metavar="N",
                      help="the committed offset plus N (may be < 0)")
    spec.add_argument("--to-datetime", metavar="ISO8601",
                      help="the first offset at or after this time, e.g. 2024-05-01T12:00:00.000 "
                           "(no zone: local time)")
    spec.add_argument("--by-duration", metavar="PnDTnHnMnS",
                      help="the first offset at or after now minus this duration")
    spec.add_argument("--to-current", action="store_true", help="the committed offset (log end where none)")
    spec.add_argument("--from-file", metavar="FILE.csv",
                      help="the offsets in FILE: TOPIC,PARTITION,OFFSET lines for one group, "
                           "GROUP,TOPIC,PARTITION,OFFSET for several (as written by --export)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--dry-run", action="store_true", help="only print the plan (the default)")
    mode.add_argument("--execute", action="store_true", help="commit the plan")
    p.add_argument("--export", action="store_true",
                   help="print the plan as CSV (TOPIC,PARTITION,OFFSET; with GROUP first unless one "
                        "group is named), for --from-file")
    p.add_argument("--no-clamp", action="store_true",
                   help="keep --to-offset/--shift-by/--from-file offsets outside [earliest, log end]")
    _common(p)
    p.set_defaults(func=cmd_reset)

    p = gsub.add_parser("delete", help="delete inactive groups and their offsets",
                        description="Delete groups (only Empty groups can be deleted).")
    p.add_argument("--group", action="append", required=True, metavar="GROUP", help="repeatable")
    _common(p)
    p.set_defaults(func=cmd_delete)

    p = gsub.add_parser("delete-offsets", help="delete a group's committed offsets of some topics",
                        description="Delete committed offsets of topics the group does not consume.")
    p.add_argument("--group", required=True, metavar="GROUP")
    p.add_argument("--topic", action="append", required=True, metavar="TOPIC[:P,P,...]", help="repeatable")
    _common(p)
    p.set_defaults(func=cmd_delete_offsets)

    p = gsub.add_parser("history", help="herd's rebalance flight recorder for a group",
                        description="Why did the group rebalance, and who was slow? Reads the flight "
                                    "recorder of a herd daemon from its HTTP endpoint (--metrics-port).")
    p.add_argument("group", metavar="GROUP")
    p.add_argument("--http", metavar="HOST:PORT", default=os.environ.get("HERD_HTTP") or None,
                   help="the daemon's HTTP endpoint (herd serve --metrics-port; default $HERD_HTTP)")
    p.add_argument("--timeout", type=_seconds, default=10.0, metavar="SECONDS")
    p.add_argument("--output", choices=("table", "json"), default="table")
    p.set_defaults(func=cmd_history)


def _group_args(p) -> None:
    p.add_argument("groups", nargs="*", metavar="GROUP", help="group ids (several allowed)")
    p.add_argument("--group", dest="more_groups", action="append", default=[], metavar="GROUP",
                   help="another group (repeatable; as kafka-consumer-groups.sh)")
    p.add_argument("--all-groups", action="store_true", help="every group")


def command_security(path: str | None) -> SecurityConfig:
    """``--command-config FILE`` -> the connections' TLS / SASL settings (PLAINTEXT without one)."""
    if path is None:
        return SecurityConfig()
    from coordinator.command_config import load_command_config

    try:
        security, ignored = load_command_config(path)
    except OSError as exc:
        raise CliError(f"--command-config {path}: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise CliError(str(exc)) from None
    if ignored:
        _note(f"--command-config {path}: not used by herd groups: {', '.join(ignored)}")
    return security


def _clusters(args):
    deadline = Deadline(args.timeout)
    security = command_security(args.command_config)  # one config for every connection, as Kafka's tool
    groups = Cluster(parse_servers(args.bootstrap_server, protocol=security.protocol), deadline, security)
    if args.data_bootstrap_server:
        data = Cluster(parse_servers(args.data_bootstrap_server, "--data-bootstrap-server", security.protocol),
                       deadline, security)
    else:
        data = groups
    return groups, data


def _close(*clusters) -> None:
    for c in clusters:
        c.close()


def _selected_groups(args, cluster: Cluster) -> list[str]:
    names = list(dict.fromkeys([*args.groups, *args.more_groups]))
    if args.all_groups:
        if names:
            raise CliError("give group names or --all-groups, not both")
        return [g["group"] for g in cluster.list_groups([])]
    if not names:
        raise CliError("which group? give GROUP (or --group GROUP, or --all-groups)")
    for n in names:
        if not n:
            raise CliError("the group id must not be empty")
    return names


def _parse_topic(spec: str) -> tuple[str, list[int] | None]:
    topic, sep, parts = spec.partition(":")
    if not topic:
        raise CliError(f"invalid --topic {spec!r}: expected TOPIC or TOPIC:P,P,...")
    if not sep:
        return topic, None
    try:
        ps = sorted({int(x) for x in parts.split(",")})
    except ValueError:
        raise CliError(f"invalid --topic {spec!r}: partitions are numbers (TOPIC:0,1,2)") from None
    if any(p < 0 for p in ps):
        raise CliError(f"invalid --topic {spec!r}: partitions are not negative")
    return topic, ps


def known_partitions(topics, data: Cluster, cluster: Cluster) -> dict[str, set[int] | None]:
    """The partitions of each topic, from the data cluster, else from the coordinator's (herd's
    catalog); None for a topic neither knows."""
    out: dict[str, set[int] | None] = {}
    todo = sorted(set(topics))
    for source in dict.fromkeys([data, cluster]):  # the same cluster once
        if not todo:
            break
        md = source.metadata(todo)
        for t in todo:
            info = md.get(t)
            if info is None or info["error"] == E.UNKNOWN_TOPIC_OR_PARTITION:
                out[t] = None
            elif info["error"] != E.NONE:
                raise CliError(f"cannot read the metadata of topic '{t}': {_error_text(info['error'])}")
            else:
                out[t] = set(info["partitions"])
        todo = [t for t in todo if out[t] is None]
    return out


def _resolve_topics(specs: list[str], data: Cluster, cluster: Cluster) -> list[tuple[str, int]]:
    """The partitions ``--topic`` names: every partition of a bare topic, the given ones of
    TOPIC:P,P (which must exist where the topic is known)."""
    parsed = [_parse_topic(s) for s in specs]
    known = known_partitions([t for t, _ in parsed], data, cluster)
    out = set()
    for t, ps in parsed:
        if ps is None:
            if known[t] is None:
                raise CliError(f"topic '{t}' does not exist")
            ps = known[t]
        out.update((t, p) for p in ps)
    check_partitions(out, known, _where(data, cluster))
    return sorted(out)


def _where(data: Cluster, cluster: Cluster) -> str:
    return " or ".join(dict.fromkeys(c.any().address for c in (data, cluster)))


def check_partitions(tps, known: dict[str, set[int] | None], where: str) -> None:
    """Kafka's check that every partition to reset exists. A topic no cluster knows is let through
    with a warning: herd keeps offsets for any topic (the data may live anywhere)."""
    missing = sorted((t, p) for t, p in tps if known.get(t) is not None and p not in known[t])
    if missing:
        raise CliError('The partitions "' + ",".join(f"{t}-{p}" for t, p in missing) + '" do not exist')
    for t in sorted({t for t, _ in tps if known.get(t) is None}):
        _note(f"warning: topic '{t}' does not exist on {where}: its partitions are not checked")


# ---- output ----------------------------------------------------------------------------------------

def _cell(v) -> str:
    if v is None or v == "":
        return "-"
    s = str(v)
    if s.isprintable():
        return s
    # client-supplied text (metadata, client ids) must not drive the terminal
    return "".join(c if c.isprintable() else ("\\x%02x" % ord(c) if ord(c) < 256 else "\\u%04x" % ord(c))
                   for c in s)


def print_table(headers: list[str], rows: list[list], file=None) -> None:
    file = file or sys.stdout
    cells = [[_cell(v) for v in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in cells]) for i, h in enumerate(headers)]
    for line in [headers, *cells]:
        print("  ".join(c.ljust(w) for c, w in zip(line, widths, strict=True)).rstrip(), file=file)


def print_json(obj) -> None:
    json.dump(obj, sys.stdout, indent=2)
    sys.stdout.write("\n")


def _note(text: str) -> None:
    sys.stdout.flush()
    print(text, file=sys.stderr)


# ---- list ------------------------------------------------------------------------------------------

def _canonical_state(text: str) -> str:
    for s in STATES:
        if s.lower() == text.lower():
            return s
    raise CliError(f"unknown group state {text!r} (one of {', '.join(STATES)})")


def cmd_list(args) -> int:
    states = [_canonical_state(s) for s in (args.state or [])]
    cluster, _ = _clusters(args)
    try:
        listed = cluster.list_groups(states)
        want_states = args.state is not None or args.output == "json"
        if want_states and any(g["state"] is None for g in listed):
            for g in listed:  # ListGroups < v4 has no states: ask each coordinator
                g["state"] = cluster.describe_group(g["group"])[0].group_state
            if states:
                listed = [g for g in listed if g["state"] in states]
    finally:
        cluster.close()
    if args.output == "json":
        print_json({"groups": listed})
    elif args.state is not None:
        print_table(["GROUP", "STATE"], [[g["group"], g["state"]] for g in listed])
    else:
        for g in listed:
            print(g["group"])
    return 0


# ---- describe ------------------------------------------------------------------------------------

def _assignment(member) -> list[tuple[str, int]]:
    try:
        _, asg = decode_assignment(member.member_assignment)
    except ProtocolError:
        return []
    return sorted((tp.topic, p) for tp in asg.assigned_partitions for p in tp.partitions)


def _lag(current, log_end):
    if current is None or log_end is None or log_end < current:
        return None
    return log_end - current


def describe_one(group: str, cluster: Cluster, data: Cluster) -> dict | None:
    """Everything describe shows about one group; None when it does not exist."""
    d, conn = cluster.describe_group(group)
    committed = cluster.committed(group)
    if d.group_state == "Dead" and not committed:
        return None
    consumer = d.protocol_type in ("consumer", "")
    members, owner = [], {}
    for mem in d.members:
        tps = _assignment(mem) if consumer else []
        by_topic: dict[str, list[int]] = {}
        for t, p in tps:
            by_topic.setdefault(t, []).append(p)
            owner[(t, p)] = mem
        members.append({"consumer_id": mem.member_id, "group_instance_id": mem.group_instance_id,
                        "host": mem.client_host, "client_id": mem.client_id, "partitions": len(tps),
                        "assignment": [{"topic": t, "partitions": ps} for t, ps in sorted(by_topic.items())]})
    tps = sorted(set(committed) | set(owner))
    # a server holding no records (herd) knows no log ends: LOG-END-OFFSET and LAG are unknown
    log_end = data.list_offsets(tps, LATEST) if tps and data.holds_records() else {}
    rows = []
    for t, p in tps:
        cur = committed.get((t, p), {}).get("offset")
        end = log_end.get((t, p))
        mem = owner.get((t, p))
        rows.append({"topic": t, "partition": p, "current_offset": cur, "log_end_offset": end,
                     "lag": _lag(cur, end), "consumer_id": mem.member_id if mem else None,
                     "group_instance_id": mem.group_instance_id if mem else None,
                     "host": mem.client_host if mem else None, "client_id": mem.client_id if mem else None})
    return {"group": group, "state": d.group_state, "protocol_type": d.protocol_type,
            "assignment_strategy": d.protocol_data or None,
            "coordinator": {"id": conn.node_id, "host": conn.host, "port": conn.port},
            "member_count": len(d.members), "members": members, "partitions": rows}


def cmd_describe(args) -> int:
    if args.verbose and not args.members:
        raise CliError("--verbose goes with --members")
    cluster, data = _clusters(args)
    try:
        names = _selected_groups(args, cluster)
        described, missing = [], []
        for g in names:
            info = describe_one(g, cluster, data)
            if info is None:
                missing.append(g)
            else:
                described.append(info)
    finally:
        _close(cluster, data)
    if args.output == "json":
        print_json({"groups": described})
    else:
        printed = [False]

        def separate():  # a blank line between the tables of two groups, none before the first
            if printed[0]:
                print()
            printed[0] = True
        for info in described:
            _print_describe(info, args, separate)
    if missing:
        if len(missing) == 1:
            raise CliError(f"Consumer group '{missing[0]}' does not exist.")
        raise CliError("Consumer groups " + ", ".join(f"'{g}'" for g in missing) + " do not exist.")
    return 0


def _print_describe(info: dict, args, separate=lambda: None) -> None:
    g, state = info["group"], info["state"]
    if args.state:
        separate()
        c = info["coordinator"]
        print_table(["GROUP", "COORDINATOR (ID)", "ASSIGNMENT-STRATEGY", "STATE", "#MEMBERS"],
                    [[g, f"{_addr(c['host'], c['port'])} ({c['id']})", info["assignment_strategy"], state,
                      info["member_count"]]])
        return
    if state == "Empty" or state == "Dead":
        _note(f"Consumer group '{g}' has no active members.")
    elif state in ("PreparingRebalance", "CompletingRebalance"):
        _note(f"Warning: Consumer group '{g}' is rebalancing.")
    if args.members:
        headers = ["GROUP", "CONSUMER-ID", "GROUP-INSTANCE-ID", "HOST", "CLIENT-ID", "#PARTITIONS"]
        if args.verbose:
            headers.append("ASSIGNMENT")
        rows = []
        for mem in info["members"]:
            row = [g, mem["consumer_id"], mem["group_instance_id"], mem["host"], mem["client_id"],
                   mem["partitions"]]
            if args.verbose:
                row.append(", ".join(f"{a['topic']}({','.join(map(str, a['partitions']))})"
                                     for a in mem["assignment"]) or "-")
            rows.append(row)
        if rows:
            separate()
            print_table(headers, rows)
        return
    if info["partitions"]:
        separate()
        print_table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID",
                     "HOST", "CLIENT-ID"],
                    [[g, r["topic"], r["partition"], r["current_offset"], r["log_end_offset"], r["lag"],
                      r["consumer_id"], r["host"], r["client_id"]] for r in info["partitions"]])


# ---- offsets -----------------------------------------------------------------------------------

def cmd_offsets(args) -> int:
    cluster, data = _clusters(args)
    try:
        d, _ = cluster.describe_group(args.group)
        committed = cluster.committed(args.group)
    finally:
        _close(cluster, data)
    if d.group_state == "Dead" and not committed:
        raise CliError(f"Consumer group '{args.group}' does not exist.")
    rows = [{"topic": t, "partition": p, **v} for (t, p), v in sorted(committed.items())]
    if args.output == "json":
        print_json({"group": args.group, "state": d.group_state, "offsets": rows})
    elif rows:
        print_table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LEADER-EPOCH", "METADATA"],
                    [[args.group, r["topic"], r["partition"], r["offset"], r["leader_epoch"], r["metadata"]]
                     for r in rows])
    else:
        _note(f"Consumer group '{args.group}' has no committed offsets.")
    return 0


# ---- reset-offsets -------------------------------------------------------------------------------

_NUM = r"(\d+(?:\.\d+)?)"
_DURATION = re.compile(rf"^P(?:{_NUM}D)?(?:T(?:{_NUM}H)?(?:{_NUM}M)?(?:{_NUM}S)?)?$")


def parse_duration(text: str) -> float:
    """ISO-8601 duration (PnDTnHnMnS, as Java's Duration.parse) in seconds."""
    mt = _DURATION.match(text.strip().upper())
    if not mt or text.strip().upper() in ("P", "PT") or text.strip().upper().endswith("T"):
        raise CliError(f"invalid --by-duration {text!r}: expected an ISO-8601 duration like PT1H30M or P1D")
    d, h, mi, s = (float(x) if x else 0.0 for x in mt.groups())
    return ((d * 24 + h) * 60 + mi) * 60 + s


def parse_datetime(text: str) -> int:
    """ISO-8601 date-time to epoch ms; without a zone it is local time (as kafka-consumer-groups.sh)."""
    try:
        when = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise CliError(f"invalid --to-datetime {text!r}: expected e.g. 2024-05-01T12:00:00.000 or "
                       "2024-05-01T12:00:00+02:00") from None
    if when.tzinfo is None:
        when = when.astimezone()
    return int(when.timestamp() * 1000)


class _Refused(Exception):
    """A group this reset leaves alone (active, or no plan can be made for it); the others go on."""


def _no_records(data: Cluster, needs: str) -> str:
    return (f"{needs}, which {data.any().address} does not have: it holds no records (a coordinator "
            "like herd); give --data-bootstrap-server, the Kafka cluster that holds the partitions")


def _check_reset_args(args) -> int | None:
    """Argument checks that need no server; returns the timestamp of --to-datetime/--by-duration."""
    if args.from_file is None and not args.topic and not args.all_topics:
        raise CliError("one of the arguments --topic --all-topics is required (or --from-file)")
    if args.from_file is not None and (args.topic or args.all_topics):
        raise CliError("--from-file takes the partitions from the file: no --topic or --all-topics")
    if args.export and args.output == "json":
        raise CliError("--export prints CSV: it does not go with --output json")
    if args.to_datetime is not None:
        return parse_datetime(args.to_datetime)
    if args.by_duration is not None:
        return int((time.time() - parse_duration(args.by_duration)) * 1000)
    return None


def read_reset_plan(path: str, group: str | None) -> dict[str, dict[tuple[str, int], int]]:
    """A --from-file CSV, as Kafka's tool reads it (and --export writes it): TOPIC,PARTITION,OFFSET
    lines for ``group``, the one group named, or GROUP,TOPIC,PARTITION,OFFSET lines."""
    try:
        with open(path, newline="", encoding="utf-8") as f:
            rows = list(csv.reader(f))
    except OSError as exc:
        raise CliError(f"cannot read --from-file {path}: {_strerror(exc)}") from None
    except (UnicodeDecodeError, csv.Error) as exc:
        raise CliError(f"cannot read --from-file {path}: {exc}") from None
    expected = ("TOPIC,PARTITION,OFFSET or " if group is not None else "") + "GROUP,TOPIC,PARTITION,OFFSET"
    plan: dict[str, dict[tuple[str, int], int]] = {}
    for n, row in enumerate(rows, 1):
        row = [x.strip() for x in row]
        if not any(row):
            continue
        if len(row) == 3 and group is not None:
            g, (t, p, o) = group, row
        elif len(row) == 4:
            g, t, p, o = row
        else:
            raise CliError(f"invalid --from-file {path} line {n}: expected {expected}")
        try:
            p, o = int(p), int(o)
        except ValueError:
            raise CliError(f"invalid --from-file {path} line {n}: partition and offset are numbers") from None
        if not t or p < 0 or not 0 <= o <= INT64_MAX:
            raise CliError(f"invalid --from-file {path} line {n}: expected a topic, a partition and an "
                           f"offset from 0 to {INT64_MAX}")
        plan.setdefault(g, {})[(t, p)] = o
    if not plan:
        raise CliError(f"--from-file {path} has no offsets")
    return plan


def _reset_scope(args, names, file_plan, data: Cluster, cluster: Cluster) -> list[tuple[str, int]]:
    """What holds for every group: whether the data cluster can answer what the reset needs, and
    the partitions of --topic (checked, as those of --from-file)."""
    needs = ("--to-latest needs the log-end offsets" if args.to_latest else
             "--to-datetime needs the records' timestamps" if args.to_datetime is not None else
             "--by-duration needs the records' timestamps" if args.by_duration is not None else None)
    if needs and not data.holds_records():
        raise CliError(_no_records(data, needs))
    tps: list[tuple[str, int]] = []
    if args.topic:
        tps = _resolve_topics(args.topic, data, cluster)
    elif file_plan is not None:
        listed = {tp for g in names for tp in file_plan.get(g, {})}
        check_partitions(listed, known_partitions({t for t, _ in listed}, data, cluster), _where(data, cluster))
    return tps


def _plan_group(args, group: str, cluster: Cluster, data: Cluster, tps, ts, file_plan) -> dict:
    d, _ = cluster.describe_group(group)
    res = {"group": group, "state": d.group_state, "error": None, "committed": False, "partitions": []}
    try:
        if d.group_state not in INACTIVE:
            raise _Refused(f"Assignments can only be reset if the group '{group}' is inactive, but the "
                           f"current state is {d.group_state}.")
        committed = cluster.committed(group)
        requested = None
        if file_plan is not None:
            requested = file_plan.get(group)
            if requested is None:
                raise _Refused(f"No reset plan for group '{group}' found in {args.from_file}.")
            tps = sorted(requested)
        elif args.all_topics:
            tps = sorted(committed)
        res["partitions"] = _plan(args, group, committed, data, tps, ts, requested)
        if not res["partitions"]:
            _note(f"Group '{group}' has no committed offsets to reset.")
    except _Refused as exc:
        res["error"] = str(exc)
    return res


def _plan(args, group: str, committed: dict, data: Cluster, tps, ts, requested) -> list[dict]:
    """The new offset of each of ``tps``; _Refused when one cannot be given."""
    cur = {tp: committed[tp]["offset"] for tp in tps if tp in committed}
    ends_known = data.holds_records()
    new: dict[tuple[str, int], int | None] = {}
    clamp = False
    if requested is not None:
        new = dict(requested)
        clamp = True
    elif args.to_earliest:
        new = data.list_offsets(tps, EARLIEST)
    elif args.to_latest:
        new = data.list_offsets(tps, LATEST)
    elif args.to_offset is not None:
        new = dict.fromkeys(tps, args.to_offset)
        clamp = True
    elif args.shift_by is not None:
        missing = [tp for tp in tps if tp not in cur]
        if missing:
            t, p = missing[0]
            raise _Refused(f"cannot shift the offset of {t}-{p}: group '{group}' has no committed offset "
                           "for it")
        new = {tp: max(0, cur[tp] + args.shift_by) for tp in tps}
        clamp = True
    elif ts is not None:
        new = data.list_offsets(tps, ts)
        no_match = [tp for tp in tps if new.get(tp) is None]
        if no_match:  # no record at or after that time: the log end, as Kafka does
            latest = data.list_offsets(no_match, LATEST)
            for t, p in no_match:
                if latest.get((t, p)) is not None:
                    _note(f"warning: Partition {p} from topic {t} is empty. Falling back to latest known offset.")
                    new[(t, p)] = latest[(t, p)]
    elif args.to_current:
        new = dict(cur)
        rest = [tp for tp in tps if tp not in cur]
        if rest and not ends_known:
            t, p = rest[0]
            raise _Refused(_no_records(data, f"--to-current needs the log-end offset of {t}-{p} (group "
                                             f"'{group}' has no committed offset for it)"))
        if rest:
            new.update(data.list_offsets(rest, LATEST))
    if clamp and not args.no_clamp and tps and ends_known:
        earliest, latest = data.list_offsets(tps, EARLIEST), data.list_offsets(tps, LATEST)
        for tp in tps:
            want, lo, hi = new[tp], earliest.get(tp), latest.get(tp)
            if hi is not None and want > hi:
                new[tp] = hi
            elif lo is not None and want < lo:
                new[tp] = lo
            if new[tp] != want:
                _note(f"warning: {tp[0]}-{tp[1]}: offset {want} is outside the log range "
                      f"[{_cell(lo)}, {_cell(hi)}]; using {new[tp]} (--no-clamp keeps {want})")
    unknown = [tp for tp in tps if new.get(tp) is None]
    if unknown:
        t, p = unknown[0]
        raise _Refused(f"cannot find an offset for {t}-{p}: no such partition, or its leader is unavailable")
    for (t, p) in tps:  # only --no-clamp (or unknown log ends) gets here with such offsets
        if new[(t, p)] < 0:
            raise _Refused(f"cannot reset {t}-{p} to offset {new[(t, p)]}: offsets are not negative")
        if new[(t, p)] > INT64_MAX:
            raise _Refused(f"cannot reset {t}-{p} to offset {new[(t, p)]}: offsets are at most {INT64_MAX}")
    return [{"topic": t, "partition": p, "current_offset": cur.get((t, p)), "new_offset": new[(t, p)]}
            for t, p in tps]


def _commit_plans(cluster: Cluster, results: list[dict]) -> str | None:
    """Commit each planned group in turn; when one fails to answer (deadline, lost connection),
    stop and return what was done, for the final error."""
    for i, res in enumerate(results):
        if res["error"] is not None or not res["partitions"]:
            continue
        for r in res["partitions"]:
            r["error"] = None
        try:
            codes = cluster.commit(res["group"], {(r["topic"], r["partition"]): r["new_offset"]
                                                  for r in res["partitions"]})
        except CliError as exc:
            res["committed"], res["error"] = None, str(exc)  # unknown: the commit may have landed
            for r in results[i + 1:]:
                if r["error"] is None and r["partitions"]:
                    r["error"] = f"not committed: the command stopped at group '{res['group']}'"
            done = [r["group"] for r in results if r["committed"]]
            rest = [r["group"] for r in results if r["committed"] is False]
            return "; ".join([str(exc), "reset: " + (_quoted(done) or "no group"),
                              f"unknown whether '{res['group']}' was reset"]
                             + (["not reset: " + _quoted(rest)] if rest else []))
        failed = []
        for r in res["partitions"]:
            code = codes.get((r["topic"], r["partition"]), E.UNKNOWN_SERVER_ERROR)
            if code != E.NONE:
                r["error"] = E.error_name(code)
                failed.append(f"{r['topic']}-{r['partition']}: {_error_text(code)}")
        res["committed"] = not failed
        if failed:
            more = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
            res["error"] = f"could not commit {res['group']} {failed[0]}{more}"
    return None


def _quoted(names) -> str:
    return ", ".join(f"'{n}'" for n in names)


def cmd_reset(args) -> int:
    ts = _check_reset_args(args)
    named = list(dict.fromkeys([*args.groups, *args.more_groups]))
    single = named[0] if len(named) == 1 and not args.all_groups else None  # Kafka's CSV without GROUP
    file_plan = read_reset_plan(args.from_file, single) if args.from_file is not None else None
    cluster, data = _clusters(args)
    stopped = None
    try:
        if file_plan is not None and not named and not args.all_groups:
            names = list(file_plan)  # the groups of the file
        else:
            names = _selected_groups(args, cluster)
        tps = _reset_scope(args, names, file_plan, data, cluster)
        # plan every group before committing any, so that a refused group stops nothing
        results = [_plan_group(args, g, cluster, data, tps, ts, file_plan) for g in names]
        clamps = args.to_offset is not None or args.shift_by is not None or args.from_file is not None
        if clamps and not args.no_clamp and any(res["partitions"] for res in results) and not data.holds_records():
            _note(f"warning: {data.any().address} holds no records, so the log range is unknown: offsets are "
                  "not clamped to it (give --data-bootstrap-server to clamp them)")
        if args.execute:
            stopped = _commit_plans(cluster, results)
    finally:
        _close(cluster, data)
    planned = [res for res in results if res["partitions"]]
    if args.output == "json":
        print_json({"executed": bool(args.execute), "groups": results})
    elif args.export:
        out = csv.writer(sys.stdout, lineterminator="\n")
        for res in planned:
            for r in res["partitions"]:
                out.writerow(([] if single else [res["group"]]) + [r["topic"], r["partition"], r["new_offset"]])
    elif planned:
        print_table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "NEW-OFFSET"],
                    [[res["group"], r["topic"], r["partition"], r["current_offset"], r["new_offset"]]
                     for res in planned for r in res["partitions"]])
    if not args.execute and any(res["error"] is None for res in results):
        _note("Dry run: nothing was committed. Add --execute to commit these offsets.")
    if stopped:
        raise CliError(stopped)
    bad = [res for res in results if res["error"] is not None]
    if len(bad) == 1:
        raise CliError(bad[0]["error"])
    if bad:
        for res in bad:
            _note(res["error"])
        raise CliError(f"{len(bad)} of {len(results)} groups were not reset: {_quoted(r['group'] for r in bad)}")
    return 0


# ---- delete / delete-offsets ------------------------------------------------------------------------

def cmd_delete(args) -> int:
    cluster, _ = _clusters(args)
    results = []
    try:
        for group in dict.fromkeys(args.group):
            code = cluster.delete_group(group)
            results.append({"group": group, "deleted": code == E.NONE,
                            "error": None if code == E.NONE else E.error_name(code)})
    finally:
        cluster.close()
    failed = [r for r in results if not r["deleted"]]
    if args.output == "json":
        print_json({"groups": results})
    else:
        ok = [r["group"] for r in results if r["deleted"]]
        if ok:
            names = ", ".join(f"'{g}'" for g in ok)
            print(f"Deletion of requested consumer groups ({names}) was successful.")
    if failed:
        msgs = [_delete_error(r["group"], r["error"]) for r in failed]
        if len(msgs) == 1:
            raise CliError(msgs[0])
        raise CliError(f"{len(msgs)} groups could not be deleted: " + "; ".join(msgs))
    return 0


def _delete_error(group: str, name: str) -> str:
    if name == "NON_EMPTY_GROUP":
        return f"Group '{group}' could not be deleted: the group is not empty (it has active members)."
    if name == "GROUP_ID_NOT_FOUND":
        return f"Group '{group}' could not be deleted: Consumer group '{group}' does not exist."
    code = getattr(E, name, None)
    return f"Group '{group}' could not be deleted: {_error_text(code) if code is not None else name}"


def cmd_delete_offsets(args) -> int:
    cluster, data = _clusters(args)
    try:
        parsed = [_parse_topic(s) for s in args.topic]
        whole = [t for t, ps in parsed if ps is None]
        if whole:  # all partitions: those the cluster knows, else those the group has offsets for
            committed = cluster.committed(args.group)
            md = data.metadata(sorted(set(whole)))
        parts: dict[str, set[int]] = {}
        for t, ps in parsed:
            if ps is None:
                info = md.get(t)
                known = set(info["partitions"]) if info and info["error"] == E.NONE else set()
                known |= {p for (ct, p) in committed if ct == t}
                if not known:
                    raise CliError(f"topic '{t}' does not exist and group '{args.group}' has no offsets "
                                   "for it")
                ps = known
            parts.setdefault(t, set()).update(ps)
        top, codes = cluster.delete_offsets(args.group, {t: sorted(ps) for t, ps in sorted(parts.items())})
    finally:
        _close(cluster, data)
    if top == E.GROUP_ID_NOT_FOUND:
        raise CliError(f"Consumer group '{args.group}' does not exist.")
    if top == E.NON_EMPTY_GROUP or top == E.GROUP_SUBSCRIBED_TO_TOPIC:
        pass  # reported per partition below
    elif top != E.NONE:
        raise CliError(f"cannot delete offsets of group '{args.group}': {_error_text(top)}")
    rows = []
    for t, ps in sorted(parts.items()):
        for p in sorted(ps):
            code = codes.get((t, p), top)
            rows.append({"topic": t, "partition": p, "deleted": code == E.NONE,
                         "error": None if code == E.NONE else E.error_name(code)})
    if args.output == "json":
        print_json({"group": args.group, "partitions": rows})
    else:
        print_table(["TOPIC", "PARTITION", "STATUS"],
                    [[r["topic"], r["partition"], "Successful" if r["deleted"] else f"Error: {r['error']}"]
                     for r in rows])
    bad = [r for r in rows if not r["deleted"]]
    if bad:
        r = bad[0]
        why = ("the group is subscribed to the topic" if r["error"] == "GROUP_SUBSCRIBED_TO_TOPIC"
               else _error_text(getattr(E, r["error"], E.UNKNOWN_SERVER_ERROR)))
        more = f" (and {len(bad) - 1} more)" if len(bad) > 1 else ""
        raise CliError(f"could not delete the offset of {r['topic']}-{r['partition']} for group "
                       f"'{args.group}': {why}{more}")
    return 0


# ---- history -------------------------------------------------------------------------------------

def _http_base(text: str | None) -> str:
    if not text:
        raise CliError("history reads herd's HTTP endpoint: give --http HOST:PORT (the --metrics-port of "
                       "herd serve) or set HERD_HTTP")
    if "://" not in text:
        text = "http://" + text
    u = urllib.parse.urlsplit(text)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise CliError(f"invalid --http {text!r}: expected HOST:PORT")
    try:
        _ = u.port
    except ValueError:
        raise CliError(f"invalid --http {text!r}: bad port") from None
    return f"{u.scheme}://{u.netloc}"


def fetch_history(base: str, group: str, timeout: float):
    url = f"{base}/groups/{urllib.parse.quote(group, safe='')}/history"
    where = urllib.parse.urlsplit(base).netloc
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            raise CliError(f"Consumer group '{group}' does not exist.") from None
        raise CliError(f"{where} answered HTTP {exc.code} for {url}") from None
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            raise CliError(f"timed out after {timeout:g}s waiting for {where}") from None
        text = _strerror(reason) if isinstance(reason, OSError) else str(reason)
        raise CliError(f"cannot connect to {where}: {text}") from None
    except TimeoutError:
        raise CliError(f"timed out after {timeout:g}s waiting for {where}") from None
    except OSError as exc:
        raise CliError(f"cannot read {url}: {_strerror(exc)}") from None
    try:
        return json.loads(body)
    except ValueError:
        raise CliError(f"{url} did not return JSON") from None


def cmd_history(args) -> int:
    base = _http_base(args.http)
    hist = fetch_history(base, args.group, args.timeout)
    if args.output == "json":
        print_json(hist)
        return 0
    if not isinstance(hist, list):
        raise CliError(f"unexpected answer from {base}: not a list of rebalances")
    for line in render_history(args.group, hist):
        print(line)
    return 0


def _ms(v) -> str:
    return "?" if v is None else f"{v} ms"


def _when(ms) -> str:
    if ms is None:
        return "?"
    return dt.datetime.fromtimestamp(ms / 1000, dt.UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def _who(e: dict) -> str:
    if "client_id" not in e:
        return f"[{e.get('member_id')}]"
    s = f"{e.get('client_id') or '?'}@{e.get('client_host') or '?'}"
    if e.get("group_instance_id"):
        s += f" (instance {e['group_instance_id']})"
    return s + f" [{e.get('member_id')}]"


def render_history(group: str, hist: list[dict]) -> list[str]:
    """The flight recorder as a readable timeline, oldest first."""
    if not hist:
        return [f"Group '{group}': no rebalances recorded."]
    reasons: dict[str, int] = {}
    people: dict[str, dict] = {}  # member id -> who (client id, host), from every entry
    for e in hist:
        reasons[e.get("reason")] = reasons.get(e.get("reason"), 0) + 1
        trigger = e.get("trigger") or {}
        for x in [trigger, *(trigger.get("members") or []), *(e.get("awaited") or []),
                  *(e.get("joined") or [])]:
            if x.get("member_id") and "client_id" in x:
                people.setdefault(x["member_id"], x)

    def who(mid):
        return _who(people.get(mid, {"member_id": mid}))
    slow = [(e["slowest_member"]["rejoined_after_ms"], e) for e in hist if e.get("slowest_member")]
    out = [f"Group '{group}': {len(hist)} rebalance{'s' if len(hist) != 1 else ''} recorded, oldest first "
           f"(times UTC).",
           "  reasons: " + ", ".join(f"{r} x{n}" for r, n in sorted(reasons.items(),
                                                                    key=lambda x: (-x[1], str(x[0]))))]
    if slow:
        ms, e = max(slow, key=lambda x: x[0])
        mid = e["slowest_member"]["member_id"]
        out.append(f"  slowest to rejoin: {who(mid)} after {ms} ms (generation {e.get('generation')})")
    for e in hist:
        out.append("")
        gen = e.get("generation")
        head = (f"generation {e.get('previous_generation')} -> {gen if gen is not None else '?'}  "
                f"{_when(e.get('started_wall_ms'))}  {e.get('reason')}  {e.get('outcome')}")
        if e.get("duration_ms") is not None:
            head += (" after " if e.get("outcome") != "in_progress" else " for ") + _ms(e["duration_ms"])
        out.append(head)
        if e.get("detail"):
            out.append(f"  why        {e['detail']}")
        if e.get("client_reason"):
            out.append(f"  client     {e['client_reason']}")
        stall = e.get("stall")
        if stall:  # herd itself stalled: the members got the time back (docs/reliability.md)
            if stall.get("when") == "during":
                out.append(f"  stall      herd stalled {_ms(stall.get('stall_ms'))} during this rebalance")
            else:
                out.append(f"  stall      started {_ms(stall.get('started_after_stall_ms'))} after herd stalled "
                           f"{_ms(stall.get('stall_ms'))}")
        awaited = e.get("awaited") or []
        trig = e.get("trigger")
        if trig:
            if trig.get("member_id"):
                out.append(f"  trigger    {who(trig['member_id'])}")
            for mid in trig.get("member_ids") or []:  # several members at once (LeaveGroup)
                out.append(f"  trigger    {who(mid)}")
        if awaited:
            first = True
            for a in sorted(awaited, key=lambda a: (a.get("rejoined_after_ms") is None,
                                                    -(a.get("rejoined_after_ms") or 0))):
                if a.get("rejoined_after_ms") is not None:
                    what = f"rejoined after {a['rejoined_after_ms']} ms"
                    if a.get("replaced_member_id"):
                        what += f" (replacing {a['replaced_member_id']})"
                else:
                    what = "did not rejoin"
                if a.get("outcome") not in (None, "rejoined"):
                    what += f" ({a['outcome']})"
                out.append(f"  {'waited for' if first else '':<10} {_who(a)}: {what}")
                first = False
        else:
            out.append("  waited for nobody")
        for j in e.get("joined") or []:
            out.append(f"  joined     {_who(j)} after {_ms(j.get('joined_after_ms'))}")
        for r in e.get("removed") or []:
            gone = who(r.get("member_id"))
            out.append(f"  removed    {gone}: {r.get('why')} after {_ms(r.get('after_ms'))}")
        ph = e.get("phases") or {}
        line = (f"  phases     preparing {_ms(ph.get('preparing_ms'))}, "
                f"completing {_ms(ph.get('completing_ms'))}")
        syncs = [s for s in e.get("sync") or [] if s.get("synced_after_ms") is not None]
        if syncs:
            worst = max(syncs, key=lambda s: s["synced_after_ms"])
            line += f"; slowest SyncGroup {worst['synced_after_ms']} ms from {who(worst['member_id'])}"
        out.append(line)
        result = f"  result     protocol {e.get('protocol') or '-'}, {_cell(e.get('members'))} member"
        out.append(result + ("" if e.get("members") == 1 else "s"))
    return out
