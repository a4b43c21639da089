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

In a cluster (``cluster`` set to a routing view, :class:`coordinator.cluster.node.Routing`):
Metadata and DescribeCluster list every live node (``cluster.brokers()``), FindCoordinator answers
the node that owns the group's shard (``cluster.coordinator(shard)``; None, an owner not known or
a view that may be stale: COORDINATOR_NOT_AVAILABLE, retriable); the topic records are kept in the
database by the runtime (``Runtime.topic_store``), not in shard 0.
"""
from __future__ import annotations

import re
import struct
import uuid
from dataclasses import dataclass

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


class Catalog:
    def __init__(self, config, node_id: int = 0):
        self.config = config
        self.node_id = node_id
        self.host = config.advertised_host or config.host
        self.port = config.advertised_port or config.port
        self.topics: dict[str, Topic] = {}
        self.by_id: dict[bytes, Topic] = {}
        self.cluster = None  # a routing view in a cluster (see the module docstring); None: this node alone
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
        me = (self.node_id, self.host, self.port)
        if self.cluster is None:
            return [me]
        nodes = [n for n in self.cluster.brokers() if n[0] != self.node_id]
        return sorted([me, *nodes])

    def coordinator(self, key: str) -> tuple[int, str, int] | None:
        """The node that coordinates group ``key`` (None: not known now, retriable)."""
        if self.cluster is None:
            return self.node_id, self.host, self.port
        return self.cluster.coordinator(shard_for(key, self.config.offsets_partitions))

    # ---- the catalog as consumer groups see it (coordinator.consumer.Topics) ------------------

    def get(self, name: str) -> tuple[bytes, int] | None:
        topic = self.topics.get(name)
        return None if topic is None else (topic.topic_id, topic.partitions)

    def names(self):
        return self.topics.keys()

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

    def metadata(self, req: m.MetadataRequest, version: int) -> tuple[list, m.MetadataResponse]:
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
            elif ct.name in self.topics:
                r.error_code = E.TOPIC_ALREADY_EXISTS
                r.error_message = f"Topic '{ct.name}' already exists."
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

    def handle(self, api_key: int, version: int, request, token) -> Result:
        """Answer one catalog request (Metadata, CreateTopics, FindCoordinator, ListOffsets,
        DescribeCluster; Fetch too, though the runtime holds a long-polling Fetch's answer itself).
        The writes (topics created) are CATALOG_SHARD's."""
        if api_key == METADATA:
            writes, resp = self.metadata(request, version)
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
            topic = self.by_id.get(ft.topic_id) if version >= 13 else self.topics.get(ft.topic)
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
