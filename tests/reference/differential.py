"""The differential harness: one raw-protocol script (herd's codec over a plain socket) run against
herd and against a real Kafka broker, the two transcripts normalised and compared field by field.

A script is a function ``script(r: Run)``. It opens connections with ``r.conn()``, sends requests
with ``r.call(conn, request, version)`` (or ``r.send`` / ``r.recv`` to keep several requests
parked at once), and every answer goes into ``r.transcript`` under a label. Group and topic names
come from ``r.group(...)`` / ``r.topic(...)``: they carry a per-run token, so a script can run
against a shared server more than once.

Normalisation changes only what must differ between two servers:
  * the run token in names -> ``<run>``;
  * the uuid in a minted member id -> ``#n`` in order of first appearance (the prefix, the client
    id or group.instance.id Kafka puts before it, is kept and compared);
  * throttle_time_ms, node ids, hosts and ports of coordinators and brokers; unknown tagged fields.
Everything else, error codes and messages included, is compared as it is.
"""
from __future__ import annotations

import re
import socket
import time
import uuid
from dataclasses import dataclass, field

from protocol import acls
from protocol import consumer as cp
from protocol import messages as m
from tools.rawclient import RawClient

UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
DROP_FIELDS = frozenset({"throttle_time_ms", "node_id", "host", "port", "unknown_tagged_fields",
                         "coordinators_node_id"})
CLOSED = "<connection closed>"


class Conn:
    def __init__(self, address, client_id: str):
        self.client_id = client_id
        self.raw = RawClient(address, client_id=client_id, timeout=20.0)
        self.closed = False

    def close(self):
        self.raw.close()


@dataclass
class Pending:
    conn: Conn
    api_key: int
    version: int
    cid: int


@dataclass
class Run:
    """One script against one server."""

    address: tuple[str, int]
    server: str  # "herd" | "kafka"
    token: str = field(default_factory=lambda: uuid.uuid4().hex[:8])
    transcript: list = field(default_factory=list)
    conns: list = field(default_factory=list)

    # -- names ---------------------------------------------------------------------------------
    def group(self, name: str = "g") -> str:
        return f"{name}-{self.token}"

    def topic(self, name: str = "t", partitions: int = 1) -> str:
        full = f"{name}-{self.token}"
        c = self.conn("admin")
        r = c.raw.call(m.CreateTopicsRequest(topics=[m.CreateTopicsRequestCreatableTopic(
            name=full, num_partitions=partitions, replication_factor=1)], timeout_ms=15000), 5)
        assert r.topics[0].error_code == 0, r
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:  # Kafka's metadata reaches the broker a moment later
            md = c.raw.call(m.MetadataRequest(topics=[m.MetadataRequestTopic(name=full)],
                                              allow_auto_topic_creation=False), 9)
            t = md.topics[0]
            if t.error_code == 0 and len(t.partitions) == partitions and all(
                    p.leader_id >= 0 for p in t.partitions):
                break
            time.sleep(0.05)
        else:
            raise AssertionError(f"topic {full} never showed {partitions} partitions on {self.server}")
        c.close()
        self.conns.remove(c)
        return full

    # -- connections and calls -----------------------------------------------------------------
    def conn(self, client_id: str = "ref") -> Conn:
        c = Conn(self.address, client_id)
        self.conns.append(c)
        return c

    def send(self, conn: Conn, request, version: int) -> Pending:
        try:
            cid = conn.raw.send(request, version)
        except OSError:  # closed by the server after an earlier request
            conn.closed = True
            cid = None
        return Pending(conn, request.API_KEY, version, cid)

    def recv(self, p: Pending, label: str | None = None):
        resp = None
        if not p.conn.closed:
            try:
                resp = p.conn.raw.receive(p.api_key, p.version, p.cid)
            except (ConnectionError, OSError):
                p.conn.closed = True
        name = (m.RESPONSES.get(p.api_key) or acls.RESPONSES[p.api_key]).NAME
        self.note(label or f"{name} v{p.version}", CLOSED if resp is None else resp)
        return resp

    def call(self, conn: Conn, request, version: int, label: str | None = None):
        return self.recv(self.send(conn, request, version), label)

    def parked(self, p: Pending, seconds: float = 0.3) -> bool:
        """True when no answer arrives within ``seconds`` (the request is held by the server)."""
        sock = p.conn.raw.sock
        sock.settimeout(seconds)
        try:
            sock.recv(1, socket.MSG_PEEK)
            return False  # an answer, or the connection closed
        except TimeoutError:
            return True
        finally:
            sock.settimeout(20.0)

    def wait_state(self, group: str, state: str, timeout: float = 10.0) -> None:
        """Until DescribeGroups says ``state`` (not recorded): orders requests sent on different
        connections, which a server may otherwise take in either order."""
        c = self.conn("ref-probe")
        deadline = time.monotonic() + timeout
        try:
            while True:
                got = c.raw.call(m.DescribeGroupsRequest(groups=[group]), 5).groups[0].group_state
                if got == state:
                    return
                if time.monotonic() > deadline:
                    raise AssertionError(f"{self.server}: {group} stayed {got}, never {state}")
                time.sleep(0.02)
        finally:
            c.close()
            self.conns.remove(c)

    def note(self, label: str, value) -> None:
        self.transcript.append((label, value))

    def close(self):
        for c in self.conns:
            c.close()


# -- normalisation and comparison --------------------------------------------------------------

def plain(value):
    if hasattr(value, "FIELDS"):
        return {n: plain(getattr(value, n)) for n in value.FIELDS}
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, bytes | bytearray):
        return decode_blob(bytes(value))
    return value


