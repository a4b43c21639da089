"""PySpark helpers: Spark tasks as herd group members, and Spark progress as group offsets.

Batch jobs -- each Spark task is one member of a consumer group that shares a fixed set of work::

    from client import TopicPartition
    from client.spark import GroupJob

    job = GroupJob("herd:9092", "etl", {TopicPartition("events", p): n for p, n in enumerate(sizes)},
                   static_membership=True, config={"session.timeout.ms": 10000})
    stats = job.run(spark, process, num_tasks=4)   # process(tp, start, end) handles [start, end)
    job.wait(timeout_s=60)                         # committed offsets >= end offsets, or TimeoutError

The work is ``end_offsets``: per topic partition, the offset where it ends (a shard of N records is
offsets 0..N-1 and ends at N). Every task joins the group for those topics and loops: ``poll`` for
its assignment, take the next ``chunk_size`` records of an assigned partition from the committed
offset, call ``process(tp, start, end)`` (which must make its output durable before it returns),
commit ``end`` with the member's generation, repeat. A task whose partitions are all done keeps its
membership and waits (polling OffsetFetch) until the *whole group's* work is committed, so that the
partitions of a member that dies are reassigned to a live one; then it leaves. It returns one stats
dict (records, chunks, commit failures, generations seen, ...). Delivery is at least once: a chunk
processed but not committed when its member died (or lost its partitions in a rebalance, which
makes the commit fail with CommitFailedError) is processed again by the next owner.

The member is closed in ``finally`` even when Spark reuses the Python worker for the next task
(``spark.python.worker.reuse``, the default), so an idle worker never holds a member; an ``atexit``
guard closes members a worker still holds when it exits normally. A worker that Spark SIGKILLs
(task kill, executor loss) cannot run either: its member stays in the group until
``session.timeout.ms`` expires, and the group waits for it before it rebalances.

Static membership (``static_membership=True``): ``group.instance.id`` is ``instance_id_for(group,
spark partition id)``, so the retry of a failed task (or the same task of the next run) takes over
its predecessor's member and partitions at once, without a rebalance and without waiting for the
session timeout. The price: a task that is *not* retried (executor gone, job cancelled) leaves its
partitions unowned until the session timeout; and two live attempts of one task (speculation)
fence each other (FencedInstanceIdError) -- keep ``spark.speculation`` off. Static members do not
send LeaveGroup when closed (KIP-345); after the work is done, the task removes its instance id
from the group (``leave_on_finish``, an administrative LeaveGroup) so the group ends Empty.

Streaming -- a foreachBatch that commits a query's progress into a member-less group::

    committer = BatchProgressCommitter("herd:9092", "spark-ticks", process=write_batch)
    query = df.writeStream.foreachBatch(committer).option("checkpointLocation", ...).start()

After ``process(batch_df, batch_id)`` returns, the committer commits, per topic partition seen in
the batch, ``max(offset) + 1`` (Kafka's convention: the next offset to read) with generation -1, so
``kafka-consumer-groups``, kafka-python's ``KafkaAdminClient.list_group_offsets``, confluent's
``AdminClient.list_consumer_group_offsets`` and ``herd groups offsets`` show the query's progress.
Rows need ``topic`` / ``partition`` / ``offset`` columns: Spark's Kafka source has them. For other
sources, "progress" is the batch's end offset per source partition mapped to a topic partition:
``with_source_position`` maps a rate source's ``value`` v to partition ``v % P``, offset ``v // P``
(contiguous per partition), or pass ``offsets_fn(batch_df, batch_id) -> {tp: next_offset}``. A
partition absent from a batch keeps its previous offset, and offsets never move backwards unless
``allow_rewind=True``.

Resuming: ``starting_offsets_json`` turns the group's offsets into the ``startingOffsets`` option of
Spark's Kafka source (``{"topic": {"0": 42, "1": -2}}``, -2 = earliest); for a replayable source
without positions (rate, files), ``skip_committed(df, group_offsets(...))`` drops the rows before
the committed offsets, so a query restarted without its checkpoint resumes right after them.

Records in Kafka -- each Spark task is a ``KafkaGroupConsumer`` member reading the topic from the
data cluster, herd coordinating (``pip install herd[kafka]``)::

    job = KafkaGroupJob("herd:9092", "etl", "kafka:9092", ["events"])   # to the log ends at start
    stats = job.run(spark, process, num_tasks=4)   # process(records) per batch, then a commit

Driver-side inspection: ``describe_group``, ``group_offsets``, ``wait_for_offsets``, and
``offsets_dataframe`` / ``members_dataframe`` / ``history_dataframe`` (the last reads the flight
recorder at ``/groups/<group>/history`` of ``herd serve --metrics-port``).
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import socket
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import weakref
from dataclasses import dataclass, field

from client import errors as cerr
from client.assignors import Assignor, MemberSubscription
from client.config import parse_bootstrap, security_of
from client.consumer import GroupConsumer
from client.types import OffsetAndMetadata, TopicPartition
from protocol import errors as codes
from protocol import messages as m
from protocol.client_connection import AuthenticationFailed, Connection, ConnectionBroken, Ready, Response
from protocol.client_security import SecurityConfig, tls_failure
from protocol.consumer import decode_assignment, decode_subscription

log = logging.getLogger("herd.client.spark")

__all__ = [
    "GroupJob",
    "JobAssignor",
    "TaskInfo",
    "run_member",
    "instance_id_for",
    "wait_for_offsets",
    "group_offsets",
    "all_group_offsets",
    "describe_group",
    "ensure_topic",
    "partitions_for",
    "remove_static_members",
    "fetch_history",
    "offsets_dataframe",
    "members_dataframe",
    "history_dataframe",
    "BatchProgressCommitter",
    "with_source_position",
    "skip_committed",
    "starting_offsets_json",
    "list_offsets",
    "KafkaGroupJob",
    "run_kafka_member",
    "data_end_offsets",
]

# ---- members a worker still holds: closed at exit ------------------------------------------------

_LIVE: weakref.WeakSet = weakref.WeakSet()
_LIVE_LOCK = threading.Lock()


def _track(consumer: GroupConsumer) -> GroupConsumer:
    with _LIVE_LOCK:
        _LIVE.add(consumer)
    return consumer


def _close_live(timeout_s: float = 5.0) -> None:
    with _LIVE_LOCK:
        live = list(_LIVE)
        _LIVE.clear()
    for c in live:
        try:
            c.close(timeout_s)
        except Exception:
            pass


atexit.register(_close_live)


def _tp(value) -> TopicPartition:
    return value if isinstance(value, TopicPartition) else TopicPartition(*value)


def instance_id_for(group_id: str, spark_partition: int) -> str:
    """The ``group.instance.id`` of the member run by Spark partition ``spark_partition``."""
    return f"{group_id}-spark-{int(spark_partition)}"


# ---- a small blocking Kafka connection for the admin requests the consumer does not send ----------


class _Broker:
    """One blocking connection (TLS when configured; ApiVersions and SASL handshakes, then
    request/response). ``security``: the consumer config's TLS / SASL settings (``security_of``)."""

    def __init__(self, host: str, port: int, timeout_s: float, client_id: str = "herd-spark",
                 security: SecurityConfig | None = None):
        security = security or SecurityConfig()
        self.timeout_s = timeout_s
        self.target = (host, port)
        self.sock = socket.create_connection((host, port), timeout=timeout_s)
        self.conn = Connection(client_id=client_id, sasl=security.sasl_credentials())
        try:
            ctx = security.ssl_context()
            if ctx is not None:
                try:
                    self.sock = ctx.wrap_socket(self.sock, server_hostname=host)
                except ssl.SSLError as exc:
                    raise self._tls_error(exc) from None
            self.conn.initiate()
            self._exchange(lambda ev: isinstance(ev, Ready))
        except BaseException:
            self.close()
            raise

    def _tls_error(self, exc: ssl.SSLError) -> cerr.KafkaError:
        fatal, why = tls_failure(exc, *self.target)
        return cerr.SslAuthenticationError(why) if fatal else cerr.KafkaConnectionError(why)

    def _exchange(self, done):
        self.sock.sendall(self.conn.data_to_send())
        deadline = time.monotonic() + self.timeout_s
        while True:
            if time.monotonic() > deadline:
                raise cerr.KafkaTimeoutError("no response from the broker")
            try:
                data = self.sock.recv(1 << 16)
            except ssl.SSLError as exc:  # TLS 1.3: a refused client certificate shows up here
                raise self._tls_error(exc) from None
            if not data:
                raise cerr.KafkaConnectionError("the broker closed the connection")
            try:
                events = self.conn.receive(data)
            except AuthenticationFailed as exc:
                raise cerr.AuthenticationFailedError(str(exc)) from None
            except ConnectionBroken as exc:
                raise cerr.KafkaConnectionError(str(exc)) from None
            out = self.conn.data_to_send()  # an ApiVersions retry at a lower version
            if out:
                self.sock.sendall(out)
            for ev in events:
                if done(ev):
                    return ev

    def version(self, cls) -> int:
        lo, hi = self.conn.broker_versions.get(cls.API_KEY, (None, None))
        if hi is None:
            raise cerr.UnsupportedVersionError(f"the broker does not serve {cls.NAME}")
        return min(hi, cls.MAX_VERSION)

    def request(self, req, version: int | None = None):
        v = self.version(type(req)) if version is None else version
        corr = self.conn.send(req, v)
        ev = self._exchange(lambda e: isinstance(e, Response) and e.correlation_id == corr)
        if ev.error is not None:
            raise cerr.ProtocolMismatchError(f"undecodable {type(req).NAME} response: {ev.error}")
        return ev.message, v

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def _bootstrap_broker(bootstrap, timeout_s: float, config: dict | None = None) -> _Broker:
    security = security_of(config)
    last = None
    for host, port in parse_bootstrap(bootstrap, security.protocol):
        try:
            return _Broker(host, port, timeout_s, security=security)
        except cerr.AuthenticationFailedError:
            raise  # the next server would refuse the same credentials
        except (OSError, cerr.KafkaError) as exc:
            last = exc
    raise cerr.KafkaConnectionError(f"cannot reach any bootstrap server {bootstrap!r}: {last}")


