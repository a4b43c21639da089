"""The TCP edge in process: a real Runtime and group coordinator behind a ``Connection`` on a fake
transport, to check pipelining (answers of one read leave in one write, in request order),
backpressure, and closing mid-pipeline without sockets or timing."""
from __future__ import annotations

import asyncio
import os
import random
import struct
from pathlib import Path

import pytest
import uvloop

from coordinator.config import Config
from coordinator.core.catalog import Catalog
from coordinator.core.coordinator import GroupCoordinator
from coordinator.core.versions import API_NAMES
from coordinator.edge.server import Connection, Server, _encode_body
from coordinator.ops.metrics import Counter, Histogram, RequestStats
from coordinator.runtime import Runtime
from coordinator.store.filelog import LogStore
from protocol import errors as E
from protocol import fastpath
from protocol import messages as m
from protocol.headers import decode_response_header, encode_request_header

HB = 4  # Heartbeat version used here (flexible)


class FakeTransport:
    """Records writes; ``high_water`` set: calls pause_writing past it until ``drain()``."""

    def __init__(self, high_water: int | None = None):
        self.protocol: Connection | None = None
        self.data = bytearray()
        self.writes = 0
        self.aborted = False
        self.reading = True
        self.high_water = high_water
        self.unsent = 0
        self.write_paused = False
        self.written = asyncio.Event()  # set on every write: tests wait on it, not on a timer

    def write(self, data) -> None:
        assert not self.aborted
        self.writes += 1
        self.data += data
        self.written.set()
        if self.high_water is not None:
            self.unsent += len(data)
            if self.unsent > self.high_water and not self.write_paused:
                self.write_paused = True
                self.protocol.pause_writing()

    def drain(self) -> None:
        self.unsent = 0
        if self.write_paused:
            self.write_paused = False
            self.protocol.resume_writing()

    def get_extra_info(self, name, default=None):
        return default

    def get_write_buffer_size(self) -> int:
        return self.unsent

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def abort(self) -> None:
        self.aborted = True

    close = abort


def frame(request, version: int, correlation_id: int) -> bytes:
    out = bytearray(b"\x00\x00\x00\x00")
    encode_request_header(out, request.API_KEY, version, correlation_id, "fastpath-test")
    request.encode_into(out, version)
    struct.pack_into(">i", out, 0, len(out) - 4)
    return bytes(out)


def answers(data: bytes) -> list[bytes]:
    out, pos = [], 0
    while pos < len(data):
        n, = struct.unpack_from(">i", data, pos)
        out.append(bytes(data[pos + 4:pos + 4 + n]))
        pos += 4 + n
    assert pos == len(data)
    return out


def decode(body: bytes, api_key: int, version: int):
    cid, pos = decode_response_header(body, api_key, version)
    return cid, m.RESPONSES[api_key].decode(body, version, pos)


class Edge:
    """One daemon's worth of objects on the running loop, and helpers to talk to it."""

    def __init__(self, tmp_path: Path, fsync: str = "never", **overrides):
        self.config = Config(data_dir=str(tmp_path), fsync=fsync, offsets_partitions=4,
                             initial_rebalance_delay_ms=0, **overrides)
        self.store = LogStore(tmp_path, self.config.offsets_partitions, fsync=fsync)

    async def __aenter__(self) -> Edge:
        loop = asyncio.get_running_loop()
        self.store.open(latest_only=True)
        self.runtime = Runtime(self.config, GroupCoordinator(self.config.group_config(), node_id=0),
                               Catalog(self.config, node_id=0), self.store)
        self.server = Server(self.config, self.runtime)
        self.server.loop = loop
        self.runtime.replay({})
        self.runtime.start(loop)
        return self

    async def __aexit__(self, *exc):
        self.runtime.shutdown()
        self.store.close()

    def connect(self, transport: FakeTransport | None = None) -> tuple[Connection, FakeTransport]:
        tr = transport or FakeTransport()
        conn = Connection(self.server)
        tr.protocol = conn
        conn.connection_made(tr)
        return conn, tr

    async def call(self, request, version: int):
        conn, tr = self.connect()
        conn.data_received(frame(request, version, 1))
        await until(lambda: tr.data, tr)
        (body,) = answers(tr.data)
        return decode(body, request.API_KEY, version)[1]

    async def member(self, group_id: str) -> m.HeartbeatRequest:
        """Join a one-member group; return a Heartbeat request that it answers with NONE."""
        j = await self.call(m.JoinGroupRequest(
            group_id=group_id, session_timeout_ms=60_000, rebalance_timeout_ms=60_000, protocol_type="consumer",
            protocols=[m.JoinGroupRequestProtocol(name="range", metadata=b"")]), 3)
        assert j.error_code == E.NONE
        s = await self.call(m.SyncGroupRequest(
            group_id=group_id, generation_id=j.generation_id, member_id=j.member_id,
            assignments=[m.SyncGroupRequestAssignment(member_id=j.member_id, assignment=b"")]), 3)
        assert s.error_code == E.NONE
        return m.HeartbeatRequest(group_id=group_id, generation_id=j.generation_id, member_id=j.member_id)


