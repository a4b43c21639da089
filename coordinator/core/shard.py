"""One offsets partition (a shard): a classic-groups object, an offsets object and a
consumer-groups object, the timers they share, and where they meet. Pure (no I/O, no clock reads).

As Kafka's GroupCoordinatorShard holds a GroupMetadataManager and an OffsetMetadataManager,
:class:`Shard` holds

* ``classic``: :class:`coordinator.core.classic.groups.ClassicGroups` (JoinGroup, SyncGroup, Heartbeat,
  LeaveGroup, their rebalances and timers, GroupMetadata records);
* ``offsets``: :class:`coordinator.core.offsets.Offsets` (OffsetCommit, OffsetFetch, OffsetDelete,
  retention), which asks the groups what it needs through :class:`_OffsetGroups` (an
  :class:`coordinator.core.offsets.OffsetGroups`);
* ``consumer``: :class:`coordinator.core.consumer.on_shard.ConsumerProtocol` (KIP-848's ``consumer``
  groups over the pure core in :mod:`coordinator.core.consumer`), told the classic group ids (one
  group id is one type at a time);

each owning its state, and ``timers`` (one :class:`~coordinator.core.timers.Timers`, each side
scheduling its own keys). The shard routes records (:meth:`Shard.replay`) and timer keys
(:meth:`Shard.on_timers`) to their owner and does what spans the objects: start-up, a group id
changing type, DeleteGroups, ListGroups, offset expiry (each group's offsets, then the group).

Every handler takes ``now`` (monotonic ms, for timers) and ``wall`` (epoch ms, for record
timestamps), both read by the runtime from one clock, and appends to a
:class:`~coordinator.core.result.Result` (``out``): records to write durably and replies to send.
Replies to parked JoinGroup/SyncGroup requests come out of later calls (another member's request,
or :meth:`Shard.on_timers`). Calling conventions (three, each for a reason):

* a request handler ``(req, version, token, [client_id, client_host,] now, wall, out) -> None``
  answers through ``out.reply`` (JoinGroup, SyncGroup, LeaveGroup, OffsetCommit, OffsetDelete);
* a per-group part of a request that names several groups (and may span shards) returns its
  part, and the coordinator assembles the answer: ``fetch_offsets``, ``describe_group``,
  ``delete_group``, ``list_groups``;
* ``classic.heartbeat`` returns just the error code: the hot path, answered by the edge with
  cached bytes.

Durable state changes through records: offsets only by replaying them (a commit applies its
records as :meth:`coordinator.core.offsets.Offsets.replay` does at start-up), consumer
groups likewise (their core), classic groups as Kafka's (the live group is authoritative, a
GroupMetadata record snapshots it; see :mod:`coordinator.core.classic.groups`).
"""
from __future__ import annotations

import uuid

import structlog

from coordinator.core import records
from coordinator.core.classic.group import DEAD, EMPTY, Parked
from coordinator.core.classic.groups import CLASSIC_TIMER_KINDS, ClassicGroups
from coordinator.core.config import GroupConfig
from coordinator.core.consumer import ConsumerGroups, StaticTopics
from coordinator.core.consumer import records as consumer_records
from coordinator.core.consumer.on_shard import CONSUMER_TIMER_KINDS, PROTOCOL_TYPE, ConsumerProtocol, HeartbeatError
from coordinator.core.offsets import Offsets
from coordinator.core.result import Result
from coordinator.core.timers import Timers
from protocol import errors
from protocol.messages import (
    ConsumerGroupHeartbeatResponse,
    DescribeGroupsResponseDescribedGroup,
    ListGroupsResponseListedGroup,
)

__all__ = ["Shard"]

log = structlog.get_logger("herd.group")

_NONE = errors.NONE
_RETENTION_KEY = ("retention",)


