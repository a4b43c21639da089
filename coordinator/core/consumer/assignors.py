"""Server-side assignors for consumer groups (KIP-848 ``ServerAssignor``): pure functions.

``assign(members, topics, current) -> target``

* ``members``: member id -> :class:`MemberSubscription` (the topic ids it subscribes to, among the
  ones in ``topics``; its instance id and rack);
* ``topics``: topic id (16 bytes) -> partition count, for every topic some member subscribes to;
* ``current``: member id -> the member's previous *target* assignment ``{topic id: frozenset}``
  (stickiness starts from there, as Kafka's assignors start from the previous target);
* result: member id -> ``{topic id: frozenset of partitions}`` for every member in ``members``
  (empty dict when it gets nothing). Every partition of a subscribed topic goes to exactly one
  member subscribed to it. Deterministic: the same input always gives the same output.

``uniform`` (the default, Kafka's ``UniformAssignor``): balanced and sticky.
  When every member subscribes to the same topics (homogeneous, the usual case) each member gets
  ``P // N`` or ``P // N + 1`` partitions; a member keeps the partitions it had, up to its quota,
  and members that had more than the minimum get the ``P % N`` larger quotas first, so that the
  number of partitions that move is the minimum the quotas allow (one member joining takes its
  share from the others and nothing else moves; one leaving gives its partitions away and nothing
  else moves). With different subscriptions (heterogeneous), members keep what they had, new
  partitions go to the least loaded eligible member (topics with the fewest eligible members
  first), then partitions move one at a time from a member to an eligible one with at least two
  fewer until no such move exists.
``range`` (Kafka's ``RangeAssignor``): per topic, the subscribed members (static ones first by
  instance id, then dynamic ones by member id) get contiguous ranges, the first ``P % N`` one
  more; members with the same subscription over topics of equal size get the same partition
  numbers of every topic (co-partitioning). Like Kafka's, it ignores the current assignment:
  static members are what keeps it stable across restarts.
"""
from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["MemberSubscription", "uniform", "range_assign", "ASSIGNORS", "DEFAULT_ASSIGNOR"]

Assignment = dict  # topic id (bytes) -> frozenset[int]


@dataclass(frozen=True)
class MemberSubscription:
    topic_ids: frozenset = field(default_factory=frozenset)
    instance_id: str | None = None
    rack_id: str | None = None


def _freeze(assigned: dict[str, dict[bytes, list[int]]]) -> dict[str, Assignment]:
    return {mid: {tid: frozenset(ps) for tid, ps in sorted(tps.items()) if ps} for mid, tps in assigned.items()}


def _kept(members, topics, current):
    """Each member's still-valid previous partitions (subscribed, existing, not taken by a member
    earlier in id order), sorted; and the set of partitions taken."""
    taken: set[tuple[bytes, int]] = set()
    kept: dict[str, list[tuple[bytes, int]]] = {}
    for mid in sorted(members):
        subs = members[mid].topic_ids
        mine = []
        for tid, parts in sorted((current.get(mid) or {}).items()):
            n = topics.get(tid)
            if n is None or tid not in subs:
                continue
            for p in sorted(parts):
                if 0 <= p < n and (tid, p) not in taken:
                    taken.add((tid, p))
                    mine.append((tid, p))
        kept[mid] = mine
    return kept, taken


def uniform(members: dict[str, MemberSubscription], topics: dict[bytes, int],
            current: dict[str, Assignment]) -> dict[str, Assignment]:
    if not members:
        return {}
    subs = {m.topic_ids for m in members.values()}
    if len(subs) == 1:
        return _uniform_homogeneous(members, topics, current, next(iter(subs)))
    return _uniform_heterogeneous(members, topics, current)