def _coordinator(bootstrap, group_id: str, timeout_s: float, config: dict | None = None) -> _Broker:
    """A connection to ``group_id``'s coordinator (FindCoordinator, retried until ``timeout_s``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with _bootstrap_broker(bootstrap, timeout_s, config) as b:
            v = b.version(m.FindCoordinatorRequest)
            if v >= 4:
                resp, _ = b.request(m.FindCoordinatorRequest(key_type=0, coordinator_keys=[group_id]), v)
                c = resp.coordinators[0]
                err, host, port = c.error_code, c.host, c.port
            else:
                resp, _ = b.request(m.FindCoordinatorRequest(key=group_id, key_type=0), v)
                err, host, port = resp.error_code, resp.host, resp.port
        if err == codes.NONE:
            return _Broker(host, port, timeout_s, security=security_of(config))
        if time.monotonic() > deadline or not codes.is_retriable(err):
            raise cerr.KafkaError(f"FindCoordinator({group_id}): {codes.error_name(err)}", code=err)
        time.sleep(0.1)


def describe_group(bootstrap, group_id: str, timeout_s: float = 10.0, config: dict | None = None) -> dict:
    """DescribeGroups: ``{"group_id", "state", "protocol_type", "protocol", "members": [{"member_id",
    "group_instance_id", "client_id", "client_host", "topics", "assignment": [TopicPartition]}]}``.
    An unknown group is state "Dead" with no members (as Kafka answers). ``config``: a consumer
    config whose TLS / SASL settings the connections use (the helpers below take it too)."""
    with _coordinator(bootstrap, group_id, timeout_s, config) as b:
        resp, _ = b.request(m.DescribeGroupsRequest(groups=[group_id]))
    g = resp.groups[0]
    if g.error_code != codes.NONE:
        raise cerr.KafkaError(f"DescribeGroups({group_id}): {codes.error_name(g.error_code)}",
                              code=g.error_code)
    members = []
    for mm in g.members:
        topics, assignment = [], []
        try:
            if mm.member_metadata:
                topics = list(decode_subscription(mm.member_metadata)[1].topics)
            for t in decode_assignment(mm.member_assignment)[1].assigned_partitions:
                assignment += [TopicPartition(t.topic, p) for p in t.partitions]
        except Exception:  # not the consumer protocol: leave them empty
            pass
        members.append({"member_id": mm.member_id, "group_instance_id": mm.group_instance_id,
                        "client_id": mm.client_id, "client_host": mm.client_host, "topics": topics,
                        "assignment": sorted(assignment)})
    return {"group_id": g.group_id, "state": g.group_state, "protocol_type": g.protocol_type,
            "protocol": g.protocol_data, "members": members}


def remove_static_members(bootstrap, group_id: str, instance_ids, timeout_s: float = 10.0,
                          config: dict | None = None) -> dict:
    """Remove static members by ``group.instance.id`` (LeaveGroup v3+, as Kafka's
    ``removeMembersFromConsumerGroup``): instance id -> error name ("NONE" when removed)."""
    ids = list(instance_ids)
    with _coordinator(bootstrap, group_id, timeout_s, config) as b:
        if b.version(m.LeaveGroupRequest) < 3:
            raise cerr.UnsupportedVersionError("removing static members needs LeaveGroup v3+")
        resp, _ = b.request(m.LeaveGroupRequest(group_id=group_id, members=[
            m.LeaveGroupRequestMemberIdentity(member_id="", group_instance_id=i,
                                              reason="the Spark task finished the group's work")
            for i in ids]))
    if resp.error_code != codes.NONE:
        raise cerr.KafkaError(f"LeaveGroup({group_id}): {codes.error_name(resp.error_code)}",
                              code=resp.error_code)
    return {r.group_instance_id: codes.error_name(r.error_code) for r in resp.members}


def partitions_for(bootstrap, topic: str, timeout_s: float = 10.0,
                   config: dict | None = None) -> list[TopicPartition]:
    """The partitions of ``topic`` (Metadata; the topic is not auto-created)."""
    with _bootstrap_broker(bootstrap, timeout_s, config) as b:
        resp, _ = b.request(m.MetadataRequest(topics=[m.MetadataRequestTopic(name=topic)],
                                              allow_auto_topic_creation=False))
    for t in resp.topics:
        if t.name == topic:
            if t.error_code != codes.NONE:
                raise cerr.KafkaError(f"Metadata({topic}): {codes.error_name(t.error_code)}",
                                      code=t.error_code)
            return sorted(TopicPartition(topic, p.partition_index) for p in t.partitions)
    raise cerr.UnknownTopicOrPartitionError(f"no topic {topic!r}")


def _known_partitions(bootstrap, topic: str, timeout_s: float,
                      config: dict | None = None) -> list[TopicPartition] | None:
    """``partitions_for``, or None when herd has no such topic."""
    try:
        return partitions_for(bootstrap, topic, timeout_s, config)
    except cerr.KafkaError as exc:
        if exc.code != codes.UNKNOWN_TOPIC_OR_PARTITION:
            raise
        return None


def ensure_topic(bootstrap, topic: str, partitions: int, timeout_s: float = 10.0,
                 config: dict | None = None) -> list[TopicPartition]:
    """Create ``topic`` with ``partitions`` partitions unless it exists (CreateTopics); returns its
    partitions. An existing topic with another partition count raises ValueError."""
    with _bootstrap_broker(bootstrap, timeout_s, config) as b:
        resp, _ = b.request(m.CreateTopicsRequest(
            topics=[m.CreateTopicsRequestCreatableTopic(name=topic, num_partitions=partitions,
                                                        replication_factor=1)],
            timeout_ms=int(timeout_s * 1000)))
    err = resp.topics[0].error_code
    if err not in (codes.NONE, codes.TOPIC_ALREADY_EXISTS):
        raise cerr.KafkaError(f"CreateTopics({topic}): {codes.error_name(err)}", code=err)
    parts = partitions_for(bootstrap, topic, timeout_s, config)
    if len(parts) != partitions:
        raise ValueError(f"topic {topic!r} exists with {len(parts)} partitions, not {partitions}")
    return parts


# ---- offsets ---------------------------------------------------------------------------------------


def _offsets_reader(bootstrap, group_id: str, config: dict | None) -> GroupConsumer:
    cfg = {"enable.auto.commit": False, "client.id": "herd-spark-driver", **(config or {})}
    return _track(GroupConsumer(bootstrap, group_id, cfg))  # never subscribes: never joins


def group_offsets(bootstrap, group_id: str, partitions, timeout_s: float = 30.0,
                  config: dict | None = None) -> dict:
    """The committed offsets of ``partitions`` (an iterable of TopicPartition, or a topic name for
    every partition of it the group has committed, whether or not herd knows the topic or all its
    partitions): ``{tp: offset}`` for those with a commit."""
    if isinstance(partitions, str):
        return {tp: om.offset for tp, om in all_group_offsets(bootstrap, group_id, timeout_s, config).items()
                if tp.topic == partitions}
    parts = [_tp(p) for p in partitions]
    with _offsets_reader(bootstrap, group_id, config) as c:
        got = c.committed(parts, timeout_s=timeout_s)
    return {tp: om.offset for tp, om in got.items() if om is not None and om.offset >= 0}


def all_group_offsets(bootstrap, group_id: str, timeout_s: float = 30.0, config: dict | None = None) -> dict:
    """Every committed offset of ``group_id`` (OffsetFetch for all topics): ``{tp:
    OffsetAndMetadata}``; empty for a group with none (or none known)."""
    with _coordinator(bootstrap, group_id, timeout_s, config) as b:
        v = b.version(m.OffsetFetchRequest)
        if v < 2:
            raise cerr.UnsupportedVersionError("listing all of a group's offsets needs OffsetFetch v2+")
        if v >= 8:
            resp, _ = b.request(m.OffsetFetchRequest(groups=[m.OffsetFetchRequestGroup(group_id=group_id,
                                                                                       topics=None)]), v)
            code, topics = (resp.groups[0].error_code, resp.groups[0].topics) if resp.groups else (0, [])
        else:
            resp, _ = b.request(m.OffsetFetchRequest(group_id=group_id, topics=None), v)
            code, topics = resp.error_code, resp.topics
    if code == codes.GROUP_ID_NOT_FOUND:
        return {}
    if code != codes.NONE:
        raise cerr.error_for_code(code, f"OffsetFetch({group_id}): {codes.error_name(code)}")
    return {TopicPartition(t.name, p.partition_index): OffsetAndMetadata(p.committed_offset, p.metadata or "",
                                                                          p.committed_leader_epoch)
            for t in topics for p in t.partitions
            if p.error_code == codes.NONE and p.committed_offset >= 0}


def wait_for_offsets(bootstrap, group_id: str, targets: dict, timeout_s: float = 300.0,
                     interval_s: float = 0.2, config: dict | None = None, on_progress=None) -> dict:
    """Poll OffsetFetch until every ``targets`` partition's committed offset reaches its target
    (``{tp: end_offset}``); returns the committed offsets. ``on_progress(committed)`` is called after
    each fetch. Raises TimeoutError naming the partitions still short after ``timeout_s``."""
    targets = {_tp(tp): int(off) for tp, off in targets.items()}
    deadline = time.monotonic() + timeout_s
    committed: dict = {}
    with _offsets_reader(bootstrap, group_id, config) as c:
        while True:
            remaining = deadline - time.monotonic()
            try:
                got = c.committed(list(targets), timeout_s=max(0.5, min(10.0, remaining)))
                committed = {tp: (om.offset if om is not None else None) for tp, om in got.items()}
            except cerr.KafkaTimeoutError:
                pass
            if on_progress is not None:
                on_progress(dict(committed))
            short = {tp: (committed.get(tp), end) for tp, end in targets.items()
                     if (committed.get(tp) or 0) < end}
            if not short:
                return committed
            if time.monotonic() >= deadline:
                shown = ", ".join(f"{tp} at {have} of {end}" for tp, (have, end) in sorted(short.items())[:8])
                raise TimeoutError(f"group {group_id}: {len(short)} partition(s) not done after "
                                   f"{timeout_s:.0f}s: {shown}")
            time.sleep(interval_s)


# ---- batch jobs: Spark tasks as group members ------------------------------------------------------


@dataclass(frozen=True)
class TaskInfo:
    """Who is running: given to ``on_start``."""

    group_id: str
    spark_partition: int
    attempt: int
    pid: int
    client_id: str
    instance_id: str | None


class JobAssignor(Assignor):
    """The assignor of a ``GroupJob``'s members (protocol name ``herd-job``): it deals out only the
    job's partitions, balanced by the records left to do (largest first, each to the member with
    the fewest records so far). Kafka's range assignor works topic by topic over every partition of
    a topic: a job over partitions 0-3 of a 16-partition topic would put all of its work on the
    first member, and a job over several one-partition topics all of it on the first member too.

    ``committed`` (``{tp: offset}``, read at each assignment; ``run_member`` keeps it up to date)
    is where each partition stands: a resumed job, or the next run of an incremental one, is shared
    by what is left, not by the partitions' sizes."""

    name = "herd-job"

    def __init__(self, end_offsets: dict, committed: dict | None = None):
        self.end_offsets = {_tp(tp): max(int(n), 0) for tp, n in dict(end_offsets).items()}
        self.committed = committed if committed is not None else {}

    @property
    def work(self) -> dict:
        """Records left per partition of the job."""
        done = dict(self.committed)  # a snapshot: run_member updates it from its own thread
        return {tp: max(end - max(int(done.get(tp) or 0), 0), 0) for tp, end in self.end_offsets.items()}

    def assign(self, partitions_per_topic, subscriptions):
        members = sorted(subscriptions.values(), key=MemberSubscription.sort_key)
        out = {s.member_id: [] for s in members}
        load = {s.member_id: [0, 0] for s in members}  # records, partitions
        topics = {s.member_id: set(s.topics) for s in members}
        order = {s.member_id: i for i, s in enumerate(members)}
        work = [(n, tp) for tp, n in self.work.items() if tp.partition < partitions_per_topic.get(tp.topic, 0)]
        for n, tp in sorted(work, key=lambda w: (-w[0], w[1])):
            eligible = [mid for mid in out if tp.topic in topics[mid]]
            if not eligible:
                continue
            mid = min(eligible, key=lambda m: (load[m][0], load[m][1], order[m]))
            out[mid].append(tp)
            load[mid][0] += n
            load[mid][1] += 1
        return {mid: sorted(tps) for mid, tps in out.items()}


