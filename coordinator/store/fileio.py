"""The OS calls the file log makes, each complete: full pwrite/pread, atomic file replacement,
directory fsync, quiet close/unlink."""
from __future__ import annotations

import os
from concurrent.futures import Future
from pathlib import Path

import structlog

log = structlog.get_logger("herd.log")


def _fsync_dir(path) -> None:
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _pwrite_all(fd: int, data, offset: int) -> None:
    view = memoryview(data)
    while view:
        n = os.pwrite(fd, view, offset)
        if n <= 0:
            raise OSError(f"pwrite wrote {n} bytes")
        view = view[n:]
        offset += n


def _pread_all(fd: int, size: int, offset: int) -> bytes:
    parts = []
    while size > 0:
        chunk = os.pread(fd, min(size, 1 << 30), offset)
        if not chunk:
            raise OSError(f"unexpected end of file at byte {offset}")
        parts.append(chunk)
        size -= len(chunk)
        offset += len(chunk)
    return b"".join(parts)


def _write_file_atomic(path: Path, data: bytes) -> None:
    """tmp + fsync + rename + fsync(dir). Used for structure (always fsynced, whatever the mode)."""
    tmp = path.with_name(path.name + ".new")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
    try:
        _pwrite_all(fd, data, 0)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    _fsync_dir(path.parent)


def _fail(fut: Future, exc: BaseException) -> None:
    if not fut.done():
        fut.set_exception(exc)


def _close_quietly(fd: int) -> None:
    try:
        os.close(fd)
    except OSError:
        pass


def _unlink_quietly(path) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        log.warning("log.unlink_failed", path=str(path), error=str(exc))
