"""A real Kafka 4.x broker as herd's data cluster (``--data-bootstrap-server``): the broker is the
catalog and the log. herd's Metadata gives the broker's partition counts and topic ids (herd the one
broker listed), never creates a topic; ListOffsets gives the broker's offsets for every spec at
every version; partitions added on the broker (CreatePartitions) reach a classic group and a
consumer group (KIP-848) through herd; Kafka's kafka-consumer-groups --describe against herd prints
the broker's log ends and the lag against herd's commits."""
from __future__ import annotations

import time
import uuid

import pytest

from protocol import errors as E
from protocol import messages as m
from tests.cluster.conftest import pg, pg_server  # noqa: F401 - fixtures: a PostgreSQL for the cluster test
from tools.daemon import Daemon
from tools.rawclient import RawClient

pytestmark = [pytest.mark.reference, pytest.mark.integration]

REFRESH_MS = 500


def token() -> str:
    return uuid.uuid4().hex[:8]


@pytest.fixture(scope="module")
def herd_data(kafka_broker, tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("herd-data") / "data", "--data-bootstrap-server", kafka_broker.bootstrap,
                "--data-metadata-refresh-interval-ms", REFRESH_MS, "--lag-refresh-interval-ms", REFRESH_MS,
                initial_rebalance_delay_ms=0) as d:
        yield d


def create_topic(broker, name: str, partitions: int) -> None:
    with RawClient(broker.address) as c:
        r = c.call(m.CreateTopicsRequest(topics=[m.CreateTopicsRequestCreatableTopic(
            name=name, num_partitions=partitions, replication_factor=1)], timeout_ms=30000), 7)
    assert r.topics[0].error_code == E.NONE, r.topics[0].error_message
    broker_has(broker, name, partitions)


def broker_has(broker, name: str, partitions: int) -> None:
    """Wait for the broker's own Metadata to show the topic with every partition led."""
    def led():
        t = metadata(broker.address, [name], auto_create=False).topics[0]
        return t.error_code == E.NONE and len(t.partitions) == partitions and all(
            p.leader_id >= 0 for p in t.partitions)
    until(f"the broker to show {name} with {partitions} partitions", led)


def add_partitions(broker, name: str, count: int) -> None:
    from confluent_kafka.admin import AdminClient, NewPartitions

    admin = AdminClient({"bootstrap.servers": broker.bootstrap})
    admin.create_partitions([NewPartitions(name, count)])[name].result(30)
    broker_has(broker, name, count)


def metadata(address, names, version=12, auto_create=None):
    """Metadata naming ``names``: allowing auto-creation by default for herd (which must never
    create), never for the broker (which would)."""
    with RawClient(address) as c:
        req = m.MetadataRequest(topics=[m.MetadataRequestTopic(name=n) for n in names],
                                allow_auto_topic_creation=True if auto_create is None else auto_create)
        return c.call(req, version)


def catalog_of(resp) -> dict:
    return {t.name: (t.error_code, t.topic_id, len(t.partitions)) for t in resp.topics}


def until(what, pred, timeout=30.0, every=0.1):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(every)


def produce(bootstrap: str, topic: str, per_partition: dict[int, int], base_ts: int) -> None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for part, n in per_partition.items():
        for i in range(n):
            p.produce(topic, value=b"v%d" % i, key=b"k%d" % i, partition=part, timestamp=base_ts + 1000 * i)
    assert p.flush(30) == 0


