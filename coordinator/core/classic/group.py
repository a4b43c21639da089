"""The classic consumer group (Kafka's ``ClassicGroup``): members, states, protocol, generation.

States and what each one answers
--------------------------------

=====================  ===========================================================================
state                  behaviour
=====================  ===========================================================================
Empty                  No members (offsets may remain). JoinGroup starts the initial rebalance
                       (delayed by ``initial_rebalance_delay_ms``, debounced); SyncGroup and
                       Heartbeat → UNKNOWN_MEMBER_ID; OffsetCommit from a non-member with
                       generation -1 is accepted; DeleteGroups and offset expiry may remove it.
PreparingRebalance     Waiting for every known member to (re)join, up to the rebalance timeout.
                       JoinGroup is parked; Heartbeat → REBALANCE_IN_PROGRESS (rejoin);
                       SyncGroup → REBALANCE_IN_PROGRESS; commits from current members accepted.
CompletingRebalance    Join responses sent; waiting for the leader's SyncGroup with the
                       assignment. SyncGroup is parked until then; Heartbeat → NONE;
                       OffsetCommit → REBALANCE_IN_PROGRESS; a changed JoinGroup restarts.
Stable                 Assignment stored (GroupMetadata record written). SyncGroup returns the
                       stored assignment; Heartbeat → NONE; a JoinGroup from the leader or with
                       changed metadata restarts the rebalance.
Dead                   Removed (deleted or expired); never answers (the group is gone from its
                       shard, requests see an unknown group).
=====================  ===========================================================================

Transitions (``VALID_PREVIOUS`` is checked by :meth:`Group.transition_to`; anything else raises
:class:`IllegalStateTransition`)::

    Empty ──────────────┐
    Stable ─────────────┼──► PreparingRebalance ──► CompletingRebalance ──► Stable
    CompletingRebalance ┘            │
                                     └──► Empty   (the join phase ends with no members)
    any state ──► Dead

A group loaded from a GroupMetadata record starts directly in Stable (members) or Empty (none).

This module holds state and the rules that only need the group; the protocol's handlers live in
:mod:`coordinator.classic`, timers and records in :mod:`coordinator.shard`, responses in
:mod:`coordinator.responses`. The flight recorder (:class:`RebalanceRecord`) keeps, per group, the
last ``rebalance_history_size`` rebalances: why, who was waited for and how long, each phase.
"""
from __future__ import annotations

from collections import deque

from protocol import errors
from protocol.consumer import PROTOCOL_TYPE as CONSUMER_PROTOCOL_TYPE
from protocol.consumer import decode_subscription
from protocol.wire import ProtocolError

__all__ = [
    "EMPTY", "PREPARING_REBALANCE", "COMPLETING_REBALANCE", "STABLE", "DEAD", "STATES",
    "VALID_PREVIOUS", "IllegalStateTransition", "Parked", "Member", "Group", "RebalanceRecord",
]

EMPTY = "Empty"
PREPARING_REBALANCE = "PreparingRebalance"
COMPLETING_REBALANCE = "CompletingRebalance"
STABLE = "Stable"
DEAD = "Dead"
STATES = (EMPTY, PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE, DEAD)

# target state -> the states it may be entered from (Kafka's ClassicGroupState.validPreviousStates)
VALID_PREVIOUS: dict[str, frozenset[str]] = {
    PREPARING_REBALANCE: frozenset({STABLE, COMPLETING_REBALANCE, EMPTY}),
    COMPLETING_REBALANCE: frozenset({PREPARING_REBALANCE}),
    STABLE: frozenset({COMPLETING_REBALANCE}),
    EMPTY: frozenset({PREPARING_REBALANCE}),
    DEAD: frozenset({STABLE, PREPARING_REBALANCE, COMPLETING_REBALANCE, EMPTY, DEAD}),
}

_LOWER_STATES = {s.lower(): s for s in STATES}


