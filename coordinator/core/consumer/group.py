"""A consumer group of Kafka's consumer protocol (KIP-848): its epochs, members and assignments.

Group states and what each one means
------------------------------------

===========  ==================================================================================
state        meaning (computed from the epochs, as Kafka's ``ConsumerGroup.maybeUpdateGroupState``)
===========  ==================================================================================
Empty        No members. Offsets may remain; DeleteGroups may delete it (-> Dead).
Assigning    The group epoch is ahead of the target assignment epoch: a member joined, left, changed
             its subscription, or a subscribed topic changed; the next heartbeat of any member
             computes the new target assignment.
Reconciling  The target assignment is computed; some member has not reached it yet (it has
             partitions to revoke, or waits for partitions others still have to release).
Stable       Every member is at the target assignment epoch with its target partitions.
Dead         Deleted; never answers (the group is gone, requests see an unknown group).
===========  ==================================================================================

Group transitions (``GROUP_VALID_PREVIOUS``, checked by :meth:`ConsumerGroup.settle` at the end
of every operation and after replay; anything else raises :class:`IllegalStateTransition`)::

    Empty <──► Assigning <──► Reconciling <──► Stable      (every pair among these four)
    Empty ──► Dead                                         (Dead is final)

The state is settled once per operation, not per record: within one heartbeat a group moves
through intermediate states record by record (Kafka's does too), and only the state an operation
leaves the group in is a transition.

Member states (the ``State`` byte of the CurrentMemberAssignment record, Kafka's ``MemberState``)
-----------------------------------------------------------------------------------------------

======================  ==========  =================================================================
state                   byte        meaning
======================  ==========  =================================================================
STABLE                  0           At its epoch's assignment; nothing to revoke or to wait for.
UNREVOKED_PARTITIONS    1           Must revoke ``pending_revocation`` before it gets its next epoch;
                                    the rebalance timeout runs (fenced when it expires).
UNRELEASED_PARTITIONS   2           At the target epoch, but some target partitions are still owned
                                    by other members; it gets them as they are released.
UNKNOWN                 127         A state byte this coordinator does not know (written by a newer
                                    one): the member is fenced unless it comes back owning nothing.
======================  ==========  =================================================================

Member transitions (``MEMBER_VALID_PREVIOUS``; :meth:`Member.set_state` checks them)::

    STABLE ◄──► UNREVOKED_PARTITIONS ◄──► UNRELEASED_PARTITIONS ◄──► STABLE
    UNKNOWN ──► any of the three                (UNKNOWN is only ever read from a record)

Revoke before assign: a partition has at most one owner at any moment. ``partition_epochs`` maps
each partition owned (assigned or pending revocation) to its owner's epoch; :meth:`_own` raises if
a partition would get a second owner, and the reconciliation never gives a member a partition that
is still in ``partition_epochs`` under someone else.

This module holds state and the rules that only need the group; operations, records, timers and
responses live in :mod:`coordinator.core.consumer.groups`.
"""
from __future__ import annotations

from protocol import errors

__all__ = [
    "EMPTY", "ASSIGNING", "RECONCILING", "STABLE", "DEAD", "GROUP_STATES", "GROUP_VALID_PREVIOUS",
    "MEMBER_STABLE", "UNREVOKED_PARTITIONS", "UNRELEASED_PARTITIONS", "UNKNOWN", "MEMBER_STATES",
    "MEMBER_VALID_PREVIOUS", "IllegalStateTransition", "Member", "ConsumerGroup", "NO_EPOCH",
    "LEAVE_EPOCH", "STATIC_LEAVE_EPOCH",
]

EMPTY = "Empty"
ASSIGNING = "Assigning"
RECONCILING = "Reconciling"
STABLE = "Stable"
DEAD = "Dead"
GROUP_STATES = (EMPTY, ASSIGNING, RECONCILING, STABLE, DEAD)

# target state -> the states it may be entered from
GROUP_VALID_PREVIOUS: dict[str, frozenset[str]] = {
    EMPTY: frozenset({ASSIGNING, RECONCILING, STABLE}),
    ASSIGNING: frozenset({EMPTY, RECONCILING, STABLE}),
    RECONCILING: frozenset({EMPTY, ASSIGNING, STABLE}),
    STABLE: frozenset({EMPTY, ASSIGNING, RECONCILING}),
    DEAD: frozenset({EMPTY}),
}

