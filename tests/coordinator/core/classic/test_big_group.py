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


# ---- a big group's answers in slices (Result.later) ---------------------------------------------

N = 2 * GS.ANSWER_SLICE + 100  # three slices


def _rejoin_all(h, group_id, mids):
    """Every member rejoins (their JoinGroups parked until the last); -> the tokens by member."""
    return {mid: h.join(group_id, mid, version=9) for mid in mids}


def test_the_join_phase_s_answers_leave_in_slices_the_leader_s_first_each_once():
    h = Harness()
    mids, gen = h.form_group("big", N)
    h.hold_later = True
    tokens = _rejoin_all(h, "big", mids)
    g = h.group("big")
    assert g.state == "CompletingRebalance" and g.generation == gen + 1
    # the turn that ended the join phase answers nobody (its O(members) passes are enough for one
    # turn); the next answers the leader alone (its answer lists every member), then the slices
    assert not any(h.reply(t) is not None for t in tokens.values())
    assert g.pending_sync == set(mids)
    assert len(h.later) == 1 and h.run_later(1) == 1

    def answered():
        return [mid for mid, t in tokens.items() if h.reply(t) is not None]
    assert answered() == [g.leader_id]
    # the first slice (which holds the leader too: answered once), then the next
    assert h.run_later(1) == 1 and len(answered()) == GS.ANSWER_SLICE
    assert h.run_later(1) == 1 and len(answered()) == 2 * GS.ANSWER_SLICE
    h.run_later()
    assert all(h.reply(t) is not None for t in tokens.values())
    for mid, t in tokens.items():
        r = h.reply(t)
        assert r.error_code == 0 and r.generation_id == gen + 1 and r.member_id == mid
        assert (len(r.members) == N) == (mid == g.leader_id)
    assert g.pending_sync == set(mids)  # all of them owe a SyncGroup from the start


def test_a_later_join_slice_answers_nothing_once_a_new_join_phase_began_and_that_phase_answers_them():
    h = Harness()
    mids, gen = h.form_group("big", N)
    h.hold_later = True
    tokens = _rejoin_all(h, "big", mids)
    assert h.run_later(2) == 2  # the leader's turn, then the first slice
    newcomer, _t = h.join_dynamic("big")  # CompletingRebalance -> PreparingRebalance
    g = h.group("big")
    assert g.state == "PreparingRebalance"
    unanswered = [mid for mid, t in tokens.items() if h.reply(t) is None]
    assert len(unanswered) == N - GS.ANSWER_SLICE
    h.run_later()  # the old slices find the generation moved on: nothing
    assert [mid for mid, t in tokens.items() if h.reply(t) is None] == unanswered
    # those still parked count as joined; the answered ones rejoin: the next phase answers everyone
    again = {mid: h.join("big", mid, version=9) for mid in mids if mid not in unanswered}
    h.run_later()
    g = h.group("big")
    assert g.generation == gen + 2 and g.state == "CompletingRebalance"
    for mid in unanswered:
        assert h.reply(tokens[mid]).generation_id == gen + 2
    for t in again.values():
        assert h.reply(t).generation_id == gen + 2


def test_the_leader_s_sync_answers_every_parked_sync_in_slices_with_its_assignment():
    h = Harness()
    mids, gen = h.form_group("big", N)
    tokens = _rejoin_all(h, "big", mids)
    assert all(h.reply(t).error_code == 0 for t in tokens.values())  # slices run at once here
    g = h.group("big")
    gen2 = g.generation
    h.hold_later = True
    followers = [mid for mid in mids if mid != g.leader_id]
    syncs = {mid: h.sync("big", gen2, mid, version=5) for mid in followers}
    assert not any(h.reply(t) for t in syncs.values())  # parked until the leader's
    leaving = followers[-1]  # answered by its leave, in between two slices
    lead = h.sync("big", gen2, g.leader_id, {mid: mid.encode() for mid in mids}, version=5)
    while g.state != "Stable":  # the record's slices (a group over RECORD_SLICE), then the answers'
        assert h.run_later(1) == 1
    assert h.reply(lead) is not None
    assert sum(1 for t in syncs.values() if h.reply(t) is not None) < len(followers)
    h.leave("big", leaving)
    h.run_later()
    for mid, t in syncs.items():
        r = h.reply(t)
        assert r is not None
        if mid == leaving and r.error_code:
            continue  # its leave answered it (UNKNOWN_MEMBER_ID), once (the harness checks that)
        assert r.error_code == 0 and r.assignment == mid.encode()


