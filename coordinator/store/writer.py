"""The file log's writing machinery: :class:`Writer`, the object that owns the open files (the
shards' state), the staged writes, the writer thread, the sync threads and the locks between them
and the event loop (see ``Writer.__init__`` for what each lock guards). The
:class:`~coordinator.store.filelog.LogStore` holds one (``writer``) and one
:class:`~coordinator.store.compaction.Compaction`; its ``submit``, ``flush``, ``append`` are the
writer's.

Writing: framed on the loop, written and fsynced off it (fsync="always"), group commit
--------------------------------------------------------------------------------------
:meth:`LogStore.submit` stages entries for a shard and returns that shard's next sequence number;
:meth:`LogStore.flush` (the runtime calls it once per loop iteration) frames everything staged on
the calling thread, each shard's pending entries as one batch, and takes the batch's place at the
shard's end. Under ``fsync="never"`` it writes the batch there (one ``pwrite``, a page-cache copy)
and settles it there and then (flush returns them). Under ``fsync="always"`` the batch's ``pwrite``
and the file's fdatasync both run on ``SYNC_JOBS`` sync threads, never on the loop: a disk that
blocks writes (a frozen file system, writeback throttling, a stalled device) holds back the answers
that wait for it, not the event loop. Up to ``SYNC_JOBS`` jobs run at once (the disk takes
concurrent flushes; the shards of one loop turn's batches are dealt out over the free threads) but
never two of one shard, so a shard's batches reach its file in sequence order; a batch framed while
its shard syncs or every slot is busy joins the next job (group commit), and jobs are settled in the
order they were made, so the listener (:meth:`LogStore.set_listener`) hears ``(shard, last sequence
number, error or None)`` in each shard's sequence order and a failed fsync is never papered over by
a later one. Because each shard's writes become durable in sequence order, one number per shard
says what is durable. A compaction snapshots what is in the file (``_Shard.written``), not what is
framed. A write lock orders the writes; while the writer thread holds it (a compaction swap, an
:meth:`LogStore.append` from a tool or test: a ``concurrent.futures.Future`` per call, ordered
behind everything submitted before it) the loop leaves its staged writes to that thread instead of
waiting.

Under ``fsync="interval"`` a batch is written and settled on the calling thread as under ``"never"``
(acknowledged once in the page cache: it survives herd being killed), and the
``herd-log-interval-sync`` thread fdatasyncs every file written since its last sync once per
``fsync_interval_ms`` (:meth:`Writer.sync_written`), so a power loss loses at most about that
window; the batch after such a sync carries PREFIX_DURABLE as under ``"always"``. It holds
``_fd_lock`` while it syncs, which a compaction swap (closing the old fd) takes.

Under ``fsync="always"`` each file is kept preallocated: zeros are written and made durable ahead of
the last entry (a quarter of the file, 64 KiB to 1 MiB at a time), so the fdatasync of a batch
flushes data without changing the file size (~110 µs instead of ~190 µs per fsync on the VM disk
where this was measured). Open reads a tail of nothing but zeros after the last good entry as the
end of the log, not damage (no whole entry is zeros: its length field is >= 10; a torn write that
left only zeros lost nothing that was acknowledged), and a clean close trims it.

A write or fsync error fails that shard's writes in the batch with the ``OSError``, marks the shard
failed and logs ``log.shard_failed``; later appends to it fail at once with
:class:`ShardFailedError` (the caller answers a retriable error). No fsync is ever retried after it
failed: after a failed fsync the kernel may have dropped the dirty pages ("fsyncgate"), so only a
restart (which re-reads the file) can say what is on disk.

"""
from __future__ import annotations

import bisect
import collections
import errno
import os
import queue
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path

import structlog

from coordinator.store import FSYNC_BUCKETS, ShardFailedError, ShardStats, check_shard, report
from coordinator.store.fileio import _close_quietly, _fail, _pwrite_all, _unlink_quietly
from coordinator.store.logformat import (
    _MIN_FRAME,
    COMPACT_TMP,
    HEADER_SIZE,
    LOG_NAME,
    MAX_ENTRY_BYTES,
    PREFIX_DURABLE,
    LogClosedError,
    LogError,
    encode_entries,
    encode_header,
)

log = structlog.get_logger("herd.log")

