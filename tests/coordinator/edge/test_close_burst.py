"""Clients that close their connections all at once (a big application stopping) are closed by the
server ``close_per_turn`` per loop turn (Connection.eof_received, Server.close_soon), so other
connections are served meanwhile; every one is still closed and forgotten. Real sockets on a real
uvloop server over loopback."""
from __future__ import annotations

import asyncio
import socket

from coordinator.edge.server import Connection
from protocol import messages as m
from tests.coordinator.edge.test_server_fastpath import Listening, answers, decode, frame, run, sock_answer


def test_a_burst_of_closes_is_closed_by_turns_and_nothing_is_left_behind(tmp_path, monkeypatch):
    n = 120
    turn_of_lost: list[int] = []
    turn = [0]
    lost = Connection.connection_lost

    def counted_lost(self, exc):
        turn_of_lost.append(turn[0])
        lost(self, exc)

    monkeypatch.setattr(Connection, "connection_lost", counted_lost)

    async def main():
        loop = asyncio.get_running_loop()
        async with Listening(tmp_path) as edge:
            server = edge.server
            server.close_per_turn = 16
            ticking = [True]

            def tick():  # counts loop turns: one call_soon callback per turn
                turn[0] += 1
                if ticking[0]:
                    loop.call_soon(tick)

            socks = []
            other = None
            try:
                for _ in range(n):
                    socks.append(socket.create_connection((edge.host, edge.port)))
                other = socket.create_connection((edge.host, edge.port))
                other.setblocking(False)
                while len(server.connections) < n + 1:  # accepted
                    await asyncio.sleep(0.01)
                loop.call_soon(tick)
                await asyncio.sleep(0)
                for s in socks:  # all in one go: the server's next poll reads every EOF
                    s.close()
                socks = []
                # meanwhile another client is served
                other.send(frame(m.ApiVersionsRequest(), 3, 77))
                assert decode(await sock_answer(other, 10), m.ApiVersionsRequest.API_KEY, 3)[0] == 77
                for _ in range(1000):
                    if len(turn_of_lost) == n:
                        break
                    await asyncio.sleep(0.01)
                assert len(turn_of_lost) == n
                per_turn: dict[int, int] = {}
                for t in turn_of_lost:
                    per_turn[t] = per_turn.get(t, 0) + 1
                assert max(per_turn.values()) <= 16  # close_per_turn a turn
                assert len(per_turn) >= n // 16
                assert len(server.connections) == 1 and not server.to_close and not server.close_scheduled
                assert server.per_ip == {"127.0.0.1": 1}
            finally:
                ticking[0] = False
                for s in socks:
                    s.close()
                if other is not None:
                    other.close()

    run(main())


def test_a_client_that_closes_after_its_request_is_answered_and_then_closed(tmp_path):
    """A request read before the client's EOF is answered (a half-closed client still reads), then
    the server closes its side."""

    async def main():
        loop = asyncio.get_running_loop()
        async with Listening(tmp_path) as edge:
            server = edge.server
            s = socket.create_connection((edge.host, edge.port))
            s.setblocking(False)
            try:
                s.send(frame(m.ApiVersionsRequest(), 3, 5))
                s.shutdown(socket.SHUT_WR)
                data = b""
                while True:
                    chunk = await asyncio.wait_for(loop.sock_recv(s, 65536), 10)
                    if not chunk:  # the server closed its side
                        break
                    data += chunk
                (body,) = answers(data)
                assert decode(body, m.ApiVersionsRequest.API_KEY, 3)[0] == 5
                for _ in range(500):
                    if not server.connections:
                        break
                    await asyncio.sleep(0.01)
                assert not server.connections and server.per_ip == {}
            finally:
                s.close()

    run(main())
