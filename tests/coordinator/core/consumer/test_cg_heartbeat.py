"""ConsumerGroupHeartbeat on the pure core, with the manual clock."""
import pytest

from coordinator.core.consumer import records as cr
from coordinator.core.consumer.group import (
    ASSIGNING,
    EMPTY,
    MEMBER_STABLE,
    RECONCILING,
    STABLE,
    UNRELEASED_PARTITIONS,
    UNREVOKED_PARTITIONS,
    ConsumerGroup,
    IllegalStateTransition,
)
from coordinator.core.consumer.groups import (
    OLDER_MEMBER_EPOCH,
    ConsumerGroupConfig,
    commit_partition_ok,
    validate_offset_commit,
    validate_offset_fetch,
)
from protocol import errors as E
from protocol.messages import ConsumerGroupHeartbeatRequest, ConsumerGroupHeartbeatRequestTopicPartitions
from tests.coordinator.core.consumer.cg_harness import Client, Harness, assert_never_owned_twice, run_rounds, tid

T = tid("t")


def parts(client, topic="t"):
    return client.owned.get(tid(topic), set())


def test_first_member_gets_every_partition_and_the_group_is_stable():
    h = Harness({"t": 4})
    a = Client(h, "a")
    resp = a.join()
    assert resp.error_code == 0
    assert resp.member_id == "a" and resp.member_epoch == 2  # a new group is at epoch 1 (Kafka 4.4)
    assert resp.heartbeat_interval_ms == 5000
    assert parts(a) == {0, 1, 2, 3}
    g = h.group()
    assert (g.group_epoch, g.assignment_epoch, g.state) == (2, 2, STABLE)
    # a steady heartbeat writes nothing and carries no assignment
    n = len(h.log)
    resp = a.heartbeat()
    assert resp.error_code == 0 and resp.assignment is None and resp.member_epoch == 2
    assert len(h.log) == n
    h.assert_replay_equivalent()


def test_v0_join_mints_the_member_id_and_v1_requires_one():
    h = Harness({"t": 2})
    a = Client(h, "", version=0)
    resp = a.join()
    assert resp.error_code == 0 and resp.member_id == "minted-1"
    b = Client(h, "", version=1)
    resp = b.join()
    assert resp.error_code == E.INVALID_REQUEST and "MemberId" in resp.error_message
    assert h.group().members.keys() == {"minted-1"}


def _req(**kw):
    base = dict(group_id="g", member_id="m", member_epoch=0, rebalance_timeout_ms=30000,
                subscribed_topic_names=["t"], topic_partitions=[])
    base.update(kw)
    return ConsumerGroupHeartbeatRequest(**base)


@pytest.mark.parametrize("kw,code", [
    (dict(group_id=""), E.INVALID_REQUEST),
    (dict(group_id="  "), E.INVALID_REQUEST),
    (dict(instance_id=" "), E.INVALID_REQUEST),
    (dict(rack_id=""), E.INVALID_REQUEST),
    (dict(rebalance_timeout_ms=-1), E.INVALID_REQUEST),
    (dict(topic_partitions=None), E.INVALID_REQUEST),
    (dict(topic_partitions=[ConsumerGroupHeartbeatRequestTopicPartitions(topic_id=T, partitions=[0])]),
     E.INVALID_REQUEST),
    (dict(subscribed_topic_names=None), E.INVALID_REQUEST),
    (dict(member_epoch=-3), E.INVALID_REQUEST),
    (dict(member_epoch=-2), E.INVALID_REQUEST),  # static leave without an instance id
    (dict(server_assignor="sticky"), E.UNSUPPORTED_ASSIGNOR),
    (dict(subscribed_topic_regex="t(?=x)"), E.INVALID_REGULAR_EXPRESSION),
    (dict(subscribed_topic_regex="(unclosed"), E.INVALID_REGULAR_EXPRESSION),
    (dict(member_epoch=3), E.GROUP_ID_NOT_FOUND),  # no such group (Kafka's answer)
    (dict(member_epoch=-1), E.GROUP_ID_NOT_FOUND),
])
def test_invalid_requests_get_kafkas_error_and_change_nothing(kw, code):
    h = Harness({"t": 2})
    resp = h.send(_req(**kw))
    assert resp.error_code == code
    assert resp.error_message
    assert h.log == [] and h.groups.groups == {}


