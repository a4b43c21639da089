"""The data-cluster reader against scripted brokers on loopback (asyncio servers on port 0): the
mock cluster's malformed answers, ListOffsets per leader, a silent broker, a refused one and its
backoff (on a manual clock), a leader that moved, and what the refresher makes of a partial answer."""
from __future__ import annotations

import asyncio
import ssl

import pytest

from coordinator.clock import ManualClock
from coordinator.ops.datacluster import DataClusterError, DataClusterReader, parse_servers, reader_from_config
from coordinator.ops.lag import LagRefresher, LagTracker, PartialFetch
from protocol import errors as E
from protocol import messages as m
from protocol.framing import FrameDecoder, frame
from protocol.headers import encode_response_header, read_request_header
from protocol.sasl import SaslError, Users, server_mechanism
from tests.support.pki import make_pki
from tests.support.records import batch

# librdkafka's mock answers ApiVersions v3+ with this body (measured): it does not decode as v3
MOCK_APIVERSIONS_V3 = b"\x00\x23\x01\x00\x12\x00\x00\x00\x02\x00\x00\x00\x00"
VERSIONS = {18: (0, 3), 3: (0, 12), 2: (0, 7), 17: (0, 1), 36: (0, 2), 1: (0, 16)}


class Broker:
    """One scripted broker of a :class:`Cluster`."""

    def __init__(self, cluster: Cluster, node_id: int):
        self.cluster, self.node_id = cluster, node_id
        self.server: asyncio.AbstractServer | None = None
        self.port = 0
        self.silent = False  # accept, read, never answer
        self.requests: list[tuple[int, int]] = []  # (api key, version)
        self.connections = 0
        self.writers: list[asyncio.StreamWriter] = []

    async def start(self, port: int = 0):
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", port, ssl=self.cluster.tls)
        self.port = self.server.sockets[0].getsockname()[1]

    async def stop(self):
        self.server.close()
        for w in self.writers:
            w.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        self.connections += 1
        self.writers.append(writer)
        decoder = FrameDecoder(1 << 20)
        users, mech = self.cluster.users, None
        try:
            while data := await reader.read(65536):
                for payload in decoder.feed(data):
                    key, version, corr, _, _, pos = read_request_header(payload)
                    self.requests.append((key, version))
                    if self.silent:
                        continue
                    if key in (17, 36):  # SASL, with protocol.sasl's server side
                        req = m.REQUESTS[key].decode(payload, version, pos)
                        if key == 17:
                            mech = server_mechanism(req.mechanism, users)
                            resp = m.SaslHandshakeResponse(mechanisms=["PLAIN", "SCRAM-SHA-512"])
                        else:
                            try:
                                resp = m.SaslAuthenticateResponse(auth_bytes=mech.step(req.auth_bytes))
                            except SaslError as exc:
                                resp = m.SaslAuthenticateResponse(error_code=E.SASL_AUTHENTICATION_FAILED,
                                                                  error_message=str(exc))
                                mech = None
                            if mech is not None and mech.done:
                                users = None  # authenticated
                        writer.write(frame(encode_response_header(corr, key, version) + resp.encode(version)))
                        continue
                    if users is not None and key != 18:
                        return  # not authenticated: as Kafka, the connection closes
                    writer.write(frame(self._answer(key, version, corr, payload, pos)))
        except (ConnectionError, asyncio.CancelledError, ssl.SSLError):
            pass
        finally:
            writer.close()

    def _answer(self, key: int, version: int, corr: int, payload: bytes, pos: int) -> bytes:
        if key == 18:
            if version >= 3:  # as librdkafka's mock: a body that does not decode at v3
                return corr.to_bytes(4, "big") + MOCK_APIVERSIONS_V3
            body = m.ApiVersionsResponse(error_code=0, api_keys=[
                m.ApiVersionsResponseApiVersion(api_key=k, min_version=lo, max_version=hi)
                for k, (lo, hi) in VERSIONS.items()])
            return encode_response_header(corr, key, version) + body.encode(version)
        req = m.REQUESTS[key].decode(payload, version, pos)
        c = self.cluster
        if key == 3:
            topics = []
            asked = req.topics if req.topics is not None else [m.MetadataRequestTopic(name=n) for n in c.leaders]
            for t in asked:
                if t.name not in c.leaders:
                    topics.append(m.MetadataResponseTopic(error_code=E.UNKNOWN_TOPIC_OR_PARTITION, name=t.name,
                                                          partitions=[]))
                    continue
                topics.append(m.MetadataResponseTopic(error_code=0, name=t.name, partitions=[
                    m.MetadataResponsePartition(error_code=0, partition_index=p, leader_id=leader,
                                                replica_nodes=[leader], isr_nodes=[leader])
                    for p, leader in sorted(c.leaders[t.name].items())]))
            resp = m.MetadataResponse(brokers=[
                m.MetadataResponseBroker(node_id=b.node_id, host="127.0.0.1", port=b.port) for b in c.brokers],
                cluster_id="scripted", controller_id=1, topics=topics)
            extra = b"\x00" if version >= 9 else b""  # the mock's extra byte
            return encode_response_header(corr, key, version) + resp.encode(version) + extra
        if key == 2:
            out = []
            for t in req.topics:
                parts = []
                for p in t.partitions:
                    mine = c.leaders.get(t.name, {}).get(p.partition_index) == self.node_id
                    code = E.NONE if mine else E.NOT_LEADER_OR_FOLLOWER
                    parts.append(m.ListOffsetsResponseListOffsetsPartitionResponse(
                        partition_index=p.partition_index, error_code=code, timestamp=-1,
                        offset=c.ends.get((t.name, p.partition_index), 0) if mine else -1, leader_epoch=-1))
                out.append(m.ListOffsetsResponseListOffsetsTopicResponse(name=t.name, partitions=parts))
            return encode_response_header(corr, key, version) + m.ListOffsetsResponse(topics=out).encode(version)
        if key == 1:  # Fetch: the partition's records (one batch) when this broker leads it
            out = []
            for t in req.topics:
                parts = []
                for p in t.partitions:
                    mine = c.leaders.get(t.topic, {}).get(p.partition) == self.node_id
                    base, stamps = c.records.get((t.topic, p.partition), (0, []))
                    pd = m.FetchResponsePartitionData(
                        partition_index=p.partition, high_watermark=base + len(stamps), aborted_transactions=[],
                        error_code=E.NONE if mine else E.NOT_LEADER_OR_FOLLOWER)
                    if mine and base <= p.fetch_offset < base + len(stamps):
                        pd.records = batch(base, stamps)
                    parts.append(pd)
                out.append(m.FetchResponseFetchableTopicResponse(topic=t.topic, partitions=parts))
            return encode_response_header(corr, key, version) + m.FetchResponse(responses=out).encode(version)
        raise AssertionError(f"unexpected api {key}")


