"""KIP-345 static membership."""
from coordinator.core import records
from protocol import errors as E
from tests.coordinator.core.test_group_harness import Harness, sub

P = (("range", sub("t")),)


def static_group(h, n=2, version=5, **kw):
    """n static members i0..i{n-1}, Stable. Returns ({instance: member_id}, generation)."""
    ids = {}
    for i in range(n):
        t = h.join("g", instance=f"i{i}", version=version, client_id=f"c{i}", **kw)
        r = h.reply(t)
        ids[f"i{i}"] = r.member_id if r is not None else None
        if i > 0:  # the group rebalances for each newcomer: everyone else rejoins
            for inst, mid in ids.items():
                if inst != f"i{i}" and h.group("g").members[mid].join is None:
                    h.join("g", mid, instance=inst, version=version, **kw)
    g = h.group("g")
    ids = {m.group_instance_id: m.member_id for m in g.members.values()}
    assert h.state("g") == "CompletingRebalance"
    gen = g.generation
    h.sync("g", gen, g.leader_id, {mid: inst.encode() for inst, mid in ids.items()},
           instance=g.members[g.leader_id].group_instance_id)
    for inst, mid in ids.items():
        if mid != g.leader_id:
            h.sync("g", gen, mid, instance=inst)
    assert h.state("g") == "Stable"
    return ids, gen


def test_static_members_get_ids_without_member_id_required():
    h = Harness()
    r = h.reply(h.join("g", instance="i1", version=5, client_id="app"))
    assert r.error_code == E.NONE and r.member_id.startswith("i1-")
    assert h.group("g").static_members == {"i1": r.member_id}


def test_restart_in_stable_with_same_protocols_keeps_assignment_without_rebalance():
    h = Harness()
    ids, gen = static_group(h)
    g = h.group("g")
    leader = g.leader_id
    follower_inst = next(i for i, m in ids.items() if m != leader)
    old_id = ids[follower_inst]
    n = len(h.writes)
    t = h.join("g", instance=follower_inst, version=5)  # restarted: no member id
    r = h.reply(t)
    new_id = r.member_id
    assert r.error_code == E.NONE and new_id != old_id and new_id.startswith(follower_inst)
    assert r.generation_id == gen and r.leader == leader and r.members == []
    assert h.state("g") == "Stable" and g.generation == gen
    # the new id is persisted before the reply (GroupMetadata record in the same result)
    (write,) = h.writes[n:]
    value = records.decode_value(2, write[2])
    stored = [m.member_id for m in value.members]
    assert new_id in stored and old_id not in stored
    result = next(res for res in h.results if any(tok == t for tok, _ in res.replies))
    assert result.writes == [write]
    # the old id is fenced
    assert h.heartbeat("g", gen, old_id, instance=follower_inst).error_code == E.FENCED_INSTANCE_ID
    assert h.heartbeat("g", gen, old_id).error_code == E.UNKNOWN_MEMBER_ID
    assert h.reply(h.sync("g", gen, old_id, instance=follower_inst)).error_code == E.FENCED_INSTANCE_ID
    # the new id gets the old assignment
    assert h.reply(h.sync("g", gen, new_id, instance=follower_inst)).assignment == follower_inst.encode()
    assert h.heartbeat("g", gen, new_id, instance=follower_inst).error_code == E.NONE
    assert not h.gc.group_history("g")[-1]["outcome"] == "in_progress"


def test_static_leader_restart_before_v9_is_told_the_old_leader_id():
    h = Harness()
    ids, gen = static_group(h)
    g = h.group("g")
    old_leader = g.leader_id
    inst = g.members[old_leader].group_instance_id
    r = h.reply(h.join("g", instance=inst, version=8))
    assert r.error_code == E.NONE and r.leader == old_leader and r.member_id != old_leader
    assert r.members == [] and r.skip_assignment is False
    assert g.leader_id == r.member_id  # internally the new id leads
    # it behaves as a follower and fetches the stored assignment
    assert h.reply(h.sync("g", gen, r.member_id, instance=inst)).assignment == inst.encode()
    assert h.state("g") == "Stable"


