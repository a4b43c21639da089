"""The classic group protocol on one shard: JoinGroup, SyncGroup, Heartbeat, LeaveGroup, the
rebalance they drive and its timers (session expiry, join completion, pending members and
syncs), the GroupMetadata records and their replay, and the operator's view of classic groups
(DescribeGroups, ListGroups, parked requests). :class:`ClassicGroups` owns the shard's classic
groups; the shard (:class:`coordinator.core.shard.Shard`) holds one, beside its offsets and its
consumer groups, and passes it the shard's :class:`~coordinator.core.timers.Timers` (keys
``("hb"|"pending", group, member)``, ``("join"|"sync", group)``). The group's own state table is
:mod:`coordinator.core.classic.group`.

A GroupMetadata record snapshots a group (written when the leader's SyncGroup stores the
assignment, when a group falls Empty, and when a static member is replaced without a rebalance).
The live group object is authoritative while the process runs (it also holds parked requests and
rebalance progress that are never persisted, as in Kafka); replay rebuilds it as Stable/Empty. A
GroupMetadata tombstone deletes the group (DeleteGroups, expiry, a consumer group taking its id):
:meth:`ClassicGroups.write_tombstone` writes it and replays it, as start-up does.

Member ids are minted here (``<client id or instance id>-<uuid4>``, as Kafka) and only ever read
back from records, so replay is deterministic.
"""
from __future__ import annotations

import itertools

import structlog

from coordinator.core import records
from coordinator.core.classic import encoded
from coordinator.core.classic.group import (
    COMPLETING_REBALANCE,
    DEAD,
    EMPTY,
    PREPARING_REBALANCE,
    STABLE,
    Group,
    Member,
    Parked,
    RebalanceRecord,
)
from coordinator.core.responses import join_response, sync_response
from coordinator.core.result import Result
from coordinator.core.timers import Timers
from protocol import errors
from protocol._base import _ENCODE_FAILURES
from protocol.messages import (
    DescribeGroupsResponseDescribedGroup,
    DescribeGroupsResponseDescribedGroupMember,
    GroupMetadataValue,
    JoinGroupResponseMember,
    LeaveGroupRequestMemberIdentity,
    LeaveGroupResponse,
    LeaveGroupResponseMemberResponse,
    ListGroupsResponseListedGroup,
)

__all__ = ["ClassicGroups", "NEW_MEMBER_JOIN_TIMEOUT_MS", "CLASSIC_TIMER_KINDS"]

log = structlog.get_logger("herd.group")

# Kafka's group.classic.new.member.join.timeout: a new member whose JoinGroup is parked is dropped
# after this long if the rebalance has not completed (it cannot heartbeat without its member id).
NEW_MEMBER_JOIN_TIMEOUT_MS = 300_000
# a big group's JoinGroup / SyncGroup answers are built this many per loop turn (Result.later)
ANSWER_SLICE = 256
# a big group's record is encoded this many members per loop turn after the leader's SyncGroup
RECORD_SLICE = 1000

# Operations a describing client may perform on a group when no authorizer is configured:
# READ(3), DELETE(6), DESCRIBE(8), DESCRIBE_CONFIGS(10), ALTER_CONFIGS(11).
GROUP_AUTHORIZED_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8) | (1 << 10) | (1 << 11)

CLASSIC_TIMER_KINDS = frozenset({"hb", "pending", "join", "sync"})

_NONE = errors.NONE


def _member_ident(member: Member) -> dict:
    return {"member_id": member.member_id, "group_instance_id": member.group_instance_id,
            "client_id": member.client_id, "client_host": member.client_host}


class _JoinCtx:
    __slots__ = ("req", "version", "token", "client_id", "client_host", "protocols", "rebalance_timeout",
                 "instance_id", "reason")

    def __init__(self, req, version, token, client_id, client_host, protocols, rebalance_timeout, instance_id,
                 reason):
        self.req = req
        self.version = version
        self.token = token
        self.client_id = client_id
        self.client_host = client_host
        self.protocols = protocols
        self.rebalance_timeout = rebalance_timeout
        self.instance_id = instance_id
        self.reason = reason