_REJOIN_ERRORS = (cerr.CommitFailedError, cerr.RebalanceInProgressError, cerr.IllegalGenerationError,
                  cerr.UnknownMemberIdError, cerr.KafkaTimeoutError, cerr.RetriableCommitFailedError)


@dataclass
class GroupJob:
    """A fixed set of work shared by a group: ``end_offsets`` maps each TopicPartition to the offset
    where its work ends. Picklable: ship it to executors (``task_fn``) or call ``run``."""

    bootstrap: str
    group_id: str
    end_offsets: dict
    static_membership: bool = False
    # consumer config for the members (Kafka names), TLS / SASL settings included: kept out of the
    # repr, which would show sasl.password
    config: dict = field(default_factory=dict, repr=False)
    chunk_size: int = 500  # records per process() call and per commit
    task_timeout_s: float = 600.0  # a task that sees no progress (no chunk committed by anyone) that long fails
    poll_timeout_s: float = 1.0  # how long an idle member waits in poll between checks
    leave_on_finish: bool = True  # static members remove themselves once the group's work is done
    # how long a task keeps trying to reach herd as it starts (herd restarting while tasks start or
    # are retried); the driver's check in run() does not wait
    connect_retry_s: float = 30.0

    def __post_init__(self):
        self.end_offsets = {_tp(tp): int(n) for tp, n in dict(self.end_offsets).items()}
        if not self.end_offsets:
            raise ValueError("a GroupJob needs at least one partition of work")
        if self.chunk_size <= 0:
            raise ValueError("chunk_size must be positive")

    @property
    def topics(self) -> list[str]:
        return sorted({tp.topic for tp in self.end_offsets})

    @property
    def total_records(self) -> int:
        return sum(self.end_offsets.values())

    def check_topics(self, timeout_s: float = 10.0) -> None:
        """Fail at once (ValueError) unless herd has every partition of the work: members are only
        assigned partitions that exist, so work on a missing one would wait out ``task_timeout_s``
        in every task. An unreachable bootstrap raises KafkaConnectionError here too."""
        problems = []
        for topic in self.topics:
            wanted = sorted(tp.partition for tp in self.end_offsets if tp.topic == topic)
            known = _known_partitions(self.bootstrap, topic, timeout_s, self.config)
            if known is None:
                problems.append(f"topic {topic!r} does not exist")
                continue
            have = {tp.partition for tp in known}
            lost = [p for p in wanted if p not in have]
            if lost:
                problems.append(f"topic {topic!r} has {len(have)} partition(s), the work covers partition(s) "
                                f"{', '.join(map(str, lost))}")
        if problems:
            raise ValueError(f"group {self.group_id}: {'; '.join(problems)}; create each topic with all its "
                             f"partitions first (ensure_topic(bootstrap, topic, partitions))")

    def task_fn(self, process, on_start=None):
        """A function for ``rdd.mapPartitionsWithIndex``: each Spark partition runs one member and
        yields its stats dict."""
        return _task_fn(run_member, self, process, on_start)

    def run(self, spark, process, num_tasks: int, on_start=None) -> list[dict]:
        """Run ``num_tasks`` Spark tasks as members until the work is done; their stats dicts.
        Checks the topics first (``check_topics``)."""
        self.check_topics()
        return _run_tasks(spark, self.task_fn(process, on_start), num_tasks,
                          f"herd group {self.group_id}: {num_tasks} members, {self.total_records} records")

    def wait(self, timeout_s: float = 300.0, **kwargs) -> dict:
        """Block until the group has committed every end offset (see ``wait_for_offsets``)."""
        kwargs.setdefault("config", self.config)
        return wait_for_offsets(self.bootstrap, self.group_id, self.end_offsets, timeout_s, **kwargs)


