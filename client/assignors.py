"""Partition assignors with Kafka's protocol names and wire formats, and a pluggable registry.

The group leader runs the assignor the coordinator selected (the first name in the leader's
``partition.assignment.strategy`` list that every member supports). Built in:

============================  ==============  ===================================================
name                          protocols       user data in the subscription
============================  ==============  ===================================================
``range``                     eager           none
``roundrobin``                eager           none
``sticky``                    eager           StickyAssignorUserData v1 (previous assignment + gen)
``cooperative-sticky``        cooperative,    int32 generation (owned partitions travel in the
                              eager           subscription itself, ConsumerProtocol v1+)
============================  ==============  ===================================================

Kafka's documentation examples hold (10 partitions, 3 consumers): range gives [0-3], [4-6], [7-9];
roundrobin gives [0,3,6,9], [1,4,7], [2,5,8]; with sticky, after the third consumer of
[0-3], [4-6], [7-9] leaves, the result is [0-3,7], [4-6,8,9].

Write your own by subclassing :class:`Assignor` (``name``, ``assign``; optionally
``supported_protocols``, ``subscription_user_data``, ``on_assignment``) and calling
:func:`register_assignor`; or pass an instance in ``partition.assignment.strategy``.

Sticky algorithm (ours, following the behaviour of Kafka's AbstractStickyAssignor): previous
ownership is taken from each member's data, the highest generation winning a contested partition.
When every member subscribes to the same topics the assignment is computed with quotas (each member
keeps up to its quota of what it owned; the rest is dealt round-robin to members under quota).
Otherwise every valid previous assignment is kept, the rest goes to the eligible member with the
fewest partitions, and then partitions move from a member to an eligible member with at least two
fewer until none can: Kafka's definition of balanced. Each such move lowers the sum of squared
assignment sizes, so the loop ends.
"""

from __future__ import annotations

import struct
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from client.types import COOPERATIVE, EAGER, TopicPartition

__all__ = [
    "Assignor",
    "MemberSubscription",
    "MemberAssignment",
    "RangeAssignor",
    "RoundRobinAssignor",
    "StickyAssignor",
    "CooperativeStickyAssignor",
    "register_assignor",
    "create_assignor",
    "registered_assignors",
    "encode_sticky_user_data",
    "decode_sticky_user_data",
    "encode_generation_user_data",
    "decode_generation_user_data",
    "EAGER",
    "COOPERATIVE",
]

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")


@dataclass
class MemberSubscription:
    """One member's decoded subscription, as the leader's assignor sees it."""

    member_id: str
    topics: list
    user_data: bytes | None = None
    owned_partitions: list = field(default_factory=list)
    generation_id: int = -1
    rack_id: str | None = None
    group_instance_id: str | None = None
    version: int = 0

    def sort_key(self):
        # Kafka's MemberInfo order: static members (by instance id) before dynamic (by member id).
        if self.group_instance_id is not None:
            return (0, self.group_instance_id, self.member_id)
        return (1, self.member_id, "")


@dataclass
class MemberAssignment:
    partitions: list
    user_data: bytes | None = None


class Assignor(ABC):
    """Base class of partition assignors."""

    name: str = ""
    supported_protocols: tuple = (EAGER,)

    def subscription_user_data(self, topics: Iterable[str]) -> bytes | None:
        """Bytes to put in this member's subscription (None for none)."""
        return None

    @abstractmethod
    def assign(
        self, partitions_per_topic: dict[str, int], subscriptions: dict[str, MemberSubscription]
    ) -> dict[str, MemberAssignment | list]:
        """member id -> its partitions (a list of TopicPartition, or a MemberAssignment)."""

    def on_assignment(self, partitions: list, user_data: bytes | None, generation: int) -> None:  # noqa: B027
        """Called on every member when it receives its assignment (default: nothing)."""


def _sorted_members(subscriptions: dict[str, MemberSubscription]) -> list[MemberSubscription]:
    return sorted(subscriptions.values(), key=MemberSubscription.sort_key)


