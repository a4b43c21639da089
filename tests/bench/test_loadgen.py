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
        ) as lg,
    ):
        joined = lg.join()
        assert joined["groups_joined"] == 12 and joined["groups_failed"] == 0
        assert joined["groups_joined_one_by_one"] == 0
        assert joined["errors"] == {}
        hb = lg.window(1.5)
        assert hb["errors"] == {} and hb["members_failed"] == 0
        assert hb["heartbeats"] > 0 and hb["unanswered"] == 0 and hb["due_but_not_sent"] == 0
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
