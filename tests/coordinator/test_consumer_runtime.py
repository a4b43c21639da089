"""KIP-848 through the runtime: a ConsumerGroupHeartbeat's answer waits until its records are
durable, a restart replays the consumer group from the store, and a topic created in the catalog
moves the groups subscribed to it (topics_changed)."""
from __future__ import annotations

import asyncio

from coordinator.config import Config
from coordinator.core.catalog import Catalog
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.versions import CONSUMER_GROUP_HEARTBEAT, CREATE_TOPICS
from coordinator.runtime import Runtime
from protocol import messages as m
from tests.coordinator.test_runtime_shards import FakeStore, N, Token, settle


class DeferredStore(FakeStore):
    """Keeps what is submitted (replayable); durability is reported only by :meth:`durable`."""

    def __init__(self):
        super().__init__(owned=list(range(N)))
        for gate in self.gates.values():
            gate.set()
        self.log: dict[int, list] = {sid: [] for sid in range(N)}
        self.pending: list = []

    def submit(self, shard_id, entries):
        self.log[shard_id].extend(entries)
        seq = super().submit(shard_id, entries)
        return seq

    def flush(self):
        self.pending.extend(self.staged)
        self.staged = []
        return []  # nothing is durable yet

    def durable(self):
        done, self.pending = self.pending, []
        self.listener([(sid, seq, None) for sid, seq in done])

    async def load(self, shard_id):
        return list(self.log[shard_id])


def runtime(store, **kw) -> Runtime:
    config = Config(offsets_partitions=N, initial_rebalance_delay_ms=0, topics=(("t", 4),), **kw)
    return Runtime(config, GroupCoordinator(config.group_config(), node_id=0), Catalog(config, node_id=0), store)


def cghb(rt, req, version=1):
    token = Token(CONSUMER_GROUP_HEARTBEAT, version, req)
    rt.dispatch(token, CONSUMER_GROUP_HEARTBEAT, version, req, "cli", "/127.0.0.1")
    return token


async def start(rt):
    await rt.load_owned()
    rt.start(asyncio.get_running_loop())
    await settle()
    rt.store.durable()
    await settle()


async def test_the_heartbeat_answer_waits_for_its_records_and_a_restart_replays_the_group():
    store = DeferredStore()
    rt = runtime(store)
    await start(rt)
    req = m.ConsumerGroupHeartbeatRequest(group_id="g", member_id="m-1", member_epoch=0, rebalance_timeout_ms=5000,
                                          subscribed_topic_names=["t"], topic_partitions=[])
    token = cghb(rt, req)
    await settle()
    assert token.held and token.responses == []  # records staged, not durable: no answer yet
    store.durable()
    await settle()
    (resp,) = token.responses
    assert (resp.error_code, resp.member_id, resp.member_epoch) == (0, "m-1", 2)
    assert sorted(resp.assignment.topic_partitions[0].partitions) == [0, 1, 2, 3]
    # a steady heartbeat writes nothing and is answered at once
    owned = [m.ConsumerGroupHeartbeatRequestTopicPartitions(tp.topic_id, tp.partitions)
             for tp in resp.assignment.topic_partitions]
    t2 = cghb(rt, m.ConsumerGroupHeartbeatRequest(group_id="g", member_id="m-1", member_epoch=2,
                                                 topic_partitions=owned))
    await settle()
    assert t2.responses and t2.responses[0].error_code == 0 and t2.responses[0].member_epoch == 2
    rt.shutdown()
    # restart: a new runtime over the same store resumes the member at its epoch
    rt2 = runtime(store)
    await start(rt2)
    d = rt2.groups.describe_group("g")
    assert d["type"] == "consumer" and [(mm["member_id"], mm["member_epoch"]) for mm in d["members"]] == [("m-1", 2)]
    t3 = cghb(rt2, m.ConsumerGroupHeartbeatRequest(group_id="g", member_id="m-1", member_epoch=2,
                                                  topic_partitions=owned))
    await settle()
    assert t3.responses[0].error_code == 0 and t3.responses[0].member_epoch == 2
    rt2.shutdown()


async def test_a_topic_created_moves_the_groups_subscribed_to_it_by_regex():
    store = DeferredStore()
    rt = runtime(store)
    await start(rt)
    token = cghb(rt, m.ConsumerGroupHeartbeatRequest(group_id="g", member_id="m-1", member_epoch=0,
                                                     rebalance_timeout_ms=5000, subscribed_topic_regex="new.*",
                                                     topic_partitions=[]))
    await settle()
    store.durable()
    await settle()
    (resp,) = token.responses
    assert resp.error_code == 0 and resp.assignment.topic_partitions == []
    epoch = rt.groups.describe_group("g")["group_epoch"]
    ct = m.CreateTopicsRequest(topics=[m.CreateTopicsRequestCreatableTopic(name="new-1", num_partitions=3,
                                                                          replication_factor=1)])
    t = Token(CREATE_TOPICS, 5, ct)
    rt.dispatch(t, CREATE_TOPICS, 5, ct, "cli", "/127.0.0.1")
    await settle()
    store.durable()
    await settle()
    assert t.responses[0].topics[0].error_code == 0
    assert rt.groups.describe_group("g")["group_epoch"] == epoch + 1
    tok = cghb(rt, m.ConsumerGroupHeartbeatRequest(group_id="g", member_id="m-1", member_epoch=resp.member_epoch,
                                                   topic_partitions=[]))
    await settle()
    store.durable()
    await settle()
    (r2,) = tok.responses
    assert r2.error_code == 0 and sorted(r2.assignment.topic_partitions[0].partitions) == [0, 1, 2]
    rt.shutdown()
