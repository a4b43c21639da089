"""Byte-level reading and writing for the edge's fast paths, next to the codec they shortcut.

The daemon answers its two most frequent requests without building request or response objects:

* Heartbeat: the answer's bytes after the correlation id depend only on (version, error code):
  :func:`heartbeat_tail`, cached.
* a steady-state ConsumerGroupHeartbeat (KIP-848: a member that changes nothing): the request is
  recognised from its bytes (:func:`parse_steady_consumer_heartbeat`) and the answer written from
  the request's own group-id bytes (:func:`steady_consumer_heartbeat_answer`).

Everything here is checked byte for byte against the generated classes of ``protocol.messages``
(tests/protocol/test_fastpath.py). Pure: no I/O.
"""
from __future__ import annotations

import struct

from protocol import messages as m
from protocol.headers import response_header_version

__all__ = ["FRAME_HEAD", "header_tails", "heartbeat_tail", "encode_heartbeat_body",
           "parse_steady_consumer_heartbeat", "steady_consumer_heartbeat_answer"]

FRAME_HEAD = struct.Struct(">ii")  # frame size, correlation id
_II = struct.Struct(">ii")
_I32 = struct.Struct(">i")

HEARTBEAT = m.HeartbeatRequest.API_KEY
_HeartbeatResponse = m.HeartbeatResponse


def header_tails(supported: dict[int, tuple[int, int]]) -> dict[int, tuple[bytes, ...]]:
    """api key -> by version, what follows the correlation id in a response header: the empty
    tagged fields of header v1 (flexible versions), or nothing (v0; always for ApiVersions)."""
    return {key: tuple(b"\x00" if response_header_version(key, v) else b"" for v in range(hi + 1))
            for key, (_, hi) in supported.items()}


_heartbeat_bodies: dict[tuple[int, int], bytes] = {}  # (version, error code) -> encoded body
_heartbeat_tails: dict[tuple[int, int], bytes] = {}  # (version, code) -> header tail + body


def encode_heartbeat_body(version: int, code: int) -> bytes:
    """A plain HeartbeatResponse body (no throttle, no tagged fields) of this version and code."""
    body = _heartbeat_bodies.get((version, code))
    if body is None:
        body = _heartbeat_bodies[(version, code)] = _HeartbeatResponse(error_code=code).encode(version)
    return body


def heartbeat_tail(version: int, code: int) -> bytes:
    """What follows the correlation id in a plain HeartbeatResponse of this version and code."""
    tail = _heartbeat_tails.get((version, code))
    if tail is None:
        header = b"\x00" if response_header_version(HEARTBEAT, version) else b""
        tail = _heartbeat_tails[(version, code)] = header + encode_heartbeat_body(version, code)
    return tail


# A steady-state ConsumerGroupHeartbeat's bytes after its member epoch: instance id, rack id null,
# rebalance timeout -1, subscribed topic names, (v1+) regex, server assignor, topic partitions
# null, no tagged fields. By version.
_CG_STEADY_TAIL = (b"\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00", b"\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00\x00")
_CG_OK_HEAD = b"\x00" + b"\x00" * 6 + b"\x00"  # header tags; throttle 0, error 0, error message null
_CG_OK_END = b"\xff\x00"  # assignment null, no tagged fields


def parse_steady_consumer_heartbeat(frame: bytes, pos: int, version: int):
    """A ConsumerGroupHeartbeat body at ``frame[pos:]`` that is exactly a group id and a member id
    (compact strings of 1-126 bytes), an epoch > 0 and every other field null: ``(group_id,
    member_id, epoch, member_span)``, ``member_span`` the (start, end) of the member id's encoded
    bytes (its length and characters) that the answer repeats; None for anything else (the full decoder then says
    what it is)."""
    try:
        n = frame[pos] - 1
        if not 0 < n < 127:
            return None
        g_end = pos + 1 + n
        n = frame[g_end] - 1
        if not 0 < n < 127:
            return None
        m_end = g_end + 1 + n
        epoch = _I32.unpack_from(frame, m_end)[0]
        if epoch <= 0 or frame[m_end + 4:] != _CG_STEADY_TAIL[version]:
            return None
        group_id = frame[pos + 1:g_end].decode()
        member_id = frame[g_end + 1:m_end].decode()
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return group_id, member_id, epoch, (g_end, m_end)


def steady_consumer_heartbeat_answer(frame: bytes, member_span: tuple[int, int], epoch: int,
                                     interval_ms: int) -> bytes:
    """The answer to a steady ConsumerGroupHeartbeat after the correlation id (header tagged
    fields, then the body): no error, the member id as the request encoded it, its epoch, the
    heartbeat interval, no assignment. The same bytes at v0 and v1."""
    start, end = member_span
    return b"".join((_CG_OK_HEAD, frame[start:end], _II.pack(epoch, interval_ms), _CG_OK_END))