def test_join_with_only_a_regex_is_accepted():
    h = Harness({"orders-1": 1, "orders-2": 1, "other": 1})
    a = Client(h, "a", topics=None, regex="orders-.*")
    assert a.join().error_code == 0
    assert set(a.owned) == {tid("orders-1"), tid("orders-2")}


def test_unknown_member_and_epochs_from_the_future_or_the_past_are_fenced():
    h = Harness({"t": 4})
    a, b = Client(h, "a"), Client(h, "b")
    a.join()
    b.join()
    run_rounds(h, [a, b])
    g = h.group()
    ma = g.members["a"]
    ghost = Client(h, "ghost")
    ghost.epoch = 3
    assert ghost.heartbeat().error_code == E.UNKNOWN_MEMBER_ID
    a.epoch = ma.member_epoch + 1
    assert a.heartbeat().error_code == E.FENCED_MEMBER_EPOCH
    # its previous epoch is accepted only when it owns a subset of its assignment
    a.epoch = ma.previous_member_epoch
    a.owned = {T: {0, 1, 2, 3}}
    assert a.heartbeat().error_code == E.FENCED_MEMBER_EPOCH


def test_previous_epoch_is_accepted_when_the_bump_was_lost():
    h = Harness({"t": 4})
    a = Client(h, "a")
    a.join()
    b = Client(h, "b")
    b.join()
    run_rounds(h, [a, b])
    m = h.group().members["a"]
    assert m.previous_member_epoch < m.member_epoch
    # the response carrying the new epoch got lost: a comes back with its previous epoch,
    # owning a subset of what it is assigned
    a.epoch = m.previous_member_epoch
    resp = a.heartbeat()
    assert resp.error_code == 0 and resp.member_epoch == m.member_epoch


def test_second_member_revoke_before_assign():
    h = Harness({"t": 4})
    a, b = Client(h, "a"), Client(h, "b")
    a.join()
    assert parts(a) == {0, 1, 2, 3}
    resp = b.join()
    g = h.group()
    assert g.group_epoch == 3 and g.assignment_epoch == 3
    # b's target partitions are still a's: b waits at the new epoch without them
    assert parts(b) == set()
    assert g.members["b"].state == UNRELEASED_PARTITIONS and resp.member_epoch == 3
    assert g.state == RECONCILING
    # a is told to give up two partitions (they leave its assignment) but keeps its epoch
    resp = a.heartbeat()
    assert g.members["a"].state == UNREVOKED_PARTITIONS and resp.member_epoch == 2
    assert len(parts(a)) == 2
    assert_never_owned_twice([a, b])
    # a acknowledges (its next heartbeat no longer reports them): it gets epoch 3
    resp = a.heartbeat()
    assert resp.member_epoch == 3 and g.members["a"].state == MEMBER_STABLE
    # and only now b gets them
    b.heartbeat()
    assert len(parts(b)) == 2 and parts(a) | parts(b) == {0, 1, 2, 3}
    assert g.settle() == STABLE
    h.assert_replay_equivalent()


def test_member_that_never_revokes_is_fenced_after_its_rebalance_timeout():
    h = Harness({"t": 4})
    a = Client(h, "a", rebalance_timeout_ms=10_000)
    a.join()
    b = Client(h, "b")
    b.join()
    a.stubborn = True
    a.heartbeat()
    assert h.group().members["a"].state == UNREVOKED_PARTITIONS
    for _ in range(9):  # heartbeats keep its session alive, not its rebalance
        h.advance(1000)
        a.heartbeat()
        b.heartbeat()
        assert parts(b) == set()
        assert_never_owned_twice([a, b])
    recs = h.advance(1000)
    assert recs, "the rebalance timeout fenced nobody"
    assert "a" not in h.group().members
    assert a.heartbeat().error_code == E.UNKNOWN_MEMBER_ID  # fenced: it must rejoin
    a.owned = {}
    b.heartbeat()
    assert parts(b) == {0, 1, 2, 3}
    h.assert_replay_equivalent()


