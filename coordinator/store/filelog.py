"""herd's file log: one append-only file per shard, replayed at start-up; and :class:`FileStore`,
the file log behind the :class:`coordinator.store.Store` interface.

Entries are opaque ``(key: bytes, value: bytes | None)`` pairs; ``None`` is a tombstone. This layer
never looks inside them (``tools/logdump`` does).

The parts: :mod:`coordinator.store.logformat` (the bytes on disk, scanning, damage),
:mod:`coordinator.store.writer` (:class:`~coordinator.store.writer.Writer`: the open files, the
staged writes, the writer and sync threads and their locks), :mod:`coordinator.store.compaction`
(:class:`~coordinator.store.compaction.Compaction`: the compactor thread),
:mod:`coordinator.store.fileio` (OS calls). This module holds the store class, which holds a
writer and a compaction: opening (with the torn-tail and corruption rules of ``logformat``), then
the writer's write API, and closing.

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
import functools
import gc
import json
import os
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path

import structlog

from coordinator.store import Entry, ShardStats, Store
from coordinator.store.compaction import Compaction
from coordinator.store.fileio import _fsync_dir, _pwrite_all, _write_file_atomic
from coordinator.store.logformat import (
    COMPACT_TMP,
    CRC32C_IMPL,
    FORMAT_VERSION,
    HEADER_SIZE,
    META_NAME,
    LogCorruptError,
    LogError,
    LogFormatError,
    _Scan,
    _scan,
    encode_header,
    latest,
    shard_dir_name,
)
from coordinator.store.writer import SYNC_JOBS, MiB, Writer, _Shard

log = structlog.get_logger("herd.log")
_warned_slow_crc = False


class LogStore:
    """Durable per-shard logs. ``open()`` once, ``append()`` from any thread, ``close()`` once.
    Holds a :class:`Writer` (``writer``: the files once open, the writes, their threads and locks)
    and a :class:`Compaction` (``compaction``); ``append``, ``submit``, ``flush``,
    ``set_listener``, ``compact`` and ``stats`` are the writer's."""

    def __init__(self, data_dir, num_shards: int = 50, fsync: str = "always", *, repair: bool = False,
                 compact_threshold_bytes: int = 64 * MiB, compact_dead_ratio: float = 0.5,
                 auto_compact: bool = True, sync_jobs: int = SYNC_JOBS, fsync_interval_ms: int = 1000):
        if fsync not in ("always", "interval", "never"):
            raise ValueError(f"fsync must be 'always', 'interval' or 'never', got {fsync!r}")
        if fsync_interval_ms <= 0:
            raise ValueError(f"fsync_interval_ms must be positive, got {fsync_interval_ms}")
        if not 1 <= num_shards <= 0xFFFF:
            raise ValueError(f"num_shards must be 1..65535, got {num_shards}")
        self.data_dir = Path(data_dir)
        self.num_shards = num_shards
        self.fsync = fsync
        self.repair = repair
        self.writer = Writer(num_shards, fsync, sync_jobs, fsync_interval_ms)
        self.compaction = Compaction(self.writer, compact_threshold_bytes, compact_dead_ratio, auto_compact)
        # the writer's bound methods on the instance: the event loop's per-request calls cost no
        # extra call through the store
        self.submit = self.writer.submit
        self.flush = self.writer.flush
        self.append = self.writer.append

    # ---- open ------------------------------------------------------------------------------------

    def open(self, latest_only: bool = False) -> dict[int, list[Entry]]:
        """Check every shard, cut torn tails, start the threads; -> {shard id: [(key, value), ...]}
        in log order. Raises LogCorruptError (changing no log file) for damage in the middle of a log
        unless ``repair``; LogFormatError / LogError for files it must not touch.

        ``latest_only``: return what a compaction would keep (the last value of each key, in the
        order of those last entries, no tombstones) so the caller decodes each key once. Replaying
        it is equivalent by construction: after a compaction that is all the file holds."""
        self.writer.begin_open()
        global _warned_slow_crc
        if CRC32C_IMPL == "pure-python" and not _warned_slow_crc:
            _warned_slow_crc = True
            log.warning("log.crc32c_slow", detail="no C CRC32C (google-crc32c) installed; replay is slow")
        shards: list[_Shard] = []
        try:
            result = self._open(shards)
            if latest_only:
                for shard_id, entries in result.items():
                    result[shard_id] = latest(entries)
        except BaseException:
            for st in shards:
                if st.fd >= 0:
                    os.close(st.fd)
                    st.fd = -1
            self.writer.open_failed()
            raise
        self.writer.start(shards, self.compaction)
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

    def _open(self, shards: list[_Shard]) -> dict[int, list[Entry]]:
        # Replay makes no cyclic garbage; without this, the collections that the new tuples trigger
        # rescan all the earlier ones (~40% of the time of a 1M-entry replay).
        gc_was_enabled = gc.isenabled()
        gc.disable()
        try:
            return self._open_files(shards)
        finally:
            if gc_was_enabled:
                gc.enable()

    def _open_files(self, shards: list[_Shard]) -> dict[int, list[Entry]]:
        self._check_meta()
        created_dirs = False
        scans = []
        for shard_id in range(self.num_shards):
            d = self.data_dir / shard_dir_name(shard_id)
            if not d.is_dir():
                d.mkdir()
                created_dirs = True
            st = _Shard(shard_id, d)
            shards.append(st)
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
        for st, sc in zip(shards, scans, strict=True):
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
        if self.fsync != "never" or changed:
            os.fsync(st.fd)  # a cut is durable before anything is appended after it
            st.synced = True
        return sc.entries

    # ---- the writer's ------------------------------------------------------------------------------

    def append(self, shard_id: int, entries: Iterable[Entry]) -> Future:  # replaced per instance
        return self.writer.append(shard_id, entries)

    def submit(self, shard_id: int, entries: list[Entry]) -> int:  # replaced per instance
        return self.writer.submit(shard_id, entries)

    def flush(self) -> list:  # replaced per instance
        return self.writer.flush()

    def set_listener(self, listener) -> None:
        self.writer.set_listener(listener)

    def compact(self, shard_id: int) -> Future:
        """Compact ``shard_id`` now (in the background); the Future resolves to a dict of figures."""
        return self.writer.compact(shard_id)

    def close(self) -> None:
        """Write everything queued (resolving its futures), stop the threads, close the files."""
        self.writer.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def stats(self) -> list[ShardStats]:
        return self.writer.stats()


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
