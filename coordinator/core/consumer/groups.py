"""The consumer groups of one shard (KIP-848): ConsumerGroupHeartbeat, timers, replay, describe.

Pure: no I/O, no clock reads, no randomness outside ``heartbeat`` (member ids are minted there and
written into records). See :mod:`coordinator.core.consumer` for the calling convention.

Durable state changes only through records. Every record an operation produces is applied at once
by the same code :meth:`ConsumerGroups.replay` runs at start-up (the bytes are decoded again), so
memory always equals "log replayed". Validation happens before the first record, so a rejected
request changes nothing. Timers (session and rebalance timeouts) are not durable: after replay,
:meth:`ConsumerGroups.on_loaded` schedules them again, as Kafka does on loading a shard.

The heartbeat follows Kafka's ``GroupMetadataManager.consumerGroupHeartbeat``:

1. validate the request (INVALID_REQUEST, UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION);
2. epoch -1 / -2: leave (fence the member: tombstones and a group epoch bump) or, for a static
   member, leave for a while (epoch -2, partitions kept for its return within the session);
3. find or create the member (GROUP_MAX_SIZE_REACHED, UNKNOWN_MEMBER_ID, FENCED_MEMBER_EPOCH,
   UNRELEASED_INSTANCE_ID, FENCED_INSTANCE_ID); a static member that comes back under a new
   member id takes over the old one's assignment (nobody else moves);
4. write its metadata if it changed; a changed subscription, or a changed view of the subscribed
   topics, bumps the group epoch;
5. group epoch ahead of the assignment epoch: run the assignor (target assignment records), at
   most once per ``assignment_interval_ms`` per group (Kafka 4.3's
   ``group.consumer.assignment.interval.ms``, KIP-1263: joins arriving together are assigned in
   one run; until it is due, members reconcile toward the target they have, at its epoch);
6. reconcile the member toward its target (:func:`next_assignment`, Kafka's
   ``CurrentAssignmentBuilder``): revoke first, then assign what nobody else owns;
7. answer: member id, epoch, heartbeat interval, and the assignment when the request was a full
   one or the member's assigned partitions changed.
"""
from __future__ import annotations

import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

from coordinator.core.consumer import records as cr
from coordinator.core.consumer.assignors import ASSIGNORS, DEFAULT_ASSIGNOR, MemberSubscription
from coordinator.core.consumer.group import (
    DEAD,
    LEAVE_EPOCH,
    MEMBER_STABLE,
    STATIC_LEAVE_EPOCH,
    UNKNOWN,
    UNRELEASED_PARTITIONS,
    UNREVOKED_PARTITIONS,
    ConsumerGroup,
    Member,
)
from coordinator.core.consumer.regex import InvalidRegex, compile_subscription
from coordinator.core.timers import Timers
from protocol import errors as E
from protocol.messages import (
    ConsumerGroupDescribeResponseAssignment,
    ConsumerGroupDescribeResponseDescribedGroup,
    ConsumerGroupDescribeResponseMember,
    ConsumerGroupDescribeResponseTopicPartitions,
    ConsumerGroupHeartbeatResponse,
    ConsumerGroupHeartbeatResponseAssignment,
    ConsumerGroupHeartbeatResponseTopicPartitions,
)

__all__ = ["ConsumerGroupConfig", "Topics", "StaticTopics", "ConsumerGroups", "next_assignment",
           "validate_offset_commit", "validate_offset_fetch", "OLDER_MEMBER_EPOCH", "commit_partition_ok",
           "HeartbeatError", "SESSION", "REBALANCE"]

INT32_MAX = 2**31 - 1
SESSION = "cg-session"  # timer key (SESSION, group id, member id)
REBALANCE = "cg-rebalance"  # timer key (REBALANCE, group id, member id)
_HAS_MEMBER_TYPE = "member_type" in ConsumerGroupDescribeResponseMember.FIELDS
# Operations a describing client may perform on a group with no authorizer (see coordinator.core.shard).
GROUP_AUTHORIZED_OPERATIONS = (1 << 3) | (1 << 6) | (1 << 8) | (1 << 10) | (1 << 11)


@dataclass(frozen=True)
class ConsumerGroupConfig:
    """Kafka's ``group.consumer.*`` broker settings (names in the comments); bounds as Kafka's."""

    session_timeout_ms: int = 45_000  # group.consumer.session.timeout.ms
    min_session_timeout_ms: int = 45_000  # group.consumer.min.session.timeout.ms
    max_session_timeout_ms: int = 60_000  # group.consumer.max.session.timeout.ms
    heartbeat_interval_ms: int = 5_000  # group.consumer.heartbeat.interval.ms
    min_heartbeat_interval_ms: int = 5_000  # group.consumer.min.heartbeat.interval.ms
    max_heartbeat_interval_ms: int = 15_000  # group.consumer.max.heartbeat.interval.ms
    max_size: int = INT32_MAX  # group.consumer.max.size
    assignors: tuple[str, ...] = ("uniform", "range")  # group.consumer.assignors (first = default)
    # group.consumer.assignment.interval.ms (Kafka 4.3, KIP-1263): the least time between two runs
    # of a group's assignor; 0: every heartbeat that finds the group epoch ahead runs it
    assignment_interval_ms: int = 0
    # herd's own (Kafka tells every member the heartbeat interval): a member waiting on others for
    # its assignment (its join not yet assigned while the assignor is held back by the assignment
    # interval, or partitions of its target still owned by members that must revoke them first:
    # UNRELEASED_PARTITIONS) is asked back after this, if shorter; 0: always the heartbeat interval
    pending_heartbeat_interval_ms: int = 1_000
    # authorizer = acl: a regex subscription resolves to the topics the member whose heartbeat
    # resolves it may DESCRIBE (Kafka 4, KAFKA-18813)
    authorize_regex: bool = False

    def __post_init__(self):
        def bad(msg):
            raise ValueError(msg)
        if not 0 < self.min_session_timeout_ms <= self.session_timeout_ms <= self.max_session_timeout_ms:
            bad("group.consumer.session.timeout.ms must be within its min and max")
        if not 0 < self.min_heartbeat_interval_ms <= self.heartbeat_interval_ms <= self.max_heartbeat_interval_ms:
            bad("group.consumer.heartbeat.interval.ms must be within its min and max")
        if self.heartbeat_interval_ms >= self.session_timeout_ms:
            bad("group.consumer.heartbeat.interval.ms must be lower than the session timeout")
        if self.max_size < 1:
            bad("group.consumer.max.size must be at least 1")
        if self.assignment_interval_ms < 0:
            bad("group.consumer.assignment.interval.ms must be at least 0")
        if self.pending_heartbeat_interval_ms < 0:
            bad("group.consumer.pending.heartbeat.interval.ms must be at least 0")
        if not self.assignors or any(a not in ASSIGNORS for a in self.assignors):
            bad(f"group.consumer.assignors must name some of {sorted(ASSIGNORS)}")