def test_rebalance_timeout_is_cancelled_once_the_member_revokes():
    h = Harness({"t": 4})
    a = Client(h, "a", rebalance_timeout_ms=10_000)
    a.join()
    Client(h, "b").join()
    a.heartbeat()
    a.heartbeat()  # revoked
    h.advance(9_000)
    a.heartbeat()
    h.advance(9_000)
    a.heartbeat()
    assert "a" in h.group().members


def test_member_dying_mid_reconciliation_is_fenced_at_session_timeout_and_others_take_over():
    h = Harness({"t": 6})
    a, b, c = Client(h, "a", rebalance_timeout_ms=300_000), Client(h, "b"), Client(h, "c")
    a.join()
    b.join()
    c.join()
    a.heartbeat()  # a is now revoking; then it dies (no more heartbeats, never revokes)
    assert h.group().members["a"].state == UNREVOKED_PARTITIONS
    for second in range(1, 51):
        h.advance(1000)
        for x in (b, c):
            x.heartbeat()
        if "a" in h.group().members:
            assert second < 45
            assert_never_owned_twice([a, b, c])  # nothing of a's is handed out while it lives
        else:
            assert second >= 45
            a.owned = {}
    assert "a" not in h.group().members
    run_rounds(h, [b, c])
    assert parts(b) | parts(c) == set(range(6)) and len(parts(b)) == len(parts(c)) == 3


def test_session_timeout_fences_a_silent_member():
    h = Harness({"t": 4}, ConsumerGroupConfig())
    a, b = Client(h, "a"), Client(h, "b")
    a.join()
    b.join()
    run_rounds(h, [a, b])
    a.heartbeat()
    for _ in range(44):
        h.advance(1000)
        b.heartbeat()
    assert "a" in h.group().members
    h.advance(1000)
    assert "a" not in h.group().members
    assert h.group().state == ASSIGNING  # the next heartbeat computes the new target
    a.owned = {}
    b.heartbeat()
    b.heartbeat()
    assert parts(b) == {0, 1, 2, 3}


def test_leave_gives_partitions_to_the_others_at_their_next_heartbeats():
    h = Harness({"t": 6})
    cs = [Client(h, m) for m in "abc"]
    for c in cs:
        c.join()
    run_rounds(h, cs)
    epoch = h.group().group_epoch
    resp = cs[0].leave()
    assert resp.error_code == 0 and resp.member_epoch == -1
    assert h.group().group_epoch == epoch + 1 and "a" not in h.group().members
    rounds = run_rounds(h, cs[1:])
    assert rounds <= 2
    assert parts(cs[1]) | parts(cs[2]) == set(range(6))
    assert cs[0].leave().error_code == E.UNKNOWN_MEMBER_ID
    h.assert_replay_equivalent()


def test_last_member_leaving_empties_the_group():
    h = Harness({"t": 2})
    a = Client(h, "a")
    a.join()
    a.leave()
    g = h.group()
    assert g.state == EMPTY and not g.partition_epochs
    h.assert_replay_equivalent()


def test_topic_growing_partitions_bumps_the_epoch_and_assigns_them():
    h = Harness({"t": 2})
    a, b = Client(h, "a"), Client(h, "b")
    a.join()
    b.join()
    run_rounds(h, [a, b])
    epoch = h.group().group_epoch
    recs = h.set_topic("t", 6)
    assert recs and h.group().group_epoch == epoch + 1 and h.group().state == ASSIGNING
    run_rounds(h, [a, b])
    assert parts(a) | parts(b) == set(range(6)) and len(parts(a)) == 3
    assert h.set_topic("t", 6) == []  # no change, no records
    h.assert_replay_equivalent()


def test_topic_created_later_is_assigned_to_its_subscribers():
    h = Harness({})
    a = Client(h, "a", topics=["late"])
    a.join()
    assert a.owned == {}
    h.set_topic("late", 3)
    run_rounds(h, [a])
    assert parts(a, "late") == {0, 1, 2}


