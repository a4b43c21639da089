"""The load tool behind bench/scale.py and bench/server_cost.py: its framing, its pre-encoded
requests, and (against a real daemon) the pipelined join, heartbeats and bursts. Behaviour only:
no assertion here depends on how fast anything runs."""

from __future__ import annotations

import asyncio
import struct

import pytest

from bench import loadgen as L
from protocol import messages as m
from protocol.headers import decode_request_header, encode_response_header


class FakeTransport:
    def __init__(self):
        self.written = []
        self.closed = False

    def get_extra_info(self, name):
        return None

    def write(self, data):
        self.written.append(bytes(data))

    def abort(self):
        self.closed = True

    def close(self):
        self.closed = True


def answer(cid: int, body: bytes = b"\x00" * 8) -> bytes:
    payload = struct.pack(">i", cid) + body
    return struct.pack(">i", len(payload)) + payload


async def test_pipeconn_splits_answers_across_reads_for_a_handler():
    conn = L.PipeConn("t")
    conn.connection_made(FakeTransport())
    seen = []
    conn.handler = lambda data, spans, arrived: seen.extend(struct.unpack_from(">i", data, s)[0] for s, _ in spans)
    stream = b"".join(answer(c) for c in range(1, 8))
    for cut in (3, 5, 17, 30, 31, 60):  # arbitrary read boundaries, inside prefixes and bodies
        conn.data_received(stream[:cut])
        stream = stream[cut:]
    conn.data_received(stream)
    assert seen == list(range(1, 8))
    assert conn.buf == b""


async def test_pipeconn_call_many_resolves_once_all_answers_are_in():
    conn = L.PipeConn("t")
    t = FakeTransport()
    conn.connection_made(t)
    task = asyncio.ensure_future(conn.call_many([b"a", b"b", b"c"]))
    await asyncio.sleep(0)
    assert t.written == [b"abc"]  # one write for the three frames
    conn.data_received(answer(1) + answer(2)[:6])
    await asyncio.sleep(0)
    assert not task.done()
    conn.data_received(answer(2)[6:] + answer(3))
    got, sent, arrived = await task
    assert [struct.unpack_from(">i", g)[0] for g in got] == [1, 2, 3]
    assert arrived >= sent


async def test_pipeconn_lost_connection_fails_waiters_and_tells_the_owner():
    conn = L.PipeConn("t")
    conn.connection_made(FakeTransport())
    lost = []
    conn.on_lost = lost.append
    task = asyncio.ensure_future(conn.call_many([b"x"]))
    await asyncio.sleep(0)
    conn.connection_lost(None)
    with pytest.raises(L.ConnectionLost):
        await task
    assert lost == ["closed by server"]


async def test_pipeconn_rejects_a_negative_frame_size():
    conn = L.PipeConn("t")
    t = FakeTransport()
    conn.connection_made(t)
    conn.handler = lambda *a: pytest.fail("no frame expected")
    conn.data_received(struct.pack(">i", -5) + b"xxxx")
    assert t.closed and conn.lost


def worker(members: int = 3) -> L.Worker:
    cfg = dict(L.DEFAULTS, proc=0, bootstrap="127.0.0.1:1", group_ids=["g-1"], hb_conns=1, members=members)
    return L.Worker(cfg, None)


def test_stamped_reads_leave_out_how_long_the_reader_was_busy_and_see_the_server_close():
    """A connection read with the kernel's receive timestamps (kernel_stamps): an answer that
    arrives while the reading process is busy for 200 ms counts 200 ms later as seen by it, but not
    at the kernel; answers still come in order; the server closing is seen as a lost connection."""
    import socket
    import time

    import uvloop

    async def main():
        loop = asyncio.get_running_loop()
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        host, port = srv.getsockname()
        [conn] = await L.open_conns(host, port, 1, "t")
        peer, _ = srv.accept()
        try:
            assert conn.stamp_reads()
            fut = asyncio.ensure_future(conn.call_many([b"\x00\x00\x00\x04abcd"]))
            await asyncio.sleep(0.05)  # sent
            peer.sendall(answer(1) + answer(2)[:5])  # one answer and the start of the next
            time.sleep(0.2)  # this process busy: the answer waits in the kernel
            got, sent, arrived = await fut
            assert got == [answer(1)[4:]]
            assert arrived - sent >= 0.2
            assert conn.kernel_arrived is not None and sent <= conn.kernel_arrived < arrived - 0.15
            fut = asyncio.ensure_future(conn.call_many([b"\x00\x00\x00\x04efgh"]))
            await asyncio.sleep(0.01)
            peer.sendall(answer(2)[5:])  # the rest of it
            got, _, _ = await fut
            assert got == [answer(2)[4:]]
            fut = asyncio.ensure_future(conn.call_many([b"\x00\x00\x00\x04ijkl"]))
            await asyncio.sleep(0.01)
            peer.close()
            with pytest.raises(L.ConnectionLost):
                await asyncio.wait_for(fut, 5)
            assert conn.lost and conn._stamped is None
        finally:
            conn.close()
            peer.close()
            srv.close()
            await asyncio.sleep(0)
        assert loop.is_running()

    uvloop.run(main())