class IllegalStateTransition(RuntimeError):
    """A state change the table above does not allow: a coordinator bug, never client input."""


class Parked:
    """A JoinGroup or SyncGroup request waiting for the rebalance: answered later."""

    __slots__ = ("token", "version", "since_ms")

    def __init__(self, token, version: int, since_ms: int):
        self.token = token
        self.version = version
        self.since_ms = since_ms

    def __repr__(self) -> str:
        return f"Parked(token={self.token!r}, version={self.version}, since_ms={self.since_ms})"


class Member:
    __slots__ = ("member_id", "group_instance_id", "client_id", "client_host", "rebalance_timeout_ms",
                 "session_timeout_ms", "protocol_type", "protocols", "assignment", "join", "sync",
                 "is_new", "hb_key", "joined_wall_ms", "stall_until", "join_enc", "record_enc")

    def __init__(self, member_id: str, group_instance_id: str | None, client_id: str, client_host: str,
                 rebalance_timeout_ms: int, session_timeout_ms: int, protocol_type: str,
                 protocols: list[tuple[str, bytes]], assignment: bytes = b"", hb_key=None,
                 joined_wall_ms: int | None = None):
        self.member_id = member_id
        self.group_instance_id = group_instance_id
        self.client_id = client_id
        self.client_host = client_host
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.session_timeout_ms = session_timeout_ms
        self.protocol_type = protocol_type
        # ((name, metadata), ...) in the member's preference order: a tuple, replaced on a rejoin,
        # never changed in place (encoded.py's cached parts rely on it)
        self.protocols = tuple(protocols)
        self.assignment = assignment
        self.join: Parked | None = None  # parked JoinGroup (only through Group.set_join/take_join)
        self.sync: Parked | None = None  # parked SyncGroup
        self.is_new = False
        self.hb_key = hb_key
        self.joined_wall_ms = joined_wall_ms
        # until when (monotonic ms) its session lives on time herd gave back after a stall
        self.stall_until = 0
        # its encoded part of the leader's JoinGroup answer and of the group's record, with what
        # they were encoded from (coordinator.core.classic.encoded)
        self.join_enc = None
        self.record_enc = None

    @property
    def is_static(self) -> bool:
        return self.group_instance_id is not None

    def metadata(self, protocol: str | None) -> bytes:
        for name, meta in self.protocols:
            if name == protocol:
                return meta
        raise KeyError(f"member {self.member_id} does not support protocol {protocol!r}")

    def matches(self, protocols: list[tuple[str, bytes]]) -> bool:
        """Same protocols with the same metadata in the same order (Kafka's ``matches``)."""
        return self.protocols == tuple(protocols)

    def vote(self, candidates) -> str:
        for name, _ in self.protocols:
            if name in candidates:
                return name
        raise ValueError(f"member {self.member_id} supports none of {sorted(candidates)}")

    def has_satisfied_heartbeat(self) -> bool:
        """At session expiry: a member waiting in a rebalance is kept (the rebalance and sync
        timeouts police it); a new member that never completed a join is not."""
        if self.is_new:
            return False
        return self.join is not None or self.sync is not None

    def describe(self) -> dict:
        return {
            "member_id": self.member_id,
            "group_instance_id": self.group_instance_id,
            "client_id": self.client_id,
            "client_host": self.client_host,
            "session_timeout_ms": self.session_timeout_ms,
            "rebalance_timeout_ms": self.rebalance_timeout_ms,
            "protocols": [name for name, _ in self.protocols],
            "assignment_bytes": len(self.assignment),
            "awaiting_join": self.join is not None,
            "awaiting_sync": self.sync is not None,
            "is_new": self.is_new,
        }

    def __repr__(self) -> str:
        return f"Member({self.member_id!r}, instance={self.group_instance_id!r})"