def test_regex_subscription_follows_the_catalog():
    h = Harness({"orders.eu": 2, "payments": 2})
    a = Client(h, "a", topics=[], regex=r"orders\..*")
    b = Client(h, "b", topics=["payments"])
    a.join()
    b.join()
    run_rounds(h, [a, b])
    assert set(a.owned) == {tid("orders.eu")} and set(b.owned) == {tid("payments")}
    h.set_topic("orders.us", 2)
    h.set_topic("ordersXus", 2)  # the dot is escaped: no match
    run_rounds(h, [a, b])
    assert set(a.owned) == {tid("orders.eu"), tid("orders.us")}
    d = h.groups.describe(["g"])[0]
    ma = next(m for m in d.members if m.member_id == "a")
    assert ma.subscribed_topic_regex == r"orders\..*"
    assert sorted(tp.topic_name for tp in ma.assignment.topic_partitions) == ["orders.eu", "orders.us"]
    h.assert_replay_equivalent()


def test_changing_subscription_bumps_the_epoch():
    h = Harness({"t": 2, "u": 2})
    a = Client(h, "a")
    a.join()
    epoch = h.group().group_epoch
    req = ConsumerGroupHeartbeatRequest(group_id="g", member_id="a", member_epoch=a.epoch,
                                        subscribed_topic_names=["u"], topic_partitions=a._owned_wire())
    a._apply(h.send(req))
    assert h.group().group_epoch == epoch + 1
    run_rounds(h, [a])
    assert set(a.owned) == {tid("u")}


def test_hundred_members_joining_at_once_converge_balanced_never_owned_twice():
    h = Harness({"t": 250, "u": 50})
    cs = [Client(h, f"m{i:03d}", topics=["t", "u"]) for i in range(100)]
    for c in cs:
        assert c.join().error_code == 0
        assert_never_owned_twice(cs)
    run_rounds(h, cs, rounds=10)
    counts = sorted(c.count() for c in cs)
    assert counts[0] == counts[-1] == 3
    g = h.group()
    for c in cs:
        assert {t: set(ps) for t, ps in g.members[c.member_id].assigned.items()} == c.owned
    h.assert_replay_equivalent()


def test_static_member_restart_within_the_session_keeps_its_partitions_and_moves_nobody():
    h = Harness({"t": 6})
    a = Client(h, "a-1", instance_id="ia")
    b = Client(h, "b", instance_id="ib")
    c = Client(h, "c")
    for x in (a, b, c):
        x.join()
    run_rounds(h, [a, b, c])
    before = {x.member_id: set(parts(x)) for x in (a, b, c)}
    epoch = h.group().group_epoch
    assert a.leave(-2).member_epoch == -2
    g = h.group()
    assert g.members["a-1"].member_epoch == -2  # still a member, partitions kept for it
    for _ in range(10):
        h.advance(1000)
        b.heartbeat()
        c.heartbeat()
    # a new process with the same instance id, a new member id
    a2 = Client(h, "a-2", instance_id="ia")
    resp = a2.join()
    assert resp.error_code == 0 and resp.member_id == "a-2"
    assert parts(a2) == before["a-1"]
    assert g.group_epoch == epoch  # nobody moved
    assert "a-1" not in g.members and g.static_members["ia"] == "a-2"
    run_rounds(h, [a2, b, c])
    assert parts(b) == before["b"] and parts(c) == before["c"]
    h.assert_replay_equivalent()


def test_static_instance_still_in_use_is_unreleased():
    h = Harness({"t": 2})
    a = Client(h, "a-1", instance_id="ia")
    a.join()
    resp = Client(h, "a-2", instance_id="ia").join()
    assert resp.error_code == E.UNRELEASED_INSTANCE_ID
    # a heartbeat naming the instance with another member id is fenced
    x = Client(h, "a-3", instance_id="ia")
    x.epoch = 1
    assert x.heartbeat().error_code == E.FENCED_INSTANCE_ID


def test_static_member_not_back_within_the_session_is_fenced():
    h = Harness({"t": 4})
    a = Client(h, "a-1", instance_id="ia")
    b = Client(h, "b")
    a.join()
    b.join()
    run_rounds(h, [a, b])
    a.leave(-2)
    for _ in range(50):
        h.advance(1000)
        b.heartbeat()
    assert "a-1" not in h.group().members and "ia" not in h.group().static_members
    assert parts(b) == {0, 1, 2, 3}
    assert Client(h, "a-2", instance_id="ia").join().error_code == 0


