"""The runtime's shard states with a store that is not the file log: requests for a shard this node
does not own get NOT_COORDINATOR, for one being loaded COORDINATOR_LOAD_IN_PROGRESS; a write the
store refuses because another node owns the shard now (ShardFencedError) unloads it, an I/O
failure (ShardFailedError) stops it. With the file store none of this happens (every shard is
loaded at start), so it is tested here with a fake store."""
from __future__ import annotations

import asyncio

import pytest

from coordinator.config import Config
from coordinator.core import records as R
from coordinator.core.catalog import Catalog
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.partitioning import shard_for
from coordinator.core.versions import JOIN_GROUP, LIST_GROUPS, OFFSET_COMMIT
from coordinator.runtime import ACTIVE, FAILED, LOADING, NOT_OWNED, Runtime
from coordinator.store import ShardFailedError, ShardFencedError, Store
from protocol import errors as E
from protocol import messages as m

N = 4


class FakeStore(Store):
    """Owns ``owned``; ``load`` waits for the shard's gate; ``flush`` settles everything at once,
    failing a shard's writes with ``fail[shard]`` when set."""

    def __init__(self, owned):
        self.num_shards = N
        self.owned = owned
        self.gates = {sid: asyncio.Event() for sid in range(N)}
        self.seqs = [0] * N
        self.staged: list = []
        self.fail: dict[int, BaseException] = {}
        self.entries: dict[int, list] = {}
        self.listener = None

    async def open(self):
        pass

    def owned_shards(self):
        return self.owned

    async def load(self, shard_id):
        await self.gates[shard_id].wait()
        return self.entries.pop(shard_id, [])

    def submit(self, shard_id, entries):
        self.seqs[shard_id] += 1
        self.staged.append((shard_id, self.seqs[shard_id]))
        return self.seqs[shard_id]

    def flush(self):
        staged, self.staged = self.staged, []
        return [(sid, seq, self.fail.get(sid)) for sid, seq in staged]

    def set_listener(self, listener):
        self.listener = listener

    async def compact(self, shard_id):
        return None

    def stats(self):
        return []

    async def close(self):
        pass


class Token:
    def __init__(self, api_key, version, request):
        self.api_key, self.api_version, self.request = api_key, version, request
        self.responses: list = []
        self.timer = None
        self.held = False

    def reply(self, response):
        self.responses.append(response)

    def park(self, timer):
        self.timer = timer

    def hold(self):
        self.held = True


def group_in(shard: int, nth: int = 0) -> str:
    return [g for g in (f"g{i}" for i in range(1000)) if shard_for(g, N) == shard][nth]


def commit(group: str) -> m.OffsetCommitRequest:
    return m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, member_id="", topics=[
        m.OffsetCommitRequestTopic("t", [m.OffsetCommitRequestPartition(0, 5)])])


def join(group: str, member_id: str = "") -> m.JoinGroupRequest:
    return m.JoinGroupRequest(group_id=group, session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
                              member_id=member_id, protocol_type="consumer",
                              protocols=[m.JoinGroupRequestProtocol("range", b"")])


def runtime_with(store) -> Runtime:
    config = Config(offsets_partitions=N, initial_rebalance_delay_ms=0)
    return Runtime(config, GroupCoordinator(config.group_config(), node_id=0), Catalog(config, node_id=0), store)


def send(rt: Runtime, api_key: int, version: int, request) -> Token:
    token = Token(api_key, version, request)
    rt.dispatch(token, api_key, version, request, "cli", "/127.0.0.1")
    return token


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


def commit_code(token: Token) -> int:
    (resp,) = token.responses
    return resp.topics[0].partitions[0].error_code


async def test_not_owned_shards_answer_not_coordinator_and_loading_ones_load_in_progress():
    store = FakeStore(owned=[0, 1])
    rt = runtime_with(store)
    rt.start(asyncio.get_running_loop())
    assert rt.shard_states == [NOT_OWNED] * N
    loading = asyncio.ensure_future(rt.load_owned())
    await settle()
    assert rt.shard_states == [LOADING, LOADING, NOT_OWNED, NOT_OWNED]
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(0)))
    await settle()
    assert commit_code(t) == E.COORDINATOR_LOAD_IN_PROGRESS
    assert send(rt, JOIN_GROUP, 5, join(group_in(1))).responses[0].error_code == E.COORDINATOR_LOAD_IN_PROGRESS
    hb = m.HeartbeatRequest(group_id=group_in(0), generation_id=1, member_id="x")
    assert rt.heartbeat(3, hb) == E.COORDINATOR_LOAD_IN_PROGRESS
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(2)))
    await settle()
    assert commit_code(t) == E.NOT_COORDINATOR
    store.gates[0].set()
    store.gates[1].set()
    stats = await asyncio.wait_for(loading, 5)
    assert stats["records"] == 0
    assert rt.shard_states == [ACTIVE, ACTIVE, NOT_OWNED, NOT_OWNED]
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(0)))
    await settle()
    assert commit_code(t) == E.NONE
    hb = m.HeartbeatRequest(group_id=group_in(3), generation_id=1, member_id="x")
    assert rt.heartbeat(3, hb) == E.NOT_COORDINATOR
    rt.shutdown()


