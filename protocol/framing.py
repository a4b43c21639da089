"""Length-prefixed frames: int32 size, then that many bytes.

The size is checked against the maximum as soon as its four bytes arrive, before any of the body
is buffered, so a hostile prefix costs nothing.
"""
from __future__ import annotations

import struct

from protocol.wire import ProtocolError

DEFAULT_MAX_FRAME_SIZE = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes
_SIZE = struct.Struct(">i")


class FrameTooLarge(ProtocolError):
    def __init__(self, size: int, limit: int):
        super().__init__(f"frame of {size} bytes exceeds the maximum of {limit}")
        self.size = size
        self.limit = limit


class FrameDecoder:
    """Incremental frame splitter: ``split(data)`` returns every frame completed by ``data`` (and
    the error of an invalid size prefix after them, if any)."""

    __slots__ = ("max_frame_size", "_buf", "_need", "error")

    def __init__(self, max_frame_size: int = DEFAULT_MAX_FRAME_SIZE):
        self.max_frame_size = max_frame_size
        self._buf = bytearray()
        self._need = -1  # size of the frame being assembled, -1 while reading its prefix
        self.error: ProtocolError | None = None  # an invalid size prefix ended the stream

    @property
    def buffered(self) -> int:
        return len(self._buf)

    @property
    def reserved(self) -> int:
        """Bytes this stream holds or has announced: the whole size of the frame being assembled
        (its prefix read), else what is buffered. A server's memory budget counts this (Kafka's
        memory pool allocates a request's buffer when its size prefix arrives)."""
        need = self._need
        return need + 4 if need >= 0 else len(self._buf)

    def feed(self, data) -> list[bytes]:
        """Every frame completed by ``data``; raises the framing error if the stream has one
        (then the frames before it in ``data`` are lost: a server uses ``split``)."""
        frames, error = self.split(data)
        if error is not None:
            raise error
        return frames

    def split(self, data) -> tuple[list[bytes], ProtocolError | None]:
        """The frames completed by ``data``, and the error of an invalid size prefix after them
        (None if there is none). After an error the stream cannot be resynchronised: nothing is
        buffered and every later call returns the same error."""
        if self.error is not None:
            return [], self.error
        if not self._buf and self._need < 0 and len(data) >= 4:
            # the common case: the read holds exactly one whole frame and nothing is buffered
            need, = _SIZE.unpack_from(data, 0)
            if 0 <= need <= self.max_frame_size and len(data) == need + 4:
                return [bytes(data[4:])], None
        buf = self._buf
        buf += data
        frames = []
        start = 0
        end = len(buf)
        while True:
            need = self._need
            if need < 0:
                if end - start < 4:
                    break
                need, = _SIZE.unpack_from(buf, start)
                if need < 0 or need > self.max_frame_size:
                    buf.clear()
                    self.error = FrameTooLarge(need, self.max_frame_size) if need >= 0 else ProtocolError(
                        f"negative frame size {need}")
                    return frames, self.error
                start += 4
                self._need = need
            if end - start < need:
                break
            frames.append(bytes(buf[start:start + need]))
            start += need
            self._need = -1
        if start:
            del buf[:start]
        return frames, None


def frame(payload: bytes) -> bytes:
    return _SIZE.pack(len(payload)) + payload
