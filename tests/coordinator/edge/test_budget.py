"""max_buffered_bytes' accounting (coordinator.edge.budget): who pauses, who resumes, and that
connections paused with partial reads can never deadlock one another."""
from coordinator.edge.budget import MemoryBudget


class Decoder:
    def __init__(self):
        self.reserved = 0
        self.buffered = 0


class Conn:
    """What the budget sees of a connection; reports like Connection._account."""

    def __init__(self, budget):
        self.budget = budget
        self.decoder = Decoder()
        self.memory_paused = False
        self.memory_granted = False
        self.closed = False
        self.accounted = 0

    def account(self):
        new = self.decoder.buffered if self.memory_paused else self.decoder.reserved
        delta, self.accounted = new - self.accounted, new
        if delta:
            self.budget.change(self, delta)

    def memory_pause(self):
        self.memory_paused = True
        self.account()

    def memory_resume(self):
        self.memory_paused = False
        self.account()

    def announce(self, size, first_read):
        """A frame's size prefix and the first ``first_read`` bytes arrive."""
        self.decoder.reserved, self.decoder.buffered = size, first_read
        self.memory_granted = False
        self.account()

    def complete(self):
        """The frame is read whole and handled: nothing held."""
        self.decoder.reserved = self.decoder.buffered = 0
        self.memory_granted = False
        self.account()


def make(limit):
    soon = []
    return MemoryBudget(limit, soon.append), soon


def run(soon):
    while soon:
        soon.pop(0)()


MiB = 1 << 20


def test_a_frame_that_fits_is_read_and_one_over_the_limit_waits():
    b, soon = make(3 * MiB // 2)
    a, c = Conn(b), Conn(b)
    a.announce(MiB, 64 << 10)
    assert not a.memory_paused and b.total == MiB
    c.announce(MiB, 64 << 10)
    assert c.memory_paused and b.pauses == 1
    assert b.total == MiB + (64 << 10)  # the paused one counts what it read, not what it announced
    a.complete()
    run(soon)
    assert not c.memory_paused and b.total == MiB and b.forced == 0


def test_paused_partial_reads_over_the_limit_on_their_own_do_not_deadlock():
    """The CI failure: 8 clients, 1 MiB frames, a 1.5 MiB budget; the 7 waiting ones had read 256 KiB
    each (1.75 MiB together) before they stopped, so no frame could ever fit again."""
    b, soon = make(3 * MiB // 2)
    conns = [Conn(b) for _ in range(8)]
    conns[0].announce(MiB, 256 << 10)
    for c in conns[1:]:
        c.announce(MiB, 256 << 10)
        assert c.memory_paused
    answered = 0
    for _ in range(20):
        active = [c for c in conns if c.decoder.reserved and not c.memory_paused]
        if not active:
            break
        assert len(active) == 1  # one frame over the limit at a time, never more
        active[0].complete()
        answered += 1
        run(soon)
    assert answered == 8
    assert b.total == 0 and not b.waiting
    assert b.forced >= 1


def test_no_forced_grant_while_someone_else_will_release():
    b, soon = make(MiB)
    holder, w1, w2 = Conn(b), Conn(b), Conn(b)
    holder.announce(MiB // 2, 1)
    w1.announce(MiB, 300 << 10)
    w2.announce(MiB, 300 << 10)
    assert w1.memory_paused and w2.memory_paused
    w1.decoder.buffered = 0  # something else moved: a release anywhere wakes the line
    w1.accounted, b.total = 0, b.total - (300 << 10)
    b.change(w1, 0)
    run(soon)
    assert w1.memory_paused and b.forced == 0  # the holder still holds: no grant over the limit
    holder.complete()
    run(soon)
    assert not w1.memory_paused  # w1 is first in line and now the only one not paused
    assert w2.memory_paused  # one at a time
    w1.complete()
    run(soon)
    assert not w2.memory_paused


def test_a_closed_waiter_is_skipped():
    b, soon = make(MiB)
    a, gone, c = Conn(b), Conn(b), Conn(b)
    a.announce(MiB, 1)
    gone.announce(MiB, 1)
    c.announce(MiB // 2, 1)
    assert gone.memory_paused and c.memory_paused
    gone.closed = True
    b.change(gone, -gone.accounted)
    a.complete()
    run(soon)
    assert not c.memory_paused and not b.waiting
