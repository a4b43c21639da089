"""Bounds-checked wire primitives shared by the generated codec and hand-written code.

Every reader takes ``(buf, pos)`` and returns ``(value, new_pos)``. Every failure to read raises
:class:`ProtocolError`; nothing here lets ``struct.error``, ``IndexError`` or
``UnicodeDecodeError`` escape. Writers append to a ``bytearray``.

The generated module (``protocol/messages.py``) inlines the common cases of these for speed and
falls back to the functions here for the rare ones (multi-byte varints, unknown tagged fields).
"""
from __future__ import annotations

import struct

__all__ = [
    "ProtocolError", "EncodeError",
    "read_uvarint", "write_uvarint", "uvarint_bytes", "read_varint", "write_varint",
    "read_varlong", "write_varlong", "read_tagged_fields", "write_tagged_fields",
    "INT8", "INT16", "INT32", "INT64", "UINT16", "UINT32", "FLOAT64",
]


class ProtocolError(ValueError):
    """Malformed input: the bytes do not decode as the message/version they claim to be."""


class EncodeError(ValueError):
    """A value cannot be written at the requested version (Kafka's UnsupportedVersionException
    for a non-ignorable field, a null in a non-nullable field, a value out of range)."""


INT8 = struct.Struct(">b")
INT16 = struct.Struct(">h")
INT32 = struct.Struct(">i")
INT64 = struct.Struct(">q")
UINT16 = struct.Struct(">H")
UINT32 = struct.Struct(">I")
FLOAT64 = struct.Struct(">d")

# One-byte unsigned varints, the overwhelmingly common case (lengths and counts < 128).
UVARINT_SMALL = tuple(bytes((i,)) for i in range(128))


def read_uvarint(buf, pos: int) -> tuple[int, int]:
    """Unsigned 32-bit LEB128 varint, at most 5 bytes (as Kafka's ByteUtils.readUnsignedVarint)."""
    value = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise ProtocolError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if value > 0xFFFFFFFF:
                raise ProtocolError("varint exceeds 32 bits")
            return value, pos
        shift += 7
        if shift > 28:
            raise ProtocolError("varint is too long")


def _read_uvarlong(buf, pos: int) -> tuple[int, int]:
    value = 0
    shift = 0
    end = len(buf)
    while True:
        if pos >= end:
            raise ProtocolError("truncated varlong")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            if value > 0xFFFFFFFFFFFFFFFF:
                raise ProtocolError("varlong exceeds 64 bits")
            return value, pos
        shift += 7
        if shift > 63:
            raise ProtocolError("varlong is too long")


def uvarint_bytes(value: int) -> bytes:
    if 0 <= value < 128:
        return UVARINT_SMALL[value]
    if value < 0:
        value &= 0xFFFFFFFF  # Java int written as its unsigned 32-bit pattern
    if value > 0xFFFFFFFF:
        raise EncodeError(f"unsigned varint out of range: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def write_uvarint(out: bytearray, value: int) -> None:
    out += uvarint_bytes(value)


def _uvarlong_bytes(value: int) -> bytes:
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def read_varint(buf, pos: int) -> tuple[int, int]:
    """Signed zigzag 32-bit varint."""
    raw, pos = read_uvarint(buf, pos)
    return (raw >> 1) ^ -(raw & 1), pos


def write_varint(out: bytearray, value: int) -> None:
    if not -(1 << 31) <= value < (1 << 31):
        raise EncodeError(f"varint out of range: {value}")
    out += uvarint_bytes(((value << 1) ^ (value >> 31)) & 0xFFFFFFFF)


def read_varlong(buf, pos: int) -> tuple[int, int]:
    """Signed zigzag 64-bit varlong."""
    raw, pos = _read_uvarlong(buf, pos)
    return (raw >> 1) ^ -(raw & 1), pos


def write_varlong(out: bytearray, value: int) -> None:
    if not -(1 << 63) <= value < (1 << 63):
        raise EncodeError(f"varlong out of range: {value}")
    out += _uvarlong_bytes(((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF)


def read_tagged_fields(buf, pos: int) -> tuple[list | None, int]:
    """Read a tagged-field section keeping every field as raw ``(tag, bytes)``."""
    count, pos = read_uvarint(buf, pos)
    if count == 0:
        return None, pos
    if count > len(buf) - pos:
        raise ProtocolError("tagged field count exceeds remaining bytes")
    fields = []
    for _ in range(count):
        tag, pos = read_uvarint(buf, pos)
        size, pos = read_uvarint(buf, pos)
        end = pos + size
        if end > len(buf):
            raise ProtocolError("tagged field runs past the end of the buffer")
        fields.append((tag, bytes(buf[pos:end])))
        pos = end
    return fields, pos


def write_tagged_fields(out: bytearray, fields) -> None:
    """Write ``(tag, bytes)`` pairs as a tagged-field section, sorted by tag."""
    if not fields:
        out += b"\x00"
        return
    fields = sorted(fields, key=_first)
    out += uvarint_bytes(len(fields))
    prev = -1
    for tag, data in fields:
        if tag == prev:
            raise EncodeError(f"duplicate tag {tag}")
        prev = tag
        out += uvarint_bytes(tag)
        out += uvarint_bytes(len(data))
        out += data


def _first(pair):
    return pair[0]