async def test_a_fenced_write_unloads_the_shard_and_an_io_failure_stops_it():
    store = FakeStore(owned=range(N))
    for gate in store.gates.values():
        gate.set()
    rt = runtime_with(store)
    rt.start(asyncio.get_running_loop())
    await rt.load_owned()
    assert rt.shard_states == [ACTIVE] * N
    # a JoinGroup parked in shard 0 (v3: no member-id round trip; the group waits for no one else,
    # so park it behind a second member that has not rejoined)
    first = send(rt, JOIN_GROUP, 3, join(group_in(0)))
    await settle()
    (resp,) = first.responses
    assert resp.error_code == E.NONE
    second = send(rt, JOIN_GROUP, 3, join(group_in(0)))  # a new member: a rebalance, parked
    await settle()
    assert second.responses == []
    assert any(g["shard"] == 0 for g in rt.groups.list_groups())
    store.fail[0] = ShardFencedError(0, "epoch 7 > 6")
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(0, 1)))
    await settle()
    assert commit_code(t) == E.NOT_COORDINATOR
    assert rt.shard_states[0] == NOT_OWNED
    assert [r.error_code for r in second.responses] == [E.NOT_COORDINATOR]  # parked: answered
    assert not any(g["shard"] == 0 for g in rt.groups.list_groups())  # its state is forgotten
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(0)))
    await settle()
    assert commit_code(t) == E.NOT_COORDINATOR
    store.fail[1] = ShardFailedError(1, OSError(5, "Input/output error"))
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(1)))
    await settle()
    assert commit_code(t) == E.COORDINATOR_NOT_AVAILABLE
    assert rt.shard_states[1] == FAILED and rt.groups.failed_shards == [1]
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(1)))
    await settle()
    assert commit_code(t) == E.COORDINATOR_NOT_AVAILABLE
    t = send(rt, OFFSET_COMMIT, 8, commit(group_in(2)))  # the others keep working
    await settle()
    assert commit_code(t) == E.NONE
    rt.shutdown()


async def test_a_shard_unloaded_and_loaded_again_serves_what_the_store_holds():
    store = FakeStore(owned=[0])
    for gate in store.gates.values():
        gate.set()
    rt = runtime_with(store)
    rt.start(asyncio.get_running_loop())
    await rt.load_owned()
    gid = group_in(0)
    t = send(rt, OFFSET_COMMIT, 8, commit(gid))
    await settle()
    assert commit_code(t) == E.NONE and rt.groups.group_offsets(gid)["t"][0]["offset"] == 5
    rt.unload_shard(0)
    assert rt.shard_states[0] == NOT_OWNED and rt.groups.group_offsets(gid) == {}
    t = send(rt, OFFSET_COMMIT, 8, commit(gid))
    await settle()
    assert commit_code(t) == E.NOT_COORDINATOR
    # won back: the store has the record another node wrote meanwhile
    store.entries[0] = [(R.offset_commit_key(gid, "t", 0), R.offset_commit_value(42, -1, "", 0))]
    assert await rt.load_shard(0) == 1
    assert rt.shard_states[0] == ACTIVE and rt.groups.group_offsets(gid)["t"][0]["offset"] == 42
    t = send(rt, OFFSET_COMMIT, 8, commit(gid))
    await settle()
    assert commit_code(t) == E.NONE
    rt.shutdown()


def test_only_the_transitions_of_the_table_are_allowed():
    rt = runtime_with(FakeStore(owned=[]))
    rt.replay({}, owned=[0])
    assert rt.shard_states == [ACTIVE, NOT_OWNED, NOT_OWNED, NOT_OWNED]
    with pytest.raises(RuntimeError, match="active -> loading"):
        rt._move(0, LOADING)
    with pytest.raises(RuntimeError, match="not-owned -> active"):
        rt._move(1, ACTIVE)
    rt._move(0, FAILED)
    rt._move(0, NOT_OWNED)
    rt._move(0, LOADING)
    assert rt.shard_states[0] == LOADING


async def test_list_groups_lists_the_shards_this_node_serves_and_waits_for_loading_ones():
    """A cluster node lists the groups of its own shards (the others' nodes list theirs: the admin
    tool fans out); a shard of its own still loading fails the listing, retriably, as Kafka."""
    store = FakeStore(owned=[0])
    store.gates[0].set()
    rt = runtime_with(store)
    rt.start(asyncio.get_running_loop())
    await rt.load_owned()
    send(rt, OFFSET_COMMIT, 8, commit(group_in(0)))
    await settle()
    t = send(rt, LIST_GROUPS, 4, m.ListGroupsRequest(states_filter=[]))
    await settle()
    (resp,) = t.responses
    assert resp.error_code == E.NONE and [g.group_id for g in resp.groups] == [group_in(0)]
    loading = asyncio.ensure_future(rt.load_shard(1))  # its gate is closed: stays LOADING
    await settle()
    t = send(rt, LIST_GROUPS, 4, m.ListGroupsRequest(states_filter=[]))
    await settle()
    assert t.responses[0].error_code == E.COORDINATOR_LOAD_IN_PROGRESS
    store.gates[1].set()
    await asyncio.wait_for(loading, 5)
    t = send(rt, LIST_GROUPS, 4, m.ListGroupsRequest(states_filter=[]))
    await settle()
    assert t.responses[0].error_code == E.NONE
    rt.shutdown()
    t = send(rt, LIST_GROUPS, 4, m.ListGroupsRequest(states_filter=[]))
    assert t.responses[0].error_code == E.NOT_COORDINATOR
