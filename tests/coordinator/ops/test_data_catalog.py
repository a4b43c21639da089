"""The data cluster as the catalog: the pure view (coordinator.core.catalog.DataTopics, time passed in as
a manual clock's), the catalog's answers from it (Metadata, CreateTopics, the consumer groups' view,
ListOffsets' shape), and coordinator.ops.datacatalog.DataCatalog over a scripted reader (first-use
waits, shared reads, bounded waits, changes reported). A real Kafka broker: tests/reference."""
from __future__ import annotations

import asyncio

import pytest

from coordinator.clock import ManualClock
from coordinator.config import Config
from coordinator.core.catalog import PENDING, RECHECK_MS, Catalog, DataTopics
from coordinator.ops.datacatalog import DataCatalog
from coordinator.ops.datacluster import DataClusterError, TopicsRead
from protocol import errors as E
from protocol import messages as m

A, B = b"A" * 16, b"B" * 16


def view_with(now=0, **topics) -> DataTopics:
    v = DataTopics()
    v.apply_all({n: t for n, t in topics.items()}, {}, now)
    return v


# ---- the pure view ---------------------------------------------------------------------------------

def test_lookup_pending_until_read_then_unknown_for_the_recheck_window():
    clock = ManualClock()
    v = DataTopics()
    assert v.lookup("orders", clock.monotonic_ms()) is PENDING
    assert v.apply_names({}, {"orders"}, {}, clock.monotonic_ms()) is False
    assert v.lookup("orders", clock.monotonic_ms()) == E.UNKNOWN_TOPIC_OR_PARTITION
    clock.advance(RECHECK_MS - 1)
    assert v.lookup("orders", clock.monotonic_ms()) == E.UNKNOWN_TOPIC_OR_PARTITION
    clock.advance(1)
    assert v.lookup("orders", clock.monotonic_ms()) is PENDING  # asked again: it may exist by now
    assert v.apply_names({"orders": (A, 3)}, set(), {}, clock.monotonic_ms()) is True
    assert v.lookup("orders", clock.monotonic_ms()).partitions == 3


def test_a_read_of_every_topic_replaces_the_view_and_reports_changes():
    v = view_with(orders=(A, 2), audit=(B, 1))
    assert set(v.topics) == {"orders", "audit"} and v.by_id[A].name == "orders"
    assert v.apply_all({"orders": (A, 2), "audit": (B, 1)}, {}, 10) is False  # nothing changed
    assert v.apply_all({"orders": (A, 5), "audit": (B, 1)}, {}, 20) is True  # grown
    assert v.topics["orders"].partitions == 5 and v.by_id[A].partitions == 5
    assert v.apply_all({"audit": (B, 1)}, {}, 30) is True  # deleted
    assert "orders" not in v.topics and A not in v.by_id
    c = b"C" * 16
    assert v.apply_all({"audit": (c, 1)}, {}, 40) is True  # recreated under a new id
    assert v.by_id[c].name == "audit" and B not in v.by_id
    # a topic absent from a read of every topic is not known missing: a name read asks again
    assert v.lookup("orders", 41) is PENDING


def test_a_topic_the_cluster_cannot_describe_keeps_its_last_answer_and_its_error():
    v = view_with(orders=(A, 2))
    assert v.apply_all({}, {"orders": E.LEADER_NOT_AVAILABLE, "new": E.TOPIC_AUTHORIZATION_FAILED}, 100) is False
    assert v.lookup("orders", 100).partitions == 2  # kept, not dropped while leaderless
    assert v.lookup("new", 100) == E.TOPIC_AUTHORIZATION_FAILED
    assert v.lookup("new", 100 + RECHECK_MS) is PENDING


def test_a_failed_read_is_leader_not_available_for_a_while_known_topics_untouched():
    clock = ManualClock(5_000)
    v = view_with(orders=(A, 2))
    v.read_failed(["orders", "later"], clock.monotonic_ms())
    assert v.lookup("orders", clock.monotonic_ms()).partitions == 2
    assert v.lookup("later", clock.monotonic_ms()) == E.LEADER_NOT_AVAILABLE
    clock.advance(RECHECK_MS)
    assert v.lookup("later", clock.monotonic_ms()) is PENDING


