"""The group coordinator facade the runtime calls: routes requests to shards, assembles answers.

Pure: no asyncio, no sockets, no disk, no clock. Time comes in as arguments, read by the runtime
from one :class:`~coordinator.clock.Clock`: ``now_ms`` is monotonic time (drives every timeout);
``wall_ms`` is wall-clock epoch ms (written into records as commit and state timestamps, shown by
the flight recorder). Tests pass a :class:`~coordinator.clock.ManualClock`'s readings.

Contract with the runtime
-------------------------
* Every operation returns a :class:`~coordinator.core.result.Result` (``handle``, ``on_timers``,
  ``shutdown``, ``refuse``/``fail_shard``/``unload``), except :meth:`GroupCoordinator.heartbeat`,
  whose whole answer is an error code (it writes nothing, parks nothing and depends on nothing
  durable; the edge answers it with cached bytes). Append ``result.writes`` to the store in order;
  send ``result.replies`` only once *all* of that result's writes are durable. Replies must also
  not overtake earlier, still pending writes of the shards in ``result.shards``.
* If writes fail, send ``result.failure_replies(code)`` instead of ``result.replies`` and stop the
  shard: :meth:`GroupCoordinator.fail_shard` (I/O failure: COORDINATOR_NOT_AVAILABLE until
  restart) or :meth:`GroupCoordinator.unload` (the shard is another node's now: NOT_COORDINATOR).
* After ``handle``/``on_timers``, re-arm the shard timer at :meth:`GroupCoordinator.next_check`
  (never later than :meth:`GroupCoordinator.next_deadline`) and call
  :meth:`GroupCoordinator.on_timers` when it passes (``loop.call_at``).
* Start-up: ``replay`` every record of the shards being loaded, then ``loaded(now_ms, wall_ms)``
  (also with nothing replayed: it arms the offset-retention cycle and session timers of loaded
  members) and they are served.
"""
from __future__ import annotations

import uuid

from coordinator.core import records
from coordinator.core.classic.group import STATES, Group
from coordinator.core.config import GroupConfig
from coordinator.core.consumer import records as consumer_records
from coordinator.core.consumer import validate_offset_fetch
from coordinator.core.consumer.group import MEMBER_STATES
from coordinator.core.partitioning import shard_for as _shard_for
from coordinator.core.responses import (
    consumer_described_group_error,
    described_group_error,
    error_response,
    offset_fetch_group_error,
)
from coordinator.core.result import NO_SHARDS, Result
from coordinator.core.shard import Shard
from coordinator.core.versions import (
    API_NAMES,
    CONSUMER_GROUP_DESCRIBE,
    CONSUMER_GROUP_HEARTBEAT,
    DELETE_GROUPS,
    DESCRIBE_GROUPS,
    GROUP_APIS,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    SUPPORTED,
    SYNC_GROUP,
)
from protocol import errors
from protocol.messages import (
    ConsumerGroupDescribeResponse,
    DeleteGroupsResponse,
    DeleteGroupsResponseDeletableGroupResult,
    DescribeGroupsResponse,
    ListGroupsResponse,
    OffsetFetchResponse,
    OffsetFetchResponseGroup,
    OffsetFetchResponsePartition,
    OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
)

__all__ = ["GroupCoordinator", "Result", "SUPPORTED_VERSIONS", "API_NAMES"]

# api key -> (min, max) version this coordinator answers (what ApiVersions advertises for them)
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {key: SUPPORTED[key] for key in GROUP_APIS}

_NONE = errors.NONE
_NO_SHARDS = NO_SHARDS
# Timer heap entries looked at per on_timers call (~1-2 ms of re-arming extended heartbeat deadlines
# on the machine measured); more is left for the next loop turn, with I/O served in between.
TIMER_STEPS_PER_CALL = 500
# A DescribeGroups (ConsumerGroupDescribe) describes groups until it has described this many members
# (and groups), then leaves the rest for later loop turns (Result.later): `kafka-consumer-groups
# --describe --all-groups` asks for every group of a coordinator in one request, and describing
# 1,000 groups of 10 members took ~30 ms of loop time in one go (bench/RESULTS.md 15.10).
DESCRIBE_SLICE_MEMBERS = 2048
_REPLAY_PREFIXES_MAX = 100_000  # bounds the replay cache when there are very many (group, topic) pairs