class Cluster:
    def __init__(self, n: int, tls: ssl.SSLContext | None = None, users: Users | None = None):
        self.tls, self.users = tls, users
        self.brokers = [Broker(self, i + 1) for i in range(n)]
        self.leaders: dict[str, dict[int, int]] = {}
        self.ends: dict[tuple[str, int], int] = {}
        self.records: dict[tuple[str, int], tuple[int, list[int]]] = {}  # (base offset, timestamps)

    async def __aenter__(self):
        for b in self.brokers:
            await b.start()
        return self

    async def __aexit__(self, *exc):
        for b in self.brokers:
            await b.stop()

    @property
    def bootstrap(self):
        return [("127.0.0.1", self.brokers[0].port)]

    def count(self, key: int) -> list[int]:
        return [sum(1 for k, _ in b.requests if k == key) for b in self.brokers]


async def test_log_ends_per_leader_through_the_mock_clusters_malformed_answers():
    async with Cluster(2) as c:
        c.leaders = {"orders": {0: 1, 1: 2, 2: 1}, "audit": {0: 2}}
        c.ends = {("orders", 0): 100, ("orders", 1): 7, ("orders", 2): 0, ("audit", 0): 12}
        reader = DataClusterReader(c.bootstrap, timeout_ms=2000)
        try:
            got = await reader.fetch([("orders", 0), ("orders", 1), ("orders", 2), ("audit", 0), ("gone", 0),
                                      ("orders", 9)])
            # the topic and the partition the data cluster does not have: no answer, no error
            assert got == {("orders", 0): 100, ("orders", 1): 7, ("orders", 2): 0, ("audit", 0): 12}
            # ApiVersions at our top (v4), the mock's answer, again at v0; then Metadata at its top and one
            # ListOffsets per leader
            assert [v for k, v in c.brokers[0].requests if k == 18] == [m.ApiVersionsRequest.MAX_VERSION, 0]
            assert (3, 12) in c.brokers[0].requests
            assert c.count(2) == [1, 1]
            assert {v for b in c.brokers for k, v in b.requests if k == 2} == {7}
            c.ends[("orders", 1)] = 9
            assert (await reader.fetch([("orders", 1)])) == {("orders", 1): 9}
            assert c.count(3) == [1, 0]  # leaders remembered (metadata_max_age_ms)
        finally:
            reader.close()