class Topics(Protocol):
    """The topic catalog as the consumer groups see it (phase 2 adapts ``coordinator.core.catalog``)."""

    def get(self, name: str) -> tuple[bytes, int] | None:
        """(topic id, partition count) of a topic, or None when it does not exist."""

    def names(self) -> Iterable[str]:
        """Every topic name (for regex subscriptions)."""


class StaticTopics:
    """A :class:`Topics` over a dict ``name -> (topic id, partitions)`` (tests, tools)."""

    def __init__(self, topics: dict[str, tuple[bytes, int]] | None = None):
        self.topics = dict(topics or {})

    def get(self, name: str):
        return self.topics.get(name)

    def names(self):
        return self.topics.keys()


class HeartbeatError(Exception):
    def __init__(self, code: int, message: str | None = None):
        super().__init__(message or E.error_name(code))
        self.code = code
        self.message = message


Records = list  # [(key bytes, value bytes or None)]


def _blank(s: str | None) -> bool:
    return s is not None and not s.strip()


def _owned_map(owned) -> dict[bytes, frozenset[int]] | None:
    return None if owned is None else cr.assignment_from_wire(owned)


def _is_subset(owned: dict | None, assigned: dict) -> bool:
    if owned is None:
        return False
    return all(parts <= assigned.get(tid, frozenset()) for tid, parts in owned.items())


def _owns_any(owned: dict | None, partitions: dict) -> bool:
    """Kafka's ``ownsRevokedPartitions``: unknown ownership (null) counts as owning."""
    if owned is None:
        return True
    return any(parts & partitions.get(tid, frozenset()) for tid, parts in owned.items())


def next_assignment(member: Member, target_epoch: int, target: dict, partition_epoch,
                    owned: dict | None) -> tuple[int, int, int, dict, dict]:
    """Kafka's ``CurrentAssignmentBuilder.build``: the member's next ``(epoch, previous epoch,
    state, assigned, pending revocation)`` toward ``target`` at ``target_epoch``.
    ``partition_epoch(topic_id, p)`` is -1 when nobody owns the partition; ``owned`` is what the
    member reported owning (None: not reported). Raises HeartbeatError(FENCED_MEMBER_EPOCH) for a
    member in an UNKNOWN state that still owns partitions."""
    state = member.state
    if state == MEMBER_STABLE:
        if member.member_epoch == target_epoch:
            return _same(member)
        return _compute(member, member.member_epoch, target_epoch, target, partition_epoch, owned)
    if state == UNREVOKED_PARTITIONS:
        if _owns_any(owned, member.pending_revocation):
            return _same(member)
        return _compute(member, member.member_epoch + 1, target_epoch, target, partition_epoch, owned)
    if state == UNRELEASED_PARTITIONS:
        return _compute(member, member.member_epoch, target_epoch, target, partition_epoch, owned)
    if owned is None or owned:
        raise HeartbeatError(E.FENCED_MEMBER_EPOCH, "The consumer group member is in a unknown state. "
                             "The member must abandon all its partitions and rejoin.")
    return _compute(member, target_epoch, target_epoch, target, partition_epoch, owned)


def _same(m: Member):
    return m.member_epoch, m.previous_member_epoch, m.state, m.assigned, m.pending_revocation


def _compute(member: Member, epoch: int, target_epoch: int, target: dict, partition_epoch, owned):
    unreleased = False
    assigned: dict[bytes, frozenset[int]] = {}
    revoke: dict[bytes, frozenset[int]] = {}
    gain: dict[bytes, frozenset[int]] = {}
    current = member.assigned
    for tid in set(target) | set(current):
        want = target.get(tid, frozenset())
        have = current.get(tid, frozenset())
        keep = have & want
        go = have - keep
        new = want - keep
        free = frozenset(p for p in new if partition_epoch(tid, p) == -1)
        if len(free) != len(new):
            unreleased = True
        if keep:
            assigned[tid] = keep
        if go:
            revoke[tid] = go
        if free:
            gain[tid] = free
    prev = member.member_epoch  # ConsumerGroupMember.Builder.updateMemberEpoch: always the old epoch
    if revoke and _owns_any(owned, revoke):
        return epoch, prev, UNREVOKED_PARTITIONS, assigned, revoke
    for tid, ps in gain.items():
        assigned[tid] = assigned.get(tid, frozenset()) | ps
    return target_epoch, prev, (UNRELEASED_PARTITIONS if unreleased else MEMBER_STABLE), assigned, {}