def test_known_member_joining_again_with_epoch_zero_gets_its_assignment_back():
    # KAFKA-19233: after FENCED_MEMBER_EPOCH (or a lost join response) a client rejoins with
    # epoch 0 under the same member id; it is accepted as it is, nothing moves
    h = Harness({"t": 4})
    a, b = Client(h, "a"), Client(h, "b")
    a.join()
    b.join()
    run_rounds(h, [a, b])
    mine, epoch = set(parts(a)), a.epoch
    n = len(h.log)
    resp = a.join()  # it gave up everything it owned
    assert resp.error_code == 0 and resp.member_epoch == epoch and parts(a) == mine
    assert len(h.log) == n
    run_rounds(h, [a, b])
    assert len(parts(a)) == len(parts(b)) == 2
    h.assert_replay_equivalent()


def test_group_max_size():
    h = Harness({"t": 2}, ConsumerGroupConfig(max_size=2))
    assert Client(h, "a").join().error_code == 0
    assert Client(h, "b").join().error_code == 0
    assert Client(h, "c").join().error_code == E.GROUP_MAX_SIZE_REACHED
    assert Client(h, "a").join().error_code == 0  # a member already in may rejoin


def test_range_assignor_chosen_by_the_members():
    h = Harness({"t": 4, "u": 4})
    a = Client(h, "a", topics=["t", "u"], assignor="range")
    b = Client(h, "b", topics=["t", "u"], assignor="range")
    a.join()
    b.join()
    run_rounds(h, [a, b])
    assert parts(a, "t") == parts(a, "u") == {0, 1}
    assert parts(b, "t") == parts(b, "u") == {2, 3}
    assert h.groups.describe(["g"])[0].assignor_name == "range"


def test_describe():
    h = Harness({"t": 2})
    a = Client(h, "a", instance_id="ia")
    a.join()
    [d, missing] = h.groups.describe(["g", "nope"], include_authorized_operations=True)
    assert missing.error_code == E.GROUP_ID_NOT_FOUND
    assert (d.error_code, d.group_state, d.group_epoch, d.assignment_epoch, d.assignor_name) == \
        (0, STABLE, 2, 2, "uniform")
    [m] = d.members
    assert (m.member_id, m.instance_id, m.member_epoch, m.client_id, m.subscribed_topic_names) == \
        ("a", "ia", 2, "c", ["t"])
    assert [(tp.topic_name, tp.partitions) for tp in m.assignment.topic_partitions] == [("t", [0, 1])]
    assert [(tp.topic_name, tp.partitions) for tp in m.target_assignment.topic_partitions] == [("t", [0, 1])]
    assert d.authorized_operations > 0


def test_delete_group_only_when_empty():
    h = Harness({"t": 2})
    a = Client(h, "a")
    a.join()
    assert h.groups.delete_group("g")[1] == E.NON_EMPTY_GROUP
    a.leave()
    recs, err = h.groups.delete_group("g")
    h.log.extend(recs)
    assert err == 0 and "g" not in h.groups.groups
    assert h.replayed().groups == {}
    assert h.groups.list_groups() == []


def test_offset_commit_and_fetch_member_epoch_rules():
    h = Harness({"t": 2})
    a = Client(h, "a")
    a.join()
    g = h.group()
    assert validate_offset_commit(g, "a", 2, 9) == E.NONE
    assert validate_offset_commit(g, "a", 3, 9) == E.STALE_MEMBER_EPOCH  # newer than its epoch
    assert validate_offset_commit(g, "a", 1, 9) == OLDER_MEMBER_EPOCH  # older: decided per partition
    assert not commit_partition_ok(g, "a", 1, "t", 0)  # it got t-0 at epoch 2, after epoch 1
    assert commit_partition_ok(g, "a", 2, "t", 0) and not commit_partition_ok(g, "a", 2, "t", 7)
    assert validate_offset_commit(g, "x", 2, 9) == E.UNKNOWN_MEMBER_ID
    assert validate_offset_commit(g, "a", 2, 8) == E.UNSUPPORTED_VERSION
    assert validate_offset_commit(g, "", -1, 9) == E.UNKNOWN_MEMBER_ID  # members present
    assert validate_offset_commit(ConsumerGroup("e"), "", -1, 2) == E.NONE  # empty: admin/standalone
    assert validate_offset_fetch(g, None, -1) == E.NONE
    assert validate_offset_fetch(g, "a", 2) == E.NONE
    assert validate_offset_fetch(g, "a", 3) == E.STALE_MEMBER_EPOCH
    assert validate_offset_fetch(g, "x", 2) == E.UNKNOWN_MEMBER_ID


