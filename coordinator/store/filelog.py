"""herd's file log: one append-only file per shard, replayed at start-up; and :class:`FileStore`,
the file log behind the :class:`coordinator.store.Store` interface.

Entries are opaque ``(key: bytes, value: bytes | None)`` pairs; ``None`` is a tombstone. This layer
never looks inside them (``tools/logdump`` does).

The parts: :mod:`coordinator.store.logformat` (the bytes on disk, scanning, damage),
:mod:`coordinator.store.writer` (the writer and sync threads), :mod:`coordinator.store.compaction`,
:mod:`coordinator.store.fileio` (OS calls). This module holds the store class: opening (with the
torn-tail and corruption rules of ``logformat``), the write API and closing.

Speed
-----
CRC32C comes from ``google_crc32c`` (or the ``crc32c`` package) when installed: 45 µs per MiB and
~0.2 µs per 100-byte entry, against 158 ms per MiB and ~16 µs per entry for the pure-Python table
fallback (which works, but makes replay of a large log ~15x slower). Replay reads each file whole and
parses it in one loop with the cyclic GC paused: 1,000,000 entries (50-byte keys, 30-byte values,
98 MB over 50 shards) open in ~1.0-1.7 s on a loaded 2-core VM. :func:`bench._log_replay.benchmark_replay` reproduces
the figure; ``open(latest_only=True)`` lets the caller decode each key once.
"""
from __future__ import annotations

import asyncio
import collections
import functools
import gc
import json
import os
import queue
import threading
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path

import structlog

from coordinator.store import Entry, ShardFailedError, ShardStats, Store
from coordinator.store.compaction import Compaction
from coordinator.store.fileio import _fail, _fsync_dir, _pwrite_all, _write_file_atomic
from coordinator.store.logformat import (
    COMPACT_TMP,
    CRC32C_IMPL,
    FORMAT_VERSION,
    HEADER_SIZE,
    MAX_ENTRY_BYTES,
    META_NAME,
    LogClosedError,
    LogCorruptError,
    LogError,
    LogFormatError,
    _Scan,
    _scan,
    encode_header,
    latest,
    shard_dir_name,
)
from coordinator.store.writer import _CHECK_ALL, _COMPACT, _FLUSH, _STOP, SYNC_JOBS, MiB, WriterThreads, _Shard

log = structlog.get_logger("herd.log")
_warned_slow_crc = False