class ClassicGroups:
    """One shard's classic groups (``groups``: group id -> :class:`Group`) and their protocol.

    Given at construction: the shard id (written into records), the group config, the shard's
    :class:`Timers` (shared with the consumer groups: each side schedules only its own keys),
    ``new_uuid`` (member ids), ``count(name, n=1)`` (the coordinator's counters) and
    ``listeners`` (called with each completed rebalance's summary: RebalanceRecord.summary)."""

    def __init__(self, shard_id: int, config, timers: Timers, new_uuid, count, listeners):
        self.shard_id = shard_id
        self._shard_set = frozenset((shard_id,))  # the shards a later slice's answers wait on
        self.config = config
        self.timers = timers
        self._new_uuid = new_uuid
        self._count = count
        self.listeners = listeners
        self.groups: dict[str, Group] = {}
        # the last stall of herd itself (on_stall): {"stall_ms", "ended_ms", "ended_wall_ms"}; the
        # flight recorder marks the rebalances it may have caused
        self.last_stall: dict | None = None

    # ==== JoinGroup ==============================================================================

    def join_group(self, req, version: int, token, client_id: str, client_host: str, now: int, wall: int,
                   out: Result) -> None:
        gid = req.group_id
        mid = req.member_id
        if not gid:
            out.reply(token, join_response(version, errors.INVALID_GROUP_ID, mid))
            return
        cfg = self.config
        if not cfg.min_session_timeout_ms <= req.session_timeout_ms <= cfg.max_session_timeout_ms:
            out.reply(token, join_response(version, errors.INVALID_SESSION_TIMEOUT, mid))
            return
        unknown = mid == ""
        group = self.groups.get(gid)
        if group is None:
            if not unknown:
                out.reply(token, join_response(version, errors.UNKNOWN_MEMBER_ID, mid))
                return
            group = Group(gid, state_wall_ms=wall, history_size=cfg.rebalance_history_size)
            self.groups[gid] = group
        size_id = mid
        if unknown and version >= 5 and req.group_instance_id is not None:
            # herd: a restarting static member takes its own place back, so a full group can still
            # restart its members (Kafka checks it as a newcomer and may answer GROUP_MAX_SIZE_REACHED)
            size_id = group.static_members.get(req.group_instance_id, mid)
        if not self._accept_joining_member(group, size_id):
            member = group.members.get(mid)
            if member is not None:
                self._remove_member_and_update(group, member, "over_capacity",
                                               "member rejected: group_max_size reached", now, wall, out)
            out.reply(token, join_response(version, errors.GROUP_MAX_SIZE_REACHED, ""))
            if mid in group.pending_members:
                # the client resets its id: a kept pending id would hold the join phase until it
                # expires (Kafka's group.remove forgets pending ids too)
                group.pending_members.discard(mid)
                self.timers.cancel(("pending", gid, mid))
                self._maybe_complete_join_phase(group, now, wall, out)
            return
        protocols = [(p.name, p.metadata) for p in req.protocols]
        rebalance_timeout = req.session_timeout_ms if version == 0 else req.rebalance_timeout_ms
        ctx = _JoinCtx(req, version, token, client_id, client_host, protocols, rebalance_timeout,
                       req.group_instance_id if version >= 5 else None, req.reason if version >= 8 else None)
        if unknown:
            self._join_new_member(group, ctx, now, wall, out)
        else:
            self._join_existing_member(group, ctx, now, wall, out)

    def _accept_joining_member(self, group: Group, member_id: str) -> bool:
        limit = self.config.group_max_size
        state = group.state
        if state in (EMPTY, DEAD):
            return True
        member = group.members.get(member_id)
        if state == PREPARING_REBALANCE:
            # counting awaiting members lets the last members to rejoin be the ones kicked out
            return (member is not None and member.join is not None) or group.num_awaiting_join < limit
        return member is not None or len(group.members) < limit

    def _join_new_member(self, group: Group, ctx: _JoinCtx, now: int, wall: int, out: Result) -> None:
        req, version = ctx.req, ctx.version
        if group.state == DEAD:
            out.reply(ctx.token, join_response(version, errors.COORDINATOR_NOT_AVAILABLE, ""))
            return
        if not group.supports_protocols(req.protocol_type, [n for n, _ in ctx.protocols]):
            out.reply(ctx.token, join_response(version, errors.INCONSISTENT_GROUP_PROTOCOL, ""))
            return
        iid = ctx.instance_id
        if iid is None and self.last_stall is not None:
            self._drop_member_given_up_after_stall(group, ctx, now, wall, out)
        new_id = f"{iid if iid is not None else ctx.client_id}-{self._new_uuid()}"
        if iid is not None:
            old_id = group.static_members.get(iid)
            if old_id is not None:
                self._replace_static_member(group, ctx, old_id, new_id, now, wall, out)
            else:
                self._add_member_and_rebalance(group, ctx, new_id, now, wall, out)
        elif version >= 4:
            # KIP-394: hand out the id and wait for the member to come back with it
            group.pending_members.add(new_id)
            self.timers.schedule(("pending", group.group_id, new_id), now + req.session_timeout_ms)
            if group.rebalance is not None and group.state == PREPARING_REBALANCE:
                group.rebalance.on_pending(new_id, ctx.client_id, ctx.client_host, now)
            out.reply(ctx.token, join_response(version, errors.MEMBER_ID_REQUIRED, new_id))
        else:
            self._add_member_and_rebalance(group, ctx, new_id, now, wall, out)

    def _drop_member_given_up_after_stall(self, group: Group, ctx: _JoinCtx, now: int, wall: int,
                                          out: Result) -> None:
        """A JoinGroup without a member id from the client id and host of a dynamic member that
        lives on time herd gave back after its own stall: that client gave its session up and starts
        over (librdkafka does after session.timeout.ms without a heartbeat answer: it drops its
        member id, closes the coordinator connection and joins anew). The old member is removed now
        (one per such JoinGroup) rather than when its moved deadline passes, which would hold the
        group's next rebalance that long. Outside that window herd does as Kafka does."""
        # the group's dynamic members at the stall, by client (on_stall): no scan of every member
        # for each newcomer (O(members²) while a big group forms after a stall)
        stalled = group.stalled_clients
        if stalled is None:
            return
        until, by_client = stalled
        if now > until:  # the window has passed for every member of then: forget them
            group.stalled_clients = None
            return
        for m in by_client.get((ctx.client_id, ctx.client_host), ()):
            if (group.members.get(m.member_id) is m and now <= m.stall_until and m.join is None):
                log.info("member_rejoined_as_new", group_id=group.group_id, member_id=m.member_id,
                         client_id=m.client_id, client_host=m.client_host, generation=group.generation,
                         shard=self.shard_id)
                detail = (f"member {m.member_id} (client {m.client_id!r} from {m.client_host or '?'}) joined "
                          f"again without its id after herd stalled: it had given its session up")
                self._remove_member_and_update(group, m, "rejoined_as_new", detail, now, wall, out)
                return

    def _join_existing_member(self, group: Group, ctx: _JoinCtx, now: int, wall: int, out: Result) -> None:
        req, version, token = ctx.req, ctx.version, ctx.token
        mid = req.member_id
        if group.state == DEAD:
            out.reply(token, join_response(version, errors.COORDINATOR_NOT_AVAILABLE, mid))
            return
        if not group.supports_protocols(req.protocol_type, [n for n, _ in ctx.protocols]):
            out.reply(token, join_response(version, errors.INCONSISTENT_GROUP_PROTOCOL, mid))
            return
        if mid in group.pending_members:
            if ctx.instance_id is not None:
                # Kafka raises IllegalStateException here (a pending member is never static)
                out.reply(token, join_response(version, errors.UNKNOWN_SERVER_ERROR, mid))
                return
            self._add_member_and_rebalance(group, ctx, mid, now, wall, out)
            return
        err = group.validate_member(mid, ctx.instance_id)
        if err != _NONE:
            out.reply(token, join_response(version, err, mid))
            return
        member = group.members[mid]
        state = group.state
        if state == PREPARING_REBALANCE:
            self._update_member_and_rebalance(group, member, ctx, "member_rejoined", "", now, wall, out)
        elif state == COMPLETING_REBALANCE:
            if member.matches(ctx.protocols):
                # a retry of a JoinGroup whose response was lost: answer with the current generation
                out.reply(token, self._join_answer(group, version, mid))
            else:
                detail = f"member {mid} changed its metadata during {state}"
                self._update_member_and_rebalance(group, member, ctx, "metadata_changed", detail, now, wall,
                                                  out)
        elif state == STABLE:
            if group.is_leader(mid):
                # the leader rejoins to trigger a rebalance (e.g. topic metadata changed)
                self._update_member_and_rebalance(group, member, ctx, "leader_rejoin",
                                                  f"leader {mid} rejoined during Stable", now, wall, out)
            elif not member.matches(ctx.protocols):
                detail = f"member {mid} changed its metadata during Stable"
                self._update_member_and_rebalance(group, member, ctx, "metadata_changed", detail, now, wall,
                                                  out)
            else:
                out.reply(token, join_response(version, _NONE, mid, group.generation, group.protocol_type,
                                               group.protocol_name, group.leader_id, []))
        else:  # Empty: the member was lost (e.g. expired); make it start over
            out.reply(token, join_response(version, errors.UNKNOWN_MEMBER_ID, mid))

    def _join_members(self, group: Group, version: int) -> list[JoinGroupResponseMember]:
        return encoded.join_members(group, version)[0]

    def _join_answer(self, group: Group, version: int, mid: str):
        """The successful JoinGroup answer of member ``mid`` in the group's current generation: the
        leader's lists every member, from the parts each member keeps encoded (encoded.py)."""
        if group.is_leader(mid):
            return encoded.leader_join_response(version, _NONE, mid, group.generation, group.protocol_type,
                                                group.protocol_name, group.leader_id, group)
        return join_response(version, _NONE, mid, group.generation, group.protocol_type, group.protocol_name,
                             group.leader_id, [])

    def _add_member_and_rebalance(self, group: Group, ctx: _JoinCtx, member_id: str, now: int, wall: int,
                                  out: Result) -> None:
        gid = group.group_id
        member = Member(member_id, ctx.instance_id, ctx.client_id, ctx.client_host, ctx.rebalance_timeout,
                        ctx.req.session_timeout_ms, ctx.req.protocol_type, ctx.protocols,
                        hb_key=("hb", gid, member_id), joined_wall_ms=wall)
        member.is_new = True
        encoded.warm(member, ctx.version)
        if group.state == PREPARING_REBALANCE and group.generation == 0:
            # extends the initial rebalance delay of a brand-new group only (Kafka's
            # addMemberAndRebalance): a group coming back from Empty waits one delay
            group.new_member_added = True
        group.add(member)
        group.set_join(member, Parked(ctx.token, ctx.version, now))
        self.timers.cancel(("pending", gid, member_id))
        # a parked new member cannot heartbeat (no id yet): bound its wait instead
        self.timers.schedule(member.hb_key, now + NEW_MEMBER_JOIN_TIMEOUT_MS)
        if group.rebalance is not None and group.state == PREPARING_REBALANCE:
            group.rebalance.on_join(member, now)
        initial = group.state == EMPTY
        self._maybe_prepare_rebalance_or_complete_join(
            group, "initial" if initial else "member_joined",
            f"member {member_id} joined (client {ctx.client_id!r} from {ctx.client_host or '?'})",
            _member_ident(member), ctx.reason, now, wall, out)

    def _update_member_and_rebalance(self, group: Group, member: Member, ctx: _JoinCtx, reason: str,
                                     detail: str, now: int, wall: int, out: Result) -> None:
        group.update_member(member, ctx.protocols, ctx.rebalance_timeout, ctx.req.session_timeout_ms)
        encoded.warm(member, ctx.version)
        self._park_join(group, member, Parked(ctx.token, ctx.version, now), out)
        if group.rebalance is not None and group.state == PREPARING_REBALANCE:
            group.rebalance.on_join(member, now)
        self._maybe_prepare_rebalance_or_complete_join(group, reason, detail, _member_ident(member),
                                                       ctx.reason, now, wall, out)

    def _park_join(self, group: Group, member: Member, parked: Parked, out: Result) -> None:
        old = group.set_join(member, parked)
        if old is not None and old.token is not parked.token:
            # herd: a JoinGroup superseded by a newer one from the same member is answered rather
            # than dropped (Kafka drops it), so no connection waits forever
            out.reply(old.token, join_response(old.version, errors.REBALANCE_IN_PROGRESS, member.member_id))

    def _replace_static_member(self, group: Group, ctx: _JoinCtx, old_id: str, new_id: str, now: int,
                               wall: int, out: Result) -> None:
        """KIP-345: a static member came back with no member id: it takes over its instance id."""
        gid = group.group_id
        current_leader = group.leader_id
        old, new = group.replace_static_member(ctx.instance_id, old_id, new_id, ("hb", gid, new_id))
        # fence whoever still holds the old member id
        if old.join is not None:
            out.reply(old.join.token, join_response(old.join.version, errors.FENCED_INSTANCE_ID, old_id))
            old.join = None
        if old.sync is not None:
            out.reply(old.sync.token, sync_response(old.sync.version, errors.FENCED_INSTANCE_ID))
            old.sync = None
        self.timers.cancel(old.hb_key)
        self.timers.schedule(new.hb_key, now + new.session_timeout_ms)
        if group.rebalance is not None:
            group.rebalance.on_replaced(old_id, new, now)
        group.update_member(new, ctx.protocols, ctx.rebalance_timeout, ctx.req.session_timeout_ms)
        group.set_join(new, Parked(ctx.token, ctx.version, now))
        detail = f"static member {ctx.instance_id} restarted: {old_id} replaced by {new_id}"
        state = group.state
        if state == STABLE:
            if group.protocol_name == group.select_protocol():
                # nothing the assignment depends on changed: persist the new id, no rebalance
                parked = group.take_join(new)
                group.subscribed_topics = group.compute_subscribed_topics()  # its subscription may differ
                self._write_group(out, group)
                self._count("static_member_rejoins_without_rebalance")
                v = parked.version
                if v >= 9:
                    is_leader = group.is_leader(new_id)
                    members = self._join_members(group, v) if is_leader else []
                    resp = join_response(v, _NONE, new_id, group.generation, group.protocol_type,
                                         group.protocol_name, group.leader_id, members,
                                         skip_assignment=is_leader)
                else:
                    # before v9 the old leader id is returned, so a restarted leader acts as a
                    # follower and fetches its stored assignment instead of reassigning
                    resp = join_response(v, _NONE, new_id, group.generation, group.protocol_type,
                                         group.protocol_name, current_leader, [])
                out.reply(parked.token, resp)
                return
            self._maybe_prepare_rebalance_or_complete_join(
                group, "static_member_replaced", detail + " with a protocol change", _member_ident(new),
                ctx.reason, now, wall, out)
        elif state == COMPLETING_REBALANCE:
            # the leader may already be assigning to the old id: start over
            self._prepare_rebalance(group, "static_member_replaced", detail + " during CompletingRebalance",
                                    _member_ident(new), ctx.reason, now, wall, out)
        elif state == PREPARING_REBALANCE:
            self._maybe_complete_join_phase(group, now, wall, out)
        else:  # pragma: no cover - a known static member cannot be in an Empty group
            raise RuntimeError(f"static member {ctx.instance_id} rejoined group {gid} in state {state}")

    # ==== rebalance machinery ====================================================================

    def _maybe_prepare_rebalance_or_complete_join(self, group: Group, reason: str, detail: str, trigger,
                                                  client_reason, now: int, wall: int, out: Result) -> None:
        if group.can_rebalance():
            self._prepare_rebalance(group, reason, detail, trigger, client_reason, now, wall, out)
        else:
            self._maybe_complete_join_phase(group, now, wall, out)

    def _prepare_rebalance(self, group: Group, reason: str, detail: str, trigger, client_reason, now: int,
                           wall: int, out: Result) -> None:
        gid = group.group_id
        if group.state == COMPLETING_REBALANCE:
            self._reset_and_propagate_assignment_error(group, errors.REBALANCE_IN_PROGRESS, now, out)
        group.pending_sync.clear()
        self.timers.cancel(("sync", gid))
        if group.rebalance is not None:  # a rebalance restarted before it completed
            self._finish_rebalance(group, "restarted", now, wall)
        initial = group.state == EMPTY
        group.rebalance = RebalanceRecord(group, reason, detail, trigger, client_reason, now, wall)
        stall = self.stall_mark(group, now)
        if stall is not None:
            group.rebalance.mark_stall(stall, now, during=False)
        self._count("rebalances_started")
        if initial:
            delay = self.config.initial_rebalance_delay_ms
            remaining = max(group.rebalance_timeout_ms() - delay, 0)
            group.join_phase = ("initial", delay, remaining)
            self.timers.schedule(("join", gid), now + delay)
        group.transition_to(PREPARING_REBALANCE, wall)
        if not initial:
            if group.has_all_members_joined():
                self._complete_join(group, now, wall, out)
            else:
                group.join_phase = ("normal",)
                self.timers.schedule(("join", gid), now + group.rebalance_timeout_ms())

    def _maybe_complete_join_phase(self, group: Group, now: int, wall: int, out: Result) -> None:
        # the initial rebalance of an Empty group always waits for its (debounced) delay
        if (group.state == PREPARING_REBALANCE and group.previous_state != EMPTY
                and group.has_all_members_joined()):
            self._complete_join(group, now, wall, out)

    def _complete_join(self, group: Group, now: int, wall: int, out: Result) -> None:
        gid = group.group_id
        self.timers.cancel(("join", gid))
        group.join_phase = None
        rec = group.rebalance
        for m in group.not_yet_rejoined():
            if not m.is_static:  # static members keep their place until their session expires
                self._drop_member(group, m, "missed_rejoin", now, out)
        if group.state == DEAD:
            return
        if not group.maybe_elect_new_joined_leader() and group.members:
            # nobody rejoined (only static members remain): wait another round for sessions to expire
            group.join_phase = ("normal",)
            self.timers.schedule(("join", gid), now + group.rebalance_timeout_ms())
            return
        group.init_next_generation(wall)
        if group.state == EMPTY:
            self._write_group(out, group)
            if rec is not None:
                rec.on_join_done(group, now)
                self._finish_rebalance(group, "empty", now, wall)
            return
        if rec is not None:
            rec.on_join_done(group, now)
        members = list(group.members.values())
        for m in members:
            m.is_new = False
        group.pending_sync.update(group.members)
        group.sync_generation = group.generation
        self.timers.schedule(("sync", gid), now + group.rebalance_timeout_ms())
        # the answers: the leader's first (it assigns), the rest in slices (a big group's thousands
        # of answers are built over several loop turns, each slice checking the generation holds).
        # A big group's leader answer (every member's metadata) waits for the next turn too: this
        # one has done the group's O(members) passes already
        if len(members) <= ANSWER_SLICE:
            leader = group.members.get(group.leader_id)
            if leader is not None:
                self._answer_join(group, leader, now, out)
            self._answer_joins(group, group.generation, members, 0, now, out)
        else:
            self._later_answer_joins(group, group.generation, members, -1, out)

    def _answer_join(self, group: Group, m: Member, now: int, out: Result) -> None:
        parked = group.take_join(m)
        if parked is not None:
            out.reply(parked.token, self._join_answer(group, parked.version, m.member_id))
            # its session restarts now. herd: only for members that rejoined; Kafka also restarts
            # the session of a static member that did not rejoin, which lets it stay silent for
            # longer than its session timeout
            self.timers.schedule(m.hb_key, now + m.session_timeout_ms)

    def _answer_joins(self, group: Group, generation: int, members: list[Member], start: int, now: int,
                      out: Result) -> None:
        """Answer the parked JoinGroups of ``members[start:]`` (the join phase of ``generation``
        just ended), ANSWER_SLICE of them now and the rest in later slices (``out.defer``). A later
        slice answers only while the group is the same, at ``generation``, and past its join phase
        (CompletingRebalance, or Stable once the leader has synced); else the rest stay parked and
        the next join phase's end answers them. A member removed meanwhile was answered then."""
        end = start + ANSWER_SLICE
        current = group.members
        for m in members[start:end]:
            if current.get(m.member_id) is m:
                self._answer_join(group, m, now, out)
        if end < len(members):
            self._later_answer_joins(group, generation, members, end, out)

    def _later_answer_joins(self, group: Group, generation: int, members: list[Member], start: int,
                            out: Result) -> None:
        """In a later loop turn, while the group is the same, at ``generation`` and past its join
        phase: ``_answer_joins(start)``, or with ``start`` -1 the leader's answer alone (its turn
        builds the list of every member) and the slices after."""
        gid = group.group_id

        def more(now: int, wall: int) -> Result:
            res = Result(shards=self._shard_set)
            if (self.groups.get(gid) is group and group.generation == generation
                    and group.state in (COMPLETING_REBALANCE, STABLE)):
                if start >= 0:
                    self._answer_joins(group, generation, members, start, now, res)
                else:
                    leader = group.members.get(group.leader_id)
                    if leader is not None:
                        self._answer_join(group, leader, now, res)
                    self._later_answer_joins(group, generation, members, 0, res)
            return res
        out.defer(more)

    def _drop_member(self, group: Group, member: Member, why: str, now: int, out: Result) -> None:
        """Remove a member, answering its parked requests with UNKNOWN_MEMBER_ID (so a live client
        rejoins); no rebalance decision here."""
        parked = group.take_join(member)
        if parked is not None:
            out.reply(parked.token, join_response(parked.version, errors.UNKNOWN_MEMBER_ID, ""))
        if member.sync is not None:
            out.reply(member.sync.token, sync_response(member.sync.version, errors.UNKNOWN_MEMBER_ID))
            member.sync = None
        group.remove(member.member_id)
        self.timers.cancel(member.hb_key)
        if group.rebalance is not None:
            group.rebalance.on_removed(member.member_id, why, now)
        self._count("members_removed_" + why)

    def _remove_member_and_update(self, group: Group, member: Member, reason: str, detail: str, now: int,
                                  wall: int, out: Result) -> None:
        self._drop_member(group, member, reason, now, out)
        state = group.state
        if state in (STABLE, COMPLETING_REBALANCE):
            self._maybe_prepare_rebalance_or_complete_join(group, reason, detail, _member_ident(member), None,
                                                           now, wall, out)
        elif state == PREPARING_REBALANCE and group.has_all_members_joined():
            self._complete_join(group, now, wall, out)

    def _reset_and_propagate_assignment_error(self, group: Group, error: int, now: int, out: Result) -> None:
        for m in group.members.values():
            m.assignment = b""
        self._propagate_assignment(group, error, now, out)

    def _propagate_assignment(self, group: Group, error: int, now: int, out: Result) -> None:
        self._answer_syncs(group, error, (group.protocol_type, group.protocol_name), list(group.members.values()),
                           0, now, out)

    def _answer_syncs(self, group: Group, error: int, protocol: tuple, members: list[Member], start: int,
                      now: int, out: Result) -> None:
        """Answer the parked SyncGroups of ``members[start:]`` with ``error`` and each member's
        assignment, ANSWER_SLICE of them now and the rest in later slices (``out.defer``), while
        the group is the same object: whatever happens to it meanwhile, a member still parked
        here was given this assignment (a new rebalance or a removal answers or drops the parked
        request itself, and then there is nothing left to answer here)."""
        ptype, pname = protocol
        end = start + ANSWER_SLICE
        schedule = self.timers.schedule
        for m in members[start:end]:
            parked = m.sync
            if parked is not None:
                m.sync = None
                out.reply(parked.token, sync_response(parked.version, error, ptype, pname, m.assignment))
                schedule(m.hb_key, now + m.session_timeout_ms)
        if end < len(members):
            gid = group.group_id

            def more(now: int, wall: int) -> Result:
                res = Result(shards=self._shard_set)
                if self.groups.get(gid) is group:
                    self._answer_syncs(group, error, protocol, members, end, now, res)
                return res
            out.defer(more)

    def _finish_rebalance(self, group: Group, outcome: str, now: int, wall: int) -> None:
        rec = group.rebalance
        group.rebalance = None
        if rec is None:
            return
        rec.finish(group, outcome, now, wall)
        entry = rec.summary()
        group.history.append(rec)  # kept as the record: followers' late SyncGroups still update it
        self._count(f"rebalances_{outcome}")
        if outcome in ("stable", "empty"):
            self._count(f"rebalances_completed_reason_{rec.reason}")
            for listener in self.listeners:
                listener(entry)
            stall = {} if rec.stall is None else {"stall": rec.stall}  # herd stalled during/just before
            log.info("rebalance_completed", group_id=group.group_id, generation=entry["generation"],
                     members=entry["members"], reason=rec.reason, duration_ms=entry["duration_ms"],
                     outcome=outcome, protocol=entry["protocol"], detail=rec.detail,
                     preparing_ms=entry["phases"]["preparing_ms"],
                     completing_ms=entry["phases"]["completing_ms"],
                     shard=self.shard_id, **stall, **_pending_summary(rec.pending_entries(), rec.pending_outcomes))

    # ==== SyncGroup ==============================================================================

    def sync_group(self, req, version: int, token, now: int, wall: int, out: Result) -> None:
        gid = req.group_id
        if not gid:
            out.reply(token, sync_response(version, errors.INVALID_GROUP_ID))
            return
        if version >= 5 and (req.protocol_type is None or req.protocol_name is None):
            out.reply(token, sync_response(version, errors.INCONSISTENT_GROUP_PROTOCOL))
            return
        group = self.groups.get(gid)
        if group is None or group.state == EMPTY:
            out.reply(token, sync_response(version, errors.UNKNOWN_MEMBER_ID))
            return
        mid = req.member_id
        err = group.validate_member(mid, req.group_instance_id if version >= 3 else None)
        if err == _NONE and req.generation_id != group.generation:
            err = errors.ILLEGAL_GENERATION
        if err == _NONE and ((req.protocol_type is not None and group.protocol_type is not None
                              and req.protocol_type != group.protocol_type)
                             or (req.protocol_name is not None and group.protocol_name is not None
                                 and req.protocol_name != group.protocol_name)):
            err = errors.INCONSISTENT_GROUP_PROTOCOL
        if err != _NONE:
            out.reply(token, sync_response(version, err))
            return
        state = group.state
        member = group.members[mid]
        if state == PREPARING_REBALANCE:
            out.reply(token, sync_response(version, errors.REBALANCE_IN_PROGRESS))
        elif state == COMPLETING_REBALANCE:
            old = member.sync
            if old is not None and old.token is not token:
                out.reply(old.token, sync_response(old.version, errors.REBALANCE_IN_PROGRESS))
            member.sync = Parked(token, version, now)
            self._remove_pending_sync(group, mid)
            if group.rebalance is not None:
                group.rebalance.on_sync(mid, now)
            if group.is_leader(mid):
                members = list(group.members.values())
                if len(members) <= RECORD_SLICE:
                    self._store_assignment(group, _assignment_map(req.assignments), None, now, wall, out)
                else:  # a big group: its record encoded over several loop turns, then stored
                    # (from the next turn on: this one decoded every member's assignment already)
                    job = group.assigning = object()
                    self._later_assign(group, job, req.assignments, members, out)
        else:  # Stable: the assignment is stored; a follower syncing late gets it here
            self._remove_pending_sync(group, mid)
            if group.history:
                last = group.history[-1]
                if last.outcome == "stable" and last.generation == group.generation:
                    last.on_sync(mid, now)
            self.timers.schedule(member.hb_key, now + member.session_timeout_ms)
            out.reply(token, sync_response(version, _NONE, group.protocol_type, group.protocol_name,
                                           member.assignment))

    def _store_assignment(self, group: Group, assignment: dict[str, bytes], member_parts: list | None, now: int,
                          wall: int, out: Result) -> None:
        """The leader's assignment: the group's record (answers wait for it), each member's
        assignment, the parked SyncGroups answered, Stable."""
        group.assigning = None  # no slices of an earlier leader's sync go on after this
        self._write_group(out, group, assignment, member_parts)
        get = assignment.get
        for m in group.members.values():
            m.assignment = get(m.member_id, b"")
        self._propagate_assignment(group, _NONE, now, out)
        group.transition_to(STABLE, wall)
        self._finish_rebalance(group, "stable", now, wall)

    def _later_assign(self, group: Group, job, assignments, members: list[Member], out: Result) -> None:
        """In the next loop turn, while ``job`` is still the group's (see :meth:`_assign_in_slices`):
        the leader's ``assignments`` by member, then the record's first slice."""
        gid, generation = group.group_id, group.generation

        def first(now: int, wall: int) -> Result:
            res = Result(shards=self._shard_set)
            if (self.groups.get(gid) is group and group.assigning is job and group.generation == generation
                    and group.state == COMPLETING_REBALANCE):
                self._assign_in_slices(group, job, generation, _assignment_map(assignments), members, 0, [], now,
                                       wall, res)
            return res
        out.defer(first)

    def _assign_in_slices(self, group: Group, job, generation: int, assignment: dict[str, bytes],
                          members: list[Member], start: int, parts: list, now: int, wall: int,
                          out: Result) -> None:
        """Encode the record entries of ``members[start:]`` RECORD_SLICE at a time (one slice per
        loop turn, ``out.defer``), then store the assignment (:meth:`_store_assignment`). Until then
        the group stays CompletingRebalance, as Kafka's does until its record is appended: a
        follower's SyncGroup parks, and anything that moves the group on (a member leaving, a
        new join phase, the leader syncing again) makes the next slice drop this job."""
        get = assignment.get
        end = start + RECORD_SLICE
        encoded.record_member_parts(members[start:end], group.protocol_name, lambda m: get(m.member_id, b""),
                                    parts)
        if end < len(members):
            gid = group.group_id

            def more(now: int, wall: int) -> Result:
                res = Result(shards=self._shard_set)
                if (self.groups.get(gid) is group and group.assigning is job and group.generation == generation
                        and group.state == COMPLETING_REBALANCE):
                    self._assign_in_slices(group, job, generation, assignment, members, end, parts, now, wall,
                                           res)
                return res
            out.defer(more)
            return
        current = group.members
        if len(current) != len(members) or any(current.get(m.member_id) is not m for m in members):
            parts = None  # the members changed meanwhile without a new rebalance: encode them now
        self._store_assignment(group, assignment, parts, now, wall, out)

    def _remove_pending_sync(self, group: Group, member_id: str) -> None:
        group.pending_sync.discard(member_id)
        if not group.pending_sync:
            self.timers.cancel(("sync", group.group_id))

    # ==== Heartbeat (hot path) ===================================================================

    def heartbeat(self, req, version: int, now: int) -> int:
        """-> the Heartbeat's error code (the whole answer: the edge sends cached bytes for it)."""
        if not req.group_id:
            return errors.INVALID_GROUP_ID
        group = self.groups.get(req.group_id)
        if group is None:
            return errors.UNKNOWN_MEMBER_ID
        member = group.members.get(req.member_id)
        iid = req.group_instance_id
        if iid is not None or member is None:
            err = group.validate_member(req.member_id, iid)
            if err != _NONE:
                return err
        if req.generation_id != group.generation:
            return errors.ILLEGAL_GENERATION
        state = group.state
        if state == EMPTY:
            return errors.UNKNOWN_MEMBER_ID
        self.timers.schedule(member.hb_key, now + member.session_timeout_ms)
        if state == PREPARING_REBALANCE:
            return errors.REBALANCE_IN_PROGRESS
        return _NONE

    # ==== LeaveGroup =============================================================================

    def leave_group(self, req, version: int, token, now: int, wall: int, out: Result) -> None:
        gid = req.group_id
        if version >= 3:
            identities = req.members
        else:
            identities = [LeaveGroupRequestMemberIdentity(member_id=req.member_id)]
        if not gid:
            out.reply(token, LeaveGroupResponse(error_code=errors.INVALID_GROUP_ID))
            return
        group = self.groups.get(gid)
        results: list[tuple[object, int]] = []
        left = []
        left_members: list[dict] = []
        pending_left = False
        if group is None:
            results = [(ident, errors.UNKNOWN_MEMBER_ID) for ident in identities]
        else:
            for ident in identities:
                mid, iid = ident.member_id, ident.group_instance_id
                if mid == "":
                    # administrative removal by instance id
                    current = group.static_members.get(iid) if iid is not None else None
                    if current is None:
                        results.append((ident, errors.UNKNOWN_MEMBER_ID))
                        continue
                    member = group.members[current]
                elif mid in group.pending_members:
                    group.pending_members.discard(mid)
                    self.timers.cancel(("pending", gid, mid))
                    if group.rebalance is not None:
                        group.rebalance.on_pending_gone(mid, "left", now)
                    results.append((ident, _NONE))
                    pending_left = True
                    continue
                else:
                    err = group.validate_member(mid, iid)
                    if err != _NONE:
                        results.append((ident, err))
                        continue
                    member = group.members[mid]
                self._drop_member(group, member, "left", now, out)
                results.append((ident, _NONE))
                left.append(member.member_id)
                left_members.append(_member_ident(member))
            state = group.state
            if left and state in (STABLE, COMPLETING_REBALANCE):
                reasons = [ident.reason for ident, e in results if e == _NONE and ident.reason]
                self._maybe_prepare_rebalance_or_complete_join(
                    group, "member_left", f"LeaveGroup for {', '.join(left)}",
                    {"member_ids": left, "members": left_members},
                    "; ".join(reasons) or None, now, wall, out)
            elif (left or pending_left) and state == PREPARING_REBALANCE:
                # a pending member that leaves only matters to a join phase waiting for it (as the
                # Scala coordinator; Kafka's Java coordinator would also rebalance a Stable group)
                self._maybe_complete_join_phase(group, now, wall, out)
        if version < 3:
            err = next((e for _, e in results if e != _NONE), _NONE)
            out.reply(token, LeaveGroupResponse(error_code=err))
            return
        out.reply(token, LeaveGroupResponse(error_code=_NONE, members=[
            LeaveGroupResponseMemberResponse(ident.member_id, ident.group_instance_id, e)
            for ident, e in results]))

    def _expire_heartbeat(self, gid: str, mid: str, now: int, wall: int, out: Result) -> None:
        group = self.groups.get(gid)
        if group is None or group.state == DEAD:
            return
        member = group.members.get(mid)
        if member is None or member.has_satisfied_heartbeat():
            return
        why = "join_timeout" if member.is_new else "session_expired"
        log.info("member_expired", group_id=gid, member_id=mid, client_id=member.client_id,
                 client_host=member.client_host, why=why, generation=group.generation, shard=self.shard_id)
        what = "never completed its join" if member.is_new else "stopped heartbeating"
        detail = f"member {mid} (client {member.client_id!r} from {member.client_host or '?'}) {what}"
        self._remove_member_and_update(group, member, why, detail, now, wall, out)

    def forget_pending(self, gid: str, mid: str, now: int, wall: int, out: Result) -> bool:
        """The connection that carried ``mid``'s MEMBER_ID_REQUIRED answer closed before the member
        joined with it: no client will come back with that id (a JoinGroup answered after its
        client timed it out and reconnected, e.g. one read when herd resumed from a pause), so it
        stops holding the join phase now rather than at its session timeout. -> whether it was
        pending. (A client that did read the answer and rejoins on a new connection gets
        UNKNOWN_MEMBER_ID and joins afresh: one more round trip.)"""
        group = self.groups.get(gid)
        if group is None or mid not in group.pending_members:
            return False
        group.pending_members.discard(mid)
        self.timers.cancel(("pending", gid, mid))
        self._count("pending_members_forgotten")
        if group.rebalance is not None:
            group.rebalance.on_pending_gone(mid, "connection_closed", now)
        if group.state == PREPARING_REBALANCE and group.has_all_members_joined():
            self._complete_join(group, now, wall, out)
        return True

    def _expire_pending_member(self, gid: str, mid: str, now: int, wall: int, out: Result) -> None:
        group = self.groups.get(gid)
        if group is None or mid not in group.pending_members:
            return
        group.pending_members.discard(mid)
        self._count("pending_members_expired")
        if group.rebalance is not None:
            group.rebalance.on_pending_gone(mid, "expired", now)
        if group.state == PREPARING_REBALANCE and group.has_all_members_joined():
            self._complete_join(group, now, wall, out)

    def _on_join_timer(self, gid: str, now: int, wall: int, out: Result) -> None:
        group = self.groups.get(gid)
        if group is None or group.state != PREPARING_REBALANCE:
            return
        phase = group.join_phase
        if phase is not None and phase[0] == "initial":
            _, delay, remaining = phase
            if group.new_member_added and remaining != 0:
                # debounce: each new member buys another delay, capped by the rebalance timeout
                group.new_member_added = False
                new_delay = min(self.config.initial_rebalance_delay_ms, remaining)
                group.join_phase = ("initial", new_delay, max(remaining - delay, 0))
                self.timers.schedule(("join", gid), now + new_delay)
                return
        self._complete_join(group, now, wall, out)

    def _expire_pending_sync(self, gid: str, now: int, wall: int, out: Result) -> None:
        group = self.groups.get(gid)
        if group is None or group.sync_generation != group.generation:
            return
        if group.state not in (COMPLETING_REBALANCE, STABLE) or not group.pending_sync:
            return
        missing = list(group.pending_sync)
        missing_members = []
        for mid in missing:
            member = group.members.get(mid)
            if member is not None:
                missing_members.append(_member_ident(member))
                self._drop_member(group, member, "sync_expired", now, out)
            else:
                group.pending_sync.discard(mid)
        self._prepare_rebalance(group, "sync_expired", f"no SyncGroup from {', '.join(missing)} within the "
                                f"rebalance timeout", {"member_ids": missing, "members": missing_members},
                                None, now, wall, out)

    # ==== timers =================================================================================

    def on_timer(self, key, now: int, wall: int, out: Result) -> None:
        """Fire one of this side's timer keys (``key[0]`` in :data:`CLASSIC_TIMER_KINDS`)."""
        kind = key[0]
        if kind == "hb":
            self._expire_heartbeat(key[1], key[2], now, wall, out)
        elif kind == "pending":
            self._expire_pending_member(key[1], key[2], now, wall, out)
        elif kind == "join":
            self._on_join_timer(key[1], now, wall, out)
        else:  # "sync"
            self._expire_pending_sync(key[1], now, wall, out)

    # ==== records ================================================================================

    def replay_group(self, gid: str, value: GroupMetadataValue | None) -> None:
        """Apply one GroupMetadata record (a decoded value; None: the tombstone)."""
        if value is None:
            self._remove_group(gid)
        else:
            self._load_group(gid, value)

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

    def _write_group(self, out: Result, group: Group, assignment: dict[str, bytes] | None = None,
                     member_parts: list | None = None) -> None:
        """The group's GroupMetadata record: the encoded head, then each member's cached part
        (encoded.py) and its assignment (``assignment``'s, else the member's own); ``member_parts``:
        those already encoded, for the group's current members in order."""
        members = list(group.members.values())
        head = GroupMetadataValue(
            protocol_type=group.protocol_type or "", generation=group.generation,
            protocol=group.protocol_name, leader=group.leader_id if members else None,
            current_state_timestamp=-1 if group.state_wall_ms is None else group.state_wall_ms,
            members=[])
        if assignment is not None:
            get = assignment.get

            def assignment_of(m):
                return get(m.member_id, b"")
        else:
            def assignment_of(m):
                return m.assignment
        try:
            value = encoded.group_record_value(head, members, assignment_of, member_parts)
        except _ENCODE_FAILURES as exc:
            raise records.RecordError(str(exc)) from None
        out.writes.append((self.shard_id, records.group_metadata_key(group.group_id), value))

    def write_tombstone(self, out: Result, gid: str) -> None:
        """Delete group ``gid``: its GroupMetadata tombstone, replayed as start-up replays it."""
        out.writes.append((self.shard_id, records.group_metadata_key(gid), None))
        self.replay_group(gid, None)

    # ==== "simple" groups (offsets only) =========================================================

    def create_simple(self, gid: str, state_wall_ms: int) -> Group:
        """A group with no protocol type, kept by its committed offsets (a standalone consumer)."""
        group = self.groups[gid] = Group(gid, state_wall_ms=state_wall_ms,
                                         history_size=self.config.rebalance_history_size)
        return group

    def drop_replaced_simple(self, gid: str) -> None:
        """After replay: a "simple" group rebuilt from offsets replayed before the records of the
        consumer group that replaced it (a compacted log) goes."""
        group = self.groups.get(gid)
        if group is not None and group.state == EMPTY and not group.members and not group.protocol_type:
            self._remove_group(gid)

    def validate_offset_commit(self, gid: str, member_id: str, instance_id: str | None, generation: int,
                               version: int, now: int, wall: int) -> int:
        """The classic group's part of an OffsetCommit for ``gid`` (no consumer group of that id):
        a commit from a non-member into no group makes a "simple" group; a member's commit restarts
        its session as a heartbeat would."""
        group = self.groups.get(gid)
        if group is None:
            if generation >= 0:
                return errors.GROUP_ID_NOT_FOUND if version >= 9 else errors.ILLEGAL_GENERATION
            # a standalone consumer (or the admin client): a "simple" group, kept by its offsets
            group = self.create_simple(gid, wall)
        err = _validate_offset_commit(group, member_id, instance_id, generation)
        if err == _NONE and group.state in (STABLE, PREPARING_REBALANCE):
            member = group.members[member_id]  # validated above
            self.timers.schedule(member.hb_key, now + member.session_timeout_ms)
        return err

    # ==== start-up and stalls =====================================================================

    def on_loaded(self, now: int, wall: int, out: Result) -> None:
        """After replay: session timers for loaded members, and a rebalance for groups over
        ``group_max_size`` (the limit may have been lowered)."""
        for group in list(self.groups.values()):
            for m in group.members.values():
                self.timers.schedule(m.hb_key, now + m.session_timeout_ms)
            if len(group.members) > self.config.group_max_size:
                detail = (f"freshly loaded group has {len(group.members)} members, over "
                          f"group_max_size {self.config.group_max_size}")
                self._prepare_rebalance(group, "over_capacity", detail, None, None, now, wall, out)

    def on_stall(self, stall_ms: int, now: int, wall: int) -> None:
        """herd did not run for ``stall_ms`` (see :meth:`coordinator.core.shard.Shard.on_stall`, which
        moved the deadlines): remember the stall for the flight recorder and for members whose
        client gave its session up meanwhile (:meth:`_drop_member_given_up_after_stall`)."""
        self.last_stall = {"stall_ms": stall_ms, "ended_ms": now, "ended_wall_ms": wall}
        for group in self.groups.values():
            by_client: dict = {}
            until = now
            for m in group.members.values():
                m.stall_until = now + m.session_timeout_ms
                if m.group_instance_id is None:
                    by_client.setdefault((m.client_id, m.client_host), []).append(m)
                    until = max(until, m.stall_until)
            group.stalled_clients = (until, by_client) if by_client else None
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

    def check_delete(self, group_id: str) -> int:
        """DeleteGroups' check of a classic group (NONE: it may go; its pending ids are forgotten)."""
        group = self.groups.get(group_id)
        if group is None or group.state == DEAD:
            return errors.GROUP_ID_NOT_FOUND
        if group.state != EMPTY:
            return errors.NON_EMPTY_GROUP
        for pid in list(group.pending_members):
            self.timers.cancel(("pending", group_id, pid))
        return _NONE

    def list_groups(self, states: set[str] | None) -> list[ListGroupsResponseListedGroup]:
        res = []
        for group in self.groups.values():
            if states and group.state.lower() not in states:
                continue
            res.append(ListGroupsResponseListedGroup(group.group_id, group.protocol_type or "", group.state,
                                                     "classic"))
        return res

    # ==== lifecycle ==============================================================================

    def parked(self) -> list[tuple[str, Parked]]:
        """Every parked request as ``("join"|"sync", parked)``."""
        res = []
        for group in self.groups.values():
            for m in group.members.values():
                if m.join is not None:
                    res.append(("join", m.join))
                if m.sync is not None:
                    res.append(("sync", m.sync))
        return res

    def release_parked(self, error: int, out: Result) -> None:
        """Answer every parked request with ``error`` and forget them."""
        for group in self.groups.values():
            for m in group.members.values():
                parked = group.take_join(m)
                if parked is not None:
                    out.reply(parked.token, join_response(parked.version, error, m.member_id))
                if m.sync is not None:
                    out.reply(m.sync.token, sync_response(m.sync.version, error))
                    m.sync = None


