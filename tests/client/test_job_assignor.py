"""client.spark.JobAssignor: a GroupJob's members share only the job's partitions, balanced by
records, whatever the topics' other partitions are."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from client.assignors import MemberSubscription, RangeAssignor
from client.spark import JobAssignor
from client.types import TopicPartition as TP


def subs(*members, topics=("t",)):
    return {mid: MemberSubscription(member_id=mid, topics=list(topics)) for mid in members}


def test_a_job_over_four_of_sixteen_partitions_gives_each_member_one():
    work = {TP("t", p): 100 for p in range(4)}
    got = JobAssignor(work).assign({"t": 16}, subs("a", "b", "c", "d"))
    assert sorted(len(v) for v in got.values()) == [1, 1, 1, 1]
    assert sorted(tp for v in got.values() for tp in v) == sorted(work)
    # what range would have done: all of the work on the first member
    rng = RangeAssignor().assign({"t": 16}, subs("a", "b", "c", "d"))
    assert [mid for mid, v in rng.items() if set(v) & set(work)] == ["a"]


def test_one_partition_topics_are_spread_over_the_members():
    work = {TP("x", 0): 10, TP("y", 0): 10, TP("z", 0): 10}
    got = JobAssignor(work).assign({"x": 1, "y": 1, "z": 1}, subs("a", "b", "c", topics=("x", "y", "z")))
    assert sorted(len(v) for v in got.values()) == [1, 1, 1]


def test_partitions_are_balanced_by_records_largest_first():
    work = {TP("t", 0): 900, TP("t", 1): 500, TP("t", 2): 400, TP("t", 3): 100}
    got = JobAssignor(work).assign({"t": 4}, subs("a", "b"))
    loads = sorted(sum(work[tp] for tp in v) for v in got.values())
    assert loads == [900, 1000]  # 900 + 100 | 500 + 400; two partitions each by count could give 1,400 | 500
    assert got == {"a": [TP("t", 0), TP("t", 3)], "b": [TP("t", 1), TP("t", 2)]}


def test_missing_partitions_and_unsubscribed_members_get_nothing():
    work = {TP("t", 0): 5, TP("t", 7): 5, TP("u", 0): 5}
    s = {"a": MemberSubscription("a", ["t"]), "b": MemberSubscription("b", ["u"])}
    got = JobAssignor(work).assign({"t": 2, "u": 1}, s)  # t-7 does not exist
    assert got == {"a": [TP("t", 0)], "b": [TP("u", 0)]}


@settings(max_examples=80, deadline=None)
@given(sizes=st.lists(st.integers(0, 10_000), min_size=1, max_size=40), members=st.integers(1, 12),
       spare=st.integers(0, 8))
def test_every_job_partition_goes_to_exactly_one_member_and_loads_are_within_one_partition(
        sizes, members, spare):
    work = {TP("t", p): n for p, n in enumerate(sizes)}
    got = JobAssignor(work).assign({"t": len(sizes) + spare}, subs(*[f"m{i}" for i in range(members)]))
    flat = [tp for v in got.values() for tp in v]
    assert sorted(flat) == sorted(work)
    loads = [sum(work[tp] for tp in v) for v in got.values()]
    # greedy largest-first: no member exceeds the lightest by more than the largest partition
    assert max(loads) - min(loads) <= max(sizes)


def test_the_records_left_are_balanced_not_the_partitions_sizes():
    # a resumed job: partition 0 (1000 records) is done, 1-3 (100 each) are not
    ends = {TP("t", 0): 1000, TP("t", 1): 100, TP("t", 2): 100, TP("t", 3): 100}
    committed = {TP("t", 0): 1000}
    a = JobAssignor(ends, committed)
    left = lambda got: sorted(sum(a.work[tp] for tp in v) for v in got.values())  # noqa: E731
    assert left(a.assign({"t": 4}, subs("a", "b"))) == [100, 200]
    # the next run of an incremental job: committed offsets below the new ends
    committed.update({TP("t", 1): 100, TP("t", 2): 100, TP("t", 3): 40})  # read at each assignment
    assert a.work == {TP("t", 0): 0, TP("t", 1): 0, TP("t", 2): 0, TP("t", 3): 60}
    assert left(a.assign({"t": 4}, subs("a", "b"))) == [0, 60]
    assert JobAssignor(ends).work == ends  # nothing known: the sizes
