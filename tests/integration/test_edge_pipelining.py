"""Pipelined requests against a real daemon: many requests in one TCP write are all answered, in
request order, also when the client reads its answers late (herd stops reading meanwhile)."""
from __future__ import annotations

import socket
import struct
import threading
import time

import pytest

from protocol import errors as E
from protocol import messages as m
from protocol.headers import decode_response_header, encode_request_header
from tools.daemon import Daemon
from tools.rawclient import RawClient

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def herd(tmp_path_factory):
    with Daemon(tmp_path_factory.mktemp("pipelining") / "data", "--max-pending-bytes-per-connection", "65536",
                fsync="never") as d:
        yield d


def frame(request, version: int, correlation_id: int) -> bytes:
    out = bytearray()
    encode_request_header(out, request.API_KEY, version, correlation_id, "pipeliner")
    request.encode_into(out, version)
    return struct.pack(">i", len(out)) + bytes(out)


def join(herd, group_id: str) -> m.HeartbeatRequest:
    with RawClient(herd.address) as c:
        j = c.call(m.JoinGroupRequest(group_id=group_id, session_timeout_ms=60_000, rebalance_timeout_ms=60_000,
                                      protocol_type="consumer",
                                      protocols=[m.JoinGroupRequestProtocol(name="range", metadata=b"")]), 3)
        assert j.error_code == E.NONE
        s = c.call(m.SyncGroupRequest(group_id=group_id, generation_id=j.generation_id, member_id=j.member_id,
                                      assignments=[m.SyncGroupRequestAssignment(member_id=j.member_id,
                                                                                assignment=b"")]), 3)
        assert s.error_code == E.NONE
    return m.HeartbeatRequest(group_id=group_id, generation_id=j.generation_id, member_id=j.member_id)


def read_answers(c: RawClient, n: int, api_key: int, version: int) -> list[tuple[int, object]]:
    out = []
    for _ in range(n):
        body = c.recv_frame()
        cid, pos = decode_response_header(body, api_key, version)
        out.append((cid, m.RESPONSES[api_key].decode(body, version, pos)))
    return out


def read_many(sock: socket.socket, n: int) -> list[bytes]:
    """``n`` answer frames, read in large chunks (RawClient reads each frame with two recv calls)."""
    buf = bytearray()
    out = []
    pos = 0
    while len(out) < n:
        while len(buf) - pos >= 4 and len(buf) - pos - 4 >= struct.unpack_from(">i", buf, pos)[0]:
            size, = struct.unpack_from(">i", buf, pos)
            out.append(bytes(buf[pos + 4:pos + 4 + size]))
            pos += 4 + size
        if len(out) < n:
            chunk = sock.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed by herd")
            buf += chunk
    assert pos == len(buf)
    return out


def test_pipelined_heartbeats_of_several_members_are_answered_in_order(herd):
    members = [join(herd, f"pipe-{i}") for i in range(4)]
    with RawClient(herd.address) as c:
        c.sock.sendall(b"".join(frame(members[i % 4], 4, 1000 + i) for i in range(100)))
        got = read_answers(c, 100, 12, 4)
        assert [cid for cid, _ in got] == list(range(1000, 1100))
        assert all(r.error_code == E.NONE for _, r in got)
        # and the connection goes on serving one request at a time
        assert c.call(members[0], 4).error_code == E.NONE


def test_a_slow_reader_of_a_long_pipeline_gets_every_answer_in_order(herd):
    """~8 MB of ApiVersions answers to a client that sends everything before reading anything:
    more than the socket buffers and max_pending_bytes_per_connection hold, so herd must stop
    reading the socket and go on once the client reads; meanwhile other connections are served."""
    n = 60_000
    payload = b"".join(frame(m.ApiVersionsRequest(), 3, i) for i in range(n))
    with RawClient(herd.address, timeout=30) as c:
        c.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        sender = threading.Thread(target=c.sock.sendall, args=(payload,), daemon=True)
        sender.start()
        time.sleep(1.0)  # herd answers until its writes back up, then stops reading
        with RawClient(herd.address) as other:
            assert other.call(m.ApiVersionsRequest(), 3).error_code == E.NONE
        answers = read_many(c.sock, n)
        # ApiVersions answers have header v0: correlation id, then the body's error code
        assert {struct.unpack_from(">h", a, 4)[0] for a in answers} == {E.NONE}
        cids = [struct.unpack_from(">i", a)[0] for a in answers]
        sender.join(10)
        assert not sender.is_alive()
        assert cids == list(range(n))