def test_want_asks_once_per_name_and_only_for_valid_unknown_names():
    v = view_with(orders=(A, 2))
    calls = []
    v.on_wanted = lambda: calls.append(set(v.wanted))
    v.want("orders")
    v.want("bad name!")
    v.want("new")
    v.want("new")
    assert calls == [{"new"}]


# ---- the catalog's answers from the view -----------------------------------------------------------

def catalog(**topics) -> Catalog:
    cfg = Config(auto_create_topics=True, topics=[("orders", 9)]).validate()
    cat = Catalog(cfg, node_id=0, data=view_with(**topics))
    cat.set_address("127.0.0.1", 9092)
    return cat


def md(names, version=12):
    return m.MetadataRequest(topics=None if names is None else [m.MetadataRequestTopic(name=n) for n in names],
                             allow_auto_topic_creation=True)


def test_metadata_answers_the_data_clusters_counts_and_ids_and_creates_nothing():
    cat = catalog(orders=(A, 3))
    cat.data.apply_names({}, {"ghost"}, {}, 0)
    writes, resp = cat.metadata(md(["orders", "ghost", "fresh", "bad name!"]), 12, now=0)
    assert writes == []
    got = {t.name: (t.error_code, t.topic_id, len(t.partitions)) for t in resp.topics}
    assert got == {"orders": (E.NONE, A, 3), "ghost": (E.UNKNOWN_TOPIC_OR_PARTITION, bytes(16), 0),
                   "fresh": (E.LEADER_NOT_AVAILABLE, bytes(16), 0),  # not read yet: retriable
                   "bad name!": (E.INVALID_TOPIC_EXCEPTION, bytes(16), 0)}
    assert [(b.node_id, b.port) for b in resp.brokers] == [(0, 9092)]
    assert {p.leader_id for p in resp.topics[0].partitions} == {0}
    assert "fresh" not in cat.topics and "ghost" not in cat.topics  # herd's own catalog untouched
    _, every = cat.metadata(md(None), 12, now=0)
    assert [t.name for t in every.topics] == ["orders"]
    by_id = m.MetadataRequest(topics=[m.MetadataRequestTopic(name=None, topic_id=A),
                                      m.MetadataRequestTopic(name=None, topic_id=B)])
    _, resp = cat.metadata(by_id, 12, now=0)
    assert [(t.name, t.error_code) for t in resp.topics] == [("orders", E.NONE), (None, E.UNKNOWN_TOPIC_ID)]


def test_data_needs_names_the_topics_never_read():
    cat = catalog(orders=(A, 3))
    assert cat.data_needs(md(["orders"]), 12, 0) is None
    assert cat.data_needs(md(["orders", "new", "bad name!"]), 12, 0) == ["new"]
    assert cat.data_needs(md(None), 12, 0) is None  # every topic: read at start
    assert Catalog(Config().validate()).data_needs(md(["x"]), 12, 0) is None  # no data cluster
    never = Catalog(Config().validate(), data=DataTopics())
    assert never.data_needs(md(None), 12, 0) == []  # every topic, never read: read them first


def test_create_topics_refused_and_configured_topics_create_nothing():
    cat = catalog(orders=(A, 3))
    assert cat.configured_topics() == []
    req = m.CreateTopicsRequest(topics=[m.CreateTopicsRequestCreatableTopic(name=n, num_partitions=1,
                                                                             replication_factor=1)
                                        for n in ("orders", "new")])
    writes, resp = cat.create_topics(req, 5)
    assert writes == []
    assert [(t.name, t.error_code) for t in resp.topics] == [("orders", E.TOPIC_ALREADY_EXISTS),
                                                              ("new", E.POLICY_VIOLATION)]
    assert "data cluster" in resp.topics[1].error_message