# -- range ---------------------------------------------------------------------------------------
class RangeAssignor(Assignor):
    """Per topic: consecutive ranges; the first ``partitions % members`` members get one more."""

    name = "range"

    def assign(self, partitions_per_topic, subscriptions):
        out = {m: [] for m in subscriptions}
        by_topic: dict[str, list[MemberSubscription]] = {}
        for sub in _sorted_members(subscriptions):
            for topic in set(sub.topics):
                by_topic.setdefault(topic, []).append(sub)
        for topic in sorted(by_topic):
            n = partitions_per_topic.get(topic)
            if not n:
                continue
            members = by_topic[topic]
            per, extra = divmod(n, len(members))
            for i, sub in enumerate(members):
                start = per * i + min(i, extra)
                length = per + (1 if i < extra else 0)
                out[sub.member_id].extend(TopicPartition(topic, p) for p in range(start, start + length))
        return out


# -- roundrobin ----------------------------------------------------------------------------------
class RoundRobinAssignor(Assignor):
    """All partitions sorted, dealt in turn to the members (skipping members not subscribed)."""

    name = "roundrobin"

    def assign(self, partitions_per_topic, subscriptions):
        out = {m: [] for m in subscriptions}
        members = _sorted_members(subscriptions)
        if not members:
            return out
        topics = sorted({t for s in members for t in s.topics if partitions_per_topic.get(t)})
        subscribed = {s.member_id: set(s.topics) for s in members}
        i = 0
        for topic in topics:
            for p in range(partitions_per_topic[topic]):
                while topic not in subscribed[members[i % len(members)].member_id]:
                    i += 1
                out[members[i % len(members)].member_id].append(TopicPartition(topic, p))
                i += 1
        return out


# -- sticky user data ----------------------------------------------------------------------------
def encode_sticky_user_data(partitions: Iterable[TopicPartition], generation: int | None) -> bytes:
    """StickyAssignorUserData as Java writes it: v1 when ``generation`` is given, else v0.

    v0: previous_assignment: [topic: string, partitions: [int32]]; v1 appends generation: int32.
    """
    by_topic: dict[str, list[int]] = {}
    for tp in partitions:
        by_topic.setdefault(tp.topic, []).append(tp.partition)
    out = bytearray(_I32.pack(len(by_topic)))
    for topic in sorted(by_topic):
        raw = topic.encode()
        out += _I16.pack(len(raw)) + raw
        parts = sorted(by_topic[topic])
        out += _I32.pack(len(parts))
        for p in parts:
            out += _I32.pack(p)
    if generation is not None:
        out += _I32.pack(generation)
    return bytes(out)


def decode_sticky_user_data(data: bytes | None) -> tuple[list[TopicPartition], int | None]:
    """(previous assignment, generation or None). Undecodable data reads as nothing owned."""
    if not data:
        return [], None
    try:
        pos = 0
        (n,) = _I32.unpack_from(data, pos)
        pos += 4
        if n < 0 or n > len(data):
            return [], None
        parts = []
        for _ in range(n):
            (ln,) = _I16.unpack_from(data, pos)
            pos += 2
            if ln < 0 or pos + ln > len(data):
                return [], None
            topic = data[pos : pos + ln].decode()
            pos += ln
            (m,) = _I32.unpack_from(data, pos)
            pos += 4
            if m < 0 or pos + 4 * m > len(data):
                return [], None
            for _ in range(m):
                (p,) = _I32.unpack_from(data, pos)
                pos += 4
                parts.append(TopicPartition(topic, p))
        generation = None
        if len(data) - pos >= 4:
            (generation,) = _I32.unpack_from(data, pos)
        return parts, generation
    except (struct.error, UnicodeDecodeError):
        return [], None


def encode_generation_user_data(generation: int) -> bytes:
    """CooperativeStickyAssignor's user data: just the int32 generation."""
    return _I32.pack(generation)


def decode_generation_user_data(data: bytes | None) -> int | None:
    if data is None:
        return None
    if len(data) < 4:
        return -1  # as Java: unreadable user data means the default generation
    return _I32.unpack_from(data, 0)[0]