# ---- a big group's record encoded in slices after the leader's SyncGroup --------------------------

BIG = GS.RECORD_SLICE + 300  # two record slices


def _completing(h, n):
    """A formed group of ``n``, rejoined by all: CompletingRebalance, every follower's sync parked."""
    mids, _gen = h.form_group("big", n)
    for mid in mids:
        h.join("big", mid, version=9)
    g = h.group("big")
    syncs = {mid: h.sync("big", g.generation, mid, version=5) for mid in mids if mid != g.leader_id}
    return mids, g, syncs


def test_a_big_group_s_record_is_encoded_in_slices_and_stored_once_then_every_sync_is_answered():
    from coordinator.core import records
    from tests.coordinator.core.classic.test_encoded_parts import fresh_record
    h = Harness()
    mids, g, syncs = _completing(h, BIG)
    writes = len(h.writes)
    h.hold_later = True
    lead = h.sync("big", g.generation, g.leader_id, {mid: b"a-" + mid.encode() for mid in mids}, version=5)
    # nothing encoded in the leader's own turn (it decoded every assignment): the record's slices
    # start in the next; nothing stored or answered yet, the group still completing
    assert len(h.later) == 1
    assert len(h.writes) == writes and h.reply(lead) is None and g.state == "CompletingRebalance"
    late = h.sync("big", g.generation, mids[-1], version=5)  # a follower syncing again meanwhile: parks
    assert h.reply(late) is None
    h.run_later()
    assert g.state == "Stable" and len(h.writes) == writes + 1
    value = h.writes[-1][2]
    assert value == fresh_record(g)
    decoded = records.decode_value(records.GROUP_METADATA, value)
    assert {mm.member_id: mm.assignment for mm in decoded.members} == {mid: b"a-" + mid.encode() for mid in mids}
    assert h.reply(lead).assignment == b"a-" + g.leader_id.encode()
    for mid, t in syncs.items():
        r = h.reply(t)
        if mid == mids[-1]:
            assert r.error_code != 0  # replaced by its second SyncGroup (REBALANCE_IN_PROGRESS, as before)
        else:
            assert r.error_code == 0 and r.assignment == b"a-" + mid.encode()
    assert h.reply(late).assignment == b"a-" + mids[-1].encode()


def test_a_member_leaving_while_the_record_is_encoded_drops_the_assignment_and_rebalances():
    h = Harness()
    mids, g, syncs = _completing(h, BIG)
    gen = g.generation
    writes = len(h.writes)
    h.hold_later = True
    lead = h.sync("big", gen, g.leader_id, {mid: b"a-" + mid.encode() for mid in mids}, version=5)
    leaver = mids[-1]
    h.leave("big", leaver)
    assert g.state == "PreparingRebalance"
    h.run_later()
    assert not any(w[2] and b"a-" in w[2] for w in h.writes[writes:])  # that assignment never stored
    assert h.reply(lead).error_code == GS.errors.REBALANCE_IN_PROGRESS
    for t in syncs.values():
        assert h.reply(t).error_code in (GS.errors.REBALANCE_IN_PROGRESS, GS.errors.UNKNOWN_MEMBER_ID)
    assert g.assigning is not None and g.generation == gen  # the job was dropped, not finished