MiB = 1024 * 1024
PREALLOC_MIN = 64 * 1024  # zeros written ahead of a shard's end: a quarter of its size, within these
PREALLOC_MAX = 1 * MiB
SYNC_JOBS = 4  # batches whose fdatasyncs may run at once (a batch written while another syncs)
_fdatasync = getattr(os, "fdatasync", os.fsync)  # the size is covered: fdatasync flushes it when it changed


class _Shard:
    """Writer-owned state of one shard (the compactor only reads ``path``)."""

    __slots__ = ("id", "dir", "path", "fd", "size", "allocated", "entries", "written", "synced", "sizes",
                 "live_bytes", "failed", "durable_end",
                 "batches", "fsyncs", "fsync_seconds", "fsync_buckets", "compactions", "compaction_seconds",
                 "compacting",
                 "waiters", "next_waiters", "snapshot", "no_auto_below")

    def __init__(self, shard_id: int, directory: Path):
        self.id = shard_id
        self.dir = directory
        self.path = directory / LOG_NAME
        self.fd = -1
        self.size = 0  # end of the last entry: where the next batch goes
        self.allocated = 0  # file size: zeros from ``size`` to here (preallocated, fsync="always")
        self.entries = 0
        # (size, entries) of what is in the file: under fsync="always" a batch is counted in size and
        # entries when the loop encodes it, and written by the sync thread with its fdatasync
        self.written = (0, 0)
        self.synced = False  # every byte in the file is known durable
        self.durable_end = HEADER_SIZE  # what the file's header says
        self.sizes: dict[int, int] = {}
        self.live_bytes = 0
        self.failed: BaseException | None = None
        self.batches = self.fsyncs = self.compactions = 0
        self.fsync_seconds = self.compaction_seconds = 0.0
        self.fsync_buckets = [0] * (len(FSYNC_BUCKETS) + 1)  # one sync job per shard at a time: no race
        self.compacting = False
        self.waiters: list[Future] = []  # futures of the running compaction
        self.next_waiters: list[Future] = []  # compact() calls made while one runs
        self.snapshot = (0, 0)  # (size, entries) when the running compaction started
        self.no_auto_below = 0  # after a failed compaction, wait for more growth


# what the writer thread is asked to do (the first item of a queue entry)
_FLUSH, _COMPACT, _SWAP, _SWAP_FAILED, _CHECK_ALL, _STOP = range(6)


class _SyncJob:
    """Some shards' batches to write and fdatasync on a sync thread; settled in the order jobs were
    made."""

    __slots__ = ("items", "errors")

    def __init__(self, items):
        self.items = items  # [(shard, slot, size after the write, (data, entries after) or None)]
        self.errors: list | None = None  # once synced, per item: the exception, or None (durable)


