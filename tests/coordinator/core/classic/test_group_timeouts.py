"""Every timer path, with the manual clock: initial delay and its debounce, rebalance timeout,
session expiry, new-member join timeout, pending-member expiry, pending-sync expiry."""
from coordinator.core.classic.groups import NEW_MEMBER_JOIN_TIMEOUT_MS
from protocol import errors as E
from tests.coordinator.core.test_group_harness import Harness, sub

CHANGED = (("range", sub("t", "u")),)


def test_initial_rebalance_delay():
    h = Harness(initial_rebalance_delay_ms=3_000)
    a, ta = h.join_dynamic("g")
    assert h.state("g") == "PreparingRebalance"
    assert h.gc.next_deadline() == h.now + 3_000
    h.advance(2_999)
    assert h.state("g") == "PreparingRebalance" and h.reply(ta) is None
    h.advance(1)
    assert h.state("g") == "CompletingRebalance" and h.reply(ta).generation_id == 1


def test_initial_delay_does_not_complete_early_when_everyone_joined():
    h = Harness(initial_rebalance_delay_ms=3_000)
    a, ta = h.join_dynamic("g")
    h.leave("g", a)
    b, tb = h.join_dynamic("g")
    assert h.state("g") == "PreparingRebalance"
    h.advance(2_000)
    assert h.state("g") == "PreparingRebalance"


def test_initial_delay_is_debounced_by_new_members():
    h = Harness(initial_rebalance_delay_ms=3_000)
    t0 = h.now
    a, ta = h.join_dynamic("g", rebalance=10_000)
    h.advance(1_000)
    b, tb = h.join_dynamic("g", rebalance=10_000)  # extends the delay
    h.advance(2_000)  # t0+3000: first expiry, a new member was added: wait another 3000
    assert h.state("g") == "PreparingRebalance"
    h.advance(2_000)  # t0+5000
    c, tc = h.join_dynamic("g", rebalance=10_000)
    h.advance(999)  # t0+5999
    assert h.state("g") == "PreparingRebalance"
    h.advance(1)  # t0+6000: extended again (c joined) until t0+9000
    assert h.state("g") == "PreparingRebalance"
    h.advance(2_999)
    assert h.state("g") == "PreparingRebalance"
    h.advance(1)  # t0+9000: no new member since: complete with all three
    assert h.state("g") == "CompletingRebalance"
    assert h.now - t0 == 9_000
    assert {h.reply(t).generation_id for t in (ta, tb, tc)} == {1}
    assert len(h.group("g").members) == 3


def test_a_group_back_from_empty_waits_one_initial_delay():
    """Only a brand-new group (generation 0) debounces its initial delay; a group that was used and
    emptied waits one delay, however many members arrive meanwhile (Kafka's addMemberAndRebalance)."""
    h = Harness(initial_rebalance_delay_ms=3_000)
    a, ta = h.join_dynamic("g", rebalance=10_000)
    h.advance(3_000)
    assert h.reply(ta).generation_id == 1
    h.leave("g", a)
    assert h.state("g") == "Empty" and h.group("g").generation > 0
    t0 = h.now
    b, tb = h.join_dynamic("g", rebalance=10_000)
    h.advance(2_000)
    c, tc = h.join_dynamic("g", rebalance=10_000)  # would extend a new group's delay
    h.advance(999)
    assert h.state("g") == "PreparingRebalance"
    h.advance(1)
    assert h.state("g") == "CompletingRebalance" and h.now - t0 == 3_000
    assert h.reply(tb).error_code == E.NONE and h.reply(tc).error_code == E.NONE


def test_initial_delay_debounce_is_capped_by_the_rebalance_timeout():
    h = Harness(initial_rebalance_delay_ms=3_000)
    t0 = h.now
    h.join_dynamic("g", rebalance=10_000)
    while h.state("g") == "PreparingRebalance":
        h.advance(1_000)
        if h.state("g") == "PreparingRebalance":
            h.join_dynamic("g", rebalance=10_000)  # a new member every second
    assert h.now - t0 == 10_000
    assert h.state("g") == "CompletingRebalance"