class LogStore(WriterThreads, Compaction):
    """Durable per-shard logs. ``open()`` once, ``append()`` from any thread, ``close()`` once."""

    def __init__(self, data_dir, num_shards: int = 50, fsync: str = "always", *, repair: bool = False,
                 compact_threshold_bytes: int = 64 * MiB, compact_dead_ratio: float = 0.5,
                 auto_compact: bool = True, sync_jobs: int = SYNC_JOBS):
        if fsync not in ("always", "never"):
            raise ValueError(f"fsync must be 'always' or 'never', got {fsync!r}")
        if not 1 <= num_shards <= 0xFFFF:
            raise ValueError(f"num_shards must be 1..65535, got {num_shards}")
        self.data_dir = Path(data_dir)
        self.num_shards = num_shards
        self.fsync = fsync
        self.repair = repair
        self.compact_threshold_bytes = compact_threshold_bytes
        self.compact_dead_ratio = compact_dead_ratio
        self.auto_compact = auto_compact
        self._shards: list[_Shard] = []
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        # Held while writing (flush on the loop, the writer thread's work): orders the writes and
        # guards the writer-side shard state. ``_synced_lock`` pairs a shard's size with ``synced``.
        self._wlock = threading.Lock()
        self._synced_lock = threading.Lock()
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
        self._state = "new"  # new -> open -> closing -> closed
        self._writer: threading.Thread | None = None
        self._compactor: threading.Thread | None = None
        # Test hook: called in the compactor thread with the shard id once the compacted file is
        # written and fsynced, before the writer swaps it in.
        self._compaction_written_hook = None

    # ---- open ------------------------------------------------------------------------------------

    def open(self, latest_only: bool = False) -> dict[int, list[Entry]]:
        """Check every shard, cut torn tails, start the threads; -> {shard id: [(key, value), ...]}
        in log order. Raises LogCorruptError (changing no log file) for damage in the middle of a log
        unless ``repair``; LogFormatError / LogError for files it must not touch.

        ``latest_only``: return what a compaction would keep (the last value of each key, in the
        order of those last entries, no tombstones) so the caller decodes each key once. Replaying
        it is equivalent by construction: after a compaction that is all the file holds."""
        with self._lock:
            if self._state != "new":
                raise LogError("LogStore.open() may be called once")
            self._state = "opening"
        global _warned_slow_crc
        if CRC32C_IMPL == "pure-python" and not _warned_slow_crc:
            _warned_slow_crc = True
            log.warning("log.crc32c_slow", detail="no C CRC32C (google-crc32c) installed; replay is slow")
        try:
            result = self._open()
            if latest_only:
                for shard_id, entries in result.items():
                    result[shard_id] = latest(entries)
        except BaseException:
            for st in self._shards:
                if st.fd >= 0:
                    os.close(st.fd)
                    st.fd = -1
            self._shards = []
            with self._lock:
                self._state = "closed"
            raise
        self._writer = threading.Thread(target=self._writer_main, name="herd-log-writer", daemon=True)
        self._compactor = threading.Thread(target=self._compactor_main, name="herd-log-compactor",
                                           daemon=True)
        if self.fsync == "always":
            self._sync_threads = [threading.Thread(target=self._sync_main, name=f"herd-log-fsync-{i}", daemon=True)
                                  for i in range(self._sync_jobs)]
        with self._lock:
            self._state = "open"
        self._writer.start()
        self._compactor.start()
        for t in self._sync_threads:
            t.start()
        self._queue.put((_CHECK_ALL,))
        return result

    def _check_meta(self) -> None:
        try:
            self.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise LogError(f"cannot create data directory {self.data_dir}: {exc.strerror}") from None
        meta_path = self.data_dir / META_NAME
        existing = sorted(int(p.name[6:]) for p in self.data_dir.glob("shard-*")
                          if p.is_dir() and p.name[6:].isdigit())
        if meta_path.exists():
            try:
                meta = json.loads(meta_path.read_text())
                fmt, n = meta["format"], meta["num_shards"]
            except (ValueError, KeyError, TypeError, OSError) as exc:
                raise LogError(f"{meta_path}: unreadable ({exc})") from None
            if fmt != FORMAT_VERSION:
                raise LogFormatError(f"{meta_path}: log format {fmt}; "
                                     f"this herd reads format {FORMAT_VERSION}")
            if n != self.num_shards:
                raise LogError(f"{self.data_dir} holds {n} shards but {self.num_shards} were asked for; the "
                               f"shard count (offsets_partitions) is fixed for the life of a data directory")
            return
        if existing and existing[-1] >= self.num_shards:
            raise LogError(f"{self.data_dir} has a shard directory {shard_dir_name(existing[-1])} but only "
                           f"{self.num_shards} shards were asked for; the shard count is fixed for the life "
                           f"of a data directory")
        if existing and existing != list(range(self.num_shards)):
            # shard directories without their herd-log.json (a partial restore, a lost file): with
            # another shard count, groups would hash to other shards than their records are in, and
            # a commit made now would lose to the older record at the next replay (shard order)
            raise LogError(f"{self.data_dir} has {len(existing)} shard directories ({shard_dir_name(existing[0])} "
                           f"to {shard_dir_name(existing[-1])}) but no {META_NAME}, and {self.num_shards} shards "
                           f"were asked for: restore the whole data directory, or start with the "
                           f"offsets_partitions it was written with")
        _write_file_atomic(meta_path, json.dumps({"format": FORMAT_VERSION, "num_shards": self.num_shards})
                           .encode() + b"\n")
        if existing:
            log.warning("log.meta_recreated", path=str(meta_path), shards=self.num_shards,
                        detail=f"{META_NAME} was missing; the shard directories match the shard count asked for")
            return
        # A new store is right on a first start, and a loud surprise on any other (a volume not
        # mounted, a directory cleaned by a script): every group starts with no offsets.
        log.warning("log.new_data_dir", path=str(self.data_dir), shards=self.num_shards,
                    detail="no herd data here: started an EMPTY store (no groups, no offsets); expected on a "
                           "first start only")

    def _open(self) -> dict[int, list[Entry]]:
        # Replay makes no cyclic garbage; without this, the collections that the new tuples trigger
        # rescan all the earlier ones (~40% of the time of a 1M-entry replay).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._open_files()
        finally:
            if gc_was_enabled:
                gc.enable()

    def _open_files(self) -> dict[int, list[Entry]]:
        self._check_meta()
        created_dirs = False
        scans = []
        for shard_id in range(self.num_shards):
            d = self.data_dir / shard_dir_name(shard_id)
            if not d.is_dir():
                d.mkdir()
                created_dirs = True
            st = _Shard(shard_id, d)
            self._shards.append(st)
            tmp = d / COMPACT_TMP
            if tmp.exists():
                tmp.unlink()
                log.info("log.stale_compaction_removed", shard=shard_id, path=str(tmp))
            if not st.path.exists():
                scans.append(None)
                continue
            with open(st.path, "rb") as f:
                buf = f.read()
            try:
                scans.append(_scan(buf, shard_id, str(st.path), positions=False, sizes=st.sizes))
            except LogFormatError as exc:  # an entry's error names its offset, not its file
                if str(exc).startswith(str(st.path)):
                    raise
                raise LogFormatError(f"{st.path}: {exc}") from None
            del buf
        if created_dirs:
            _fsync_dir(self.data_dir)
        problems = []
        for sc in scans:
            if sc is None:
                continue
            for d in (sc.header_damage, sc.damage):
                if d is not None and d.kind == "corrupt":
                    problems.append(d)
        if problems and not self.repair:
            for p in problems:
                log.error("log.corrupt", shard=p.shard, path=p.path, offset=p.offset, reason=p.reason,
                          evidence=p.evidence)
            raise LogCorruptError(problems)
        # Nothing refused: now change files.
        result: dict[int, list[Entry]] = {}
        for st, sc in zip(self._shards, scans, strict=True):
            result[st.id] = self._prepare_shard(st, sc)
        return result

    def _prepare_shard(self, st: _Shard, sc: _Scan | None) -> list[Entry]:
        path = str(st.path)
        hd = sc.header_damage if sc is not None else None
        if sc is None or sc.size < HEADER_SIZE or (hd is not None and hd.kind == "torn"):
            if sc is not None:  # an empty file or a header cut short: give it its header back
                log.warning("log.header_rewritten", shard=st.id, path=path, size=sc.size,
                            reason="file header cut short (crash while the file was created)")
            _write_file_atomic(st.path, encode_header(st.id))
            st.fd = os.open(st.path, os.O_RDWR | os.O_CLOEXEC)
            st.size = st.allocated = HEADER_SIZE
            st.written = (HEADER_SIZE, 0)
            st.synced = True
            return []
        st.fd = os.open(st.path, os.O_RDWR | os.O_CLOEXEC)
        changed = False
        if hd is not None:  # a bad header: only reached with repair
            log.error("log.repaired", shard=st.id, path=path, offset=0, reason=hd.reason,
                      action="REPAIR: rewrote the file header; kept the entries that check out")
            _pwrite_all(st.fd, encode_header(st.id), 0)
            changed = True
        dmg = sc.damage
        if dmg is not None and dmg.kind == "corrupt":
            log.error("log.repaired", shard=st.id, path=path, offset=sc.end, reason=dmg.reason,
                      evidence=dmg.evidence, cut_bytes=sc.size - sc.end, kept_entries=len(sc.entries),
                      action="REPAIR: cut the log at the damage; every entry after it is LOST")
            if sc.durable_end > sc.end:
                _pwrite_all(st.fd, encode_header(st.id, sc.end), 0)
            st.durable_end = min(sc.durable_end, sc.end)
            changed = True
        elif dmg is not None:
            log.warning("log.tail_truncated", shard=st.id, path=path, offset=sc.end,
                        cut_bytes=sc.size - sc.end, reason=dmg.reason, kept_entries=len(sc.entries))
            changed = True
        if sc.zero_tail and not changed:
            st.allocated = sc.size  # preallocated zeros: keep them
        elif sc.end < sc.size:
            os.ftruncate(st.fd, sc.end)
            st.allocated = sc.end
        else:
            st.allocated = sc.size
        st.size = sc.end
        if hd is None and (dmg is None or dmg.kind != "corrupt"):
            st.durable_end = sc.durable_end
        st.entries = len(sc.entries)
        st.written = (st.size, st.entries)
        st.live_bytes = sum(st.sizes.values())
        if self.fsync == "always" or changed:
            os.fsync(st.fd)  # a cut is durable before anything is appended after it
            st.synced = True
        return sc.entries

    # ---- append ----------------------------------------------------------------------------------

    def append(self, shard_id: int, entries: Iterable[Entry]) -> Future:
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
            st = self._shards[shard_id]
            if st.failed is not None:
                fut.set_exception(ShardFailedError(shard_id, st.failed))
                return fut
            seq = self._seqs[shard_id] = self._seqs[shard_id] + 1
            self._staged.append((shard_id, entries, seq, fut))  # behind everything staged before it
            self._queue.put((_FLUSH,))
        return fut

    def submit(self, shard_id: int, entries: list[Entry]) -> int:
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
        if self._state != "open":
            raise LogClosedError(f"log store is {self._state}")
        if not 0 <= shard_id < self.num_shards:
            raise ValueError(f"shard {shard_id} out of range 0..{self.num_shards - 1}")

    def _report(self, results: list) -> None:
        listener = self._listener
        if listener is not None and results:
            try:
                listener(results)
            except Exception:  # the listener's bug must not kill the writer
                log.exception("log.listener_error")

    def compact(self, shard_id: int) -> Future:
        """Compact ``shard_id`` now (in the background); the Future resolves to a dict of figures."""
        fut: Future = Future()
        fut.set_running_or_notify_cancel()
        with self._lock:
            if self._state != "open":
                raise LogClosedError(f"log store is {self._state}")
            if not 0 <= shard_id < self.num_shards:
                raise ValueError(f"shard {shard_id} out of range 0..{self.num_shards - 1}")
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
        self._jobs.put(None)
        self._compactor.join()
        self._queue.put((_STOP,))
        self._writer.join()
        with self._wlock, self._lock:  # a flush() that raced with close() left nothing behind
            left, self._staged = self._staged, []
        self._report([(shard_id, seq, LogClosedError("log store closed")) for shard_id, _e, seq, _f in left])
        for _shard, _e, _seq, fut in left:
            if fut is not None:
                _fail(fut, LogClosedError("log store closed"))
        # The writer may have asked for a compaction after the compactor had stopped.
        while True:
            try:
                job = self._jobs.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self._compaction_over(self._shards[job[0]], LogClosedError("log store closed"))
        # Anything left (it cannot be an append: those are refused once closing) is failed.
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            self._discard(item, LogClosedError("log store closed"))
        with self._lock:
            self._state = "closed"

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def stats(self) -> list[ShardStats]:
        out = []
        for st in self._shards:
            body = max(st.size - HEADER_SIZE, 0)
            out.append(ShardStats(
                shard=st.id, bytes=st.size, entries=st.entries, live_keys=len(st.sizes),
                live_bytes=st.live_bytes, dead_bytes=max(body - st.live_bytes, 0), batches=st.batches,
                fsyncs=st.fsyncs, fsync_seconds=st.fsync_seconds, compactions=st.compactions,
                compaction_seconds=st.compaction_seconds,
                failed=None if st.failed is None else f"{type(st.failed).__name__}: {st.failed}",
                fsync_buckets=tuple(st.fsync_buckets)))
        return out


