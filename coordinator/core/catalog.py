"""The topic catalog, and the answers for the broker APIs a group member also sends.

herd keeps no partition data, but consumers ask for Metadata (to learn partition counts for
assignment), FindCoordinator, ListOffsets and Fetch. This module answers them as a one-node
cluster whose logs are all empty:

* Metadata: every known topic with this node as leader of every partition. Unknown topics are
  created on the fly when ``auto_create_topics`` is on and the client allows it (v4+), as Kafka's
  ``auto.create.topics.enable``; otherwise UNKNOWN_TOPIC_OR_PARTITION.
* ListOffsets: offset 0 for earliest and latest (an empty log).
* Fetch: no records, and a high watermark equal to the fetch offset, so a consumer that resumes
  from a committed offset stays where it is instead of being reset (the runtime delays the answer
  by the request's max wait, as a broker with no new data does).
* CreateTopics: adds topics (replication factor -1 or 1 on this one-node cluster).

Topics are durable: each is a herd-specific record in shard 0's log (key type ``TOPIC_RECORD``),
so they survive restarts and are compacted with everything else. Each carries the topic's id, a
UUID minted when the topic is created and never changed (Metadata v10+ and Fetch v13+ name topics
by id; KIP-848 assignments are by topic id). A record with the nil id (none written by herd so far,
but an id must never be missing) gets one minted once at start-up, written back durably.
A ``--topic name:N`` with more partitions than the topic has grows it at start-up (never shrinks).
Pure: no I/O, no clock.

With a data cluster (``data_bootstrap_server``; ``data`` set to a :class:`DataTopics`), the data
cluster is the catalog: Metadata answers its partition counts and topic ids (this node still the
leader of every partition), a topic it does not have is UNKNOWN_TOPIC_OR_PARTITION (never
auto-created), CreateTopics is refused (POLICY_VIOLATION: create topics there), consumer groups
assign its topics by its ids, and ``--topic`` creates nothing. :class:`DataTopics` is that view as
last read (pure: time comes in as arguments); ``coordinator.ops.datacatalog`` reads it on the loop and
the runtime parks a Metadata whose topics were never read until the read returns (bounded).
ListOffsets is then answered by the data cluster (``list_offsets_answer`` shapes its answer).

Where groups are coordinated is a *routing* object given at construction (:class:`Routing`; default
:class:`ThisNodeOnly`: every shard is this node's). In a cluster
(:class:`coordinator.cluster.node.Routing`) Metadata and DescribeCluster list every live node
(``routing.brokers(me)``), FindCoordinator answers the node that owns the group's shard
(``routing.coordinator(shard, me)``; None, an owner not known or a view that may be stale:
COORDINATOR_NOT_AVAILABLE, retriable); the topic records are kept in the database by the runtime
(``Runtime.topic_store``), not in shard 0.
"""
from __future__ import annotations

import re
import struct
import uuid
from dataclasses import dataclass
from typing import Protocol

from coordinator.core.partitioning import shard_for
from coordinator.core.responses import kafka_error_message
from coordinator.core.result import Result
from coordinator.core.versions import CREATE_TOPICS, DESCRIBE_CLUSTER, FETCH, FIND_COORDINATOR, LIST_OFFSETS, METADATA
from protocol import errors as E
from protocol import messages as m
from protocol.wire import ProtocolError

TOPIC_RECORD = 0x7F00  # herd's own record type, outside Kafka's __consumer_offsets range
CATALOG_SHARD = 0
# FindCoordinator key types other than a group (0): Kafka's CoordinatorType
TRANSACTION_KEY = 1
SHARE_KEY = 2
_KEY = struct.Struct(">hh")
_VALUE = struct.Struct(">hi16s")
_TOPIC_RE = re.compile(r"[a-zA-Z0-9._-]+")
MAX_TOPIC_LEN = 249
MAX_PARTITIONS = 100_000
NIL_ID = bytes(16)  # Kafka's Uuid.ZERO_UUID: no topic id
MAX_TIMESTAMP, LATEST_TIERED_TIMESTAMP = -3, -5  # ListOffsets special timestamps (-1 latest, -2 earliest)