def test_group_state_table_is_enforced():
    g = ConsumerGroup("g")
    g.state = "Dead"
    g.members = {}
    with pytest.raises(IllegalStateTransition):
        g.settle()  # Dead is final
    g2 = ConsumerGroup("g2")
    g2.state = STABLE
    with pytest.raises(IllegalStateTransition):
        g2.mark_dead()  # only an Empty group may die


def test_owning_a_partition_twice_is_refused_by_the_model():
    g = ConsumerGroup("g")
    g.apply_current_assignment("a", 1, 0, 0, {T: frozenset({0})}, {})
    with pytest.raises(IllegalStateTransition):
        g.apply_current_assignment("b", 1, 0, 0, {T: frozenset({0})}, {})


def test_static_member_back_under_the_same_member_id_keeps_its_partitions():
    h = Harness({"t": 4})
    a = Client(h, "a", instance_id="ia")
    b = Client(h, "b")
    a.join()
    b.join()
    run_rounds(h, [a, b])
    mine = set(parts(a))
    epoch = h.group().group_epoch
    a.leave(-2)
    assert a.join().error_code == 0
    assert parts(a) == mine and h.group().group_epoch == epoch
    h.assert_replay_equivalent()


def test_null_fields_mean_unchanged_and_full_requests_get_the_assignment():
    h = Harness({"t": 2, "u": 2})
    a = Client(h, "a", topics=["t"], assignor="range")
    a.join()
    m = h.group().members["a"]
    # a heartbeat with every optional field null changes nothing and carries no assignment
    resp = h.send(ConsumerGroupHeartbeatRequest(group_id="g", member_id="a", member_epoch=a.epoch))
    assert resp.error_code == 0 and resp.assignment is None
    assert (m.subscribed_topic_names, m.server_assignor, m.rebalance_timeout_ms) == (("t",), "range", 30000)
    # a full request (rebalance timeout, subscription and owned partitions all set) gets it even unchanged
    resp = h.send(ConsumerGroupHeartbeatRequest(
        group_id="g", member_id="a", member_epoch=a.epoch, rebalance_timeout_ms=30000,
        subscribed_topic_names=["t"], topic_partitions=a._owned_wire()))
    assert resp.assignment is not None
    assert [(tp.topic_id, tp.partitions) for tp in resp.assignment.topic_partitions] == [(T, [0, 1])]
    # an empty list is a value: it unsubscribes from everything
    epoch = h.group().group_epoch
    a._apply(h.send(ConsumerGroupHeartbeatRequest(group_id="g", member_id="a", member_epoch=a.epoch,
                                                  subscribed_topic_names=[], topic_partitions=a._owned_wire())))
    m = h.group().members["a"]
    assert m.subscribed_topic_names == () and h.group().group_epoch == epoch + 1
    a.heartbeat()
    assert a.owned == {}
    # a changed rebalance timeout is written (a member metadata record), without an epoch bump
    n = len(h.log)
    h.send(ConsumerGroupHeartbeatRequest(group_id="g", member_id="a", member_epoch=a.epoch,
                                         rebalance_timeout_ms=1234))
    assert h.group().members["a"].rebalance_timeout_ms == 1234 and len(h.log) == n + 1
    h.assert_replay_equivalent()


