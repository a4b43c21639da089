"""A manual-clock harness around GroupCoordinator, shared by the group tests (and its own tests).

Every reply the coordinator produces is encoded at the version it was asked for (and decoded back),
so each test also checks that responses are wire-valid for their version. Tokens are
``(api_key, version, n)``.
"""
from __future__ import annotations

from itertools import count

from coordinator.clock import ManualClock
from coordinator.config import Config
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.result import Result
from protocol import errors
from protocol.consumer import encode_subscription
from protocol.messages import (
    ConsumerProtocolSubscription,
    DeleteGroupsRequest,
    DescribeGroupsRequest,
    HeartbeatRequest,
    HeartbeatResponse,
    JoinGroupRequest,
    JoinGroupRequestProtocol,
    LeaveGroupRequest,
    LeaveGroupRequestMemberIdentity,
    ListGroupsRequest,
    OffsetCommitRequest,
    OffsetCommitRequestPartition,
    OffsetCommitRequestTopic,
    OffsetDeleteRequest,
    OffsetDeleteRequestPartition,
    OffsetDeleteRequestTopic,
    OffsetFetchRequest,
    OffsetFetchRequestGroup,
    OffsetFetchRequestTopic,
    OffsetFetchRequestTopics,
    SyncGroupRequest,
    SyncGroupRequestAssignment,
)

JOIN, SYNC, HB, LEAVE, COMMIT, FETCH, DESCRIBE, LIST, DELETE, ODELETE = 11, 14, 12, 13, 8, 9, 15, 16, 42, 47


def sub(*topics: str) -> bytes:
    """A real consumer-protocol subscription blob."""
    return encode_subscription(ConsumerProtocolSubscription(topics=list(topics)), 1)


DEFAULT_PROTOCOLS = (("range", sub("t")),)