# -- sticky --------------------------------------------------------------------------------------
class _AbstractSticky(Assignor):
    """Shared sticky logic; subclasses say where a member's previous partitions come from."""

    def __init__(self):
        self.partitions_transferring: dict[TopicPartition, str] = {}

    def member_data(self, sub: MemberSubscription) -> tuple[list[TopicPartition], int]:
        raise NotImplementedError

    def assign(self, partitions_per_topic, subscriptions):
        members = [s.member_id for s in sorted(subscriptions.values(), key=lambda s: s.member_id)]
        eligible_topics = {
            m: frozenset(t for t in subscriptions[m].topics if partitions_per_topic.get(t)) for m in members
        }
        exists = lambda tp: 0 <= tp.partition < partitions_per_topic.get(tp.topic, 0)  # noqa: E731

        # Previous ownership: the highest generation wins; equal generations, the first member.
        claims: dict[TopicPartition, tuple[int, str]] = {}
        for m in members:
            owned, gen = self.member_data(subscriptions[m])
            for tp in owned:
                tp = TopicPartition(*tp)
                if not exists(tp):
                    continue
                cur = claims.get(tp)
                if cur is None or gen > cur[0]:
                    claims[tp] = (gen, m)
        prev_owner = {tp: m for tp, (_, m) in claims.items()}
        owned_by: dict[str, list[TopicPartition]] = {m: [] for m in members}
        for tp, m in sorted(prev_owner.items()):
            if tp.topic in eligible_topics[m]:
                owned_by[m].append(tp)

        all_partitions = (
            sorted(
                TopicPartition(t, p)
                for t in set().union(*eligible_topics.values())
                for p in range(partitions_per_topic[t])
            )
            if members
            else []
        )
        if members and len(set(eligible_topics.values())) == 1:
            result = self._constrained(members, owned_by, all_partitions)
        else:
            result = self._general(members, owned_by, all_partitions, eligible_topics)
        self.partitions_transferring = {
            tp: m
            for m, tps in result.items()
            for tp in tps
            if tp in prev_owner and prev_owner[tp] != m and prev_owner[tp] in subscriptions
        }
        return result

    @staticmethod
    def _constrained(members, owned_by, all_partitions):
        n = len(members)
        total = len(all_partitions)
        min_q, extra = divmod(total, n)
        max_q = min_q + (1 if extra else 0)
        expected_max = extra  # how many members end with max_q
        result: dict[str, list[TopicPartition]] = {}
        taken: set[TopicPartition] = set()
        for m in members:
            owned = owned_by[m]
            if len(owned) <= min_q:
                keep = list(owned)
            elif len(owned) >= max_q and expected_max > 0:
                keep = owned[:max_q]
                expected_max -= 1
            else:
                keep = owned[:min_q]
            result[m] = keep
            taken.update(keep)
        unassigned = [tp for tp in all_partitions if tp not in taken]
        under_min = [m for m in members if len(result[m]) < min_q]
        at_min = [m for m in members if len(result[m]) == min_q and min_q < max_q]
        queue = list(unassigned)
        qi = 0
        # Deal to members under the minimum quota, round-robin, dropping each as it reaches it.
        while under_min and qi < len(queue):
            still = []
            for m in under_min:
                if qi >= len(queue):
                    still.append(m)
                    continue
                result[m].append(queue[qi])
                qi += 1
                if len(result[m]) < min_q:
                    still.append(m)
                elif min_q < max_q:
                    at_min.append(m)
            under_min = still
        # Then one extra each to members at exactly the minimum, while max-quota slots remain.
        for m in at_min:
            if qi >= len(queue) or expected_max <= 0:
                break
            result[m].append(queue[qi])
            qi += 1
            expected_max -= 1
        # Anything left (only when quotas were miscounted) goes to the smallest members.
        while qi < len(queue):
            m = min(members, key=lambda x: (len(result[x]), x))
            result[m].append(queue[qi])
            qi += 1
        return result

    @staticmethod
    def _general(members, owned_by, all_partitions, eligible_topics):
        result = {m: list(owned_by[m]) for m in members}
        kept = {tp: m for m in members for tp in owned_by[m]}
        candidates: dict[str, list[str]] = {}
        for m in members:
            for t in eligible_topics[m]:
                candidates.setdefault(t, []).append(m)
        unassigned = [tp for tp in all_partitions if tp not in kept]
        unassigned.sort(key=lambda tp: (len(candidates.get(tp.topic, ())), tp))
        for tp in unassigned:
            cands = candidates.get(tp.topic)
            if not cands:
                continue
            m = min(cands, key=lambda x: (len(result[x]), x))
            result[m].append(tp)
        # Balance: move a partition to an eligible member with at least two fewer, until none can.
        originally = {tp: m for tp, m in kept.items()}
        while True:
            moved = False
            for a in sorted(members, key=lambda x: (-len(result[x]), x)):
                # Prefer moving partitions a did not own before (keeps stickiness).
                order = sorted(result[a], key=lambda tp: (originally.get(tp) == a, tp))
                for tp in order:
                    best = None
                    for b in candidates[tp.topic]:
                        if len(result[b]) < len(result[a]) - 1 and (
                            best is None or (len(result[b]), b) < (len(result[best]), best)
                        ):
                            best = b
                    if best is not None:
                        result[a].remove(tp)
                        result[best].append(tp)
                        moved = True
                        break
                if moved:
                    break
            if not moved:
                return result


