"""The pure decisions of membership: even shares, moves on join/leave, self-fencing by the manual
clock before the database's lease can lapse."""
import pytest
from hypothesis import given
from hypothesis import strategies as st

from coordinator.clock import ManualClock
from coordinator.cluster.placement import LeaseTable, LeaseView, Plan, plan, targets


def test_targets_are_even_and_cover_every_shard():
    assert targets([3, 1, 2], 50) == {1: 17, 2: 17, 3: 16}
    assert targets([7], 50) == {7: 50}
    assert targets([], 50) == {}
    assert targets([1, 2, 3, 4], 2) == {1: 1, 2: 1, 3: 0, 4: 0}


def converge(nodes, n, leases=None, rounds=20):
    """Every node plans and acts in turn (releases free the row, acquisitions take free rows) until
    nothing moves; -> shard -> owner."""
    owner = dict(leases or {})
    for _ in range(rounds):
        moved = False
        for node in nodes:
            view = {s: LeaseView(owner.get(s), owner.get(s) is not None) for s in range(n)}
            p = plan(node, nodes, view, n)
            for s in p.release:
                assert owner[s] == node
                owner[s] = None
                moved = True
            for s in p.acquire:
                assert owner.get(s) is None  # plan only offers free shards
                owner[s] = node
                moved = True
        if not moved:
            return owner
    raise AssertionError("did not converge")


def counts(owner):
    out = {}
    for o in owner.values():
        if o is not None:
            out[o] = out.get(o, 0) + 1
    return out


def test_join_and_leave_move_only_the_excess():
    n = 12
    one = converge([1], n)
    assert counts(one) == {1: 12}
    two = converge([1, 2], n, one)
    assert counts(two) == {1: 6, 2: 6}
    three = converge([1, 2, 3], n, two)
    assert counts(three) == {1: 4, 2: 4, 3: 4}
    moved = sum(1 for s in range(n) if three[s] != two[s])
    assert moved == 4  # only node 3's new share moved
    # node 2 dies: its leases lapse (the view shows them not live), the others share them
    lapsed = {s: (o if o != 2 else None) for s, o in three.items()}
    after = converge([1, 3], n, lapsed)
    assert counts(after) == {1: 6, 3: 6}
    assert all(after[s] == three[s] for s in range(n) if three[s] != 2)  # survivors kept theirs


def test_a_dead_nodes_live_lease_is_not_taken_before_it_lapses():
    view = {0: LeaseView(2, True), 1: LeaseView(None, False)}
    assert plan(1, [1], view, 2) == Plan(acquire=(1,))  # shard 0 still live for node 2: wait
    view[0] = LeaseView(2, False)
    assert plan(1, [1], view, 2) == Plan(acquire=(0, 1))


def test_a_node_not_live_holds_nothing():
    view = {0: LeaseView(1, True), 1: LeaseView(1, True)}
    assert plan(1, [2], view, 2) == Plan(release=(0, 1))


def test_nodes_taking_at_once_start_at_different_points():
    view = {s: LeaseView(None, False) for s in range(12)}
    picks = [set(plan(node, [1, 2, 3], view, 12).acquire) for node in (1, 2, 3)]
    assert all(len(p) == 4 for p in picks)
    assert not (picks[0] & picks[1] or picks[1] & picks[2] or picks[0] & picks[2])


@given(st.lists(st.integers(0, 20), min_size=1, max_size=6, unique=True), st.integers(1, 64))
def test_any_membership_converges_to_even_disjoint_shares(nodes, n):
    owner = converge(nodes, n)
    share = targets(nodes, n)
    assert counts(owner) == {k: v for k, v in share.items() if v}
    assert all(owner[s] is not None for s in range(n))


# ---- self-fencing by the manual clock --------------------------------------------------------------

def test_a_lease_stops_serving_before_it_can_lapse():
    clock = ManualClock()
    table = LeaseTable(10_000)  # margin 2000, renew every 3333
    assert (table.margin_ms, table.renew_every_ms) == (2000, 3333)
    sent = clock.monotonic_ms()
    clock.advance(40)  # the database executed the acquisition 40 ms after we sent it
    db_expiry = clock.monotonic_ms() + 10_000
    table.granted(4, 7, sent)
    assert table.valid(4, clock.monotonic_ms())
    clock.advance(7_959)
    assert table.valid(4, clock.monotonic_ms()) and table.expired(clock.monotonic_ms()) == []
    clock.advance(1)  # sent + 8000: no renewal got through
    assert not table.valid(4, clock.monotonic_ms())
    assert table.expired(clock.monotonic_ms()) == [4]
    assert clock.monotonic_ms() <= db_expiry - 2000  # stopped a whole margin before the lapse
    assert table.held() == {} and table.next_deadline() is None


def test_renewal_moves_the_deadline_from_the_time_it_was_sent():
    clock = ManualClock()
    table = LeaseTable(1000, margin_ms=200, renew_every_ms=300)
    table.granted(1, 3, clock.monotonic_ms())
    table.granted(2, 5, clock.monotonic_ms())
    clock.advance(300)
    sent = clock.monotonic_ms()
    clock.advance(450)  # a slow round trip: the deadline counts from when it was sent
    table.renewed([1], sent)
    assert table.until(1) == sent + 800 and table.until(2) == 800
    assert table.next_deadline() == 800
    clock.advance(50)  # t = 800
    assert table.expired(clock.monotonic_ms()) == [2]
    assert table.held() == {1: 3}
    table.renewed([1], 0)  # a late answer to an older renewal never shortens the deadline
    assert table.until(1) == sent + 800


def test_a_paused_node_finds_every_deadline_passed_on_waking():
    clock = ManualClock()
    table = LeaseTable(1000)
    for s in range(3):
        table.granted(s, 1, clock.monotonic_ms())
    clock.advance(60_000)  # SIGSTOP for a minute
    assert [s for s in range(3) if table.valid(s, clock.monotonic_ms())] == []
    assert table.expired(clock.monotonic_ms()) == [0, 1, 2]


@pytest.mark.parametrize("kw", [{"margin_ms": 0}, {"margin_ms": 1000}, {"renew_every_ms": 800}])
def test_bad_lease_timings_are_refused(kw):
    with pytest.raises(ValueError):
        LeaseTable(1000, **kw)
