"""Produce v3-v8, written by hand: Kafka's schema for it is not among the files herd generates
from, and herd only needs to refuse it clearly.

herd stores no records, but it must advertise Produce: librdkafka enables its v2 message format
(and with it a consistent Fetch encoding) only when the broker advertises Produce v3+. A Produce
request that does arrive is answered with an error for every partition. v3-v8 are the
non-flexible versions that carry message format v2.
"""
from __future__ import annotations

import struct
from dataclasses import dataclass, field

from protocol.wire import ProtocolError

MIN_VERSION = 3
MAX_VERSION = 8
API_KEY = 0

_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_HI = struct.Struct(">hi")
_PART_V3 = struct.Struct(">ihqq")  # index, error, base offset, log append time
_PART_V5 = struct.Struct(">ihqqq")  # + log start offset


@dataclass
class ProduceRequest:
    transactional_id: str | None = None
    acks: int = -1
    timeout_ms: int = 0
    topics: list[tuple[str, list[int]]] = field(default_factory=list)  # (name, partition indexes)


def _string(buf: bytes, pos: int, nullable: bool) -> tuple[str | None, int]:
    if pos + 2 > len(buf):
        raise ProtocolError("Produce: truncated string length")
    n, = _I16.unpack_from(buf, pos)
    pos += 2
    if n < 0:
        if nullable:
            return None, pos
        raise ProtocolError("Produce: null topic name")
    if pos + n > len(buf):
        raise ProtocolError("Produce: string runs past the end")
    try:
        return buf[pos:pos + n].decode(), pos + n
    except UnicodeDecodeError:
        raise ProtocolError("Produce: string is not UTF-8") from None


def _count(buf: bytes, pos: int) -> tuple[int, int]:
    if pos + 4 > len(buf):
        raise ProtocolError("Produce: truncated array length")
    n, = _I32.unpack_from(buf, pos)
    if n < 0 or n > len(buf) - pos:
        raise ProtocolError(f"Produce: bad array length {n}")
    return n, pos + 4


def decode_request(buf: bytes, pos: int, version: int) -> ProduceRequest:
    if not MIN_VERSION <= version <= MAX_VERSION:
        raise ProtocolError(f"Produce has no version {version} here")
    req = ProduceRequest()
    req.transactional_id, pos = _string(buf, pos, True)
    if pos + 6 > len(buf):
        raise ProtocolError("Produce: truncated")
    req.acks, req.timeout_ms = _HI.unpack_from(buf, pos)
    pos += 6
    ntopics, pos = _count(buf, pos)
    for _ in range(ntopics):
        name, pos = _string(buf, pos, False)
        nparts, pos = _count(buf, pos)
        parts = []
        for _ in range(nparts):
            if pos + 8 > len(buf):
                raise ProtocolError("Produce: truncated partition")
            index, size = struct.unpack_from(">ii", buf, pos)
            pos += 8
            if size > 0:
                if pos + size > len(buf):
                    raise ProtocolError("Produce: records run past the end")
                pos += size
            parts.append(index)
        req.topics.append((name, parts))
    if pos != len(buf):  # Kafka fails a request with bytes after its body (the connection closes)
        raise ProtocolError(f"Produce v{version}: {len(buf) - pos} bytes after the request body")
    return req


class ProduceResponse:
    """Every partition of the request answered with ``error_code`` (and, v8, ``message``)."""

    def __init__(self, request: ProduceRequest, error_code: int, message: str):
        self.request = request
        self.error_code = error_code
        self.message = message

    def encode_into(self, out: bytearray, version: int) -> None:
        out += _I32.pack(len(self.request.topics))
        msg = self.message.encode()
        for name, parts in self.request.topics:
            raw = name.encode()
            out += _I16.pack(len(raw))
            out += raw
            out += _I32.pack(len(parts))
            for index in parts:
                if version >= 5:
                    out += _PART_V5.pack(index, self.error_code, -1, -1, -1)
                else:
                    out += _PART_V3.pack(index, self.error_code, -1, -1)
                if version >= 8:
                    out += b"\x00\x00\x00\x00"  # record_errors: empty
                    out += _I16.pack(len(msg))
                    out += msg
        out += b"\x00\x00\x00\x00"  # throttle_time_ms
