"""Random joins/syncs/heartbeats/commits/leaves/crashes/clock advances over a few members of one
group, checking the invariants a classic group must keep:

* at most one leader, and every member told it is the leader of a generation agrees on who it is;
* every Stable generation's assignment is the one that generation's leader sent;
* the generation never decreases;
* no member stays in the group past its session timeout without activity (unless it is waiting in
  a rebalance, where the rebalance and sync timeouts police it);
* no request is ever dropped: each one is answered exactly once or is still parked in the group;
* replaying the written records rebuilds the same Stable/Empty groups and offsets.
"""
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from protocol import errors as E
from tests.coordinator.core.test_group_harness import Harness, sub
from tests.coordinator.core.test_group_replay import durable_view, replayed

GROUP = "g"
ORACLE_CHECKED: dict[int, int] = {}  # expected error -> commits the oracle checked (all runs)
PROTOCOLS = [(("range", sub("t")),), (("range", sub("t", "u")),),
             (("roundrobin", sub("t")), ("range", sub("t")))]


class Client:
    def __init__(self, idx: int, session: int, rebalance: int, instance: str | None = None):
        self.idx = idx
        self.instance = instance  # static members (KIP-345) keep it across crashes
        self.session = session
        self.rebalance = rebalance
        self.member_id = ""
        self.generation = -1
        self.leader = ""
        self.members: list[str] = []
        self.proto = 0
        self.outstanding = None  # ("join"|"sync", token)
        self.phase = "unjoined"  # unjoined -> joined (must sync) -> stable (heartbeats)