class GroupCoordinator:
    """All offsets partitions (shards) of this node. See the module docstring for the contract."""

    def __init__(self, config: GroupConfig, node_id: int = 0, new_uuid=None, topics=None):
        self.config = config
        self.node_id = node_id
        self._new_uuid = new_uuid or (lambda: str(uuid.uuid4()))
        # the topic catalog as consumer groups see it (get(name) -> (topic id, partitions) | None,
        # names()); the runtime plugs the catalog in (set_topics)
        self.topics = _Topics(topics)
        self.stats: dict[str, int] = {}
        self._n = config.offsets_partitions
        self.rebalance_listeners: list = []  # called with each completed rebalance's summary (RebalanceRecord.summary)
        self.shards = [self._new_shard(i) for i in range(self._n)]
        # True when some shard's earliest deadline may have moved earlier since next_deadline()
        # last looked (see Timers.on_push): the runtime re-arms its timer only then.
        self.timers_changed = True
        for shard in self.shards:
            shard.timers.on_push = self._timers_pushed
        self._closed = False
        self.skipped_records = 0
        self.misplaced_records = 0
        # replay: offset-key prefix (group + topic) -> (group, topic, owning shard); emptied by loaded()
        self._replay_prefixes: dict[bytes, tuple[str, str, int]] = {}
        self._dispatch = {
            JOIN_GROUP: self._join_group, SYNC_GROUP: self._sync_group,
            LEAVE_GROUP: self._leave_group, OFFSET_COMMIT: self._offset_commit,
            OFFSET_FETCH: self._offset_fetch,
            CONSUMER_GROUP_HEARTBEAT: self._consumer_group_heartbeat,
            CONSUMER_GROUP_DESCRIBE: self._consumer_group_describe,
            LIST_GROUPS: self._list_groups, DESCRIBE_GROUPS: self._describe_groups,
            DELETE_GROUPS: self._delete_groups, OFFSET_DELETE: self._offset_delete,
        }

    def _new_shard(self, shard_id: int) -> Shard:
        return Shard(shard_id, self.config, self._new_uuid, self.stats, self.rebalance_listeners,
                     topics=self.topics)

    def set_topics(self, topics) -> None:
        """The topic catalog consumer groups assign from (anything with ``get`` and ``names``)."""
        self.topics.source = topics

    # ---- routing --------------------------------------------------------------------------------

    def shard_for(self, group_id: str) -> int:
        return _shard_for(group_id, self._n)

    def _shard(self, group_id: str) -> Shard:
        return self.shards[_shard_for(group_id, self._n)]

    def _unavailable(self, shard: Shard) -> int:
        """The error a request routed to ``shard`` gets now, or NONE."""
        if self._closed:
            return errors.NOT_COORDINATOR
        return shard.refusal

    # ---- start-up -------------------------------------------------------------------------------

    def replay(self, shard_id: int, key: bytes, value: bytes | None) -> None:
        """Apply one record read back from shard ``shard_id``'s log. Record types this coordinator
        does not own (share/streams groups) are skipped and counted in
        ``skipped_records``; undecodable bytes raise :class:`coordinator.core.records.RecordError`."""
        if not 0 <= shard_id < self._n:
            raise ValueError(f"shard {shard_id} out of range (offsets_partitions={self._n})")
        plain = records.plain_offset_commit(key, value)
        if plain is not None:
            # the record herd writes for nearly every commit: the value is kept as it is, and the
            # group and topic are decoded once per (group, topic), not once per partition
            prefix, partition = plain
            known = self._replay_prefixes.get(prefix) or self._replay_prefix(prefix)
            if known is not None:
                gid, topic, owner = known
                if owner != shard_id:
                    self.misplaced_records += 1
                self.shards[owner].offsets.replay(gid, topic, partition, value)
                return
        if consumer_records.is_consumer_record(key):  # KIP-848 consumer group records (types 3-8)
            gid = consumer_records.decode(key, None)[1]
            owner = _shard_for(gid, self._n)
            if owner != shard_id:
                self.misplaced_records += 1
            self.shards[owner].consumer.replay(key, value)
            return
        rtype, key_obj = records.decode_key(key)
        if key_obj is None:
            self.skipped_records += 1
            return
        owner = _shard_for(key_obj.group, self._n)
        if owner != shard_id:
            # the data dir was written with another offsets_partitions: keep the record reachable
            self.misplaced_records += 1
        self.shards[owner].apply(rtype, key_obj, records.decode_value(rtype, value))

    def _replay_prefix(self, prefix: bytes) -> tuple[str, str, int] | None:
        """``(group, topic, owning shard)`` of an offset-key prefix, remembered while replaying."""
        names = records.decode_offset_key_prefix(prefix)
        if names is None:
            return None  # damaged: the generic decoder reports it
        if len(self._replay_prefixes) >= _REPLAY_PREFIXES_MAX:
            self._replay_prefixes.clear()
        known = self._replay_prefixes[prefix] = (*names, _shard_for(names[0], self._n))
        return known

    def loaded(self, now_ms: int, wall_ms: int, shard_ids=None) -> None:
        """Call once after replay (also with nothing replayed): the shards (``shard_ids``, default
        all) start serving: session timers of loaded members, the offset-retention cycle."""
        self._replay_prefixes = {}
        for shard in (self.shards if shard_ids is None else [self.shards[i] for i in shard_ids]):
            out = shard.on_loaded(now_ms, wall_ms)
            assert not out.writes and not out.replies, "loading produced output"
            shard.refusal = _NONE

    # ---- requests -------------------------------------------------------------------------------

    def handle(self, api_key: int, api_version: int, request, token, now_ms: int, wall_ms: int,
               client_id: str = "", client_host: str = "") -> Result:
        """Answer one request (every group API but Heartbeat: see :meth:`heartbeat`). ``token``
        identifies the reply (the runtime's handle for the connection and correlation id); a
        parked JoinGroup/SyncGroup is answered in a later Result."""
        fn = self._dispatch.get(api_key)
        if fn is None:
            if api_key == HEARTBEAT:
                raise ValueError("Heartbeat has one entry point: GroupCoordinator.heartbeat")
            raise ValueError(f"api key {api_key} is not handled by the group coordinator")
        lo, hi = SUPPORTED_VERSIONS[api_key]
        if not lo <= api_version <= hi:
            raise ValueError(f"{API_NAMES[api_key]} v{api_version} is not supported ({lo}-{hi})")
        return fn(api_version, request, token, now_ms, wall_ms, client_id, client_host)

    def heartbeat(self, version: int, req, now_ms: int) -> int:
        """The hot path, and Heartbeat's one entry point: a heartbeat writes nothing and depends on
        nothing durable, so it is answered at once, and its answer is just an error code."""
        shard = self.shards[_shard_for(req.group_id, self._n)]
        if shard.refusal or self._closed:
            return self._unavailable(shard)
        return shard.classic.heartbeat(req, version, now_ms)

    def consumer_heartbeat_steady(self, group_id: str, member_id: str, member_epoch: int, client_id: str,
                                  client_host: str, now_ms: int, write_pending) -> int | None:
        """A steady-state ConsumerGroupHeartbeat answered at the edge: its heartbeat interval, or
        None when the full path must answer it (the shard refuses requests, a write of the shard
        is not durable yet, so the answer would wait for it, or the heartbeat changes anything)."""
        shard = self.shards[_shard_for(group_id, self._n)]
        if shard.refusal or self._closed or write_pending(shard.shard_id):
            return None
        return shard.consumer.steady_heartbeat(group_id, member_id, member_epoch, client_id, client_host, now_ms)

    def _join_group(self, version, req, token, now, wall, client_id, client_host) -> Result:
        shard = self._shard(req.group_id)
        err = self._unavailable(shard)
        if err:
            return Result([], [(token, error_response(JOIN_GROUP, version, req, err))])
        out = Result(shards=shard.shard_set)
        shard.join_group(req, version, token, client_id, client_host, now, wall, out)
        return out

    def _sync_group(self, version, req, token, now, wall, client_id, client_host) -> Result:
        shard = self._shard(req.group_id)
        err = self._unavailable(shard)
        if err:
            return Result([], [(token, error_response(SYNC_GROUP, version, req, err))])
        out = Result(shards=shard.shard_set)
        shard.classic.sync_group(req, version, token, now, wall, out)
        return out

    def _leave_group(self, version, req, token, now, wall, client_id, client_host) -> Result:
        shard = self._shard(req.group_id)
        err = self._unavailable(shard)
        if err:
            return Result([], [(token, error_response(LEAVE_GROUP, version, req, err))])
        out = Result(shards=shard.shard_set)
        shard.classic.leave_group(req, version, token, now, wall, out)
        return out

    def _offset_commit(self, version, req, token, now, wall, client_id, client_host) -> Result:
        shard = self._shard(req.group_id)
        err = self._unavailable(shard)
        if err:
            return Result([], [(token, error_response(OFFSET_COMMIT, version, req, err))])
        out = Result(shards=shard.shard_set)
        shard.offsets.offset_commit(req, version, token, now, wall, out)
        return out

    def _offset_fetch(self, version, req, token, now, wall, client_id, client_host) -> Result:
        touched = set()
        if version >= 8:
            groups_out = []
            for g in req.groups:
                shard = self._shard(g.group_id)
                touched.add(shard.shard_id)
                err = self._unavailable(shard)
                if err:
                    groups_out.append(offset_fetch_group_error(g.group_id, err))
                    continue
                if version >= 9:
                    cgroup = shard.consumer.groups.get(g.group_id)
                    err = cgroup is not None and validate_offset_fetch(cgroup, g.member_id, g.member_epoch)
                    if err:
                        groups_out.append(offset_fetch_group_error(g.group_id, err))
                        continue
                wanted = None if g.topics is None else [(t.name, t.partition_indexes) for t in g.topics]
                rows = shard.offsets.fetch_offsets(g.group_id, wanted)
                groups_out.append(OffsetFetchResponseGroup(group_id=g.group_id, error_code=_NONE, topics=[
                    OffsetFetchResponseTopics(name, [OffsetFetchResponsePartitions(p, off, epoch, meta, _NONE)
                                                     for p, off, epoch, meta in parts])
                    for name, parts in rows]))
            resp = OffsetFetchResponse(groups=groups_out)
        else:
            shard = self._shard(req.group_id)
            touched.add(shard.shard_id)
            err = self._unavailable(shard)
            wanted = None if req.topics is None else [(t.name, t.partition_indexes) for t in req.topics]
            epochs = version >= 5
            if err:
                resp = error_response(OFFSET_FETCH, version, req, err)
            else:
                rows = shard.offsets.fetch_offsets(req.group_id, wanted)
                resp = OffsetFetchResponse(error_code=_NONE, topics=[
                    OffsetFetchResponseTopic(name, [
                        OffsetFetchResponsePartition(p, off, epoch if epochs else -1, meta, _NONE)
                        for p, off, epoch, meta in parts])
                    for name, parts in rows])
        return Result([], [(token, resp)], frozenset(touched))

    def _consumer_group_heartbeat(self, version, req, token, now, wall, client_id, client_host) -> Result:
        shard = self._shard(req.group_id)
        err = self._unavailable(shard)
        if err:
            return Result([], [(token, error_response(CONSUMER_GROUP_HEARTBEAT, version, req, err))])
        out = Result(shards=shard.shard_set)
        shard.consumer_group_heartbeat(req, version, token, client_id, client_host, now, wall, out)
        return out

    def _consumer_group_describe(self, version, req, token, now, wall, client_id, client_host) -> Result:
        def one(shard, gid):
            err = self._unavailable(shard)
            if err:
                return consumer_described_group_error(gid, err), 0
            d = shard.consumer.describe([gid], req.include_authorized_operations)[0]
            if d.error_code == errors.GROUP_ID_NOT_FOUND and gid in shard.classic.groups:
                d.error_message = f"Group {gid} is not a consumer group."  # Kafka's words for a classic one
            return d, len(d.members)

        return self._described_in_slices(req.group_ids, one, ConsumerGroupDescribeResponse, token)

    def topics_changed(self, now_ms: int, wall_ms: int) -> Result:
        """A topic was created or grown in the catalog (and once after start-up): every consumer
        group whose subscribed topics changed gets its new metadata and a group epoch bump."""
        out = Result()
        for shard in self.shards:
            if not shard.refusal and not self._closed:
                shard.consumer.topics_changed(now_ms, wall_ms, out)
        return out

    def _describe_groups(self, version, req, token, now, wall, client_id, client_host) -> Result:
        include_ops = version >= 3 and req.include_authorized_operations

        def one(shard, gid):
            err = self._unavailable(shard)
            if err:
                return described_group_error(gid, err), 0
            described = shard.describe_group(gid, include_ops)
            if version < 4:
                for m in described.members:
                    m.group_instance_id = None
            return described, len(described.members)

        return self._described_in_slices(req.groups, one, DescribeGroupsResponse, token)

    def _described_in_slices(self, ids, one, response_cls, token) -> Result:
        """Answer ``token`` with ``response_cls(groups=[one(shard, id)[0] for each id])``, describing
        DESCRIBE_SLICE_MEMBERS members (and groups) a loop turn and leaving the rest for the next
        ones (Result.later; ``one`` -> (the described group, its members)). Each group is described
        as it is in its slice's turn (Kafka's describes read each group on its own, not all of them
        at one instant either)."""
        described = []
        touched = set()

        def step(start: int) -> Result:
            budget = DESCRIBE_SLICE_MEMBERS
            i = start
            while i < len(ids) and budget > 0:
                gid = ids[i]
                i += 1
                shard = self._shard(gid)
                touched.add(shard.shard_id)
                d, members = one(shard, gid)
                described.append(d)
                budget -= 1 + members
            if i >= len(ids):
                return Result([], [(token, response_cls(groups=described))], frozenset(touched))
            out = Result()
            out.defer(lambda now_ms, wall_ms: step(i))
            return out

        return step(0)

    def _list_groups(self, version, req, token, now, wall, client_id, client_host) -> Result:
        states = {s.lower() for s in req.states_filter} if version >= 4 and req.states_filter else None
        types = {t.lower() for t in req.types_filter} if version >= 5 and req.types_filter else None
        listed = []
        if self._closed:
            return Result([], [(token, error_response(LIST_GROUPS, version, req, errors.NOT_COORDINATOR))],
                          _NO_SHARDS)
        for shard in self.shards:
            err = shard.refusal
            if err == errors.NOT_COORDINATOR:  # another node's shard (a cluster): that node lists its groups
                continue
            if err:  # as Kafka: a partition of this node that cannot answer (loading, failed) fails the listing
                return Result([], [(token, error_response(LIST_GROUPS, version, req, err))], _NO_SHARDS)
            listed.extend(shard.list_groups(states, types))
        if version < 4:
            for g in listed:
                g.group_state = ""
        if version < 5:
            for g in listed:
                g.group_type = ""
        return Result([], [(token, ListGroupsResponse(error_code=_NONE, groups=listed))],
                      frozenset(range(self._n)))

    def _delete_groups(self, version, req, token, now, wall, client_id, client_host) -> Result:
        out = Result()
        results = []
        touched = set()
        for gid in req.groups_names:
            shard = self._shard(gid)
            touched.add(shard.shard_id)
            err = self._unavailable(shard)
            if not err:
                err = shard.delete_group(gid, out)
            results.append(DeleteGroupsResponseDeletableGroupResult(gid, err))
        out.reply(token, DeleteGroupsResponse(results=results))
        out.shards = frozenset(touched)
        return out

    def _offset_delete(self, version, req, token, now, wall, client_id, client_host) -> Result:
        shard = self._shard(req.group_id)
        err = self._unavailable(shard)
        if err:
            return Result([], [(token, error_response(OFFSET_DELETE, version, req, err))])
        out = Result(shards=shard.shard_set)
        shard.offsets.offset_delete(req, version, token, now, wall, out)
        return out

    # ---- timers and lifecycle ---------------------------------------------------------------------

    def on_timers(self, now_ms: int, wall_ms: int) -> Result:
        """Fire the timers due at ``now_ms``: session expiry, join completion (incl. the initial
        delay), pending-member and pending-sync expiry, offset retention. At most
        TIMER_STEPS_PER_CALL heap entries per call: while :meth:`next_check` is still <= now, more
        is due and the caller calls again (the runtime on its next loop turn)."""
        out = Result()
        touched = set()
        budget = TIMER_STEPS_PER_CALL
        for shard in self.shards:
            if shard.refusal or self._closed:
                continue
            d = shard.timers.next_check()
            if d is not None and d <= now_ms:
                if budget <= 0:
                    break  # the rest is still due: next_check() says so, the runtime calls again
                touched.add(shard.shard_id)
                budget -= shard.on_timers(now_ms, wall_ms, out, budget)
        out.shards = frozenset(touched)
        return out

    def forget_pending(self, pending, now_ms: int, wall_ms: int) -> Result:
        """``pending``: (group id, member id) pairs handed out with MEMBER_ID_REQUIRED on a connection
        that has closed; those still pending stop holding their group's join phase
        (:meth:`ClassicGroups.forget_pending`)."""
        out = Result()
        touched = set()
        for gid, mid in pending:
            shard = self._shard(gid)
            if self._unavailable(shard):
                continue
            if shard.classic.forget_pending(gid, mid, now_ms, wall_ms, out):
                touched.add(shard.shard_id)
        out.shards = frozenset(touched)
        return out

    def on_stall(self, stall_ms: int, now_ms: int, wall_ms: int, shift_ms: int | None = None) -> None:
        """herd did not run for ``stall_ms`` and is back at ``now_ms`` (the runtime's stall
        detector): every shard's deadlines move ``shift_ms`` (default ``stall_ms``; 0 after a system
        suspend, which the monotonic clock already left out) later, and the flight recorder notes
        the stall (see :meth:`Shard.on_stall`). Nothing fires here; the runtime reads the sockets
        before it calls :meth:`on_timers` again."""
        shift = stall_ms if shift_ms is None else shift_ms
        for shard in self.shards:
            shard.on_stall(stall_ms, shift, now_ms, wall_ms)
        self.timers_changed = True

    def _timers_pushed(self) -> None:
        self.timers_changed = True

    def next_deadline(self) -> int | None:
        """The earliest monotonic time at which :meth:`on_timers` has work, or None. Clears
        :attr:`timers_changed`."""
        return self._earliest(lambda shard: shard.next_deadline())

    def next_check(self) -> int | None:
        """A time no later than :meth:`next_deadline` at which to call :meth:`on_timers` (which may
        then find nothing due yet and only re-arm extended deadlines): what the runtime arms its
        timer at, because it never settles deadlines ahead of time. Clears :attr:`timers_changed`."""
        return self._earliest(lambda shard: shard.timers.next_check())

    def _earliest(self, of) -> int | None:
        self.timers_changed = False
        if self._closed:
            return None
        best = None
        for shard in self.shards:
            if shard.refusal:
                continue
            d = of(shard)
            if d is not None and (best is None or d < best):
                best = d
        return best

    def shutdown(self) -> Result:
        """Answer every parked JoinGroup/SyncGroup with NOT_COORDINATOR (the clients look for the
        coordinator again); afterwards every request gets NOT_COORDINATOR."""
        out = Result()
        for shard in self.shards:
            shard.release_parked(errors.NOT_COORDINATOR, out)
        self._closed = True
        return out

    # ---- shard serving (the runtime's shard states drive these) -----------------------------------

    def refuse(self, shard_id: int, error: int) -> Result:
        """Stop serving ``shard_id``: every request for its groups gets ``error`` from now on, its
        timers stop, and the requests parked in it are answered with ``error`` now (the Result's
        replies: send them, they depend on nothing durable). Its state is kept (see
        :meth:`unload`). ``error`` NONE is not allowed: :meth:`loaded` starts serving."""
        if error == _NONE:
            raise ValueError("refuse() needs an error code; loaded() starts serving a shard")
        shard = self.shards[shard_id]
        out = Result()
        if shard.refusal != error:
            shard.refusal = error
            shard.release_parked(error, out)
        return out

    def fail_shard(self, shard_id: int) -> Result:
        """A write to ``shard_id``'s store failed: the shard stops; requests for its groups get
        COORDINATOR_NOT_AVAILABLE (retriable) until restart. Returns the answers for requests
        parked in that shard (send them; they depend on nothing durable)."""
        if self.shards[shard_id].refusal == errors.COORDINATOR_NOT_AVAILABLE:
            return Result()
        return self.refuse(shard_id, errors.COORDINATOR_NOT_AVAILABLE)

    def unload(self, shard_id: int) -> Result:
        """This node no longer owns ``shard_id``: answer its parked requests NOT_COORDINATOR,
        forget its groups, offsets and timers (another node serves them now; a later load replays
        them afresh), and refuse its requests with NOT_COORDINATOR."""
        res = self.refuse(shard_id, errors.NOT_COORDINATOR)
        fresh = self._new_shard(shard_id)
        fresh.refusal = errors.NOT_COORDINATOR
        fresh.timers.on_push = self._timers_pushed
        self.shards[shard_id] = fresh
        self.timers_changed = True
        return res

    @property
    def failed_shards(self) -> list[int]:
        return [s.shard_id for s in self.shards if s.refusal == errors.COORDINATOR_NOT_AVAILABLE]

    # ---- operator views (plain data for metrics, the CLI and the flight recorder) --------------------

    def _group(self, group_id: str) -> Group | None:
        return self._shard(group_id).classic.groups.get(group_id)

    def list_groups(self) -> list[dict]:
        """Every group: id, state, protocol, generation, member count, shard."""
        return list(self.iter_groups())

    def iter_groups(self):
        """``list_groups`` one group at a time (a generator), for a view that yields to the loop
        between groups (the HTTP endpoint's ``/groups``): each shard's groups are listed as they are
        when the generator reaches that shard, each group's summary as it is when reached."""
        for shard in self.shards:
            sid = shard.shard_id
            for g in list(shard.classic.groups.values()):
                d = g.summary()
                d["shard"] = sid
                d.setdefault("type", "classic")
                yield d
            for g in list(shard.consumer.groups.values()):
                yield _consumer_summary(g, sid)

    def describe_group(self, group_id: str, now_ms: int | None = None) -> dict | None:
        """One group in detail: members, the rebalance in progress, the flight-recorder history and
        the number of committed offsets; None for an unknown group."""
        shard = self._shard(group_id)
        g = shard.classic.groups.get(group_id)
        if g is None:
            cg = shard.consumer.groups.get(group_id)
            if cg is None:
                return None
            d = _consumer_summary(cg, shard.shard_id)
            names = {tid: name for name, (tid, _) in cg.subscription_metadata.items()}
            d["members"] = [_consumer_member(m, cg.target.get(m.member_id, {}), names) for m in cg.members.values()]
            d["subscribed_topics"] = sorted(cg.subscription_metadata)
            d["history"] = list(shard.consumer.history.get(group_id, ()))
            d["offsets"] = sum(len(p) for p in shard.offsets.committed.get(group_id, {}).values())
            return d
        d = g.summary()
        d.setdefault("type", "classic")
        d["shard"] = shard.shard_id
        d["members"] = [m.describe() for m in g.members.values()]
        d["pending_member_ids"] = sorted(g.pending_members)
        d["pending_sync_member_ids"] = sorted(g.pending_sync)
        d["subscribed_topics"] = None if g.subscribed_topics is None else sorted(g.subscribed_topics)
        d["rebalance_in_progress"] = None if g.rebalance is None else g.rebalance.as_dict(now_ms)
        d["history"] = [r.as_dict() for r in g.history]
        d["offsets"] = sum(len(p) for p in shard.offsets.committed.get(group_id, {}).values())
        return d

    def group_history(self, group_id: str, now_ms: int | None = None) -> list[dict] | None:
        """The flight recorder: the last ``rebalance_history_size`` rebalances, oldest first, plus
        the one in progress (outcome "in_progress") if any."""
        g = self._group(group_id)
        if g is None:
            shard = self._shard(group_id)
            if group_id in shard.consumer.groups:
                return list(shard.consumer.history.get(group_id, ()))
            return None
        hist = [r.as_dict() for r in g.history]
        if g.rebalance is not None:
            hist.append(g.rebalance.as_dict(now_ms))
        return hist

    def group_offsets(self, group_id: str) -> dict[str, dict[int, dict]]:
        stored = self._shard(group_id).offsets.committed.get(group_id, {})
        names = ("offset", "leader_epoch", "metadata", "commit_timestamp", "expire_timestamp")
        return {topic: {p: dict(zip(names, records.offset_value_fields(v), strict=True)) for p, v in parts.items()}
                for topic, parts in stored.items()}

    def committed_by_shard(self):
        """Every committed offset, for lag and commit ages (read-only): yields one list per shard
        of ``(group_id, topic, partition, offset, commit_timestamp)``; Empty and member-less groups
        included. Each list is complete when yielded, so a caller may wait between shards (the
        state moves on meanwhile; no iteration spans it)."""
        fields = records.offset_value_fields
        for shard in self.shards:
            rows = []
            for gid, topics in shard.offsets.committed.items():
                for topic, parts in topics.items():
                    for p, v in parts.items():
                        off, _, _, ts, _ = fields(v)
                        rows.append((gid, topic, p, off, ts))
            yield rows

    def committed_partitions(self):
        """The ``(topic, partition)`` pairs with a committed offset in any group: yields one list
        per shard (complete when yielded; a pair committed in several shards comes once per shard)."""
        for shard in self.shards:
            yield list({(topic, p) for topics in shard.offsets.committed.values() for topic, parts in topics.items()
                        for p in parts})

    def rebalance_starts(self, group_id: str) -> list[int]:
        """Wall times (ms) at which the recorded rebalances of a group started (the one in progress
        included; for a consumer group, its recorded epoch moves), oldest first; [] for an unknown
        group. In memory only: the flight recorder starts empty when the process (or the node that
        owns the shard) starts."""
        g = self._group(group_id)
        if g is None:  # a consumer group (KIP-848): each recorded move of its epochs
            hist = self._shard(group_id).consumer.history.get(group_id, ())
            return [h["wall_ms"] for h in hist]
        starts = [r.started_wall_ms for r in g.history]
        if g.rebalance is not None:
            starts.append(g.rebalance.started_wall_ms)
        return starts

    def member_assignments(self, group_id: str) -> dict[str, bytes]:
        """Each member's assignment as the leader sent it (ConsumerProtocol bytes for consumer
        groups); {} for an unknown group."""
        g = self._group(group_id)
        return {} if g is None else {mid: m.assignment for mid, m in g.members.items()}

    def snapshot_stats(self) -> dict:
        """Gauges and counters for metrics: groups by state, members, parked requests, plus the
        running counters (rebalances by outcome/reason, commits, expiries, ...)."""
        by_state = dict.fromkeys(STATES, 0)
        members = pending = parked = offsets = 0
        for shard in self.shards:
            for g in shard.classic.groups.values():
                by_state[g.state] += 1
                members += len(g.members)
                pending += len(g.pending_members)
            parked += len(shard.parked())
            offsets += sum(len(p) for parts in shard.offsets.committed.values() for p in parts.values())
        consumer_by_state: dict[str, int] = {}
        consumer_members = 0
        for shard in self.shards:
            for cg in shard.consumer.groups.values():
                consumer_by_state[cg.state] = consumer_by_state.get(cg.state, 0) + 1
                consumer_members += len(cg.members)
        return {"groups_by_state": by_state, "members": members, "pending_members": pending,
                "consumer_groups_by_state": consumer_by_state, "consumer_members": consumer_members,
                "parked_requests": parked, "offsets": offsets, "failed_shards": self.failed_shards,
                "counters": dict(self.stats)}


