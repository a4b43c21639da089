"""A burst of rebalance requests holds back the connections likely to send more (edge/turns.py,
Server.hold_back, issue 31 item 4): which connections stop being read, how they are read again
(``rearm_per_turn`` per loop turn, no other resume path first), and that every request held in the
kernel meanwhile is answered, in process on fake transports and over real loopback sockets."""
from __future__ import annotations

import asyncio
import socket

from protocol import errors as E
from protocol import messages as m
from tests.coordinator.edge.test_server_fastpath import HB, Edge, Listening, answers, decode, frame, run, sock_answer

SYNC_V = 3


def unknown_sync(group_id: str) -> m.SyncGroupRequest:
    """A SyncGroup of a member the coordinator does not know: a rebalance request answered at once."""
    return m.SyncGroupRequest(group_id=group_id, generation_id=1, member_id="nobody", assignments=[])


def test_a_burst_holds_back_the_connections_that_have_not_sent_theirs_and_reads_them_again_by_turns(tmp_path):
    async def main():
        async with Edge(tmp_path) as edge:
            server = edge.server
            server.turns.budget = 0.0  # every rebalance request after a turn's first waits for a turn
            server.turns.hold_back_after = 3
            server.rearm_per_turn = 2
            # a small group's steady member on its own connection: its last request a Heartbeat
            hb = await edge.member("small")
            steady, steady_tr = edge.connect()
            steady.data_received(frame(hb, HB, 7))
            assert not steady.rejoin_likely and steady not in server.turns.likely
            n = 12
            conns = [edge.connect() for _ in range(n)]
            assert all(c in server.turns.likely for c, _ in conns)  # fresh: a JoinGroup is likely next
            pending = {i: frame(unknown_sync(f"big{i}"), SYNC_V, 1) for i in range(n)}

            def poll():
                """One poll phase: each readable socket with data is read (the kernel holds the rest)."""
                for i, (conn, tr) in enumerate(conns):
                    if i in pending and tr.reading:
                        conn.data_received(pending.pop(i))

            poll()
            # the first is handled (answered), the next three wait for a turn; at the third of those
            # the rest of the burst (not read yet: fresh connections) is held back, and so is the
            # first (its last request a rebalance one, nothing parked): its next one is likely one too
            held = [i for i in range(n) if not conns[i][1].reading]
            assert held == [0, *range(4, n)]
            assert sorted(pending) == held[1:]
            assert all(conns[i][0].turn_waiting for i in (1, 2, 3))
            assert server.read_bursts == 1
            assert server.held_back_total == sum(1 for c in server.connections if c.held_back) >= len(held)
            assert steady_tr.reading and not steady.held_back
            # the steady member is served as ever meanwhile
            before = len(steady_tr.data)
            steady.data_received(frame(hb, HB, 8))
            assert len(steady_tr.data) > before
            # no other resume path reads a held-back connection before its turn
            conns[held[0]][0].memory_resume()
            conns[held[0]][0].resume_writing()
            assert not conns[held[0]][1].reading
            still_held = [len(server.held_back)]
            for _ in range(200):
                await asyncio.sleep(0)
                still_held.append(sum(1 for c in server.connections if c.held_back))
                poll()
                if not pending and all(tr.data for _, tr in conns):
                    break
            h = still_held[0]
            assert still_held[:4] == [h, h - 2, h - 4, h - 6]  # rearm_per_turn a turn
            assert server.read_bursts == 1  # the held-back ones read again are not a new burst
            for conn, tr in conns:
                (body,) = answers(tr.data)
                cid, resp = decode(body, m.SyncGroupRequest.API_KEY, SYNC_V)
                assert cid == 1 and resp.error_code == E.UNKNOWN_MEMBER_ID
                assert not conn.held_back and not conn.paused
            lines = "\n".join(server.metric_lines())
            assert "herd_read_bursts_total 1" in lines
            assert f"herd_connections_held_back_total {server.held_back_total}" in lines

    run(main())


def test_a_heartbeat_answered_with_an_error_makes_a_rejoin_likely(tmp_path):
    async def main():
        async with Edge(tmp_path) as edge:
            hb = await edge.member("g")
            conn, tr = edge.connect()
            conn.data_received(frame(hb, HB, 1))
            assert not conn.rejoin_likely
            # a second member joins: the group rebalances, the first learns it from its Heartbeat
            other, _ = edge.connect()
            other.data_received(frame(m.JoinGroupRequest(
                group_id="g", session_timeout_ms=60_000, rebalance_timeout_ms=60_000, protocol_type="consumer",
                protocols=[m.JoinGroupRequestProtocol(name="range", metadata=b"")]), 3, 1))
            conn.data_received(frame(hb, HB, 2))
            cid, resp = decode(answers(tr.data)[-1], 12, HB)
            assert cid == 2 and resp.error_code == E.REBALANCE_IN_PROGRESS
            assert conn.rejoin_likely and conn in edge.server.turns.likely
            conn.connection_lost(None)
            assert conn not in edge.server.turns.likely  # closed: forgotten

    run(main())


def test_over_loopback_a_burst_is_held_back_and_every_request_is_answered(tmp_path):
    """Real sockets on a real uvloop server: requests that arrive while their connection is not
    read wait in the kernel and are answered once it is read again."""
    n = 200

    async def main():
        async with Listening(tmp_path) as edge:
            server = edge.server
            server.turns.budget = 0.0
            server.turns.hold_back_after = 8
            server.rearm_per_turn = 16
            socks = []
            try:
                for _ in range(n):
                    s = socket.create_connection((edge.host, edge.port))
                    s.setblocking(False)
                    socks.append(s)
                while len(server.connections) < n:  # accepted
                    await asyncio.sleep(0.01)
                for i, s in enumerate(socks):  # all in one go: the server's next poll finds them all readable
                    s.send(frame(unknown_sync(f"big{i}"), SYNC_V, 100 + i))

                async def answer(s):
                    return decode(await sock_answer(s), m.SyncGroupRequest.API_KEY, SYNC_V)

                got = await asyncio.wait_for(asyncio.gather(*(answer(s) for s in socks)), 30)
                assert [cid for cid, _ in got] == [100 + i for i in range(n)]
                assert all(resp.error_code == E.UNKNOWN_MEMBER_ID for _, resp in got)
                assert server.read_bursts >= 1 and server.held_back_total > 0
                assert not server.held_back and all(not c.held_back and not c.paused for c in server.connections)
            finally:
                for s in socks:
                    s.close()

    run(main())