def test_consumer_groups_see_the_data_clusters_topics_and_ask_for_missing_ones():
    cat = catalog(orders=(A, 3))
    cat.replay(*_herd_topic("orders", 1))  # a topic herd made before the data cluster was set: ignored
    asked = []
    cat.data.on_wanted = lambda: asked.append(set(cat.data.wanted))
    assert cat.get("orders") == (A, 3)
    assert list(cat.names()) == ["orders"]
    assert cat.get("later") is None and asked == [{"later"}]


def _herd_topic(name, parts):
    from coordinator.core.catalog import Topic, topic_key, topic_value
    return topic_key(name), topic_value(Topic(name, parts, b"H" * 16))


def lo_request(parts, ts=-1):
    return m.ListOffsetsRequest(replica_id=-1, topics=[m.ListOffsetsRequestListOffsetsTopic(
        name="orders", partitions=[m.ListOffsetsRequestListOffsetsPartition(partition_index=p, timestamp=ts)
                                   for p in parts])])


def test_list_offsets_answer_is_shaped_for_each_version():
    cat = catalog(orders=(A, 3))
    answers = {("orders", 0): (E.NONE, -1, 42), ("orders", 1): (E.NONE, 1234, 7),
               ("orders", 2): (E.NONE, -1, -1)}
    for version in (1, 4, 9):
        resp = cat.list_offsets_answer(lo_request([0, 1, 2, 3]), version, answers)
        got = [(p.partition_index, p.error_code, p.timestamp, p.offset) for p in resp.topics[0].partitions]
        assert got == [(0, E.NONE, -1, 42), (1, E.NONE, 1234, 7), (2, E.NONE, -1, -1),
                       (3, E.LEADER_NOT_AVAILABLE, -1, -1)]  # no answer: retriable, never an offset
        if version >= 4:
            assert [p.leader_epoch for p in resp.topics[0].partitions] == [0, 0, -1, -1]
    v0 = cat.list_offsets_answer(lo_request([0, 2, 3]), 0, answers)
    assert [(p.error_code, p.old_style_offsets) for p in v0.topics[0].partitions] == [
        (E.NONE, [42]), (E.NONE, []), (E.LEADER_NOT_AVAILABLE, [])]
    twice = cat.list_offsets_answer(lo_request([0, 0, 1]), 5, answers)
    assert [p.partition_index for p in twice.topics[0].partitions] == [0, 1]


# ---- DataCatalog over a scripted reader ------------------------------------------------------------

class Reader:
    """Answers ``topics``/``list_offsets`` from dicts; ``gate`` (an Event) holds reads; ``down`` fails them."""

    def __init__(self, topics=None):
        self.data = dict(topics or {})
        self.calls = []
        self.gate: asyncio.Event | None = None
        self.down = False
        self.offsets = {}
        self.closed = False

    async def topics(self, names=None, timeout_ms=None):
        self.calls.append(None if names is None else sorted(names))
        if self.gate is not None:
            await self.gate.wait()
        if self.down:
            raise DataClusterError("127.0.0.1:9: cannot connect")
        out = TopicsRead()
        for n in (self.data if names is None else names):
            if n in self.data:
                out.found[n] = self.data[n]
            else:
                out.unknown.add(n)
        return out

    async def list_offsets(self, specs, isolation=0, timeout_ms=None):
        self.calls.append(("list_offsets", dict(specs), isolation, timeout_ms))
        return {tp: self.offsets.get(tp, (E.UNKNOWN_TOPIC_OR_PARTITION, -1, -1)) for tp in specs}

    def close(self):
        self.closed = True

    servers = [("127.0.0.1", 9)]


def data_catalog(reader, wait_ms=5000):
    clock = ManualClock()
    cat = Catalog(Config().validate())
    changes = []
    dc = DataCatalog(reader, cat, clock, interval_ms=30_000, wait_ms=wait_ms, on_change=lambda: changes.append(1))
    return dc, cat, clock, changes


