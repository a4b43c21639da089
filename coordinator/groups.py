"""The group coordinator facade the runtime calls: routes requests to shards, shapes responses.

Pure: no asyncio, no sockets, no disk. Time comes in as arguments: ``now_ms`` is monotonic time
(drives every timeout); wall-clock epoch ms (written into records as commit and state timestamps,
and shown by the flight recorder) is the ``wall_ms`` argument when given, else ``clock.wall_ms()``
of the :class:`~coordinator.clock.Clock` passed to the constructor (a
:class:`~coordinator.clock.ManualClock` in tests).

Contract with the runtime
-------------------------
* ``handle``/``on_timers``/``shutdown``/``fail_shard`` return a :class:`Result`. Append
  ``result.writes`` to the shard logs in order; send ``result.replies`` only once *all* of that
  result's writes are durable. Replies must also not overtake earlier, still pending writes of the
  shards in ``result.shards`` (a reply that reads state, e.g. a follower's SyncGroup after the
  leader's, or an OffsetFetch after a commit, must not be sent before that state is durable).
  Heartbeat results have no ``shards``: they depend on nothing durable.
* If writes fail, send ``result.failure_replies()`` instead of ``result.replies`` and call
  :meth:`GroupCoordinator.fail_shard` for the shard: it then answers COORDINATOR_NOT_AVAILABLE
  (retriable) until the process restarts and replays its log.
* After ``handle``/``on_timers``, re-arm the shard timer at :meth:`GroupCoordinator.next_check`
  (never later than :meth:`GroupCoordinator.next_deadline`) and call
  :meth:`GroupCoordinator.on_timers` when it passes (``loop.call_at``).
* Start-up: ``replay`` every record of every shard, then ``loaded(now_ms)`` once (also with an
  empty data dir: it arms the offset-retention cycle and session timers of loaded members).
"""
from __future__ import annotations

import uuid
from dataclasses import dataclass, field

from coordinator import records
from coordinator.clock import Clock, SystemClock
from coordinator.config import Config
from coordinator.group import STATES, Group
from coordinator.partitioning import shard_for as _shard_for
from coordinator.shard import Out, Shard, _commit_error, join_response, sync_response
from protocol import errors
from protocol.messages import (
    DeleteGroupsResponse,
    DeleteGroupsResponseDeletableGroupResult,
    DescribeGroupsResponse,
    DescribeGroupsResponseDescribedGroup,
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    ListGroupsResponse,
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
    OffsetDeleteResponse,
    OffsetFetchResponse,
    OffsetFetchResponseGroup,
    OffsetFetchResponsePartition,
    OffsetFetchResponsePartitions,
    OffsetFetchResponseTopic,
    OffsetFetchResponseTopics,
    SyncGroupResponse,
)

__all__ = ["GroupCoordinator", "Result", "SUPPORTED_VERSIONS", "API_NAMES"]

OFFSET_COMMIT = 8
OFFSET_FETCH = 9
JOIN_GROUP = 11
HEARTBEAT = 12
LEAVE_GROUP = 13
SYNC_GROUP = 14
DESCRIBE_GROUPS = 15
LIST_GROUPS = 16
DELETE_GROUPS = 42
OFFSET_DELETE = 47

# api key -> (min, max) version this coordinator answers (for ApiVersions)
SUPPORTED_VERSIONS: dict[int, tuple[int, int]] = {
    OFFSET_COMMIT: (0, 9), OFFSET_FETCH: (0, 9), JOIN_GROUP: (0, 9), HEARTBEAT: (0, 4),
    LEAVE_GROUP: (0, 5), SYNC_GROUP: (0, 5), DESCRIBE_GROUPS: (0, 5), LIST_GROUPS: (0, 5),
    DELETE_GROUPS: (0, 2), OFFSET_DELETE: (0, 0),
}
API_NAMES = {OFFSET_COMMIT: "OffsetCommit", OFFSET_FETCH: "OffsetFetch", JOIN_GROUP: "JoinGroup",
             HEARTBEAT: "Heartbeat", LEAVE_GROUP: "LeaveGroup", SYNC_GROUP: "SyncGroup",
             DESCRIBE_GROUPS: "DescribeGroups", LIST_GROUPS: "ListGroups", DELETE_GROUPS: "DeleteGroups",
             OFFSET_DELETE: "OffsetDelete"}