def _task_fn(member, job, process, on_start):
    """``run_task(index, iterator)`` for ``rdd.mapPartitionsWithIndex``: yields ``member(job,
    process, spark_partition, attempt, on_start)``, the Spark partition and attempt of the task
    (``index`` and 0 outside a Spark task)."""

    def run_task(index, _iterator):
        spark_partition, attempt = index, 0
        try:
            from pyspark import TaskContext

            ctx = TaskContext.get()
            if ctx is not None:
                spark_partition, attempt = ctx.partitionId(), ctx.attemptNumber()
        except ImportError:
            pass
        yield member(job, process, spark_partition, attempt, on_start)

    return run_task


def _run_tasks(spark, task_fn, num_tasks: int, description: str) -> list[dict]:
    """``num_tasks`` Spark tasks running ``task_fn``; what they yield."""
    sc = getattr(spark, "sparkContext", spark)
    sc.setJobDescription(description)
    rdd = sc.parallelize(range(num_tasks), num_tasks)
    return rdd.mapPartitionsWithIndex(task_fn).collect()


def _member_identity(job, cfg: dict, spark_partition: int, attempt: int) -> str | None:
    """Set a task's ``client.id`` (and ``group.instance.id`` for static membership) in ``cfg``;
    -> the instance id or None."""
    cfg["client.id"] = f"herd-spark-p{spark_partition}-a{attempt}"
    instance_id = instance_id_for(job.group_id, spark_partition) if job.static_membership else None
    if instance_id is not None:
        cfg["group.instance.id"] = instance_id
    return instance_id


class _Watchdog:
    """``task_timeout_s`` bounds a task that sees no progress: neither its own commits
    (``progressed``) nor the group's committed offsets moving (``group_done``). A job that just
    takes long is not stopped by it."""

    def __init__(self, started: float, timeout_s: float):
        self.timeout_s = timeout_s
        self.deadline = started + timeout_s
        self._group = -1  # records of the work the group has committed, as last fetched

    def expired(self) -> bool:
        return time.monotonic() > self.deadline

    def progressed(self) -> None:
        self.deadline = time.monotonic() + self.timeout_s

    def group_done(self, done: dict, targets: dict) -> bool:
        """Whether the group's committed offsets ``done`` reach every end offset of ``targets``;
        if not, whether they moved since the last look counts as progress."""
        if all(done[tp] >= end for tp, end in targets.items()):
            return True
        progress = sum(min(done[tp], end) for tp, end in targets.items())
        if progress > self._group:
            if self._group >= 0:
                self.progressed()
            self._group = progress
        return False


def _group_committed(consumer, targets: dict, errors) -> dict | None:
    """The group's committed offset of each partition of ``targets`` (0 where none); None when it
    could not be read (one of ``errors``)."""
    try:
        got = consumer.committed(list(targets), timeout_s=30.0)
    except errors:
        return None
    return {tp: (max(got[tp].offset, 0) if got.get(tp) is not None else 0) for tp in targets}


def _end_member(job, consumer, stats: dict, started: float, finished: bool, instance_id: str | None,
                leave: bool, config: dict) -> None:
    """A task's member is done: close it; once the group's work is finished a static member
    (when ``leave``) removes itself from the group (``stats["left"]``); the task's seconds."""
    try:
        consumer.close(10.0)
    finally:
        with _LIVE_LOCK:
            _LIVE.discard(consumer)
    if finished and instance_id is not None and leave:
        try:
            res = remove_static_members(job.bootstrap, job.group_id, [instance_id], config=config)
            stats["left"] = res.get(instance_id) == "NONE"
        except (OSError, cerr.KafkaError):
            pass
    elif finished:
        stats["left"] = True
    stats["seconds"] = round(time.monotonic() - started, 3)