class Listening(Edge):
    """An Edge whose server listens on a loopback port of its own (``host``, ``port``): real sockets."""

    def __init__(self, tmp_path: Path, **overrides):
        super().__init__(tmp_path, port=0, **overrides)

    async def __aenter__(self) -> Listening:
        await super().__aenter__()
        self.host, self.port = await self.server.bind()
        await self.server.start()
        return self

    async def __aexit__(self, *exc):
        self.server.stop_accepting()
        self.server.close_all()
        await super().__aexit__(*exc)


async def sock_answer(sock, bound_s: float = 30.0) -> bytes:
    """One answer's body read from a non-blocking socket on the running loop."""
    loop = asyncio.get_running_loop()
    data = b""
    while len(data) < 4 or len(data) < 4 + struct.unpack_from(">i", data)[0]:
        chunk = await asyncio.wait_for(loop.sock_recv(sock, 65536), bound_s)
        assert chunk, "connection closed"
        data += chunk
    (body,) = answers(data)
    return body


async def until(cond, tr: FakeTransport, bound_s: float = 30.0):
    """Wait until ``cond()`` holds, waking on each write to ``tr`` (the answers released by the log
    writer arrive through the loop); ``bound_s`` only bounds a hung test."""
    while not cond():
        tr.written.clear()
        await asyncio.wait_for(tr.written.wait(), bound_s)


async def turns(n: int = 5):
    for _ in range(n):
        await asyncio.sleep(0)


def run(coro):
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def heartbeat_cids(data: bytes) -> list[int]:
    out = []
    for body in answers(data):
        cid, resp = decode(body, 12, HB)
        assert resp.error_code == E.NONE
        out.append(cid)
    return out


def test_pipelined_heartbeats_get_their_answers_in_order_in_one_write(tmp_path):
    async def main():
        async with Edge(tmp_path) as edge:
            hbs = [await edge.member(f"g{i}") for i in range(5)]
            conn, tr = edge.connect()
            conn.data_received(b"".join(frame(hbs[i % 5], HB, 100 + i) for i in range(20)))
            assert heartbeat_cids(tr.data) == list(range(100, 120))
            assert tr.writes == 1
            # one frame per read: one write each, as before
            for i in range(3):
                conn.data_received(frame(hbs[0], HB, 200 + i))
            assert tr.writes == 4
            assert heartbeat_cids(tr.data)[20:] == [200, 201, 202]
            # a frame split over reads, then two frames and a half in one read
            f = [frame(hbs[1], HB, 300 + i) for i in range(4)]
            conn.data_received(f[0][:7])
            conn.data_received(f[0][7:] + f[1] + f[2][:3])
            conn.data_received(f[2][3:] + f[3])
            assert heartbeat_cids(tr.data)[23:] == [300, 301, 302, 303]
            assert not tr.aborted and not conn.queue and conn.queued_bytes == 0

    run(main())


def test_a_burst_longer_than_a_turn_is_answered_in_order_over_several_turns(tmp_path):
    async def main():
        async with Edge(tmp_path) as edge:
            hb = await edge.member("g")
            conn, tr = edge.connect()
            n = 2 * Connection.FRAMES_PER_TURN + 10
            conn.data_received(b"".join(frame(hb, HB, i) for i in range(n)))
            assert heartbeat_cids(tr.data) == list(range(Connection.FRAMES_PER_TURN))
            await turns()
            assert heartbeat_cids(tr.data) == list(range(n))
            assert tr.writes == 3
            assert conn.queued_bytes == 0

    run(main())


def join_g(member_id: str = "") -> m.JoinGroupRequest:
    """A JoinGroup for group "g" (a new member's parks until the group's member rejoins)."""
    return m.JoinGroupRequest(group_id="g", session_timeout_ms=60_000, rebalance_timeout_ms=60_000,
                              member_id=member_id, protocol_type="consumer",
                              protocols=[m.JoinGroupRequestProtocol(name="range", metadata=b"")])


