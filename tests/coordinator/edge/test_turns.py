"""Rebalance requests yield to the rest when a loop turn is long (coordinator/edge/turns.py,
issue 31 item 4): the budget per turn, heartbeats never waiting, FIFO resumption, one request let
through per resumed connection."""
import struct

from coordinator.edge.turns import Turns


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Conn:
    def __init__(self, name, log):
        self.name = name
        self.turn_waiting = False
        self.turn_pass = False
        self.rejoin_likely = True
        self.log = log

    def resume_turn(self):
        self.log.append(self.name)


def frame(api_key: int) -> bytes:
    return struct.pack(">hhi", api_key, 0, 1) + b"\x00\x00"


JOIN, SYNC, LEAVE, HEARTBEAT, COMMIT = 11, 14, 13, 12, 8


def make():
    scheduled = []
    clock = Clock()
    return Turns(scheduled.append, budget=0.008, clock=clock), clock, scheduled


def test_rebalance_requests_wait_once_the_turns_budget_is_spent_heartbeats_never():
    turns, clock, scheduled = make()
    log = []
    a, b, c, hb = (Conn(n, log) for n in "abch")
    assert not turns.defers(a, frame(JOIN))  # opens the turn
    assert len(scheduled) == 1  # its end is scheduled
    clock.t = 0.005
    assert not turns.defers(b, frame(SYNC))  # within the budget
    clock.t = 0.009
    assert turns.defers(b, frame(JOIN)) and b.turn_waiting
    assert turns.defers(c, frame(LEAVE))
    assert not turns.defers(hb, frame(HEARTBEAT)) and not turns.defers(hb, frame(COMMIT))
    assert turns.defers(b, frame(JOIN))  # still waiting: its later requests too
    assert list(turns.waiting) == [b, c] and turns.deferred_total == 2


def test_the_next_turn_resumes_waiting_connections_in_order_within_its_budget():
    turns, clock, scheduled = make()
    log = []
    conns = [Conn(str(i), log) for i in range(4)]
    turns.defers(conns[0], frame(JOIN))
    clock.t = 0.010
    for c in conns[1:]:
        assert turns.defers(c, frame(JOIN))

    def slow_resume(self):
        log.append(self.name)
        clock.t += 0.005  # each resumed request costs 5 ms

    for c in conns:
        c.resume_turn = slow_resume.__get__(c)
    end = scheduled.pop()
    end()  # the next loop turn: 8 ms for the waiting ones
    assert log == ["1", "2"]
    assert conns[1].turn_pass and not conns[1].turn_waiting
    assert list(turns.waiting) == [conns[3]]
    # a resumed connection's waiting request goes through once, whatever the budget
    assert not turns.defers(conns[1], frame(JOIN)) and not conns[1].turn_pass
    late = Conn("late", log)
    assert turns.defers(late, frame(JOIN))  # the budget of this turn is spent: it waits
    assert list(turns.waiting) == [conns[3], late]
    late.resume_turn = slow_resume.__get__(late)
    scheduled.pop()()  # the turn after
    assert log[-2:] == ["3", "late"] and not turns.waiting


def test_a_short_or_raw_frame_is_never_deferred():
    turns, clock, _ = make()
    c = Conn("x", [])
    turns.defers(c, frame(JOIN))
    clock.t = 1.0
    assert not turns.defers(c, b"\x00")
    assert turns.defers(c, frame(JOIN))


def cg_frame(epoch: int, owned=None) -> bytes:
    from protocol import messages as m
    from protocol.headers import encode_request_header

    req = m.ConsumerGroupHeartbeatRequest(group_id="g", member_id="m1", member_epoch=epoch, topic_partitions=owned)
    out = bytearray()
    encode_request_header(out, req.API_KEY, 1, 3, "client")
    req.encode_into(out, 1)
    return bytes(out)


def test_a_consumer_heartbeat_waits_unless_it_is_a_member_s_steady_one():
    from protocol import messages as m

    turns, clock, _scheduled = make()
    log = []
    a, b, c, d, e = (Conn(n, log) for n in "abcde")
    assert not turns.defers(a, frame(JOIN))  # opens the turn
    clock.t = 0.009  # spent
    assert not turns.defers(a, cg_frame(5))  # a member's steady heartbeat: never waits
    assert turns.defers(b, cg_frame(0))  # a join
    assert turns.defers(c, cg_frame(-1))  # a leave
    owned = [m.ConsumerGroupHeartbeatRequestTopicPartitions(topic_id=b"\x01" * 16, partitions=[0, 1])]
    assert turns.defers(d, cg_frame(7, owned))  # a member acknowledging its assignment
    assert not turns.defers(e, cg_frame(7)) and not e.turn_waiting
    assert list(turns.waiting) == [b, c, d]


def test_a_request_found_to_be_rebalance_work_late_waits_only_once_the_budget_is_spent():
    turns, clock, _scheduled = make()
    log = []
    a, b = Conn("a", log), Conn("b", log)
    assert not turns.defers_late(a)  # opens the turn: within the budget, handled now
    clock.t = 0.009
    assert turns.defers_late(b) and b.turn_waiting and list(turns.waiting) == [b]
    assert turns.deferred_total == 1


def test_a_burst_of_deferred_reads_calls_on_burst_once_per_turn():
    turns, clock, scheduled = make()
    turns.hold_back_after = 3
    bursts = []
    turns.on_burst = lambda: bursts.append(turns.deferred_reads)
    turns.defers(Conn("first", []), frame(JOIN))  # opens the turn
    clock.t = 0.010
    for i in range(5):
        assert turns.defers(Conn(str(i), []), frame(JOIN))
        turns.read_deferred()
    assert bursts == [3]  # at the third, not again at the fourth and fifth
    scheduled.pop()()  # the next turn counts afresh
    assert turns.deferred_reads == 0
    for _ in range(3):
        turns.read_deferred()
    assert bursts == [3, 3]


def test_what_a_connection_sent_last_says_whether_a_rejoin_is_likely():
    turns, _clock, _scheduled = make()
    c = Conn("c", [])
    assert turns.defers(c, frame(COMMIT)) is False and c.rejoin_likely is False
    turns.defers(c, frame(JOIN))
    assert c.rejoin_likely is True
    turns.defers(c, frame(COMMIT))
    assert c.rejoin_likely is False
    turns.defers(c, frame(SYNC))
    assert c.rejoin_likely is True
    turns.defers(c, frame(3))  # Metadata, FindCoordinator, ...: they say nothing either way
    assert c.rejoin_likely is True


def test_after_turn_is_called_at_the_end_of_a_turn_of_a_burst_only_and_its_error_keeps_nobody_waiting():
    turns, clock, scheduled = make()
    ends = []

    def after():
        ends.append(clock.t)
        raise RuntimeError("a bug in the hook")

    turns.after_turn = after
    log = []
    a, b, c, hb = (Conn(n, log) for n in "abch")
    assert not turns.defers(hb, frame(HEARTBEAT))  # a heartbeat opens no turn
    assert scheduled == []
    assert not turns.defers(a, frame(JOIN))
    assert not turns.defers(b, frame(SYNC))
    clock.t = 0.004
    scheduled.pop()()  # an ordinary turn (within its budget) ends: no hook
    assert ends == []
    assert not turns.defers(a, frame(JOIN))  # the next turn
    clock.t = 0.020
    assert turns.defers(c, frame(JOIN))  # over the budget: c waits
    scheduled.pop()()  # the burst's turn ends: the hook, and c still gets its turn despite its error
    assert ends == [0.020] and log == ["c"]