async def test_open_checks_the_topic_flags_against_the_first_read():
    reader = Reader({"orders": (A, 4)})
    dc, cat, _, _ = data_catalog(reader)
    with pytest.raises(ValueError, match=r"--topic nope: the data cluster at .* has no such topic"):
        await dc.open([("orders", 9), ("nope", 1)])
    assert reader.closed
    down = Reader({"orders": (A, 4)})
    down.down = True
    dc, cat, _, _ = data_catalog(down)
    await dc.open([("nope", 1)])  # nothing known missing while the data cluster does not answer
    assert not down.closed


async def test_prime_reads_every_topic_and_missing_names_the_absent_flags():
    reader = Reader({"orders": (A, 4)})
    dc, cat, _, changes = data_catalog(reader)
    assert dc.missing(["nope"]) == []  # nothing read yet: nothing known missing
    assert await dc.prime() is True
    assert cat.get("orders") == (A, 4) and changes == [1]
    assert dc.missing(["orders", "nope"]) == ["nope"]
    assert "herd_data_catalog_up 1" in dc.metric_lines() and "herd_data_topics 1" in dc.metric_lines()
    reader.down = True
    assert await dc.prime() is False and dc.up is False
    assert cat.get("orders") == (A, 4)  # the last read stands
    lines = dc.metric_lines()
    assert "herd_data_catalog_up 0" in lines and "herd_data_catalog_read_failures_total 1" in lines


async def test_names_asked_in_one_turn_share_one_read_and_wait_for_it():
    reader = Reader({"a": (A, 1), "b": (B, 2)})
    reader.gate = asyncio.Event()
    dc, cat, clock, changes = data_catalog(reader)
    first = asyncio.create_task(dc.read(["a"]))
    second = asyncio.create_task(dc.read(["b", "zz"]))
    await asyncio.sleep(0.01)
    assert not first.done() and not second.done()  # parked until the read returns
    reader.gate.set()
    await asyncio.gather(first, second)
    assert reader.calls == [["a", "b", "zz"]]
    now = clock.monotonic_ms()
    assert cat.data.lookup("a", now).partitions == 1 and cat.data.lookup("b", now).partitions == 2
    assert cat.data.lookup("zz", now) == E.UNKNOWN_TOPIC_OR_PARTITION
    assert changes == [1]


async def test_a_read_that_does_not_return_in_time_is_leader_not_available():
    reader = Reader({"a": (A, 1)})
    reader.gate = asyncio.Event()  # never set: the data cluster hangs
    dc, cat, clock, _ = data_catalog(reader, wait_ms=50)
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    await dc.read(["a"])
    assert loop.time() - t0 < 2.0  # bounded by wait_ms
    assert cat.data.lookup("a", clock.monotonic_ms()) == E.LEADER_NOT_AVAILABLE
    _, resp = cat.metadata(md(["a"]), 12, clock.monotonic_ms())
    assert resp.topics[0].error_code == E.LEADER_NOT_AVAILABLE
    clock.advance(RECHECK_MS)
    assert cat.data_needs(md(["a"]), 12, clock.monotonic_ms()) == ["a"]  # asked again after a while
    await dc.stop()
    assert reader.closed


async def test_a_failed_read_marks_its_names_and_the_next_one_recovers():
    reader = Reader({"a": (A, 1)})
    reader.down = True
    dc, cat, clock, changes = data_catalog(reader)
    await dc.read(["a"])
    assert cat.data.lookup("a", clock.monotonic_ms()) == E.LEADER_NOT_AVAILABLE and dc.up is False
    reader.down = False
    clock.advance(RECHECK_MS)
    await dc.read(["a"])
    assert cat.data.lookup("a", clock.monotonic_ms()).topic_id == A and dc.up is True and changes == [1]


async def test_a_consumer_groups_lookup_reads_the_name_and_reports_the_change():
    reader = Reader({"later": (B, 6)})
    dc, cat, _, changes = data_catalog(reader)
    assert cat.get("later") is None  # never waits
    for _ in range(20):
        await asyncio.sleep(0)
        if changes:
            break
    await asyncio.gather(*dc._reads)
    assert reader.calls == [["later"]] and changes == [1] and cat.get("later") == (B, 6)