def test_after_replay_timers_are_scheduled_again():
    h = Harness({"t": 4})
    a, b = Client(h, "a", rebalance_timeout_ms=10_000), Client(h, "b")
    a.join()
    b.join()
    a.heartbeat()  # a is revoking
    fresh = h.replayed()  # a restart: memory from the log, timers from on_loaded(now)
    assert fresh.groups["g"].members["a"].state == UNREVOKED_PARTITIONS
    recs = fresh.on_timers(h.now + 10_000, 0)  # a's rebalance timeout, counted from the restart
    assert recs and "a" not in fresh.groups["g"].members
    recs = fresh.on_timers(h.now + 45_000, 0)  # then b's session
    assert recs and not fresh.groups["g"].members and fresh.groups["g"].state == EMPTY


def test_member_in_an_unknown_state_is_fenced_unless_it_owns_nothing():
    h = Harness({"t": 2})
    a = Client(h, "a")
    a.join()
    m = h.group().members["a"]
    # a newer coordinator wrote a state byte this one does not know
    key = cr.current_assignment_key("g", "a")
    value = cr.current_assignment_value(m.member_epoch, m.previous_member_epoch, 42, m.assigned, {})
    h.groups.replay(key, value)
    h.log.append((key, value))
    assert a.heartbeat().error_code == E.FENCED_MEMBER_EPOCH
    resp = a.join()  # it gives up everything and rejoins under its id (epoch 0)
    assert resp.error_code == 0 and parts(a) == {0, 1}
    assert h.group().members["a"].state == MEMBER_STABLE
    h.assert_replay_equivalent()


def test_assignment_interval_runs_the_assignor_once_for_joins_arriving_together():
    """group.consumer.assignment.interval.ms (KIP-1263): the first join runs the assignor at once;
    joins within the interval bump the group epoch only (the group is Assigning, a new member gets
    the target it has: nothing, at the assignment epoch); the first heartbeat after the interval
    runs it once for all of them, and the group converges as without the interval."""
    h = Harness({"t": 6}, ConsumerGroupConfig(assignment_interval_ms=1000))
    a = Client(h, "a")
    assert a.join().error_code == 0 and parts(a) == set(range(6))
    g = h.group()
    assert (g.group_epoch, g.assignment_epoch, g.state) == (2, 2, STABLE)
    others = [Client(h, f"m{i}") for i in range(5)]
    h.advance(10)
    for c in others:
        resp = c.join()
        assert resp.error_code == 0 and resp.member_epoch == 2 and parts(c) == set()
    g = h.group()
    assert (g.group_epoch, g.assignment_epoch, g.state) == (7, 2, ASSIGNING)
    targets = sum(1 for k, _ in h.log if cr.decode(k, None)[0] == cr.TARGET_MEMBER)
    # a heartbeat within the interval: no run, a keeps everything
    h.advance(500)
    assert a.heartbeat().error_code == 0 and parts(a) == set(range(6))
    assert h.group().assignment_epoch == 2
    assert sum(1 for k, _ in h.log if cr.decode(k, None)[0] == cr.TARGET_MEMBER) == targets
    # after the interval: one run at the group's epoch, for all six
    h.advance(500)
    a.heartbeat()
    g = h.group()
    assert g.assignment_epoch == g.group_epoch == 7
    assert sorted(len(t.get(T, ())) for t in g.target.values()) == [1] * 6
    clients = [a, *others]
    run_rounds(h, clients, rounds=5, step_ms=100)
    assert sorted(c.count() for c in clients) == [1] * 6
    assert_never_owned_twice(clients)
    h.assert_replay_equivalent()


def test_assignment_interval_is_checked():
    with pytest.raises(ValueError, match="assignment.interval.ms"):
        ConsumerGroupConfig(assignment_interval_ms=-1)
    assert ConsumerGroupConfig().assignment_interval_ms == 0  # every heartbeat that needs it runs it