def test_a_parked_request_holds_the_requests_pipelined_after_it(tmp_path):
    async def main():
        async with Edge(tmp_path) as edge:
            hb = await edge.member("g")
            other = await edge.member("h")
            join = join_g()  # a second member for "g": its JoinGroup parks until g's member rejoins
            conn, tr = edge.connect()
            conn.data_received(frame(other, HB, 1) + frame(join, 3, 2) + frame(other, HB, 3) + frame(other, HB, 4))
            assert len(answers(tr.data)) == 1
            assert conn.inflight is not None and len(conn.queue) == 2
            await turns()
            assert len(answers(tr.data)) == 1 and len(conn.queue) == 2  # still parked
            rejoin = join_g(hb.member_id)
            assert (await edge.call(rejoin, 3)).error_code == E.NONE
            await until(lambda: len(answers(tr.data)) == 4, tr)
            bodies = answers(tr.data)
            assert decode(bodies[1], 11, 3)[0] == 2 and decode(bodies[1], 11, 3)[1].error_code == E.NONE
            assert [decode(b, 12, HB)[0] for b in bodies] == [1, 2, 3, 4]
            # the join's answer was written when released, the two heartbeats behind it together
            assert tr.writes == 3

    run(main())


def commit_request(group_id: str, offset: int, partitions: int = 3) -> m.OffsetCommitRequest:
    return m.OffsetCommitRequest(group_id=group_id, generation_id_or_member_epoch=-1, member_id="", topics=[
        m.OffsetCommitRequestTopic(name="t", partitions=[
            m.OffsetCommitRequestPartition(partition_index=p, committed_offset=offset, committed_metadata="")
            for p in range(partitions)])])


def test_pipelined_commits_share_one_log_write_and_answer_in_order(tmp_path):
    """A commit waiting for the log does not hold its connection: the requests behind it are
    handled in the same turn (one log write for all), and every answer leaves in request order,
    the heartbeat's behind the commit before it."""
    async def main():
        async with Edge(tmp_path) as edge:
            hb = await edge.member("g")
            conn, tr = edge.connect()
            shard = edge.runtime.groups.shard_for("s1")
            batches = edge.store.stats()[shard].batches
            fetch = m.OffsetFetchRequest(group_id="s1", topics=[m.OffsetFetchRequestTopic(name="t",
                                                                                        partition_indexes=[0])])
            conn.data_received(frame(commit_request("s1", 5), 8, 1) + frame(hb, HB, 2)
                               + frame(commit_request("s1", 6), 8, 3) + frame(fetch, 7, 4) + frame(hb, HB, 5))
            assert tr.data == b"" and conn.inflight is None and not conn.queue  # all handled, all held
            assert len(conn.held) == 5
            await until(lambda: tr.data, tr)
            bodies = answers(tr.data)
            assert tr.writes == 1 and not conn.held
            assert [decode_response_header(b, k, v)[0] for b, (k, v) in
                    zip(bodies, [(8, 8), (12, HB), (8, 8), (9, 7), (12, HB)], strict=True)] == [1, 2, 3, 4, 5]
            assert decode(bodies[0], 8, 8)[1].topics[0].partitions[0].error_code == E.NONE
            assert decode(bodies[2], 8, 8)[1].topics[0].partitions[0].error_code == E.NONE
            # the fetch, handled before the second commit was on disk, saw it (and waited for it)
            assert decode(bodies[3], 9, 7)[1].topics[0].partitions[0].committed_offset == 6
            assert edge.store.stats()[shard].batches == batches + 1  # both commits in one write

    run(main())


def test_at_most_max_held_answers_wait_then_the_connection_stops_reading(tmp_path):
    async def main():
        async with Edge(tmp_path) as edge:
            conn, tr = edge.connect()
            conn.MAX_HELD = 4
            n = 11
            conn.data_received(b"".join(frame(commit_request("s1", i, 1), 8, i) for i in range(n)))
            assert tr.data == b"" and len(conn.held) == 4 and len(conn.queue) == n - 4
            await until(lambda: len(answers(tr.data)) == n, tr)
            bodies = answers(tr.data)
            assert [decode(b, 8, 8)[0] for b in bodies] == list(range(n))
            assert all(decode(b, 8, 8)[1].topics[0].partitions[0].error_code == E.NONE for b in bodies)
            assert not conn.held and not conn.queue and conn.queued_bytes == 0
            assert tr.writes == 3  # 4 + 4 + 3: each batch's answers in one write

    run(main())


