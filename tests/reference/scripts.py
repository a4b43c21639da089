"""The differential scripts: each drives one server through herd's codec over plain sockets.

Every script registers itself in SCRIPTS under its name; test_differential.py runs each against
herd and Kafka and compares. Scripts only send and record; what they record is the comparison.
"""
from __future__ import annotations

from protocol import errors as E
from protocol import messages as m
from tests.reference.differential import (
    Run,
    assignment,
    commit_req,
    fetch_req,
    join_req,
    subscription,
    sync_req,
)

SCRIPTS: dict[str, object] = {}


def script(fn=None, *, name=None):
    def reg(f):
        SCRIPTS[name or f.__name__] = f
        return f
    return reg(fn) if fn else reg


# -- helpers ------------------------------------------------------------------------------------

def join(r: Run, c, group, *, v=9, label="join", **kw):
    """JoinGroup; at v4+ a new dynamic member's MEMBER_ID_REQUIRED answer is recorded, then it
    rejoins with the minted id."""
    resp = r.call(c, join_req(group, **kw), v, label)
    if resp is not None and resp.error_code == E.MEMBER_ID_REQUIRED:
        kw["member_id"] = resp.member_id
        resp = r.call(c, join_req(group, **kw), v, label + " (with id)")
    return resp


def one_member(r: Run, group, topic, *, v=9, sync_v=5, parts=(0,), **kw):
    """A single member joined and synced with ``parts`` of ``topic``: (conn, member_id, gen)."""
    c = r.conn("ref-a")
    j = join(r, c, group, v=v, topics=(topic,), **kw)
    asg = [(j.member_id, assignment({topic: list(parts)}))]
    r.call(c, sync_req(group, j.generation_id, j.member_id, asg, instance_id=kw.get("instance_id")), sync_v, "sync")
    return c, j.member_id, j.generation_id


def two_members(r: Run, group, topic, **kw):
    """Two dynamic members in one generation, both synced: ((ca, ida), (cb, idb), gen)."""
    ca, ida, _ = one_member(r, group, topic, **kw)
    cb = r.conn("ref-b")
    pb = r.send(cb, join_req(group, topics=(topic,)), 9)
    jb = r.recv(pb, "b join")
    pb = r.send(cb, join_req(group, jb.member_id, topics=(topic,)), 9)
    r.wait_state(group, "PreparingRebalance")
    # a's heartbeat learns of the rebalance; a rejoins; both answered
    r.call(ca, m.HeartbeatRequest(group_id=group, generation_id=1, member_id=ida), 4, "a heartbeat")
    ja = r.call(ca, join_req(group, ida, topics=(topic,)), 9, "a rejoin")
    jb = r.recv(pb, "b join (with id)")
    leader = ja if ja.leader == ja.member_id else jb
    asg = [(ida, assignment({topic: [0]})), (jb.member_id, assignment({topic: [1]}))]
    conns = {ida: ca, jb.member_id: cb}
    pl = r.send(conns[leader.member_id], sync_req(group, ja.generation_id, leader.member_id, asg), 5)
    other = jb.member_id if leader.member_id == ida else ida
    po = r.send(conns[other], sync_req(group, ja.generation_id, other), 5)
    r.recv(pl, "leader sync")
    r.recv(po, "follower sync")
    return (ca, ida), (cb, jb.member_id), ja.generation_id


def describe(r: Run, c, *groups, v=5, label="describe"):
    return r.call(c, m.DescribeGroupsRequest(groups=list(groups)), v, label)


def fetch_all(r: Run, c, group, v=9, label="fetch all"):
    return r.call(c, fetch_req(group, None, v), v, label)


# -- JoinGroup ------------------------------------------------------------------------------------

for _v in range(10):
    def _join_version(r: Run, v=_v):
        group, topic = r.group(), r.topic(partitions=2)
        c = r.conn("ref-a")
        j = join(r, c, group, v=v, topics=(topic,))
        if j is None or j.error_code:
            return
        r.call(c, sync_req(group, j.generation_id, j.member_id, [(j.member_id, assignment({topic: [0, 1]}))]),
               min(v, 5) if v >= 3 else min(v, 2), "sync")
        r.call(c, m.HeartbeatRequest(group_id=group, generation_id=j.generation_id, member_id=j.member_id),
               min(v, 4), "heartbeat")
        describe(r, c, group)
    script(_join_version, name=f"join_v{_v}")


@script
def join_unknown_member_id_into_empty_group(r: Run):
    group = r.group()
    c = r.conn()
    r.call(c, join_req(group, "ref-made-up-member"), 9)
    describe(r, c, group)