def test_static_leader_restart_v9_skip_assignment():
    h = Harness()
    ids, gen = static_group(h, version=9)
    g = h.group("g")
    old_leader = g.leader_id
    inst = g.members[old_leader].group_instance_id
    r = h.reply(h.join("g", instance=inst, version=9))
    assert r.error_code == E.NONE and r.skip_assignment is True
    assert r.leader == r.member_id != old_leader
    assert {m.member_id for m in r.members} == set(g.members) and r.generation_id == gen
    assert h.state("g") == "Stable"


def test_static_restart_with_a_protocol_change_rebalances():
    h = Harness()
    ids, gen = static_group(h, n=1)
    t = h.join("g", instance="i0", protocols=(("roundrobin", b"rr"), ("range", sub("t"))))
    assert h.state("g") == "PreparingRebalance" or h.state("g") == "CompletingRebalance"
    assert h.gc.group_history("g")[-1]["reason"] == "static_member_replaced"
    r = h.reply(t)
    assert r.generation_id == gen + 1 and r.protocol_name == "roundrobin"


def test_static_rejoin_during_completing_rebalance_restarts():
    h = Harness()
    ids, gen = static_group(h)
    for inst, mid in ids.items():
        h.join("g", mid, instance=inst)
    assert h.state("g") == "CompletingRebalance"
    h.join("g", instance="i1")  # i1 restarted meanwhile
    assert h.state("g") == "PreparingRebalance"
    assert h.group("g").rebalance.reason == "static_member_replaced"


def test_static_rejoin_during_preparing_fences_the_parked_old_join():
    h = Harness()
    ids, gen = static_group(h)
    old = h.join("g", ids["i0"], instance="i0", protocols=(("range", sub("t", "x")),))
    assert h.state("g") == "PreparingRebalance"
    new = h.join("g", instance="i0")
    assert h.reply(old).error_code == E.FENCED_INSTANCE_ID
    assert h.reply(new) is None  # waits for i1
    h.join("g", ids["i1"], instance="i1")
    assert h.reply(new).error_code == E.NONE and h.reply(new).generation_id == gen + 1


def test_static_members_that_miss_the_rejoin_are_kept_then_dropped_by_sync_expiry():
    h = Harness()
    ids, gen = static_group(h, session=20_000, rebalance=5_000)
    t = h.join("g", ids["i0"], instance="i0", session=20_000, rebalance=5_000,
               protocols=(("range", sub("t", "y")),))
    h.advance(5_000)  # rebalance timeout: i1 (static) did not rejoin but is kept, unlike a dynamic member
    assert h.state("g") == "CompletingRebalance"
    assert set(h.group("g").static_members) == {"i0", "i1"}
    r = h.reply(t)
    assert r.generation_id == gen + 1 and r.leader == ids["i0"]  # the leader must be a member that rejoined
    assert {m.member_id for m in r.members} == set(ids.values())
    h.sync("g", gen + 1, ids["i0"], {ids["i0"]: b"0", ids["i1"]: b"1"}, instance="i0")
    assert h.state("g") == "Stable"
    h.advance(5_000)  # i1 never synced: removed, and the group rebalances without it
    assert set(h.group("g").static_members) == {"i0"}
    assert h.state("g") == "PreparingRebalance"


def test_fencing_and_unknown_instances_on_join_and_leave():
    h = Harness()
    ids, gen = static_group(h)
    assert h.reply(h.join("g", "bogus", instance="i0")).error_code == E.FENCED_INSTANCE_ID
    assert h.reply(h.join("g", ids["i0"], instance="nope")).error_code == E.UNKNOWN_MEMBER_ID
    r = h.leave("g", ("bogus", "i0"), ("", "nope"), version=4)
    assert [m.error_code for m in r.members] == [E.FENCED_INSTANCE_ID, E.UNKNOWN_MEMBER_ID]
    assert h.state("g") == "Stable"
    # administrative removal by instance id alone
    r = h.leave("g", ("", "i1", "operator"), version=5)
    assert r.members[0].error_code == E.NONE and r.members[0].group_instance_id == "i1"
    assert set(h.group("g").static_members) == {"i0"}
    assert h.state("g") == "PreparingRebalance"
    assert h.group("g").rebalance.client_reason == "operator"


def test_a_full_group_can_still_restart_its_static_members():
    h = Harness(group_max_size=2)
    ids, gen = static_group(h)
    r = h.reply(h.join("g", instance="i0"))
    assert r.error_code == E.NONE and r.generation_id == gen
    assert h.reply(h.join("g", instance="i9")).error_code == E.GROUP_MAX_SIZE_REACHED