def test_held_commits_whose_fsync_fails_are_refused_in_order_and_nothing_after_them_overtakes(
        tmp_path, monkeypatch):
    """fsync=always and the shard's fdatasync fails: both pipelined commits get
    COORDINATOR_NOT_AVAILABLE (never NONE), and the heartbeat and the fetch behind them leave after
    them, in request order."""
    import errno

    from coordinator.store import writer as LW

    async def main():
        async with Edge(tmp_path, fsync="always") as edge:
            hb = await edge.member("g")
            shard = edge.runtime.groups.shard_for("s1")
            path = edge.store.writer.shards[shard].path
            real = LW._fdatasync

            def fdatasync(fd):
                if os.path.samefile(f"/proc/self/fd/{fd}", path):
                    raise OSError(errno.EIO, "injected")
                return real(fd)

            monkeypatch.setattr(LW, "_fdatasync", fdatasync)
            conn, tr = edge.connect()
            fetch = m.OffsetFetchRequest(group_id="s1", topics=[m.OffsetFetchRequestTopic(name="t",
                                                                                        partition_indexes=[0])])
            conn.data_received(frame(commit_request("s1", 5), 8, 1) + frame(commit_request("s1", 6), 8, 2)
                               + frame(hb, HB, 3) + frame(fetch, 7, 4))
            assert len(conn.held) == 4
            await until(lambda: len(answers(tr.data)) == 4, tr)
            bodies = answers(tr.data)
            kinds = [(8, 8), (8, 8), (12, HB), (9, 7)]
            assert [decode(b, k, v)[0] for b, (k, v) in zip(bodies, kinds, strict=True)] == [1, 2, 3, 4]
            for b in bodies[:2]:
                assert {p.error_code for p in decode(b, 8, 8)[1].topics[0].partitions} == {
                    E.COORDINATOR_NOT_AVAILABLE}
            assert decode(bodies[2], 12, HB)[1].error_code == E.NONE  # g lives on another shard
            fetched = decode(bodies[3], 9, 7)[1]
            assert fetched.error_code == E.COORDINATOR_NOT_AVAILABLE or \
                fetched.topics[0].partitions[0].error_code == E.COORDINATOR_NOT_AVAILABLE

    run(main())


@pytest.mark.parametrize("bad", ["unsupported", "malformed"])
def test_a_request_that_closes_the_connection_waits_for_the_held_answers_before_it(tmp_path, bad):
    """commit, heartbeat, then a frame that closes the connection: the commit (applied, and on
    disk) and the heartbeat are answered, in order, and only then is the connection aborted;
    nothing after the closing frame is handled."""
    async def main():
        async with Edge(tmp_path) as edge:
            hb = await edge.member("g")
            conn, tr = edge.connect()
            if bad == "unsupported":
                body = struct.pack(">hhih", 12, 99, 9, -1)  # Heartbeat v99: Kafka closes the connection
                closing = struct.pack(">i", len(body)) + body
            else:
                closing = struct.pack(">i", -5)  # a negative frame size
            conn.data_received(frame(commit_request("s1", 5), 8, 1) + frame(hb, HB, 2))
            conn.data_received(closing + frame(commit_request("s1", 7), 8, 3))
            assert conn.closing and not tr.aborted and not tr.reading
            conn.data_received(frame(hb, HB, 4))  # ignored: the connection is closing
            await until(lambda: tr.aborted, tr)
            bodies = answers(tr.data)
            assert [decode(bodies[0], 8, 8)[0], decode(bodies[1], 12, HB)[0]] == [1, 2] and len(bodies) == 2
            assert decode(bodies[0], 8, 8)[1].topics[0].partitions[0].error_code == E.NONE
            assert conn.closed and not conn.held
            fetch = m.OffsetFetchRequest(group_id="s1", topics=[m.OffsetFetchRequestTopic(name="t",
                                                                                        partition_indexes=[0])])
            assert (await edge.call(fetch, 7)).topics[0].partitions[0].committed_offset == 5  # not 7

    run(main())


def test_a_failure_writing_one_connections_released_answers_does_not_strand_the_others(tmp_path):
    class Failing(FakeTransport):
        def write(self, data):
            raise RuntimeError("injected")

    async def main():
        async with Edge(tmp_path) as edge:
            a, ta = edge.connect(Failing())
            b, tb = edge.connect()
            a.data_received(frame(commit_request("s1", 1), 8, 1))
            b.data_received(frame(commit_request("s2", 2), 8, 1))
            await until(lambda: tb.data, tb)
            assert a.closed and ta.aborted  # our bug (here: an injected one) drops that connection only
            assert not b.dirty and not edge.server.dirty and not edge.server.holding
            b.data_received(frame(commit_request("s2", 3), 8, 2))
            await until(lambda: len(answers(tb.data)) == 2, tb)
            assert [decode(x, 8, 8)[0] for x in answers(tb.data)] == [1, 2]

    run(main())