class Writer:
    """The file log's writer: ``append()`` from any thread, ``submit()``/``flush()`` from the
    event loop, the writer and sync threads. Lifecycle (``begin_open``, ``start``, ``close``)
    driven by the :class:`~coordinator.store.filelog.LogStore`; the compaction it is started with
    (:meth:`start`) is asked on the writer thread to start, swap in or abandon a compaction, and
    asks the writer through :meth:`post`, :meth:`is_open`, :meth:`fail_shard` and ``shards``."""

    def __init__(self, num_shards: int, fsync: str, sync_jobs: int = SYNC_JOBS, fsync_interval_ms: int = 1000):
        self.num_shards = num_shards
        self.fsync = fsync
        self.fsync_interval = fsync_interval_ms / 1000.0
        # fsync="interval": the thread that fdatasyncs every written file once per interval. It
        # holds ``_fd_lock`` while it syncs; a compaction swap (which closes a shard's fd) takes it.
        self._fd_lock = threading.Lock()
        self._interval_stop = threading.Event()
        self._interval_thread: threading.Thread | None = None
        self.shards: list[_Shard] = []  # the open files (given by start)
        self.compaction = None  # given by start
        self._queue: queue.SimpleQueue = queue.SimpleQueue()  # the writer thread's work
        # Guards the lifecycle state, the staged writes and the sequence numbers.
        self._lock = threading.Lock()
        # Held while writing (flush on the loop, the writer thread's work): orders the writes and
        # guards the writer-side shard state. ``_synced_lock`` pairs a shard's size with ``synced``.
        self._wlock = threading.Lock()
        self._synced_lock = threading.Lock()
        # Guards the sync jobs (``_running``, ``_active``, ``_unsynced``, ``_syncing``) and orders
        # the listener's reports.
        self._settle_lock = threading.Condition(threading.Lock())
        self._running: collections.deque = collections.deque()  # _SyncJobs not settled, oldest first
        self._sync_jobs = max(1, sync_jobs)  # at most this many _SyncJobs syncing at once
        self._active = 0  # _SyncJobs on the sync threads
        self._unsynced: list = []  # written while its shard synced or all slots were busy
        self._syncing: set[int] = set()  # shards with a job syncing (one fdatasync per file at a time)
        # The fsync threads take jobs from this queue (a SimpleQueue and plain threads: the
        # ThreadPoolExecutor's Future, Condition and Semaphore per job cost ~40 us of loop CPU).
        self._sync_queue: queue.SimpleQueue = queue.SimpleQueue()
        self._sync_threads: list[threading.Thread] = []
        self._staged: list = []  # (shard, entries, seq, future | None) not yet handed to the writer
        self._seqs = [0] * num_shards  # last sequence number given out per shard
        self._listener = None
        self._state = "new"  # new -> opening -> open -> closing -> closed
        self._writer: threading.Thread | None = None

    # ---- lifecycle -------------------------------------------------------------------------------

    def begin_open(self) -> None:
        with self._lock:
            if self._state != "new":
                raise LogError("LogStore.open() may be called once")
            self._state = "opening"

    def open_failed(self) -> None:
        with self._lock:
            self._state = "closed"

    def start(self, shards: list[_Shard], compaction) -> None:
        """The files are open: start the writer, the compactor and (fsync="always") the sync
        threads, and look for shards to compact."""
        self.shards = shards
        self.compaction = compaction
        self._writer = threading.Thread(target=self._writer_main, name="herd-log-writer", daemon=True)
        if self.fsync == "always":
            self._sync_threads = [threading.Thread(target=self._sync_main, name=f"herd-log-fsync-{i}", daemon=True)
                                  for i in range(self._sync_jobs)]
        if self.fsync == "interval":
            self._interval_thread = threading.Thread(target=self._interval_main, name="herd-log-interval-sync",
                                                     daemon=True)
        with self._lock:
            self._state = "open"
        self._writer.start()
        compaction.start()
        for t in self._sync_threads:
            t.start()
        if self._interval_thread is not None:
            self._interval_thread.start()
        self._queue.put((_CHECK_ALL,))

    def is_open(self) -> bool:
        return self._state == "open"

    def post(self, item) -> None:
        """Give the writer thread work (a compaction's swap or failure)."""
        self._queue.put(item)

    # ---- append ----------------------------------------------------------------------------------

    def append(self, shard_id: int, entries: Iterable) -> Future:
        """Queue entries for ``shard_id``; the Future resolves (None) once they are written and, with
        fsync="always", fsynced. It fails with the OSError if the write or fsync fails, or with
        ShardFailedError if the shard had already failed. Never blocks on disk."""
        entries = list(entries)
        for item in entries:
            key, value = item
            if type(key) is not bytes or (value is not None and type(value) is not bytes):
                raise TypeError("log entries are (bytes, bytes | None) pairs")
            if len(key) + (len(value) if value is not None else 0) > MAX_ENTRY_BYTES:
                raise ValueError(f"log entry larger than {MAX_ENTRY_BYTES} bytes")
        fut: Future = Future()
        fut.set_running_or_notify_cancel()
        with self._lock:
            self._check_writable(shard_id)
            st = self.shards[shard_id]
            if st.failed is not None:
                fut.set_exception(ShardFailedError(shard_id, st.failed))
                return fut
            seq = self._seqs[shard_id] = self._seqs[shard_id] + 1
            self._staged.append((shard_id, entries, seq, fut))  # behind everything staged before it
            self._queue.put((_FLUSH,))
        return fut

    def submit(self, shard_id: int, entries: list) -> int:
        """The event loop's fast path: stage ``entries`` (a list of (bytes, bytes | None) built by
        herd itself, not checked) for ``shard_id`` and return the shard's sequence number of this
        write. Nothing is written until :meth:`flush` (the runtime flushes once per loop
        iteration)."""
        with self._lock:
            self._check_writable(shard_id)
            seq = self._seqs[shard_id] = self._seqs[shard_id] + 1
            self._staged.append((shard_id, entries, seq, None))
        return seq

    def flush(self) -> list:
        """Write everything staged, on the calling thread (the event loop: a page-cache write of a
        few KB), and return what is settled now: a list of ``(shard_id, seq, exc)`` (see
        :meth:`set_listener`). Under ``fsync="never"`` that is everything (written to the OS);
        under ``"always"`` the fdatasyncs run on the sync threads and their results reach the
        listener: the caller never waits for the disk. If the writer thread holds the files (a
        compaction swap, an :meth:`append`), the staged writes are left to it, in order, and
        reported to the listener: the loop never waits for a compaction either."""
        if not self._staged:
            return []
        if not self._wlock.acquire(blocking=False):
            self._queue.put((_FLUSH,))
            return []
        try:
            return self._flush_staged()
        finally:
            self._wlock.release()

    def set_listener(self, listener) -> None:
        """``listener(results)`` is called in a log thread (a sync or the writer thread) for what
        :meth:`flush` did not return: a list of ``(shard_id, seq, exc)``, every write of that shard
        up to ``seq`` is durable (``exc`` None) or failed with ``exc``. It must be quick and
        thread-safe (e.g. hand over to the loop)."""
        self._listener = listener

    def _check_writable(self, shard_id: int) -> None:
        check_shard(self._state, shard_id, self.num_shards, LogClosedError, "log store")

    def _report(self, results: list) -> None:
        report(self._listener, results, log, "log.listener_error")

    def compact(self, shard_id: int) -> Future:
        """Compact ``shard_id`` now (in the background); the Future resolves to a dict of figures."""
        fut: Future = Future()
        fut.set_running_or_notify_cancel()
        with self._lock:
            self._check_writable(shard_id)
            self._queue.put((_COMPACT, shard_id, fut))
        return fut

    # ---- close / stats ---------------------------------------------------------------------------

    def close(self) -> None:
        """Write everything queued (resolving its futures), stop the threads, close the files."""
        with self._lock:
            if self._state in ("closing", "closed"):
                return
            if self._state != "open":
                self._state = "closed"
                return
            self._state = "closing"
            self._queue.put((_FLUSH,))  # submitted but not flushed: written like everything else
        compaction = self.compaction
        compaction.stop()
        self._queue.put((_STOP,))
        self._writer.join()
        with self._wlock, self._lock:  # a flush() that raced with close() left nothing behind
            left, self._staged = self._staged, []
        self._report([(shard_id, seq, LogClosedError("log store closed")) for shard_id, _e, seq, _f in left])
        for _shard, _e, _seq, fut in left:
            if fut is not None:
                _fail(fut, LogClosedError("log store closed"))
        # The writer may have asked for a compaction after the compactor had stopped.
        compaction.abandon_jobs(LogClosedError("log store closed"))
        # Anything left (it cannot be an append: those are refused once closing) is failed.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            self._discard(item, LogClosedError("log store closed"))
        with self._lock:
            self._state = "closed"

    def stats(self) -> list[ShardStats]:
        out = []
        for st in self.shards:
            body = max(st.size - HEADER_SIZE, 0)
            out.append(ShardStats(
                shard=st.id, bytes=st.size, entries=st.entries, live_keys=len(st.sizes),
                live_bytes=st.live_bytes, dead_bytes=max(body - st.live_bytes, 0), batches=st.batches,
                fsyncs=st.fsyncs, fsync_seconds=st.fsync_seconds, compactions=st.compactions,
                compaction_seconds=st.compaction_seconds,
                failed=None if st.failed is None else f"{type(st.failed).__name__}: {st.failed}",
                fsync_buckets=tuple(st.fsync_buckets)))
        return out

    # ---- writer thread ---------------------------------------------------------------------------

    def _writer_main(self) -> None:
        get = self._queue.get
        get_nowait = self._queue.get_nowait
        stop = False
        while not stop:
            batch = [get()]
            while True:
                try:
                    batch.append(get_nowait())
                except queue.Empty:
                    break
            try:
                with self._wlock:
                    stop = self._process(batch)
            except BaseException as exc:  # our bug: never leave a request unanswered
                log.exception("log.writer_error")
                for item in batch:
                    self._discard(item, exc)
        if self._sync_threads:
            self._sync_barrier()
            for _ in self._sync_threads:
                self._sync_queue.put(None)
            for t in self._sync_threads:
                t.join()
        if self._interval_thread is not None:
            self._interval_stop.set()
            self._interval_thread.join()
        for st in self.shards:
            if st.fd >= 0:
                if self.fsync != "never" and st.failed is None and (
                        st.allocated > st.size or st.size > st.durable_end):
                    try:
                        self._stop_cleanly(st)
                    except OSError as exc:
                        log.warning("log.trim_failed", shard=st.id, error=str(exc))
                try:
                    os.close(st.fd)
                except OSError:
                    pass
                st.fd = -1

    @staticmethod
    def _stop_cleanly(st: _Shard) -> None:
        """A clean stop leaves no preallocated zeros behind, and records in the header that the
        whole file is durable: damage found there at the next start is then corruption (bit rot,
        a stray writer), refused, not a torn write cut away with the entries it held. The header
        is rewritten in place, one 24-byte write in the first sector (as PostgreSQL's pg_control,
        it relies on a sector being written whole); after a crash during it the next start refuses
        a bad header and ``--repair`` rewrites it, losing nothing. Under fsync="always" and "interval":
        "never" promises nothing and never fsyncs."""
        if st.allocated > st.size:
            os.ftruncate(st.fd, st.size)
            st.allocated = st.size
        os.fsync(st.fd)
        if st.size > st.durable_end:
            _pwrite_all(st.fd, encode_header(st.id, st.size), 0)
            os.fsync(st.fd)
            st.durable_end = st.size

    def _discard(self, item, exc: BaseException) -> None:
        kind = item[0]
        if kind == _COMPACT:
            _fail(item[2], exc)
        elif kind == _SWAP:
            st = self.shards[item[1]]
            _close_quietly(item[2])
            _unlink_quietly(st.dir / COMPACT_TMP)
            self.compaction.over(st, exc)
        elif kind == _SWAP_FAILED:
            self.compaction.over(self.shards[item[1]], exc)

    def _process(self, batch) -> bool:
        """The writer thread's work, under the write lock: staged writes (an append(), a flush the
        loop left to it, close), compaction requests and swaps."""
        stop = False
        flushed = False
        for item in batch:
            kind = item[0]
            if kind == _FLUSH:
                if not flushed:  # one flush takes everything staged so far
                    flushed = True
                    self._report(self._flush_staged())
            elif kind == _COMPACT:
                self.compaction.request(self.shards[item[1]], item[2])
            elif kind == _SWAP:
                self._sync_barrier()  # no fdatasync of the old file may still run
                with self._fd_lock:  # nor an interval sync
                    self.compaction.swap(*item[1:])
            elif kind == _SWAP_FAILED:
                self.compaction.over(self.shards[item[1]], item[2])
            elif kind == _CHECK_ALL:
                for st in self.shards:
                    self.compaction.maybe_compact(st)
            elif kind == _STOP:
                stop = True
        return stop

    def _flush_staged(self) -> list:
        """Frame everything staged (the caller holds the write lock), one batch per shard. Under
        fsync="never" each batch is written here (one pwrite); under "always" its place in the file
        is taken here and a sync thread writes it and fdatasyncs the file, so a disk that blocks
        writes (a frozen file system, writeback throttling) never blocks the caller, the event
        loop. -> the results settled now (under "never": all of them); the rest reach the
        listener."""
        with self._lock:
            staged, self._staged = self._staged, []
        if not staged:
            return []
        # shard -> [entries, last seq, futures]
        pending: dict[int, list] = {}
        for shard_id, entries, seq, fut in staged:
            slot = pending.get(shard_id)
            if slot is None:
                pending[shard_id] = slot = [entries, seq, []]  # our own list (submit: the runtime's, append: a copy)
            else:
                slot[0] += entries
                slot[1] = seq
            if fut is not None:
                slot[2].append(fut)
        results = []  # (shard, seq, exc)
        # (shard, slot, size after the write, (data, entries after) while the write is pending)
        written: list[tuple[_Shard, list, int, tuple | None]] = []
        deferred = self.fsync == "always"
        try:
            for shard_id, slot in pending.items():
                st = self.shards[shard_id]
                if st.failed is not None:
                    self._settle(results, st, slot, ShardFailedError(shard_id, st.failed))
                    continue
                entries = slot[0]
                data = encode_entries(entries, PREFIX_DURABLE if st.synced else 0)
                if not deferred:
                    try:
                        self._write(st, data, st.size)
                    except OSError as exc:
                        self.fail_shard(st, exc, "write")
                        self._settle(results, st, slot, exc)
                        continue
                with self._synced_lock:
                    st.size += len(data)
                    st.synced = False
                st.entries += len(entries)
                st.batches += 1
                self._account(st, entries)
                if deferred:
                    written.append((st, slot, st.size, (data, st.entries)))
                else:
                    st.written = (st.size, st.entries)
                    written.append((st, slot, st.size, None))
        except BaseException as exc:  # our bug: fail what is left rather than lose it silently
            log.exception("log.writer_error")
            done = {sid for sid, _seq, _exc in results} | {item[0].id for item in written}
            for shard_id, slot in pending.items():
                if shard_id not in done:
                    st = self.shards[shard_id]
                    self.fail_shard(st, exc)
                    self._settle(results, st, slot, exc)
        if written:
            if deferred:
                self._start_sync(written)
            else:
                for st, slot, _size, _pending in written:
                    self._settle(results, st, slot, None)
            compaction = self.compaction
            if compaction.auto_compact and self._state == "open":
                for item in written:
                    compaction.maybe_compact(item[0])
        return results

    @staticmethod
    def _settle(results: list, st: _Shard, slot: list, exc: BaseException | None) -> None:
        results.append((st.id, slot[1], exc))
        for f in slot[2]:
            if exc is None:
                f.set_result(None)
            else:
                _fail(f, exc)

    # ---- interval sync thread (fsync="interval") --------------------------------------------------

    def _interval_main(self) -> None:
        """fsync="interval": every ``fsync_interval`` seconds, fdatasync each file written since its
        last sync. The writes themselves were acknowledged once in the page cache (they survive
        herd being killed); this bounds what a power loss or kernel crash can take to about one
        interval (plus the sync's own time)."""
        while not self._interval_stop.wait(self.fsync_interval):
            try:
                self.sync_written()
            except BaseException:  # our bug: keep syncing the next interval
                log.exception("log.sync_error")

    def sync_written(self) -> int:
        """fdatasync every open shard file that holds bytes written since its last sync (the
        interval thread's work; tests call it too). -> the files synced. A failed fdatasync marks
        the shard failed (never retried: the kernel may have dropped the pages): it refuses later
        writes until a restart, and ``log.shard_failed`` says so; commits already acknowledged
        from it were in the page cache only."""
        synced = 0
        for st in self.shards:
            with self._fd_lock:
                if st.fd < 0 or st.failed is not None or st.synced:
                    continue
                with self._synced_lock:
                    size = st.size  # every byte before it is in the file (pwrite, then size)
                exc = self._sync_one(st)
                if exc is not None:
                    self.fail_shard(st, exc, "fsync")
                    continue
                synced += 1
                with self._synced_lock:
                    if st.size == size:  # nothing written since: every byte in the file is durable
                        st.synced = True
        return synced

    # ---- sync thread -----------------------------------------------------------------------------

    def _start_sync(self, written: list) -> None:
        """Have the writes and fdatasyncs of a batch just framed run on the sync threads. Up to
        ``sync_jobs`` jobs sync at once (a batch written while another syncs need not wait: the
        disk takes concurrent flushes), but never two of one shard: since Linux 4.13 a writeback
        error is reported to one fdatasync of a file only, so two concurrent ones could hand an
        earlier batch's error to the later one and report the earlier batch durable. What waits
        (its shard is syncing, or every slot is busy) joins the next job (group commit). Jobs
        are settled in the order they were made, so the listener hears of each shard's writes in
        sequence order, and a shard whose fsync failed is never reported durable by a later one."""
        with self._settle_lock:
            self._unsynced += written
            jobs = self._launch()
            if not jobs:
                self._settle_lock.notify_all()  # (tests wait for a batch to be waiting)
        for job in jobs:
            self._sync_queue.put(job)

    def _launch(self) -> list:
        """Make jobs of the waiting items whose shard is not syncing, at most one per free slot
        (the caller holds the settle lock and queues the jobs returned). A shard's items all go to
        one job, in order; the shards (oldest first, at most 1/sync_jobs of those waiting per job)
        are dealt out over the jobs, so the sync threads fdatasync different files at once, each
        its own share one after another (no pool: a thread hand-off per file cost more CPU than
        the fsync, in futex calls and GIL switches)."""
        free = self._sync_jobs - self._active
        if free <= 0 or not self._unsynced:
            return []
        syncing = self._syncing
        by_shard: dict[int, list] = {}
        wait = []
        for item in self._unsynced:
            sid = item[0].id
            if sid in syncing:
                wait.append(item)
            elif sid in by_shard:
                by_shard[sid].append(item)
            else:
                by_shard[sid] = [item]
        if not by_shard:
            return []
        # A job takes at most its fair share of the shards as if every thread were free (one slot
        # free with 40 shards waiting: 10, not 40); the rest wait for the next thread that frees up,
        # so a slow disk still syncs up to sync_jobs files at once.
        per = -(-len(by_shard) // self._sync_jobs)
        n = min(free, -(-len(by_shard) // per))
        taken = list(by_shard)[:n * per]
        if len(taken) < len(by_shard):
            left = set(by_shard).difference(taken)
            wait = [item for item in self._unsynced if item[0].id in syncing or item[0].id in left]
        self._unsynced = wait
        shares: list[list] = [[] for _ in range(n)]
        for i, sid in enumerate(taken):
            shares[i % n] += by_shard[sid]
        jobs = [_SyncJob(share) for share in shares]
        syncing.update(taken)
        self._active += n
        self._running.extend(jobs)
        return jobs

    def _sync_main(self) -> None:
        get = self._sync_queue.get
        while True:
            job = get()
            if job is None:
                return
            while job is not None:  # a job launched as this one ended: run here, wake nobody
                job = self._run_sync(job)

    def _run_sync(self, job: _SyncJob) -> _SyncJob | None:
        """Write and sync one job, settle what is done, launch what waited for it. -> one of the
        jobs launched, for this thread to run next (the others are queued for the free threads)."""
        try:
            errors = self._sync_files(job.items)
        except BaseException as exc:  # our bug: never leave a write unanswered
            log.exception("log.sync_error")
            errors = [exc] * len(job.items)
        with self._settle_lock:
            job.errors = errors
            self._active -= 1
            for item in job.items:
                self._syncing.discard(item[0].id)
            jobs = self._launch()
            try:
                results = self._settle_ready()
                if results:
                    self._report(results)  # under the lock: the listener hears each shard in order
            except BaseException:  # our bug: keep this thread (and close()'s barrier) alive
                log.exception("log.sync_error")
            self._settle_lock.notify_all()
        for nxt in jobs[1:]:
            self._sync_queue.put(nxt)
        return jobs[0] if jobs else None

    def _settle_ready(self) -> list:
        """Settle the oldest jobs that are done (the caller holds the settle lock). -> their
        results, in job order."""
        results = []
        running = self._running
        while running and running[0].errors is not None:
            results += self._sync_results(running.popleft())
        return results

    def _sync_files(self, items: list) -> list:
        """Write each item's pending batch (in order; one job at a time per shard, so a shard's
        batches reach its file in sequence order), then fdatasync each item's file once. A shard
        failed before is neither written nor synced again (a failed fsync is never retried, not
        even by a later batch); a failed write fails every item of its shard in this job (what was
        written before it cannot be made durable: no fsync follows). -> per item the exception or
        None."""
        write_failed: dict[int, BaseException] = {}
        for st, _slot, size, pending in items:
            if pending is None or st.failed is not None:
                continue
            data, entries_after = pending
            try:
                self._write(st, data, size - len(data))
            except OSError as exc:
                self.fail_shard(st, exc, "write")
                write_failed[st.id] = exc
                continue
            st.written = (size, entries_after)
        outcome: dict[int, BaseException | None] = {}
        todo = []
        for item in items:
            st = item[0]
            if st.id not in outcome:
                outcome[st.id] = None
                if st.id in write_failed:
                    outcome[st.id] = write_failed[st.id]
                elif st.failed is not None:
                    outcome[st.id] = ShardFailedError(st.id, st.failed)
                else:
                    todo.append(st)
        if todo:
            for st, exc in zip(todo, self._sync(todo), strict=True):
                outcome[st.id] = exc
        return [outcome[item[0].id] for item in items]

    def _sync_results(self, job: _SyncJob) -> list:
        """Settle a job whose syncs are done: -> the (shard, seq, exc) results."""
        results = []
        for (st, slot, size, _pending), exc in zip(job.items, job.errors, strict=True):
            if exc is None and st.failed is not None:
                # an earlier job's fsync of this file failed (settled just before): a later fsync's
                # success proves nothing about the pages that one lost
                exc = ShardFailedError(st.id, st.failed)
            if exc is not None:
                if not isinstance(exc, ShardFailedError):
                    self.fail_shard(st, exc, "fsync")
                self._settle(results, st, slot, exc)
                continue
            with self._synced_lock:
                if st.size == size:  # nothing written since: every byte in the file is durable
                    st.synced = True
            self._settle(results, st, slot, None)
        return results

    def _sync_barrier(self) -> None:
        """Wait until every batch's fdatasyncs have ended and been settled (the caller holds the
        write lock, so no new one can start)."""
        with self._settle_lock:
            while self._running or self._unsynced:
                self._settle_lock.wait()

    def _write(self, st: _Shard, data: bytes, offset: int) -> None:
        """Write ``data`` at ``offset`` (the shard's end when its batch was framed). Under
        fsync="always" the file is kept preallocated (zeros written and fsynced ahead of the end),
        so the fsync of a batch flushes data only, no size change: ~110 µs instead of ~190 µs per
        fsync on the VM disk measured. The zeros are not entries: open() reads a zero tail as the
        end of the log."""
        end = offset + len(data)
        _pwrite_all(st.fd, data, offset)
        if end > st.allocated:
            st.allocated = end
            if self.fsync == "always":
                grow = min(max(offset // 4, PREALLOC_MIN), PREALLOC_MAX)
                try:
                    _pwrite_all(st.fd, bytes(grow), end)
                    st.allocated = end + grow
                except OSError:  # a full disk: the data is in, only the zeros ahead of it are not
                    st.allocated = max(end, os.fstat(st.fd).st_size)

    def _sync(self, shards: list[_Shard]) -> list[BaseException | None]:
        """fdatasync each shard's file, one after another: the sync threads run several jobs at
        once (the disk takes concurrent flushes: ~5,000 fsyncs/s from one thread, ~13,000/s from
        four, measured), and :meth:`_launch` deals the shards of a batch out over them."""
        return [self._sync_one(st) for st in shards]

    @staticmethod
    def _sync_one(st: _Shard) -> BaseException | None:
        t0 = time.perf_counter()
        try:
            _fdatasync(st.fd)
            if os.fstat(st.fd).st_nlink == 0:
                # durable in a file nobody will read again: the next start would not find it
                raise OSError(errno.ENOENT, f"{st.path} was removed while herd ran (data directory deleted "
                                            f"or replaced?); restart herd on the right directory")
        except OSError as exc:
            return exc
        took = time.perf_counter() - t0
        st.fsync_seconds += took
        st.fsyncs += 1
        st.fsync_buckets[bisect.bisect_left(FSYNC_BUCKETS, took)] += 1
        return None

    @staticmethod
    def _account(st: _Shard, entries: list) -> None:
        sizes = st.sizes
        live = st.live_bytes
        for key, value in entries:
            h = hash(key)
            old = sizes.pop(h, 0) if value is None else sizes.get(h, 0)
            if value is None:
                live -= old
            else:
                new = _MIN_FRAME + len(key) + len(value)
                sizes[h] = new
                live += new - old
        st.live_bytes = live

    def fail_shard(self, st: _Shard, exc: BaseException, what: str = "internal error") -> None:
        """Mark ``st`` failed (the first failure is kept): it refuses writes until restart."""
        if st.failed is None:
            st.failed = exc
            log.error("log.shard_failed", shard=st.id, path=str(st.path), operation=what, error=str(exc),
                      detail="the shard refuses writes until restart; the failed fsync is not retried")