class RebalanceRecord:
    """One rebalance as seen by the flight recorder: from PreparingRebalance to Stable (or Empty,
    or superseded by a restart)."""

    __slots__ = ("reason", "detail", "trigger", "client_reason", "initial", "from_generation",
                 "started_ms", "started_wall_ms", "awaited", "rejoined", "outcomes", "replaced", "joined", "removed",
                 "join_done_ms", "synced", "protocol", "generation", "members", "outcome", "ended_ms",
                 "ended_wall_ms", "stall", "pending", "pending_outcomes", "joined_ids")

    def __init__(self, group: Group, reason: str, detail: str, trigger: dict | None,
                 client_reason: str | None, now_ms: int, wall_ms: int):
        self.reason = reason
        self.detail = detail
        self.trigger = trigger
        self.client_reason = client_reason
        self.initial = group.state == EMPTY
        self.from_generation = group.generation
        self.started_ms = now_ms
        self.started_wall_ms = wall_ms
        # members present when the rebalance started: who had to rejoin, and how long they took.
        # Kept compact (the Member objects, and only what changed per id): a 10,000-member group's
        # rebalance starts in one request, so no per-member entry is built here (as_dict builds them)
        newcomer = trigger.get("member_id") if trigger and reason in ("initial", "member_joined") else None
        members = group.members
        self.awaited: dict[str, Member] = dict(members)
        self.joined: list[dict] = []  # members that were not in the group when it started
        self.joined_ids: set[str] = set()  # their ids: a 5,000-member join phase checks each join in O(1)
        if newcomer is not None and newcomer in members:
            m = self.awaited.pop(newcomer)
            self.joined.append({**_who(m), "joined_after_ms": 0})
            self.joined_ids.add(newcomer)
        # ms after the start each awaited member rejoined (absent: not yet), what became of it
        # (absent: nothing yet), and the id a static member replaced (KIP-345)
        self.rejoined: dict[str, int] = {mid: 0 for mid, m in self.awaited.items() if m.join is not None}
        self.outcomes: dict[str, str] = {}
        self.replaced: dict[str, str] = {}
        self.removed: list[dict] = []
        # KIP-394 pending member ids (MEMBER_ID_REQUIRED handed out, not joined yet): the join phase
        # waits for them too, so the record says which ones there were and what became of them (an
        # entry is built when something happens to its id: None until then, see _pending_entry)
        self.pending: dict[str, dict | None] = dict.fromkeys(sorted(group.pending_members))
        # how many of them came to each outcome ("still_pending": none yet), kept as they change:
        # the rebalance_completed line of a 10,000-member formation counts them without a pass
        self.pending_outcomes: dict[str, int] = {"still_pending": len(self.pending)}
        self.join_done_ms: int | None = None
        self.synced: dict[str, int | None] = {}
        self.protocol: str | None = None
        self.generation: int | None = None
        self.members: int | None = None
        self.outcome: str | None = None
        self.ended_ms: int | None = None
        self.ended_wall_ms: int | None = None
        # herd itself stalled during this rebalance or just before it started (Shard.on_stall)
        self.stall: dict | None = None

    def mark_stall(self, stall: dict, now_ms: int, during: bool) -> None:
        """herd stalled for ``stall["stall_ms"]`` while this rebalance was in progress (``during``)
        or shortly before it started: an operator reading the history sees it was not the members."""
        self.stall = {"stall_ms": stall["stall_ms"], "stall_ended_wall_ms": stall["ended_wall_ms"],
                      "when": "during" if during else "after",
                      "started_after_stall_ms": None if during else now_ms - stall["ended_ms"]}

    def on_pending(self, member_id: str, client_id: str, client_host: str, now_ms: int) -> None:
        """A pending member id was handed out while this rebalance waits for its joins."""
        if member_id in self.pending:
            old = self.pending[member_id]
            self._count_outcome((old and old["outcome"]) or "still_pending", "still_pending")
        else:
            self._count_outcome(None, "still_pending")
        self.pending[member_id] = {"member_id": member_id, "client_id": client_id, "client_host": client_host,
                                   "minted_after_ms": now_ms - self.started_ms, "outcome": None, "after_ms": None}

    def on_pending_gone(self, member_id: str, outcome: str, now_ms: int) -> None:
        """A pending id stopped holding the join phase: ``joined``, ``expired``, ``left``, ..."""
        pending = self.pending
        if member_id not in pending:
            return
        entry = pending[member_id]
        if entry is None:
            entry = pending[member_id] = _pending_entry(member_id)
        if entry["outcome"] is None:
            entry["outcome"] = outcome
            entry["after_ms"] = now_ms - self.started_ms
            self._count_outcome("still_pending", outcome)

    def _count_outcome(self, was: str | None, now: str) -> None:
        counts = self.pending_outcomes
        if was is not None:
            counts[was] -= 1
        counts[now] = counts.get(now, 0) + 1

    def waiting_for(self) -> dict:
        """While the join phase runs: the members not rejoined yet and the pending ids not joined."""
        rejoined, outcomes = self.rejoined, self.outcomes
        return {"members": [mid for mid in self.awaited if mid not in rejoined and mid not in outcomes],
                "pending_member_ids": [pid for pid, e in self.pending.items() if e is None or e["outcome"] is None]}

    def pending_entries(self) -> list[dict]:
        """The pending ids' entries (as_dict, the rebalance_completed line)."""
        return [e if e is not None else _pending_entry(pid) for pid, e in self.pending.items()]

    def on_join(self, member: Member, now_ms: int) -> None:
        mid = member.member_id
        if self.pending:
            self.on_pending_gone(mid, "joined", now_ms)
        if mid in self.awaited:
            if mid not in self.rejoined:
                self.rejoined[mid] = now_ms - self.started_ms
            return
        if member.member_id in self.joined_ids:
            return
        self.joined_ids.add(member.member_id)
        self.joined.append({**_who(member), "joined_after_ms": now_ms - self.started_ms})

    def on_replaced(self, old_id: str, member: Member, now_ms: int) -> None:
        if self.awaited.pop(old_id, None) is not None:
            new_id = member.member_id
            self.awaited[new_id] = member
            self.replaced.pop(old_id, None)
            self.replaced[new_id] = old_id
            self.rejoined.pop(old_id, None)
            self.rejoined[new_id] = now_ms - self.started_ms
            if old_id in self.outcomes:
                self.outcomes[new_id] = self.outcomes.pop(old_id)

    def on_removed(self, member_id: str, why: str, now_ms: int) -> None:
        if member_id in self.awaited and member_id not in self.outcomes:
            self.outcomes[member_id] = why
        self.removed.append({"member_id": member_id, "why": why, "after_ms": now_ms - self.started_ms})

    def on_join_done(self, group: Group, now_ms: int) -> None:
        self.join_done_ms = now_ms
        self.protocol = group.protocol_name
        self.generation = group.generation
        self.members = len(group.members)
        self.synced = dict.fromkeys(group.members)
        outcomes, members = self.outcomes, group.members
        for mid in self.awaited:
            if mid not in outcomes and mid in members:
                outcomes[mid] = "rejoined"

    def on_sync(self, member_id: str, now_ms: int) -> None:
        if self.join_done_ms is not None and self.synced.get(member_id, 0) is None:
            self.synced[member_id] = now_ms - self.join_done_ms

    def finish(self, group: Group, outcome: str, now_ms: int, wall_ms: int) -> None:
        self.outcome = outcome
        self.ended_ms = now_ms
        self.ended_wall_ms = wall_ms
        if outcome == "empty":
            self.generation = group.generation
            self.members = 0
            self.protocol = None

    def _phases(self, end: int | None) -> tuple[int | None, int | None]:
        preparing = completing = None
        if self.join_done_ms is not None:
            preparing = self.join_done_ms - self.started_ms
            if end is not None:
                completing = end - self.join_done_ms
        elif end is not None:
            preparing = end - self.started_ms
        return preparing, completing

    def summary(self) -> dict:
        """The few fields a finished rebalance's log line and listeners use: O(1), unlike
        :meth:`as_dict`, which copies every member's entry (thousands in a big group)."""
        end = self.ended_ms
        preparing, completing = self._phases(end)
        return {"generation": self.generation, "reason": self.reason, "outcome": self.outcome or "in_progress",
                "protocol": self.protocol, "members": self.members,
                "duration_ms": None if end is None else end - self.started_ms,
                "phases": {"preparing_ms": preparing, "completing_ms": completing}}

    def as_dict(self, now_ms: int | None = None) -> dict:
        end = self.ended_ms if self.ended_ms is not None else now_ms
        preparing, completing = self._phases(end)
        slowest = max(self.rejoined.items(), key=lambda x: x[1], default=None)
        return {
            "generation": self.generation,
            "previous_generation": self.from_generation,
            "reason": self.reason,
            "detail": self.detail,
            "trigger": self.trigger,
            "client_reason": self.client_reason,
            "initial": self.initial,
            "outcome": self.outcome or "in_progress",
            "protocol": self.protocol,
            "members": self.members,
            "started_wall_ms": self.started_wall_ms,
            "ended_wall_ms": self.ended_wall_ms,
            "duration_ms": None if end is None else end - self.started_ms,
            "phases": {"preparing_ms": preparing, "completing_ms": completing},
            "awaited": [self._awaited_entry(mid, m) for mid, m in self.awaited.items()],
            "slowest_member": (None if slowest is None
                               else {"member_id": slowest[0], "rejoined_after_ms": slowest[1]}),
            "joined": [dict(j) for j in self.joined],
            "removed": [dict(r) for r in self.removed],
            "sync": [{"member_id": mid, "synced_after_ms": after} for mid, after in self.synced.items()],
            "stall": None if self.stall is None else dict(self.stall),
            "pending": [dict(e) for e in self.pending_entries()],
            "waiting_for": self.waiting_for() if self.join_done_ms is None and self.ended_ms is None else None,
        }

    def _awaited_entry(self, mid: str, m: Member) -> dict:
        entry = {**_who(m), "rejoined_after_ms": self.rejoined.get(mid), "outcome": self.outcomes.get(mid)}
        if mid in self.replaced:
            entry["replaced_member_id"] = self.replaced[mid]
        return entry