def test_the_idle_check_leaves_a_connection_whose_answers_wait_for_the_log(tmp_path):
    async def main():
        async with Edge(tmp_path) as edge:
            quiet, _ = edge.connect()
            conn, tr = edge.connect()
            conn.data_received(frame(commit_request("s1", 1), 8, 1))
            assert conn.held and conn.inflight is None
            quiet.last_active = conn.last_active = edge.server.loop.time() - 10 * edge.config.connections_max_idle_ms
            edge.server._idle_check()
            edge.server._idle_timer.cancel()
            assert quiet.closed and not conn.closed
            await until(lambda: tr.data, tr)
            assert decode(answers(tr.data)[0], 8, 8)[1].topics[0].partitions[0].error_code == E.NONE

    run(main())


def test_write_backpressure_stops_a_pipelined_burst_until_the_peer_reads(tmp_path):
    async def main():
        async with Edge(tmp_path) as edge:
            hb = await edge.member("g")
            conn, tr = edge.connect(FakeTransport(high_water=1))
            n = 3 * Connection.FRAMES_PER_TURN
            conn.data_received(b"".join(frame(hb, HB, i) for i in range(n)))
            assert len(answers(tr.data)) == Connection.FRAMES_PER_TURN
            assert conn.write_paused and conn.paused and not tr.reading
            await turns()
            assert len(answers(tr.data)) == Connection.FRAMES_PER_TURN  # nothing more while paused
            tr.drain()
            assert len(answers(tr.data)) == 2 * Connection.FRAMES_PER_TURN
            await turns()
            tr.drain()
            await turns()
            assert heartbeat_cids(tr.data) == list(range(n))
            tr.drain()
            assert tr.reading and not conn.paused and conn.queued_bytes == 0

    run(main())


@pytest.mark.parametrize("bad", [
    struct.pack(">hhih", 12, HB, 9, 0) + b"\xff\xff\xff",  # heartbeat with a garbage body
    struct.pack(">hhih", 12, 99, 9, -1),  # unsupported version
    struct.pack(">hhih", 999, 0, 9, -1),  # unknown api
    b"\x00\x0c",  # truncated header
], ids=["garbage-body", "unsupported-version", "unknown-api", "truncated-header"])
def test_a_bad_request_mid_pipeline_answers_those_before_it_then_closes(tmp_path, bad):
    async def main():
        async with Edge(tmp_path) as edge:
            hb = await edge.member("g")
            conn, tr = edge.connect()
            conn.data_received(frame(hb, HB, 1) + frame(hb, HB, 2) + struct.pack(">i", len(bad)) + bad
                               + frame(hb, HB, 3))
            assert heartbeat_cids(tr.data) == [1, 2]
            assert tr.aborted and conn.closed and not conn.queue
            conn.data_received(frame(hb, HB, 4))  # late data on a closed connection is ignored
            assert heartbeat_cids(tr.data) == [1, 2]

    run(main())


def test_a_negative_frame_size_after_good_frames_closes_after_answering_them(tmp_path):
    async def main():
        async with Edge(tmp_path) as edge:
            hb = await edge.member("g")
            conn, tr = edge.connect()
            conn.data_received(frame(hb, HB, 1))
            conn.data_received(struct.pack(">i", -5))
            assert heartbeat_cids(tr.data) == [1] and tr.aborted

    run(main())


@pytest.mark.parametrize("prefix", [-5, 1 << 30], ids=["negative", "too-large"])
def test_an_invalid_frame_size_in_the_same_read_as_good_frames_answers_them_first(tmp_path, prefix):
    """commit + heartbeat + an invalid size prefix, all in one read: the commit (durable) and the
    heartbeat are answered in order, then the connection closes; nothing more is read."""
    async def main():
        async with Edge(tmp_path, max_frame_size=1 << 20) as edge:
            hb = await edge.member("g")
            conn, tr = edge.connect()
            conn.data_received(frame(commit_request("s1", 5), 8, 1) + frame(hb, HB, 2)
                               + struct.pack(">i", prefix) + frame(hb, HB, 3))
            assert not tr.reading
            conn.data_received(frame(hb, HB, 4))  # ignored: the stream is past following
            await until(lambda: tr.aborted, tr)
            bodies = answers(tr.data)
            assert len(bodies) == 2 and [decode(bodies[0], 8, 8)[0], decode(bodies[1], 12, HB)[0]] == [1, 2]
            assert decode(bodies[0], 8, 8)[1].topics[0].partitions[0].error_code == E.NONE
            assert conn.closed and not conn.queue

    run(main())