class StickyAssignor(_AbstractSticky):
    """Eager sticky: the previous assignment travels in StickyAssignorUserData v1."""

    name = "sticky"
    supported_protocols = (EAGER,)

    def __init__(self):
        super().__init__()
        self.member_assignment: list[TopicPartition] | None = None
        self.generation = -1

    def subscription_user_data(self, topics):
        if self.member_assignment is None:
            return None
        return encode_sticky_user_data(self.member_assignment, self.generation)

    def on_assignment(self, partitions, user_data, generation):
        self.member_assignment = list(partitions)
        self.generation = generation

    def member_data(self, sub):
        owned, gen = decode_sticky_user_data(sub.user_data)
        return owned, (-1 if gen is None else gen)


class CooperativeStickyAssignor(_AbstractSticky):
    """Cooperative sticky: owned partitions from the subscription; partitions that must move are left
    out of this round (their owner revokes them and rejoins; the next round assigns them)."""

    name = "cooperative-sticky"
    supported_protocols = (COOPERATIVE, EAGER)

    def __init__(self):
        super().__init__()
        self.generation = -1

    def subscription_user_data(self, topics):
        return encode_generation_user_data(self.generation)

    def on_assignment(self, partitions, user_data, generation):
        self.generation = generation

    def member_data(self, sub):
        if sub.generation_id is not None and sub.generation_id >= 0:
            gen = sub.generation_id
        else:
            g = decode_generation_user_data(sub.user_data)
            gen = -1 if g is None else g
        return list(sub.owned_partitions), gen

    def assign(self, partitions_per_topic, subscriptions):
        result = super().assign(partitions_per_topic, subscriptions)
        for tp, m in self.partitions_transferring.items():
            if tp in result.get(m, ()):
                result[m].remove(tp)
        return result


# -- registry ------------------------------------------------------------------------------------
_REGISTRY: dict[str, Callable[[], Assignor]] = {}


def register_assignor(factory: Callable[[], Assignor], name: str | None = None) -> None:
    """Make ``name`` (default: ``factory.name``) usable in ``partition.assignment.strategy``.

    ``factory`` is an Assignor subclass or any callable returning a fresh Assignor (assignors keep
    per-consumer state, so every consumer gets its own instance)."""
    name = name or getattr(factory, "name", None)
    if not name:
        raise ValueError("an assignor needs a name")
    _REGISTRY[name] = factory


def registered_assignors() -> list[str]:
    return sorted(_REGISTRY)


def create_assignor(spec) -> Assignor:
    """An Assignor from a registered name, an Assignor subclass, or an instance (used as is)."""
    if isinstance(spec, Assignor):
        return spec
    if isinstance(spec, type) and issubclass(spec, Assignor):
        return spec()
    if isinstance(spec, str):
        factory = _REGISTRY.get(spec.strip())
        if factory is None:
            raise ValueError(f"unknown partition assignor {spec!r}; registered: {registered_assignors()}")
        return factory()
    raise TypeError(f"not an assignor: {spec!r}")


for _cls in (RangeAssignor, RoundRobinAssignor, StickyAssignor, CooperativeStickyAssignor):
    register_assignor(_cls)
