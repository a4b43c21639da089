"""The file log's compaction: :class:`Compaction` owns the compactor thread and its job queue;
its writer-side half (start, swap, finish) runs on the writer thread when the
:class:`~coordinator.store.writer.Writer` it was built with asks. The
:class:`~coordinator.store.filelog.LogStore` holds one.

Compaction
----------
Keeps the last value of each key, in log order, and drops keys whose last value is a tombstone (one
file, so no older copy of a dropped key can resurface). Triggered after a batch when a shard's file
is at least ``compact_threshold_bytes`` (64 MiB) and at least ``compact_dead_ratio`` (half) of its
entry bytes are dead; :meth:`LogStore.compact` forces it. A compactor thread reads the file up to the
size S the writer had written when it asked, writes the live entries to ``compacting.tmp`` and
fsyncs it; the writer thread then copies the entries appended since S (raw bytes), writes the header
(``durable_end`` = new size), fsyncs, renames and fsyncs the directory between two batches, so no
append is lost or reordered and the event loop never waits for a compaction. Compaction fsyncs even
under ``fsync="never"``: it is rare, and an unsynced rename could lose the whole shard after an OS
crash, not just a recent tail. The dead ratio is known cheaply: per shard a dict ``hash(key) ->
framed size of its live entry`` and the file size. A hash collision only skews that estimate; the
compaction itself works on the real keys.

Apart from file creation, cutting a damaged tail at open, and compaction (all rare, and structural),
``fsync="never"`` never calls fsync, not even at close: that mode leaves flushing to the OS.

"""
from __future__ import annotations

import os
import queue
import threading
import time
from concurrent.futures import Future

import structlog

from coordinator.store import ShardFailedError
from coordinator.store.fileio import _close_quietly, _fail, _fsync_dir, _pread_all, _pwrite_all, _unlink_quietly
from coordinator.store.logformat import (
    COMPACT_TMP,
    HEADER_SIZE,
    Damage,
    LogClosedError,
    LogCorruptError,
    LogError,
    _frame_problem,
    _parse_positions,
    encode_header,
)
from coordinator.store.writer import _SWAP, _SWAP_FAILED, _Shard

log = structlog.get_logger("herd.log")