def test_metadata_is_the_data_clusters_catalog(kafka_broker, herd_data):
    t = token()
    a, b, missing = f"cat-a-{t}", f"cat-b-{t}", f"cat-missing-{t}"
    create_topic(kafka_broker, a, 3)
    create_topic(kafka_broker, b, 1)
    broker = catalog_of(metadata(kafka_broker.address, [a, b], auto_create=False))
    assert broker[a][0] == broker[b][0] == E.NONE

    # first use: herd reads the names it never read before answering
    herd = metadata(herd_data.address, [a, b, missing])
    assert catalog_of(herd) == {**broker, missing: (E.UNKNOWN_TOPIC_OR_PARTITION, bytes(16), 0)}
    assert [(x.node_id, x.port) for x in herd.brokers] == [(0, herd_data.port)]
    for topic in herd.topics:
        for p in topic.partitions:
            assert (p.leader_id, p.replica_nodes, p.isr_nodes) == (0, [0], [0])
    # never auto-created, neither in herd nor on the broker
    assert catalog_of(metadata(kafka_broker.address, [missing], auto_create=False)) == {
        missing: (E.UNKNOWN_TOPIC_OR_PARTITION, bytes(16), 0)}
    # every version a client uses: the counts; ids from v10
    for version in (1, 4, 9, 10, 12):
        got = catalog_of(metadata(herd_data.address, [a], version))
        assert got[a][0] == E.NONE and got[a][2] == 3
        if version >= 10:
            assert got[a][1] == broker[a][1]
    # by topic id (v12), and every topic (the broker's, herd's own internal topics aside)
    with RawClient(herd_data.address) as c:
        by_id = c.call(m.MetadataRequest(topics=[m.MetadataRequestTopic(name=None, topic_id=broker[b][1])]), 12)
        assert [(x.name, len(x.partitions)) for x in by_id.topics] == [(b, 1)]
        everything = until("the refresh to list both topics", lambda: (lambda r: r if {a, b} <= {
            x.name for x in r.topics} else None)(c.call(m.MetadataRequest(topics=None), 12)))
        assert {x.name: (x.topic_id, len(x.partitions)) for x in everything.topics if x.name in (a, b)} == {
            n: (broker[n][1], broker[n][2]) for n in (a, b)}
        # CreateTopics: the data cluster is the catalog
        r = c.call(m.CreateTopicsRequest(topics=[m.CreateTopicsRequestCreatableTopic(
            name=missing, num_partitions=1, replication_factor=1)], timeout_ms=5000), 5)
        assert r.topics[0].error_code == E.POLICY_VIOLATION
        r = c.call(m.CreateTopicsRequest(topics=[m.CreateTopicsRequestCreatableTopic(
            name=a, num_partitions=1, replication_factor=1)], timeout_ms=5000), 5)
        assert r.topics[0].error_code == E.TOPIC_ALREADY_EXISTS

    # a topic created on the broker after herd found it missing: known within the recheck
    create_topic(kafka_broker, missing, 2)
    until("herd to see the new topic", lambda: catalog_of(metadata(herd_data.address, [missing]))[missing][0] == E.NONE)
    assert catalog_of(metadata(herd_data.address, [missing])) == catalog_of(
        metadata(kafka_broker.address, [missing], auto_create=False))


SPECS = (-2, -1, -3)  # earliest, latest, max timestamp


def list_offsets(address, topic, parts, timestamps, version, isolation=0):
    with RawClient(address) as c:
        req = m.ListOffsetsRequest(replica_id=-1, isolation_level=isolation, topics=[
            m.ListOffsetsRequestListOffsetsTopic(name=topic, partitions=[
                m.ListOffsetsRequestListOffsetsPartition(partition_index=p, current_leader_epoch=-1, timestamp=ts,
                                                         max_num_offsets=1)
                for p in parts for ts in timestamps])])
        resp = c.call(req, version)
    out = []
    for rt in resp.topics:
        for rp in rt.partitions:
            if version == 0:
                out.append((rp.partition_index, rp.error_code, list(rp.old_style_offsets)))
            else:
                out.append((rp.partition_index, rp.error_code, rp.timestamp, rp.offset))
    return out