MEMBER_STABLE = 0
UNREVOKED_PARTITIONS = 1
UNRELEASED_PARTITIONS = 2
UNKNOWN = 127
MEMBER_STATES = {MEMBER_STABLE: "STABLE", UNREVOKED_PARTITIONS: "UNREVOKED_PARTITIONS",
                 UNRELEASED_PARTITIONS: "UNRELEASED_PARTITIONS", UNKNOWN: "UNKNOWN"}
MEMBER_VALID_PREVIOUS: dict[int, frozenset[int]] = {
    MEMBER_STABLE: frozenset({MEMBER_STABLE, UNREVOKED_PARTITIONS, UNRELEASED_PARTITIONS, UNKNOWN}),
    UNREVOKED_PARTITIONS: frozenset({MEMBER_STABLE, UNREVOKED_PARTITIONS, UNRELEASED_PARTITIONS, UNKNOWN}),
    UNRELEASED_PARTITIONS: frozenset({MEMBER_STABLE, UNREVOKED_PARTITIONS, UNRELEASED_PARTITIONS, UNKNOWN}),
    UNKNOWN: frozenset(),
}

NO_EPOCH = -1  # partition_epoch() of a partition nobody owns
LEAVE_EPOCH = -1  # MemberEpoch of a leaving member
STATIC_LEAVE_EPOCH = -2  # MemberEpoch of a static member leaving for a while (a restart)

EMPTY_ASSIGNMENT: dict = {}


class IllegalStateTransition(RuntimeError):
    """A state change the tables above do not allow: a coordinator bug, never client input."""


class Member:
    """One member. Subscription fields come from MemberMetadata records, epochs and partitions from
    CurrentMemberAssignment records (a member may exist with only one of the two while a batch
    of records is being applied)."""

    __slots__ = ("member_id", "instance_id", "rack_id", "client_id", "client_host",
                 "subscribed_topic_names", "subscribed_topic_regex", "rebalance_timeout_ms",
                 "server_assignor", "member_epoch", "previous_member_epoch", "state", "assigned",
                 "pending_revocation", "has_metadata", "assigned_at")

    def __init__(self, member_id: str):
        self.member_id = member_id
        self.instance_id: str | None = None
        self.rack_id: str | None = None
        self.client_id = ""
        self.client_host = ""
        self.subscribed_topic_names: tuple[str, ...] = ()
        self.subscribed_topic_regex: str | None = None
        self.rebalance_timeout_ms = -1
        self.server_assignor: str | None = None
        self.member_epoch = 0
        self.previous_member_epoch = 0
        self.state = MEMBER_STABLE
        self.assigned: dict[bytes, frozenset[int]] = {}
        self.pending_revocation: dict[bytes, frozenset[int]] = {}
        self.has_metadata = False
        # (topic id, partition) -> the member epoch at which this member got it (kept while the
        # partition stays assigned or pending revocation): an OffsetCommit with an older member
        # epoch is accepted for it when that epoch is at or after this one (Kafka 4.4). Derived
        # from the CurrentMemberAssignment records in replay order; after a restart that replayed
        # only the latest record, a kept partition counts from the member's epoch then (stricter)
        self.assigned_at: dict[tuple[bytes, int], int] = {}

    def set_state(self, state: int) -> None:
        if state not in MEMBER_VALID_PREVIOUS:
            state = UNKNOWN
        if state != UNKNOWN and self.state not in MEMBER_VALID_PREVIOUS[state]:
            raise IllegalStateTransition(
                f"member {self.member_id}: {MEMBER_STATES[self.state]} -> {MEMBER_STATES[state]}")
        self.state = state

    def is_reconciled_to(self, target_epoch: int) -> bool:
        return self.state == MEMBER_STABLE and self.member_epoch == target_epoch

    def subscription_key(self) -> tuple:
        return (self.subscribed_topic_names, self.subscribed_topic_regex)

    def copy_metadata_from(self, other: Member) -> None:
        for name in ("instance_id", "rack_id", "client_id", "client_host", "subscribed_topic_names",
                     "subscribed_topic_regex", "rebalance_timeout_ms", "server_assignor"):
            setattr(self, name, getattr(other, name))

    def __repr__(self) -> str:
        return (f"Member({self.member_id!r}, epoch={self.member_epoch}, prev={self.previous_member_epoch}, "
                f"state={MEMBER_STATES.get(self.state, self.state)}, assigned={_fmt(self.assigned)}, "
                f"revoking={_fmt(self.pending_revocation)})")