def test_rebalance_timeout_removes_members_that_do_not_rejoin():
    h = Harness()
    mids, gen = h.form_group("g", 2, rebalance=5_000)
    a, b = mids
    h.group("g").members[b].rebalance_timeout_ms = 8_000  # the group's timeout is the max: 8000
    ta = h.join("g", a, rebalance=5_000, protocols=CHANGED)
    assert h.state("g") == "PreparingRebalance"
    h.advance(4_000)
    assert h.heartbeat("g", gen, b).error_code == E.REBALANCE_IN_PROGRESS  # b is told to rejoin
    h.advance(3_999)
    assert h.state("g") == "PreparingRebalance"
    h.advance(1)  # 8000: b never rejoined
    assert h.state("g") == "CompletingRebalance"
    assert set(h.group("g").members) == {a}
    assert h.reply(ta).generation_id == gen + 1 and h.reply(ta).leader == a
    assert h.heartbeat("g", gen + 1, b).error_code == E.UNKNOWN_MEMBER_ID
    rec = h.group("g").rebalance
    assert rec.removed == [{"member_id": b, "why": "missed_rejoin", "after_ms": 8_000}]


def test_session_expiry_removes_a_silent_member_and_rebalances():
    h = Harness()
    mids, gen = h.form_group("g", 2, session=3_000)
    a, b = mids
    for _ in range(2):
        h.advance(1_000)
        assert h.heartbeat("g", gen, a).error_code == E.NONE
    h.advance(999)
    assert b in h.group("g").members
    h.advance(1)  # b has been silent for 3000 ms: expired at exactly its deadline
    assert b not in h.group("g").members
    assert h.state("g") == "PreparingRebalance"
    rec = h.group("g").rebalance
    assert rec.reason == "session_expired" and rec.trigger["member_id"] == b
    assert h.heartbeat("g", gen, a).error_code == E.REBALANCE_IN_PROGRESS
    t = h.join("g", a, session=3_000)
    assert h.reply(t).generation_id == gen + 1  # completes at once: a is the only member


def test_heartbeats_keep_a_member_alive():
    h = Harness()
    mids, gen = h.form_group("g", 1, session=1_000)
    for _ in range(50):
        h.advance(900)
        assert h.heartbeat("g", gen, mids[0]).error_code == E.NONE
    assert h.state("g") == "Stable"
    h.advance(999)
    assert h.state("g") == "Stable"
    h.advance(1)
    assert h.state("g") == "Empty"


def test_offset_commit_keeps_the_session_alive_in_stable():
    h = Harness()
    mids, gen = h.form_group("g", 1, session=1_000)
    for i in range(5):
        h.advance(900)
        r = h.commit("g", {("t", 0): i}, generation=gen, member_id=mids[0])
        assert r.topics[0].partitions[0].error_code == E.NONE
    assert h.state("g") == "Stable"


def test_members_waiting_in_a_rebalance_are_not_expired_by_their_session():
    h = Harness()
    mids, gen = h.form_group("g", 2, session=1_000, rebalance=10_000)
    a, b = mids
    ta = h.join("g", a, session=1_000, rebalance=10_000, protocols=CHANGED)  # a waits (parked)
    for _ in range(11):  # b keeps heartbeating (REBALANCE_IN_PROGRESS) but never rejoins
        h.advance(900)
        assert h.heartbeat("g", gen, b).error_code == E.REBALANCE_IN_PROGRESS
    assert a in h.group("g").members  # parked for 9900 ms: its 1000 ms session does not expire
    h.advance(100)  # rebalance timeout
    assert h.reply(ta).error_code == E.NONE and set(h.group("g").members) == {a}