# What a broker without an authorizer reports: every operation the resource type supports (Kafka's
# AclEntry.supportedOperations; AclOperation codes READ 3, WRITE 4, CREATE 5, DELETE 6, ALTER 7,
# DESCRIBE 8, CLUSTER_ACTION 9, DESCRIBE_CONFIGS 10, ALTER_CONFIGS 11, IDEMPOTENT_WRITE 12).
TOPIC_AUTHORIZED_OPERATIONS = sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
CLUSTER_AUTHORIZED_OPERATIONS = sum(1 << op for op in (5, 7, 8, 9, 10, 11, 12))


@dataclass
class Topic:
    name: str
    partitions: int
    topic_id: bytes


def topic_key(name: str) -> bytes:
    raw = name.encode()
    return _KEY.pack(TOPIC_RECORD, len(raw)) + raw


def topic_value(topic: Topic) -> bytes:
    return _VALUE.pack(0, topic.partitions, topic.topic_id)


def decode_topic_record(key: bytes, value: bytes | None) -> tuple[str, Topic | None]:
    """-> (topic name, the topic; None for a tombstone). Raises ProtocolError when damaged."""
    try:
        _, n = _KEY.unpack_from(key, 0)
        name = key[4:4 + n].decode()
    except (struct.error, UnicodeDecodeError) as exc:
        raise ProtocolError(f"bad topic record key: {exc}") from None
    if value is None:
        return name, None
    try:
        _, parts, tid = _VALUE.unpack_from(value, 0)
    except struct.error as exc:
        raise ProtocolError(f"bad topic record value: {exc}") from None
    return name, Topic(name, parts, tid)


def is_topic_record(key: bytes) -> bool:
    return len(key) >= 2 and key[0] == 0x7F and key[1] == 0x00


def validate_topic_name(name: str) -> str | None:
    """Kafka's Topic.validate: None when valid, else the reason."""
    if not name:
        return "Topic name is illegal, it can't be empty"
    if name in (".", ".."):
        return "Topic name cannot be \".\" or \"..\""
    if len(name) > MAX_TOPIC_LEN:
        return f"Topic name is illegal, it can't be longer than {MAX_TOPIC_LEN} characters"
    if not _TOPIC_RE.fullmatch(name):
        return f"Topic name \"{name}\" is illegal, it contains a character other than ASCII " \
               "alphanumerics, '.', '_' and '-'"
    return None


# DataTopics.lookup: a topic never read (or not for a while): read it before answering
PENDING = object()
# a name the data cluster did not have (or could not describe) is asked again after this long
RECHECK_MS = 1000
MAX_REMEMBERED = 10_000  # names known missing or failing, past which the expired ones are forgotten