def decode_blob(b: bytes):
    """Consumer-protocol metadata and assignments shown decoded, anything else as hex."""
    for dec in (cp.decode_subscription, cp.decode_assignment):
        try:
            version, obj = dec(b)
        except Exception:  # noqa: BLE001 - not that kind of blob
            continue
        if obj.encode(min(version, type(obj).MAX_VERSION)) == b[2:]:
            return {"v": version, type(obj).NAME: plain(obj)}
    return "0x" + b.hex()


class Normaliser:
    def __init__(self, token: str):
        self.token = token
        self.uuids: dict[str, str] = {}

    def __call__(self, value, key=None):
        if isinstance(value, dict):
            return {k: self(v, k) for k, v in value.items() if k not in DROP_FIELDS}
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, str):
            value = value.replace(self.token, "<run>")
            return UUID_RE.sub(self._uuid, value)
        return value

    def _uuid(self, match) -> str:
        return self.uuids.setdefault(match.group(0), f"#{len(self.uuids) + 1}")


# Arrays whose order carries no meaning (a server builds them from hash maps): sorted by these keys.
SORT_KEYS = ("partition_index", "member_id", "group_id", "name", "topic")


def ordered(value):
    if isinstance(value, dict):
        return {k: ordered(v) for k, v in value.items()}
    if isinstance(value, list):
        items = [ordered(v) for v in value]
        if items and all(isinstance(v, dict) for v in items):
            for key in SORT_KEYS:
                if all(key in v for v in items):
                    return sorted(items, key=lambda v, k=key: str(v[k]))
        return items
    return value


def normalise(run: Run) -> list:
    norm = Normaliser(run.token)
    return [(label, ordered(norm(plain(v)))) for label, v in run.transcript]


def diff(a, b, path="") -> list[tuple[str, object, object]]:
    """Field-by-field differences between two normalised transcripts: (path, a, b)."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in list(a) + [k for k in b if k not in a]:
            out += diff(a.get(k, "<absent>"), b.get(k, "<absent>"), f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b) and not (a and isinstance(a[0], tuple)):
            return [(f"{path}[len]", len(a), len(b))] + [
                d for i, (x, y) in enumerate(zip(a, b, strict=False)) for d in diff(x, y, f"{path}[{i}]")]
        out = []
        for i, (x, y) in enumerate(zip(a, b, strict=False)):
            out += diff(x, y, f"{path}[{i}]")
        if len(a) != len(b):
            out.append((f"{path}[len]", len(a), len(b)))
        return out
    if isinstance(a, tuple) and isinstance(b, tuple):  # (label, value) transcript entries
        if a[0] != b[0]:
            return [(f"{path}<label>", a[0], b[0])]
        return diff(a[1], b[1], f"{path}{a[0]}")
    return [] if a == b else [(path, a, b)]


def compare(herd_run: Run, kafka_run: Run) -> list[tuple[str, object, object]]:
    return diff(normalise(herd_run), normalise(kafka_run))


def describe(diffs) -> str:
    return "\n".join(f"  {p}: herd={h!r} kafka={k!r}" for p, h, k in diffs)


# -- request builders shared by the scripts ---------------------------------------------------

def subscription(*topics: str, user_data: bytes | None = None) -> bytes:
    return cp.encode_subscription(cp.Subscription(topics=list(topics), user_data=user_data), 1)


def assignment(parts: dict[str, list[int]]) -> bytes:
    return cp.encode_assignment(cp.Assignment(assigned_partitions=[
        cp.TopicPartitions(topic=t, partitions=ps) for t, ps in parts.items()]), 1)


def join_req(group, member_id="", *, protocols=None, protocol_type="consumer", session_ms=10000,
             rebalance_ms=5000, instance_id=None, reason=None, topics=("x",)):
    if protocols is None:
        protocols = [("range", subscription(*topics))]
    return m.JoinGroupRequest(group_id=group, session_timeout_ms=session_ms, rebalance_timeout_ms=rebalance_ms,
                              member_id=member_id, group_instance_id=instance_id, protocol_type=protocol_type,
                              protocols=[m.JoinGroupRequestProtocol(name=n, metadata=md) for n, md in protocols],
                              reason=reason)


def sync_req(group, generation, member_id, assignments=(), *, instance_id=None, protocol_type="consumer",
             protocol_name="range"):
    return m.SyncGroupRequest(group_id=group, generation_id=generation, member_id=member_id,
                              group_instance_id=instance_id, protocol_type=protocol_type,
                              protocol_name=protocol_name,
                              assignments=[m.SyncGroupRequestAssignment(member_id=mid, assignment=a)
                                           for mid, a in assignments])


def commit_req(group, offsets, *, generation=-1, member_id="", instance_id=None, metadata="",
               leader_epoch=-1):
    """offsets: {topic: {partition: offset}}"""
    return m.OffsetCommitRequest(
        group_id=group, generation_id_or_member_epoch=generation, member_id=member_id,
        group_instance_id=instance_id,
        topics=[m.OffsetCommitRequestTopic(name=t, partitions=[
            m.OffsetCommitRequestPartition(partition_index=p, committed_offset=o, committed_metadata=metadata,
                                           committed_leader_epoch=leader_epoch)
            for p, o in ps.items()]) for t, ps in offsets.items()])


def fetch_req(group, topics: dict[str, list[int]] | None, version: int, require_stable=False):
    if version >= 8:
        return m.OffsetFetchRequest(groups=[m.OffsetFetchRequestGroup(
            group_id=group, topics=None if topics is None else [
                m.OffsetFetchRequestTopics(name=t, partition_indexes=ps) for t, ps in topics.items()])],
            require_stable=require_stable)
    return m.OffsetFetchRequest(group_id=group, topics=None if topics is None else [
        m.OffsetFetchRequestTopic(name=t, partition_indexes=ps) for t, ps in topics.items()],
        require_stable=require_stable)