@script
def join_wrong_protocol_type(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    c, _, _ = one_member(r, group, topic)
    c2 = r.conn("ref-b")
    join(r, c2, group, protocol_type="connect", topics=(topic,))
    describe(r, c, group)


@script
def join_no_common_protocol(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    c, _, _ = one_member(r, group, topic)
    c2 = r.conn("ref-b")
    join(r, c2, group, protocols=[("roundrobin", subscription(topic))])
    describe(r, c, group)


@script
def join_empty_protocol_list(r: Run):
    group = r.group()
    c = r.conn()
    join(r, c, group, protocols=[])


@script
def join_empty_protocol_type(r: Run):
    group = r.group()
    c = r.conn()
    join(r, c, group, protocol_type="")


@script
def join_session_timeout_bounds(r: Run):
    c = r.conn()
    for ms in (5999, 6000, 1800000, 1800001):
        join(r, c, r.group(f"s{ms}"), session_ms=ms, label=f"join session={ms}")


@script
def join_group_max_size(r: Run):
    from tests.reference.conftest import GROUP_MAX_SIZE
    group, topic = r.group(), r.topic()
    c0, id0, gen = one_member(r, group, topic)
    pending = []
    for i in range(1, GROUP_MAX_SIZE + 1):  # one at a time: each either parks or is refused at once
        c = r.conn(f"ref-{i}")
        j = r.call(c, join_req(group, topics=(topic,)), 9, f"join {i}")
        p = r.send(c, join_req(group, j.member_id, topics=(topic,)), 9)
        if r.parked(p):
            r.note(f"join {i} (with id)", "parked")
            pending.append((i, p))
        else:
            r.recv(p, f"join {i} (with id)")
        if i == 1:
            r.wait_state(group, "PreparingRebalance")
    r.call(c0, join_req(group, id0, topics=(topic,)), 9, "join 0 rejoins")
    # Which member leads a new generation is the server's pick (Kafka: the first key of a hash
    # map): record who answered, and that exactly one of them leads with everyone's metadata.
    answers = []
    for i, p in pending:
        p_resp = p.conn.raw.receive(p.api_key, p.version, p.cid)
        answers.append(p_resp)
        r.note(f"join {i} answered", {"error_code": p_resp.error_code, "generation_id": p_resp.generation_id,
                                       "protocol_name": p_resp.protocol_name})
    leaders = [a for a in answers if a.leader == a.member_id]
    r.note("leaders", [(len(a.members), sorted(x.member_id == y.member_id for x in a.members for y in answers
                                               if x.member_id == y.member_id)) for a in leaders])
    r.note("all name the same leader", len({a.leader for a in answers}) == 1)
    d = r.conn("ref-probe").raw.call(m.DescribeGroupsRequest(groups=[group]), 5).groups[0]
    r.note("described", {"state": d.group_state, "members": len(d.members)})


@script
def join_empty_group_id(r: Run):
    c = r.conn()
    join(r, c, "")
    r.call(c, m.HeartbeatRequest(group_id="", generation_id=1, member_id="x"), 4)
    r.call(c, sync_req("", 1, "x"), 5)
    describe(r, c, "")


@script
def long_group_ids(r: Run):
    topic = r.topic()
    c = r.conn()
    for n in (249, 256, 1000, 32767):
        group = (r.group() + "x" * n)[:n]
        r.call(c, commit_req(group, {topic: {0: n}}), 9, f"commit len={n}")
        r.call(c, fetch_req(group, {topic: [0]}, 9), 9, f"fetch len={n}")
        join(r, c, group, topics=(topic,), label=f"join len={n}")
        describe(r, c, group, label=f"describe len={n}")


@script
def join_reason_and_leave_reason(r: Run):
    group, topic = r.group(), r.topic()
    c, mid, gen = one_member(r, group, topic, reason="ref: starting")
    r.call(c, m.LeaveGroupRequest(group_id=group, members=[
        m.LeaveGroupRequestMemberIdentity(member_id=mid, reason="ref: done")]), 5, "leave")
    describe(r, c, group)


@script
def follower_rejoin_stable_same_metadata(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    (ca, ida), (cb, idb), gen = two_members(r, group, topic)
    r.call(cb, join_req(group, idb, topics=(topic,)), 9, "follower rejoins, same metadata")
    describe(r, ca, group)


@script
def leader_rejoin_stable_triggers_rebalance(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    (ca, ida), (cb, idb), gen = two_members(r, group, topic)
    pa = r.send(ca, join_req(group, ida, topics=(topic,)), 9)
    r.note("leader's join parked", r.parked(pa))
    r.wait_state(group, "PreparingRebalance")
    r.call(cb, m.HeartbeatRequest(group_id=group, generation_id=gen, member_id=idb), 4, "b heartbeat")
    pb = r.send(cb, join_req(group, idb, topics=(topic,)), 9)
    r.recv(pa, "a join")
    r.recv(pb, "b join")
    describe(r, ca, group)


# -- Sync / Heartbeat / Leave -----------------------------------------------------------------

@script
def unknown_member_everywhere(r: Run):
    group, topic = r.group(), r.topic()
    c, mid, gen = one_member(r, group, topic)
    ghost = "ref-ghost-1"
    r.call(c, m.HeartbeatRequest(group_id=group, generation_id=gen, member_id=ghost), 4, "heartbeat")
    r.call(c, sync_req(group, gen, ghost), 5, "sync")
    r.call(c, commit_req(group, {topic: {0: 3}}, generation=gen, member_id=ghost), 9, "commit")
    r.call(c, m.LeaveGroupRequest(group_id=group, members=[
        m.LeaveGroupRequestMemberIdentity(member_id=ghost)]), 5, "leave")
    r.call(c, join_req(group, ghost, topics=(topic,)), 9, "join")


@script
def unknown_group_everywhere(r: Run):
    group = r.group()
    c = r.conn()
    r.call(c, m.HeartbeatRequest(group_id=group, generation_id=1, member_id="x"), 4, "heartbeat")
    r.call(c, sync_req(group, 1, "x"), 5, "sync")
    r.call(c, m.LeaveGroupRequest(group_id=group, member_id="x"), 2, "leave v2")
    r.call(c, m.LeaveGroupRequest(group_id=group, members=[m.LeaveGroupRequestMemberIdentity(member_id="x")]),
           5, "leave v5")
    r.call(c, commit_req(group, {r.topic(): {0: 1}}, generation=1, member_id="x"), 9, "commit")
    describe(r, c, group)


@script
def stale_generation(r: Run):
    group, topic = r.group(), r.topic()
    c, mid, gen = one_member(r, group, topic)
    r.call(c, m.HeartbeatRequest(group_id=group, generation_id=gen - 1, member_id=mid), 4, "heartbeat gen-1")
    r.call(c, m.HeartbeatRequest(group_id=group, generation_id=gen + 1, member_id=mid), 4, "heartbeat gen+1")
    r.call(c, sync_req(group, gen + 1, mid), 5, "sync gen+1")
    r.call(c, commit_req(group, {topic: {0: 1}}, generation=gen + 1, member_id=mid), 9, "commit gen+1")
    r.call(c, commit_req(group, {topic: {0: 1}}, generation=gen - 1, member_id=mid), 9, "commit gen-1")
    fetch_all(r, c, group)


@script
def heartbeat_during_rebalance(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    ca, ida, gen = one_member(r, group, topic)
    cb = r.conn("ref-b")
    jb = r.call(cb, join_req(group, topics=(topic,)), 9, "b join")
    pb = r.send(cb, join_req(group, jb.member_id, topics=(topic,)), 9)
    r.wait_state(group, "PreparingRebalance")
    r.call(ca, m.HeartbeatRequest(group_id=group, generation_id=gen, member_id=ida), 4, "a heartbeat")
    describe(r, ca, group, label="describe while preparing")
    r.call(ca, commit_req(group, {topic: {0: 1}}, generation=gen, member_id=ida), 9, "a commit while preparing")
    ja = r.call(ca, join_req(group, ida, topics=(topic,)), 9, "a rejoin")
    jb = r.recv(pb, "b join (with id)")
    describe(r, ca, group, label="describe while completing")
    r.call(ca, m.HeartbeatRequest(group_id=group, generation_id=ja.generation_id, member_id=ida), 4,
           "a heartbeat while completing")
    r.call(ca, commit_req(group, {topic: {0: 1}}, generation=ja.generation_id, member_id=ida), 9,
           "a commit while completing")


@script
def describe_assignments_through_rebalances(r: Run):
    """What DescribeGroups shows of each member in every state: the last assignment while the
    group rebalances (empty for a member that joined since), none for anyone once a new member
    interrupts CompletingRebalance, the new ones when Stable again, no members when Empty."""
    group, topic = r.group(), r.topic(partitions=4)
    (ca, ida), (cb, idb), gen = two_members(r, group, topic)
    conns = {ida: ca, idb: cb}

    def newcomer(name):
        c = r.conn(f"ref-{name}")
        j = r.call(c, join_req(group, topics=(topic,)), 9, f"{name} join")
        conns[j.member_id] = c
        return j.member_id, r.send(c, join_req(group, j.member_id, topics=(topic,)), 9)

    def answers(pending):  # who leads is the server's pick: join answers are not recorded
        return [p.conn.raw.receive(p.api_key, p.version, p.cid) for p in pending]

    idc, pc = newcomer("c")
    r.wait_state(group, "PreparingRebalance")
    describe(r, ca, group, label="preparing: c joined")
    for mid in (ida, idb):
        r.call(conns[mid], m.HeartbeatRequest(group_id=group, generation_id=gen, member_id=mid), 4,
               "heartbeat")
    pending = [r.send(conns[mid], join_req(group, mid, topics=(topic,)), 9) for mid in (ida, idb)]
    answers(pending + [pc])
    describe(r, ca, group, label="completing")
    idd, pd = newcomer("d")
    r.wait_state(group, "PreparingRebalance")
    describe(r, ca, group, label="preparing again: d joined before the leader's sync")
    pending = [r.send(conns[mid], join_req(group, mid, topics=(topic,)), 9) for mid in (ida, idb, idc)]
    got = answers(pending + [pd])
    leader, gen = got[0].leader, got[0].generation_id
    parts = {ida: [0], idb: [1], idc: [2], idd: [3]}
    pl = r.send(conns[leader], sync_req(group, gen, leader, [(mid, assignment({topic: ps}))
                                                             for mid, ps in parts.items()]), 5)
    others = [r.send(conns[mid], sync_req(group, gen, mid), 5) for mid in parts if mid != leader]
    answers([pl] + others)
    describe(r, ca, group, label="stable")
    r.call(ca, m.LeaveGroupRequest(group_id=group, members=[
        m.LeaveGroupRequestMemberIdentity(member_id=mid) for mid in parts]), 5, "everyone leaves")
    describe(r, ca, group, label="empty")


@script
def sync_follower_before_leader(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    two_members(r, group, topic)  # two_members sends the leader's sync first; here the reverse below
    group2 = r.group("g2")
    ca = r.conn("ref-a")
    ja = join(r, ca, group2, topics=(topic,))
    r.call(ca, sync_req(group2, ja.generation_id, ja.member_id, []), 5, "leader syncs an empty assignment")
    describe(r, ca, group2)


@script
def sync_protocol_mismatch(r: Run):
    group, topic = r.group(), r.topic()
    c = r.conn("ref-a")
    j = join(r, c, group, topics=(topic,))
    r.call(c, sync_req(group, j.generation_id, j.member_id, [], protocol_type="connect"), 5, "sync wrong type")
    r.call(c, sync_req(group, j.generation_id, j.member_id, [], protocol_name="roundrobin"), 5, "sync wrong name")
    r.call(c, sync_req(group, j.generation_id, j.member_id, []), 5, "sync right")


@script
def sync_assignment_for_unknown_member(r: Run):
    group, topic = r.group(), r.topic()
    c = r.conn("ref-a")
    j = join(r, c, group, topics=(topic,))
    r.call(c, sync_req(group, j.generation_id, j.member_id, [
        (j.member_id, assignment({topic: [0]})), ("ref-nobody", assignment({topic: [0]}))]), 5)
    describe(r, c, group)


@script
def leave_batch_with_unknown(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    (ca, ida), (cb, idb), gen = two_members(r, group, topic)
    r.call(ca, m.LeaveGroupRequest(group_id=group, members=[
        m.LeaveGroupRequestMemberIdentity(member_id=ida),
        m.LeaveGroupRequestMemberIdentity(member_id="ref-unknown")]), 5, "leave a + unknown")
    describe(r, ca, group)


@script
def leave_v0_last_member_then_empty(r: Run):
    group, topic = r.group(), r.topic()
    c, mid, gen = one_member(r, group, topic)
    r.call(c, commit_req(group, {topic: {0: 7}}, generation=gen, member_id=mid), 9, "commit")
    r.call(c, m.LeaveGroupRequest(group_id=group, member_id=mid), 0, "leave v0")
    describe(r, c, group)
    fetch_all(r, c, group)


# -- static membership ------------------------------------------------------------------------

@script
def static_member_fenced(r: Run):
    group, topic = r.group(), r.topic()
    c1, old, gen = one_member(r, group, topic, instance_id="inst-1")
    c2 = r.conn("ref-b")
    j2 = join(r, c2, group, topics=(topic,), instance_id="inst-1", label="same instance joins")
    r.call(c1, m.HeartbeatRequest(group_id=group, generation_id=gen, member_id=old, group_instance_id="inst-1"),
           4, "old member heartbeat")
    r.call(c1, commit_req(group, {topic: {0: 1}}, generation=gen, member_id=old, instance_id="inst-1"), 9,
           "old member commit")
    r.call(c1, sync_req(group, gen, old, instance_id="inst-1"), 5, "old member sync")
    r.call(c2, m.HeartbeatRequest(group_id=group, generation_id=j2.generation_id, member_id=j2.member_id,
                                  group_instance_id="inst-1"), 4, "new member heartbeat")
    r.call(c1, m.LeaveGroupRequest(group_id=group, members=[
        m.LeaveGroupRequestMemberIdentity(member_id=old, group_instance_id="inst-1")]), 5, "old member leave")
    describe(r, c1, group)


@script
def static_member_restart_keeps_assignment(r: Run):
    group, topic = r.group(), r.topic()
    c1, old, gen = one_member(r, group, topic, instance_id="inst-1")
    c1.close()
    c2 = r.conn("ref-a")
    j = join(r, c2, group, topics=(topic,), instance_id="inst-1", label="restarted")
    r.call(c2, sync_req(group, j.generation_id, j.member_id, instance_id="inst-1"), 5, "sync")
    describe(r, c2, group)


@script
def static_member_restart_at_group_max_size(r: Run):
    """A full group (group.max.size static members, Stable); one of them restarts (empty member
    id, its group.instance.id)."""
    import time

    from tests.reference.conftest import GROUP_MAX_SIZE

    group, topic = r.group(), r.topic(partitions=GROUP_MAX_SIZE)
    conns, ids = [], []
    probe, deadline = r.conn("ref-probe"), time.monotonic() + 30
    # a fresh Kafka creates __consumer_offsets on the first FindCoordinator: wait for it (not recorded)
    while probe.raw.call(m.FindCoordinatorRequest(key=group, key_type=0), 3).error_code:
        assert time.monotonic() < deadline, f"{r.server}: no group coordinator within 30 s"
        time.sleep(0.1)

    def answers(pending):  # who leads is the server's pick: join answers are not recorded
        return [p.conn.raw.receive(p.api_key, p.version, p.cid) for p in pending]

    for i in range(GROUP_MAX_SIZE):  # each newcomer starts a rebalance the others rejoin
        c = r.conn(f"ref-s{i}")
        pending = [r.send(c, join_req(group, topics=(topic,), instance_id=f"inst-{i}"), 9)]
        if i:
            r.wait_state(group, "PreparingRebalance")
            pending += [r.send(conns[j], join_req(group, ids[j], topics=(topic,), instance_id=f"inst-{j}"), 9)
                        for j in range(i)]
        got = answers(pending)
        conns.append(c)
        ids.append(got[0].member_id)
    gen, leader = got[0].generation_id, ids.index(got[0].leader)
    asg = [(mid, assignment({topic: [i]})) for i, mid in enumerate(ids)]
    order = [leader] + [i for i in range(GROUP_MAX_SIZE) if i != leader]
    pending = [r.send(conns[i], sync_req(group, gen, ids[i], asg if i == leader else (),
                                         instance_id=f"inst-{i}"), 5) for i in order]
    answers(pending)
    r.note("member ids, in join order", ids)  # numbers the minted ids alike on both servers
    describe(r, conns[0], group, label="full")
    c = r.conn("ref-restart")
    r.call(c, join_req(group, topics=(topic,), instance_id="inst-0"), 9, "inst-0 restarts")
    d = r.conn("ref-probe").raw.call(m.DescribeGroupsRequest(groups=[group]), 5).groups[0]
    r.note("after", {"state": d.group_state, "members": len(d.members)})


@script
def static_leave_by_instance_id(r: Run):
    group, topic = r.group(), r.topic()
    c, mid, gen = one_member(r, group, topic, instance_id="inst-1")
    r.call(c, m.LeaveGroupRequest(group_id=group, members=[
        m.LeaveGroupRequestMemberIdentity(member_id="", group_instance_id="inst-1")]), 5, "leave by instance")
    describe(r, c, group)


@script
def static_join_v4_instance_ignored(r: Run):
    # group.instance.id exists from v5; a v4 join carries none
    group, topic = r.group(), r.topic()
    c = r.conn("ref-a")
    join(r, c, group, v=4, topics=(topic,))
    describe(r, c, group)


# -- offsets --------------------------------------------------------------------------------------

for _v in range(10):
    def _commit_version(r: Run, v=_v):
        group, topic = r.group(), r.topic(partitions=2)
        c, cv = r.conn(), r.conn()  # Kafka 4 closes the connection of a version it removed
        r.call(cv, commit_req(group, {topic: {0: 10, 1: 11}}, metadata="m" if v else ""), v, f"commit v{v}")
        r.call(c, fetch_req(group, {topic: [0, 1]}, 5), 5, "fetch v5")
        describe(r, c, group)
    script(_commit_version, name=f"offset_commit_v{_v}")

for _v in range(10):
    def _fetch_version(r: Run, v=_v):
        group, topic = r.group(), r.topic(partitions=3)
        c, cv = r.conn(), r.conn()  # Kafka 4 closes the connection of a version it removed
        r.call(c, commit_req(group, {topic: {0: 5, 1: 6}}, metadata="meta", leader_epoch=3), 8, "commit")
        r.call(cv, fetch_req(group, {topic: [0, 1, 2]}, v), v, f"fetch v{v}")
        if v >= 2:
            r.call(c, fetch_req(group, None, v), v, f"fetch all v{v}")
    script(_fetch_version, name=f"offset_fetch_v{_v}")


@script
def commit_generation_minus_one_into_stable_group(r: Run):
    group, topic = r.group(), r.topic()
    c, mid, gen = one_member(r, group, topic)
    c2 = r.conn("ref-standalone")
    r.call(c2, commit_req(group, {topic: {0: 4}}), 9, "non-member commit, empty member id")
    r.call(c2, commit_req(group, {topic: {0: 4}}, member_id=mid), 9, "member id, generation -1")
    fetch_all(r, c, group)


@script
def commit_generation_minus_one_into_empty_group(r: Run):
    group, topic = r.group(), r.topic()
    c, mid, gen = one_member(r, group, topic)
    r.call(c, m.LeaveGroupRequest(group_id=group, members=[m.LeaveGroupRequestMemberIdentity(member_id=mid)]), 5)
    r.call(c, commit_req(group, {topic: {0: 9}}), 9, "non-member commit into Empty")
    r.call(c, commit_req(group, {topic: {0: 9}}, generation=gen, member_id=mid), 9, "old member commit into Empty")
    fetch_all(r, c, group)
    describe(r, c, group)


@script
def commit_metadata_too_large(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    c = r.conn()
    r.call(c, commit_req(group, {topic: {0: 1}}, metadata="x" * 4096), 9, "4096 chars")
    r.call(c, commit_req(group, {topic: {1: 1}}, metadata="x" * 4097), 9, "4097 chars")
    r.call(c, commit_req(group, {topic: {1: 1}}, metadata="é" * 3000), 9, "3000 two-byte chars")
    r.call(c, fetch_req(group, {topic: [0, 1]}, 9), 9, "fetch")


@script
def commit_null_metadata_and_negative_offset(r: Run):
    group, topic = r.group(), r.topic(partitions=3)
    c = r.conn()
    r.call(c, commit_req(group, {topic: {0: 1}}, metadata=None), 9, "null metadata")
    r.call(c, commit_req(group, {topic: {1: -1}}), 9, "offset -1")
    r.call(c, commit_req(group, {topic: {2: -5}}), 9, "offset -5")
    r.call(c, fetch_req(group, {topic: [0, 1, 2]}, 9), 9, "fetch")


@script
def commit_unknown_topic_and_partition(r: Run):
    group, topic = r.group(), r.topic(partitions=1)
    c = r.conn()
    r.call(c, commit_req(group, {topic: {0: 1, 5: 1}}), 9, "partition past the end")
    r.call(c, commit_req(group, {r.group("no-such-topic"): {0: 1}}), 9, "unknown topic")
    fetch_all(r, c, group)


@script
def commit_empty_group_id(r: Run):
    topic = r.topic()
    c = r.conn()
    r.call(c, commit_req("", {topic: {0: 1}}), 9, "commit")
    r.call(c, fetch_req("", {topic: [0]}, 9), 9, "fetch v9")
    r.call(c, fetch_req("", {topic: [0]}, 5), 5, "fetch v5")


@script
def fetch_unknown_group_and_require_stable(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    c = r.conn()
    fetch_all(r, c, group, label="unknown group, all")
    r.call(c, fetch_req(group, {topic: [0, 1]}, 9), 9, "unknown group, named")
    r.call(c, commit_req(group, {topic: {0: 2}}), 9, "commit")
    r.call(c, fetch_req(group, {topic: [0, 1]}, 7, require_stable=True), 7, "require stable v7")


@script
def fetch_many_groups_v8(r: Run):
    g1, g2, topic = r.group("a"), r.group("b"), r.topic()
    c = r.conn()
    r.call(c, commit_req(g1, {topic: {0: 1}}), 9)
    r.call(c, m.OffsetFetchRequest(groups=[
        m.OffsetFetchRequestGroup(group_id=g1, topics=None),
        m.OffsetFetchRequestGroup(group_id=g2, topics=[m.OffsetFetchRequestTopics(name=topic, partition_indexes=[0])]),
        m.OffsetFetchRequestGroup(group_id="", topics=None),
    ]), 8, "fetch 3 groups")


# -- admin ----------------------------------------------------------------------------------------

@script
def delete_groups_states(r: Run):
    g_live, g_empty, g_none, topic = r.group("live"), r.group("empty"), r.group("none"), r.topic()
    c, mid, gen = one_member(r, g_live, topic)
    r.call(c, commit_req(g_empty, {topic: {0: 3}}), 9, "commit into empty")
    r.call(c, m.DeleteGroupsRequest(groups_names=[g_live, g_empty, g_none, ""]), 2, "delete")
    fetch_all(r, c, g_empty, label="fetch deleted")
    describe(r, c, g_live, g_empty, g_none)


@script
def offset_delete_subscribed_topic(r: Run):
    group, topic, other = r.group(), r.topic("sub", 2), r.topic("other", 1)
    c, mid, gen = one_member(r, group, topic)
    r.call(c, commit_req(group, {topic: {0: 3}, other: {0: 4}}, generation=gen, member_id=mid), 9, "commit")
    r.call(c, m.OffsetDeleteRequest(group_id=group, topics=[
        m.OffsetDeleteRequestTopic(name=topic, partitions=[m.OffsetDeleteRequestPartition(partition_index=0)]),
        m.OffsetDeleteRequestTopic(name=other, partitions=[m.OffsetDeleteRequestPartition(partition_index=0)]),
    ]), 0, "offset delete")
    fetch_all(r, c, group)
    r.call(c, m.OffsetDeleteRequest(group_id=r.group("nobody"), topics=[
        m.OffsetDeleteRequestTopic(name=topic, partitions=[m.OffsetDeleteRequestPartition(partition_index=0)])]),
        0, "offset delete, unknown group")


@script
def offset_delete_empty_group(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    c = r.conn()
    r.call(c, commit_req(group, {topic: {0: 3, 1: 4}}), 9, "commit")
    r.call(c, m.OffsetDeleteRequest(group_id=group, topics=[
        m.OffsetDeleteRequestTopic(name=topic, partitions=[m.OffsetDeleteRequestPartition(partition_index=1),
                                                           m.OffsetDeleteRequestPartition(partition_index=7)])]),
        0, "offset delete")
    fetch_all(r, c, group)


@script
def describe_stable_group_every_version(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    two_members(r, group, topic)
    c = r.conn()
    for v in range(6):
        describe(r, c, group, v=v, label=f"describe v{v}")


@script
def list_groups_filters(r: Run):
    g_live, g_empty, topic = r.group("live"), r.group("empty"), r.topic()
    c, _, _ = one_member(r, g_live, topic)
    r.call(c, commit_req(g_empty, {topic: {0: 3}}), 9)
    for v, states, types in ((0, [], []), (3, [], []), (4, [], []), (4, ["Stable"], []), (4, ["Empty"], []),
                             (5, [], ["classic"]), (5, [], ["consumer"])):
        keep = f"list v{v} {states}{types}"
        resp = r.call(c, m.ListGroupsRequest(states_filter=states, types_filter=types), v, keep)
        r.transcript.pop()  # other scripts' groups are on the same server: keep only ours
        mine = sorted((plain_group(g) for g in resp.groups if r.token in g.group_id), key=str)
        r.note(keep, {"error_code": resp.error_code, "groups": mine})


def plain_group(g):
    return {f: getattr(g, f) for f in g.FIELDS}


@script
def find_coordinator_versions(r: Run):
    group = r.group()
    c = r.conn()
    for v in range(4):
        r.call(c, m.FindCoordinatorRequest(key=group, key_type=0), v, f"find v{v}")
    r.call(c, m.FindCoordinatorRequest(coordinator_keys=[group, ""], key_type=0), 4, "find v4 batch")


@script
def find_coordinator_key_type_errors(r: Run):
    """Share groups (key type 2: no share coordinator on either server) and an unknown key type,
    at every version that has a key type: the error and its message, per key at v4+."""
    c = r.conn()
    for key_type in (2, 5):
        for v in range(1, 4):
            r.call(c, m.FindCoordinatorRequest(key=r.group(), key_type=key_type), v, f"type {key_type} v{v}")
        for v in range(4, 7):
            r.call(c, m.FindCoordinatorRequest(coordinator_keys=[r.group(), ""], key_type=key_type), v,
                   f"type {key_type} v{v} batch")


@script
def find_coordinator_transactions(r: Run):
    """Key type 1. Kafka creates __transaction_state on the first such request and answers
    COORDINATOR_NOT_AVAILABLE until it has a leader: asked again (not recorded) until it does."""
    import time

    c = r.conn()
    deadline = time.monotonic() + 30
    while c.raw.call(m.FindCoordinatorRequest(key="ref-txn", key_type=1), 3).error_code == E.COORDINATOR_NOT_AVAILABLE:
        assert time.monotonic() < deadline, f"{r.server}: no transaction coordinator within 30 s"
        time.sleep(0.1)
    r.call(c, m.FindCoordinatorRequest(key="ref-txn", key_type=1), 3, "txn v3")
    r.call(c, m.FindCoordinatorRequest(coordinator_keys=["ref-txn"], key_type=1), 4, "txn v4")


# -- every version of the other group APIs --------------------------------------------------------

for _v in range(5):
    def _heartbeat_version(r: Run, v=_v):
        group, topic = r.group(), r.topic()
        c, mid, gen = one_member(r, group, topic)
        cv = r.conn("ref-v")
        r.call(cv, m.HeartbeatRequest(group_id=group, generation_id=gen, member_id=mid), v, f"heartbeat v{v}")
        r.call(cv, m.HeartbeatRequest(group_id=group, generation_id=gen, member_id="ref-nobody"), v,
               f"heartbeat v{v}, unknown member")
    script(_heartbeat_version, name=f"heartbeat_v{_v}")

for _v in range(6):
    def _sync_version(r: Run, v=_v):
        group, topic = r.group(), r.topic(partitions=2)
        c = r.conn("ref-a")
        j = join(r, c, group, v=5, topics=(topic,))
        cv = r.conn("ref-v")
        r.call(cv, sync_req(group, j.generation_id, j.member_id, [(j.member_id, assignment({topic: [1]}))]), v,
               f"sync v{v}")
        describe(r, c, group)
    script(_sync_version, name=f"sync_group_v{_v}")

for _v in range(6):
    def _leave_version(r: Run, v=_v):
        group, topic = r.group(), r.topic(partitions=2)
        (ca, ida), (cb, idb), gen = two_members(r, group, topic)
        cv = r.conn("ref-v")
        if v < 3:
            r.call(cv, m.LeaveGroupRequest(group_id=group, member_id=ida), v, f"leave v{v}")
        else:
            r.call(cv, m.LeaveGroupRequest(group_id=group, members=[
                m.LeaveGroupRequestMemberIdentity(member_id=ida)]), v, f"leave v{v}")
        d = r.conn("ref-probe").raw.call(m.DescribeGroupsRequest(groups=[group]), 5).groups[0]
        r.note("after", {"state": d.group_state, "members": len(d.members)})
    script(_leave_version, name=f"leave_group_v{_v}")

for _v in range(3):
    def _delete_version(r: Run, v=_v):
        group, topic = r.group(), r.topic()
        c = r.conn()
        r.call(c, commit_req(group, {topic: {0: 1}}), 9)
        cv = r.conn("ref-v")
        r.call(cv, m.DeleteGroupsRequest(groups_names=[group, r.group("none")]), v, f"delete v{v}")
        fetch_all(r, c, group)
    script(_delete_version, name=f"delete_groups_v{_v}")


# -- more edges -------------------------------------------------------------------------------------

@script
def describe_authorized_operations(r: Run):
    group, topic = r.group(), r.topic()
    c, _, _ = one_member(r, group, topic)
    r.call(c, m.DescribeGroupsRequest(groups=[group, r.group("none")], include_authorized_operations=True), 5,
           "describe with authorized operations")


@script
def join_empty_instance_id(r: Run):
    group, topic = r.group(), r.topic()
    c = r.conn("ref-a")
    join(r, c, group, topics=(topic,), instance_id="")
    describe(r, c, group)


@script
def static_member_wrong_instance_id(r: Run):
    group, topic = r.group(), r.topic()
    c, mid, gen = one_member(r, group, topic, instance_id="inst-1")
    r.call(c, m.HeartbeatRequest(group_id=group, generation_id=gen, member_id=mid, group_instance_id="inst-2"), 4,
           "heartbeat, another instance id")
    r.call(c, m.HeartbeatRequest(group_id=group, generation_id=gen, member_id=mid), 4, "heartbeat, no instance id")
    r.call(c, commit_req(group, {topic: {0: 1}}, generation=gen, member_id=mid, instance_id="inst-2"), 9,
           "commit, another instance id")
    r.call(c, join_req(group, "ref-other-id", topics=(topic,), instance_id="inst-1"), 9,
           "join, known instance with an unknown member id")


@script
def follower_rejoin_changed_metadata(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    other = r.topic("other", 1)
    (ca, ida), (cb, idb), gen = two_members(r, group, topic)
    pb = r.send(cb, join_req(group, idb, topics=(topic, other)), 9)
    r.note("follower's join parked", r.parked(pb))
    r.wait_state(group, "PreparingRebalance")
    r.call(ca, m.HeartbeatRequest(group_id=group, generation_id=gen, member_id=ida), 4, "a heartbeat")
    r.call(ca, join_req(group, ida, topics=(topic,)), 9, "a rejoin")
    r.recv(pb, "b join answered")


@script
def rebalance_timeout_removes_laggard(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    ca, ida, gen = one_member(r, group, topic, rebalance_ms=1000)
    cb = r.conn("ref-b")
    jb = r.call(cb, join_req(group, topics=(topic,), rebalance_ms=1000), 9, "b join")
    # a never rejoins: after its rebalance timeout (1 s) the generation completes without it
    r.call(cb, join_req(group, jb.member_id, topics=(topic,), rebalance_ms=1000), 9, "b join (with id)")
    r.call(ca, m.HeartbeatRequest(group_id=group, generation_id=gen, member_id=ida), 4, "a heartbeat, too late")
    describe(r, cb, group)


@script
def session_expiry_empties_group(r: Run):
    import time

    group, topic = r.group(), r.topic()
    c, mid, gen = one_member(r, group, topic, session_ms=6000)
    r.call(c, commit_req(group, {topic: {0: 3}}, generation=gen, member_id=mid), 9, "commit")
    # 6 s: the minimum session timeout both servers allow. The margin covers a late expiry timer on
    # a loaded machine (Kafka's and herd's alike; herd gives no time back for a loop that was late
    # because it ran or waited for a CPU, only for a pause: coordinator/stall.py)
    time.sleep(9.0)
    r.call(c, m.HeartbeatRequest(group_id=group, generation_id=gen, member_id=mid), 4, "heartbeat after expiry")
    describe(r, c, group)
    fetch_all(r, c, group)


@script
def commit_retention_time(r: Run):
    group, topic = r.group(), r.topic(partitions=2)
    c = r.conn()
    r.call(c, m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, retention_time_ms=60000,
                                    topics=[m.OffsetCommitRequestTopic(name=topic, partitions=[
                                        m.OffsetCommitRequestPartition(partition_index=0, committed_offset=4)])]),
           4, "commit v4 with a retention time")
    r.call(c, m.OffsetCommitRequest(group_id=group, generation_id_or_member_epoch=-1, retention_time_ms=-1,
                                    topics=[m.OffsetCommitRequestTopic(name=topic, partitions=[
                                        m.OffsetCommitRequestPartition(partition_index=1, committed_offset=5)])]),
           2, "commit v2, retention -1 (the broker's)")
    r.call(c, fetch_req(group, {topic: [0, 1]}, 9), 9, "fetch")