def _check_topics_retrying(job: GroupJob) -> None:
    """``job.check_topics()``, retried while herd cannot be reached, for ``job.connect_retry_s``: a
    task started (or retried by Spark, within a second) while herd restarts waits for it, instead
    of failing with every retry and aborting the job. Missing topics fail at once."""
    deadline = time.monotonic() + job.connect_retry_s
    backoff = 0.1
    while True:
        try:
            return job.check_topics()
        except (cerr.KafkaConnectionError, OSError) as exc:
            if time.monotonic() + backoff > deadline:
                raise cerr.KafkaConnectionError(f"{exc} (retried for {job.connect_retry_s:g}s)") from exc
            time.sleep(backoff)
            backoff = min(backoff * 2, 1.0)


def _poll(consumer: GroupConsumer, timeout_s: float) -> frozenset:
    """``consumer.poll``, riding through herd being unreachable (a restart while the member joins):
    the client keeps reconnecting, and the task's ``task_timeout_s`` bounds the wait, not
    ``broker.unreachable.timeout.ms``."""
    try:
        return consumer.poll(timeout_s)
    except cerr.NoBrokersAvailableError as exc:
        log.info("%s; still waiting for herd", exc)
        return consumer.assignment()


def run_member(job: GroupJob, process, spark_partition: int = 0, attempt: int = 0, on_start=None) -> dict:
    """Be one member of ``job``'s group until the group's work is done: the body of a Spark task
    (usable without Spark too). ``process(tp, start, end)`` handles records [start, end) of ``tp``
    and must make its output durable before returning; ``end`` is committed after it."""
    started = time.monotonic()
    _check_topics_retrying(job)  # fail this task now, not after task_timeout_s (a down herd says so)
    # a member must never auto-create a topic of the work with the default partition count
    known: dict = {}  # committed offsets this task has seen: what the job's assignor balances
    cfg = {"enable.auto.commit": False, "allow.auto.create.topics": False,
           # the job's own assignor first; range lets a member of an older herd still join
           "partition.assignment.strategy": [JobAssignor(job.end_offsets, known), "range"], **job.config}
    instance_id = _member_identity(job, cfg, spark_partition, attempt)
    targets = job.end_offsets
    stats = {"spark_partition": spark_partition, "attempt": attempt, "pid": os.getpid(),
             "instance_id": instance_id, "member_ids": [], "generations": [], "records": 0,
             "chunks": 0, "commit_failures": 0, "partitions": [], "seconds": 0.0, "left": False}
    finished = False
    consumer = _track(GroupConsumer(job.bootstrap, job.group_id, cfg))
    try:
        try:  # where the work stands, before joining: this member may lead the first assignment
            known.update({tp: om.offset for tp, om in consumer.committed(list(targets), timeout_s=30.0).items()
                          if om is not None and om.offset >= 0})
        except cerr.KafkaTimeoutError:
            pass  # the assignor balances the partitions' sizes until this task learns more
        consumer.subscribe(job.topics)
        if on_start is not None:
            on_start(TaskInfo(job.group_id, spark_partition, attempt, os.getpid(), cfg["client.id"],
                              instance_id))
        watchdog = _Watchdog(started, job.task_timeout_s)
        positions: dict = {}
        seen_key = None
        worked: set = set()
        while True:
            if watchdog.expired():
                raise TimeoutError(f"group {job.group_id}: no progress for {job.task_timeout_s}s (no chunk "
                                   f"committed by this task or by the rest of the group)")
            assigned = _poll(consumer, 0.0)
            generation = consumer.generation()
            key = (generation, assigned)
            if key != seen_key:  # a new assignment: (re)read where each partition stands
                seen_key = key
                if generation >= 0 and generation not in stats["generations"]:
                    stats["generations"].append(generation)
                    mid = consumer.member_id()
                    if mid and mid not in stats["member_ids"]:
                        stats["member_ids"].append(mid)
                mine = [tp for tp in assigned if tp in targets]
                try:
                    got = consumer.committed(mine, timeout_s=30.0) if mine else {}
                except cerr.KafkaTimeoutError:
                    seen_key = None
                    continue
                positions = {tp: (om.offset if om is not None and om.offset >= 0 else 0)
                             for tp, om in got.items()}
                known.update(positions)
            todo = sorted(tp for tp, pos in positions.items() if pos < targets[tp] and tp in assigned)
            if todo:
                tp = todo[stats["chunks"] % len(todo)]  # round robin over the partitions left
                start = positions[tp]
                end = min(start + job.chunk_size, targets[tp])
                process(tp, start, end)
                stats["records"] += end - start
                stats["chunks"] += 1
                worked.add(tp)
                try:
                    consumer.commit({tp: (end, f"spark p{spark_partition} a{attempt}")}, timeout_s=30.0)
                    positions[tp] = known[tp] = end
                    watchdog.progressed()
                except _REJOIN_ERRORS:
                    # the partition may have moved: the next owner redoes this chunk (at least once)
                    stats["commit_failures"] += 1
                    seen_key = None
                    _poll(consumer, job.poll_timeout_s)
                continue
            # Nothing left here: done when the whole group's work is committed.
            done = _group_committed(consumer, targets, cerr.KafkaTimeoutError)
            if done is None:
                continue
            known.update(done)
            if watchdog.group_done(done, targets):
                finished = True
                break
            _poll(consumer, job.poll_timeout_s)
        stats["partitions"] = sorted(str(tp) for tp in worked)
        return stats
    except cerr.FencedInstanceIdError as exc:
        raise cerr.FencedInstanceIdError(
            f"group {job.group_id}: instance id {instance_id} is held by another live member: another "
            f"application running this job with the same group id, or a speculative copy of this task "
            f"(give each application its own group id; keep spark.speculation off) [{exc}]") from exc
    finally:
        _end_member(job, consumer, stats, started, finished, instance_id, job.leave_on_finish, job.config)


# ---- DataFrames of herd's view of a group ----------------------------------------------------------


def fetch_history(metrics_url: str, group_id: str, timeout_s: float = 10.0) -> list[dict]:
    """herd's rebalance flight recorder for ``group_id`` (``GET /groups/<g>/history`` on the
    ``--metrics-port`` endpoint), oldest first; [] for an unknown group."""
    base = metrics_url if "://" in metrics_url else f"http://{metrics_url}"
    url = f"{base.rstrip('/')}/groups/{urllib.parse.quote(group_id, safe='')}/history"
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as r:
            data = json.loads(r.read().decode())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return []
        raise
    return data if isinstance(data, list) else data.get("history", [])