def test_new_member_join_timeout():
    """A new member's parked JoinGroup is bounded (it cannot heartbeat without its id)."""
    h = Harness()
    mids, gen = h.form_group("g", 1, session=10_000, rebalance=600_000)
    (a,) = mids
    n, tn = h.join_dynamic("g", rebalance=600_000)
    assert h.state("g") == "PreparingRebalance"
    while h.now < 1_000 + NEW_MEMBER_JOIN_TIMEOUT_MS - 5_000:
        h.advance(5_000)
        assert h.heartbeat("g", gen, a).error_code == E.REBALANCE_IN_PROGRESS
    assert h.reply(tn) is None
    h.advance(5_000)
    assert h.reply(tn).error_code == E.UNKNOWN_MEMBER_ID and h.reply(tn).member_id == ""
    assert n not in h.group("g").members
    hist_reasons = [r["reason"] for r in h.gc.group_history("g")]
    assert hist_reasons[-1] == "member_joined"


def test_pending_member_expires_after_its_session_timeout():
    h = Harness()
    r = h.reply(h.join("g", session=2_000))
    pid = r.member_id
    assert h.group("g").pending_members == {pid}
    h.advance(1_999)
    assert h.group("g").pending_members == {pid}
    h.advance(1)
    assert h.group("g").pending_members == set()
    # too late: the id is forgotten, the client resets it and starts over (as Kafka)
    assert h.reply(h.join("g", pid)).error_code == E.UNKNOWN_MEMBER_ID


def test_pending_member_holds_the_join_phase_until_it_joins_or_expires():
    h = Harness()
    mids, gen = h.form_group("g", 2, session=2_000, rebalance=30_000)
    a, b = mids
    assert h.reply(h.join("g", session=2_000)).error_code == E.MEMBER_ID_REQUIRED  # a pending member
    ta = h.join("g", a, session=2_000, protocols=CHANGED)
    tb = h.join("g", b, session=2_000)
    assert h.state("g") == "PreparingRebalance"  # everyone rejoined, but a pending member exists
    h.advance(2_000)  # the pending member's session timeout
    assert h.state("g") == "CompletingRebalance"
    assert h.reply(ta).generation_id == h.reply(tb).generation_id == gen + 1


def test_pending_member_joining_completes_the_phase():
    h = Harness()
    mids, gen = h.form_group("g", 1, session=2_000)
    (a,) = mids
    pid = h.reply(h.join("g", session=2_000)).member_id
    h.join("g", a, session=2_000, protocols=CHANGED)
    assert h.state("g") == "PreparingRebalance"
    tp = h.join("g", pid, session=2_000)
    assert h.state("g") == "CompletingRebalance" and h.reply(tp).generation_id == gen + 1


def test_pending_sync_expiry_removes_members_that_never_sync():
    h = Harness()
    mids, gen = h.form_group("g", 3, rebalance=4_000, session=60_000)
    g = h.group("g")
    for m in mids:
        h.join("g", m, rebalance=4_000, session=60_000)
    gen = g.generation
    leader = g.leader_id
    followers = [m for m in mids if m != leader]
    h.sync("g", gen, leader, {m: m.encode() for m in mids})
    assert h.state("g") == "Stable"
    h.sync("g", gen, followers[0])  # followers[1] never syncs
    h.advance(3_999)
    assert followers[1] in g.members
    h.advance(1)
    assert followers[1] not in g.members
    assert h.state("g") == "PreparingRebalance"
    assert g.rebalance.reason == "sync_expired"


def test_pending_sync_expiry_when_the_leader_never_syncs():
    h = Harness()
    mids, gen = h.form_group("g", 2, rebalance=4_000, session=60_000)
    g = h.group("g")
    for m in mids:
        h.join("g", m, rebalance=4_000, session=60_000)
    gen = g.generation
    leader = g.leader_id
    follower = [m for m in mids if m != leader][0]
    parked = h.sync("g", gen, follower)
    h.advance(4_000)
    assert h.reply(parked).error_code == E.REBALANCE_IN_PROGRESS
    assert set(g.members) == {follower}
    assert h.state("g") == "PreparingRebalance"
    t = h.join("g", follower)
    assert h.reply(t).leader == follower


def test_sync_timer_is_cancelled_once_everyone_synced():
    h = Harness()
    mids, gen = h.form_group("g", 2, rebalance=4_000, session=60_000)
    assert ("sync", "g") not in h.gc._shard("g").timers
    h.advance(10_000)
    assert h.state("g") == "Stable"