class FileStore(Store):
    """The file log behind the :class:`~coordinator.store.Store` interface (what ``herd serve``
    runs). :class:`LogStore` does the work; this adds the asyncio lifecycle: ``open`` runs the
    whole scan (every shard checked before any file is changed, as ``LogStore.open`` does) in an
    executor and keeps each shard's entries until the runtime loads it; ``close`` runs in an
    executor too. The file store owns every shard and never raises :class:`ShardFencedError`.

    ``submit`` and ``flush`` are the log's own bound methods, set on the instance: the event loop's
    per-request calls cost no extra call through this adapter."""

    def __init__(self, data_dir, num_shards: int = 50, fsync: str = "always", *, repair: bool = False,
                 **options):
        self.log = LogStore(data_dir, num_shards, fsync=fsync, repair=repair, **options)
        self.num_shards = num_shards
        self._entries: dict[int, list[Entry]] = {}
        self.submit = self.log.submit
        self.flush = self.log.flush

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        self._entries = await loop.run_in_executor(None, functools.partial(self.log.open, latest_only=True))

    def owned_shards(self) -> range:
        return range(self.num_shards)

    async def load(self, shard_id: int) -> list[Entry]:
        """The shard's entries, latest only (each key's last value, no tombstones), handed over once."""
        return self._entries.pop(shard_id, [])

    def submit(self, shard_id: int, entries: list[Entry]) -> int:  # replaced per instance, see above
        return self.log.submit(shard_id, entries)

    def flush(self) -> list:  # replaced per instance, see above
        return self.log.flush()

    def set_listener(self, listener) -> None:
        self.log.set_listener(listener)

    async def compact(self, shard_id: int) -> dict | None:
        return await asyncio.wrap_future(self.log.compact(shard_id))

    def stats(self) -> list[ShardStats]:
        return self.log.stats()

    async def close(self) -> None:
        self._entries = {}
        await asyncio.get_running_loop().run_in_executor(None, self.log.close)