class _OffsetGroups:
    """The groups as the offsets see them (:class:`coordinator.core.offsets.OffsetGroups`)."""

    __slots__ = ("_classic", "_consumer", "_classic_groups", "_consumer_groups")

    def __init__(self, classic: ClassicGroups, consumer: ConsumerProtocol):
        self._classic = classic
        self._consumer = consumer
        # read only, for known() (called for every offset replayed or committed)
        self._classic_groups = classic.groups
        self._consumer_groups = consumer.groups

    def known(self, group_id: str) -> bool:
        return group_id in self._classic_groups or group_id in self._consumer_groups

    def create_simple(self, group_id: str, state_wall_ms: int) -> None:
        self._classic.create_simple(group_id, state_wall_ms)

    def exists(self, group_id: str) -> bool:
        group = self._classic.groups.get(group_id)
        return (group is not None and group.state != DEAD) or group_id in self._consumer.groups

    def validate_commit(self, group_id: str, member_id: str, instance_id: str | None, generation: int,
                        version: int, now: int, wall: int) -> int:
        if group_id not in self._classic.groups and group_id in self._consumer.groups:
            # a consumer group: member epochs (Kafka's ConsumerGroup.validateOffsetCommit)
            return self._consumer.validate_offset_commit(group_id, member_id, generation, version)
        return self._classic.validate_offset_commit(group_id, member_id, instance_id, generation, version,
                                                    now, wall)

    def commit_partition_check(self, group_id: str, member_id: str, member_epoch: int):
        return self._consumer.commit_partition_check(group_id, member_id, member_epoch)

    def delete_target(self, group_id: str):
        group = self._classic.groups.get(group_id)
        if group is None and group_id in self._consumer.groups:
            return self._consumer.subscribed(group_id)
        return group


