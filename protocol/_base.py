"""Base classes for the generated message classes in ``protocol/messages.py``."""
from __future__ import annotations

import struct

from protocol.wire import EncodeError, ProtocolError

_UNSET = object()
_ZERO_UUID = bytes(16)

# What a specialised decoder may raise on malformed input before we wrap it.
_DECODE_FAILURES = (struct.error, IndexError, UnicodeDecodeError, ValueError, TypeError, OverflowError,
                    RecursionError, MemoryError)
_ENCODE_FAILURES = (struct.error, TypeError, AttributeError, ValueError, OverflowError, UnicodeEncodeError)


class _Struct:
    __slots__ = ()
    NAME = ""
    FIELDS: tuple = ()

    def __eq__(self, other):
        if type(other) is not type(self):
            return NotImplemented
        for name in self.__slots__:
            if getattr(self, name) != getattr(other, name):
                return False
        return True

    __hash__ = None  # mutable

    def __repr__(self):
        inner = ", ".join(f"{n}={getattr(self, n)!r}" for n in self.FIELDS)
        return f"{type(self).__name__}({inner})"

    def to_dict(self) -> dict:
        """Plain data (lists, dicts, scalars) for logging, JSON and tests."""
        return {n: _plain(getattr(self, n)) for n in self.FIELDS}


def _plain(value):
    if isinstance(value, _Struct):
        return value.to_dict()
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


class _Message(_Struct):
    __slots__ = ()
    TYPE = ""
    API_KEY: int | None = None
    MIN_VERSION = 0
    MAX_VERSION = 0
    FLEXIBLE_VERSION: int | None = None
    _DEC: tuple = ()
    _ENC: tuple = ()

    @classmethod
    def is_flexible(cls, version: int) -> bool:
        return cls.FLEXIBLE_VERSION is not None and version >= cls.FLEXIBLE_VERSION

    @classmethod
    def supports(cls, version: int) -> bool:
        return cls.MIN_VERSION <= version <= cls.MAX_VERSION

    @classmethod
    def decode_from(cls, buf, pos: int, version: int):
        """Decode at ``pos``; return ``(message, end_pos)``. Malformed input → ProtocolError."""
        if not cls.MIN_VERSION <= version <= cls.MAX_VERSION:
            raise ProtocolError(f"{cls.NAME} has no version {version}")
        if type(buf) is not bytes:
            buf = bytes(buf)
        try:
            return cls._DEC[version](buf, pos)
        except ProtocolError:
            raise
        except _DECODE_FAILURES as exc:
            raise ProtocolError(f"{cls.NAME} v{version}: malformed ({type(exc).__name__}: {exc})") from None

    @classmethod
    def decode(cls, buf, version: int, pos: int = 0):
        """Decode one message starting at ``pos`` (trailing bytes are ignored, as Kafka does)."""
        return cls.decode_from(buf, pos, version)[0]

    def encode_into(self, out: bytearray, version: int) -> None:
        if not self.MIN_VERSION <= version <= self.MAX_VERSION:
            raise EncodeError(f"{self.NAME} has no version {version}")
        try:
            self._ENC[version](self, out)
        except EncodeError:
            raise
        except _ENCODE_FAILURES as exc:
            raise EncodeError(f"{self.NAME} v{version}: cannot encode ({type(exc).__name__}: {exc})") from None

    def encode(self, version: int) -> bytes:
        out = bytearray()
        self.encode_into(out, version)
        return bytes(out)