def _pending_entry(member_id: str) -> dict:
    """A pending id's entry in a RebalanceRecord before anything happened to it."""
    return {"member_id": member_id, "minted_after_ms": None, "outcome": None, "after_ms": None}


def _who(m: Member) -> dict:
    return {"member_id": m.member_id, "group_instance_id": m.group_instance_id, "client_id": m.client_id,
            "client_host": m.client_host}


class Group:
    __slots__ = ("group_id", "state", "previous_state", "state_wall_ms", "generation", "protocol_type",
                 "protocol_name", "leader_id", "members", "static_members", "pending_members",
                 "pending_sync", "supported_protocols", "num_awaiting_join", "new_member_added",
                 "_subscribed", "_subscribed_stale", "join_phase", "sync_generation", "history", "rebalance",
                 "created_wall_ms", "assigning", "stalled_clients")

    def __init__(self, group_id: str, *, state: str = EMPTY, generation: int = 0,
                 protocol_type: str | None = None, protocol_name: str | None = None,
                 leader_id: str | None = None, state_wall_ms: int | None = None,
                 history_size: int = 20):
        if state not in (EMPTY, STABLE):
            raise ValueError("a group starts Empty or (loaded) Stable")
        self.group_id = group_id
        self.state = state
        self.previous_state = state
        self.state_wall_ms = state_wall_ms  # wall ms of the last transition (Kafka currentStateTimestamp)
        self.created_wall_ms = state_wall_ms
        self.generation = generation
        self.protocol_type = protocol_type  # None until a member defines it (or "simple" groups)
        self.protocol_name = protocol_name
        self.leader_id = leader_id
        self.members: dict[str, Member] = {}  # insertion order matters: leader re-election
        self.static_members: dict[str, str] = {}  # group instance id -> member id
        self.pending_members: set[str] = set()  # KIP-394: got MEMBER_ID_REQUIRED, not yet joined
        self.pending_sync: set[str] = set()  # joined this generation, SyncGroup not yet received
        self.supported_protocols: dict[str, int] = {}  # protocol name -> members supporting it
        self.num_awaiting_join = 0
        self.new_member_added = False
        self._subscribed: set[str] | None = None
        self._subscribed_stale = False
        self.join_phase: tuple | None = None  # ("initial", delay_ms, remaining_ms) | ("normal",)
        self.sync_generation: int | None = None
        self.assigning = None  # the leader's assignment being encoded in slices (groups.py _assign_in_slices)
        # after herd stalled: (the last of their stall_until, its dynamic members then by (client id,
        # client host), in member order); groups.py _drop_member_given_up_after_stall looks a
        # rejoining client up here
        self.stalled_clients: tuple[int, dict[tuple[str, str], list[Member]]] | None = None
        self.history: deque = deque(maxlen=history_size)
        self.rebalance: RebalanceRecord | None = None

    # ---- state ------------------------------------------------------------------------------

    def transition_to(self, target: str, wall_ms: int | None) -> None:
        allowed = VALID_PREVIOUS.get(target)
        if allowed is None or self.state not in allowed:
            raise IllegalStateTransition(
                f"group {self.group_id!r}: cannot go from {self.state} to {target}")
        self.previous_state = self.state
        self.state = target
        self.state_wall_ms = wall_ms

    def can_rebalance(self) -> bool:
        return self.state in VALID_PREVIOUS[PREPARING_REBALANCE]

    @property
    def is_empty_state(self) -> bool:
        return self.state == EMPTY

    # ---- members ----------------------------------------------------------------------------

    def add(self, member: Member) -> None:
        iid = member.group_instance_id
        if iid is not None:
            if iid in self.static_members:
                raise RuntimeError(f"static member {iid!r} is already in group {self.group_id!r}")
            self.static_members[iid] = member.member_id
        if not self.members:
            self.protocol_type = member.protocol_type
        if member.protocol_type != self.protocol_type:
            raise RuntimeError("the group's and the member's protocol types differ")
        if self.leader_id is None:
            self.leader_id = member.member_id
        self.members[member.member_id] = member
        for name, _ in member.protocols:
            self.supported_protocols[name] = self.supported_protocols.get(name, 0) + 1
        if member.join is not None:
            self.num_awaiting_join += 1
        self.pending_members.discard(member.member_id)

    def remove(self, member_id: str) -> Member | None:
        member = self.members.pop(member_id, None)
        if member is not None:
            self._uncount_protocols(member)
            if member.join is not None:
                self.num_awaiting_join -= 1
            if member.group_instance_id is not None:
                self.static_members.pop(member.group_instance_id, None)
        if self.leader_id == member_id:
            self.leader_id = next(iter(self.members), None)
        self.pending_members.discard(member_id)
        self.pending_sync.discard(member_id)
        return member

    def _uncount_protocols(self, member: Member) -> None:
        sp = self.supported_protocols
        for name, _ in member.protocols:
            left = sp.get(name, 0) - 1
            if left > 0:
                sp[name] = left
            else:
                sp.pop(name, None)

    def update_member(self, member: Member, protocols: list[tuple[str, bytes]], rebalance_timeout_ms: int,
                      session_timeout_ms: int) -> None:
        self._uncount_protocols(member)
        member.protocols = tuple(protocols)
        for name, _ in protocols:
            self.supported_protocols[name] = self.supported_protocols.get(name, 0) + 1
        member.rebalance_timeout_ms = rebalance_timeout_ms
        member.session_timeout_ms = session_timeout_ms

    def replace_static_member(self, group_instance_id: str, old_id: str, new_id: str,
                              hb_key) -> tuple[Member, Member]:
        """KIP-345: the instance id moves to ``new_id``; everything else is kept. Returns
        ``(old, new)``; the caller answers the old member's parked requests (FENCED_INSTANCE_ID)."""
        old = self.members.pop(old_id, None)
        if old is None:
            raise KeyError(f"cannot replace unknown member {old_id!r}")
        if old.join is not None:
            self.num_awaiting_join -= 1
        new = Member(new_id, old.group_instance_id, old.client_id, old.client_host, old.rebalance_timeout_ms,
                     old.session_timeout_ms, old.protocol_type, old.protocols, old.assignment, hb_key=hb_key,
                     joined_wall_ms=old.joined_wall_ms)
        self.members[new_id] = new
        if self.leader_id == old_id:
            self.leader_id = new_id
        self.static_members[group_instance_id] = new_id
        if old_id in self.pending_sync:  # herd: the replacement inherits the obligation to sync
            self.pending_sync.discard(old_id)
            self.pending_sync.add(new_id)
        return old, new

    def set_join(self, member: Member, parked: Parked) -> Parked | None:
        """Park a JoinGroup for ``member``; returns a superseded parked JoinGroup, if any."""
        old = member.join
        if old is None:
            self.num_awaiting_join += 1
        member.join = parked
        return old

    def take_join(self, member: Member) -> Parked | None:
        parked = member.join
        if parked is not None:
            member.join = None
            self.num_awaiting_join -= 1
        return parked

    def has_all_members_joined(self) -> bool:
        return len(self.members) == self.num_awaiting_join and not self.pending_members

    def not_yet_rejoined(self) -> list[Member]:
        if self.num_awaiting_join == len(self.members):
            return []  # every member's JoinGroup is parked (the usual end of a join phase)
        return [m for m in self.members.values() if m.join is None]

    def maybe_elect_new_joined_leader(self) -> bool:
        """At the end of the join phase: keep the leader if it rejoined, else pick the first member
        that did. False when there is no leader or no member rejoined."""
        if self.leader_id is None:
            return False
        leader = self.members.get(self.leader_id)
        if leader is not None and leader.join is not None:
            return True
        for m in self.members.values():
            if m.join is not None:
                self.leader_id = m.member_id
                return True
        return False

    def validate_member(self, member_id: str, group_instance_id: str | None) -> int:
        """Kafka's ``validateMember``: the error code, or NONE."""
        if group_instance_id is not None:
            existing = self.static_members.get(group_instance_id)
            if existing is None:
                return errors.UNKNOWN_MEMBER_ID
            if existing != member_id:
                return errors.FENCED_INSTANCE_ID
        if member_id not in self.members:
            return errors.UNKNOWN_MEMBER_ID
        return errors.NONE

    def is_leader(self, member_id: str) -> bool:
        return self.leader_id == member_id

    def rebalance_timeout_ms(self) -> int:
        return max((m.rebalance_timeout_ms for m in self.members.values()), default=0)

    # ---- protocol ---------------------------------------------------------------------------

    def supports_protocols(self, protocol_type: str, names) -> bool:
        if self.state == EMPTY:
            return bool(protocol_type) and bool(names)
        n = len(self.members)
        return (self.protocol_type == protocol_type
                and any(self.supported_protocols.get(name, 0) == n for name in names))

    def candidate_protocols(self) -> set[str]:
        n = len(self.members)
        return {name for name, count in self.supported_protocols.items() if count == n}

    def select_protocol(self) -> str:
        """Each member votes for its most preferred protocol among those all members support; the
        most votes wins. Ties (Kafka: HashMap order, unspecified) go to the protocol voted for
        first in member order, so the choice is deterministic."""
        if not self.members:
            raise RuntimeError(f"cannot select a protocol for empty group {self.group_id!r}")
        candidates = self.candidate_protocols()
        if len(candidates) == 1:  # every member votes for the one protocol all support
            return next(iter(candidates))
        votes: dict[str, int] = {}
        for m in self.members.values():
            name = m.vote(candidates)
            votes[name] = votes.get(name, 0) + 1
        best = None
        for name, count in votes.items():
            if best is None or count > votes[best]:
                best = name
        return best

    def init_next_generation(self, wall_ms: int | None) -> None:
        self.generation += 1
        if self.members:
            self.protocol_name = self.select_protocol()
            self.transition_to(COMPLETING_REBALANCE, wall_ms)
        else:
            self.protocol_name = None
            self.transition_to(EMPTY, wall_ms)
        # the new generation's subscribed topics, computed when first asked for: a pass over every
        # member that a big group's join phase end (already one long loop turn) need not make
        self._subscribed_stale = True
        self.pending_sync.clear()

    @property
    def subscribed_topics(self) -> set[str] | None:
        """The union of the members' subscribed topics (see :meth:`compute_subscribed_topics`) as
        of the current generation."""
        if self._subscribed_stale:
            self._subscribed = self.compute_subscribed_topics()
            self._subscribed_stale = False
        return self._subscribed

    @subscribed_topics.setter
    def subscribed_topics(self, topics: set[str] | None) -> None:
        self._subscribed = topics
        self._subscribed_stale = False

    def uses_consumer_protocol(self) -> bool:
        return self.protocol_type == CONSUMER_PROTOCOL_TYPE

    def compute_subscribed_topics(self) -> set[str] | None:
        """The union of the members' subscribed topics for "consumer" groups; None when unknown
        (other protocol types, no protocol chosen yet, or an unparsable subscription)."""
        if self.protocol_type != CONSUMER_PROTOCOL_TYPE:
            return None
        if not self.members:
            return set()
        if self.protocol_name is None:
            return None
        topics: set[str] = set()
        seen: set[bytes] = set()  # members mostly share one subscription: each distinct one decoded once
        try:
            for m in self.members.values():
                meta = m.metadata(self.protocol_name)
                if meta in seen:
                    continue
                seen.add(meta)
                _, sub = decode_subscription(meta)
                topics.update(sub.topics)
        except (ProtocolError, KeyError):
            return None
        return topics

    def is_subscribed_to_topic(self, topic: str) -> bool:
        if self.subscribed_topics is None:
            return self.uses_consumer_protocol()
        return topic in self.subscribed_topics

    def offset_expiration_base(self) -> str | None:
        """KIP-211: which timestamp offsets of this group expire from, or None (no expiry now).
        "state": since the group became Empty (falling back to the commit time);
        "commit": since each offset's commit."""
        if self.protocol_type is not None:
            if self.state == EMPTY:
                return "state"
            if self.state == STABLE and self.uses_consumer_protocol() and self.subscribed_topics is not None:
                return "commit"
            return None
        return "commit"  # a "simple" group: offsets committed by standalone consumers

    # ---- views ------------------------------------------------------------------------------

    def summary(self) -> dict:
        return {
            "group_id": self.group_id,
            "state": self.state,
            "protocol_type": self.protocol_type or "",
            "protocol": self.protocol_name,
            "generation": self.generation,
            "leader": self.leader_id,
            "members": len(self.members),
            "pending_members": len(self.pending_members),
            "state_since_wall_ms": self.state_wall_ms,
        }

    @staticmethod
    def state_from_filter(name: str) -> str | None:
        return _LOWER_STATES.get(name.lower())

    def __repr__(self) -> str:
        return (f"Group({self.group_id!r}, state={self.state}, generation={self.generation}, "
                f"members={list(self.members)})")