def validate_offset_commit(group: ConsumerGroup | None, member_id: str, member_epoch: int, version: int,
                           transactional: bool = False) -> int:
    """Kafka's ``ConsumerGroup.validateOffsetCommit`` for a consumer group: the error code to
    answer an OffsetCommit with (NONE to accept). Epoch < 0 into an empty group is an admin or
    standalone commit (accepted); an unknown member gets UNKNOWN_MEMBER_ID; a consumer-protocol
    member must use OffsetCommit v9+ (UNSUPPORTED_VERSION) and its current member epoch
    (STALE_MEMBER_EPOCH)."""
    if group is None or (member_epoch < 0 and not group.members):
        return E.NONE
    member = group.members.get(member_id)
    if member is None:
        return E.UNKNOWN_MEMBER_ID
    if not transactional and version < 9:
        return E.UNSUPPORTED_VERSION
    if member_epoch != member.member_epoch:
        if 0 <= member_epoch < member.member_epoch:
            return OLDER_MEMBER_EPOCH  # decided partition by partition: commit_partition_ok
        return E.STALE_MEMBER_EPOCH
    return E.NONE


# Not a Kafka error code: validate_offset_commit's answer for a member's older epoch, which Kafka
# 4.4 accepts partition by partition (:func:`commit_partition_ok`); the others get STALE_MEMBER_EPOCH.
OLDER_MEMBER_EPOCH = -1000


def commit_partition_ok(group: ConsumerGroup, member_id: str, member_epoch: int, topic: str,
                        partition: int) -> bool:
    """Kafka 4.4's rule for an OffsetCommit at an older member epoch: the partition is still the
    member's (assigned, or pending revocation from it) and it got it at or before that epoch."""
    member = group.members.get(member_id)
    if member is None:
        return False
    meta = group.subscription_metadata.get(topic)
    if meta is None:
        return False
    at = member.assigned_at.get((meta[0], partition))
    return at is not None and at <= member_epoch


def validate_offset_fetch(group: ConsumerGroup | None, member_id: str | None, member_epoch: int) -> int:
    """Kafka's ``ConsumerGroup.validateOffsetFetch``: no member id and epoch < 0 is an admin fetch
    (accepted); otherwise the member must exist (UNKNOWN_MEMBER_ID) at that epoch
    (STALE_MEMBER_EPOCH)."""
    if member_id is None and member_epoch < 0:
        return E.NONE
    member = group.members.get(member_id) if group is not None and member_id is not None else None
    if member is None:
        return E.UNKNOWN_MEMBER_ID
    if member_epoch != member.member_epoch:
        return E.STALE_MEMBER_EPOCH
    return E.NONE


CREATED_GROUP_EPOCH = 1  # a new group's epoch before its first member (Kafka 4.4)