async def test_list_offsets_forwards_every_partition_once_with_isolation_and_timeout():
    reader = Reader({"orders": (A, 3)})
    reader.offsets = {("orders", 0): (E.NONE, -1, 10), ("orders", 1): (E.NONE, 99, 4)}
    dc, cat, _, _ = data_catalog(reader)
    req = m.ListOffsetsRequest(replica_id=-1, isolation_level=1, timeout_ms=800, topics=[
        m.ListOffsetsRequestListOffsetsTopic(name="orders", partitions=[
            m.ListOffsetsRequestListOffsetsPartition(partition_index=0, timestamp=-1),
            m.ListOffsetsRequestListOffsetsPartition(partition_index=1, timestamp=12345),
            m.ListOffsetsRequestListOffsetsPartition(partition_index=2, timestamp=-2),
            m.ListOffsetsRequestListOffsetsPartition(partition_index=2, timestamp=-1)])])
    resp = await dc.list_offsets(req, 10)
    assert reader.calls == [("list_offsets", {("orders", 0): -1, ("orders", 1): 12345}, 1, 800)]
    assert [(p.partition_index, p.error_code, p.offset) for p in resp.topics[0].partitions] == [
        (0, E.NONE, 10), (1, E.NONE, 4), (2, E.INVALID_REQUEST, -1)]



def test_names_known_missing_are_bounded():
    from coordinator.core.catalog import MAX_REMEMBERED

    v = DataTopics()
    v.apply_names({}, {f"t{i}" for i in range(MAX_REMEMBERED + 1)}, {}, 0)
    v.apply_names({}, {"late"}, {}, RECHECK_MS)  # the expired ones go
    assert set(v.checked) == {"late"}


# ---- the runtime: Metadata waits for a first read, ListOffsets for the data cluster ------------------

async def test_runtime_holds_a_metadata_for_unread_topics_and_answers_list_offsets_from_the_data_cluster():
    from coordinator.core.coordinator import GroupCoordinator
    from coordinator.core.versions import LIST_OFFSETS, METADATA
    from coordinator.runtime import Runtime
    from tests.coordinator.test_runtime_shards import FakeStore, N, Token

    config = Config(offsets_partitions=N, initial_rebalance_delay_ms=0).validate()
    cat = Catalog(config, node_id=0)
    clock = ManualClock()
    reader = Reader({"orders": (A, 2)})
    reader.offsets = {("orders", 1): (E.NONE, -1, 77)}
    data = DataCatalog(reader, cat, clock)
    rt = Runtime(config, GroupCoordinator(config.group_config(), node_id=0), cat, FakeStore(owned=[]),
                 clock=clock, data=data)
    assert data.on_change == rt.topics_changed  # the runtime hears the data cluster's changes
    rt.start(asyncio.get_running_loop())
    reader.gate = asyncio.Event()

    def send(api_key, version, request):
        token = Token(api_key, version, request)
        rt.dispatch(token, api_key, version, request, "cli", "/127.0.0.1")
        return token

    first = send(METADATA, 12, md(["orders"]))
    assert first.held and first.responses == []  # parked until the data cluster answers
    reader.gate.set()
    for _ in range(50):
        await asyncio.sleep(0)
        if first.responses:
            break
    (resp,) = first.responses
    assert [(t.name, t.topic_id, len(t.partitions)) for t in resp.topics] == [("orders", A, 2)]
    calls = len(reader.calls)
    again = send(METADATA, 12, md(["orders"]))
    assert not again.held and len(again.responses) == 1 and len(reader.calls) == calls  # known: at once

    lo = send(LIST_OFFSETS, 7, lo_request([1]))
    assert lo.held and lo.responses == []
    for _ in range(50):
        await asyncio.sleep(0)
        if lo.responses:
            break
    (resp,) = lo.responses
    assert [(p.partition_index, p.error_code, p.offset) for p in resp.topics[0].partitions] == [(1, E.NONE, 77)]
    assert cat.topics == {}  # herd's own catalog: nothing created
    await rt.data.stop()
    rt.shutdown()