class GroupMachine(RuleBasedStateMachine):
    @initialize(delay=st.sampled_from([0, 0, 400]),
                sessions=st.lists(st.sampled_from([1_000, 2_000, 3_000]), min_size=4, max_size=4),
                rebalances=st.lists(st.sampled_from([1_500, 3_000, 5_000]), min_size=4, max_size=4),
                statics=st.integers(0, 2))
    def setup(self, delay, sessions, rebalances, statics):
        self.h = Harness(initial_rebalance_delay_ms=delay, offsets_partitions=2,
                         offsets_retention_check_interval_ms=10**9)
        self.clients = [Client(i, s, r, f"i{i}" if i < statics else None)
                        for i, (s, r) in enumerate(zip(sessions, rebalances, strict=True))]
        self.instance_ids: dict[str, str] = {}  # instance -> its member id after the last step
        self.member_instance: dict[str, str] = {}  # every static member id seen -> its instance
        self.activity: dict[str, int] = {}  # member id -> last request from / reply to it
        self.leaders: dict[int, str] = {}  # generation -> leader (from join responses)
        self.assigned: dict[int, dict[str, bytes]] = {}  # generation -> the leader's assignment
        self.max_generation = 0
        self.orphans = []  # parked requests of crashed clients
        self.orphans_seen = set()
        self.orphan_owner = {}

    # ---- plumbing ---------------------------------------------------------------------------

    def touch(self, member_id: str, at: int | None = None) -> None:
        if member_id:
            at = self.h.now if at is None else at
            self.activity[member_id] = max(self.activity.get(member_id, at), at)

    def process_replies(self) -> None:
        h = self.h
        for token in self.orphans:
            if token in h.replies and token not in self.orphans_seen:
                # a crashed client's parked request answered later: the coordinator restarted that
                # member's session at that moment
                self.orphans_seen.add(token)
                self.touch(getattr(h.replies[token], "member_id", "") or self.orphan_owner[token],
                           h.reply_times[token])
        for c in self.clients:
            if c.outstanding is None:
                continue
            kind, token = c.outstanding
            resp = h.reply(token)
            if resp is None:
                continue
            c.outstanding = None
            # any answer counts as activity, at the moment it was sent (the coordinator restarts
            # a member's session when it answers a parked request, whatever the answer)
            self.touch(c.member_id, h.reply_times[token])
            self.touch(getattr(resp, "member_id", ""), h.reply_times[token])
            if kind == "join":
                self.on_join_reply(c, resp)
            else:
                self.on_sync_reply(c, resp)

    def on_join_reply(self, c: Client, r) -> None:
        c.phase = "unjoined"
        if r.error_code == E.NONE:
            c.phase = "joined"
            c.member_id, c.generation, c.leader = r.member_id, r.generation_id, r.leader
            prev = self.leaders.setdefault(r.generation_id, r.leader)
            if prev != r.leader:  # only a restarted static leader may change its id mid-generation
                g = self.h.group(GROUP)
                live = {mid: inst for inst, mid in g.static_members.items()} if g else {}
                inst = self.member_instance.get(prev) or live.get(prev)
                now_inst = self.member_instance.get(r.leader) or live.get(r.leader)
                assert inst is not None and inst == now_inst, \
                    f"two leaders for generation {r.generation_id}: {prev} and {r.leader}"
            if r.leader == r.member_id and r.members:
                c.members = [m.member_id for m in r.members]
                assert c.member_id in c.members
            else:
                c.members = []
            if c.instance is not None:
                old = self.instance_ids.get(c.instance)
                done = self.assigned.get(r.generation_id)
                if old and old != r.member_id and done is not None and r.member_id not in done:
                    # restarted static member, no rebalance: it inherits its old assignment
                    done[r.member_id] = done.get(old, b"")
        elif r.error_code == E.MEMBER_ID_REQUIRED:
            c.member_id = r.member_id
        elif r.error_code in (E.UNKNOWN_MEMBER_ID, E.ILLEGAL_GENERATION, E.FENCED_INSTANCE_ID):
            c.member_id, c.generation = "", -1
        else:
            assert r.error_code in (E.REBALANCE_IN_PROGRESS,), r

    def on_sync_reply(self, c: Client, r) -> None:
        c.phase = "stable" if r.error_code == E.NONE else "unjoined"
        if r.error_code == E.NONE:
            expected = self.assigned.get(c.generation)
            assert expected is not None, f"assignment for generation {c.generation} not from its leader"
            assert r.assignment == expected.get(c.member_id, b""), (c.member_id, c.generation)
        elif r.error_code in (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID):
            c.member_id, c.generation = "", -1

    # ---- rules ------------------------------------------------------------------------------

    def natural_step(self, i: int) -> None:
        """What a well-behaved consumer does next: join, sync, or heartbeat."""
        c = self.clients[i]
        if c.outstanding is not None:
            return
        if c.phase == "unjoined":
            self.join(i, False)
        elif c.phase == "joined":
            self.sync(i)
        else:
            self.heartbeat(i)

    @rule(i=st.integers(0, 3))
    def act(self, i):
        self.natural_step(i)

    @rule(i=st.integers(0, 3))
    def act_more(self, i):
        self.natural_step(i)

    @rule()
    def everyone_acts(self):
        for i in range(len(self.clients)):
            self.natural_step(i)

    @rule(i=st.integers(0, 3), change=st.booleans())
    def join(self, i, change):
        c = self.clients[i]
        if c.outstanding is not None:
            return
        if change:
            c.proto = (c.proto + 1) % len(PROTOCOLS)
        self.touch(c.member_id)
        t = self.h.join(GROUP, c.member_id, session=c.session, rebalance=c.rebalance,
                        protocols=PROTOCOLS[c.proto], client_id=f"c{i}", instance=c.instance)
        c.outstanding = ("join", t)
        self.process_replies()

    @rule(i=st.integers(0, 3))
    def sync(self, i):
        c = self.clients[i]
        if c.outstanding is not None or not c.member_id or c.generation < 0:
            return
        self.touch(c.member_id)
        assignments = None
        if c.leader == c.member_id:
            assignments = {m: f"{c.generation}:{m}".encode() for m in c.members[::-1][:3]}
            g = self.h.group(GROUP)
            if g is not None and g.generation == c.generation and g.leader_id == c.member_id \
                    and g.state == "CompletingRebalance":
                self.assigned[c.generation] = assignments
        t = self.h.sync(GROUP, c.generation, c.member_id, assignments, instance=c.instance)
        c.outstanding = ("sync", t)
        self.process_replies()

    @rule(i=st.integers(0, 3))
    def heartbeat(self, i):
        c = self.clients[i]
        if c.outstanding is not None or not c.member_id:
            return
        self.touch(c.member_id)
        r = self.h.heartbeat(GROUP, c.generation, c.member_id, instance=c.instance)
        if r.error_code in (E.NONE, E.REBALANCE_IN_PROGRESS):
            self.touch(c.member_id)
        if r.error_code != E.NONE:
            c.phase = "unjoined"
        if r.error_code in (E.UNKNOWN_MEMBER_ID, E.FENCED_INSTANCE_ID):
            c.member_id, c.generation = "", -1
        self.process_replies()

    @rule(i=st.integers(0, 3), offset=st.integers(0, 100), stale=st.sampled_from([False, False, True]))
    def commit(self, i, offset, stale):
        """A commit with the client's generation, or (stale) the one before it, as a client that
        missed a rebalance would send."""
        c = self.clients[i]
        if c.outstanding is not None:
            return
        self.touch(c.member_id)
        g = self.h.group(GROUP)
        state = self.h.state(GROUP)
        known = g is not None and c.member_id != "" and c.member_id in g.members
        generation = c.generation - 1 if stale and c.generation > 0 else c.generation
        current = known and generation == g.generation
        r = self.h.commit(GROUP, {("t", i % 2): offset}, generation=generation, member_id=c.member_id,
                          instance=c.instance if c.member_id else None)
        # the commit oracle (Kafka's ClassicGroup.validateOffsetCommit) for a member the group knows:
        # its generation is checked first, then a group completing a rebalance refuses the commit
        if known:
            assert r is not None, "a member's commit was not answered"
            code = r.topics[0].partitions[0].error_code
            if not current:
                expected = E.ILLEGAL_GENERATION
            elif state == "CompletingRebalance":
                expected = E.REBALANCE_IN_PROGRESS
            else:
                expected = E.NONE
            assert code == expected, (state, generation, g.generation, code)
            ORACLE_CHECKED[expected] = ORACLE_CHECKED.get(expected, 0) + 1
        self.process_replies()

    @rule(i=st.integers(0, 3))
    def leave(self, i):
        c = self.clients[i]
        if c.outstanding is not None or not c.member_id:
            return
        self.h.leave(GROUP, (c.member_id, c.instance))
        c.member_id, c.generation, c.phase = "", -1, "unjoined"
        self.process_replies()

    @rule(i=st.integers(0, 3))
    def crash(self, i):
        """The client process dies: it goes silent (its parked request, if any, stays parked)."""
        c = self.clients[i]
        self.clients[i] = Client(i, c.session, c.rebalance, c.instance)
        if c.outstanding is not None:
            self.orphans.append(c.outstanding[1])
            self.orphan_owner[c.outstanding[1]] = c.member_id

    @rule(ms=st.sampled_from([50, 400, 900, 1_600, 3_100]))
    def advance(self, ms):
        self.h.advance(ms)
        self.process_replies()

    # ---- invariants -------------------------------------------------------------------------

    @invariant()
    def remember_static_members(self):
        g = self.h.group(GROUP)
        if g is not None:
            self.instance_ids = dict(g.static_members)
            for inst, mid in g.static_members.items():
                self.member_instance[mid] = inst

    @invariant()
    def one_leader_and_monotonic_generation(self):
        g = self.h.group(GROUP)
        if g is None:
            return
        if g.members:
            assert g.leader_id in g.members
        assert g.generation >= self.max_generation
        self.max_generation = g.generation
        assert g.num_awaiting_join == sum(1 for m in g.members.values() if m.join is not None)

    @invariant()
    def stable_assignment_comes_from_the_leader(self):
        g = self.h.group(GROUP)
        if g is None or g.state != "Stable":
            return
        expected = self.assigned.get(g.generation)
        assert expected is not None, f"Stable generation {g.generation} without a leader assignment"
        assert self.leaders.get(g.generation) is not None
        for m in g.members.values():
            assert m.assignment == expected.get(m.member_id, b"")

    @invariant()
    def nobody_outlives_its_session(self):
        g = self.h.group(GROUP)
        if g is None:
            return
        now = self.h.now
        for m in g.members.values():
            if m.join is not None or m.sync is not None:
                continue
            last = self.activity.get(m.member_id)
            assert last is not None, m
            assert now - last <= m.session_timeout_ms, (m.member_id, now - last, m.session_timeout_ms)

    @invariant()
    def no_request_is_lost(self):
        g = self.h.group(GROUP)
        parked = set()
        if g is not None:
            for m in g.members.values():
                if m.join is not None:
                    parked.add(m.join.token)
                if m.sync is not None:
                    parked.add(m.sync.token)
        tokens = [c.outstanding[1] for c in self.clients if c.outstanding is not None] + self.orphans
        for t in tokens:
            assert t in self.h.replies or t in parked, f"request {t} was neither answered nor parked"

    def teardown(self):
        h = getattr(self, "h", None)
        if h is None:
            return
        g = h.group(GROUP)
        if g is None or g.state in ("Stable", "Empty"):
            assert durable_view(replayed(h)) == durable_view(h.gc)


# derandomize: the same 150 programs every run (a random draw left the commit oracle without a
# CompletingRebalance commit about one run in twelve, failing the check below by chance)
GroupMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=50, deadline=None,
                                          derandomize=True, suppress_health_check=[HealthCheck.too_slow])
TestGroupMachine = GroupMachine.TestCase


def test_the_commit_oracle_saw_every_outcome():
    """Runs after the machine (same module, file order): every branch of the oracle was exercised,
    so the machine's commit checks cannot pass by never checking."""
    if not ORACLE_CHECKED:
        import pytest
        pytest.skip("run with the state machine (this file as a whole)")
    assert {E.NONE, E.ILLEGAL_GENERATION, E.REBALANCE_IN_PROGRESS} <= set(ORACLE_CHECKED), ORACLE_CHECKED
