"""One offsets partition (a shard): its groups, committed offsets and timers. Pure (no I/O, no
clock reads).

:class:`Shard` holds the state and what every group type shares: records and replay, start-up,
the timer dispatch, the operator's group admin (DescribeGroups, DeleteGroups, ListGroups) and
releasing parked requests. The request handlers live with what they serve:
:mod:`coordinator.classic` (the classic group protocol: JoinGroup, SyncGroup, Heartbeat,
LeaveGroup, and its rebalances) and :mod:`coordinator.offsets` (OffsetCommit, OffsetFetch,
OffsetDelete, retention) and :mod:`coordinator.consumer_group` (KIP-848's ``consumer`` groups:
ConsumerGroupHeartbeat, over the pure core in :mod:`coordinator.consumer`, held as
``self.consumer``); :class:`Shard` is all three (mixins sharing its state).

Every handler takes ``now`` (monotonic ms, for timers) and ``wall`` (epoch ms, for record
timestamps), both read by the runtime from one clock, and appends to a
:class:`~coordinator.result.Result` (``out``): records to write durably and replies to send.
Replies to parked JoinGroup/SyncGroup requests come out of later calls (another member's request,
or :meth:`Shard.on_timers`). Calling conventions (three, each for a reason):

* a request handler ``(req, version, token, [client_id, client_host,] now, wall, out) -> None``
  answers through ``out.reply`` (JoinGroup, SyncGroup, LeaveGroup, OffsetCommit, OffsetDelete);
* a per-group part of a request that names several groups (and may span shards) returns its
  part, and the coordinator assembles the answer: ``fetch_offsets``, ``describe_group``,
  ``delete_group``, ``list_groups``;
* ``heartbeat`` returns just the error code: the hot path, answered by the edge with cached bytes.

Durable state changes through records:

* offset commits and offset tombstones are applied through the same code :meth:`Shard.replay` runs
  at start-up (``_apply_offset``), so memory always equals "log replayed". A committed offset
  is kept as its record value bytes, as written (see :mod:`coordinator.records`);
* a GroupMetadata record snapshots a group (written when the leader's SyncGroup stores the
  assignment, when a group falls Empty, and when a static member is replaced without a rebalance).
  The live group object is authoritative while the process runs (it also holds parked requests and
  rebalance progress that are never persisted, as in Kafka); replay rebuilds it as Stable/Empty;
* a GroupMetadata tombstone deletes the group (DeleteGroups, expiry).

Member ids are minted in :mod:`coordinator.classic` (``<client id or instance id>-<uuid4>``, as
Kafka) and only ever read back from records, so replay is deterministic.
"""
from __future__ import annotations

import uuid
from collections import deque

import structlog

from coordinator.config import Config
from coordinator.core import records
from coordinator.core.classic.group import (
    DEAD,
    EMPTY,
    STABLE,
    Group,
    Member,
    Parked,
)
from coordinator.core.classic.groups import ClassicGroups
from coordinator.core.consumer import ConsumerGroups, StaticTopics
from coordinator.core.consumer import records as consumer_records
from coordinator.core.consumer.on_shard import CONSUMER_TIMER_KINDS, PROTOCOL_TYPE, ConsumerProtocol
from coordinator.core.offsets import Offsets
from coordinator.core.responses import join_response, sync_response
from coordinator.core.result import Result
from coordinator.core.timers import Timers
from protocol import errors
from protocol.messages import (
    DescribeGroupsResponseDescribedGroup,
    DescribeGroupsResponseDescribedGroupMember,
    GroupMetadataValue,
    GroupMetadataValueMemberMetadata,
    ListGroupsResponseListedGroup,
)

__all__ = ["Shard"]

log = structlog.get_logger("herd.group")

# Operations a describing client may perform on a group when no authorizer is configured:
# READ(3), DELETE(6), DESCRIBE(8), DESCRIBE_CONFIGS(10), ALTER_CONFIGS(11).
GROUP_AUTHORIZED_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8) | (1 << 10) | (1 << 11)