def offsets_dataframe(spark, bootstrap, group_id: str, end_offsets: dict | None = None,
                      partitions=None, timeout_s: float = 30.0, config: dict | None = None):
    """A DataFrame (topic, partition, committed, end_offset, lag, metadata) of the group's offsets
    for ``end_offsets``' partitions (or ``partitions``); lag = end_offset - committed. With neither,
    every partition the group has committed an offset for (end_offset and lag null). A commit past
    the end counts as lag 0."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    ends = {_tp(tp): int(v) for tp, v in (end_offsets or {}).items()}
    parts = sorted(set(ends) | {_tp(p) for p in (partitions or [])})
    if parts:
        with _offsets_reader(bootstrap, group_id, config) as c:
            got = c.committed(parts, timeout_s=timeout_s)
    elif end_offsets is None and partitions is None:
        got = all_group_offsets(bootstrap, group_id, timeout_s, config)
        parts = sorted(got)
    else:
        got = {}
    rows = []
    for tp in parts:
        om = got.get(tp)
        committed = om.offset if om is not None and om.offset >= 0 else None
        end = ends.get(tp)
        lag = None if end is None else max(end - (committed or 0), 0)  # never negative
        rows.append((tp.topic, tp.partition, committed, end, lag, om.metadata if om is not None else None))
    schema = StructType([StructField("topic", StringType()), StructField("partition", LongType()),
                         StructField("committed", LongType()), StructField("end_offset", LongType()),
                         StructField("lag", LongType()), StructField("metadata", StringType())])
    return spark.createDataFrame(rows, schema)


def members_dataframe(spark, bootstrap, group_id: str, timeout_s: float = 10.0, config: dict | None = None):
    """A DataFrame (state, member_id, group_instance_id, client_id, client_host, assignment) from
    DescribeGroups; one row with null member columns when the group has no members."""
    from pyspark.sql.types import StringType, StructField, StructType

    d = describe_group(bootstrap, group_id, timeout_s, config)
    rows = [(d["state"], mm["member_id"], mm["group_instance_id"], mm["client_id"], mm["client_host"],
             ",".join(str(tp) for tp in mm["assignment"])) for mm in d["members"]]
    if not rows:
        rows = [(d["state"], None, None, None, None, None)]
    cols = ["state", "member_id", "group_instance_id", "client_id", "client_host", "assignment"]
    return spark.createDataFrame(rows, StructType([StructField(c, StringType()) for c in cols]))


_UUID_TAIL = re.compile(r"-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


def _history_rows(hist: list[dict]) -> list[tuple]:
    rows = []
    for e in hist:
        known = {x.get("member_id"): x for x in [*(e.get("awaited") or []), *(e.get("joined") or [])]}

        def who(mid, known=known):
            x = known.get(mid) or {}
            return x.get("group_instance_id") or x.get("client_id") or _UUID_TAIL.sub("", mid or "")

        trig = e.get("trigger") or {}
        trigger = (trig.get("group_instance_id") or trig.get("client_id")
                   or ", ".join(who(mid) for mid in trig.get("member_ids") or []) or None)
        removed = "; ".join(f"{who(r.get('member_id'))} {r.get('why')} after {r.get('after_ms')} ms"
                            for r in e.get("removed") or [])
        missing = ", ".join(f"{who(a.get('member_id'))}: {a.get('outcome') or 'did not rejoin'}"
                            for a in e.get("awaited") or [] if a.get("rejoined_after_ms") is None)
        joined = ", ".join(who(j.get("member_id")) for j in e.get("joined") or [])
        rows.append((e.get("previous_generation"), e.get("generation"), e.get("reason"), trigger,
                     e.get("outcome"), e.get("duration_ms"), e.get("members"), e.get("started_wall_ms"),
                     joined or None, missing or None, removed or None, e.get("detail")))
    return rows


def history_dataframe(spark, metrics_url: str, group_id: str, timeout_s: float = 10.0):
    """A DataFrame of the group's rebalances from herd's flight recorder, oldest first:
    from_generation, generation, reason, trigger (the instance id or client id of the member that
    caused it), outcome,
    duration_ms, members, started (timestamp), joined, not_rejoined (members waited for that did
    not rejoin, and why: session_expired, left, ...), removed (who, why, when), detail."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    schema = StructType([StructField("from_generation", LongType()), StructField("generation", LongType()),
                         StructField("reason", StringType()), StructField("trigger", StringType()),
                         StructField("outcome", StringType()), StructField("duration_ms", LongType()),
                         StructField("members", LongType()), StructField("started_ms", LongType()),
                         StructField("joined", StringType()), StructField("not_rejoined", StringType()),
                         StructField("removed", StringType()), StructField("detail", StringType())])
    df = spark.createDataFrame(_history_rows(fetch_history(metrics_url, group_id, timeout_s)), schema)
    return df.withColumn("started", F.timestamp_millis("started_ms")).drop("started_ms")


# ---- streaming: a query's progress as a member-less group's offsets ---------------------------------


def with_source_position(df, topic: str, partitions: int, value_col: str = "value"):
    """Give a source without Kafka positions (e.g. ``rate``/``rate-micro-batch``, whose ``value`` is
    0, 1, 2, ...) ``topic``/``partition``/``offset`` columns: value v is offset ``v // partitions``
    of partition ``v % partitions`` (so each partition's offsets are contiguous from 0)."""
    from pyspark.sql import functions as F

    v = F.col(value_col).cast("long")
    return (df.withColumn("topic", F.lit(topic))
              .withColumn("partition", F.pmod(v, F.lit(partitions)).cast("int"))
              .withColumn("offset", F.floor(v / F.lit(partitions)).cast("long")))


def skip_committed(df, committed: dict, topic_col: str = "topic", partition_col: str = "partition",
                   offset_col: str = "offset"):
    """Drop rows before the committed offsets (``{tp: next_offset}``): a replayable source restarted
    without its checkpoint resumes right after the group's progress."""
    from pyspark.sql import functions as F

    if not committed:
        return df
    start = F.lit(0).cast("long")
    for tp, off in sorted((_tp(k), int(v)) for k, v in committed.items()):
        cond = (F.col(topic_col) == F.lit(tp.topic)) & (F.col(partition_col) == F.lit(tp.partition))
        start = F.when(cond, F.lit(off).cast("long")).otherwise(start)
    return df.where(F.col(offset_col) >= start)


def list_offsets(bootstrap, partitions, spec: str | int = "latest", timeout_s: float = 30.0,
                 config: dict | None = None) -> dict:
    """herd's ListOffsets answer for ``partitions``: ``{TopicPartition: offset}`` (``spec``:
    "earliest", "latest" or a timestamp in ms; -1 where none). With ``--data-bootstrap-server``
    herd answers with the data cluster's offsets; a partition's error raises KafkaError."""
    ts = {"earliest": -2, "latest": -1}.get(spec, spec)
    if not isinstance(ts, int):
        raise ValueError(f"spec must be 'earliest', 'latest' or a timestamp, not {spec!r}")
    by_topic: dict = {}
    for tp in map(_tp, partitions):
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    if not by_topic:
        return {}
    req = m.ListOffsetsRequest(replica_id=-1, topics=[
        m.ListOffsetsRequestListOffsetsTopic(name=t, partitions=[
            m.ListOffsetsRequestListOffsetsPartition(partition_index=p, timestamp=ts) for p in sorted(ps)])
        for t, ps in sorted(by_topic.items())], timeout_ms=int(timeout_s * 1000))
    with _bootstrap_broker(bootstrap, timeout_s, config) as b:
        resp, _ = b.request(req, min(b.version(m.ListOffsetsRequest), 7))
    out = {}
    for t in resp.topics:
        for p in t.partitions:
            if p.error_code != codes.NONE:
                raise cerr.KafkaError(f"ListOffsets({t.name}-{p.partition_index}): {codes.error_name(p.error_code)}",
                                      code=p.error_code)
            out[TopicPartition(t.name, p.partition_index)] = p.offset
    return out


