"""The topic catalog and the broker APIs a group member sends (pure, no sockets)."""
from coordinator.config import Config
from coordinator.core.catalog import Catalog, is_topic_record, validate_topic_name
from protocol import errors as E
from protocol import messages as m


def catalog(**kw):
    cat = Catalog(Config(**kw))
    cat.set_address("127.0.0.1", 9092)
    return cat


def md(*names, allow=True):
    return m.MetadataRequest(topics=[m.MetadataRequestTopic(name=n) for n in names],
                             allow_auto_topic_creation=allow)


def test_metadata_auto_creates_with_default_partitions_and_writes_a_record():
    cat = catalog(default_partitions=3)
    writes, resp = cat.metadata(md("orders"), 12)
    assert [(t.name, t.error_code, len(t.partitions)) for t in resp.topics] == [("orders", 0, 3)]
    assert resp.brokers[0].host == "127.0.0.1" and resp.brokers[0].port == 9092
    assert resp.controller_id == 0 and resp.cluster_id == "herd-cluster"
    (shard, key, value), = writes
    assert shard == 0 and is_topic_record(key) and value is not None
    p = resp.topics[0].partitions[1]
    assert (p.partition_index, p.leader_id, p.replica_nodes, p.isr_nodes) == (1, 0, [0], [0])
    # the second time it exists: no write
    writes, resp = cat.metadata(md("orders"), 12)
    assert writes == [] and resp.topics[0].error_code == 0


