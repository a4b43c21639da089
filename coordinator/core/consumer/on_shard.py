"""KIP-848 consumer groups on one shard: ConsumerGroupHeartbeat, ConsumerGroupDescribe, their
timers, and where they meet the classic groups. A mixin of :class:`coordinator.shard.Shard`.

The consumer-group protocol itself (the state tables, reconciliation, assignors, records) is the
pure core in :mod:`coordinator.consumer`; each shard holds one
:class:`~coordinator.consumer.ConsumerGroups` (``self.consumer``) that shares the shard's
:class:`~coordinator.timers.Timers` (keys ``("cg-session" | "cg-rebalance", group, member)``,
dispatched by :meth:`Shard.on_timers`). Its records are applied in memory as they are made and
go to the store through the :class:`~coordinator.result.Result` like every other write, so a
heartbeat's answer leaves only once they are durable.

One group id is one type at a time (Kafka's rules, migration policy "disabled"):

* ConsumerGroupHeartbeat joining (epoch 0) a classic group that is Empty (e.g. the "simple" group
  of offsets-only commits) replaces it: the classic group's tombstone, then the consumer group
  (its committed offsets stay). A classic group with members: GROUP_ID_NOT_FOUND ("Group g is
  not a consumer group"), as any non-join heartbeat for a classic group id.
* JoinGroup for an Empty consumer group deletes it (its tombstones; offsets stay) and the classic
  group is created; for a consumer group with members: INCONSISTENT_GROUP_PROTOCOL (Kafka 4.x
  would take the classic member into the consumer group: online migration, not in herd).
"""
from __future__ import annotations

import structlog

from coordinator.core.classic.group import EMPTY
from coordinator.core.consumer import ConsumerGroups
from coordinator.core.consumer.groups import HeartbeatError
from coordinator.core.responses import join_response
from coordinator.core.result import Result
from protocol import errors
from protocol.messages import ConsumerGroupHeartbeatResponse

__all__ = ["ConsumerProtocol", "CONSUMER_TIMER_KINDS", "PROTOCOL_TYPE"]

log = structlog.get_logger("herd.group")

CONSUMER_TIMER_KINDS = frozenset({"cg-session", "cg-rebalance"})
PROTOCOL_TYPE = "consumer"  # the protocol type and the group type of a consumer group


class ConsumerProtocol:
    """The consumer-group handlers of :class:`~coordinator.shard.Shard` (a mixin)."""

    consumer: ConsumerGroups

    def _consumer_writes(self, out: Result, recs) -> None:
        if recs:
            sid = self.shard_id
            out.writes.extend((sid, k, v) for k, v in recs)
            self._count("consumer_group_records", len(recs))

    # ==== ConsumerGroupHeartbeat ================================================================

    def consumer_group_heartbeat(self, req, version: int, token, client_id: str, client_host: str,
                                 now: int, wall: int, out: Result) -> None:
        self._count("consumer_heartbeats")
        gid = req.group_id
        classic = self.groups.get(gid) if gid else None
        if classic is not None:
            if req.member_epoch != 0 or classic.state != EMPTY or classic.members:
                out.reply(token, ConsumerGroupHeartbeatResponse(
                    error_code=errors.GROUP_ID_NOT_FOUND, error_message=f"Group {gid} is not a consumer group"))
                return
            try:  # a request the consumer core would refuse must not delete the classic group
                self.consumer._validate(req, version)
            except HeartbeatError as exc:
                out.reply(token, ConsumerGroupHeartbeatResponse(error_code=exc.code, error_message=exc.message))
                return
            # Kafka's maybeDeleteEmptyClassicGroup: an Empty classic group gives way (offsets stay)
            self._write_group_tombstone(out, gid)
            log.info("classic_group_replaced", group_id=gid, by="consumer group")
        group = self.consumer.groups.get(gid)
        before = None if group is None else (group.group_epoch, group.assignment_epoch)
        recs, resp = self.consumer.heartbeat(req, version, now, wall, client_id, client_host)
        self._consumer_writes(out, recs)
        group = self.consumer.groups.get(gid)
        if group is not None and (before is None or before != (group.group_epoch, group.assignment_epoch)):
            self._consumer_epoch_moved(group, wall)
        out.reply(token, resp)

    def consumer_heartbeat_steady(self, group_id: str, member_id: str, member_epoch: int, client_id: str,
                                  client_host: str, now: int) -> int | None:
        """The edge's steady-state ConsumerGroupHeartbeat (see ConsumerGroups.steady_heartbeat):
        the heartbeat interval, or None for the full path (also for a classic group's id)."""
        if group_id in self.groups:
            return None
        interval = self.consumer.steady_heartbeat(group_id, member_id, member_epoch, client_id, client_host, now)
        if interval is not None:
            self._count("consumer_heartbeats")
        return interval

    def _consumer_epoch_moved(self, group, wall: int) -> None:
        """Hook for the flight recorder (see Shard): the group or assignment epoch moved."""

    # ==== timers =================================================================================

    def _consumer_timer(self, key, now: int, wall: int, out: Result) -> None:
        group = self.consumer.groups.get(key[1])
        before = None if group is None else group.group_epoch
        self._consumer_writes(out, self.consumer.fire_timer(key, now, wall))
        group = self.consumer.groups.get(key[1])
        if group is not None and group.group_epoch != before:
            self._consumer_epoch_moved(group, wall)

    def consumer_topics_changed(self, now: int, wall: int, out: Result) -> None:
        groups = self.consumer.groups
        before = {gid: g.group_epoch for gid, g in groups.items()}
        self._consumer_writes(out, self.consumer.topics_changed(now, wall))
        for gid, g in groups.items():
            if before.get(gid) != g.group_epoch:
                self._consumer_epoch_moved(g, wall)

    # ==== the classic protocol meeting a consumer group ===========================================

    def classic_join_allowed(self, req, version: int, token, out: Result) -> bool:
        """Before a JoinGroup: False (answered) when ``req.group_id`` is a consumer group with
        members; an Empty consumer group is deleted (its tombstones) and the join goes on."""
        gid = req.group_id
        group = self.consumer.groups.get(gid)
        if group is None:
            return True
        if group.members:
            out.reply(token, join_response(version, errors.INCONSISTENT_GROUP_PROTOCOL, req.member_id))
            return False
        recs, err = self.consumer.delete_group(gid)
        self._consumer_writes(out, recs)
        log.info("consumer_group_replaced", group_id=gid, by="classic group")
        return True