class DataTopics:
    """The data cluster's topics as herd last read them (pure: ``now`` is monotonic ms passed in).

    ``topics``/``by_id`` hold what the last reads found. A read of every topic (``apply_all``,
    every ``data_metadata_refresh_interval_ms``) replaces the view; a read of some names
    (``apply_names``, a Metadata or a consumer group asking for names the view lacks) adds to it.
    ``lookup(name, now)`` answers a Topic, an error code (UNKNOWN_TOPIC_OR_PARTITION: the data
    cluster said it has none, within ``recheck_ms``; the data cluster's own error for the topic; or
    LEADER_NOT_AVAILABLE: its read failed, within ``recheck_ms``), or :data:`PENDING` (read it first)."""

    def __init__(self, recheck_ms: int = RECHECK_MS):
        self.recheck_ms = recheck_ms
        self.topics: dict[str, Topic] = {}
        self.by_id: dict[bytes, Topic] = {}
        self.full_at: int | None = None  # when a read of every topic last answered
        self.checked: dict[str, int] = {}  # name -> when a read found the data cluster lacks it
        self.errors: dict[str, tuple[int, int]] = {}  # name -> (error code, when): can't be described now
        self.wanted: set[str] = set()  # names asked for and not known: read them soon
        self.on_wanted = None  # called (no argument) when a name is added to ``wanted``
        self.version = 0  # bumped by every change of ``topics``

    def lookup(self, name: str, now: int):
        topic = self.topics.get(name)
        if topic is not None:
            return topic
        err = self.errors.get(name)
        if err is not None and now - err[1] < self.recheck_ms:
            return err[0]
        # (a read of every topic that lacked it says nothing: the topic may have been made since)
        last = self.checked.get(name)
        if last is not None and now - last < self.recheck_ms:
            return E.UNKNOWN_TOPIC_OR_PARTITION
        return PENDING

    def want(self, name: str) -> None:
        """A consumer group asked for ``name`` (it does not wait): the reader reads it soon, unless
        it was read lately (``lookup`` is not PENDING then)."""
        if name not in self.topics and name not in self.wanted and validate_topic_name(name) is None:
            self.wanted.add(name)
            if self.on_wanted is not None:
                self.on_wanted()

    def apply_all(self, found: dict[str, tuple[bytes, int]], errors: dict[str, int], now: int) -> bool:
        """A read of every topic answered: -> whether the view changed."""
        self.full_at = now
        self.errors = {n: (c, now) for n, c in errors.items()}
        changed = False
        for name in list(self.topics):
            if name not in found and name not in errors:  # deleted (one it cannot describe now is kept)
                self._drop(name)
                changed = True
        for name, (tid, count) in found.items():
            changed |= self._put(name, tid, count)
        if changed:
            self.version += 1
        return changed

    def apply_names(self, found: dict[str, tuple[bytes, int]], unknown, errors: dict[str, int], now: int) -> bool:
        """A read of some names answered: -> whether the view changed."""
        changed = False
        if len(self.checked) + len(self.errors) > MAX_REMEMBERED:  # bounded: names asked for at random
            self.checked = {n: t for n, t in self.checked.items() if now - t < self.recheck_ms}
            self.errors = {n: e for n, e in self.errors.items() if now - e[1] < self.recheck_ms}
        for name in unknown:
            self.checked[name] = now
            self.errors.pop(name, None)
            if name in self.topics:
                self._drop(name)
                changed = True
        for name, code in errors.items():
            self.errors[name] = (code, now)
        for name, (tid, count) in found.items():
            self.errors.pop(name, None)
            self.checked.pop(name, None)
            changed |= self._put(name, tid, count)
        if changed:
            self.version += 1
        return changed

    def read_failed(self, names, now: int) -> None:
        """A read of ``names`` failed (the data cluster unreachable or late): they answer
        LEADER_NOT_AVAILABLE (retriable) for a while instead of waiting again at once."""
        for name in names:
            if name not in self.topics:
                self.errors[name] = (E.LEADER_NOT_AVAILABLE, now)

    def _put(self, name: str, tid: bytes, count: int) -> bool:
        old = self.topics.get(name)
        if old is not None and old.topic_id == tid and old.partitions == count:
            return False
        if old is not None:
            self.by_id.pop(old.topic_id, None)
        topic = self.topics[name] = Topic(name, count, tid)
        self.by_id[tid] = topic
        return True

    def _drop(self, name: str) -> None:
        old = self.topics.pop(name, None)
        if old is not None:
            self.by_id.pop(old.topic_id, None)


Node = tuple[int, str, int]  # (node id, host, port)


class Routing(Protocol):
    """Which nodes clients may use and which one coordinates a shard; ``me`` is this node."""

    def brokers(self, me: Node) -> list[Node]:
        """Every node clients may use, ``me`` among them, sorted by node id."""

    def coordinator(self, shard: int, me: Node) -> Node | None:
        """The node serving ``shard``; None: not known now (retriable)."""