def test_next_deadline_tracks_the_earliest_timer():
    h = Harness(offsets_retention_check_interval_ms=1_000_000)
    assert h.gc.next_deadline() == h.now + 1_000_000  # only the retention cycles
    mids, gen = h.form_group("g", 1, session=5_000)
    assert h.gc.next_deadline() == h.now + 5_000
    h.advance(2_000)
    h.heartbeat("g", gen, mids[0])
    assert h.gc.next_deadline() == h.now + 5_000


def test_timer_work_is_done_in_bounded_chunks_and_finishes_over_later_calls():
    from coordinator.core.coordinator import TIMER_STEPS_PER_CALL
    h = Harness(auto_timers=False)  # the harness's own firing settles deadlines eagerly
    n = TIMER_STEPS_PER_CALL + 500
    members = {}
    for i in range(n):  # one member per group; session 10 s
        gid = f"g{i}"
        mid, t = h.join_dynamic(gid)
        members[gid] = mid
    h.fire()  # the joins complete (initial delay 0)
    for gid, mid in members.items():
        if h.state(gid) == "CompletingRebalance":
            h.sync(gid, 1, mid, {mid: b"a"})
    assert all(h.state(g) == "Stable" for g in members)
    h.clock.advance(5_000)
    for gid, mid in members.items():
        assert h.heartbeat(gid, 1, mid).error_code == 0  # every deadline extended lazily
    h.clock.advance(5_500)  # every armed entry is due, none has expired
    first = h.gc.on_timers(h.now, h.wall)
    assert not first.writes and h.gc.next_check() <= h.now  # stopped with work left
    while h.gc.next_check() <= h.now:
        h.absorb(h.gc.on_timers(h.now, h.wall))
    assert all(h.state(g) == "Stable" for g in members)  # re-armed, nobody expired
    h.advance(10_000)
    assert all(h.state(g) == "Empty" for g in members)  # then the sessions do expire


def test_the_flight_recorder_shows_the_pending_ids_a_join_phase_waits_for():
    """issue 33 item 7: a rebalance held by a pending member id (a JoinGroup answered
    MEMBER_ID_REQUIRED whose client never came back with the id) says so: in progress, the history
    names what it waits for; completed, each pending id and what became of it."""
    h = Harness()
    mids, gen = h.form_group("g", 2, session=2_000, rebalance=30_000)
    a, b = mids
    before = h.reply(h.join("g", session=2_000, client_id="abandoned"))
    assert before.error_code == E.MEMBER_ID_REQUIRED
    ta = h.join("g", a, session=2_000, protocols=CHANGED)
    h.advance(500)
    during = h.reply(h.join("g", session=2_000, client_id="late"))  # minted during the join phase
    assert during.error_code == E.MEMBER_ID_REQUIRED
    [current] = [r for r in h.gc.group_history("g", h.now) if r["outcome"] == "in_progress"]
    assert current["waiting_for"] == {"members": [b],
                                      "pending_member_ids": [before.member_id, during.member_id]}
    tb = h.join("g", b, session=2_000)
    [current] = [r for r in h.gc.group_history("g", h.now) if r["outcome"] == "in_progress"]
    assert current["waiting_for"] == {"members": [], "pending_member_ids": [before.member_id, during.member_id]}
    tl = h.join("g", during.member_id, session=2_000, client_id="late")  # the late one comes back
    h.advance(2_000)  # the abandoned id's session timeout: the phase completes without it
    assert h.state("g") == "CompletingRebalance"
    assert h.reply(ta).generation_id == h.reply(tb).generation_id == h.reply(tl).generation_id == gen + 1
    done = h.gc.group_history("g", h.now)[-1]
    pending = {e["member_id"]: e for e in done["pending"]}
    assert pending[before.member_id]["outcome"] == "expired" and pending[before.member_id]["minted_after_ms"] is None
    assert pending[during.member_id]["outcome"] == "joined"
    assert pending[during.member_id]["client_id"] == "late" and pending[during.member_id]["minted_after_ms"] == 500
    assert done["waiting_for"] is None