def starting_offsets_json(bootstrap, group_id: str, topics, default: str | int = "earliest",
                          timeout_s: float = 30.0, config: dict | None = None, resolve: bool = False) -> str:
    """The ``startingOffsets`` option of Spark's Kafka source from the group's committed offsets
    (OffsetFetch): ``{"topic": {"0": 42, "1": -2}}`` over every committed partition and every
    partition herd's topic catalog lists; partitions without a commit get ``default`` ("earliest"
    = -2, "latest" = -1, or an offset). ``resolve=True`` asks herd's ListOffsets for those instead
    (herd with a data cluster answers with its offsets), so the query starts at offsets fixed now."""
    if isinstance(topics, str):
        topics = [topics]
    fallback = {"earliest": -2, "latest": -1}.get(default, default)
    if not isinstance(fallback, int):
        raise ValueError(f"default must be 'earliest', 'latest' or an offset, not {default!r}")
    committed = {tp: om.offset for tp, om in all_group_offsets(bootstrap, group_id, timeout_s, config).items()
                 if tp.topic in topics}
    parts = set(committed)  # every committed partition, even of a topic herd does not know (yet)
    for t in topics:
        parts.update(_known_partitions(bootstrap, t, timeout_s, config) or [])
    resolved = {}
    if resolve and isinstance(default, str):
        resolved = {tp: off for tp, off in list_offsets(bootstrap, [tp for tp in parts if tp not in committed],
                                                        default, timeout_s, config).items() if off >= 0}
    out: dict = {t: {} for t in topics}
    for tp in sorted(parts):
        out.setdefault(tp.topic, {})[str(tp.partition)] = committed.get(tp, resolved.get(tp, fallback))
    return json.dumps(out, sort_keys=True)


class BatchProgressCommitter:
    """A ``foreachBatch`` function that commits each micro-batch's progress into a herd group (no
    members; generation -1 commits), after running ``process(batch_df, batch_id)``.

    Progress is, per topic partition present in the batch, ``max(offset) + 1`` from the batch's
    ``topic_col``/``partition_col``/``offset_col`` columns (``topic`` fixes the topic when the rows
    have none), or whatever ``offsets_fn(batch_df, batch_id)`` returns. Commits never move an offset
    backwards unless ``allow_rewind``. The commit metadata is ``metadata.format(batch_id=...)``.
    The offsets are computed with one aggregation over the batch after ``process``: Spark's
    micro-batch sources replay a batch identically, so it sees the rows ``process`` saw; pass
    ``persist=True`` to cache the batch instead of reading it twice.
    ``committed`` holds the offsets known to be committed; ``batches`` the batches committed.
    Call ``close()`` (or use it as a context manager) when the query is stopped."""

    def __init__(self, bootstrap, group_id: str, process=None, *, topic: str | None = None,
                 topic_col: str = "topic", partition_col: str = "partition", offset_col: str = "offset",
                 offsets_fn=None, allow_rewind: bool = False, persist: bool = False,
                 metadata: str = "spark batch {batch_id}", config: dict | None = None,
                 timeout_s: float = 60.0):
        self.bootstrap, self.group_id, self.process = bootstrap, group_id, process
        self.topic, self.topic_col, self.partition_col, self.offset_col = (
            topic, topic_col, partition_col, offset_col)
        self.offsets_fn, self.allow_rewind, self.persist = offsets_fn, allow_rewind, persist
        self.metadata, self.config, self.timeout_s = metadata, dict(config or {}), timeout_s
        self.committed: dict = {}
        self.batches: list[int] = []
        self._consumer: GroupConsumer | None = None
        self._lock = threading.Lock()

    def _client(self) -> GroupConsumer:
        if self._consumer is None:
            self._consumer = _offsets_reader(self.bootstrap, self.group_id,
                                             {"client.id": "herd-spark-streaming", **self.config})
        return self._consumer

    def batch_offsets(self, batch_df, batch_id: int) -> dict:
        """``{tp: next_offset}`` for one batch (see the class docstring)."""
        if self.offsets_fn is not None:
            return {_tp(tp): int(v) for tp, v in self.offsets_fn(batch_df, batch_id).items()}
        from pyspark.sql import functions as F

        keys = [self.partition_col] if self.topic is not None else [self.topic_col, self.partition_col]
        rows = batch_df.groupBy(*keys).agg(F.max(self.offset_col).alias("_max")).collect()
        out = {}
        for r in rows:
            if r["_max"] is None:
                continue
            t = self.topic if self.topic is not None else r[self.topic_col]
            out[TopicPartition(t, int(r[self.partition_col]))] = int(r["_max"]) + 1
        return out

    def __call__(self, batch_df, batch_id: int) -> None:
        with self._lock:
            cached = False
            if self.persist:
                batch_df = batch_df.persist()
                cached = True
            try:
                if self.process is not None:
                    self.process(batch_df, batch_id)
                offsets = self.batch_offsets(batch_df, batch_id)
            finally:
                if cached:
                    batch_df.unpersist()
            self.commit(offsets, batch_id)

    def commit(self, offsets: dict, batch_id: int | None = None) -> dict:
        """Commit ``{tp: next_offset}`` (skipping rewinds unless allowed); returns what was sent."""
        c = self._client()
        offsets = {_tp(tp): int(v) for tp, v in offsets.items()}
        if not self.allow_rewind:
            unknown = [tp for tp in offsets if tp not in self.committed]
            if unknown:
                got = c.committed(unknown, timeout_s=self.timeout_s)
                for tp, om in got.items():
                    if om is not None and om.offset >= 0:
                        self.committed[tp] = om.offset
            offsets = {tp: v for tp, v in offsets.items() if v > self.committed.get(tp, -1)}
        if offsets:
            meta = self.metadata.format(batch_id=batch_id)
            try:
                c.commit({tp: (v, meta) for tp, v in offsets.items()}, timeout_s=self.timeout_s)
            except cerr.CommitFailedError as exc:
                # the committer never joins: Kafka refuses a member-less commit into a group with members
                raise cerr.CommitFailedError(
                    f"group {self.group_id} has active members (consumers use this group id): a query's "
                    f"progress needs a group of its own [{exc}]") from exc
            self.committed.update(offsets)
        if batch_id is not None:
            self.batches.append(batch_id)
        return offsets

    def close(self) -> None:
        """Close the connection to herd. ``StreamingQuery.stop()`` can return while the Python side
        of a foreachBatch call is still running: this waits for that batch's commit first."""
        with self._lock:
            c, self._consumer = self._consumer, None
        if c is not None:
            c.close(10.0)
            with _LIVE_LOCK:
                _LIVE.discard(c)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---- Kafka data: Spark tasks as KafkaGroupConsumer members -----------------------------------------

def data_end_offsets(data_bootstrap, topics, timeout_s: float = 30.0, data_config: dict | None = None) -> dict:
    """``{TopicPartition: log-end offset}`` of every partition of ``topics`` in the data cluster
    (librdkafka; ``data_config``: librdkafka settings, e.g. TLS / SASL)."""
    from client.kafka_consumer import _import_kafka

    ck = _import_kafka()
    if isinstance(topics, str):
        topics = [topics]
    c = ck.Consumer({"bootstrap.servers": data_bootstrap, "group.id": "herd-spark-ends",
                     "enable.auto.commit": False, **(data_config or {})})
    try:
        out = {}
        for topic in topics:
            md = c.list_topics(topic, timeout=timeout_s).topics.get(topic)
            if md is None or md.error is not None or not md.partitions:
                raise ValueError(f"topic {topic!r} is not in the data cluster {data_bootstrap}"
                                 + (f" ({md.error})" if md is not None and md.error is not None else ""))
            for p in sorted(md.partitions):
                _low, high = c.get_watermark_offsets(ck.TopicPartition(topic, p), timeout=timeout_s)
                out[TopicPartition(topic, p)] = high
        return out
    finally:
        c.close()