def test_list_offsets_are_the_data_clusters(kafka_broker, herd_data):
    topic = f"lo-{token()}"
    create_topic(kafka_broker, topic, 3)
    base = int(time.time() * 1000) - 3_600_000
    produce(kafka_broker.bootstrap, topic, {0: 5, 1: 12}, base)  # partition 2 stays empty
    stamps = (base - 1, base, base + 2500, base + 4000, base + 11_000, base + 50_000)
    checked = 0
    for version in (1, 2, 4, 5, 6, 7, 8, 9):
        specs = SPECS if version >= 7 else SPECS[:2]
        for timestamps in (specs, stamps):
            for isolation in ((0, 1) if version >= 2 else (0,)):
                for ts in timestamps:
                    herd = list_offsets(herd_data.address, topic, (0, 1, 2), (ts,), version, isolation)
                    kafka = list_offsets(kafka_broker.address, topic, (0, 1, 2), (ts,), version, isolation)
                    assert sorted(herd) == sorted(kafka), (version, ts, isolation)
                    checked += 1
                # a partition asked twice: INVALID_REQUEST for it, as Kafka
                herd = list_offsets(herd_data.address, topic, (0, 1, 2), timestamps, version, isolation)
                kafka = list_offsets(kafka_broker.address, topic, (0, 1, 2), timestamps, version, isolation)
                assert sorted(herd) == sorted(kafka), (version, timestamps, isolation)
    # v0: earliest and latest (Kafka's old-style offsets)
    for ts in (-2, -1):
        assert list_offsets(herd_data.address, topic, (0, 1, 2), (ts,), 0) == [
            (p, E.NONE, [off]) for p, off in zip((0, 1, 2), (0, 0, 0) if ts == -2 else (5, 12, 0), strict=True)]
    # the ends really are the produced counts
    assert [x[3] for x in list_offsets(herd_data.address, topic, (0, 1, 2), (-1,), 7)] == [5, 12, 0]
    # a partition or topic the broker lacks
    assert list_offsets(herd_data.address, topic, (7,), (-1,), 7)[0][1] == E.UNKNOWN_TOPIC_OR_PARTITION
    assert list_offsets(herd_data.address, f"nope-{token()}", (0,), (-1,), 7)[0][1] == E.UNKNOWN_TOPIC_OR_PARTITION
    assert checked > 60


def _consumer(herd, group, topic, protocol):
    from confluent_kafka import Consumer

    conf = {"bootstrap.servers": herd.bootstrap, "group.id": group, "enable.auto.commit": False,
            "topic.metadata.refresh.interval.ms": 300, "group.protocol": protocol}
    if protocol == "classic":
        conf["session.timeout.ms"] = 10000
    c = Consumer(conf)
    c.subscribe([topic])
    return c


@pytest.mark.parametrize("protocol", ["classic", "consumer"])
def test_partitions_added_on_the_broker_reach_the_group(kafka_broker, herd_data, protocol):
    t = token()
    topic, group = f"grow-{protocol}-{t}", f"grow-g-{t}"
    create_topic(kafka_broker, topic, 2)
    c = _consumer(herd_data, group, topic, protocol)
    try:
        def assigned(n):
            def check():
                c.poll(0.1)
                got = sorted(tp.partition for tp in c.assignment())
                return got == list(range(n))
            return check

        until(f"{protocol}: the 2 partitions", assigned(2), timeout=60)
        add_partitions(kafka_broker, topic, 5)
        until(f"{protocol}: the 5 partitions after CreatePartitions", assigned(5), timeout=60)
        assert catalog_of(metadata(herd_data.address, [topic]))[topic][2] == 5
    finally:
        c.close()