async def test_a_silent_broker_costs_one_timeout_and_its_partitions_only():
    async with Cluster(2) as c:
        c.leaders = {"t": {0: 1, 1: 2}}
        c.ends = {("t", 0): 5, ("t", 1): 6}
        reader = DataClusterReader(c.bootstrap, timeout_ms=300)
        try:
            await reader.fetch([("t", 0), ("t", 1)])
            c.brokers[1].silent = True
            c.ends[("t", 0)] = 8
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            with pytest.raises(PartialFetch) as info:
                await reader.fetch([("t", 0), ("t", 1)])
            assert loop.time() - t0 < 2.0  # bounded by the budget, not hung
            assert info.value.found == {("t", 0): 8}
            assert "did not answer ListOffsets" in str(info.value)
        finally:
            reader.close()


async def test_a_refused_broker_is_retried_after_its_backoff_on_the_clock():
    async with Cluster(1) as c:
        c.leaders = {"t": {0: 1}}
        c.ends = {("t", 0): 3}
        port = c.brokers[0].port
        clock = ManualClock()
        reader = DataClusterReader(c.bootstrap, timeout_ms=1000, backoff_ms=200, backoff_max_ms=800, clock=clock)
        try:
            assert await reader.fetch([("t", 0)]) == {("t", 0): 3}
            await c.brokers[0].stop()  # down: connections reset, then refused
            for _ in range(50):
                try:
                    await reader.fetch([("t", 0)])
                except (DataClusterError, PartialFetch):
                    break
                await asyncio.sleep(0.01)
            else:
                raise AssertionError("a stopped broker still answered")
            dials = reader.stats["connects"]
            for wait, redial in ((0, False), (199, False), (1, True), (399, False), (1, True), (800, True)):
                clock.advance(wait)
                with pytest.raises(DataClusterError):
                    await reader.fetch([("t", 0)])
                assert reader.stats["connects"] == dials + redial, (wait, redial)
                dials = reader.stats["connects"]
            await c.brokers[0].start(port)  # back on the same port
            clock.advance(800)
            assert await reader.fetch([("t", 0)]) == {("t", 0): 3}
            assert reader.peers[("127.0.0.1", port)].failures == 0  # the backoff starts over
        finally:
            reader.close()


async def test_a_moved_leader_is_found_again_in_the_same_fetch():
    async with Cluster(2) as c:
        c.leaders = {"t": {0: 1}}
        c.ends = {("t", 0): 40}
        reader = DataClusterReader(c.bootstrap, timeout_ms=2000)
        try:
            assert await reader.fetch([("t", 0)]) == {("t", 0): 40}
            c.leaders = {"t": {0: 2}}  # broker 1 now answers NOT_LEADER_OR_FOLLOWER
            c.ends[("t", 0)] = 41
            assert await reader.fetch([("t", 0)]) == {("t", 0): 41}
            assert c.count(2) == [2, 1]
        finally:
            reader.close()


async def test_the_refresher_keeps_a_partial_answer_and_says_the_source_is_down():
    class Half:
        async def fetch(self, tps):
            raise PartialFetch({tps[0]: 10}, "broker 2 did not answer")

    clock = ManualClock()
    tracker = LagTracker(history=5, stale_after_ms=1000)
    ref = LagRefresher(tracker, Half(), lambda: [[("t", 0), ("t", 1)]], clock, interval_ms=500)
    assert await ref.refresh() is False
    assert not ref.up and "broker 2 did not answer" in ref.last_error
    sampled = [tp for tp in (("t", 0), ("t", 1)) if tracker.log_end(tp) is not None]
    assert len(sampled) == 1 and tracker.log_end(sampled[0]) == 10


