"""The runtime's share of a big group's slices (issue 31 item 4): what the core leaves for later
(Result.later) runs one slice per loop turn, after what was already waiting for the loop; and the
answers released by one durable write leave as one fan-out, RELEASE_SLICE per turn, however many
results waited for it."""
from __future__ import annotations

import asyncio

from coordinator import runtime as RT
from coordinator.core.result import Result
from coordinator.core.versions import OFFSET_COMMIT
from tests.coordinator.test_runtime_shards import FakeStore, Token, commit, group_in, runtime_with


class HeldStore(FakeStore):
    """Settles nothing in flush(): the test says when the writes are durable (as the log's
    writer thread would, through the listener and the runtime's drain)."""

    def flush(self):
        return []

    def durable(self, loop):
        staged, self.staged = self.staged, []
        self.listener([(sid, seq, None) for sid, seq in staged])


async def _loaded(store) -> RT.Runtime:
    rt = runtime_with(store)
    rt.start(asyncio.get_running_loop())
    for gate in store.gates.values():
        gate.set()
    await rt.load_owned()
    return rt


async def test_later_slices_run_in_later_loop_turns_after_what_was_already_waiting():
    rt = await _loaded(FakeStore(owned=list(range(4))))
    order = []

    def slice_(k):
        def more(now, wall):
            order.append(f"slice{k}")
            res = Result()
            if k < 3:
                res.defer(slice_(k + 1))
            return res
        return more

    first = Result()
    first.defer(slice_(1))
    asyncio.get_running_loop().call_soon(order.append, "before")
    rt.apply(first)
    assert order == []  # nothing of it ran inside apply
    asyncio.get_running_loop().call_soon(order.append, "after")
    await asyncio.sleep(0)
    assert order == ["before", "slice1", "after"]  # one slice per turn
    for _ in range(3):
        await asyncio.sleep(0)
    assert order == ["before", "slice1", "after", "slice2", "slice3"]


async def test_answers_waiting_for_one_write_leave_a_slice_per_turn_however_many_results_waited():
    store = HeldStore(owned=list(range(4)))
    rt = await _loaded(store)
    group = group_in(0)
    tokens = []
    for _ in range(RT.RELEASE_SLICE * 2 + 10):  # each commit's answer waits for its write
        t = Token(OFFSET_COMMIT, 8, commit(group))
        rt.dispatch(t, OFFSET_COMMIT, 8, t.request, "cli", "/127.0.0.1")
        tokens.append(t)
    await asyncio.sleep(0)  # the runtime's flush: all staged, nothing durable yet
    assert not any(t.responses for t in tokens)
    store.durable(asyncio.get_running_loop())
    await asyncio.sleep(0)  # the drain: the first slice
    answered = [t for t in tokens if t.responses]
    assert len(answered) == RT.RELEASE_SLICE and answered == tokens[:RT.RELEASE_SLICE]  # in order
    await asyncio.sleep(0)
    assert sum(1 for t in tokens if t.responses) == 2 * RT.RELEASE_SLICE
    await asyncio.sleep(0)
    assert all(len(t.responses) == 1 and t.responses[0].topics[0].partitions[0].error_code == 0 for t in tokens)


class _Tok:
    def __init__(self):
        self.responses = []

    def reply(self, response):
        self.responses.append(response)


async def test_big_fan_outs_share_one_slice_per_turn_oldest_first():
    rt = await _loaded(FakeStore(owned=list(range(4))))
    a = [(_Tok(), "a") for _ in range(RT.RELEASE_SLICE + 10)]
    b = [(_Tok(), "b") for _ in range(RT.RELEASE_SLICE * 2)]
    rt.release(a)  # the first slice now, 10 left
    rt.release(b)  # behind a
    sent = lambda replies: sum(1 for t, _ in replies if t.responses)  # noqa: E731
    assert (sent(a), sent(b)) == (RT.RELEASE_SLICE, 0)
    await asyncio.sleep(0)
    assert (sent(a), sent(b)) == (RT.RELEASE_SLICE + 10, RT.RELEASE_SLICE - 10)  # one slice for both
    await asyncio.sleep(0)
    assert sent(b) == 2 * RT.RELEASE_SLICE - 10
    await asyncio.sleep(0)
    assert sent(b) == 2 * RT.RELEASE_SLICE and all(len(t.responses) == 1 for t, _ in a + b)
    small = [(_Tok(), "c") for _ in range(3)]
    rt.release(small)  # a small one leaves at once
    assert sent(small) == 3
