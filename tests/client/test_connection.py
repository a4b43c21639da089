"""The sans-IO connection: framing, correlation, ApiVersions negotiation (KIP-511 and fallbacks)."""

from __future__ import annotations

import struct

import pytest

from protocol import errors as E
from protocol import messages as m
from protocol.client_connection import CLIENT_VERSIONS, Connection, ConnectionBroken, Ready, Response, negotiate
from protocol.framing import frame
from protocol.headers import encode_response_header
from tests.client.harness import requests_in


def answer(header, response, version=None):
    version = header.api_version if version is None else version
    return frame(
        encode_response_header(header.correlation_id, header.api_key, version) + response.encode(version)
    )


BROKER = m.ApiVersionsResponse(
    api_keys=[
        m.ApiVersionsResponseApiVersion(api_key=k, min_version=0, max_version=v)
        for k, v in {18: 3, 10: 3, 11: 5, 12: 4, 14: 4, 13: 4, 8: 8, 9: 7, 3: 12}.items()
    ]
)


def handshake(conn: Connection, broker=BROKER) -> Ready:
    conn.initiate()
    [(h, req)] = requests_in(conn.data_to_send())
    assert h.api_key == 18 and h.api_version == m.ApiVersionsRequest.MAX_VERSION
    assert req.client_software_name == "herd-python"
    # A broker that knows only v0-3 answers a v4 request with UNSUPPORTED_VERSION in a v0 body.
    body = (
        struct.pack(">ih", h.correlation_id, E.UNSUPPORTED_VERSION)
        + struct.pack(">i", 1)
        + struct.pack(">hhh", 18, 0, 3)
    )
    assert conn.receive(frame(body)) == []
    [(h2, _)] = requests_in(conn.data_to_send())
    assert h2.api_version == 3
    [ready] = conn.receive(answer(h2, broker))
    assert isinstance(ready, Ready)
    return ready


def test_kip511_negotiation_and_versions():
    conn = Connection(client_id="me")
    ready = handshake(conn)
    assert conn.ready
    assert ready.versions[11] == 5 and ready.versions[10] == 3 and ready.versions[8] == 8
    assert ready.versions[9] == 7  # OffsetFetch: broker max 7 < ours


def test_undecodable_handshake_falls_back_to_v0():
    conn = Connection()
    conn.initiate()
    [(h, _)] = requests_in(conn.data_to_send())
    garbage = struct.pack(">ih", h.correlation_id, 0) + b"\x05\x00"  # truncated flexible body
    assert conn.receive(frame(garbage)) == []
    [(h0, _)] = requests_in(conn.data_to_send())
    assert h0.api_version == 0
    [ready] = conn.receive(answer(h0, BROKER, 0))
    assert ready.versions[12] == 4


def test_handshake_error_breaks_connection():
    conn = Connection()
    conn.initiate()
    [(h, _)] = requests_in(conn.data_to_send())
    with pytest.raises(ConnectionBroken):
        conn.receive(answer(h, m.ApiVersionsResponse(error_code=E.UNKNOWN_SERVER_ERROR)))


def test_requests_and_responses_by_correlation_id_in_pieces():
    conn = Connection(client_id="me")
    handshake(conn)
    c1 = conn.send(m.HeartbeatRequest(group_id="g", generation_id=1, member_id="x"), 4)
    c2 = conn.send(m.FindCoordinatorRequest(key="g"), 3)
    reqs = requests_in(conn.data_to_send())
    assert [h.correlation_id for h, _ in reqs] == [c1, c2] and reqs[0][0].client_id == "me"
    data = answer(reqs[0][0], m.HeartbeatResponse(error_code=E.REBALANCE_IN_PROGRESS)) + answer(
        reqs[1][0], m.FindCoordinatorResponse(host="h", port=1)
    )
    events = []
    for i in range(0, len(data), 3):  # byte dribbles
        events += conn.receive(data[i : i + 3])
    assert [type(e) for e in events] == [Response, Response]
    assert events[0].correlation_id == c1 and events[0].message.error_code == E.REBALANCE_IN_PROGRESS
    assert events[1].message.host == "h"
    assert conn.in_flight == []


def test_undecodable_response_fails_only_that_request():
    conn = Connection()
    handshake(conn)
    c = conn.send(m.HeartbeatRequest(group_id="g"), 0)
    [(h, _)] = requests_in(conn.data_to_send())
    [ev] = conn.receive(frame(struct.pack(">i", c) + b"\x00"))
    assert ev.error is not None and ev.message is None


def test_unknown_correlation_id_breaks_connection():
    conn = Connection()
    handshake(conn)
    with pytest.raises(ConnectionBroken):
        conn.receive(frame(struct.pack(">i", 999) + b"\x00\x00"))


def test_oversized_frame_breaks_connection():
    conn = Connection(max_frame_size=100)
    with pytest.raises(ConnectionBroken):
        conn.receive(struct.pack(">i", 101))


def test_send_before_ready_is_refused():
    with pytest.raises(ConnectionBroken):
        Connection().send(m.HeartbeatRequest(), 0)


def test_negotiate_takes_highest_common_and_drops_disjoint():
    got = negotiate({11: (0, 20), 12: (5, 6), 14: (9, 10)}, {11: (0, 9), 12: (0, 4), 14: (0, 5)})
    assert got == {11: 9}
    assert set(negotiate({k: (0, 100) for k in CLIENT_VERSIONS})) == set(CLIENT_VERSIONS)


def test_software_name_and_what_is_awaited():
    # herd groups names itself herd-admin, and says which request it waits for when it times out
    conn = Connection(client_id="herd-admin", software=("herd-admin", "1"))
    conn.initiate()
    assert conn.awaiting() == [(0, 18, m.ApiVersionsRequest.MAX_VERSION)]
    [(h, req)] = requests_in(conn.data_to_send())
    assert (req.client_software_name, req.client_software_version) == ("herd-admin", "1")
    [ready] = conn.receive(answer(h, BROKER))
    assert isinstance(ready, Ready) and conn.awaiting() == []
    corr = conn.send(m.FindCoordinatorRequest(key="g"), 3)
    assert conn.awaiting() == [(corr, 10, 3)]


def test_a_response_larger_than_the_limit_reports_its_size():
    conn = Connection(max_frame_size=1000)
    conn.initiate()
    conn.data_to_send()
    with pytest.raises(ConnectionBroken) as info:
        conn.receive(b"HTTP/1.1 400 Bad Request\r\n\r\n")
    assert info.value.frame_size == int.from_bytes(b"HTTP", "big")
    conn = Connection()
    conn.initiate()
    with pytest.raises(ConnectionBroken) as info:
        conn.receive(struct.pack(">ii", 4, 12345))  # an unknown correlation id: no size to report
    assert info.value.frame_size is None