def test_reader_from_config_reads_data_command_config(tmp_path):
    from coordinator.config import Config

    props = tmp_path / "data.properties"
    props.write_text("security.protocol=SASL_PLAINTEXT\nsasl.mechanism=SCRAM-SHA-512\n"
                     "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                     'username="lag" password="s3cret";\nclient.id=ignored\n')
    cfg = Config(data_bootstrap_server="SASL_PLAINTEXT://k1:9092,k2:9093", data_command_config=str(props))
    reader = reader_from_config(cfg, timeout_ms=900)
    assert reader.servers == [("k1", 9092), ("k2", 9093)] and reader.timeout_ms == 900
    assert reader.security.sasl_credentials() == ("SCRAM-SHA-512", "lag", "s3cret")
    assert "s3cret" not in repr(reader) + repr(reader.security)
    props.write_text("security.protocol=SSL\nssl.truststore.location=/x.jks\n")
    with pytest.raises(ValueError, match=r"^data_command_config .*data.properties: ssl.truststore.location without"):
        reader_from_config(cfg, timeout_ms=900)
    with pytest.raises(ValueError, match="names SASL_SSL but the data cluster's security.protocol is PLAINTEXT"):
        reader_from_config(Config(data_bootstrap_server="SASL_SSL://k1:9092"), timeout_ms=900)
    assert parse_servers("[::1]:9092, h:1") == [("::1", 9092), ("h", 1)]


async def test_sasl_ssl_from_the_data_command_config_file(tmp_path):
    from coordinator.config import Config

    pki = make_pki(tmp_path, {"lag": "s3cret"})
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(str(pki / "server.pem"))
    props = tmp_path / "data.properties"

    def reader(password: str, ca: str = "ca.pem") -> DataClusterReader:
        props.write_text("security.protocol=SASL_SSL\nsasl.mechanism=SCRAM-SHA-512\n"
                         "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required "
                         f'username="lag" password="{password}";\n'
                         f"ssl.truststore.type=PEM\nssl.truststore.location={pki / ca}\n")
        return reader_from_config(Config(data_bootstrap_server=f"127.0.0.1:{c.brokers[0].port}",
                                         data_command_config=str(props)), timeout_ms=2000)

    async with Cluster(1, tls=server, users=Users({"lag": "s3cret"})) as c:
        c.leaders = {"t": {0: 1}}
        c.ends = {("t", 0): 77}
        good = reader("s3cret")
        try:
            assert await good.fetch([("t", 0)]) == {("t", 0): 77}
            assert (36, 2) in c.brokers[0].requests  # authenticated with SaslAuthenticate v2
        finally:
            good.close()
        wrong = reader("guess")
        try:
            with pytest.raises(DataClusterError, match="SASL SCRAM-SHA-512 authentication of 'lag' failed"):
                await wrong.fetch([("t", 0)])
        finally:
            wrong.close()
        untrusted = reader("s3cret", ca="other-ca.pem")
        try:
            with pytest.raises(DataClusterError, match=r"TLS certificate verification of 127.0.0.1:\d+ failed"):
                await untrusted.fetch([("t", 0)])
        finally:
            untrusted.close()


async def test_a_partition_without_a_leader_is_a_failure_and_its_leader_is_asked_again():
    # a broker shutting down answers Metadata with leader -1 for its partitions: that must not pass
    # for "nothing to read" (a quiet success with no samples), nor be remembered for 5 minutes
    async with Cluster(1) as c:
        c.leaders = {"t": {0: 1, 1: -1}}
        c.ends = {("t", 0): 4, ("t", 1): 9}
        reader = DataClusterReader(c.bootstrap, timeout_ms=2000)
        try:
            with pytest.raises(PartialFetch, match="1 partitions have no leader") as info:
                await reader.fetch([("t", 0), ("t", 1)])
            assert info.value.found == {("t", 0): 4}
            c.leaders = {"t": {0: 1, 1: 1}}
            assert await reader.fetch([("t", 0), ("t", 1)]) == {("t", 0): 4, ("t", 1): 9}
            assert c.count(3) == [2]
        finally:
            reader.close()


async def test_topics_read_every_topic_or_some_names_with_ids_the_same_for_every_reader():
    async with Cluster(2) as c:
        c.leaders = {"a": {0: 1, 1: 2}, "b": {0: 2}}
        one, two = DataClusterReader(c.bootstrap, timeout_ms=2000), DataClusterReader(c.bootstrap, timeout_ms=2000)
        try:
            every = await one.topics()
            assert {n: count for n, (_, count) in every.found.items()} == {"a": 2, "b": 1}
            # this cluster gives no topic ids (as before Kafka 2.8): derived from its cluster id and the
            # name, so every herd node reading it gets the same ones
            assert len({tid for tid, _ in every.found.values()}) == 2
            assert (await two.topics()).found == every.found
            some = await one.topics(["b", "zz"])
            assert some.found == {"b": every.found["b"]} and some.unknown == {"zz"}
        finally:
            one.close()
            two.close()


async def test_list_offsets_per_leader_a_silent_one_is_leader_not_available_in_time():
    async with Cluster(2) as c:
        c.leaders = {"t": {0: 1, 1: 2}}
        c.ends = {("t", 0): 5, ("t", 1): 6}
        reader = DataClusterReader(c.bootstrap, timeout_ms=300)
        try:
            got = await reader.list_offsets({("t", 0): -1, ("t", 1): -1, ("t", 9): -1, ("nope", 0): -2})
            assert got == {("t", 0): (E.NONE, -1, 5), ("t", 1): (E.NONE, -1, 6),
                           ("t", 9): (E.UNKNOWN_TOPIC_OR_PARTITION, -1, -1),
                           ("nope", 0): (E.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)}
            assert c.count(2) == [1, 1]  # one ListOffsets per leader
            c.brokers[1].silent = True
            loop = asyncio.get_running_loop()
            t0 = loop.time()
            got = await reader.list_offsets({("t", 0): -1, ("t", 1): -1})
            assert loop.time() - t0 < 2.0  # bounded by the budget
            assert got == {("t", 0): (E.NONE, -1, 5), ("t", 1): (E.LEADER_NOT_AVAILABLE, -1, -1)}
        finally:
            reader.close()


async def test_list_offsets_follows_a_moved_leader_once():
    async with Cluster(2) as c:
        c.leaders = {"t": {0: 1}}
        c.ends = {("t", 0): 3}
        reader = DataClusterReader(c.bootstrap, timeout_ms=2000)
        try:
            assert await reader.list_offsets({("t", 0): -1}) == {("t", 0): (E.NONE, -1, 3)}
            c.leaders = {"t": {0: 2}}
            assert await reader.list_offsets({("t", 0): -1}) == {("t", 0): (E.NONE, -1, 3)}
            assert c.count(2) == [2, 1]  # the old leader refused, the new one answered
        finally:
            reader.close()


async def test_record_times_one_fetch_per_leader_within_the_timeout():
    t0 = 1_700_000_000_000
    async with Cluster(3) as c:
        c.leaders = {"orders": {0: 1, 1: 2, 2: 1, 3: 3}}
        c.records = {("orders", p): (0, [t0 + 1000 * i + p for i in range(100)]) for p in range(4)}
        reader = DataClusterReader(c.bootstrap, timeout_ms=500)
        try:
            got = await reader.record_times({("orders", 0): 90, ("orders", 1): 80, ("orders", 2): 70,
                                             ("orders", 9): 5, ("gone", 0): 1})
            assert got == {("orders", 0): t0 + 90_000, ("orders", 1): t0 + 80_001, ("orders", 2): t0 + 70_002,
                           ("orders", 9): None, ("gone", 0): None}  # no such partition or topic: None
            assert c.count(1) == [1, 1, 0]  # one Fetch per leader, none to the broker leading nothing asked
            assert {v for b in c.brokers for k, v in b.requests if k == 1} == {12}  # by topic name
            # past the log end: no record there; a silent leader: None for its partitions, in time
            c.brokers[2].silent = True
            loop = asyncio.get_running_loop()
            started = loop.time()
            got = await reader.record_times({("orders", 0): 100, ("orders", 3): 60, ("orders", 1): 5})
            assert got == {("orders", 0): None, ("orders", 3): None, ("orders", 1): t0 + 5001}
            assert loop.time() - started < 2.0
        finally:
            reader.close()