def _fmt(a: dict) -> str:
    return "{" + ", ".join(f"{tid.hex()[:6]}:{sorted(ps)}" for tid, ps in sorted(a.items())) + "}"


class ConsumerGroup:
    __slots__ = ("group_id", "group_epoch", "assignment_epoch", "subscription_metadata", "members",
                 "target", "static_members", "partition_epochs", "state", "state_history",
                 "epoch_reasons", "has_epoch_record", "_topic_counts", "_regex_counts", "_assignor_counts",
                 "_stable_at")

    def __init__(self, group_id: str):
        self.group_id = group_id
        self.group_epoch = 0
        self.assignment_epoch = 0
        # topic name -> (topic id, partition count), for the topics some member subscribes to, as
        # of the last PartitionMetadata record (the assignor's view of the catalog)
        self.subscription_metadata: dict[str, tuple[bytes, int]] = {}
        self.members: dict[str, Member] = {}
        self.target: dict[str, dict[bytes, frozenset[int]]] = {}  # member id -> target assignment
        self.static_members: dict[str, str] = {}  # instance id -> member id
        self.partition_epochs: dict[tuple[bytes, int], int] = {}  # (topic id, partition) -> owner's epoch
        self.state = EMPTY
        self.state_history: list[tuple[str, str]] = []  # (from, to), the last few settled changes
        # why the group epoch moved: (epoch, reason), newest last (not durable: the flight recorder)
        self.epoch_reasons: list[tuple[int, str]] = []
        self.has_epoch_record = False
        # Kept as records are applied, so that no heartbeat walks the members (a 5,000-member
        # group): subscribed topic name / regex / named assignor -> members naming it, and member
        # epoch -> members Stable at it.
        self._topic_counts: dict[str, int] = {}
        self._regex_counts: dict[str, int] = {}
        self._assignor_counts: dict[str, int] = {}
        self._stable_at: dict[int, int] = {}

    # ---- derived state --------------------------------------------------------------------------

    def computed_state(self) -> str:
        if not self.members:
            return EMPTY
        if self.group_epoch > self.assignment_epoch:
            return ASSIGNING
        # every member reconciled to the assignment epoch (Member.is_reconciled_to), counted
        if self._stable_at.get(self.assignment_epoch, 0) != len(self.members):
            return RECONCILING
        return STABLE

    def settle(self) -> str:
        """Move ``state`` to the computed state, checking the transition table."""
        new = self.computed_state()
        old = self.state
        if new != old:
            if old not in GROUP_VALID_PREVIOUS[new]:
                raise IllegalStateTransition(f"consumer group {self.group_id}: {old} -> {new}")
            self.state = new
            self.state_history.append((old, new))
            del self.state_history[:-16]
        return new

    def mark_dead(self) -> None:
        if self.members or DEAD == self.state:
            raise IllegalStateTransition(f"consumer group {self.group_id}: {self.state} -> {DEAD}"
                                         f" with {len(self.members)} members")
        if self.state not in GROUP_VALID_PREVIOUS[DEAD]:
            raise IllegalStateTransition(f"consumer group {self.group_id}: {self.state} -> {DEAD}")
        self.state = DEAD

    def note_epoch(self, epoch: int, reason: str) -> None:
        self.epoch_reasons.append((epoch, reason))
        del self.epoch_reasons[:-16]

    def partition_epoch(self, topic_id: bytes, partition: int) -> int:
        return self.partition_epochs.get((topic_id, partition), NO_EPOCH)

    def static_member(self, instance_id: str | None) -> Member | None:
        if instance_id is None:
            return None
        mid = self.static_members.get(instance_id)
        return self.members.get(mid) if mid is not None else None

    def subscribed_topic_names(self) -> set[str]:
        return set(self._topic_counts)

    def regexes(self) -> set[str]:
        return set(self._regex_counts)

    def preferred_assignor(self, default: str) -> str:
        """The assignor most members name (ties: the name first in sort order), else ``default``
        (Kafka's ``computePreferredServerAssignor``)."""
        counts = self._assignor_counts
        if not counts:
            return default
        return min(counts, key=lambda a: (-counts[a], a))

    # ---- applying records (the only way durable state changes) ------------------------------------

    def _index(self, m: Member, step: int) -> None:
        """Count ``m``'s subscription and assignor in (step 1) or out (-1) of the group's counts."""
        for counts, keys in ((self._topic_counts, m.subscribed_topic_names),
                             (self._regex_counts, (m.subscribed_topic_regex,) if m.subscribed_topic_regex else ()),
                             (self._assignor_counts, (m.server_assignor,) if m.server_assignor else ())):
            for k in keys:
                c = counts.get(k, 0) + step
                if c:
                    counts[k] = c
                else:
                    del counts[k]

    def _index_state(self, m: Member, step: int) -> None:
        """Count ``m`` in (1) or out (-1) of the members Stable at its epoch."""
        if m.state == MEMBER_STABLE:
            c = self._stable_at.get(m.member_epoch, 0) + step
            if c:
                self._stable_at[m.member_epoch] = c
            else:
                del self._stable_at[m.member_epoch]

    def _disown(self, member: Member) -> None:
        for assignment in (member.assigned, member.pending_revocation):
            for tid, parts in assignment.items():
                for p in parts:
                    if self.partition_epochs.get((tid, p)) == member.member_epoch:
                        del self.partition_epochs[(tid, p)]

    def _own(self, member: Member) -> None:
        for assignment in (member.assigned, member.pending_revocation):
            for tid, parts in assignment.items():
                for p in parts:
                    if (tid, p) in self.partition_epochs:
                        raise IllegalStateTransition(
                            f"consumer group {self.group_id}: partition {tid.hex()}/{p} would be owned twice "
                            f"(member {member.member_id} at epoch {member.member_epoch})")
                    self.partition_epochs[(tid, p)] = member.member_epoch

    def _member(self, member_id: str) -> Member:
        m = self.members.get(member_id)
        if m is None:
            m = self.members[member_id] = Member(member_id)
            self._index_state(m, 1)
        return m

    def apply_member_metadata(self, member_id: str, value) -> None:
        if value is None:
            m = self.members.get(member_id)
            if m is None:
                return
            if m.assigned or m.pending_revocation:
                self._disown(m)
            self._index(m, -1)
            self._index_state(m, -1)
            del self.members[member_id]
            if m.instance_id is not None and self.static_members.get(m.instance_id) == member_id:
                del self.static_members[m.instance_id]
            return
        m = self._member(member_id)
        if m.instance_id is not None and m.instance_id != value.instance_id \
                and self.static_members.get(m.instance_id) == member_id:
            del self.static_members[m.instance_id]
        self._index(m, -1)
        m.instance_id = value.instance_id
        m.rack_id = value.rack_id
        m.client_id = value.client_id
        m.client_host = value.client_host
        m.subscribed_topic_names = tuple(value.subscribed_topic_names or ())
        m.subscribed_topic_regex = value.subscribed_topic_regex
        m.rebalance_timeout_ms = value.rebalance_timeout_ms
        m.server_assignor = value.server_assignor
        m.has_metadata = True
        self._index(m, 1)
        if m.instance_id is not None:
            self.static_members[m.instance_id] = member_id

    def apply_current_assignment(self, member_id: str, epoch: int, previous_epoch: int, state: int,
                                 assigned: dict, pending: dict) -> None:
        m = self._member(member_id)
        self._disown(m)
        self._index_state(m, -1)
        m.member_epoch = epoch
        m.previous_member_epoch = previous_epoch
        try:
            m.set_state(state)
        finally:
            self._index_state(m, 1)
        m.assigned = assigned
        m.pending_revocation = pending
        old_at = m.assigned_at
        at: dict[tuple[bytes, int], int] = {}
        for assignment in (assigned, pending):
            for tid, parts in assignment.items():
                for p in parts:
                    at[(tid, p)] = old_at.get((tid, p), epoch)
        m.assigned_at = at
        self._own(m)

    def remove_current_assignment(self, member_id: str) -> None:
        m = self.members.get(member_id)
        if m is None:
            return
        self._disown(m)
        self._index_state(m, -1)
        m.member_epoch = 0
        m.previous_member_epoch = 0
        m.state = MEMBER_STABLE
        self._index_state(m, 1)
        m.assigned = {}
        m.pending_revocation = {}
        m.assigned_at = {}


def error_name(code: int) -> str:
    return errors.error_name(code)