class Compaction:
    """Compaction of a file log's shards. ``writer`` is what it asks of the writer: ``post(item)``
    (a swap or a failure for the writer thread), ``is_open()``, ``fail_shard(st, exc, what)``,
    ``shards``."""

    def __init__(self, writer, threshold_bytes: int, dead_ratio: float, auto_compact: bool):
        self._writer = writer
        self.compact_threshold_bytes = threshold_bytes
        self.compact_dead_ratio = dead_ratio
        self.auto_compact = auto_compact
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()  # (shard id, size) to compact; None: stop
        self._compactor: threading.Thread | None = None
        # Test hook: called in the compactor thread with the shard id once the compacted file is
        # written and fsynced, before the writer swaps it in.
        self.written_hook = None

    def start(self) -> None:
        self._compactor = threading.Thread(target=self._compactor_main, name="herd-log-compactor", daemon=True)
        self._compactor.start()

    def stop(self) -> None:
        """Stop the compactor thread (the writer is closing: a compaction under way is abandoned)."""
        self._jobs.put(None)
        self._compactor.join()

    def abandon_jobs(self, exc: BaseException) -> None:
        """Fail the compactions asked for after the compactor stopped (at close)."""
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self.over(self._writer.shards[job[0]], exc)

    # ---- compaction (writer side) ----------------------------------------------------------------

    def maybe_compact(self, st: _Shard) -> None:
        if not self.auto_compact or st.compacting or st.failed is not None:
            return
        body = st.size - HEADER_SIZE
        if (st.size >= self.compact_threshold_bytes and st.size >= st.no_auto_below
                and body - st.live_bytes >= self.compact_dead_ratio * body):
            self._start_compaction(st)

    def request(self, st: _Shard, fut: Future) -> None:
        if st.failed is not None:
            _fail(fut, ShardFailedError(st.id, st.failed))
        elif st.compacting:
            st.next_waiters.append(fut)
        else:
            st.waiters.append(fut)
            self._start_compaction(st)

    def _start_compaction(self, st: _Shard) -> None:
        if not self._writer.is_open():
            self.over(st, LogClosedError("log store closing"))
            return
        st.compacting = True
        st.snapshot = st.written  # what is in the file; the swap copies the rest, all written by then
        self._jobs.put((st.id, st.snapshot[0]))

    def swap(self, shard_id: int, tmp_fd: int, tmp_size: int, kept: int, started: float) -> None:
        st = self._writer.shards[shard_id]
        tmp_path = st.dir / COMPACT_TMP
        if st.failed is not None:
            _close_quietly(tmp_fd)
            _unlink_quietly(tmp_path)
            self.over(st, ShardFailedError(shard_id, st.failed))
            return
        snap_size, snap_entries = st.snapshot
        before = st.size
        renamed = False
        try:
            tail = _pread_all(st.fd, st.size - snap_size, snap_size)
            _pwrite_all(tmp_fd, tail, tmp_size)
            new_size = tmp_size + len(tail)
            _pwrite_all(tmp_fd, encode_header(shard_id, new_size), 0)
            os.fsync(tmp_fd)
            os.rename(tmp_path, st.path)
            renamed = True
            _fsync_dir(st.dir)
        except OSError as exc:
            if renamed:  # the new file is in place but the directory may not be durable: stop here
                os.close(st.fd)
                st.fd = tmp_fd
                self._writer.fail_shard(st, exc, "compaction")
            else:
                _close_quietly(tmp_fd)
                _unlink_quietly(tmp_path)
                self._writer.fail_shard(st, exc, "compaction")
            self.over(st, exc)
            return
        os.close(st.fd)
        st.fd = tmp_fd
        st.size = st.allocated = st.durable_end = new_size
        st.entries = kept + (st.entries - snap_entries)
        st.written = (st.size, st.entries)
        st.synced = True
        st.compactions += 1
        seconds = time.perf_counter() - started
        st.compaction_seconds += seconds
        info = {"shard": shard_id, "bytes_before": before, "bytes_after": new_size, "entries": st.entries,
                "seconds": round(seconds, 3)}
        log.info("log.compacted", **info)
        self.over(st, None, info)

    def over(self, st: _Shard, exc: BaseException | None, info: dict | None = None) -> None:
        st.compacting = False
        waiters, st.waiters = st.waiters, []
        for f in waiters:
            if exc is None:
                f.set_result(info)
            else:
                _fail(f, exc)
        if exc is not None and not isinstance(exc, LogClosedError):
            st.no_auto_below = st.size + self.compact_threshold_bytes
        if st.next_waiters:
            st.waiters, st.next_waiters = st.next_waiters, []
            if st.failed is not None:
                self.over(st, ShardFailedError(st.id, st.failed))
            else:
                self._start_compaction(st)

    # ---- compactor thread ------------------------------------------------------------------------

    def _compactor_main(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            shard_id, snap_size = job
            st = self._writer.shards[shard_id]
            started = time.perf_counter()
            tmp_path = st.dir / COMPACT_TMP
            tmp_fd = -1
            try:
                tmp_fd, tmp_size, kept = self._compact_file(st, snap_size)
                hook = self.written_hook
                if hook is not None:
                    hook(shard_id)
                if not self._writer.is_open():
                    raise LogClosedError("log store closing")
            except BaseException as exc:
                if tmp_fd >= 0:
                    _close_quietly(tmp_fd)
                _unlink_quietly(tmp_path)
                if not isinstance(exc, LogClosedError):
                    log.error("log.compaction_failed", shard=shard_id, error=f"{type(exc).__name__}: {exc}")
                self._writer.post((_SWAP_FAILED, shard_id, exc))
                continue
            self._writer.post((_SWAP, shard_id, tmp_fd, tmp_size, kept, started))

    def _compact_file(self, st: _Shard, snap_size: int) -> tuple[int, int, int]:
        """Write the live entries of ``st.path[:snap_size]`` to the temp file, fsynced.
        -> (open fd, size written, entries kept)."""
        with open(st.path, "rb") as f:
            buf = f.read(snap_size)
        if len(buf) != snap_size:
            raise LogError(f"{st.path}: expected {snap_size} bytes, read {len(buf)}")
        frames: list = []
        stop = _parse_positions(buf, HEADER_SIZE, snap_size, frames)
        if stop != snap_size:
            reason = _frame_problem(buf, stop, snap_size)
            raise LogCorruptError([Damage(st.id, str(st.path), stop, reason or "invalid entry", "corrupt",
                                          "found by compaction in data written since open", snap_size)])
        if not self._writer.is_open():
            raise LogClosedError("log store closing")
        last = {}
        for i, fr in enumerate(frames):
            last[fr[3]] = i
        out = bytearray(HEADER_SIZE)  # the writer writes the real header at the swap
        view = memoryview(buf)
        kept = 0
        run_start = run_end = -1
        for i, (p, n, _a, k, v) in enumerate(frames):
            if v is None or last[k] != i:
                continue
            kept += 1
            if p == run_end:
                run_end = n
            else:
                if run_start >= 0:
                    out += view[run_start:run_end]
                run_start, run_end = p, n
        if run_start >= 0:
            out += view[run_start:run_end]
        del view, frames, last
        fd = os.open(st.dir / COMPACT_TMP, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        try:
            _pwrite_all(fd, out, 0)
            os.fsync(fd)
        except BaseException:
            os.close(fd)
            raise
        return fd, len(out), kept
