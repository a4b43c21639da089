"""The cluster benchmarks' bookkeeping: how a read-back is judged (bench.cluster_chaos) and how groups
are split between the nodes that coordinate them (bench.cluster_heartbeats)."""
from __future__ import annotations

from bench import cluster_chaos as CC
from bench import cluster_heartbeats as CH
from coordinator.core.partitioning import shard_for


def _writer(monkeypatch, read_back):
    monkeypatch.setattr(CC, "fetch", lambda node, group: read_back)
    return CC.Writer(cluster=None, group="g")


def test_a_read_back_below_the_acknowledged_offset_is_rewound(monkeypatch):
    w = _writer(monkeypatch, 7)
    w.sent, w.acked = 12, 9
    w.check(node=None)
    assert w.rewound == [(7, 9)] and w.invented == [] and w.readbacks == 1


def test_nothing_committed_yet_is_not_rewound_and_a_value_never_sent_is_invented(monkeypatch):
    w = _writer(monkeypatch, -1)
    w.check(node=None)  # offsets start at 1: -1 with nothing acknowledged is the empty state
    assert w.rewound == []
    w = _writer(monkeypatch, 13)
    w.sent, w.acked = 12, 12
    w.check(node=None)
    assert w.invented == [(13, 12)] and w.rewound == []


def test_no_answer_is_not_a_readback(monkeypatch):
    w = _writer(monkeypatch, None)
    w.acked = 5
    w.check(node=None)
    assert (w.readbacks, w.rewound) == (0, [])


def test_groups_are_spread_over_the_shards_and_split_by_their_owner():
    owners = {s: s % 2 for s in range(CH.PARTITIONS)}
    split = CH.groups_by_node("t", 100, owners, 2)
    assert [len(x) for x in split] == [50, 50]
    for node, names in enumerate(split):
        assert all(owners[shard_for(g, CH.PARTITIONS)] == node for g in names)
    assert len({shard_for(g, CH.PARTITIONS) for x in split for g in x}) == CH.PARTITIONS