def test_frames_queued_behind_a_parked_request_are_answered_before_a_malformed_frame_closes(tmp_path):
    async def main():
        async with Edge(tmp_path) as edge:
            hb = await edge.member("g")
            other = await edge.member("h")
            join = join_g()
            conn, tr = edge.connect()
            conn.data_received(frame(join, 3, 1) + frame(other, HB, 2))
            conn.data_received(frame(other, HB, 3) + struct.pack(">i", -1))
            assert conn.inflight is not None and not tr.aborted and not tr.reading
            assert len(answers(tr.data)) == 0
            rejoin = join_g(hb.member_id)
            assert (await edge.call(rejoin, 3)).error_code == E.NONE
            await until(lambda: tr.aborted, tr)
            bodies = answers(tr.data)
            assert [decode(b, 12, HB)[0] for b in bodies] == [1, 2, 3]
            assert decode(bodies[0], 11, 3)[1].error_code == E.NONE
            assert conn.closed

    run(main())


def test_api_versions_answers_use_header_v0_and_pipeline_with_heartbeats(tmp_path):
    async def main():
        async with Edge(tmp_path) as edge:
            hb = await edge.member("g")
            conn, tr = edge.connect()
            future = bytearray()
            encode_request_header(future, 18, 99, 2, "future-client")
            future += b"\x00\x00"
            conn.data_received(frame(m.ApiVersionsRequest(), 3, 1) + struct.pack(">i", len(future)) + future
                               + frame(hb, HB, 3))
            a, b, c = answers(tr.data)
            assert struct.unpack_from(">i", a)[0] == 1
            assert m.ApiVersionsResponse.decode(a, 3, 4).error_code == E.NONE  # no header tag byte
            assert struct.unpack_from(">i", b)[0] == 2
            assert m.ApiVersionsResponse.decode(b, 0, 4).error_code == E.UNSUPPORTED_VERSION
            assert decode(c, 12, HB)[0] == 3
            assert tr.writes == 1

    run(main())


@pytest.mark.parametrize("version", range(m.HeartbeatResponse.MIN_VERSION, m.HeartbeatResponse.MAX_VERSION + 1))
def test_heartbeat_bodies_match_the_codec_including_uncached_ones(version):
    responses = [m.HeartbeatResponse(error_code=E.NONE), m.HeartbeatResponse(error_code=E.REBALANCE_IN_PROGRESS),
                 m.HeartbeatResponse(error_code=E.NONE), m.HeartbeatResponse(throttle_time_ms=250),
                 m.HeartbeatResponse(error_code=E.UNKNOWN_MEMBER_ID, unknown_tagged_fields=[(7, b"xy")])]
    for resp in responses:
        out = bytearray(b"head")
        _encode_body(out, resp, version)
        assert bytes(out) == b"head" + resp.encode(version)


def _render_old(observations) -> list[str]:
    """What Metrics rendered before RequestStats: a Counter and a Histogram keyed by API name."""
    counter = Counter("herd_requests_total", "Requests answered, by API.", ("api",))
    hist = Histogram("herd_request_duration_seconds", "Time from a request's arrival to its answer, by API.",
                     ("api",))
    for key, seconds in observations:
        counter.inc(API_NAMES[key])
        hist.observe(seconds, API_NAMES[key])
    return counter.render() + hist.render()


def test_request_stats_render_exactly_as_the_counter_and_histogram_did():
    rnd = random.Random(7)
    keys = sorted(API_NAMES)
    observations = [(rnd.choice(keys), rnd.choice([0.0, 0.0005, 0.0004, 0.001, 0.7, 61.0, 10.0])
                     if rnd.random() < 0.3 else rnd.expovariate(1000)) for _ in range(5000)]
    stats = RequestStats(API_NAMES)
    for key, seconds in observations:
        stats.observe(key, seconds)
    assert stats.counter().render() + stats.histogram().render() == _render_old(observations)
    empty = RequestStats(API_NAMES)
    assert empty.counter().render() + empty.histogram().render() == _render_old([])