def test_heartbeat_frame_has_the_members_fixed_correlation_id_and_its_ok_answer():
    w = worker()
    g = w.groups[0]
    g.generation = 7
    conn = L.PipeConn("t")
    for i, mem in enumerate(g.members):
        mem.member_id = f"m{i}"
        w.fix_hb(g, mem, conn)
    assert len({mem.cid for mem in g.members}) == len(g.members)
    mem = g.members[1]
    header, pos = decode_request_header(mem.hb_bytes[4:])
    assert header.correlation_id == mem.cid and header.api_key == m.HeartbeatRequest.API_KEY
    req = m.HeartbeatRequest.decode_from(mem.hb_bytes[4:], pos, 4)[0]
    assert (req.group_id, req.generation_id, req.member_id) == ("g-1", 7, "m1")
    body = bytearray()
    m.HeartbeatResponse(throttle_time_ms=0, error_code=0).encode_into(body, 4)
    assert mem.hb_ok == encode_response_header(mem.cid, 12, 4) + bytes(body)


def test_commit_template_patches_every_partition_offset():
    w = worker()
    g = w.groups[0]
    g.generation = 3
    mem = g.members[2]
    mem.member_id = "m2"
    w.fix_hb(g, mem, L.PipeConn("t"))
    w.fix_commit(g, mem)
    assert len(mem.commit_pos) == w.cfg["commit_partitions"]
    for p in mem.commit_pos:
        struct.pack_into(">q", mem.commit_tpl, p, 123456789)
    frame = bytes(mem.commit_tpl)
    header, pos = decode_request_header(frame[4:])
    req = m.OffsetCommitRequest.decode_from(frame[4:], pos, 9)[0]
    parts = req.topics[0].partitions
    assert [p.committed_offset for p in parts] == [123456789] * len(parts)
    assert (req.group_id, req.generation_id_or_member_epoch, req.member_id) == ("g-1", 3, "m2")
    assert struct.unpack(">i", frame[:4])[0] == len(frame) - 4


@pytest.mark.integration
@pytest.mark.slow
@pytest.mark.parametrize("hb_mode", ["pipelined", "one"])
def test_against_a_daemon_join_heartbeat_verify_burst(hb_mode):
    from bench import _util as U

    with (
        U.Herd(fsync="always") as herd,
        L.LoadGen(
            herd.bootstrap,
            groups=12,
            members=4,
            procs=1,
            group_prefix=f"t-{hb_mode}",
            hb_mode=hb_mode,
            join_batch=5,
            join_concurrency=10,  # two lanes: their rounds overlap
            session_timeout_ms=10_000,
            hb_interval=0.5,
            kernel_stamps=True,
        ) as lg,
    ):
        joined = lg.join()
        assert joined["groups_joined"] == 12 and joined["groups_failed"] == 0
        assert joined["groups_joined_one_by_one"] == 0
        assert joined["errors"] == {}
        hb = lg.window(1.5)
        assert hb["errors"] == {} and hb["members_failed"] == 0
        assert hb["heartbeats"] > 0 and hb["unanswered"] == 0 and hb["due_but_not_sent"] == 0
        # every heartbeat read with its kernel receipt, never later than the load process saw it
        assert hb["latency_at_kernel_ms"]["count"] == hb["latency_ms"]["count"]
        assert hb["latency_at_kernel_ms"]["p99"] <= hb["latency_ms"]["p99"]
        if hb_mode == "pipelined":
            assert hb["full_decodes"] == 0  # the expected "no error" bytes are the daemon's
            assert hb["heartbeat_writes"] * 4 == hb["heartbeats"] + hb["heartbeats_before_window"]
        v = lg.verify()
        assert v["groups"] == 12 and v["groups_stable_complete"] == 12
        assert v["members_missing"] == 0 and v["states"] == {"Stable": 12}
        for kind in ("heartbeat", "commit"):
            for depth in (1, 4):
                b = lg.burst(kind, 200, depth)
                assert b["requests"] == 200 and b["errors"] == {} and b["full_decodes"] == 0
                if depth == 1:
                    assert b["writes"] == 200