def test_metadata_respects_auto_create_off_and_client_opt_out():
    cat = catalog(auto_create_topics=False)
    writes, resp = cat.metadata(md("x"), 9)
    assert writes == [] and resp.topics[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    cat = catalog()
    writes, resp = cat.metadata(md("x", allow=False), 9)
    assert writes == [] and resp.topics[0].error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    # v0-3 have no opt-out flag: creation follows the server setting
    writes, resp = cat.metadata(md("x", allow=False), 3)
    assert len(writes) == 1 and resp.topics[0].error_code == 0


def test_metadata_all_topics_null_v1_and_empty_v0():
    cat = catalog()
    cat.metadata(md("b", "a"), 1)
    _, resp = cat.metadata(m.MetadataRequest(topics=None), 1)
    assert [t.name for t in resp.topics] == ["a", "b"]
    _, resp = cat.metadata(m.MetadataRequest(topics=[]), 0)
    assert [t.name for t in resp.topics] == ["a", "b"]
    _, resp = cat.metadata(m.MetadataRequest(topics=[]), 1)
    assert resp.topics == []


def test_invalid_topic_names_are_refused():
    assert validate_topic_name("ok.topic_1-x") is None
    for bad in ("", ".", "..", "a b", "x" * 250, "é"):
        assert validate_topic_name(bad) is not None
    writes, resp = catalog().metadata(md("bad name"), 9)
    assert writes == [] and resp.topics[0].error_code == E.INVALID_TOPIC_EXCEPTION


def test_topics_survive_replay_with_their_ids():
    cat = catalog()
    writes, resp = cat.create_topics(m.CreateTopicsRequest(topics=[
        m.CreateTopicsRequestCreatableTopic(name="t", num_partitions=4, replication_factor=1)]), 7)
    assert resp.topics[0].error_code == 0 and resp.topics[0].num_partitions == 4
    fresh = catalog()
    for _, key, value in writes:
        fresh.replay(key, value)
    assert fresh.topics["t"].partitions == 4
    assert fresh.topics["t"].topic_id == resp.topics[0].topic_id != bytes(16)


def test_create_topics_errors():
    cat = catalog()
    cat.create_topics(m.CreateTopicsRequest(topics=[m.CreateTopicsRequestCreatableTopic(
        name="exists", num_partitions=1, replication_factor=-1)]), 5)
    ct = m.CreateTopicsRequestCreatableTopic
    writes, resp = cat.create_topics(m.CreateTopicsRequest(topics=[
        ct(name="exists", num_partitions=1, replication_factor=1),
        ct(name="r3", num_partitions=1, replication_factor=3),
        ct(name="zero", num_partitions=0, replication_factor=1),
        ct(name="bad/name", num_partitions=1, replication_factor=1),
        ct(name="dflt", num_partitions=-1, replication_factor=-1),
    ]), 5)
    codes = {t.name: t.error_code for t in resp.topics}
    assert codes == {"exists": E.TOPIC_ALREADY_EXISTS, "r3": E.INVALID_REPLICATION_FACTOR,
                     "zero": E.INVALID_PARTITIONS, "bad/name": E.INVALID_TOPIC_EXCEPTION, "dflt": E.NONE}
    assert len(writes) == 1 and cat.topics["dflt"].partitions == 1


def test_create_topics_validate_only_writes_nothing():
    cat = catalog()
    writes, resp = cat.create_topics(m.CreateTopicsRequest(validate_only=True, topics=[
        m.CreateTopicsRequestCreatableTopic(name="v", num_partitions=2, replication_factor=1)]), 5)
    assert writes == [] and resp.topics[0].error_code == 0 and "v" not in cat.topics


def test_find_coordinator_single_and_batched():
    cat = catalog()
    r = cat.find_coordinator(m.FindCoordinatorRequest(key="g", key_type=0), 3)
    assert (r.error_code, r.node_id, r.host, r.port) == (0, 0, "127.0.0.1", 9092)
    r = cat.find_coordinator(m.FindCoordinatorRequest(key="txn", key_type=1), 3)
    assert r.error_code == E.INVALID_REQUEST and "consumer groups only" in r.error_message
    r = cat.find_coordinator(m.FindCoordinatorRequest(coordinator_keys=["a", "", "b"], key_type=0), 4)
    assert [(c.key, c.error_code, c.node_id) for c in r.coordinators] == [("a", 0, 0), ("", 0, 0), ("b", 0, 0)]
    # the empty group id is a group like any other (Kafka's getCoordinator has no check; OffsetCommit
    # and OffsetFetch accept it)
    r = cat.find_coordinator(m.FindCoordinatorRequest(key="", key_type=0), 3)
    assert (r.error_code, r.node_id, r.port) == (0, 0, 9092)


INVALID_REQUEST_MESSAGE = ("This most likely occurs because of a request being malformed by the client "
                           "library or the message was sent to an incompatible broker. See the broker "
                           "logs for more details.")


def test_find_coordinator_error_messages_are_kafkas():
    """compatibility.md, formerly KD-1 (measured on Kafka 4.4): v1-3 carry Errors.message():
    "NONE" on success, the default message on an error; at v4+ each key's own answer carries ""
    and an unknown key type (a whole-request error in Kafka) the default message on every key."""
    cat = catalog()
    for v in (1, 2, 3):
        r = cat.find_coordinator(m.FindCoordinatorRequest(key="g", key_type=0), v)
        assert (r.error_code, r.error_message) == (0, "NONE")
        for key_type in (2, 5, -1):  # share groups (no share coordinator) and unknown types
            r = cat.find_coordinator(m.FindCoordinatorRequest(key="g", key_type=key_type), v)
            assert (r.error_code, r.error_message, r.node_id, r.host, r.port) == (
                E.INVALID_REQUEST, INVALID_REQUEST_MESSAGE, -1, "", -1)
    r = cat.find_coordinator(m.FindCoordinatorRequest(key="g"), 0)
    assert r.error_code == 0  # v0 has no key type and no message
    for v in (4, 5, 6):
        req = m.FindCoordinatorRequest(coordinator_keys=["g", ""], key_type=0)
        assert [(c.error_code, c.error_message) for c in cat.find_coordinator(req, v).coordinators] == [
            (0, ""), (0, "")]
        req = m.FindCoordinatorRequest(coordinator_keys=["g"], key_type=2)
        assert [(c.error_code, c.error_message, c.node_id) for c in cat.find_coordinator(req, v).coordinators] == [
            (E.INVALID_REQUEST, "", -1)]
        req = m.FindCoordinatorRequest(coordinator_keys=["g", "h"], key_type=7)
        assert [(c.error_code, c.error_message) for c in cat.find_coordinator(req, v).coordinators] == [
            (E.INVALID_REQUEST, INVALID_REQUEST_MESSAGE)] * 2
    # transactions: herd has no transaction coordinator and says so (compatibility.md OP-4)
    r = cat.find_coordinator(m.FindCoordinatorRequest(key="txn", key_type=1), 3)
    assert r.error_code == E.INVALID_REQUEST and "transactions" in r.error_message


def test_list_offsets_and_fetch_answer_as_an_empty_log():
    cat = catalog(topics=(("t", 2),))
    assert len(cat.configured_topics()) == 1 and cat.configured_topics() == []
    lo = m.ListOffsetsRequest(topics=[m.ListOffsetsRequestListOffsetsTopic(name="t", partitions=[
        m.ListOffsetsRequestListOffsetsPartition(partition_index=0, timestamp=-1),
        m.ListOffsetsRequestListOffsetsPartition(partition_index=7, timestamp=-2)])])
    r = cat.list_offsets(lo, 5)
    (p0, p7), = [t.partitions for t in r.topics]
    assert (p0.error_code, p0.offset) == (0, 0) and p7.error_code == E.UNKNOWN_TOPIC_OR_PARTITION
    assert cat.list_offsets(lo, 0).topics[0].partitions[0].old_style_offsets == [0]
    fr = m.FetchRequest(topics=[m.FetchRequestFetchTopic(topic="t", partitions=[
        m.FetchRequestFetchPartition(partition=1, fetch_offset=42)])])
    pd = cat.fetch(fr, 11).responses[0].partitions[0]
    assert (pd.error_code, pd.high_watermark, pd.records) == (0, 42, b"")
    tid = cat.topics["t"].topic_id
    fr13 = m.FetchRequest(topics=[m.FetchRequestFetchTopic(topic_id=tid, partitions=[
        m.FetchRequestFetchPartition(partition=0, fetch_offset=0)])])
    assert cat.fetch(fr13, 13).responses[0].partitions[0].error_code == 0
    fr13.topics[0].topic_id = bytes(range(16))
    assert cat.fetch(fr13, 13).responses[0].partitions[0].error_code == E.UNKNOWN_TOPIC_ID


def test_list_offsets_special_timestamps_of_an_empty_log():
    # latest (-1), earliest (-2), earliest local (-4): offset 0; max timestamp (-3) finds no record
    # and nothing is tiered (-5): offset -1, as Kafka answers for an empty log
    cat = catalog(topics=(("t", 1),))
    cat.configured_topics()
    want = {-1: (0, 0), -2: (0, 0), -4: (0, 0), -3: (-1, -1), -5: (-1, -1), 1_700_000_000_000: (-1, -1)}
    for ts, (offset, epoch) in want.items():
        lo = m.ListOffsetsRequest(topics=[m.ListOffsetsRequestListOffsetsTopic(name="t", partitions=[
            m.ListOffsetsRequestListOffsetsPartition(partition_index=0, timestamp=ts)])])
        p = cat.list_offsets(lo, 9).topics[0].partitions[0]
        assert (p.error_code, p.offset, p.leader_epoch, p.timestamp) == (0, offset, epoch, -1), ts


def test_authorized_operations_are_everything_a_resource_supports_when_asked():
    cat = catalog(topics=(("t", 1),))
    cat.configured_topics()
    req = m.MetadataRequest(topics=[m.MetadataRequestTopic(name="t"), m.MetadataRequestTopic(name="gone")],
                            allow_auto_topic_creation=False, include_topic_authorized_operations=True,
                            include_cluster_authorized_operations=True)
    _, r = cat.metadata(req, 10)
    t, gone = r.topics
    # READ WRITE CREATE DELETE ALTER DESCRIBE DESCRIBE_CONFIGS ALTER_CONFIGS
    assert t.topic_authorized_operations == 0b1101_1111_1000
    assert gone.error_code == E.UNKNOWN_TOPIC_OR_PARTITION and gone.topic_authorized_operations == -2147483648
    # CREATE ALTER DESCRIBE CLUSTER_ACTION DESCRIBE_CONFIGS ALTER_CONFIGS IDEMPOTENT_WRITE
    assert r.cluster_authorized_operations == 0b1_1111_1010_0000
    _, plain = cat.metadata(md("t"), 10)
    assert plain.topics[0].topic_authorized_operations == -2147483648
    assert plain.cluster_authorized_operations == -2147483648
    dc = cat.describe_cluster(m.DescribeClusterRequest(include_cluster_authorized_operations=True), 1)
    assert dc.error_code == 0 and dc.cluster_authorized_operations == 0b1_1111_1010_0000
    assert cat.describe_cluster(m.DescribeClusterRequest(), 1).cluster_authorized_operations == -2147483648


def test_describe_cluster_refuses_the_controller_endpoint_type():
    cat = catalog()
    for endpoint, code in ((1, E.NONE), (2, E.MISMATCHED_ENDPOINT_TYPE), (7, E.UNSUPPORTED_ENDPOINT_TYPE)):
        r = cat.describe_cluster(m.DescribeClusterRequest(endpoint_type=endpoint), 1)
        assert r.error_code == code, endpoint
        assert (r.brokers != []) == (code == E.NONE)


def test_topic_ids_are_stable_and_metadata_v12_answers_by_id():
    cat = catalog(topics=(("t", 2),))
    writes = cat.configured_topics()
    tid = cat.topics["t"].topic_id
    assert tid != bytes(16) and len(tid) == 16
    # replayed into a fresh catalog: the same id, and nothing to write again
    fresh = catalog(topics=(("t", 2),))
    for _, k, v in writes:
        fresh.replay(k, v)
    assert fresh.configured_topics() == [] and fresh.topics["t"].topic_id == tid
    _, r = fresh.metadata(md("t"), 12)
    assert r.topics[0].topic_id == tid
    r = m.MetadataResponse.decode(r.encode(12), 12)
    assert r.topics[0].topic_id == tid and r.topics[0].name == "t"
    _, r = fresh.metadata(m.MetadataRequest(topics=[m.MetadataRequestTopic(topic_id=tid, name=None)]), 12)
    assert (r.topics[0].error_code, r.topics[0].name, len(r.topics[0].partitions)) == (0, "t", 2)
    _, r = fresh.metadata(m.MetadataRequest(topics=[m.MetadataRequestTopic(topic_id=bytes(range(16)), name=None)]), 12)
    assert r.topics[0].error_code == E.UNKNOWN_TOPIC_ID
    assert fresh.get("t") == (tid, 2) and list(fresh.names()) == ["t"] and fresh.get("x") is None


def test_a_topic_without_an_id_gets_one_minted_once_durably_and_a_configured_topic_grows():
    from coordinator.core.catalog import Topic, topic_key, topic_value

    cat = catalog(topics=(("t", 2), ("u", 4)))
    cat.replay(topic_key("t"), topic_value(Topic("t", 2, bytes(16))))  # a record with the nil id
    cat.replay(topic_key("u"), topic_value(Topic("u", 1, b"u" * 16)))
    writes = cat.configured_topics()
    minted = cat.topics["t"].topic_id
    assert minted != bytes(16)
    assert cat.topics["u"].partitions == 4 and cat.topics["u"].topic_id == b"u" * 16  # grown, same id
    again = catalog(topics=(("t", 2), ("u", 4)))
    for _, k, v in [(0, topic_key("t"), topic_value(Topic("t", 2, bytes(16)))),
                    (0, topic_key("u"), topic_value(Topic("u", 1, b"u" * 16))), *writes]:
        again.replay(k, v)
    assert again.configured_topics() == []  # once: the minted id and the growth are durable
    assert again.topics["t"].topic_id == minted and again.topics["u"].partitions == 4
    shrink = catalog(topics=(("u", 2),))
    shrink.replay(topic_key("u"), topic_value(Topic("u", 4, b"u" * 16)))
    assert shrink.configured_topics() == [] and shrink.topics["u"].partitions == 4  # never shrinks