def _validate_offset_commit(group: Group, member_id: str, instance_id: str | None, generation: int) -> int:
    state = group.state
    if state == DEAD:
        return errors.COORDINATOR_NOT_AVAILABLE
    if generation < 0 and state == EMPTY:
        return _NONE  # a non-member committing into an Empty group (Spark jobs, admin tools)
    if generation >= 0 or member_id or instance_id is not None:
        err = group.validate_member(member_id, instance_id)
        if err != _NONE:
            return err
        if generation != group.generation:
            return errors.ILLEGAL_GENERATION
    elif state != EMPTY:
        return errors.UNKNOWN_MEMBER_ID
    if state == COMPLETING_REBALANCE:
        return errors.REBALANCE_IN_PROGRESS
    return _NONE


def _assignment_map(assignments) -> dict[str, bytes]:
    """The leader's SyncGroup assignments by member id (a null assignment: empty)."""
    return {a.member_id: (a.assignment if a.assignment is not None else b"") for a in assignments}


PENDING_LOGGED = 20  # pending member ids listed in one rebalance_completed line (the rest counted)


def _pending_summary(pending, outcomes: dict[str, int] | None = None) -> dict:
    """For the rebalance_completed log line: the pending member ids the join phase had to wait
    for (KIP-394) and what became of each, only when there were any. ``pending``: the entries (a
    list or a dict's values); ``outcomes``: their counts by outcome if kept (else counted here)."""
    if not pending:
        return {}
    shown = [{"member_id": e["member_id"], "outcome": e["outcome"] or "still_pending", "after_ms": e["after_ms"]}
             for e in itertools.islice(pending, PENDING_LOGGED)]
    if len(pending) <= PENDING_LOGGED:
        return {"pending_members": shown}
    # a 5,000-member group forming: one log line of every id would be ~300 KB rendered on the loop;
    # the flight recorder (herd groups history) keeps them all
    if outcomes is None:
        outcomes = {}
        for e in pending:
            key = e["outcome"] or "still_pending"
            outcomes[key] = outcomes.get(key, 0) + 1
    return {"pending_members": shown, "pending_members_total": len(pending),
            "pending_outcomes": {k: n for k, n in outcomes.items() if n}}