def test_kafka_consumer_groups_describe_shows_log_ends_and_lag(kafka_broker, herd_data, tmp_path_factory):
    from tests.conformance.reference_clients import JavaDriver
    from tests.conformance.test_kafka_tool import table

    t = token()
    topic, group = f"desc-{t}", f"desc-g-{t}"
    create_topic(kafka_broker, topic, 3)
    produce(kafka_broker.bootstrap, topic, {0: 10, 1: 20, 2: 7}, int(time.time() * 1000))
    commits = {0: 4, 1: 20, 2: 0}
    with RawClient(herd_data.address) as c:
        r = c.call(m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
            m.OffsetCommitRequestTopic(name=topic, partitions=[
                m.OffsetCommitRequestPartition(partition_index=p, committed_offset=o,
                                                           committed_metadata="")
                for p, o in commits.items()])]), 8)
        assert {p.error_code for tt in r.topics for p in tt.partitions} == {E.NONE}
    ends = {p: off for p, _, _, off in list_offsets(kafka_broker.address, topic, (0, 1, 2), (-1,), 7)}
    assert ends == {0: 10, 1: 20, 2: 7}
    driver = JavaDriver(tmp_path_factory.mktemp("java-data"))
    try:
        code, out, err = driver.tool("--bootstrap-server", herd_data.bootstrap, "--describe", "--group", group)
    finally:
        driver.close()
    assert code == 0, err
    rows = {int(r["PARTITION"]): r for r in table(out)}
    assert {p: (int(r["CURRENT-OFFSET"]), int(r["LOG-END-OFFSET"]), int(r["LAG"])) for p, r in rows.items()} == {
        p: (commits[p], ends[p], ends[p] - commits[p]) for p in range(3)}


def test_a_topic_flag_the_data_cluster_lacks_is_one_line(kafka_broker, tmp_path):
    import os
    import subprocess
    import sys

    from tools.daemon import REPO

    t = token()
    create_topic(kafka_broker, f"flag-{t}", 2)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    env.pop("HERD_PORT", None)

    def serve(*topics):
        args = [a for name in topics for a in ("--topic", name)]
        return subprocess.run([sys.executable, "-m", "coordinator", "serve", "--port", "0", "--data-dir",
                               str(tmp_path / "d"), "--log-format", "json", "--data-bootstrap-server",
                               kafka_broker.bootstrap, *args], capture_output=True, text=True, timeout=60,
                              cwd=str(REPO), env=env)

    proc = serve(f"flag-{t}:2", f"absent-{t}:3")
    assert proc.returncode == 2, (proc.stdout[-2000:], proc.stderr[-2000:])
    errors = [line for line in proc.stderr.splitlines() if line.startswith("herd: error:")]
    assert len(errors) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"--topic absent-{t}" in errors[0] and kafka_broker.bootstrap in errors[0], errors[0]
    assert f"flag-{t}," not in errors[0]
    # and nothing was created on the broker
    assert metadata(kafka_broker.address, [f"absent-{t}"], auto_create=False).topics[0].error_code == \
        E.UNKNOWN_TOPIC_OR_PARTITION


def test_cluster_nodes_answer_the_same_catalog_and_offsets(kafka_broker, pg, tmp_path):  # noqa: F811
    from tests.cluster.nodes import Node

    t = token()
    topic = f"nodes-{t}"
    create_topic(kafka_broker, topic, 2)
    produce(kafka_broker.bootstrap, topic, {0: 3, 1: 8}, int(time.time() * 1000))
    data = ("--data-bootstrap-server", kafka_broker.bootstrap, "--data-metadata-refresh-interval-ms", REFRESH_MS)
    with Node(tmp_path, 1, pg.url, *data) as n1, Node(tmp_path, 2, pg.url, *data) as n2:
        broker = catalog_of(metadata(kafka_broker.address, [topic], auto_create=False))
        for node in (n1, n2):
            assert catalog_of(metadata(node.address, [topic])) == broker
            assert sorted(list_offsets(node.address, topic, (0, 1), (-1,), 7)) == [
                (0, E.NONE, -1, 3), (1, E.NONE, -1, 8)]
        add_partitions(kafka_broker, topic, 4)
        grown = catalog_of(metadata(kafka_broker.address, [topic], auto_create=False))
        assert grown[topic][2] == 4 and grown[topic][1] == broker[topic][1]
        for node in (n1, n2):
            until(f"node {node.node_id} to see 4 partitions",
                  lambda node=node: catalog_of(metadata(node.address, [topic])) == grown)