class Shard:
    def __init__(self, shard_id: int, config: GroupConfig, new_uuid=None, stats=None, listeners=None,
                 topics=None):
        self.shard_id = shard_id
        self.shard_set = frozenset((shard_id,))  # Result.shards of a request for this shard alone
        self.config = config
        self.timers = Timers()
        # NONE while serving, else the error every request for its groups gets (set by the
        # coordinator: see GroupCoordinator.refuse/unload/loaded)
        self.refusal = errors.NONE
        new_uuid = new_uuid or (lambda: str(uuid.uuid4()))
        self.stats = stats if stats is not None else {}
        count = self._count
        # callables given each completed rebalance's flight-recorder entry (metrics)
        self.classic = ClassicGroups(shard_id, config, self.timers, new_uuid, count,
                                     listeners if listeners is not None else [])
        # KIP-848 consumer groups: the pure core, sharing this shard's timers; topics is the
        # catalog as it sees it (get(name) -> (topic id, partitions), names())
        core = ConsumerGroups(config.consumer,
                              topics if topics is not None else StaticTopics(), new_uuid, self.timers)
        self.consumer = ConsumerProtocol(shard_id, config, core, self.classic.groups, count)
        self.offsets = Offsets(shard_id, config, _OffsetGroups(self.classic, self.consumer), count)

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
        self.apply(rtype, key_obj, records.decode_value(rtype, value))
        return True

    def apply(self, rtype: int, key, value) -> None:
        """Apply a decoded record (key object, value object or None) to its owner."""
        if rtype == records.GROUP_METADATA:
            self.classic.replay_group(key.group, value)
            return
        self.offsets.replay(key.group, key.topic, key.partition, records.encode_value(value))

    # ==== start-up and stalls =====================================================================

    def on_loaded(self, now: int, wall: int) -> Result:
        """After replay: session timers for loaded members, the retention cycle, and a rebalance for
        groups over ``group_max_size`` (the limit may have been lowered)."""
        out = Result()
        for gid in self.consumer.groups:
            # a "simple" group rebuilt from offsets replayed before the consumer group's records
            # (a compacted log): the consumer group replaced it when it was made
            self.classic.drop_replaced_simple(gid)
        for gid, commit_ts in self.offsets.orphans():
            # offsets whose group gave way to another type that is gone since (an Empty consumer
            # group deleted by a classic JoinGroup that never completed): a "simple" group keeps
            # them reachable, as their replay would have made it
            self.classic.create_simple(gid, commit_ts)
        self.consumer.on_loaded(now)
        self.classic.on_loaded(now, wall, out)
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
        self.classic.on_stall(stall_ms, now, wall)

    # ==== where the group types meet ==============================================================

    def join_group(self, req, version: int, token, client_id: str, client_host: str, now: int, wall: int,
                   out: Result) -> None:
        if self.consumer.give_way_to_classic(req, version, token, out):
            self.classic.join_group(req, version, token, client_id, client_host, now, wall, out)

    def consumer_group_heartbeat(self, req, version: int, token, client_id: str, client_host: str,
                                 now: int, wall: int, out: Result) -> None:
        self._count("consumer_heartbeats")
        gid = req.group_id
        classic = self.classic.groups.get(gid) if gid else None
        if classic is not None:
            if req.member_epoch != 0 or classic.state != EMPTY or classic.members:
                out.reply(token, ConsumerGroupHeartbeatResponse(
                    error_code=errors.GROUP_ID_NOT_FOUND, error_message=f"Group {gid} is not a consumer group"))
                return
            try:  # a request the consumer core would refuse must not delete the classic group
                self.consumer.validate(req, version)
            except HeartbeatError as exc:
                out.reply(token, ConsumerGroupHeartbeatResponse(error_code=exc.code, error_message=exc.message))
                return
            # Kafka's maybeDeleteEmptyClassicGroup: an Empty classic group gives way (offsets stay)
            self.classic.write_tombstone(out, gid)
            log.info("classic_group_replaced", group_id=gid, by="consumer group")
        self.consumer.heartbeat(req, version, token, client_id, client_host, now, wall, out)

    # ==== group admin ============================================================================

    def describe_group(self, group_id: str,
                       include_authorized_operations: bool = False) -> DescribeGroupsResponseDescribedGroup:
        return self.classic.describe_group(group_id, include_authorized_operations)

    def delete_group(self, group_id: str, out: Result) -> int:
        consumer = group_id not in self.classic.groups and group_id in self.consumer.groups
        err = self.consumer.delete_group(group_id, out) if consumer else self.classic.check_delete(group_id)
        if err != _NONE:
            return err
        offsets = self.offsets.delete_group(group_id, out)
        if not consumer:
            self.classic.write_tombstone(out, group_id)
        self._count("groups_deleted")
        log.info("group_deleted", group_id=group_id, offsets=offsets,
                 type=PROTOCOL_TYPE if consumer else "classic")
        return _NONE

    def list_groups(self, states: set[str] | None,
                    types: set[str] | None) -> list[ListGroupsResponseListedGroup]:
        res = self.classic.list_groups(states) if not types or "classic" in types else []
        if not types or PROTOCOL_TYPE in types:
            for gid, state in self.consumer.list_groups(states):
                res.append(ListGroupsResponseListedGroup(gid, PROTOCOL_TYPE, state, PROTOCOL_TYPE))
        return res

    # ==== retention (KIP-211) ====================================================================

    def expire_offsets(self, wall: int, out: Result) -> int:
        """Tombstone expired offsets; delete Empty groups left with no offsets. Returns the number
        of offsets expired."""
        expired = groups_gone = 0
        offsets = self.offsets
        for gid, group in list(self.classic.groups.items()):
            base = group.offset_expiration_base() if offsets.committed.get(gid) else "commit"
            if base is None:
                continue  # no expiry now (and the group keeps its offsets)
            n, all_gone = offsets.expire(gid, group.is_subscribed_to_topic,
                                         group.state_wall_ms if base == "state" else None, wall, out)
            expired += n
            if all_gone and group.state == EMPTY and not group.pending_members:
                self.classic.write_tombstone(out, gid)
                self._count("groups_expired")
                groups_gone += 1
        # consumer groups (Kafka's ConsumerGroup.offsetExpirationCondition): by commit time, never
        # a topic its members subscribe to; an Empty one left with no offsets is deleted
        for gid, cgroup in list(self.consumer.groups.items()):
            n, all_gone = offsets.expire(gid, self.consumer.subscribed(gid).is_subscribed_to_topic, None,
                                         wall, out)
            expired += n
            if all_gone and not cgroup.members and self.consumer.delete_group(gid, out) == _NONE:
                self._count("groups_expired")
                groups_gone += 1
        if expired:
            self._count("offsets_expired", expired)
        if expired or groups_gone:
            log.info("offsets_expired", shard=self.shard_id, offsets=expired, groups_removed=groups_gone)
        return expired

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
            if kind in CLASSIC_TIMER_KINDS:
                self.classic.on_timer(key, now, wall, out)
            elif kind in CONSUMER_TIMER_KINDS:
                self.consumer.on_timer(key, now, wall, out)
            elif kind == "retention":
                self.expire_offsets(wall, out)
                timers.schedule(_RETENTION_KEY, now + self.config.offsets_retention_check_interval_ms)

    # ==== lifecycle ==============================================================================

    def parked(self) -> list[tuple[str, Parked]]:
        """Every parked request in this shard as ``("join"|"sync", parked)``."""
        return self.classic.parked()

    def release_parked(self, error: int, out: Result) -> None:
        """Answer every parked request with ``error`` (shutdown: NOT_COORDINATOR; a failed shard:
        COORDINATOR_NOT_AVAILABLE) and forget them."""
        self.classic.release_parked(error, out)