@pytest.mark.integration
@pytest.mark.slow
def test_against_a_daemon_consumer_protocol_join_heartbeat_verify_leave():
    """KIP-848 mode: the members join with ids of their own, converge on the server's assignment
    (every partition of the topic owned once), heartbeat at the server's interval with the epoch it
    gave, the coordinator sees them all Stable at that epoch, and they leave at the end."""
    from bench import _util as U

    extra = ["--group-consumer-heartbeat-interval-ms", "1000", "--group-consumer-min-heartbeat-interval-ms", "1000",
             "--group-consumer-session-timeout-ms", "45000"]
    with (
        U.Herd(fsync="always", topics=("bench:12",), extra_args=extra) as herd,
        L.LoadGen(herd.bootstrap, groups=6, members=4, procs=1, group_prefix="t-cg", protocol="consumer",
                  topic_partitions=12, join_concurrency=3, cg_join_poll=0.1) as lg,
    ):
        assert lg.params()["join_mode"] == "member"
        joined = lg.join()
        assert joined["groups_joined"] == 6 and joined["groups_failed"] == 0
        assert joined["members_joined"] == 24 and joined["errors"] == {}
        hb = lg.window(2.5)
        assert hb["errors"] == {} and hb["members_failed"] == 0
        # 24 members at the server's 1 s interval for 2.5 s: each beat at least twice
        assert hb["heartbeats"] >= 24 * 2 and hb["unanswered"] == 0 and hb["due_but_not_sent"] == 0
        assert hb["answers_with_changes"] == 0  # steady state: no new epoch, no new assignment
        v = lg.verify()
        assert v["groups"] == 6 and v["groups_stable_complete"] == 6 and v["states"] == {"Stable": 6}
        assert v["members_missing"] == 0 and v["members_unexpected"] == 0
        left = lg.leave()
        assert left == {"members_left": 24, "errors": {}}
        v = lg.verify()
        assert v["states"] == {"error GROUP_ID_NOT_FOUND": 6} or v["states"] == {"Empty": 6}
        assert v["members_present"] == 0


def test_consumer_heartbeats_acknowledge_a_new_assignment_once_then_send_null():
    w = worker(2)
    w.cfg["protocol"] = "consumer"
    w = L.Worker(dict(w.cfg), None)
    g = w.groups[0]
    mem = g.members[0]
    mem.member_id = "m0"
    join = w.cg_request(g, mem, 0, False)
    assert (join.member_epoch, join.subscribed_topic_names, join.topic_partitions) == (0, ["bench"], [])
    assert join.rebalance_timeout_ms == w.cfg["rebalance_timeout_ms"]
    tid = b"\x01" * 16
    asg = m.ConsumerGroupHeartbeatResponseAssignment(
        topic_partitions=[m.ConsumerGroupHeartbeatResponseTopicPartitions(topic_id=tid, partitions=[3, 1])])
    assert w.cg_answer(mem, m.ConsumerGroupHeartbeatResponse(member_epoch=5, assignment=asg))
    assert mem.generation == 5 and mem.acking
    frame = w.hb_frame(g, mem)
    header, pos = decode_request_header(bytes(frame[4:]))
    assert header.api_key == m.ConsumerGroupHeartbeatRequest.API_KEY and header.api_version == 1
    req = m.ConsumerGroupHeartbeatRequest.decode_from(bytes(frame[4:]), pos, 1)[0]
    assert (req.member_id, req.member_epoch, req.subscribed_topic_names) == ("m0", 5, None)
    assert [(tp.topic_id, tp.partitions) for tp in req.topic_partitions] == [(tid, [1, 3])]
    # the acknowledgement was answered with nothing new: the next beat is back to null
    assert w.cg_answer(mem, m.ConsumerGroupHeartbeatResponse(member_epoch=5))
    assert not mem.acking
    req = m.ConsumerGroupHeartbeatRequest.decode_from(bytes(w.hb_frame(g, mem)[4:]), pos, 1)[0]
    assert req.topic_partitions is None and req.member_epoch == 5
    # nothing new again: the frame stays as it is
    assert not w.cg_answer(mem, m.ConsumerGroupHeartbeatResponse(member_epoch=5))
    # a new epoch without a new assignment changes the next beat's epoch only
    assert w.cg_answer(mem, m.ConsumerGroupHeartbeatResponse(member_epoch=6)) and not mem.acking
    leave = w.cg_request(g, mem, -1, False)
    assert leave.member_epoch == -1 and leave.topic_partitions is None