def _uniform_homogeneous(members, topics, current, topic_ids) -> dict[str, Assignment]:
    order = sorted(members)
    all_parts = [(tid, p) for tid in sorted(topic_ids) if tid in topics for p in range(topics[tid])]
    n = len(order)
    min_q, extras = divmod(len(all_parts), n)
    kept, _ = _kept(members, topics, current)
    out: dict[str, list[tuple[bytes, int]]] = {}
    pool: list[tuple[bytes, int]] = []
    # Members that had more than the minimum keep one more first: the biggest holders first,
    # so the partitions that have to move are as few as the quotas allow.
    for mid in sorted(order, key=lambda m: (-len(kept[m]), m)):
        mine = kept[mid]
        quota = min_q
        if len(mine) > min_q and extras > 0:
            quota += 1
            extras -= 1
        out[mid] = mine[:quota]
        pool.extend(mine[quota:])
    owned = {tp for mine in out.values() for tp in mine}
    pool = sorted(set(pool) | {tp for tp in all_parts if tp not in owned})
    pool.reverse()  # pop() from the end takes the smallest first
    for mid in order:
        mine = out[mid]
        while len(mine) < min_q:
            mine.append(pool.pop())
    for mid in order:
        if not extras or not pool:
            break
        if len(out[mid]) == min_q:
            out[mid].append(pool.pop())
            extras -= 1
    assert not pool, "uniform assignor left partitions unassigned"
    return _freeze({mid: _group(ps) for mid, ps in out.items()})


def _group(pairs) -> dict[bytes, list[int]]:
    out: dict[bytes, list[int]] = {}
    for tid, p in pairs:
        out.setdefault(tid, []).append(p)
    return out


def _uniform_heterogeneous(members, topics, current) -> dict[str, Assignment]:
    order = sorted(members)
    eligible: dict[bytes, list[str]] = {}
    for mid in order:
        for tid in members[mid].topic_ids:
            if tid in topics:
                eligible.setdefault(tid, []).append(mid)
    kept, taken = _kept(members, topics, current)
    owner: dict[tuple[bytes, int], str] = {}
    load = {mid: 0 for mid in order}
    for mid, mine in kept.items():
        for tp in mine:
            owner[tp] = mid
        load[mid] = len(mine)
    free = [(len(eligible[tid]), tid, p) for tid in eligible for p in range(topics[tid]) if (tid, p) not in taken]
    for _, tid, p in sorted(free):
        best = min(eligible[tid], key=lambda m: (load[m], m))
        owner[(tid, p)] = best
        load[best] += 1
    # Balance: move a partition from a member to an eligible one with at least two fewer, until no
    # such move exists (every move lowers the sum of squared loads, so this ends).
    by_member: dict[str, list[tuple[bytes, int]]] = {mid: [] for mid in order}
    for tp, mid in sorted(owner.items()):
        by_member[mid].append(tp)
    moved = True
    while moved:
        moved = False
        for giver in sorted(order, key=lambda m: (-load[m], m)):
            for tp in list(by_member[giver]):
                taker = min(eligible[tp[0]], key=lambda m: (load[m], m))
                if load[taker] <= load[giver] - 2:
                    by_member[giver].remove(tp)
                    by_member[taker].append(tp)
                    load[giver] -= 1
                    load[taker] += 1
                    moved = True
            if moved:
                break
    return _freeze({mid: _group(sorted(ps)) for mid, ps in by_member.items()})


def range_assign(members: dict[str, MemberSubscription], topics: dict[bytes, int],
                 current: dict[str, Assignment]) -> dict[str, Assignment]:
    out: dict[str, dict[bytes, list[int]]] = {mid: {} for mid in members}
    # static members first, by instance id, then dynamic ones by member id (Kafka's sortMemberIds)
    order = sorted(members, key=lambda m: (0, members[m].instance_id, m) if members[m].instance_id is not None
                   else (1, m, m))
    for tid in sorted(topics):
        subscribers = [mid for mid in order if tid in members[mid].topic_ids]
        if not subscribers:
            continue
        base, extra = divmod(topics[tid], len(subscribers))
        start = 0
        for i, mid in enumerate(subscribers):
            size = base + (1 if i < extra else 0)
            if size:
                out[mid][tid] = list(range(start, start + size))
            start += size
    return _freeze(out)


ASSIGNORS = {"uniform": uniform, "range": range_assign}
DEFAULT_ASSIGNOR = "uniform"