def test_group_state_and_subscriptions_are_counted_not_walked():
    """Stable / Reconciling and the subscribed topics come from counts kept as records apply:
    they follow members joining, reconciling and leaving."""
    h = Harness({"t": 4, "u": 2})
    a, b = Client(h, "a", topics=["t"]), Client(h, "b", topics=["t", "u"], assignor="range")
    a.join()
    g = h.group()
    assert g.subscribed_topic_names() == {"t"} and g.preferred_assignor("uniform") == "uniform"
    b.join()
    g = h.group()
    assert g.subscribed_topic_names() == {"t", "u"} and g.preferred_assignor("uniform") == "range"
    assert g.computed_state() == RECONCILING
    run_rounds(h, [a, b], rounds=5, step_ms=100)
    assert h.group().computed_state() == STABLE
    b.leave()
    g = h.group()
    assert g.subscribed_topic_names() == {"t"} and g.preferred_assignor("uniform") == "uniform"
    a.leave()
    g = h.group()
    assert g.subscribed_topic_names() == set() and g.computed_state() == EMPTY


def test_a_member_waiting_for_released_partitions_is_asked_back_sooner():
    """group_consumer_pending_heartbeat_interval_ms (herd's own): b waits at the new epoch for
    partitions a still owns (UNRELEASED_PARTITIONS) and is told 1 s, not 5 s, so it picks them up
    about as soon as a has revoked them; a, told to revoke, and every member with nothing to wait
    for get the heartbeat interval; 0 gives Kafka's plain interval to everyone."""
    h = Harness({"t": 4})
    a, b = Client(h, "a"), Client(h, "b")
    assert a.join().heartbeat_interval_ms == 5000
    resp = b.join()
    assert h.group().members["b"].state == UNRELEASED_PARTITIONS and resp.heartbeat_interval_ms == 1000
    assert a.heartbeat().heartbeat_interval_ms == 5000  # told to revoke: its own answer follows at once
    assert b.heartbeat().heartbeat_interval_ms == 1000  # still waiting: a has not acknowledged yet
    assert a.heartbeat().heartbeat_interval_ms == 5000  # revoked
    resp = b.heartbeat()
    assert len(parts(b)) == 2 and h.group().members["b"].state == MEMBER_STABLE
    assert resp.heartbeat_interval_ms == 5000

    h = Harness({"t": 4}, ConsumerGroupConfig(pending_heartbeat_interval_ms=0))
    a, b = Client(h, "a"), Client(h, "b")
    a.join()
    resp = b.join()
    assert h.group().members["b"].state == UNRELEASED_PARTITIONS and resp.heartbeat_interval_ms == 5000


def test_a_join_held_back_by_the_assignment_interval_is_asked_back_sooner():
    """A member that joins while the assignor is held back (assignment interval) gets nothing yet
    and is asked back after the pending interval (never longer than the heartbeat interval); the
    members already assigned are not; once the assignor ran, the plain interval again."""
    h = Harness({"t": 6}, ConsumerGroupConfig(assignment_interval_ms=1000, pending_heartbeat_interval_ms=800))
    a = Client(h, "a")
    assert a.join().heartbeat_interval_ms == 5000  # the first join runs the assignor at once
    h.advance(10)
    b = Client(h, "b")
    resp = b.join()
    assert parts(b) == set() and resp.heartbeat_interval_ms == 800
    assert a.heartbeat().heartbeat_interval_ms == 5000  # not waiting for anything of its own
    assert b.heartbeat().heartbeat_interval_ms == 800  # the assignor has not run yet
    h.advance(1000)
    a.heartbeat()  # runs the assignor: a must revoke 3, b waits for them
    g = h.group()
    assert g.assignment_epoch == g.group_epoch
    assert b.heartbeat().heartbeat_interval_ms == 800 and g.members["b"].state == UNRELEASED_PARTITIONS
    a.heartbeat()
    resp = b.heartbeat()
    assert len(parts(b)) == 3 and resp.heartbeat_interval_ms == 5000
    # a longer pending interval than the heartbeat interval is never told
    h = Harness({"t": 6}, ConsumerGroupConfig(assignment_interval_ms=1000, pending_heartbeat_interval_ms=9000))
    Client(h, "a").join()
    assert Client(h, "b").join().heartbeat_interval_ms == 5000


def test_pending_heartbeat_interval_is_checked():
    with pytest.raises(ValueError, match="pending.heartbeat.interval.ms"):
        ConsumerGroupConfig(pending_heartbeat_interval_ms=-1)
    assert ConsumerGroupConfig().pending_heartbeat_interval_ms == 1000