_NONE = errors.NONE
_NO_SHARDS: frozenset = frozenset()
# Timer heap entries looked at per on_timers call (~1-2 ms of re-arming extended heartbeat deadlines
# on the machine measured); more is left for the next loop turn, with I/O served in between.
TIMER_STEPS_PER_CALL = 500
_REPLAY_PREFIXES_MAX = 100_000  # bounds the replay cache when there are very many (group, topic) pairs


@dataclass(slots=True)
class Result:
    writes: list[tuple[int, bytes, bytes | None]] = field(default_factory=list)
    """``(shard_id, key, value)`` to append durably, in order (value None = tombstone)."""
    replies: list[tuple[object, object]] = field(default_factory=list)
    """``(token, response)``: send only after all of this result's writes are durable."""
    shards: frozenset = _NO_SHARDS
    """Shards whose earlier pending writes these replies must not overtake."""

    def failure_replies(self, error_code: int = errors.COORDINATOR_NOT_AVAILABLE) -> list[tuple]:
        """The replies to send instead of :attr:`replies` when the writes failed: each response
        replaced by the same API's answer with ``error_code`` (valid at every version)."""
        return [(token, _as_error(resp, error_code)) for token, resp in self.replies]


def _as_error(resp, code: int):
    if isinstance(resp, JoinGroupResponse):
        return JoinGroupResponse(error_code=code, member_id=resp.member_id, protocol_name="")
    if isinstance(resp, SyncGroupResponse):
        return SyncGroupResponse(error_code=code)
    if isinstance(resp, HeartbeatResponse):
        return HeartbeatResponse(error_code=code)
    if isinstance(resp, LeaveGroupResponse):
        return LeaveGroupResponse(error_code=code)
    if isinstance(resp, OffsetCommitResponse):
        return OffsetCommitResponse(topics=[
            OffsetCommitResponseTopic(t.name, [OffsetCommitResponsePartition(p.partition_index, code)
                                               for p in t.partitions]) for t in resp.topics])
    if isinstance(resp, OffsetDeleteResponse):
        return OffsetDeleteResponse(error_code=code)
    if isinstance(resp, DeleteGroupsResponse):
        return DeleteGroupsResponse(results=[DeleteGroupsResponseDeletableGroupResult(r.group_id, code)
                                             for r in resp.results])
    # Read-only answers wait for the writes of their shards before them (Result.shards): they
    # describe state that never became durable, so they are refused too, never sent as they are.
    if isinstance(resp, OffsetFetchResponse):
        if resp.groups:  # v8+
            return OffsetFetchResponse(groups=[OffsetFetchResponseGroup(group_id=g.group_id, topics=[],
                                                                        error_code=code) for g in resp.groups])
        # v0-1 have no top-level error: the partitions carry it (as herd's own unavailable answer)
        return OffsetFetchResponse(error_code=code, topics=[
            OffsetFetchResponseTopic(t.name, [OffsetFetchResponsePartition(p.partition_index, -1, -1, "", code)
                                              for p in t.partitions]) for t in resp.topics])
    if isinstance(resp, DescribeGroupsResponse):
        return DescribeGroupsResponse(groups=[DescribeGroupsResponseDescribedGroup(error_code=code, group_id=g.group_id)
                                              for g in resp.groups])
    if isinstance(resp, ListGroupsResponse):
        return ListGroupsResponse(error_code=code)
    return resp