def test_consumer_group_converged_only_when_every_partition_is_owned_once_at_one_epoch():
    cfg = dict(L.DEFAULTS, proc=0, bootstrap="127.0.0.1:1", group_ids=["g-1"], hb_conns=1, members=2,
               protocol="consumer", topic_partitions=4)
    w = L.Worker(cfg, None)
    g = w.groups[0]
    a, b = g.members
    t = b"\x02" * 16
    w.cg_set(a, generation=3, owned={t: frozenset({0, 1})})
    assert not w.cg_converged(g)  # b has no assignment yet
    w.cg_set(b, generation=3, owned={t: frozenset({2, 3})})
    assert w.cg_converged(g)
    w.cg_set(b, acking=True)  # its assignment not yet acknowledged
    assert not w.cg_converged(g)
    w.cg_set(b, acking=False)
    w.cg_set(b, generation=2)
    assert not w.cg_converged(g)
    w.cg_set(b, generation=3)
    assert w.cg_converged(g)
    w.cg_set(b, owned={t: frozenset({1, 2, 3})})  # partition 1 owned twice
    assert not w.cg_converged(g)
    w.cg_set(b, owned={t: frozenset({2})})  # partition 3 owned by no one
    assert not w.cg_converged(g)
    w.cg_set(b, owned={t: frozenset({2, 3})})
    assert w.cg_converged(g)
    w.cg_set(a, generation=0, owned=None, acking=False)  # fenced: rejoins
    assert not w.cg_converged(g)


def _walk_converged(g, partitions):
    """The convergence check by walking every member (what CgTrack keeps incrementally)."""
    epoch = g.members[0].generation
    seen, union = 0, set()
    for mem in g.members:
        if mem.generation != epoch or mem.generation <= 0 or mem.acking or mem.owned is None:
            return False
        for t, ps in mem.owned.items():
            seen += len(ps)
            union.update((t, p) for p in ps)
    return seen == len(union) == partitions


def test_consumer_group_convergence_kept_incrementally_agrees_with_a_full_walk():
    import random

    rnd = random.Random(848)
    cfg = dict(L.DEFAULTS, proc=0, bootstrap="127.0.0.1:1", group_ids=["g-1"], hb_conns=1, members=5,
               protocol="consumer", topic_partitions=6)
    w = L.Worker(cfg, None)
    g = w.groups[0]
    ts = [b"\x03" * 16, b"\x04" * 16]
    agreed = {True: 0, False: 0}
    for _ in range(5000):
        mem = rnd.choice(g.members)
        kind = rnd.random()
        if kind < 0.2:  # an answer: maybe a new assignment, maybe a new epoch
            asg = None
            if rnd.random() < 0.5:
                asg = m.ConsumerGroupHeartbeatResponseAssignment(topic_partitions=[
                    m.ConsumerGroupHeartbeatResponseTopicPartitions(
                        topic_id=t, partitions=rnd.sample(range(3), rnd.randint(0, 2)))
                    for t in ts if rnd.random() < 0.7])
            w.cg_answer(mem, m.ConsumerGroupHeartbeatResponse(member_epoch=rnd.randint(1, 3), assignment=asg))
        elif kind < 0.23:
            w.cg_set(mem, generation=0, owned=None, acking=False)
        else:  # steer towards convergence: a partition of each topic per member, at epoch 2
            k = g.members.index(mem)
            owned = {ts[k % 2]: frozenset({k // 2})}
            if k == 4:
                owned[ts[1]] = frozenset({2})
            w.cg_set(mem, generation=2, owned=owned, acking=rnd.random() < 0.1)
        want = _walk_converged(g, 6)
        assert w.cg_converged(g) == want
        agreed[want] += 1
    assert agreed[True] > 10 and agreed[False] > 10  # both outcomes exercised


def test_next_due_keeps_each_members_phase_unless_told_to_slip():
    # on time: one interval later
    assert L.next_due(10.0, 10.001, 3.0, slip=False) == 13.0
    assert L.next_due(10.0, 10.001, 3.0, slip=True) == pytest.approx(13.001)
    # sent 1 s late (a stalled load process): the phase stays; slipping moves it by the lateness
    assert L.next_due(10.0, 11.0, 3.0, slip=False) == 13.0
    assert L.next_due(10.0, 11.0, 3.0, slip=True) == 14.0
    # later than a whole interval: the missed beats are skipped, not made up, still on the phase
    assert L.next_due(10.0, 17.5, 3.0, slip=False) == 19.0
    assert L.next_due(10.0, 16.0, 3.0, slip=False) == 19.0
    # two members whose beats one stall delayed and sent together stay apart without slip
    a, b = L.next_due(10.0, 11.2, 3.0, False), L.next_due(10.9, 11.2, 3.0, False)
    assert b - a == pytest.approx(0.9)
    assert L.next_due(10.0, 11.2, 3.0, True) == L.next_due(10.9, 11.2, 3.0, True)
