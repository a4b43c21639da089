"""A big classic group forming (issue 31 item 4): the flight recorder's record of the join phase
stays right at thousands of members (each member once, found by id rather than by a scan), and the
rebalance_completed log line lists a bounded number of pending ids (the rest counted)."""
from coordinator.core.classic import groups as GS
from tests.coordinator.core.test_group_harness import Harness


def test_a_2000_member_group_forms_and_its_record_lists_each_newcomer_once():
    h = Harness()
    mids, gen = h.form_group("big", 2000)
    g = h.group("big")
    assert g.state == "Stable" and len(g.members) == 2000 and gen == g.generation
    last = h.gc.group_history("big")[-1]
    assert last["outcome"] == "stable" and last["generation"] == gen
    joined = [j["member_id"] for j in last["joined"]]
    assert len(joined) == len(set(joined))  # each newcomer once
    assert set(joined) <= set(mids)


def test_the_record_ignores_a_second_join_of_the_same_newcomer():
    h = Harness()
    h.form_group("g", 1)
    mid2, _t = h.join_dynamic("g")  # a newcomer: the group rebalances
    g = h.group("g")
    rec = g.rebalance
    assert rec is not None and mid2 in rec.joined_ids
    n = len(rec.joined)
    rec.on_join(g.members[mid2], h.now)
    assert len(rec.joined) == n
    assert [j["member_id"] for j in rec.joined].count(mid2) == 1


def test_rebalance_completed_lists_at_most_PENDING_LOGGED_pending_ids_and_counts_the_rest():
    pending = [{"member_id": f"m{i}", "outcome": "joined" if i % 3 else None, "after_ms": i} for i in range(50)]
    s = GS._pending_summary(pending)
    assert len(s["pending_members"]) == GS.PENDING_LOGGED == 20
    assert s["pending_members"][0] == {"member_id": "m0", "outcome": "still_pending", "after_ms": 0}
    assert s["pending_members_total"] == 50
    assert s["pending_outcomes"] == {"still_pending": 17, "joined": 33}
    few = GS._pending_summary(pending[:3])
    assert [e["member_id"] for e in few["pending_members"]] == ["m0", "m1", "m2"]
    assert "pending_members_total" not in few
    assert GS._pending_summary([]) == {}