class ConsumerGroups:
    """Every consumer group of one shard."""

    def __init__(self, config: ConsumerGroupConfig | None = None, topics: Topics | None = None,
                 new_uuid=None, timers: Timers | None = None):
        self.config = config or ConsumerGroupConfig()
        self.topics: Topics = topics if topics is not None else StaticTopics()
        self.groups: dict[str, ConsumerGroup] = {}
        self.timers = timers if timers is not None else Timers()
        self._rebalance_epoch: dict[tuple[str, str], int] = {}
        self._new_uuid = new_uuid or (lambda: str(uuid.uuid4()))
        # authorize_regex: per group, the TOPIC DESCRIBE of the member whose heartbeat last resolved
        # its regexes (in memory: after a restart, until a member's heartbeat resolves them again,
        # a regex keeps the topics it had: the PartitionMetadata replayed)
        self._regex_filter: dict[str, object] = {}
        # per group: when its assignor last ran (in memory: after a restart the next heartbeat runs it)
        self._assigned_at: dict[str, int] = {}
        # per group: the members that joined or changed their subscription while its assignor was
        # held back by the assignment interval (cleared by the next run; in memory only: after a
        # restart they are told the plain heartbeat interval)
        self._awaiting: dict[str, set[str]] = {}

    # ==== records ===============================================================================

    def replay(self, key: bytes, value: bytes | None) -> None:
        """Apply one consumer-group record (RecordError when it cannot be decoded)."""
        rtype, gid, mid, v = cr.decode(key, value)
        group = self.groups.get(gid)
        if group is None:
            if v is None:
                return
            group = self.groups[gid] = ConsumerGroup(gid)
        if rtype == cr.GROUP_EPOCH:
            if v is None:
                group.mark_dead()
                del self.groups[gid]
                self._regex_filter.pop(gid, None)
                self._assigned_at.pop(gid, None)
                self._awaiting.pop(gid, None)
            else:
                group.group_epoch = v.epoch
                group.has_epoch_record = True
        elif rtype == cr.PARTITION_METADATA:
            group.subscription_metadata = ({} if v is None else
                                           {t.topic_name: (t.topic_id, t.num_partitions) for t in v.topics})
        elif rtype == cr.MEMBER_METADATA:
            if v is None:
                self._cancel_member_timers(gid, mid)
            group.apply_member_metadata(mid, v)
        elif rtype == cr.TARGET_METADATA:
            group.assignment_epoch = 0 if v is None else v.assignment_epoch
        elif rtype == cr.TARGET_MEMBER:
            if v is None:
                group.target.pop(mid, None)
            else:
                group.target[mid] = cr.assignment_from_wire(v.topic_partitions)
        else:  # CURRENT_ASSIGNMENT
            if v is None:
                group.remove_current_assignment(mid)
            else:
                group.apply_current_assignment(mid, v.member_epoch, v.previous_member_epoch, v.state,
                                               cr.assignment_from_wire(v.assigned_partitions),
                                               cr.assignment_from_wire(v.partitions_pending_revocation))

    def _emit(self, out: Records, key: bytes, value: bytes | None) -> None:
        out.append((key, value))
        self.replay(key, value)

    def on_loaded(self, now: int) -> None:
        """After replay: settle every group's state and schedule the timers (sessions from now;
        rebalance timeouts of members still revoking)."""
        for gid, group in self.groups.items():
            group.settle()
            for mid, m in group.members.items():
                self.timers.schedule((SESSION, gid, mid), now + self.config.session_timeout_ms)
                if m.state == UNREVOKED_PARTITIONS:
                    self._schedule_rebalance(gid, m, now)

    # ==== timers ================================================================================

    def _cancel_member_timers(self, gid: str, mid: str) -> None:
        self.timers.cancel((SESSION, gid, mid))
        self.timers.cancel((REBALANCE, gid, mid))
        self._rebalance_epoch.pop((gid, mid), None)

    def _schedule_rebalance(self, gid: str, m: Member, now: int) -> None:
        self._rebalance_epoch[(gid, m.member_id)] = m.member_epoch
        self.timers.schedule((REBALANCE, gid, m.member_id), now + max(m.rebalance_timeout_ms, 0))

    def next_deadline(self) -> int | None:
        return self.timers.next_deadline()

    def on_timers(self, now: int, wall: int, budget: int | None = None) -> Records:
        """Fire due timers (see :meth:`fire_timer`). With ``budget``, stops after that many heap
        entries looked at (as ``Shard.on_timers``): what is left is still due."""
        out: Records = []
        self.timers.steps = 0
        while True:
            key = self.timers.pop_expired(now, budget)
            if key is None:
                return out
            out.extend(self.fire_timer(key, now, wall))

    def fire_timer(self, key, now: int, wall: int) -> Records:
        """One expired timer key (``(SESSION | REBALANCE, group, member)``; for a runtime that shares
        one :class:`Timers` with the classic groups and dispatches on ``key[0]``). A member whose
        session expired, or that did not revoke within its rebalance timeout (still at the epoch it
        had then), is fenced."""
        out: Records = []
        kind, gid, mid = key
        group = self.groups.get(gid)
        member = group.members.get(mid) if group is not None else None
        if kind == REBALANCE:
            epoch = self._rebalance_epoch.pop((gid, mid), None)
            if member is None or member.member_epoch != epoch:
                return out
            self._fence(group, member, out, f"member {mid} did not revoke within its rebalance timeout")
        elif kind == SESSION:
            if member is None:
                return out
            self._fence(group, member, out, f"member {mid} session expired")
        group = self.groups.get(gid)
        if group is not None:
            group.settle()
        return out

    # ==== subscriptions and topics ================================================================

    def _regex_allows(self, group: ConsumerGroup):
        """``topic -> bool`` for the topics the group's regexes may resolve to (None: all)."""
        if not self.config.authorize_regex:
            return None
        allowed = self._regex_filter.get(group.group_id)
        if allowed is not None:
            return allowed
        known = group.subscription_metadata  # nobody's ACLs known yet: only what was resolved before
        return known.__contains__

    def _subscription_metadata(self, names: set[str], regexes: set[str],
                               allows=None) -> dict[str, tuple[bytes, int]]:
        wanted = set(names)
        if regexes:
            rxs = [compile_subscription(r) for r in regexes]
            for name in self.topics.names():
                if any(rx.fullmatch(name) for rx in rxs) and (allows is None or allows(name)):
                    wanted.add(name)
        out = {}
        for name in wanted:
            t = self.topics.get(name)
            if t is not None and t[1] > 0:
                out[name] = (t[0], t[1])
        return out

    def _group_metadata(self, group: ConsumerGroup) -> dict[str, tuple[bytes, int]]:
        return self._subscription_metadata(group.subscribed_topic_names(), group.regexes(),
                                           self._regex_allows(group) if group.regexes() else None)

    def _bump(self, group: ConsumerGroup, out: Records, reason: str) -> None:
        # Kafka 4.4 creates a consumer group at epoch 1 (CREATED_GROUP_EPOCH), so its first bump,
        # the first member's join, gives epoch 2
        epoch = max(group.group_epoch, CREATED_GROUP_EPOCH) + 1
        self._emit(out, cr.group_epoch_key(group.group_id), cr.group_epoch_value(epoch))
        group.note_epoch(epoch, reason)

    def _refresh_metadata(self, group: ConsumerGroup, out: Records) -> bool:
        meta = self._group_metadata(group)
        if meta != group.subscription_metadata:
            self._emit(out, cr.partition_metadata_key(group.group_id), cr.partition_metadata_value(meta))
            return True
        return False

    def topics_changed(self, now: int, wall: int) -> Records:
        """Call when a topic was created, grown or deleted in the catalog: every group whose view
        of its subscribed topics changed gets a PartitionMetadata record and a group epoch bump
        (its next heartbeat computes the new target assignment)."""
        out: Records = []
        for group in list(self.groups.values()):
            if group.members and self._refresh_metadata(group, out):
                self._bump(group, out, "subscribed topic metadata changed")
                group.settle()
        return out

    def _member_topic_ids(self, group: ConsumerGroup, m: Member) -> frozenset:
        meta = group.subscription_metadata
        ids = {meta[n][0] for n in m.subscribed_topic_names if n in meta}
        if m.subscribed_topic_regex:
            rx = compile_subscription(m.subscribed_topic_regex)
            allows = self._regex_allows(group)
            ids.update(tid for name, (tid, _) in meta.items()
                       if rx.fullmatch(name) and (allows is None or allows(name)))
        return frozenset(ids)

    def _assignment_due(self, gid: str, now: int) -> bool:
        """Whether the group's assignor may run now: ``assignment_interval_ms`` since its last run
        (the first run, and every run with an interval of 0, at once)."""
        interval = self.config.assignment_interval_ms
        last = self._assigned_at.get(gid)
        return interval <= 0 or last is None or now - last >= interval

    def _update_target(self, group: ConsumerGroup, out: Records) -> None:
        """Kafka's TargetAssignmentBuilder: run the group's assignor, write the members whose
        target changed, then the new assignment epoch."""
        epoch = group.group_epoch
        self._awaiting.pop(group.group_id, None)
        assignor = ASSIGNORS[group.preferred_assignor(self.config.assignors[0] or DEFAULT_ASSIGNOR)]
        # members with the same subscription (the usual case: all of them) share one resolution
        # and, without an instance or rack id, one MemberSubscription
        shared: dict[tuple, MemberSubscription] = {}
        subs = {}
        for mid, m in group.members.items():
            key = m.subscription_key()
            if m.instance_id is None and m.rack_id is None:
                sub = shared.get(key)
                if sub is None:
                    sub = shared[key] = MemberSubscription(self._member_topic_ids(group, m))
            else:
                shared_ids = shared.get(key)
                ids = shared_ids.topic_ids if shared_ids is not None else self._member_topic_ids(group, m)
                sub = MemberSubscription(ids, m.instance_id, m.rack_id)
            subs[mid] = sub
        topics = {tid: n for tid, n in group.subscription_metadata.values()}
        # A static member that came back under a new id inherits its predecessor's target.
        result = assignor(subs, topics, group.target)
        gid = group.group_id
        for mid in sorted(result):
            if result[mid] != group.target.get(mid, {}):
                self._emit(out, cr.target_member_key(gid, mid), cr.target_member_value(result[mid]))
        self._emit(out, cr.target_metadata_key(gid), cr.target_metadata_value(epoch))

    # ==== ConsumerGroupHeartbeat =================================================================

    def heartbeat(self, req, version: int, now: int, wall: int, client_id: str = "",
                  client_host: str = "", may_describe=None) -> tuple[Records, ConsumerGroupHeartbeatResponse]:
        """Handle one ConsumerGroupHeartbeat: ``(records, response)``. The records are already
        applied in memory; the response must be released only once they are durable.
        ``may_describe`` (``authorize_regex``): ``topic -> bool``, the client's TOPIC DESCRIBE; the
        group's regexes are resolved with it from this heartbeat on, as Kafka resolves them with
        the ACLs of the member whose heartbeat refreshes them."""
        out: Records = []
        resolve = False  # resolve the group's regexes again after this heartbeat, with its ACLs
        if may_describe is not None and self.config.authorize_regex and req.member_epoch >= 0:
            group = self.groups.get(req.group_id)
            if req.subscribed_topic_regex or (group is not None and group.regexes()):
                before = self._regex_filter.get(req.group_id)
                # nobody's ACLs known (a restart), or the ACLs changed since the last resolution
                resolve = before is None or getattr(before, "generation", None) != getattr(
                    may_describe, "generation", None)
                self._regex_filter[req.group_id] = may_describe
        try:
            resp = self._heartbeat(req, version, now, client_id, client_host, out)
        except HeartbeatError as exc:
            if out:  # validation comes before the first record; never half-apply a request
                raise RuntimeError(f"consumer group heartbeat failed after writing records: {exc}") from exc
            return out, ConsumerGroupHeartbeatResponse(error_code=exc.code, error_message=exc.message)
        group = self.groups.get(req.group_id)
        if resolve and group is not None and group.members and self._refresh_metadata(group, out):
            self._bump(group, out, "regex subscriptions resolved again (the member's ACLs)")
        if group is not None:
            group.settle()
        return out, resp

    def steady_heartbeat(self, group_id: str, member_id: str, member_epoch: int, client_id: str,
                         client_host: str, now: int) -> int | None:
        """A steady-state heartbeat: every optional field of the request null (no subscription,
        no owned partitions, no rebalance timeout, no instance or rack id, no assignor), from a
        member that is known, Stable at its group's assignment epoch (nothing to reconcile, no
        target to compute) and whose client id and host are the ones on record. Then
        :meth:`heartbeat` would write nothing, change nothing but the session deadline and answer
        (member id, its epoch, the interval, no assignment): that is done here, and the interval
        returned. None: not such a heartbeat (the caller takes :meth:`heartbeat`)."""
        group = self.groups.get(group_id)
        if group is None or group.group_epoch != group.assignment_epoch:
            return None
        m = group.members.get(member_id)
        if (m is None or m.member_epoch != member_epoch or member_epoch != group.assignment_epoch
                or m.state != MEMBER_STABLE or not m.has_metadata or m.client_id != client_id
                or m.client_host != client_host or _blank(group_id) or _blank(member_id)):
            return None
        self.timers.schedule((SESSION, group_id, member_id), now + self.config.session_timeout_ms)
        return self.config.heartbeat_interval_ms

    def validate(self, req, version: int) -> None:
        """HeartbeatError for a request :meth:`heartbeat` would refuse before looking at its group
        (the shard asks before an Empty classic group gives way to it)."""
        self._validate(req, version)

    def _validate(self, req, version: int) -> None:
        bad = E.INVALID_REQUEST
        if not req.group_id or _blank(req.group_id):
            raise HeartbeatError(bad, "GroupId can't be empty.")
        if _blank(req.instance_id):
            raise HeartbeatError(bad, "InstanceId can't be empty.")
        if _blank(req.rack_id):
            raise HeartbeatError(bad, "RackId can't be empty.")
        epoch = req.member_epoch
        if version >= 1 and (not req.member_id or _blank(req.member_id)):
            raise HeartbeatError(bad, "MemberId can't be empty.")
        if epoch > 0 or epoch == LEAVE_EPOCH:
            if not req.member_id or _blank(req.member_id):
                raise HeartbeatError(bad, "MemberId can't be empty.")
        elif epoch == 0:
            if req.rebalance_timeout_ms == -1:
                raise HeartbeatError(bad, "RebalanceTimeoutMs must be provided in first request.")
            if req.topic_partitions is None or req.topic_partitions:
                raise HeartbeatError(bad, "TopicPartitions must be empty when (re-)joining.")
            if req.subscribed_topic_names is None and req.subscribed_topic_regex is None:
                raise HeartbeatError(bad, "Either SubscribedTopicNames or SubscribedTopicRegex must be "
                                          "non-null when (re-)joining.")
        elif epoch == STATIC_LEAVE_EPOCH:
            if not req.member_id or _blank(req.member_id):
                raise HeartbeatError(bad, "MemberId can't be empty.")
            if req.instance_id is None:
                raise HeartbeatError(bad, "InstanceId can't be null.")
        else:
            raise HeartbeatError(bad, "MemberEpoch is invalid.")
        if req.server_assignor is not None and req.server_assignor not in self.config.assignors:
            raise HeartbeatError(E.UNSUPPORTED_ASSIGNOR,
                                 f"ServerAssignor {req.server_assignor} is not supported. Supported assignors: "
                                 f"{', '.join(self.config.assignors)}.")
        if req.subscribed_topic_regex:
            try:
                compile_subscription(req.subscribed_topic_regex)
            except InvalidRegex as exc:
                raise HeartbeatError(E.INVALID_REGULAR_EXPRESSION,
                                     f"SubscribedTopicRegex {req.subscribed_topic_regex} is not a valid "
                                     f"regular expression: {exc}.") from None

    def _heartbeat(self, req, version, now, client_id, client_host, out: Records):
        self._validate(req, version)
        if req.member_epoch in (LEAVE_EPOCH, STATIC_LEAVE_EPOCH):
            return self._leave(req, now, out)
        gid = req.group_id
        epoch = req.member_epoch
        group = self.groups.get(gid)
        if group is None:
            if epoch != 0:  # Kafka's getOrMaybeCreateConsumerGroup
                raise HeartbeatError(E.GROUP_ID_NOT_FOUND, f"Consumer group {gid} not found.")
            group = ConsumerGroup(gid)  # not stored: replay of the first record creates it
        mid = req.member_id
        if len(group.members) >= self.config.max_size and (not mid or mid not in group.members):
            raise HeartbeatError(E.GROUP_MAX_SIZE_REACHED, "The consumer group has reached its maximum "
                                 f"capacity of {self.config.max_size} members.")
        owned = _owned_map(req.topic_partitions)
        replaced: Member | None = None  # a static member's predecessor (taken over, not fenced)
        if req.instance_id is None:
            member = group.members.get(mid) if mid else None
            if member is None:
                if epoch != 0:
                    raise HeartbeatError(E.UNKNOWN_MEMBER_ID, f"Member {mid} is not a member of group {gid}.")
            elif epoch != 0:
                self._check_epoch(member, epoch, owned)
            # else: a known member joining again with epoch 0 (after FENCED_MEMBER_EPOCH, or when
            # its join response was lost) is accepted as it is and gets its current assignment back
            # (KAFKA-19233: Kafka's validation returns early for epoch 0)
        else:
            existing = group.static_member(req.instance_id)
            member = group.members.get(mid) if mid else None
            if epoch == 0:
                if existing is not None and existing.member_epoch == STATIC_LEAVE_EPOCH:
                    replaced = existing  # the instance comes back (under a new member id, or the same)
                elif existing is not None and existing.member_id != mid:
                    raise HeartbeatError(E.UNRELEASED_INSTANCE_ID,
                                         f"Static member {mid} with instance id {req.instance_id} cannot "
                                         f"join the group because the instance id is owned by "
                                         f"{existing.member_id} member.")
                # else a known member id with epoch 0 (see the dynamic case) or a new static member
            else:
                if existing is None:
                    raise HeartbeatError(E.UNKNOWN_MEMBER_ID, f"Instance id {req.instance_id} is unknown.")
                if existing.member_id != mid:
                    raise HeartbeatError(E.FENCED_INSTANCE_ID,
                                         f"Static member {mid} with instance id {req.instance_id} was fenced "
                                         f"by member {existing.member_id}.")
                member = existing
                self._check_epoch(member, epoch, owned)
        if not mid:  # v0 join: the coordinator mints the member id
            mid = self._new_uuid()
        return self._join_or_heartbeat(group, member, mid, replaced, req, now, client_id, client_host, owned, out)

    @staticmethod
    def _check_epoch(member: Member, epoch: int, owned: dict | None) -> None:
        if member.state == UNKNOWN and (owned is None or owned):
            # checked here, before any record, rather than in next_assignment as Kafka does
            # (Kafka rolls the whole request back; herd applies records as it writes them)
            raise HeartbeatError(E.FENCED_MEMBER_EPOCH, "The consumer group member is in a unknown state. "
                                 "The member must abandon all its partitions and rejoin.")
        if epoch > member.member_epoch:
            raise HeartbeatError(E.FENCED_MEMBER_EPOCH,
                                 f"The consumer group member has a greater member epoch ({epoch}) than the one "
                                 f"known by the group coordinator ({member.member_epoch}). The member must "
                                 "abandon all its partitions and rejoin.")
        if epoch < member.member_epoch and (epoch != member.previous_member_epoch
                                            or not _is_subset(owned, member.assigned)):
            raise HeartbeatError(E.FENCED_MEMBER_EPOCH,
                                 f"The consumer group member has a smaller member epoch ({epoch}) than the one "
                                 f"known by the group coordinator ({member.member_epoch}). The member must "
                                 "abandon all its partitions and rejoin.")

    def _join_or_heartbeat(self, group: ConsumerGroup, member: Member | None, mid: str, replaced: Member | None,
                           req, now: int, client_id: str, client_host: str, owned, out: Records):
        gid = group.group_id
        # the member as it will be: its previous self (or its static predecessor), updated
        new = Member(mid)
        base = member if member is not None else replaced
        if base is not None:
            new.copy_metadata_from(base)
        if req.instance_id is not None:
            new.instance_id = req.instance_id
        if req.rack_id is not None:
            new.rack_id = req.rack_id
        if req.rebalance_timeout_ms != -1:
            new.rebalance_timeout_ms = req.rebalance_timeout_ms
        if req.server_assignor is not None:
            new.server_assignor = req.server_assignor
        if req.subscribed_topic_names is not None:
            new.subscribed_topic_names = tuple(sorted(set(req.subscribed_topic_names)))
        if req.subscribed_topic_regex is not None:
            new.subscribed_topic_regex = req.subscribed_topic_regex or None
        new.client_id = client_id
        new.client_host = client_host
        before = member.assigned if member is not None else (replaced.assigned if replaced is not None else {})
        reasons = []
        if replaced is not None:
            # Kafka's replaceMember: the new member id takes the old one's place, partitions and target.
            old_id = replaced.member_id
            target = group.target.get(old_id, {})
            assigned, state = replaced.assigned, replaced.state  # nothing pending: dropped at epoch -2
            self._remove_member_records(group, old_id, out)
            self._cancel_member_timers(gid, old_id)
            self._emit(out, cr.member_metadata_key(gid, mid), cr.member_metadata_value(new))
            self._emit(out, cr.target_member_key(gid, mid), cr.target_member_value(target))
            self._emit(out, cr.current_assignment_key(gid, mid),
                       cr.current_assignment_value(0, 0, state, assigned, {}))
            group = self.groups[gid]
            changed = new.subscription_key() != replaced.subscription_key()
        else:
            changed = member is None or new.subscription_key() != member.subscription_key()
            if member is None or not _same_metadata(member, new):
                self._emit(out, cr.member_metadata_key(gid, mid), cr.member_metadata_value(new))
                group = self.groups[gid]
        if changed:  # (catalog changes arrive through topics_changed())
            reasons.append(f"member {mid} " + ("joined" if member is None and replaced is None
                                              else "changed its subscription"))
            if self._refresh_metadata(group, out):
                reasons.append("subscribed topic metadata changed")
        if reasons:
            self._bump(group, out, "; ".join(reasons))
        if group.group_epoch > group.assignment_epoch and self._assignment_due(gid, now):
            self._update_target(group, out)
            self._assigned_at[gid] = now
        elif changed and group.group_epoch > group.assignment_epoch:
            self._awaiting.setdefault(gid, set()).add(mid)
        m = group.members[mid]
        nxt = next_assignment(m, group.assignment_epoch, group.target.get(mid, {}), group.partition_epoch, owned)
        if nxt != _same(m):
            e, p, state, assigned, pending = nxt
            self._emit(out, cr.current_assignment_key(gid, mid),
                       cr.current_assignment_value(e, p, state, assigned, pending))
            m = group.members[mid]
            if m.state == UNREVOKED_PARTITIONS:
                self._schedule_rebalance(gid, m, now)
            else:
                self.timers.cancel((REBALANCE, gid, mid))
                self._rebalance_epoch.pop((gid, mid), None)
        self.timers.schedule((SESSION, gid, mid), now + self.config.session_timeout_ms)
        resp = ConsumerGroupHeartbeatResponse(member_id=mid, member_epoch=m.member_epoch,
                                              heartbeat_interval_ms=self._interval_for(group, m))
        full = req.member_epoch == 0 or (
            req.rebalance_timeout_ms != -1 and req.topic_partitions is not None
            and (req.subscribed_topic_names is not None or req.subscribed_topic_regex is not None))
        if full or m.assigned != before:
            resp.assignment = ConsumerGroupHeartbeatResponseAssignment(topic_partitions=cr.assignment_to_wire(
                m.assigned, ConsumerGroupHeartbeatResponseTopicPartitions))
        return resp

    def _interval_for(self, group: ConsumerGroup, m) -> int:
        """The heartbeat interval told to ``m``: the configured one, or the pending one (if shorter)
        while ``m`` can do nothing but wait: its join (or new subscription) is not assigned yet,
        the assignor held back by the assignment interval, or partitions of its target are still
        owned by members that must revoke them first. Its next heartbeat then picks up what it
        waits for about as soon as it is there, instead of a whole interval later (a member told
        to revoke gets the plain interval: every client acknowledges a revocation at once)."""
        interval = self.config.heartbeat_interval_ms
        pending = self.config.pending_heartbeat_interval_ms
        if 0 < pending < interval and (m.state == UNRELEASED_PARTITIONS or (
                group.assignment_epoch < group.group_epoch
                and m.member_id in self._awaiting.get(group.group_id, ()))):
            return pending
        return interval

    # ==== leaving and fencing ====================================================================

    def _leave(self, req, now: int, out: Records):
        gid, mid, epoch = req.group_id, req.member_id, req.member_epoch
        group = self.groups.get(gid)
        if group is None:
            raise HeartbeatError(E.GROUP_ID_NOT_FOUND, f"Consumer group {gid} not found.")
        if req.instance_id is None:
            member = group.members.get(mid)
            if member is None:
                raise HeartbeatError(E.UNKNOWN_MEMBER_ID, f"Member {mid} is not a member of group {gid}.")
            self._fence(group, member, out, f"member {mid} left")
        else:
            member = group.static_member(req.instance_id)
            if member is None:
                raise HeartbeatError(E.UNKNOWN_MEMBER_ID, f"Instance id {req.instance_id} is unknown.")
            if member.member_id != mid:
                raise HeartbeatError(E.FENCED_INSTANCE_ID,
                                     f"Static member {mid} with instance id {req.instance_id} was fenced by "
                                     f"member {member.member_id}.")
            if epoch == STATIC_LEAVE_EPOCH:
                # Keeps its assigned partitions (nobody else gets them) until it comes back under a
                # new member id or its session expires; drops what it was revoking.
                self._emit(out, cr.current_assignment_key(gid, mid), cr.current_assignment_value(
                    STATIC_LEAVE_EPOCH, member.previous_member_epoch, member.state, member.assigned, {}))
                self.timers.cancel((REBALANCE, gid, mid))
                self._rebalance_epoch.pop((gid, mid), None)
            else:
                self._fence(group, member, out, f"static member {mid} left")
        return ConsumerGroupHeartbeatResponse(member_id=mid, member_epoch=epoch)

    def _remove_member_records(self, group: ConsumerGroup, mid: str, out: Records) -> None:
        gid = group.group_id
        self._emit(out, cr.current_assignment_key(gid, mid), None)
        self._emit(out, cr.target_member_key(gid, mid), None)
        self._emit(out, cr.member_metadata_key(gid, mid), None)

    def _fence(self, group: ConsumerGroup, member: Member, out: Records, reason: str) -> None:
        """Kafka's ``consumerGroupFenceMember``: remove the member (its partitions are free at once),
        refresh the subscribed topics' metadata and bump the group epoch."""
        gid = group.group_id
        self._remove_member_records(group, member.member_id, out)
        self._cancel_member_timers(gid, member.member_id)
        group = self.groups[gid]
        self._refresh_metadata(group, out)
        self._bump(group, out, reason)

    # ==== admin ===================================================================================

    def delete_group(self, group_id: str) -> tuple[Records, int]:
        """DeleteGroups of a consumer group: NON_EMPTY_GROUP while it has members; else the
        group's tombstones (offsets are the caller's)."""
        group = self.groups.get(group_id)
        if group is None:
            return [], E.GROUP_ID_NOT_FOUND
        if group.members:
            return [], E.NON_EMPTY_GROUP
        out: Records = []
        self._emit(out, cr.target_metadata_key(group_id), None)
        self._emit(out, cr.partition_metadata_key(group_id), None)
        self._emit(out, cr.group_epoch_key(group_id), None)
        self.groups.pop(group_id, None)
        if group.state != DEAD:
            group.mark_dead()
        return out, E.NONE

    def list_groups(self, states: set[str] | None = None) -> list[tuple[str, str]]:
        """``[(group id, state)]``; ``states`` filters case-insensitively (Kafka's ListGroups)."""
        want = {s.lower() for s in states} if states else None
        return [(gid, g.state) for gid, g in self.groups.items() if want is None or g.state.lower() in want]

    def describe(self, group_ids: Iterable[str], include_authorized_operations: bool = False
                 ) -> list[ConsumerGroupDescribeResponseDescribedGroup]:
        out = []
        for gid in group_ids:
            group = self.groups.get(gid)
            if group is None:
                out.append(ConsumerGroupDescribeResponseDescribedGroup(
                    error_code=E.GROUP_ID_NOT_FOUND, error_message=f"Group {gid} not found.", group_id=gid))
                continue
            names = {tid: name for name, (tid, _) in group.subscription_metadata.items()}
            members = []
            for m in group.members.values():
                members.append(ConsumerGroupDescribeResponseMember(
                    member_id=m.member_id, instance_id=m.instance_id, rack_id=m.rack_id,
                    member_epoch=m.member_epoch, client_id=m.client_id, client_host=m.client_host,
                    subscribed_topic_names=list(m.subscribed_topic_names),
                    subscribed_topic_regex=m.subscribed_topic_regex,
                    assignment=_describe_assignment(m.assigned, names),
                    target_assignment=_describe_assignment(group.target.get(m.member_id, {}), names)))
                if _HAS_MEMBER_TYPE:  # ConsumerGroupDescribe v1 (KIP-1099), once the schema has it
                    members[-1].member_type = 1  # a consumer-protocol member
            out.append(ConsumerGroupDescribeResponseDescribedGroup(
                group_id=gid, group_state=group.state, group_epoch=group.group_epoch,
                assignment_epoch=group.assignment_epoch,
                assignor_name=group.preferred_assignor(self.config.assignors[0]), members=members,
                authorized_operations=(GROUP_AUTHORIZED_OPERATIONS if include_authorized_operations
                                       else -2147483648)))
        return out


def _same_metadata(a: Member, b: Member) -> bool:
    return all(getattr(a, n) == getattr(b, n) for n in (
        "instance_id", "rack_id", "client_id", "client_host", "subscribed_topic_names",
        "subscribed_topic_regex", "rebalance_timeout_ms", "server_assignor")) and a.has_metadata


def _describe_assignment(assignment: dict, names: dict) -> ConsumerGroupDescribeResponseAssignment:
    return ConsumerGroupDescribeResponseAssignment(topic_partitions=[
        ConsumerGroupDescribeResponseTopicPartitions(topic_id=tid, topic_name=names[tid], partitions=sorted(ps))
        for tid, ps in sorted(assignment.items()) if tid in names and ps])