def test_heartbeats_of_every_version_are_answered_in_place_with_the_codecs_bytes(tmp_path):
    from protocol.headers import response_header_version

    def expected(cid: int, version: int, code: int) -> bytes:
        head = struct.pack(">i", cid) + (b"\x00" if response_header_version(12, version) else b"")
        return head + m.HeartbeatResponse(error_code=code).encode(version)

    async def main():
        async with Edge(tmp_path) as edge:
            good = await edge.member("g")
            stale = m.HeartbeatRequest(group_id="g", generation_id=good.generation_id + 7, member_id=good.member_id)
            nobody = m.HeartbeatRequest(group_id="nobody", generation_id=1, member_id="x")
            conn, tr = edge.connect()
            sent, want = [], []
            cid = 0
            for version in range(m.HeartbeatRequest.MIN_VERSION, m.HeartbeatRequest.MAX_VERSION + 1):
                for req, code in ((good, E.NONE), (stale, E.ILLEGAL_GENERATION), (nobody, E.UNKNOWN_MEMBER_ID)):
                    cid += 1
                    sent.append(frame(req, version, cid))
                    want.append(expected(cid, version, code))
            conn.data_received(b"".join(sent[:20]))
            conn.data_received(b"".join(sent[20:]))
            await until(lambda: len(answers(tr.data)) == len(want), tr)
            assert answers(tr.data) == want
            assert not tr.aborted and conn.inflight is None
            # the generic path (a Reply token through Runtime.dispatch) answers the same
            assert (await edge.call(good, HB)).error_code == E.NONE
            edge.runtime._closing = True  # shutting down: NOT_COORDINATOR, as for every request
            assert edge.runtime.heartbeat(HB, good) == E.NOT_COORDINATOR
            edge.runtime._closing = False

    run(main())


def _commit_scenario(tmp_path: Path) -> tuple[bytes, list]:
    """Commits of every kind pipelined on one connection, then fetches: -> (every byte answered,
    the commits' per-partition error codes)."""
    P = m.OffsetCommitRequestPartition

    def commit(group_id, generation, member_id, parts, tagged=None, long_topic=False):
        topics = [m.OffsetCommitRequestTopic(name="t", partitions=parts),
                  m.OffsetCommitRequestTopic(name="u" * (130 if long_topic else 3), partitions=parts[:1])]
        return m.OffsetCommitRequest(group_id=group_id, generation_id_or_member_epoch=generation, member_id=member_id,
                                     topics=topics, unknown_tagged_fields=tagged)

    plain = [P(0, 5, -1, -1, None), P(1, 6, 0, -1, ""), P(2, 7, 7, -1, "meta"), P(3, 8, 2, -1, "é" * 40)]
    big = [P(0, 9, 3, -1, "x" * 200), P(1, 10, -1, -1, "y" * 100), P(2, 11, -1, -1, "z" * 101)]

    async def main():
        async with Edge(tmp_path / "log", offset_metadata_max_bytes=100) as edge:
            hb = await edge.member("g")
            conn, tr = edge.connect()
            reqs = [(commit("s1", -1, "", plain), 9), (commit("s1", -1, "", big), 8),
                    (commit("s1", -1, "", plain, long_topic=True), 9),
                    (commit("g", hb.generation_id, hb.member_id, plain), 9),
                    (commit("g", hb.generation_id + 1, hb.member_id, plain), 9),
                    (commit("g", hb.generation_id, "nobody", plain), 8),
                    (commit("s2", -1, "", plain, tagged=[(7, b"x")]), 9),
                    (commit("s2", -1, "", big), 7)]
            fetches = [m.OffsetFetchRequest(group_id=g, topics=None) for g in ("s1", "s2", "g")]
            data = b"".join(frame(r, v, i) for i, (r, v) in enumerate(reqs))
            data += b"".join(frame(f, 7, 100 + i) for i, f in enumerate(fetches))
            conn.data_received(data)
            await until(lambda: len(answers(bytes(tr.data))) == len(reqs) + len(fetches), tr)
            bodies = answers(bytes(tr.data))
            codes = [[p.error_code for t in decode(b, 8, v)[1].topics for p in t.partitions]
                     for b, (_, v) in zip(bodies[:len(reqs)], reqs, strict=True)]
            return bytes(tr.data), codes

    (tmp_path / "log").mkdir(parents=True)
    return run(main())