def _fmt_assignment(assignment: dict, names: dict) -> dict[str, list[int]]:
    return {names.get(tid, tid.hex()): sorted(ps) for tid, ps in sorted(assignment.items()) if ps}


def _consumer_summary(g, shard_id: int) -> dict:
    return {"group_id": g.group_id, "type": "consumer", "state": g.state, "protocol_type": "consumer",
            "protocol": None, "generation": g.group_epoch, "group_epoch": g.group_epoch,
            "assignment_epoch": g.assignment_epoch, "members": len(g.members), "shard": shard_id}


def _consumer_member(m, target: dict, names: dict) -> dict:
    return {"member_id": m.member_id, "instance_id": m.instance_id, "client_id": m.client_id,
            "client_host": m.client_host, "member_epoch": m.member_epoch,
            "state": MEMBER_STATES.get(m.state, str(m.state)),
            "subscribed_topics": list(m.subscribed_topic_names), "subscribed_topic_regex": m.subscribed_topic_regex,
            "assignment": _fmt_assignment(m.assigned, names), "target_assignment": _fmt_assignment(target, names),
            "pending_revocation": _fmt_assignment(m.pending_revocation, names)}


class _Topics:
    """The catalog seen by consumer groups, through one indirection so that the runtime can plug
    the catalog in after the shards exist (:meth:`GroupCoordinator.set_topics`)."""

    __slots__ = ("source",)

    def __init__(self, source=None):
        self.source = source

    def get(self, name: str):
        return None if self.source is None else self.source.get(name)

    def names(self):
        return () if self.source is None else self.source.names()