_NONE = errors.NONE
_RETENTION_KEY = ("retention",)


class Shard(ClassicGroups, Offsets, ConsumerProtocol):
    def __init__(self, shard_id: int, config: Config, new_uuid=None, stats=None, listeners=None,
                 topics=None, consumer_config=None):
        self.shard_id = shard_id
        self.shard_set = frozenset((shard_id,))  # Result.shards of a request for this shard alone
        # callables given each completed rebalance's flight-recorder entry (metrics)
        self.listeners = listeners if listeners is not None else []
        self.config = config
        self.groups: dict[str, Group] = {}
        # group id -> topic -> partition -> the offset's record value bytes (v3, or v1 with an
        # explicit expiry); read with records.offset_value_fields / offset_value_times
        self.offsets: dict[str, dict[str, dict[int, bytes]]] = {}
        self.timers = Timers()
        # NONE while serving, else the error every request for its groups gets (set by the
        # coordinator: see GroupCoordinator.refuse/unload/loaded)
        self.refusal = errors.NONE
        self._new_uuid = new_uuid or (lambda: str(uuid.uuid4()))
        self.stats = stats if stats is not None else {}
        # the last stall of herd itself (on_stall): {"stall_ms", "ended_ms", "ended_wall_ms"}; the
        # flight recorder marks the rebalances it may have caused
        self.last_stall: dict | None = None
        # KIP-848 consumer groups: the pure core, sharing this shard's timers; topics is the
        # catalog as it sees it (get(name) -> (topic id, partitions), names())
        self.consumer = ConsumerGroups(consumer_config or config.consumer_group_config(),
                                       topics if topics is not None else StaticTopics(),
                                       self._new_uuid, self.timers)
        # the flight recorder of consumer groups: group id -> the last epoch moves (why, when)
        self.consumer_history: dict[str, deque] = {}

    def _count(self, name: str, n: int = 1) -> None:
        self.stats[name] = self.stats.get(name, 0) + n

    # ==== records ================================================================================

    def replay(self, key: bytes, value: bytes | None) -> bool:
        """Apply one record from the log. False for a record type this coordinator does not own
        (skipped); :class:`records.RecordError` for bytes that cannot be decoded."""
        if consumer_records.is_consumer_record(key):
            self.consumer.replay(key, value)
            return True
        rtype, key_obj = records.decode_key(key)
        if key_obj is None:
            return False
        self._apply(rtype, key_obj, records.decode_value(rtype, value))
        return True

    def _apply(self, rtype: int, key, value) -> None:
        """Apply a decoded record (key object, value object or None)."""
        if rtype == records.GROUP_METADATA:
            if value is None:
                self._remove_group(key.group)
            else:
                self._load_group(key.group, value)
            return
        self._apply_offset(key.group, key.topic, key.partition, records.encode_value(value))

    def _load_group(self, gid: str, value: GroupMetadataValue) -> None:
        old = self.groups.get(gid)
        if old is not None:
            self._cancel_group_timers(old)
        group = Group(gid, state=STABLE if value.members else EMPTY, generation=value.generation,
                      protocol_type=value.protocol_type or None, protocol_name=value.protocol,
                      leader_id=value.leader,
                      state_wall_ms=(None if value.current_state_timestamp == -1
                                     else value.current_state_timestamp),
                      history_size=self.config.rebalance_history_size)
        for mm in value.members:
            rt = mm.session_timeout if mm.rebalance_timeout == -1 else mm.rebalance_timeout
            group.add(Member(mm.member_id, mm.group_instance_id, mm.client_id, mm.client_host, rt,
                             mm.session_timeout, value.protocol_type, [(value.protocol, mm.subscription)],
                             mm.assignment, hb_key=("hb", gid, mm.member_id)))
        if group.leader_id is not None and group.leader_id not in group.members:
            group.leader_id = next(iter(group.members), None)
        group.subscribed_topics = group.compute_subscribed_topics()
        self.groups[gid] = group

    def _remove_group(self, gid: str) -> None:
        group = self.groups.pop(gid, None)
        if group is not None:
            self._cancel_group_timers(group)
            if group.state != DEAD:
                group.transition_to(DEAD, group.state_wall_ms)

    def _cancel_group_timers(self, group: Group) -> None:
        gid = group.group_id
        t = self.timers
        t.cancel(("join", gid))
        t.cancel(("sync", gid))
        for mid in group.members:
            t.cancel(("hb", gid, mid))
        for mid in group.pending_members:
            t.cancel(("pending", gid, mid))

    def _write_group(self, out: Result, group: Group, assignment: dict[str, bytes] | None = None) -> None:
        members = []
        for m in group.members.values():
            members.append(GroupMetadataValueMemberMetadata(
                member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                client_host=m.client_host, rebalance_timeout=m.rebalance_timeout_ms,
                session_timeout=m.session_timeout_ms, subscription=m.metadata(group.protocol_name),
                assignment=(assignment.get(m.member_id, b"") if assignment is not None else m.assignment)))
        value = GroupMetadataValue(
            protocol_type=group.protocol_type or "", generation=group.generation,
            protocol=group.protocol_name, leader=group.leader_id if members else None,
            current_state_timestamp=-1 if group.state_wall_ms is None else group.state_wall_ms,
            members=members)
        out.writes.append((self.shard_id, records.group_metadata_key(group.group_id),
                           records.group_metadata_value(value)))

    def _write_group_tombstone(self, out: Result, gid: str) -> None:
        out.writes.append((self.shard_id, records.group_metadata_key(gid), None))
        self._apply(records.GROUP_METADATA, records.GroupMetadataKey(gid), None)

    # ==== start-up ===============================================================================

    def on_loaded(self, now: int, wall: int) -> Result:
        """After replay: session timers for loaded members, the retention cycle, and a rebalance for
        groups over ``group_max_size`` (the limit may have been lowered)."""
        out = Result()
        for gid in self.consumer.groups:
            classic = self.groups.get(gid)
            if classic is not None and classic.state == EMPTY and not classic.members and not classic.protocol_type:
                # a "simple" group rebuilt from offsets replayed before the consumer group's
                # records (a compacted log): the consumer group replaced it when it was made
                self._remove_group(gid)
        for gid, topics in self.offsets.items():
            if gid not in self.groups and gid not in self.consumer.groups:
                # offsets whose group gave way to another type that is gone since (an Empty
                # consumer group deleted by a classic JoinGroup that never completed): a "simple"
                # group keeps them reachable, as their replay would have made it
                some = next(iter(next(iter(topics.values())).values()))
                self.groups[gid] = Group(gid, state_wall_ms=records.offset_value_times(some)[0],
                                         history_size=self.config.rebalance_history_size)
        self.consumer.on_loaded(now)
        for group in list(self.groups.values()):
            for m in group.members.values():
                self.timers.schedule(m.hb_key, now + m.session_timeout_ms)
            if len(group.members) > self.config.group_max_size:
                detail = (f"freshly loaded group has {len(group.members)} members, over "
                          f"group_max_size {self.config.group_max_size}")
                self._prepare_rebalance(group, "over_capacity", detail, None, None, now, wall, out)
        self.timers.schedule(_RETENTION_KEY, now + self.config.offsets_retention_check_interval_ms)
        return out

    def on_stall(self, stall_ms: int, shift_ms: int, now: int, wall: int) -> None:
        """herd did not run for ``stall_ms`` (a stalled loop, SIGSTOP, a frozen VM) and came back at
        ``now``: every deadline (sessions, rebalances, pending members, pending syncs, consumer
        groups' timers: all keys of :attr:`timers`) moves ``shift_ms`` later, so each member gets
        back the time herd was away; a rebalance in progress is marked in the flight recorder.

        A client may have given its session up meanwhile on its own: librdkafka (confluent-kafka)
        drops a member id after ``session.timeout.ms`` without a successful heartbeat answer and
        joins again as a new member. Such a member, present at the stall, whose client (client id
        and host) sends a JoinGroup with no member id within a session timeout of the stall, is
        removed at once (``rejoined_as_new``, see ``ClassicGroups._drop_member_given_up_after_stall``)
        instead of holding the group's next rebalance until its moved deadline."""
        self.timers.shift(shift_ms)
        self.last_stall = {"stall_ms": stall_ms, "ended_ms": now, "ended_wall_ms": wall}
        for group in self.groups.values():
            for m in group.members.values():
                m.stall_until = now + m.session_timeout_ms
            if group.rebalance is not None:
                group.rebalance.mark_stall(self.last_stall, now, during=True)

    def stall_mark(self, group: Group, now: int) -> dict | None:
        """The last stall, if a rebalance of ``group`` starting at ``now`` may come from it: it
        ended less than the largest session timeout of the group's members ago."""
        stall = self.last_stall
        if stall is None:
            return None
        window = max((m.session_timeout_ms for m in group.members.values()), default=0)
        return stall if now - stall["ended_ms"] <= max(window, self.config.min_session_timeout_ms) else None

    # ==== group admin ============================================================================

    def describe_group(self, group_id: str,
                       include_authorized_operations: bool = False) -> DescribeGroupsResponseDescribedGroup:
        group = self.groups.get(group_id)
        ops = GROUP_AUTHORIZED_OPERATIONS if include_authorized_operations else -2147483648
        # a consumer group is not a classic group: Kafka answers DescribeGroups v0-5 for it as for
        # an unknown group (Dead, no error); ConsumerGroupDescribe describes it
        if group is None or group.state == DEAD:
            return DescribeGroupsResponseDescribedGroup(
                error_code=_NONE, group_id=group_id, group_state=DEAD, protocol_type="", protocol_data="",
                members=[], authorized_operations=ops)
        stable = group.state == STABLE
        members = []
        # As Kafka (GroupMetadataManager.describeGroups, ClassicGroupMember.describeNoMetadata):
        # metadata only while Stable; the assignment always, i.e. each member's last one while
        # the group rebalances (empty for a member that joined since, and for every member once
        # a rebalance interrupted CompletingRebalance: _reset_and_propagate_assignment_error).
        for m in group.members.values():
            members.append(DescribeGroupsResponseDescribedGroupMember(
                member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
                client_host=m.client_host, member_metadata=m.metadata(group.protocol_name) if stable else b"",
                member_assignment=m.assignment))
        return DescribeGroupsResponseDescribedGroup(
            error_code=_NONE, group_id=group_id, group_state=group.state,
            # Kafka names the protocol of a Stable group only (GroupMetadata.summary)
            protocol_type=group.protocol_type or "", protocol_data=(group.protocol_name or "") if stable else "",
            members=members, authorized_operations=ops)

    def delete_group(self, group_id: str, out: Result) -> int:
        group = self.groups.get(group_id)
        consumer = None
        if group is None and group_id in self.consumer.groups:
            recs, err = self.consumer.delete_group(group_id)
            if err != _NONE:
                return err
            self._consumer_writes(out, recs)
            self.consumer_history.pop(group_id, None)
            consumer = True
        elif group is None or group.state == DEAD:
            return errors.GROUP_ID_NOT_FOUND
        elif group.state != EMPTY:
            return errors.NON_EMPTY_GROUP
        else:
            for pid in list(group.pending_members):
                self.timers.cancel(("pending", group_id, pid))
        stored = self.offsets.get(group_id)
        offsets = 0
        if stored:
            for topic, parts in list(stored.items()):
                for p in list(parts):
                    self._delete_offset(out, group_id, topic, p)
                    offsets += 1
        if consumer is None:
            self._write_group_tombstone(out, group_id)
        self._count("groups_deleted")
        log.info("group_deleted", group_id=group_id, offsets=offsets,
                 type=PROTOCOL_TYPE if consumer else "classic")
        return _NONE

    def list_groups(self, states: set[str] | None,
                    types: set[str] | None) -> list[ListGroupsResponseListedGroup]:
        res = []
        for group in self.groups.values():
            if states and group.state.lower() not in states:
                continue
            if types and "classic" not in types:
                continue
            res.append(ListGroupsResponseListedGroup(group.group_id, group.protocol_type or "", group.state,
                                                     "classic"))
        if not types or PROTOCOL_TYPE in types:
            for gid, state in self.consumer.list_groups(states):
                res.append(ListGroupsResponseListedGroup(gid, PROTOCOL_TYPE, state, PROTOCOL_TYPE))
        return res

    # ==== timers =================================================================================

    def next_deadline(self) -> int | None:
        return self.timers.next_deadline()

    def on_timers(self, now: int, wall: int, out: Result, budget: int | None = None) -> int:
        """Fire the timers due at ``now``; -> heap entries looked at. With ``budget``, stops after
        that many (most are extended heartbeat deadlines being re-armed): what is left is still
        due, so the caller comes back on a later loop turn and I/O is served in between."""
        timers = self.timers
        timers.steps = 0
        fired = 0
        while True:
            key = timers.pop_expired(now, budget)
            if key is None:
                return timers.steps
            fired += 1
            if fired > 1_000_000:  # pragma: no cover - a handler rescheduling itself at `now` forever
                raise RuntimeError(f"shard {self.shard_id}: timer storm at {now}")
            kind = key[0]
            if kind == "hb":
                self._expire_heartbeat(key[1], key[2], now, wall, out)
            elif kind == "pending":
                self._expire_pending_member(key[1], key[2], now, wall, out)
            elif kind == "join":
                self._on_join_timer(key[1], now, wall, out)
            elif kind == "sync":
                self._expire_pending_sync(key[1], now, wall, out)
            elif kind in CONSUMER_TIMER_KINDS:
                self._consumer_timer(key, now, wall, out)
            elif kind == "retention":
                self.expire_offsets(wall, out)
                timers.schedule(_RETENTION_KEY, now + self.config.offsets_retention_check_interval_ms)

    def _consumer_epoch_moved(self, group, wall: int) -> None:
        """The flight recorder of consumer groups: each move of the group epoch or the target
        assignment epoch, with why it moved (the core's reason) and when."""
        hist = self.consumer_history.get(group.group_id)
        if hist is None:
            hist = self.consumer_history[group.group_id] = deque(maxlen=self.config.rebalance_history_size)
        reason = group.epoch_reasons[-1][1] if group.epoch_reasons and \
            group.epoch_reasons[-1][0] == group.group_epoch else "target assignment computed"
        if hist and hist[-1]["group_epoch"] == group.group_epoch and hist[-1]["reason"] == reason:
            hist[-1].update(assignment_epoch=group.assignment_epoch, state=group.state)
            return
        hist.append({"group_epoch": group.group_epoch, "assignment_epoch": group.assignment_epoch,
                     "reason": reason, "state": group.state, "members": len(group.members),
                     "wall_ms": wall})
        self._count("consumer_group_epoch_bumps")

    # ==== lifecycle ==============================================================================

    def parked(self) -> list[tuple[str, Parked]]:
        """Every parked request in this shard as ``("join"|"sync", parked)``."""
        res = []
        for group in self.groups.values():
            for m in group.members.values():
                if m.join is not None:
                    res.append(("join", m.join))
                if m.sync is not None:
                    res.append(("sync", m.sync))
        return res

    def release_parked(self, error: int, out: Result) -> None:
        """Answer every parked request with ``error`` (shutdown: NOT_COORDINATOR; a failed shard:
        COORDINATOR_NOT_AVAILABLE) and forget them."""
        for group in self.groups.values():
            for m in group.members.values():
                parked = group.take_join(m)
                if parked is not None:
                    out.reply(parked.token, join_response(parked.version, error, m.member_id))
                if m.sync is not None:
                    out.reply(m.sync.token, sync_response(m.sync.version, error))
                    m.sync = None