def test_a_new_join_phase_before_the_leader_s_turn_leaves_every_join_parked_for_that_phase():
    """The leader's answer waits for the turn after the join phase's end; a member joining in
    between starts a new join phase (which ends at once: the parked joins count), and the old
    generation's leader turn then answers nothing: the new one's answers everyone, once."""
    h = Harness()
    mids, gen = h.form_group("big", N)
    h.hold_later = True
    tokens = _rejoin_all(h, "big", mids[:-1])
    h.leave("big", mids[-1])  # the last member leaves instead: the join phase ends without it
    g = h.group("big")
    assert g.state == "CompletingRebalance" and g.generation == gen + 1
    assert len(h.later) == 1  # the leader's turn of generation gen + 1, not run yet
    newcomer, t_new = h.join_dynamic("big")  # a new join phase, which ends at once: every
    assert g.state == "CompletingRebalance" and g.generation == gen + 2  # parked join counts
    assert not any(h.reply(t) is not None for t in tokens.values())
    assert h.run_later(1) == 1  # gen + 1's leader turn: the generation moved on, nothing answered
    assert not any(h.reply(t) is not None for t in tokens.values())
    h.hold_later = False
    h.run_later()  # gen + 2's
    for mid, t in tokens.items():
        r = h.reply(t)
        assert r.error_code == 0 and r.generation_id == gen + 2
        assert (len(r.members) == N) == (mid == g.leader_id)  # N - 1 old members and the newcomer
    assert h.reply(t_new).generation_id == gen + 2


def test_the_pending_outcome_counts_kept_as_they_change_match_a_count_of_the_entries():
    """The rebalance_completed line's pending_outcomes come from counts the record keeps (no pass
    over 10,000 entries at the end): they must equal a count of the entries at every step."""
    h = Harness()
    h.form_group("g", 2)
    g = h.group("g")

    def mint():
        return h.reply(h.join("g", "", version=9)).member_id  # MEMBER_ID_REQUIRED: pending

    early = [mint() for _ in range(3)]
    h.join("g", early[0], version=9)  # a rebalance starts, waiting for the other two pending ids
    rec = g.rebalance
    assert rec is not None and g.state == "PreparingRebalance"
    minted = early[1:] + [mint() for _ in range(GS.PENDING_LOGGED + 5)]  # pending while it waits
    assert len(rec.pending) == len(minted)

    def counted():
        return GS._pending_summary(rec.pending_entries())["pending_outcomes"]

    def kept():
        return GS._pending_summary(rec.pending_entries(), rec.pending_outcomes)["pending_outcomes"]
    assert kept() == counted()
    for mid in minted[:7]:
        h.join("g", mid, version=9)  # joined
    assert kept() == counted() and kept().get("joined") == 7
    h.leave("g", minted[7])  # a pending id that leaves instead
    assert kept() == counted()


def test_a_second_leader_sync_before_the_record_s_first_turn_replaces_the_first():
    """The big group's record starts in the turn after the leader's SyncGroup: a second SyncGroup
    of the leader before that turn answers the first (REBALANCE_IN_PROGRESS, as before) and its
    assignment is the one stored and given, once."""
    h = Harness()
    mids, g, syncs = _completing(h, BIG)
    writes = len(h.writes)
    h.hold_later = True
    lead1 = h.sync("big", g.generation, g.leader_id, {mid: b"one" for mid in mids}, version=5)
    lead2 = h.sync("big", g.generation, g.leader_id, {mid: b"two" for mid in mids}, version=5)
    assert h.reply(lead1).error_code == GS.errors.REBALANCE_IN_PROGRESS
    h.run_later()
    assert g.state == "Stable" and len(h.writes) == writes + 1
    assert h.reply(lead2).error_code == 0 and h.reply(lead2).assignment == b"two"
    assert all(h.reply(t).assignment == b"two" for t in syncs.values())