@dataclass
class KafkaGroupJob:
    """A batch job over records in Kafka: its Spark tasks are ``KafkaGroupConsumer`` members of
    ``group_id`` in herd (``bootstrap``), reading ``topics`` from the data cluster
    (``data_bootstrap``) up to ``end_offsets`` (default: the log ends when the job starts, read by
    ``resolve``)::

        job = KafkaGroupJob("herd:9092", "etl", "kafka:9092", ["events"])
        stats = job.run(spark, process, num_tasks=4)   # process(records): list[Record]
        job.wait()                                      # every end offset committed in herd

    Each task loops: ``poll`` (up to ``max_poll_records`` records of its assigned partitions, from
    the group's committed offsets, else the earliest), ``process(records)`` -- which must make its
    output durable before it returns -- then a synchronous commit of the positions after those
    records. A partition whose position reaches its end offset is paused; a task whose partitions
    are all done stays in the group (so that a dead member's partitions come to it) until the
    whole group's work is committed, then leaves. A task killed between ``process`` and its commit
    leaves that batch to the next owner of the partitions: delivery is at least once, and the
    duplicates are the batches processed but not committed (or whose commit failed in a
    rebalance). Records past an end offset are never passed to ``process``."""

    bootstrap: str
    group_id: str
    data_bootstrap: str
    topics: list
    end_offsets: dict | None = None
    config: dict = field(default_factory=dict, repr=False)  # KafkaGroupConsumer settings (data.* too)
    max_poll_records: int = 500
    poll_timeout_s: float = 0.5
    task_timeout_s: float = 600.0  # a task that sees no progress (its own or the group's) that long fails
    static_membership: bool = False

    def __post_init__(self):
        if isinstance(self.topics, str):
            self.topics = [self.topics]
        self.topics = sorted(set(self.topics))
        if self.end_offsets is not None:
            self.end_offsets = {_tp(tp): int(n) for tp, n in dict(self.end_offsets).items()}

    def _data_config(self) -> dict:
        out = {}
        for k, v in self.config.items():
            name = k.replace("_", ".")
            if name.startswith("data.") and name != "data.command.config":
                out[name[5:]] = v
        return out

    def resolve(self, timeout_s: float = 30.0) -> dict:
        """The end offsets: given, or the data cluster's log ends now (then fixed for the job)."""
        if self.end_offsets is None:
            self.end_offsets = data_end_offsets(self.data_bootstrap, self.topics, timeout_s, self._data_config())
        return self.end_offsets

    @property
    def total_records(self) -> int:
        return sum(self.resolve().values())

    def _herd_config(self) -> dict:
        """The settings for herd itself (not the data cluster's ``data.*``)."""
        return {k: v for k, v in self.config.items() if not k.replace("_", ".").startswith("data.")}

    def task_fn(self, process, on_start=None):
        self.resolve()
        return _task_fn(run_kafka_member, self, process, on_start)

    def run(self, spark, process, num_tasks: int, on_start=None) -> list[dict]:
        """Run ``num_tasks`` Spark tasks as members until the work is done; their stats dicts."""
        self.resolve()
        return _run_tasks(spark, self.task_fn(process, on_start), num_tasks,
                          f"herd group {self.group_id}: {num_tasks} members reading {','.join(self.topics)} from Kafka")

    def wait(self, timeout_s: float = 300.0, **kwargs) -> dict:
        """Block until the group has committed every end offset (see ``wait_for_offsets``)."""
        kwargs.setdefault("config", self._herd_config())
        return wait_for_offsets(self.bootstrap, self.group_id, self.resolve(), timeout_s, **kwargs)


def run_kafka_member(job: KafkaGroupJob, process, spark_partition: int = 0, attempt: int = 0,
                     on_start=None) -> dict:
    """Be one ``KafkaGroupConsumer`` member of ``job``'s group until the group's work is done (the
    body of a Spark task; usable without Spark). ``process(records)`` gets each batch."""
    from client.kafka_consumer import KafkaGroupConsumer

    started = time.monotonic()
    targets = job.resolve()
    cfg = {"enable.auto.commit": False, "auto.offset.reset": "earliest", "allow.auto.create.topics": False,
           "max.poll.records": job.max_poll_records, "partition.assignment.strategy": ["range"], **job.config}
    instance_id = _member_identity(job, cfg, spark_partition, attempt)
    stats = {"spark_partition": spark_partition, "attempt": attempt, "pid": os.getpid(), "instance_id": instance_id,
             "records": 0, "batches": 0, "commit_failures": 0, "generations": [], "partitions": [],
             "seconds": 0.0, "left": False}
    consumer = KafkaGroupConsumer(job.bootstrap, job.group_id, job.data_bootstrap, cfg)
    _track(consumer)
    finished = False
    worked: set = set()
    try:
        consumer.subscribe(job.topics)
        if on_start is not None:
            on_start(TaskInfo(job.group_id, spark_partition, attempt, os.getpid(), cfg["client.id"], instance_id))
        watchdog = _Watchdog(started, job.task_timeout_s)
        committed_here: dict = {}
        while True:
            if watchdog.expired():
                raise TimeoutError(f"group {job.group_id}: no progress for {job.task_timeout_s}s")
            try:
                records = consumer.poll(job.poll_timeout_s)
            except cerr.NoBrokersAvailableError as exc:
                log.info("%s; still waiting for herd", exc)
                records = []
            generation = consumer.generation()
            if generation >= 0 and generation not in stats["generations"]:
                stats["generations"].append(generation)
            assigned = consumer.assignment()
            positions = consumer.positions()
            if records:
                over = {tp for tp, pos in positions.items() if pos > targets.get(tp, 0)}
                if over:  # the end of the work: records past an end offset are not the job's
                    records = [r for r in records if r.offset < targets.get(TopicPartition(r.topic, r.partition), 0)]
                if records:
                    process(records)
                    stats["records"] += len(records)
                    stats["batches"] += 1
                changed = {tp: min(pos, targets.get(tp, 0)) for tp, pos in positions.items()
                           if tp in assigned and committed_here.get(tp) != min(pos, targets.get(tp, 0))}
                if changed:
                    try:
                        meta = f"spark p{spark_partition} a{attempt}"
                        consumer.commit({tp: (off, meta) for tp, off in changed.items()}, timeout_s=30.0)
                        committed_here.update(changed)
                        worked.update(changed)
                        watchdog.progressed()
                    except _REJOIN_ERRORS:
                        stats["commit_failures"] += 1  # the partitions moved: their next owner redoes the batch
                        committed_here.clear()
            done_here = [tp for tp in assigned if positions.get(tp) is not None and positions[tp] >= targets.get(tp, 0)]
            to_pause = [tp for tp in done_here if tp not in consumer.paused()]
            if to_pause:
                consumer.pause(to_pause)
            if records or len(done_here) < len(assigned):
                continue
            # Nothing left here: done when the whole group's work is committed.
            done = _group_committed(consumer, targets, cerr.KafkaError)
            if done is None:
                continue
            if watchdog.group_done(done, targets):
                finished = True
                break
        stats["partitions"] = sorted(str(tp) for tp in worked)
        return stats
    finally:
        _end_member(job, consumer, stats, started, finished, instance_id, True, job._herd_config())
