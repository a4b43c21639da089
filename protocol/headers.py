"""Request and response headers.

Request header version: 2 when the API version is flexible, else 1 (v0 only for
ControlledShutdown v0, which herd does not serve). ``ClientId`` keeps its int16 length even in
header v2. Response header: 1 when flexible, else 0; ApiVersions responses always use v0 (KIP-511)
so a client that does not know our versions can still read them.
"""
from __future__ import annotations

import struct
from typing import NamedTuple

from protocol import acls, messages
from protocol.wire import EncodeError, ProtocolError, read_tagged_fields, write_tagged_fields

API_VERSIONS_KEY = 18
_FIXED = struct.Struct(">hhi")
_HEAD = struct.Struct(">hhih")  # api key, api version, correlation id, client id length
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")

# api key -> first flexible version (None: never flexible), for every API the codec knows.
FIRST_FLEXIBLE = {key: cls.FLEXIBLE_VERSION for key, cls in messages.REQUESTS.items()}
FIRST_FLEXIBLE.update({key: cls.FLEXIBLE_VERSION for key, cls in acls.REQUESTS.items()})  # hand-written


class RequestHeader(NamedTuple):
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    tagged_fields: list | None = None

    @property
    def flexible(self) -> bool:
        first = FIRST_FLEXIBLE.get(self.api_key)
        return first is not None and self.api_version >= first


def request_header_version(api_key: int, api_version: int) -> int:
    first = FIRST_FLEXIBLE.get(api_key)
    return 2 if first is not None and api_version >= first else 1


def response_header_version(api_key: int, api_version: int) -> int:
    if api_key == API_VERSIONS_KEY:
        return 0
    first = FIRST_FLEXIBLE.get(api_key)
    return 1 if first is not None and api_version >= first else 0


def decode_request_header(buf: bytes) -> tuple[RequestHeader, int]:
    """Parse a request header at the start of ``buf``; return it and where the body starts.

    For an API key the codec does not know, the header is read as v1 (no tagged fields): enough to
    learn the correlation id and log the client.
    """
    *fields, pos = read_request_header(buf)
    return RequestHeader(*fields), pos


def read_request_header(buf: bytes) -> tuple[int, int, int, str | None, list | None, int]:
    """``decode_request_header`` as a plain tuple, for the server's request path:
    ``(api_key, api_version, correlation_id, client_id, tagged_fields, body_pos)``."""
    if len(buf) < 10:
        raise ProtocolError("request header truncated")
    api_key, api_version, correlation_id, n = _HEAD.unpack_from(buf, 0)
    pos = 10
    if n < 0:
        client_id = None
    else:
        end = pos + n
        if end > len(buf):
            raise ProtocolError("client id runs past the end of the frame")
        try:
            client_id = buf[pos:end].decode()
        except UnicodeDecodeError:
            raise ProtocolError("client id is not UTF-8") from None
        pos = end
    tags = None
    first = FIRST_FLEXIBLE.get(api_key)
    if first is not None and api_version >= first:
        if pos >= len(buf):
            raise ProtocolError("request header tagged fields truncated")
        if buf[pos] == 0:
            pos += 1
        else:
            tags, pos = read_tagged_fields(buf, pos)
    return api_key, api_version, correlation_id, client_id, tags, pos


def encode_request_header(out: bytearray, api_key: int, api_version: int, correlation_id: int,
                          client_id: str | None) -> None:
    try:
        fixed = _FIXED.pack(api_key, api_version, correlation_id)
    except struct.error as exc:
        raise EncodeError(f"request header: {exc}") from None
    out += fixed
    if client_id is None:
        out += b"\xff\xff"
    else:
        cid = client_id.encode()
        if len(cid) > 0x7FFF:
            raise EncodeError("request header: client id longer than 32767 bytes")
        out += _I16.pack(len(cid))
        out += cid
    if request_header_version(api_key, api_version) >= 2:
        out += b"\x00"


def encode_response_header(correlation_id: int, api_key: int, api_version: int) -> bytes:
    try:
        cid = _I32.pack(correlation_id)
    except struct.error as exc:
        raise EncodeError(f"response header: {exc}") from None
    if response_header_version(api_key, api_version) >= 1:
        return cid + b"\x00"
    return cid


def decode_response_header(buf: bytes, api_key: int, api_version: int) -> tuple[int, int]:
    """Return ``(correlation_id, body_pos)``."""
    if len(buf) < 4:
        raise ProtocolError("response header truncated")
    correlation_id, = _I32.unpack_from(buf, 0)
    pos = 4
    if response_header_version(api_key, api_version) >= 1:
        if pos >= len(buf):
            raise ProtocolError("response header tagged fields truncated")
        _, pos = read_tagged_fields(buf, pos)
    return correlation_id, pos


def write_header_tags(out: bytearray, tags) -> None:
    write_tagged_fields(out, tags or ())