class Harness:
    def __init__(self, auto_timers: bool = True, **config):
        settings = dict(initial_rebalance_delay_ms=0, min_session_timeout_ms=100, offsets_partitions=4)
        settings.update(config)
        self.config = Config(**settings).validate()
        self.clock = ManualClock(monotonic_ms=1_000)
        ids = count(1)
        self.gc = GroupCoordinator(self.config.group_config(), new_uuid=lambda: f"u{next(ids)}")
        self.gc.loaded(self.now, self.wall)
        self.auto_timers = auto_timers
        self.replies: dict = {}  # token -> response
        self.reply_times: dict = {}  # token -> monotonic time delivered
        self.writes: list = []
        self.results: list[Result] = []
        self.hold_later = False  # keep Result.later slices for run_later() instead of running them at once
        self.later: list = []
        self._n = count(1)

    # ---- plumbing ---------------------------------------------------------------------------

    @property
    def now(self) -> int:
        return self.clock.monotonic_ms()

    @property
    def wall(self) -> int:
        return self.clock.wall_ms()

    def absorb(self, result: Result) -> Result:
        self.results.append(result)
        self.writes.extend(result.writes)
        for token, resp in result.replies:
            assert token not in self.replies, f"token {token} answered twice"
            api_key, version, _ = token
            assert resp.API_KEY == api_key, (token, resp)
            raw = resp.encode(version)  # wire-valid at the version asked?
            type(resp).decode(raw, version)
            self.replies[token] = resp
            self.reply_times[token] = self.now
        if result.later:  # the rest of a big group's answers: at once, or when run_later() is called
            if self.hold_later:
                self.later.extend(result.later)
            else:
                for more in result.later:
                    self.absorb(more(self.now, self.wall))
        return result

    def run_later(self, slices: int | None = None) -> int:
        """Run held later slices (``hold_later``), oldest first, as the runtime's next loop turns
        would: ``slices`` of them, or until none is left. -> how many ran."""
        ran = 0
        while self.later and (slices is None or ran < slices):
            more = self.later.pop(0)
            held, self.hold_later = self.hold_later, True
            try:
                self.absorb(more(self.now, self.wall))
            finally:
                self.hold_later = held
            ran += 1
        return ran

    def send(self, api_key: int, version: int, request, client_id: str = "cli", host: str = "/10.0.0.1"):
        token = (api_key, version, next(self._n))
        if api_key == HB:  # Heartbeat's one entry point answers with an error code only
            resp = HeartbeatResponse(error_code=self.gc.heartbeat(version, request, self.now))
            self.absorb(Result([], [(token, resp)]))
        else:
            self.absorb(self.gc.handle(api_key, version, request, token, self.now, self.wall, client_id, host))
        if self.auto_timers:
            self.fire()
        return token

    def call(self, api_key: int, version: int, request, **kw):
        token = self.send(api_key, version, request, **kw)
        return self.replies.get(token)

    def reply(self, token):
        return self.replies.get(token)

    def fire(self) -> None:
        """Run every timer due now (as the runtime's call_at would)."""
        while True:
            d = self.gc.next_deadline()
            if d is None or d > self.now:
                return
            self.absorb(self.gc.on_timers(self.now, self.wall))

    def advance(self, ms: int) -> None:
        """Move time forward, firing timers at their exact deadlines on the way."""
        target = self.now + ms
        while True:
            d = self.gc.next_deadline()
            if d is None or d > target:
                break
            if d > self.now:
                self.clock.advance(d - self.now)
            self.absorb(self.gc.on_timers(self.now, self.wall))
        self.clock.advance(target - self.now)

    def group(self, group_id: str):
        return self.gc._shard(group_id).classic.groups.get(group_id)

    def state(self, group_id: str) -> str:
        g = self.group(group_id)
        return "Dead" if g is None else g.state

    # ---- request builders ---------------------------------------------------------------------

    def join(self, group_id: str, member_id: str = "", *, version: int = 5, session: int = 10_000,
             rebalance: int = 30_000, protocols=DEFAULT_PROTOCOLS, instance: str | None = None,
             ptype: str = "consumer", client_id: str = "cli", host: str = "/10.0.0.1",
             reason: str | None = None):
        req = JoinGroupRequest(group_id=group_id, session_timeout_ms=session,
                               rebalance_timeout_ms=rebalance if version >= 1 else -1, member_id=member_id,
                               group_instance_id=instance if version >= 5 else None, protocol_type=ptype,
                               protocols=[JoinGroupRequestProtocol(n, m) for n, m in protocols],
                               reason=reason if version >= 8 else None)
        return self.send(JOIN, version, req, client_id=client_id, host=host)

    def join_dynamic(self, group_id: str, **kw) -> tuple[str, object]:
        """A dynamic member's first join including the KIP-394 dance (v4+). Returns (member_id, token)."""
        version = kw.get("version", 5)
        t = self.join(group_id, **kw)
        resp = self.reply(t)
        if version >= 4 and kw.get("instance") is None:
            assert resp is not None and resp.error_code == errors.MEMBER_ID_REQUIRED, resp
            mid = resp.member_id
            t = self.join(group_id, mid, **kw)
            return mid, t
        if resp is not None and resp.member_id:
            return resp.member_id, t
        # parked (v0-3 or static): find the member id from the group
        g = self.group(group_id)
        mid = [m.member_id for m in g.members.values() if m.join is not None and m.join.token == t][0]
        return mid, t

    def sync(self, group_id: str, generation: int, member_id: str, assignments: dict | None = None, *,
             version: int = 3, instance: str | None = None, ptype: str | None = None,
             pname: str | None = None):
        if version >= 5:
            ptype = ptype if ptype is not None else "consumer"
            pname = pname if pname is not None else "range"
        req = SyncGroupRequest(group_id=group_id, generation_id=generation, member_id=member_id,
                               group_instance_id=instance if version >= 3 else None,
                               protocol_type=ptype if version >= 5 else None,
                               protocol_name=pname if version >= 5 else None,
                               assignments=[SyncGroupRequestAssignment(k, v)
                                            for k, v in (assignments or {}).items()])
        return self.send(SYNC, version, req)

    def heartbeat(self, group_id: str, generation: int, member_id: str, *, version: int = 3,
                  instance: str | None = None):
        req = HeartbeatRequest(group_id=group_id, generation_id=generation, member_id=member_id,
                               group_instance_id=instance if version >= 3 else None)
        return self.call(HB, version, req)

    def leave(self, group_id: str, *members, version: int = 3):
        """``members``: member ids or (member_id, instance_id[, reason]) tuples."""
        if version < 3:
            (mid,) = members
            return self.call(LEAVE, version, LeaveGroupRequest(group_id=group_id, member_id=mid))
        idents = []
        for m in members:
            if isinstance(m, tuple):
                reason = m[2] if len(m) > 2 and version >= 5 else None
                idents.append(LeaveGroupRequestMemberIdentity(m[0], m[1], reason))
            else:
                idents.append(LeaveGroupRequestMemberIdentity(m, None, None))
        return self.call(LEAVE, version, LeaveGroupRequest(group_id=group_id, members=idents))

    def commit(self, group_id: str, offsets: dict, *, generation: int = -1, member_id: str = "",
               version: int = 8, instance: str | None = None, retention: int = -1, metadata: str = "",
               commit_ts: int = -1):
        """``offsets``: {(topic, partition): offset}."""
        topics: dict[str, list] = {}
        for (topic, p), off in offsets.items():
            topics.setdefault(topic, []).append(OffsetCommitRequestPartition(
                p, off, -1 if version < 6 else 7, commit_ts if version == 1 else -1, metadata))
        req = OffsetCommitRequest(group_id=group_id,
                                  generation_id_or_member_epoch=generation if version >= 1 else -1,
                                  member_id=member_id if version >= 1 else "",
                                  group_instance_id=instance if version >= 7 else None,
                                  retention_time_ms=retention if 2 <= version <= 4 else -1,
                                  topics=[OffsetCommitRequestTopic(t, ps) for t, ps in topics.items()])
        return self.call(COMMIT, version, req)

    def fetch(self, group_id: str, wanted: dict | None = None, *, version: int = 7):
        """``wanted``: {topic: [partitions]} or None (all; v2+). Returns (error, {(t, p): (offset, meta)})."""
        if version >= 8:
            topics = None if wanted is None else [OffsetFetchRequestTopics(t, ps) for t, ps in wanted.items()]
            req = OffsetFetchRequest(groups=[OffsetFetchRequestGroup(group_id, None, -1, topics)])
            resp = self.call(FETCH, version, req)
            (g,) = resp.groups
            return g.error_code, {(t.name, p.partition_index): (p.committed_offset, p.metadata)
                                  for t in g.topics for p in t.partitions}
        topics = None if wanted is None else [OffsetFetchRequestTopic(t, ps) for t, ps in wanted.items()]
        resp = self.call(FETCH, version, OffsetFetchRequest(group_id=group_id, topics=topics))
        return resp.error_code, {(t.name, p.partition_index): (p.committed_offset, p.metadata)
                                 for t in resp.topics for p in t.partitions}

    def describe(self, *group_ids: str, version: int = 5):
        return self.call(DESCRIBE, version, DescribeGroupsRequest(groups=list(group_ids))).groups

    def list_groups(self, states=(), types=(), version: int = 5):
        return self.call(LIST, version, ListGroupsRequest(states_filter=list(states) if version >= 4 else [],
                                                          types_filter=list(types) if version >= 5 else []))

    def delete_groups(self, *group_ids: str, version: int = 2):
        resp = self.call(DELETE, version, DeleteGroupsRequest(list(group_ids)))
        return {r.group_id: r.error_code for r in resp.results}

    def offset_delete(self, group_id: str, parts: dict):
        req = OffsetDeleteRequest(group_id, [
            OffsetDeleteRequestTopic(t, [OffsetDeleteRequestPartition(p) for p in ps])
            for t, ps in parts.items()])
        return self.call(ODELETE, 0, req)

    # ---- scenarios ----------------------------------------------------------------------------

    def form_group(self, group_id: str, n: int, **kw) -> tuple[list[str], int]:
        """``n`` dynamic members join one after another and the group goes Stable (leader assigns
        each member its own id as the assignment). Returns (member ids, generation)."""
        mids = []
        for i in range(n):
            mid, t = self.join_dynamic(group_id, client_id=f"c{len(mids)}", **kw)
            mids.append(mid)
            if i < n - 1 and self.reply(t) is None:
                pass
        # every earlier member must rejoin once the group is rebalancing
        for _ in range(3):
            pending = [m for m in mids if self.group(group_id).members.get(m) is not None
                       and self.group(group_id).members[m].join is None]
            if self.state(group_id) != "PreparingRebalance" or not pending:
                break
            for m in pending:
                self.join(group_id, m, **kw)
        assert self.state(group_id) == "CompletingRebalance", self.state(group_id)
        g = self.group(group_id)
        gen = g.generation
        leader = g.leader_id
        sync_version = kw.get("version", 5) if kw.get("version", 5) <= 5 else 5
        t = self.sync(group_id, gen, leader, {m: m.encode() for m in mids}, version=min(sync_version, 5))
        assert self.reply(t).error_code == 0
        for m in mids:
            if m != leader:
                t = self.sync(group_id, gen, m, version=min(sync_version, 5))
                assert self.reply(t).assignment == m.encode()
        assert self.state(group_id) == "Stable"
        return mids, gen


# ---- tests of the harness itself ---------------------------------------------------------------

def test_harness_forms_a_group_and_encodes_every_reply():
    h = Harness()
    mids, gen = h.form_group("g", 3)
    assert gen >= 1 and len(mids) == 3
    assert h.state("g") == "Stable"
    assert h.replies  # all were encoded at their versions by absorb()


def test_harness_advance_fires_at_exact_deadlines():
    h = Harness()
    mids, gen = h.form_group("g", 1, session=1_000)
    h.advance(999)
    assert h.state("g") == "Stable"
    h.advance(1)
    assert h.state("g") == "Empty"