class GroupCoordinator:
    """All offsets partitions (shards) of this node. See the module docstring for the contract."""

    def __init__(self, config: Config, node_id: int = 0, clock: Clock | None = None, new_uuid=None):
        self.config = config
        self.node_id = node_id
        self.clock = clock if clock is not None else SystemClock()
        self._new_uuid = new_uuid or (lambda: str(uuid.uuid4()))
        self.stats: dict[str, int] = {}
        self._n = config.offsets_partitions
        self.rebalance_listeners: list = []  # called with each completed rebalance's history entry
        self.shards = [Shard(i, config, self._new_uuid, self.stats, self.rebalance_listeners)
                       for i in range(self._n)]
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
            JOIN_GROUP: self._join_group, SYNC_GROUP: self._sync_group, HEARTBEAT: self._heartbeat,
            LEAVE_GROUP: self._leave_group, OFFSET_COMMIT: self._offset_commit,
            OFFSET_FETCH: self._offset_fetch,
            LIST_GROUPS: self._list_groups, DESCRIBE_GROUPS: self._describe_groups,
            DELETE_GROUPS: self._delete_groups, OFFSET_DELETE: self._offset_delete,
        }

    # ---- routing --------------------------------------------------------------------------------

    def shard_for(self, group_id: str) -> int:
        return _shard_for(group_id, self._n)

    def _shard(self, group_id: str) -> Shard:
        return self.shards[_shard_for(group_id, self._n)]

    def _unavailable(self, shard: Shard) -> int:
        """The error a request routed to ``shard`` gets now, or NONE."""
        if self._closed:
            return errors.NOT_COORDINATOR
        if shard.failed:
            return errors.COORDINATOR_NOT_AVAILABLE
        return _NONE

    def _wall(self, wall_ms: int | None) -> int:
        return wall_ms if wall_ms is not None else self.clock.wall_ms()

    # ---- start-up -------------------------------------------------------------------------------

    def replay(self, shard_id: int, key: bytes, value: bytes | None) -> None:
        """Apply one record read back from shard ``shard_id``'s log. Record types this coordinator
        does not own (KIP-848/share/streams groups) are skipped and counted in
        ``skipped_records``; undecodable bytes raise :class:`coordinator.records.RecordError`."""
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
                self.shards[owner]._apply_offset(gid, topic, partition, value)
                return
        rtype, key_obj = records.decode_key(key)
        if key_obj is None:
            self.skipped_records += 1
            return
        owner = _shard_for(key_obj.group, self._n)
        if owner != shard_id:
            # the data dir was written with another offsets_partitions: keep the record reachable
            self.misplaced_records += 1
        self.shards[owner]._apply(rtype, key_obj, records.decode_value(rtype, value))

    def _replay_prefix(self, prefix: bytes) -> tuple[str, str, int] | None:
        """``(group, topic, owning shard)`` of an offset-key prefix, remembered while replaying."""
        names = records.decode_offset_key_prefix(prefix)
        if names is None:
            return None  # damaged: the generic decoder reports it
        if len(self._replay_prefixes) >= _REPLAY_PREFIXES_MAX:
            self._replay_prefixes.clear()
        known = self._replay_prefixes[prefix] = (*names, _shard_for(names[0], self._n))
        return known

    def loaded(self, now_ms: int, wall_ms: int | None = None) -> None:
        """Call once after replay (also with nothing replayed)."""
        self._replay_prefixes = {}
        wall = self._wall(wall_ms)
        for shard in self.shards:
            out = shard.on_loaded(now_ms, wall)
            assert not out.writes and not out.replies, "loading produced output"

    # ---- requests -------------------------------------------------------------------------------

    def handle(self, api_key: int, api_version: int, request, now_ms: int, token, client_id: str = "",
               client_host: str = "", wall_ms: int | None = None) -> Result:
        """Answer one request. ``token`` identifies the reply (the runtime's handle for the
        connection and correlation id); a parked JoinGroup/SyncGroup is answered in a later
        Result."""
        fn = self._dispatch.get(api_key)
        if fn is None:
            raise ValueError(f"api key {api_key} is not handled by the group coordinator")
        lo, hi = SUPPORTED_VERSIONS[api_key]
        if not lo <= api_version <= hi:
            raise ValueError(f"{API_NAMES[api_key]} v{api_version} is not supported ({lo}-{hi})")
        return fn(api_version, request, now_ms, token, client_id, client_host, wall_ms)

    def heartbeat_code(self, version: int, req, now_ms: int) -> int:
        """The hot path: a heartbeat writes nothing and depends on nothing durable, so it is
        answered at once, and its answer is just an error code."""
        shard = self.shards[_shard_for(req.group_id, self._n)]
        if shard.failed or self._closed:
            return self._unavailable(shard)
        return shard.heartbeat(req, version, now_ms)

    def heartbeat(self, version: int, req, now_ms: int) -> HeartbeatResponse:
        return HeartbeatResponse(error_code=self.heartbeat_code(version, req, now_ms))

    def _heartbeat(self, version, req, now, token, client_id, client_host, wall_ms) -> Result:
        return Result([], [(token, self.heartbeat(version, req, now))], _NO_SHARDS)

    def _join_group(self, version, req, now, token, client_id, client_host, wall_ms) -> Result:
        shard = self._shard(req.group_id)
        err = self._unavailable(shard)
        if err:
            return Result([], [(token, join_response(version, err, req.member_id))])
        out = Out()
        shard.join_group(req, version, token, client_id, client_host, now, self._wall(wall_ms), out)
        return Result(out.writes, out.replies, shard.shard_set)

    def _sync_group(self, version, req, now, token, client_id, client_host, wall_ms) -> Result:
        shard = self._shard(req.group_id)
        err = self._unavailable(shard)
        if err:
            return Result([], [(token, sync_response(version, err))])
        out = Out()
        shard.sync_group(req, version, token, now, self._wall(wall_ms), out)
        return Result(out.writes, out.replies, shard.shard_set)

    def _leave_group(self, version, req, now, token, client_id, client_host, wall_ms) -> Result:
        shard = self._shard(req.group_id)
        err = self._unavailable(shard)
        if err:
            return Result([], [(token, LeaveGroupResponse(error_code=err))])
        resp, out = shard.leave_group(req, version, now, self._wall(wall_ms))
        out.reply(token, resp)
        return Result(out.writes, out.replies, shard.shard_set)

    def _offset_commit(self, version, req, now, token, client_id, client_host, wall_ms) -> Result:
        shard = self._shard(req.group_id)
        err = self._unavailable(shard)
        if err:
            return Result([], [(token, _commit_error(req, err))])
        resp, out = shard.offset_commit(req, version, now, self._wall(wall_ms))
        out.reply(token, resp)
        return Result(out.writes, out.replies, shard.shard_set)

    def _offset_fetch(self, version, req, now, token, client_id, client_host, wall_ms) -> Result:
        touched = set()
        if version >= 8:
            groups_out = []
            for g in req.groups:
                shard = self._shard(g.group_id)
                touched.add(shard.shard_id)
                err = self._unavailable(shard)
                if err:
                    groups_out.append(OffsetFetchResponseGroup(g.group_id, [], err))
                    continue
                wanted = None if g.topics is None else [(t.name, t.partition_indexes) for t in g.topics]
                rows = shard.fetch_offsets(g.group_id, wanted)
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
                if version < 2:  # no top-level error field: every partition carries it
                    resp = OffsetFetchResponse(topics=[
                        OffsetFetchResponseTopic(name, [OffsetFetchResponsePartition(p, -1, -1, "", err)
                                                        for p in parts])
                        for name, parts in (wanted or [])])
                else:
                    resp = OffsetFetchResponse(topics=[], error_code=err)
            else:
                rows = shard.fetch_offsets(req.group_id, wanted)
                resp = OffsetFetchResponse(error_code=_NONE, topics=[
                    OffsetFetchResponseTopic(name, [
                        OffsetFetchResponsePartition(p, off, epoch if epochs else -1, meta, _NONE)
                        for p, off, epoch, meta in parts])
                    for name, parts in rows])
        return Result([], [(token, resp)], frozenset(touched))

    def _describe_groups(self, version, req, now, token, client_id, client_host, wall_ms) -> Result:
        include_ops = version >= 3 and req.include_authorized_operations
        out_groups = []
        touched = set()
        for gid in req.groups:
            shard = self._shard(gid)
            touched.add(shard.shard_id)
            err = self._unavailable(shard)
            if err:
                out_groups.append(DescribeGroupsResponseDescribedGroup(error_code=err, group_id=gid))
                continue
            described = shard.describe_group(gid, include_ops)
            if version < 4:
                for m in described.members:
                    m.group_instance_id = None
            out_groups.append(described)
        return Result([], [(token, DescribeGroupsResponse(groups=out_groups))], frozenset(touched))

    def _list_groups(self, version, req, now, token, client_id, client_host, wall_ms) -> Result:
        states = {s.lower() for s in req.states_filter} if version >= 4 and req.states_filter else None
        types = {t.lower() for t in req.types_filter} if version >= 5 and req.types_filter else None
        listed = []
        for shard in self.shards:
            err = self._unavailable(shard)
            if err:  # as Kafka: a partition that cannot answer fails the whole listing
                return Result([], [(token, ListGroupsResponse(error_code=err))], _NO_SHARDS)
            listed.extend(shard.list_groups(states, types))
        if version < 4:
            for g in listed:
                g.group_state = ""
        if version < 5:
            for g in listed:
                g.group_type = ""
        return Result([], [(token, ListGroupsResponse(error_code=_NONE, groups=listed))],
                      frozenset(range(self._n)))

    def _delete_groups(self, version, req, now, token, client_id, client_host, wall_ms) -> Result:
        out = Out()
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
        return Result(out.writes, out.replies, frozenset(touched))

    def _offset_delete(self, version, req, now, token, client_id, client_host, wall_ms) -> Result:
        shard = self._shard(req.group_id)
        err = self._unavailable(shard)
        if err:
            return Result([], [(token, OffsetDeleteResponse(error_code=err))])
        resp, out = shard.offset_delete(req, now, self._wall(wall_ms))
        out.reply(token, resp)
        return Result(out.writes, out.replies, shard.shard_set)

    # ---- timers and lifecycle ---------------------------------------------------------------------

    def on_timers(self, now_ms: int, wall_ms: int | None = None) -> Result:
        """Fire the timers due at ``now_ms``: session expiry, join completion (incl. the initial
        delay), pending-member and pending-sync expiry, offset retention. At most
        TIMER_STEPS_PER_CALL heap entries per call: while :meth:`next_check` is still <= now, more
        is due and the caller calls again (the runtime on its next loop turn)."""
        out = Out()
        touched = set()
        wall = None
        budget = TIMER_STEPS_PER_CALL
        for shard in self.shards:
            if shard.failed or self._closed:
                continue
            d = shard.timers.next_check()
            if d is not None and d <= now_ms:
                if budget <= 0:
                    break  # the rest is still due: next_check() says so, the runtime calls again
                if wall is None:
                    wall = self._wall(wall_ms)
                touched.add(shard.shard_id)
                budget -= shard.on_timers(now_ms, wall, out, budget)
        return Result(out.writes, out.replies, frozenset(touched))

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
            if shard.failed:
                continue
            d = of(shard)
            if d is not None and (best is None or d < best):
                best = d
        return best

    def shutdown(self) -> Result:
        """Answer every parked JoinGroup/SyncGroup with NOT_COORDINATOR (the clients look for the
        coordinator again); afterwards every request gets NOT_COORDINATOR."""
        out = Out()
        for shard in self.shards:
            shard.release_parked(errors.NOT_COORDINATOR, out)
        self._closed = True
        return Result(out.writes, out.replies, _NO_SHARDS)

    def fail_shard(self, shard_id: int) -> Result:
        """A write to ``shard_id``'s log failed: the shard stops; requests for its groups get
        COORDINATOR_NOT_AVAILABLE (retriable) until restart. Returns the answers for requests
        parked in that shard (send them; they depend on nothing durable)."""
        shard = self.shards[shard_id]
        out = Out()
        if not shard.failed:
            shard.failed = True
            shard.release_parked(errors.COORDINATOR_NOT_AVAILABLE, out)
        return Result([], out.replies, _NO_SHARDS)

    @property
    def failed_shards(self) -> list[int]:
        return [s.shard_id for s in self.shards if s.failed]

    # ---- operator views (plain data for metrics, the CLI and the flight recorder) --------------------

    def _group(self, group_id: str) -> Group | None:
        return self._shard(group_id).groups.get(group_id)

    def list_groups(self) -> list[dict]:
        """Every group: id, state, protocol, generation, member count, shard."""
        res = []
        for shard in self.shards:
            for g in shard.groups.values():
                d = g.summary()
                d["shard"] = shard.shard_id
                res.append(d)
        return res

    def describe_group(self, group_id: str, now_ms: int | None = None) -> dict | None:
        """One group in detail: members, the rebalance in progress, the flight-recorder history and
        the number of committed offsets; None for an unknown group."""
        shard = self._shard(group_id)
        g = shard.groups.get(group_id)
        if g is None:
            return None
        d = g.summary()
        d["shard"] = shard.shard_id
        d["members"] = [m.describe() for m in g.members.values()]
        d["pending_member_ids"] = sorted(g.pending_members)
        d["pending_sync_member_ids"] = sorted(g.pending_sync)
        d["subscribed_topics"] = None if g.subscribed_topics is None else sorted(g.subscribed_topics)
        d["rebalance_in_progress"] = None if g.rebalance is None else g.rebalance.as_dict(now_ms)
        d["history"] = [r.as_dict() for r in g.history]
        d["offsets"] = sum(len(p) for p in shard.offsets.get(group_id, {}).values())
        return d

    def group_history(self, group_id: str, now_ms: int | None = None) -> list[dict] | None:
        """The flight recorder: the last ``rebalance_history_size`` rebalances, oldest first, plus
        the one in progress (outcome "in_progress") if any."""
        g = self._group(group_id)
        if g is None:
            return None
        hist = [r.as_dict() for r in g.history]
        if g.rebalance is not None:
            hist.append(g.rebalance.as_dict(now_ms))
        return hist

    def group_offsets(self, group_id: str) -> dict[str, dict[int, dict]]:
        stored = self._shard(group_id).offsets.get(group_id, {})
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
            for gid, topics in shard.offsets.items():
                for topic, parts in topics.items():
                    for p, v in parts.items():
                        off, _, _, ts, _ = fields(v)
                        rows.append((gid, topic, p, off, ts))
            yield rows

    def committed_partitions(self):
        """The ``(topic, partition)`` pairs with a committed offset in any group: yields one list
        per shard (complete when yielded; a pair committed in several shards comes once per shard)."""
        for shard in self.shards:
            yield list({(topic, p) for topics in shard.offsets.values() for topic, parts in topics.items()
                        for p in parts})

    def rebalance_starts(self, group_id: str) -> list[int]:
        """Wall times (ms) at which the recorded rebalances of a group started (the one in progress
        included), oldest first; [] for an unknown group."""
        g = self._group(group_id)
        if g is None:
            return []
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
            for g in shard.groups.values():
                by_state[g.state] += 1
                members += len(g.members)
                pending += len(g.pending_members)
            parked += len(shard.parked())
            offsets += sum(len(p) for parts in shard.offsets.values() for p in parts.values())
        return {"groups_by_state": by_state, "members": members, "pending_members": pending,
                "parked_requests": parked, "offsets": offsets, "failed_shards": self.failed_shards,
                "counters": dict(self.stats)}
