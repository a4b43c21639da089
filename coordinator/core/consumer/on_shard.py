"""KIP-848 consumer groups on one shard: ConsumerGroupHeartbeat, their timers, the flight
recorder of their epochs, and what the shard's other parts ask of them.

The consumer-group protocol itself (the state tables, reconciliation, assignors, records) is the
pure core in :mod:`coordinator.core.consumer`; each shard holds one :class:`ConsumerProtocol`, which
holds one :class:`~coordinator.core.consumer.ConsumerGroups` (``core``) sharing the shard's
:class:`~coordinator.core.timers.Timers` (keys ``("cg-session" | "cg-rebalance", group, member)``,
dispatched by :meth:`coordinator.core.shard.Shard.on_timers`). Its records are applied in memory as
they are made (the core's replay) and go to the store through the
:class:`~coordinator.core.result.Result` like every other write, so a heartbeat's answer leaves only
once they are durable.

One group id is one type at a time (Kafka's rules, migration policy "disabled"); the shard
enforces it (:meth:`coordinator.core.shard.Shard.consumer_group_heartbeat`,
:meth:`coordinator.core.shard.Shard.join_group`), this side is told the classic group ids at
construction (``classic_ids``: anything supporting ``in``, read only):

* ConsumerGroupHeartbeat joining (epoch 0) a classic group that is Empty (e.g. the "simple" group
  of offsets-only commits) replaces it: the classic group's tombstone, then the consumer group
  (its committed offsets stay). A classic group with members: GROUP_ID_NOT_FOUND ("Group g is
  not a consumer group"), as any non-join heartbeat for a classic group id.
* JoinGroup for an Empty consumer group deletes it (its tombstones; offsets stay) and the classic
  group is created; for a consumer group with members: INCONSISTENT_GROUP_PROTOCOL (Kafka 4.x
  would take the classic member into the consumer group: online migration, not in herd).
"""
from __future__ import annotations

from collections import deque

import structlog

from coordinator.core.consumer import ConsumerGroups, validate_offset_commit
from coordinator.core.consumer.groups import HeartbeatError, commit_partition_ok
from coordinator.core.responses import join_response
from coordinator.core.result import Result
from protocol import errors

__all__ = ["ConsumerProtocol", "CONSUMER_TIMER_KINDS", "PROTOCOL_TYPE", "HeartbeatError"]

log = structlog.get_logger("herd.group")

CONSUMER_TIMER_KINDS = frozenset({"cg-session", "cg-rebalance"})
PROTOCOL_TYPE = "consumer"  # the protocol type and the group type of a consumer group

_NONE = errors.NONE


class SubscribedTopics:
    """What OffsetDelete and offset expiry ask of a consumer group."""

    def __init__(self, cgroup):
        self.state = cgroup.state
        self._topics = cgroup.subscribed_topic_names() | {
            name for name, (tid, _) in cgroup.subscription_metadata.items()}

    def uses_consumer_protocol(self) -> bool:
        return True

    def is_subscribed_to_topic(self, topic: str) -> bool:
        return topic in self._topics


