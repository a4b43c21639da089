"""Randomised runs of the consumer-group core against clients that follow the protocol (and some
that do not revoke), with the manual clock: after every step no partition has two owners among
the members the coordinator knows, each client owns only what the coordinator lets it own; at the
end the log replayed equals memory, and once everyone behaves the group converges, balanced."""
import random

import pytest

from coordinator.core.consumer.group import STATIC_LEAVE_EPOCH
from coordinator.core.consumer.groups import ConsumerGroupConfig
from protocol import errors as E
from protocol.messages import ConsumerGroupHeartbeatRequest
from tests.coordinator.core.consumer.cg_harness import Client, Harness, assert_never_owned_twice, run_rounds


def check(h: Harness, clients) -> None:
    g = h.group()
    if g is None:
        return
    live = [c for c in clients if c.member_id in g.members and c.epoch >= 0]
    assert_never_owned_twice(live)
    for c in live:
        m = g.members[c.member_id]
        allowed = {t: set(m.assigned.get(t, ())) | set(m.pending_revocation.get(t, ())) for t in
                   set(m.assigned) | set(m.pending_revocation)}
        for t, ps in c.owned.items():
            assert ps <= allowed.get(t, set()), f"{c.member_id} owns {sorted(ps)} beyond {allowed}"
    owned = {}
    for m in g.members.values():
        for a in (m.assigned, m.pending_revocation):
            for t, ps in a.items():
                for p in ps:
                    assert (t, p) not in owned
                    owned[(t, p)] = m.member_id
                    assert g.partition_epochs[(t, p)] == m.member_epoch
    assert len(owned) == len(g.partition_epochs)
    check_counts(g)


def check_counts(g) -> None:
    """What the group keeps counted as records apply (so no heartbeat walks its members) is what
    a walk of the members finds."""
    names, regexes, assignors = set(), set(), {}
    for m in g.members.values():
        names.update(m.subscribed_topic_names)
        if m.subscribed_topic_regex:
            regexes.add(m.subscribed_topic_regex)
        if m.server_assignor:
            assignors[m.server_assignor] = assignors.get(m.server_assignor, 0) + 1
    assert g.subscribed_topic_names() == names and g.regexes() == regexes
    assert g.preferred_assignor("dflt") == (min(assignors, key=lambda a: (-assignors[a], a)) if assignors else "dflt")
    if not g.members:
        want = "Empty"
    elif g.group_epoch > g.assignment_epoch:
        want = "Assigning"
    elif all(m.is_reconciled_to(g.assignment_epoch) for m in g.members.values()):
        want = "Stable"
    else:
        want = "Reconciling"
    assert g.computed_state() == want


def step(h: Harness, clients, rng: random.Random) -> None:
    c = rng.choice(clients)
    g = h.group()
    in_group = g is not None and c.member_id in g.members
    r = rng.random()
    if not in_group and c.epoch > 0 and r < 0.3:
        # fenced while away (session or rebalance timeout): it learns so at its next heartbeat
        assert c.heartbeat().error_code == E.UNKNOWN_MEMBER_ID
        c.owned = {}
        c.epoch = -1
        c.stubborn = False
        return
    if not in_group or c.epoch < 0:
        if r < 0.6:
            if c.instance_id and c.epoch == STATIC_LEAVE_EPOCH and rng.random() < 0.7:
                c.member_id = f"{c.instance_id}-{rng.randrange(10**6)}"  # a restarted static process
            c.owned = {}
            resp = c.join()
            assert resp.error_code in (0, E.UNRELEASED_INSTANCE_ID), resp
        return
    if r < 0.55:
        resp = c.heartbeat()
    elif r < 0.65:  # a heartbeat that does not report what it owns
        req = ConsumerGroupHeartbeatRequest(group_id=c.group, member_id=c.member_id, member_epoch=c.epoch,
                                            instance_id=c.instance_id)
        resp = c._apply(h.send(req))
    elif r < 0.7:
        resp = c.leave(-1)
    elif r < 0.75 and c.instance_id:
        resp = c.leave(STATIC_LEAVE_EPOCH)
    elif r < 0.8:
        c.stubborn = not c.stubborn
        return
    elif r < 0.85:  # change of subscription (a full request)
        c.topics = rng.choice([["t"], ["t", "u"], ["u"]])
        req = ConsumerGroupHeartbeatRequest(group_id=c.group, member_id=c.member_id, member_epoch=c.epoch,
                                            instance_id=c.instance_id, rebalance_timeout_ms=c.rebalance_timeout_ms,
                                            subscribed_topic_names=c.topics, topic_partitions=c._owned_wire())
        resp = c._apply(h.send(req))
    elif r < 0.9:
        name = rng.choice(["t", "u"])
        h.set_topic(name, min(h.topics.topics[name][1] + rng.randrange(1, 4), 40))
        return
    else:
        h.advance(rng.choice([100, 1000, 5000, 20_000, 46_000]))
        return
    if resp.error_code in (E.UNKNOWN_MEMBER_ID, E.FENCED_MEMBER_EPOCH, E.FENCED_INSTANCE_ID):
        c.owned = {}
        c.epoch = -1  # it rejoins later
        c.stubborn = False
    else:
        assert resp.error_code == 0, resp


@pytest.mark.parametrize("seed", range(25))
def test_random_runs(seed):
    random_run(seed, ConsumerGroupConfig())


@pytest.mark.parametrize("seed", range(10))
def test_random_runs_with_an_assignment_interval(seed):
    """group.consumer.assignment.interval.ms: the assignor runs at most once a second per group;
    in between, members reconcile toward the target they have. Same invariants, same end."""
    random_run(seed, ConsumerGroupConfig(assignment_interval_ms=1000), assignor="uniform", rounds=30)


def random_run(seed, config, assignor=None, rounds=12):
    rng = random.Random(seed)
    h = Harness({"t": rng.randrange(1, 12), "u": rng.randrange(1, 8)}, config)
    clients = [Client(h, f"m{i}", instance_id=(f"i{i}" if i % 3 == 0 else None),
                      rebalance_timeout_ms=rng.choice([5_000, 30_000]), topics=["t", "u"],
                      assignor=assignor if i % 2 else None) for i in range(6)]
    for _ in range(400):
        step(h, clients, rng)
        check(h, clients)
    h.assert_replay_equivalent()
    # everyone behaves from now on: the group converges, every member at the target, balanced
    for c in clients:
        c.stubborn = False
        c.topics = ["t", "u"]
        if c.epoch < 0 or c.member_id not in h.group().members:
            c.owned = {}
            if c.instance_id:
                c.member_id = f"{c.instance_id}-final"
            assert c.join().error_code == 0
        else:
            c.join()  # rejoin with the common subscription
        check(h, clients)
    run_rounds(h, clients, rounds=rounds, step_ms=100)
    g = h.group()
    total = sum(n for _, n in h.topics.topics.values())
    counts = sorted(c.count() for c in clients)
    assert sum(counts) == total and counts[-1] - counts[0] <= 1
    for c in clients:
        assert c.owned == {t: set(ps) for t, ps in g.members[c.member_id].assigned.items()}
    h.assert_replay_equivalent()