def test_offset_commits_answer_the_same_bytes_with_and_without_the_fast_paths(tmp_path, monkeypatch):
    """The edge's OffsetCommit shortcuts (protocol.fastpath's decoder and answer encoder) against
    the generated codec, played through the whole daemon: errors per partition, null and big
    metadata, leader epochs, stale generations, unknown members, tagged fields, old versions."""
    from coordinator.edge import server
    read_fast = []

    def decode_commit(frame, pos, version):
        request = fastpath.decode_offset_commit_request(frame, pos, version)
        read_fast.append(request is not None)
        return request

    monkeypatch.setattr(server, "_decode_commit", decode_commit)
    fast, codes = _commit_scenario(tmp_path / "fast")
    E_BIG, E_GEN, E_MEMBER = E.OFFSET_METADATA_TOO_LARGE, E.ILLEGAL_GENERATION, E.UNKNOWN_MEMBER_ID
    assert codes == [[0] * 5, [E_BIG, 0, E_BIG, E_BIG], [0] * 5, [0] * 5, [E_GEN] * 5, [E_MEMBER] * 5, [0] * 5,
                     [E_BIG, 0, E_BIG, E_BIG]]
    # the shortcut read the usual ones; big metadata, a long name, tagged fields, v7: the codec
    assert read_fast == [True, False, False, True, True, True, False, False]
    monkeypatch.setattr(server, "_decode_commit", lambda frame, pos, version: None)
    monkeypatch.setattr(server, "_encode_offset_commit", lambda response, version: None)
    generic, _ = _commit_scenario(tmp_path / "generic")
    assert fast == generic


def test_a_describe_answered_in_slices_holds_the_requests_pipelined_after_it(tmp_path, monkeypatch):
    """A DescribeGroups the core describes over several loop turns (DESCRIBE_SLICE_MEMBERS) parks
    on its connection like any late answer: the heartbeat pipelined after it is answered after it."""
    from coordinator.core import coordinator as core

    monkeypatch.setattr(core, "DESCRIBE_SLICE_MEMBERS", 2)

    async def main():
        async with Edge(tmp_path) as edge:
            hb = await edge.member("g0")
            for i in range(1, 5):
                await edge.member(f"g{i}")
            conn, tr = edge.connect()
            groups = [f"g{i}" for i in range(5)]
            conn.data_received(frame(m.DescribeGroupsRequest(groups=groups), 5, 1) + frame(hb, HB, 2))
            assert not tr.data and conn.inflight is not None  # the first slice: g0 only
            await until(lambda: len(answers(tr.data)) == 2, tr)
            bodies = answers(tr.data)
            cid, resp = decode(bodies[0], 15, 5)
            assert cid == 1 and [g.group_id for g in resp.groups] == groups
            assert all(g.group_state == "Stable" and len(g.members) == 1 for g in resp.groups)
            assert decode(bodies[1], 12, HB) == (2, m.HeartbeatResponse(error_code=E.NONE))

    run(main())


def test_a_big_describe_answer_is_encoded_over_several_turns_and_is_the_codecs(tmp_path, monkeypatch):
    """A DescribeGroups answer over ENCODE_SLICE_MEMBERS members (and groups) is encoded a part per
    loop turn (Connection._encode_in_turns): the bytes sent are the generated encoder's, and the
    heartbeat pipelined after it is answered after it."""
    from coordinator.edge import server as edge_server

    async def main():
        async with Edge(tmp_path) as edge:
            hb = await edge.member("g0")
            for i in range(1, 6):
                await edge.member(f"g{i}")
            groups = [f"g{i}" for i in range(6)] + ["nope"]
            for version in (0, 3, 5):
                # the answer in one piece first (under the threshold), then in parts of 4
                whole_conn, whole_tr = edge.connect()
                whole_conn.data_received(frame(m.DescribeGroupsRequest(groups=groups), version, 1))
                await until(lambda t=whole_tr: t.data, whole_tr)
                monkeypatch.setattr(edge_server, "ENCODE_SLICE_MEMBERS", 4)
                conn, tr = edge.connect()
                conn.data_received(frame(m.DescribeGroupsRequest(groups=groups), version, 1) + frame(hb, HB, 2))
                assert not tr.data and conn.inflight is not None  # 2 groups (4) encoded, the rest later
                await asyncio.sleep(0)
                assert not tr.data  # 2 more a turn
                await until(lambda t=tr: len(answers(t.data)) == 2, tr)
                monkeypatch.setattr(edge_server, "ENCODE_SLICE_MEMBERS", 2048)
                bodies = answers(tr.data)
                assert bodies[0] == answers(whole_tr.data)[0]
                cid, resp = decode(bodies[0], 15, version)
                assert cid == 1 and [g.group_id for g in resp.groups] == groups
                assert [len(g.members) for g in resp.groups] == [1] * 6 + [0]
                assert decode(bodies[1], 12, HB) == (2, m.HeartbeatResponse(error_code=E.NONE))

    run(main())