class ConsumerProtocol:
    """One shard's consumer groups: the pure core (``core``; ``groups`` is its group id ->
    :class:`~coordinator.core.consumer.group.ConsumerGroup`) and the flight recorder of their epochs
    (``history``: group id -> the last epoch moves, why and when)."""

    def __init__(self, shard_id: int, config, core: ConsumerGroups, classic_ids, count):
        self.shard_id = shard_id
        self.config = config
        self.core = core
        self.groups = core.groups  # read only; the core owns it
        self._classic_ids = classic_ids
        self._count = count
        self.history: dict[str, deque] = {}

    def _writes(self, out: Result, recs) -> None:
        if recs:
            sid = self.shard_id
            out.writes.extend((sid, k, v) for k, v in recs)
            self._count("consumer_group_records", len(recs))

    # ==== records ================================================================================

    def replay(self, key: bytes, value: bytes | None) -> None:
        self.core.replay(key, value)

    def on_loaded(self, now: int) -> None:
        self.core.on_loaded(now)

    # ==== ConsumerGroupHeartbeat ================================================================

    def validate(self, req, version: int) -> None:
        """HeartbeatError for a request the core would refuse (checked before a classic group
        gives way to it)."""
        self.core.validate(req, version)

    def heartbeat(self, req, version: int, token, client_id: str, client_host: str, now: int, wall: int,
                  out: Result) -> None:
        gid = req.group_id
        group = self.groups.get(gid)
        before = None if group is None else (group.group_epoch, group.assignment_epoch)
        recs, resp = self.core.heartbeat(req, version, now, wall, client_id, client_host,
                                         getattr(token, "topic_filter", None))
        self._writes(out, recs)
        group = self.groups.get(gid)
        if group is not None and (before is None or before != (group.group_epoch, group.assignment_epoch)):
            self._epoch_moved(group, wall)
        out.reply(token, resp)

    def steady_heartbeat(self, group_id: str, member_id: str, member_epoch: int, client_id: str,
                         client_host: str, now: int) -> int | None:
        """The edge's steady-state ConsumerGroupHeartbeat (see ConsumerGroups.steady_heartbeat):
        the heartbeat interval, or None for the full path (also for a classic group's id)."""
        if group_id in self._classic_ids:
            return None
        interval = self.core.steady_heartbeat(group_id, member_id, member_epoch, client_id, client_host, now)
        if interval is not None:
            self._count("consumer_heartbeats")
        return interval

    def _epoch_moved(self, group, wall: int) -> None:
        """The flight recorder of consumer groups: each move of the group epoch or the target
        assignment epoch, with why it moved (the core's reason) and when."""
        hist = self.history.get(group.group_id)
        if hist is None:
            hist = self.history[group.group_id] = deque(maxlen=self.config.rebalance_history_size)
        reason = group.epoch_reasons[-1][1] if group.epoch_reasons and \
            group.epoch_reasons[-1][0] == group.group_epoch else "target assignment computed"
        if hist and hist[-1]["group_epoch"] == group.group_epoch and hist[-1]["reason"] == reason:
            hist[-1].update(assignment_epoch=group.assignment_epoch, state=group.state)
            return
        hist.append({"group_epoch": group.group_epoch, "assignment_epoch": group.assignment_epoch,
                     "reason": reason, "state": group.state, "members": len(group.members),
                     "wall_ms": wall})
        self._count("consumer_group_epoch_bumps")

    # ==== timers =================================================================================

    def on_timer(self, key, now: int, wall: int, out: Result) -> None:
        group = self.groups.get(key[1])
        before = None if group is None else group.group_epoch
        self._writes(out, self.core.fire_timer(key, now, wall))
        group = self.groups.get(key[1])
        if group is not None and group.group_epoch != before:
            self._epoch_moved(group, wall)

    def topics_changed(self, now: int, wall: int, out: Result) -> None:
        groups = self.groups
        before = {gid: g.group_epoch for gid, g in groups.items()}
        self._writes(out, self.core.topics_changed(now, wall))
        for gid, g in groups.items():
            if before.get(gid) != g.group_epoch:
                self._epoch_moved(g, wall)

    # ==== what the shard's other parts ask ========================================================

    def give_way_to_classic(self, req, version: int, token, out: Result) -> bool:
        """Before a JoinGroup: False (answered) when ``req.group_id`` is a consumer group with
        members; an Empty consumer group is deleted (its tombstones) and the join goes on."""
        gid = req.group_id
        group = self.groups.get(gid)
        if group is None:
            return True
        if group.members:
            out.reply(token, join_response(version, errors.INCONSISTENT_GROUP_PROTOCOL, req.member_id))
            return False
        recs, err = self.core.delete_group(gid)
        self._writes(out, recs)
        log.info("consumer_group_replaced", group_id=gid, by="classic group")
        return True

    def delete_group(self, gid: str, out: Result) -> int:
        """Delete consumer group ``gid`` (its tombstones; DeleteGroups, expiry) -> error code."""
        recs, err = self.core.delete_group(gid)
        if err == _NONE:
            self._writes(out, recs)
            self.history.pop(gid, None)
        return err

    def validate_offset_commit(self, gid: str, member_id: str, member_epoch: int, version: int) -> int:
        return validate_offset_commit(self.groups[gid], member_id, member_epoch, version)

    def commit_partition_check(self, gid: str, member_id: str, member_epoch: int):
        group = self.groups[gid]
        return lambda topic, partition: commit_partition_ok(group, member_id, member_epoch, topic, partition)

    def subscribed(self, gid: str) -> SubscribedTopics:
        return SubscribedTopics(self.groups[gid])

    def list_groups(self, states: set[str] | None):
        return self.core.list_groups(states)

    def describe(self, group_ids, include_authorized_operations: bool):
        return self.core.describe(group_ids, include_authorized_operations)