class ThisNodeOnly:
    """One node alone: it is every broker and coordinates every shard."""

    def brokers(self, me: Node) -> list[Node]:
        return [me]

    def coordinator(self, shard: int, me: Node) -> Node:
        return me


class Catalog:
    def __init__(self, config, node_id: int = 0, routing: Routing | None = None, data: DataTopics | None = None):
        self.config = config
        self.data = data  # the data cluster's topics (see the module docstring); None: herd's own catalog
        self.node_id = node_id
        self.host = config.advertised_host or config.host
        self.port = config.advertised_port or config.port
        self.topics: dict[str, Topic] = {}
        self.by_id: dict[bytes, Topic] = {}
        self.routing = routing if routing is not None else ThisNodeOnly()  # see the module docstring
        self._reads = {FIND_COORDINATOR: self.find_coordinator, LIST_OFFSETS: self.list_offsets,
                       DESCRIBE_CLUSTER: self.describe_cluster, FETCH: self.fetch}

    # ---- state -------------------------------------------------------------------------------

    def set_address(self, host: str, port: int) -> None:
        self.host, self.port = host, port

    def replay(self, key: bytes, value: bytes | None) -> None:
        name, topic = decode_topic_record(key, value)
        old = self.topics.pop(name, None)
        if old is not None:
            self.by_id.pop(old.topic_id, None)
        if topic is None:
            return
        self.topics[name] = topic
        self.by_id[topic.topic_id] = topic

    def create(self, name: str, partitions: int, writes: list) -> Topic:
        """Create (in memory, via replay) and queue the durable record into ``writes``."""
        return self._write(Topic(name, partitions, uuid.uuid4().bytes), writes)

    def _write(self, topic: Topic, writes: list) -> Topic:
        key, value = topic_key(topic.name), topic_value(topic)
        self.replay(key, value)
        writes.append((CATALOG_SHARD, key, value))
        return topic

    def configured_topics(self) -> list:
        """Writes run once after replay: create the ``--topic`` topics not yet known, grow those
        configured with more partitions than they have, and give any topic without an id one."""
        writes: list = []
        if self.data is not None:  # the data cluster's topics are the catalog: herd creates none
            return writes
        for topic in list(self.topics.values()):
            if topic.topic_id == NIL_ID:
                self._write(Topic(topic.name, topic.partitions, uuid.uuid4().bytes), writes)
        for name, parts in self.config.topics:
            topic = self.topics.get(name)
            if topic is None:
                self.create(name, parts, writes)
            elif parts > topic.partitions:
                self._write(Topic(name, parts, topic.topic_id), writes)
        return writes

    # ---- routing -----------------------------------------------------------------------------

    def brokers(self) -> list[tuple[int, str, int]]:
        """(node id, host, port) of every node clients may use: this one alone, or the cluster's
        live nodes (this one always among them)."""
        return self.routing.brokers((self.node_id, self.host, self.port))

    def coordinator(self, key: str) -> tuple[int, str, int] | None:
        """The node that coordinates group ``key`` (None: not known now, retriable)."""
        return self.routing.coordinator(shard_for(key, self.config.offsets_partitions),
                                        (self.node_id, self.host, self.port))

    # ---- the catalog as consumer groups see it (coordinator.core.consumer.Topics) ------------------

    def get(self, name: str) -> tuple[bytes, int] | None:
        data = self.data
        if data is not None:
            topic = data.topics.get(name)
            if topic is None:
                data.want(name)
        else:
            topic = self.topics.get(name)
        return None if topic is None else (topic.topic_id, topic.partitions)

    def names(self):
        return self.topics.keys() if self.data is None else self.data.topics.keys()

    def topic_named(self, name: str) -> Topic | None:
        return self.topics.get(name) if self.data is None else self.data.topics.get(name)

    def topic_by_id(self, topic_id: bytes) -> Topic | None:
        return self.by_id.get(topic_id) if self.data is None else self.data.by_id.get(topic_id)

    def data_needs(self, req: m.MetadataRequest, version: int, now: int) -> list[str] | None:
        """With a data cluster: the names a Metadata must have read before it is answered ([] for
        every topic, when none was ever read); None when it can be answered now."""
        data = self.data
        if data is None:
            return None
        requested = req.topics
        if requested is None or (version == 0 and not requested):
            return [] if data.full_at is None else None
        names = [rt.name for rt in requested if rt.name is not None and validate_topic_name(rt.name) is None
                 and data.lookup(rt.name, now) is PENDING]
        return names or None

    # ---- APIs --------------------------------------------------------------------------------

    def find_coordinator(self, req: m.FindCoordinatorRequest, version: int) -> m.FindCoordinatorResponse:
        """Every group key is this node's (in a cluster: its shard's owner's, see :meth:`coordinator`). Error messages
        are shaped as Kafka's (KafkaApis.handleFindCoordinatorRequest, measured on 4.4): v1-3 carry
        ``Errors.message()`` ("NONE" on success, the error's default message otherwise); at v4+ a key's own
        answer carries "" (the schema's default) and only a whole-request error (an unknown key type) puts the
        default message on every key."""
        key_type = req.key_type if version >= 1 else 0
        if key_type == 0:  # "" too: Kafka hashes any key, and OffsetCommit/Fetch take group ""
            code, key_message = E.NONE, ""
        elif key_type == TRANSACTION_KEY:  # herd: no transactions (compatibility.md OP-4)
            code = E.INVALID_REQUEST
            key_message = "herd coordinates consumer groups only (key type 1, transactions, is not supported)"
        elif key_type == SHARE_KEY:  # as Kafka without a share coordinator: the key's own error
            code, key_message = E.INVALID_REQUEST, ""
        else:  # Kafka: CoordinatorType.forId throws InvalidRequestException for the request
            code, key_message = E.INVALID_REQUEST, E.ERRORS[E.INVALID_REQUEST].message

        def route(key: str):
            """-> (error code, (node id, host, port)) for one key: its shard's owner in a cluster,
            COORDINATOR_NOT_AVAILABLE (retriable) while that is not known."""
            if code != E.NONE:
                return code, (-1, "", -1)
            node = self.coordinator(key)
            return (E.NONE, node) if node is not None else (E.COORDINATOR_NOT_AVAILABLE, (-1, "", -1))

        resp = m.FindCoordinatorResponse()
        if version >= 4:
            for key in req.coordinator_keys:
                c, (nid, h, p) = route(key)
                resp.coordinators.append(m.FindCoordinatorResponseCoordinator(
                    key=key, node_id=nid, host=h, port=p, error_code=c, error_message=key_message))
            return resp
        c, (nid, h, p) = route(req.key)
        resp.error_code = c
        resp.error_message = key_message if key_type == TRANSACTION_KEY else kafka_error_message(c)
        resp.node_id, resp.host, resp.port = nid, h, p
        return resp

    def _topic_metadata(self, topic: Topic) -> m.MetadataResponseTopic:
        nid = self.node_id
        return m.MetadataResponseTopic(
            error_code=E.NONE, name=topic.name, topic_id=topic.topic_id, is_internal=False,
            partitions=[m.MetadataResponsePartition(
                error_code=E.NONE, partition_index=p, leader_id=nid, leader_epoch=0,
                replica_nodes=[nid], isr_nodes=[nid], offline_replicas=[])
                for p in range(topic.partitions)])

    def metadata(self, req: m.MetadataRequest, version: int, now: int = 0) -> tuple[list, m.MetadataResponse]:
        if self.data is not None:
            writes, resp = [], self._data_metadata(req, version, now)
        else:
            writes, resp = self._metadata(req, version)
        if req.include_topic_authorized_operations:  # no authorizer: everything a topic supports
            for t in resp.topics:
                if t.error_code == E.NONE:
                    t.topic_authorized_operations = TOPIC_AUTHORIZED_OPERATIONS
        if req.include_cluster_authorized_operations:
            resp.cluster_authorized_operations = CLUSTER_AUTHORIZED_OPERATIONS
        return writes, resp

    def _metadata(self, req: m.MetadataRequest, version: int) -> tuple[list, m.MetadataResponse]:
        writes: list = []
        resp = m.MetadataResponse(
            brokers=[m.MetadataResponseBroker(node_id=n, host=h, port=p) for n, h, p in self.brokers()],
            cluster_id=self.config.cluster_id, controller_id=self.node_id)
        requested = req.topics
        if requested is None or (version == 0 and not requested):
            resp.topics = [self._topic_metadata(t) for t in sorted(self.topics.values(), key=_name)]
            return writes, resp
        allow_create = self.config.auto_create_topics and (version < 4 or req.allow_auto_topic_creation)
        for rt in requested:
            name = rt.name
            if name is None and version >= 10:
                topic = self.by_id.get(rt.topic_id)
                if topic is None:
                    resp.topics.append(m.MetadataResponseTopic(
                        error_code=E.UNKNOWN_TOPIC_ID, name=None, topic_id=rt.topic_id))
                    continue
                resp.topics.append(self._topic_metadata(topic))
                continue
            topic = self.topics.get(name)
            if topic is None:
                problem = validate_topic_name(name or "")
                if problem is not None:
                    resp.topics.append(m.MetadataResponseTopic(error_code=E.INVALID_TOPIC_EXCEPTION, name=name))
                    continue
                if not allow_create:
                    resp.topics.append(m.MetadataResponseTopic(error_code=E.UNKNOWN_TOPIC_OR_PARTITION, name=name))
                    continue
                topic = self.create(name, self.config.default_partitions, writes)
            resp.topics.append(self._topic_metadata(topic))
        return writes, resp

    def _data_metadata(self, req: m.MetadataRequest, version: int, now: int) -> m.MetadataResponse:
        """Metadata from the data cluster's topics: a name it lacks is UNKNOWN_TOPIC_OR_PARTITION,
        one not read yet (the read failed or timed out) LEADER_NOT_AVAILABLE, both retriable."""
        data = self.data
        resp = m.MetadataResponse(
            brokers=[m.MetadataResponseBroker(node_id=n, host=h, port=p) for n, h, p in self.brokers()],
            cluster_id=self.config.cluster_id, controller_id=self.node_id)
        requested = req.topics
        if requested is None or (version == 0 and not requested):
            resp.topics = [self._topic_metadata(t) for t in sorted(data.topics.values(), key=_name)]
            return resp
        for rt in requested:
            name = rt.name
            if name is None and version >= 10:
                topic = data.by_id.get(rt.topic_id)
                resp.topics.append(self._topic_metadata(topic) if topic is not None else m.MetadataResponseTopic(
                    error_code=E.UNKNOWN_TOPIC_ID, name=None, topic_id=rt.topic_id))
                continue
            if validate_topic_name(name or "") is not None:
                resp.topics.append(m.MetadataResponseTopic(error_code=E.INVALID_TOPIC_EXCEPTION, name=name))
                continue
            found = data.lookup(name, now)
            if isinstance(found, Topic):
                resp.topics.append(self._topic_metadata(found))
            else:
                code = E.LEADER_NOT_AVAILABLE if found is PENDING else found
                resp.topics.append(m.MetadataResponseTopic(error_code=code, name=name))
        return resp

    def describe_cluster(self, req, version: int) -> m.DescribeClusterResponse:
        # herd is a broker endpoint (1); Kafka refuses a request meant for controllers (2) or an
        # unknown endpoint type, as its brokers do (KafkaApis.handleDescribeCluster)
        if req.endpoint_type == 2:
            return m.DescribeClusterResponse(
                error_code=E.MISMATCHED_ENDPOINT_TYPE, endpoint_type=req.endpoint_type,
                error_message="The request was sent to an endpoint of type BROKER, but we wanted an "
                              "endpoint of type CONTROLLER")
        if req.endpoint_type != 1:
            return m.DescribeClusterResponse(
                error_code=E.UNSUPPORTED_ENDPOINT_TYPE, endpoint_type=req.endpoint_type,
                error_message=f"Unsupported endpoint type {req.endpoint_type}")
        return m.DescribeClusterResponse(
            cluster_id=self.config.cluster_id, controller_id=self.node_id,
            brokers=[m.DescribeClusterResponseDescribeClusterBroker(broker_id=n, host=h, port=p)
                     for n, h, p in self.brokers()],
            cluster_authorized_operations=(CLUSTER_AUTHORIZED_OPERATIONS
                                           if req.include_cluster_authorized_operations else -2147483648))

    def create_topics(self, req: m.CreateTopicsRequest, version: int) -> tuple[list, m.CreateTopicsResponse]:
        writes: list = []
        resp = m.CreateTopicsResponse()
        seen: set[str] = set()
        for ct in req.topics:
            r = m.CreateTopicsResponseCreatableTopicResult(name=ct.name)
            resp.topics.append(r)
            problem = validate_topic_name(ct.name)
            parts = ct.num_partitions if ct.num_partitions != -1 else self.config.default_partitions
            if ct.name in seen:
                r.error_code, r.error_message = E.INVALID_REQUEST, "Duplicate topic name in request."
            elif problem:
                r.error_code, r.error_message = E.INVALID_TOPIC_EXCEPTION, problem
            elif self.topic_named(ct.name) is not None:
                r.error_code = E.TOPIC_ALREADY_EXISTS
                r.error_message = f"Topic '{ct.name}' already exists."
            elif self.data is not None:
                r.error_code = E.POLICY_VIOLATION
                r.error_message = ("herd takes its topics from the data cluster (data_bootstrap_server): "
                                   "create the topic there.")
            elif ct.assignments:
                r.error_code = E.INVALID_REQUEST
                r.error_message = "herd does not take manual replica assignments."
            elif not 0 < parts <= MAX_PARTITIONS:
                r.error_code = E.INVALID_PARTITIONS
                r.error_message = f"Number of partitions must be between 1 and {MAX_PARTITIONS}."
            elif ct.replication_factor not in (-1, 1):
                r.error_code = E.INVALID_REPLICATION_FACTOR
                r.error_message = (f"Unable to replicate the partition {ct.replication_factor} time(s): "
                                   "herd is a one-node cluster.")
            else:
                r.num_partitions, r.replication_factor = parts, 1
                if not req.validate_only:
                    r.topic_id = self.create(ct.name, parts, writes).topic_id
            seen.add(ct.name)
            if r.error_code != E.NONE:
                r.num_partitions = r.replication_factor = -1
        return writes, resp

    def list_offsets(self, req: m.ListOffsetsRequest, version: int) -> m.ListOffsetsResponse:
        resp = m.ListOffsetsResponse()
        for rt in req.topics:
            topic = self.topics.get(rt.name)
            out = m.ListOffsetsResponseListOffsetsTopicResponse(name=rt.name)
            resp.topics.append(out)
            for rp in rt.partitions:
                pr = m.ListOffsetsResponseListOffsetsPartitionResponse(partition_index=rp.partition_index)
                if topic is None or not 0 <= rp.partition_index < topic.partitions:
                    pr.error_code = E.UNKNOWN_TOPIC_OR_PARTITION
                elif version == 0:
                    pr.old_style_offsets = [0] if rp.timestamp < 0 else []
                elif rp.timestamp >= 0 or rp.timestamp in (MAX_TIMESTAMP, LATEST_TIERED_TIMESTAMP):
                    # a timestamp lookup in an empty log finds no record, nor does the max-timestamp
                    # one, and nothing is tiered: Kafka answers offset -1
                    pr.timestamp, pr.offset = -1, -1
                    if version >= 4:
                        pr.leader_epoch = -1
                else:
                    pr.timestamp, pr.offset = -1, 0
                    if version >= 4:
                        pr.leader_epoch = 0
                out.partitions.append(pr)
        return resp

    def list_offsets_answer(self, req: m.ListOffsetsRequest, version: int, answers: dict) -> m.ListOffsetsResponse:
        """ListOffsets from the data cluster's answers ``{(topic, partition): (error, timestamp,
        offset)}`` (see ``DataClusterReader.list_offsets``), shaped for the client's version: v0's
        ``old_style_offsets``, leader epoch as this node's Metadata gives it (0) where an offset was
        found. A partition without an answer gets LEADER_NOT_AVAILABLE (retriable)."""
        resp = m.ListOffsetsResponse()
        topics: dict[str, m.ListOffsetsResponseListOffsetsTopicResponse] = {}
        seen: set = set()
        for rt in req.topics:
            out = topics.get(rt.name)
            if out is None:
                out = topics[rt.name] = m.ListOffsetsResponseListOffsetsTopicResponse(name=rt.name)
                resp.topics.append(out)
            for rp in rt.partitions:
                if (rt.name, rp.partition_index) in seen:  # as Kafka: a partition asked twice is answered once
                    continue
                seen.add((rt.name, rp.partition_index))
                pr = m.ListOffsetsResponseListOffsetsPartitionResponse(partition_index=rp.partition_index)
                code, ts, off = answers.get((rt.name, rp.partition_index), (E.LEADER_NOT_AVAILABLE, -1, -1))
                pr.error_code = code
                if code == E.NONE:
                    if version == 0:
                        pr.old_style_offsets = [off] if off >= 0 else []
                    else:
                        pr.timestamp, pr.offset = ts, off
                        if version >= 4:
                            pr.leader_epoch = 0 if off >= 0 else -1
                elif version == 0:
                    pr.old_style_offsets = []
                out.partitions.append(pr)
        return resp

    def handle(self, api_key: int, version: int, request, token, now: int = 0) -> Result:
        """Answer one catalog request (Metadata, CreateTopics, FindCoordinator, ListOffsets,
        DescribeCluster; Fetch too, though the runtime holds a long-polling Fetch's answer itself).
        The writes (topics created) are CATALOG_SHARD's."""
        if api_key == METADATA:
            writes, resp = self.metadata(request, version, now)
        elif api_key == CREATE_TOPICS:
            writes, resp = self.create_topics(request, version)
        else:
            read = self._reads.get(api_key)
            if read is None:
                raise ValueError(f"api key {api_key} is not handled by the topic catalog")
            writes, resp = [], read(request, version)
        return Result(writes, [(token, resp)])

    def fetch(self, req: m.FetchRequest, version: int) -> m.FetchResponse:
        resp = m.FetchResponse(session_id=0)
        for ft in req.topics:
            topic = self.topic_by_id(ft.topic_id) if version >= 13 else self.topic_named(ft.topic)
            out = m.FetchResponseFetchableTopicResponse(topic=ft.topic, topic_id=ft.topic_id)
            resp.responses.append(out)
            for fp in ft.partitions:
                pd = m.FetchResponsePartitionData(partition_index=fp.partition, records=b"")
                if topic is None:
                    pd.error_code = E.UNKNOWN_TOPIC_ID if version >= 13 else E.UNKNOWN_TOPIC_OR_PARTITION
                elif not 0 <= fp.partition < topic.partitions:
                    pd.error_code = E.UNKNOWN_TOPIC_OR_PARTITION
                else:
                    hw = max(fp.fetch_offset, 0)
                    pd.high_watermark = pd.last_stable_offset = hw
                    pd.log_start_offset = 0
                out.partitions.append(pd)
        return resp


def _name(topic: Topic) -> str:
    return topic.name
