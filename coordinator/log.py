"""herd's durable log: one append-only file per shard, replayed at start-up.

Entries are opaque ``(key: bytes, value: bytes | None)`` pairs; ``None`` is a tombstone. This layer
never looks inside them (``tools/logdump`` does).

On disk
-------
::

    <data_dir>/herd-log.json          {"format": 1, "num_shards": 50}  (the shard count is fixed
                                       for the life of a data dir: groups hash to shards)
    <data_dir>/shard-07/current.log   the shard's log
    <data_dir>/shard-07/compacting.tmp  a compaction in progress (deleted at open if left over)

ONE file per shard, replaced whole by compaction (not segments). A compaction writes the live
entries to ``compacting.tmp``, fsyncs it, renames it over ``current.log`` and fsyncs the directory,
so after a crash either the old file or the new one is there, both complete. With a single file the
replay order is simply file order, and no crash can leave two files whose contents overlap.

File header, 24 bytes, big-endian::

    magic       8 bytes  b"HERDLOG\\x00"
    format      uint16   1
    shard       uint16   the shard this file belongs to (a file copied into the wrong dir is refused)
    durable_end uint64   every byte before this offset was fsynced (set by compaction, and by a
                         clean stop; the header size for a file that had neither)
    crc         uint32   CRC32C of the 20 bytes above

Entries follow back to back, big-endian::

    length      uint32   bytes from ``version`` to the end of the entry (>= 10)
    crc         uint32   CRC32C (Castagnoli) of those ``length`` bytes
    version     uint8    0
    attributes  uint8    bit 0 PREFIX_DURABLE: every byte before this entry was fsynced before it
                         was written (set on the first entry of a batch written after an fsync)
    key_len     int32    >= 0, then the key
    value_len   int32    -1 for a tombstone, else the length, then the value

18 bytes of framing per entry. Writes use ``pwrite`` at the end the writer tracks (no O_APPEND).

Opening: tails and corruption
-----------------------------
:meth:`LogStore.open` reads each file whole and parses it with ``struct.unpack_from`` in one tight
loop, checking every entry's CRC. At the first entry that does not check out (short header, length
past the end of the file, bad CRC, inconsistent lengths) it decides whether the damage is a torn
tail or corruption in the middle:

* Torn tail — nothing valid after the damage proves the damaged bytes were ever durable. The file
  is truncated at the start of the damaged entry, the cut is logged (``log.tail_truncated``) and the
  shard opens with every entry before it. A crash mid-write (even one that persisted a later page of
  a batch but not an earlier one) always looks like this: a batch is written in one ``pwrite``
  and fsynced before anything that follows it is written.
* Corruption in the middle — the damage lies before ``durable_end`` (a region a compaction or a
  clean stop made durable: nothing was being written there when the process last stopped), or a
  valid entry with PREFIX_DURABLE lies after it: those bytes had been fsynced, so this is not a torn
  write but lost data (bit rot, a bad disk, a stray writer). herd REFUSES TO START: ``open()``
  raises :class:`LogCorruptError` naming the file, the byte offset, the reason and where the intact
  data resumes, and changes no log file (every shard is checked first, all problems are listed). With
  ``repair=True`` (``herd serve --repair``) the file is cut at the first bad entry instead, which
  drops everything after it, and an error-level ``log.repaired`` event says how much was lost.
  Cutting (rather than skipping the bad entry) keeps the invariant below; deciding to lose
  acknowledged data is left to a human.

Under ``fsync="never"`` nothing carries PREFIX_DURABLE (except what compaction made durable), so
damage after a power loss is treated as a torn tail: that mode promised nothing.

A header shorter than 24 bytes (a crash while the file was created; no entry can exist) is
rewritten. A bad magic or header CRC is corruption (``repair`` rewrites the header and keeps the
entries that check out). A newer format or entry version raises :class:`LogFormatError`, never
truncates.

Invariant: a crash at any point never loses an entry reported durable (``fsync="always"``)
and never leaves a later entry of a shard visible while an earlier one is lost; open keeps a
prefix of what was written.

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

Speed
-----
CRC32C comes from ``google_crc32c`` (or the ``crc32c`` package) when installed: 45 µs per MiB and
~0.2 µs per 100-byte entry, against 158 ms per MiB and ~16 µs per entry for the pure-Python table
fallback (which works, but makes replay of a large log ~15x slower). Replay reads each file whole and
parses it in one loop with the cyclic GC paused: 1,000,000 entries (50-byte keys, 30-byte values,
98 MB over 50 shards) open in ~1.0-1.7 s on a loaded 2-core VM. :func:`benchmark_replay` reproduces
the figure; ``open(latest_only=True)`` lets the caller decode each key once.
"""
from __future__ import annotations

import bisect
import collections
import errno
import gc
import json
import os
import queue
import struct
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path

import structlog

log = structlog.get_logger("herd.log")

Entry = tuple[bytes, bytes | None]

# ---- CRC32C ----------------------------------------------------------------------------------------


def _make_table() -> list[int]:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        table.append(c)
    return table


_TABLE = _make_table()


def crc32c_pure(data) -> int:
    """CRC32C (Castagnoli), table-driven pure Python: the fallback when no C implementation is installed."""
    crc = 0xFFFFFFFF
    table = _TABLE
    for b in bytes(data):
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _pick_crc32c():
    try:
        import google_crc32c
        if getattr(google_crc32c, "implementation", "c") == "c":
            return google_crc32c.value, "google-crc32c"
    except ImportError:
        pass
    try:
        import crc32c as _crc32c_pkg
        return _crc32c_pkg.crc32c, "crc32c"
    except ImportError:
        pass
    return crc32c_pure, "pure-python"


crc32c, CRC32C_IMPL = _pick_crc32c()  # crc32c(data: bytes) -> int
_warned_slow_crc = False

# ---- format ------------------------------------------------------------------------------------------

MAGIC = b"HERDLOG\x00"
FORMAT_VERSION = 1
ENTRY_VERSION = 0
PREFIX_DURABLE = 0x01

_HEADER = struct.Struct(">8sHHQ")  # magic, format, shard, durable_end; then crc32c
_U32 = struct.Struct(">I")
HEADER_SIZE = _HEADER.size + 4  # 24
_FRAME_U = struct.Struct(">IIBBI")  # length, crc, version, attributes, key_len (read unsigned)
_LEN_CRC = struct.Struct(">II")
_PAYLOAD_HEAD = struct.Struct(">BBi")  # version, attributes, key_len
_I32 = struct.Struct(">i")
_MIN_LENGTH = 10  # version + attributes + key_len + value_len
_MIN_FRAME = 8 + _MIN_LENGTH
_TOMBSTONE_LEN = _I32.pack(-1)
MAX_ENTRY_BYTES = 256 * 1024 * 1024  # key + value of one entry

LOG_NAME = "current.log"
COMPACT_TMP = "compacting.tmp"
META_NAME = "herd-log.json"
MiB = 1024 * 1024
PREALLOC_MIN = 64 * 1024  # zeros written ahead of a shard's end: a quarter of its size, within these
PREALLOC_MAX = 1 * MiB
SYNC_JOBS = 4  # batches whose fdatasyncs may run at once (a batch written while another syncs)
_fdatasync = getattr(os, "fdatasync", os.fsync)  # the size is covered: fdatasync flushes it when it changed


def shard_dir_name(shard_id: int) -> str:
    return f"shard-{shard_id:02d}"


def encode_header(shard_id: int, durable_end: int = HEADER_SIZE) -> bytes:
    head = _HEADER.pack(MAGIC, FORMAT_VERSION, shard_id, durable_end)
    return head + _U32.pack(crc32c(head))


def encode_entries(entries: Iterable[Entry], first_attributes: int = 0) -> bytes:
    """Frame ``entries`` back to back; the first one carries ``first_attributes``."""
    parts = []
    add = parts.append
    attrs = first_attributes
    lencrc = _LEN_CRC.pack
    packers = _ENTRY_PACKERS
    for key, value in entries:
        kl = len(key)
        if value is None:
            payload = b"".join((_PAYLOAD_HEAD.pack(ENTRY_VERSION, attrs, kl), key, _TOMBSTONE_LEN))
        else:
            vl = len(value)
            pack = packers.get((kl, vl)) or _entry_packer(kl, vl)
            payload = pack(ENTRY_VERSION, attrs, kl, key, vl, value)
        add(lencrc(len(payload), crc32c(payload)))
        add(payload)
        attrs = 0
    return b"".join(parts)


# (key length, value length) -> the pack of an entry's payload with those lengths: one call per
# entry instead of three. Offset commits have a handful of shapes (one per group/topic name length
# and metadata length); the cache is cleared if a stream of odd shapes makes it large.
_ENTRY_PACKERS: dict[tuple[int, int], object] = {}
_ENTRY_PACKERS_MAX = 4096


def _entry_packer(kl: int, vl: int):
    if len(_ENTRY_PACKERS) >= _ENTRY_PACKERS_MAX:
        _ENTRY_PACKERS.clear()
    pack = _ENTRY_PACKERS[(kl, vl)] = struct.Struct(f">BBi{kl}si{vl}s").pack
    return pack


# ---- errors ----------------------------------------------------------------------------------------


class LogError(Exception):
    """Base class of the log's errors."""


@dataclass(frozen=True)
class Damage:
    """Where a log file stops checking out. ``kind``: "torn" (a torn tail: cut at open) or "corrupt"
    (damage in data that had been durable: open refuses unless repair)."""

    shard: int
    path: str
    offset: int  # start of the first bad entry
    reason: str
    kind: str
    evidence: str = ""  # why "corrupt": where intact, durable data resumes
    size: int = 0  # file size

    def describe(self) -> str:
        text = f"shard {self.shard}: {self.path}: bad entry at byte {self.offset} ({self.reason})"
        if self.evidence:
            text += f"; {self.evidence}"
        return text


class LogCorruptError(LogError):
    """Damage in the middle of a log (or a bad header): herd refuses to open. ``problems`` lists every
    damaged shard; ``shard``, ``path``, ``offset`` and ``reason`` describe the first."""

    def __init__(self, problems: list[Damage]):
        self.problems = list(problems)
        first = self.problems[0]
        self.shard, self.path, self.offset, self.reason = first.shard, first.path, first.offset, first.reason
        text = "; ".join(p.describe() for p in self.problems)
        super().__init__(f"corrupt log: {text}")


class LogFormatError(LogError):
    """A file written by a newer herd (unknown format or entry version), or foreign files."""


class ShardFailedError(LogError):
    """A write or fsync of this shard failed earlier; it takes no more appends until a restart."""

    def __init__(self, shard_id: int, cause: BaseException):
        self.shard = shard_id
        self.cause = cause
        super().__init__(f"log shard {shard_id} failed earlier and refuses writes until restart: {cause}")


class LogClosedError(LogError):
    """The store is not open (not yet opened, or closed)."""


# ---- reading ---------------------------------------------------------------------------------------


def _parse(buf: bytes, pos: int, end: int, out: list, sizes: dict) -> int:
    """Append ``(key, value)`` for every valid entry from ``pos``; maintain ``sizes`` (hash(key) ->
    framed size of its live entry). Returns where it stopped (``end`` when the whole range is good).

    The hot loop of replay (~0.75 µs per entry here). The CRC covers the whole entry, so once it
    checks out the value length is taken from the frame length (a tombstone is the only value whose
    length field starts with 0xFF); :func:`_frame_problem` checks every field on the slow path."""
    unpack = _FRAME_U.unpack_from
    append = out.append
    crc = crc32c
    pop = sizes.pop
    limit = end - _MIN_FRAME
    while pos <= limit:
        length, want, version, _attrs, klen = unpack(buf, pos)
        nxt = pos + 8 + length
        if nxt > end or version or length < _MIN_LENGTH + klen:  # klen unsigned: < 0 is huge
            break
        if crc(buf[pos + 8:nxt]) != want:
            break
        kend = pos + 14 + klen
        key = buf[pos + 14:kend]
        if length == _MIN_LENGTH + klen and buf[kend] == 0xFF:
            append((key, None))
            pop(hash(key), None)
        else:
            append((key, buf[kend + 4:nxt]))
            sizes[hash(key)] = nxt - pos
        pos = nxt
    return pos


def _parse_positions(buf: bytes, pos: int, end: int, out: list) -> int:
    """Like :func:`_parse` but appends ``(start, next, attributes, key, value)``."""
    unpack = _FRAME_U.unpack_from
    append = out.append
    crc = crc32c
    limit = end - _MIN_FRAME
    while pos <= limit:
        length, want, version, attrs, klen = unpack(buf, pos)
        nxt = pos + 8 + length
        if nxt > end or version or length < _MIN_LENGTH + klen:
            break
        if crc(buf[pos + 8:nxt]) != want:
            break
        kend = pos + 14 + klen
        if length == _MIN_LENGTH + klen and buf[kend] == 0xFF:
            append((pos, nxt, attrs, buf[pos + 14:kend], None))
        else:
            append((pos, nxt, attrs, buf[pos + 14:kend], buf[kend + 4:nxt]))
        pos = nxt
    return pos


def _frame_problem(buf: bytes, pos: int, end: int) -> str | None:
    """Why the entry at ``pos`` is bad, or None if it is good. Raises LogFormatError for an entry
    that checks out but has a version this code does not know."""
    if end - pos < 8:
        return f"truncated entry header ({end - pos} of 8 bytes)"
    length, want = _LEN_CRC.unpack_from(buf, pos)
    if length < _MIN_LENGTH:
        return f"invalid length {length}"
    nxt = pos + 8 + length
    if nxt > end:
        return f"entry of {length} bytes runs past the end of the file ({end - pos - 8} left)"
    if crc32c(buf[pos + 8:nxt]) != want:
        return "checksum mismatch"
    version = buf[pos + 8]
    if version != ENTRY_VERSION:
        raise LogFormatError(f"entry at byte {pos} has version {version}; this herd reads version "
                             f"{ENTRY_VERSION} (written by a newer herd?)")
    klen = _I32.unpack_from(buf, pos + 10)[0]
    if klen < 0 or length < _MIN_LENGTH + klen:
        return f"inconsistent key length {klen}"
    vlen = _I32.unpack_from(buf, pos + 14 + klen)[0]
    if (vlen == -1 and length != _MIN_LENGTH + klen) or (vlen != -1 and length != _MIN_LENGTH + klen + vlen):
        return f"inconsistent value length {vlen}"
    return None


def _durable_entry_after(buf: bytes, start: int, end: int) -> int | None:
    """Offset of the first valid entry at or after ``start`` flagged PREFIX_DURABLE, or None."""
    marker = bytes((ENTRY_VERSION, PREFIX_DURABLE))
    i = buf.find(marker, start + 8, end)
    while i != -1:
        cand = i - 8
        try:
            ok = _frame_problem(buf, cand, end) is None
        except LogFormatError:
            ok = False
        if ok:
            return cand
        i = buf.find(marker, i + 1, end)
    return None


def _count_entries(buf: bytes, pos: int, end: int) -> int:
    out: list = []
    _parse_positions(buf, pos, end, out)
    return len(out)


def _read_header(buf: bytes, shard_id: int | None, path: str) -> tuple[int | None, int, str | None]:
    """-> (shard in header, durable_end, problem). ``problem`` is "short" for a header cut short (no
    entry can exist), another string for a damaged header; raises LogFormatError for a newer format
    or a file of another shard."""
    if len(buf) < HEADER_SIZE:
        return shard_id, HEADER_SIZE, "short"
    magic, fmt, shard, durable_end = _HEADER.unpack_from(buf, 0)
    if magic != MAGIC or _U32.unpack_from(buf, _HEADER.size)[0] != crc32c(buf[:_HEADER.size]):
        return shard_id, HEADER_SIZE, "bad file header (magic or checksum)"
    if fmt != FORMAT_VERSION:
        raise LogFormatError(f"{path}: log format {fmt}; this herd reads format {FORMAT_VERSION}")
    if shard_id is not None and shard != shard_id:
        raise LogFormatError(f"{path}: file belongs to shard {shard}, "
                             f"found in the directory of shard {shard_id}")
    return shard, max(durable_end, HEADER_SIZE), None


@dataclass
class _Scan:
    shard: int | None
    size: int
    end: int  # end of the last good entry
    durable_end: int
    entries: list
    damage: Damage | None  # of the entries (torn or corrupt)
    header_damage: Damage | None  # a short header is "torn", a bad one "corrupt"
    zero_tail: bool = False  # zeros from ``end`` to ``size``: preallocated, not damage


def _scan(buf: bytes, shard_id: int | None, path: str, positions: bool, sizes: dict | None = None) -> _Scan:
    shard, durable_end, header_problem = _read_header(buf, shard_id, path)
    size = len(buf)
    shown = shard if shard is not None else -1
    entries: list = []
    if header_problem == "short":
        hd = Damage(shown, path, 0, "file header cut short", "torn", size=size) if size else None
        return _Scan(shard, size, 0, HEADER_SIZE, entries, None, hd)
    header_damage = None
    if header_problem is not None:
        header_damage = Damage(shown, path, 0, header_problem, "corrupt", size=size)
    if positions:
        stop = _parse_positions(buf, HEADER_SIZE, size, entries)
    else:
        stop = _parse(buf, HEADER_SIZE, size, entries, sizes if sizes is not None else {})
    damage = None
    if stop < size and stop >= durable_end and buf.count(0, stop) == size - stop:
        return _Scan(shard, size, stop, durable_end, entries, None, header_damage, zero_tail=True)
    if stop < size:
        reason = _frame_problem(buf, stop, size) or "invalid entry"
        evidence = ""
        if stop < durable_end:
            evidence = (f"the bytes before {durable_end} had been made durable (by a compaction or a "
                        f"clean stop), so this is not a torn write")
        else:
            later = _durable_entry_after(buf, stop + 1, size)
            if later is not None:
                n = _count_entries(buf, later, size)
                evidence = (f"intact entries follow from byte {later} ({n} or more), written after the "
                            f"damaged bytes had been fsynced, so this is not a torn write")
        damage = Damage(shown, path, stop, reason, "corrupt" if evidence else "torn", evidence, size)
    elif size < durable_end:
        damage = Damage(shown, path, size, f"file ends before its durable end {durable_end}", "corrupt",
                        "the file lost data that a compaction or a clean stop had made durable", size)
    return _Scan(shard, size, stop, durable_end, entries, damage, header_damage)


@dataclass
class LogFile:
    """A read-only view of one shard file (for tools): entries are ``(position, key, value)``."""

    path: str
    shard: int | None
    size: int
    durable_end: int
    entries: list[tuple[int, bytes, bytes | None]]
    damage: Damage | None  # where the entries stop checking out; a "torn" one open() would cut
    header_damage: Damage | None = None
    end: int = 0  # end of the last good entry (before a preallocated zero tail, or the damage)


def read_log_file(path, shard_id: int | None = None) -> LogFile:
    """Read and check one log file without changing it."""
    path = str(path)
    with open(path, "rb") as f:
        buf = f.read()
    sc = _scan(buf, shard_id, path, positions=True)
    entries = [(p, k, v) for p, _n, _a, k, v in sc.entries]
    return LogFile(path, sc.shard, sc.size, sc.durable_end, entries, sc.damage, sc.header_damage, sc.end)


def latest(entries: list[Entry]) -> list[Entry]:
    """What compaction keeps of ``entries``: each key's last entry, in log order, minus tombstones."""
    last = {key: i for i, (key, _value) in enumerate(entries)}
    return [e for i, e in enumerate(entries) if e[1] is not None and last[e[0]] == i]


# ---- file helpers ----------------------------------------------------------------------------------


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


# ---- the store -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ShardStats:
    shard: int
    bytes: int  # file size
    entries: int  # entries in the file
    live_keys: int
    live_bytes: int  # framed bytes of the live entries (estimate, see the module docstring)
    dead_bytes: int
    batches: int  # write batches
    fsyncs: int  # fsyncs of appended data (one per batch under fsync="always")
    fsync_seconds: float  # their cumulative latency
    compactions: int
    compaction_seconds: float
    failed: str | None  # the error that failed the shard
    fsync_buckets: tuple = ()  # fsyncs per FSYNC_BUCKETS latency bucket (not cumulative), then the rest


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


_FLUSH, _COMPACT, _SWAP, _SWAP_FAILED, _CHECK_ALL, _STOP = range(6)

# upper bounds (seconds) of the fsync latency buckets (herd_log_fsync_duration_seconds)
FSYNC_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0, 5.0)


class _SyncJob:
    """Some shards' batches to write and fdatasync on a sync thread; settled in the order jobs were
    made."""

    __slots__ = ("items", "errors")

    def __init__(self, items):
        self.items = items  # [(shard, slot, size after the write, (data, entries after) or None)]
        self.errors: list | None = None  # once synced, per item: the exception, or None (durable)


class LogStore:
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
        for st in self._shards:
            if st.fd >= 0:
                if self.fsync == "always" and st.failed is None and (
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
        a bad header and ``--repair`` rewrites it, losing nothing. Only under fsync="always":
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
            st = self._shards[item[1]]
            _close_quietly(item[2])
            _unlink_quietly(st.dir / COMPACT_TMP)
            self._compaction_over(st, exc)
        elif kind == _SWAP_FAILED:
            self._compaction_over(self._shards[item[1]], exc)

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
                self._request_compaction(self._shards[item[1]], item[2])
            elif kind == _SWAP:
                self._sync_barrier()  # no fdatasync of the old file may still run
                self._swap(*item[1:])
            elif kind == _SWAP_FAILED:
                self._compaction_over(self._shards[item[1]], item[2])
            elif kind == _CHECK_ALL:
                for st in self._shards:
                    self._maybe_compact(st)
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
                st = self._shards[shard_id]
                if st.failed is not None:
                    self._settle(results, st, slot, ShardFailedError(shard_id, st.failed))
                    continue
                entries = slot[0]
                data = encode_entries(entries, PREFIX_DURABLE if st.synced else 0)
                if not deferred:
                    try:
                        self._write(st, data, st.size)
                    except OSError as exc:
                        self._fail_shard(st, exc, "write")
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
                    st = self._shards[shard_id]
                    self._fail_shard(st, exc)
                    self._settle(results, st, slot, exc)
        if written:
            if deferred:
                self._start_sync(written)
            else:
                for st, slot, _size, _pending in written:
                    self._settle(results, st, slot, None)
            if self.auto_compact and self._state == "open":
                for item in written:
                    self._maybe_compact(item[0])
        return results

    @staticmethod
    def _settle(results: list, st: _Shard, slot: list, exc: BaseException | None) -> None:
        results.append((st.id, slot[1], exc))
        for f in slot[2]:
            if exc is None:
                f.set_result(None)
            else:
                _fail(f, exc)

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
                self._fail_shard(st, exc, "write")
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
                    self._fail_shard(st, exc, "fsync")
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

    def _fail_shard(self, st: _Shard, exc: BaseException, what: str = "internal error") -> None:
        if st.failed is None:
            st.failed = exc
            log.error("log.shard_failed", shard=st.id, path=str(st.path), operation=what, error=str(exc),
                      detail="the shard refuses writes until restart; the failed fsync is not retried")

    # ---- compaction (writer side) ----------------------------------------------------------------

    def _maybe_compact(self, st: _Shard) -> None:
        if not self.auto_compact or st.compacting or st.failed is not None:
            return
        body = st.size - HEADER_SIZE
        if (st.size >= self.compact_threshold_bytes and st.size >= st.no_auto_below
                and body - st.live_bytes >= self.compact_dead_ratio * body):
            self._start_compaction(st)

    def _request_compaction(self, st: _Shard, fut: Future) -> None:
        if st.failed is not None:
            _fail(fut, ShardFailedError(st.id, st.failed))
        elif st.compacting:
            st.next_waiters.append(fut)
        else:
            st.waiters.append(fut)
            self._start_compaction(st)

    def _start_compaction(self, st: _Shard) -> None:
        if self._state != "open":
            self._compaction_over(st, LogClosedError("log store closing"))
            return
        st.compacting = True
        st.snapshot = st.written  # what is in the file; the swap copies the rest, all written by then
        self._jobs.put((st.id, st.snapshot[0]))

    def _swap(self, shard_id: int, tmp_fd: int, tmp_size: int, kept: int, started: float) -> None:
        st = self._shards[shard_id]
        tmp_path = st.dir / COMPACT_TMP
        if st.failed is not None:
            _close_quietly(tmp_fd)
            _unlink_quietly(tmp_path)
            self._compaction_over(st, ShardFailedError(shard_id, st.failed))
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
                self._fail_shard(st, exc, "compaction")
            else:
                _close_quietly(tmp_fd)
                _unlink_quietly(tmp_path)
                self._fail_shard(st, exc, "compaction")
            self._compaction_over(st, exc)
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
        self._compaction_over(st, None, info)

    def _compaction_over(self, st: _Shard, exc: BaseException | None, info: dict | None = None) -> None:
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
                self._compaction_over(st, ShardFailedError(st.id, st.failed))
            else:
                self._start_compaction(st)

    # ---- compactor thread ------------------------------------------------------------------------

    def _compactor_main(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            shard_id, snap_size = job
            st = self._shards[shard_id]
            started = time.perf_counter()
            tmp_path = st.dir / COMPACT_TMP
            tmp_fd = -1
            try:
                tmp_fd, tmp_size, kept = self._compact_file(st, snap_size)
                hook = self._compaction_written_hook
                if hook is not None:
                    hook(shard_id)
                if self._state != "open":
                    raise LogClosedError("log store closing")
            except BaseException as exc:
                if tmp_fd >= 0:
                    _close_quietly(tmp_fd)
                _unlink_quietly(tmp_path)
                if not isinstance(exc, LogClosedError):
                    log.error("log.compaction_failed", shard=shard_id, error=f"{type(exc).__name__}: {exc}")
                self._queue.put((_SWAP_FAILED, shard_id, exc))
                continue
            self._queue.put((_SWAP, shard_id, tmp_fd, tmp_size, kept, started))

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
        if self._state != "open":
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


# ---- benchmark helper --------------------------------------------------------------------------------


def benchmark_replay(data_dir, entries: int = 1_000_000, num_shards: int = 50, key_bytes: int = 50,
                     value_bytes: int = 30, distinct_keys: int | None = None) -> dict:
    """Write ``entries`` synthetic entries (fsync="never", in batches) into an EMPTY ``data_dir``, then
    time ``LogStore.open()`` of it. Sizes default to a typical OffsetCommitKey v1 / OffsetCommitValue
    v3 record. -> a dict of parameters and seconds (``bench/`` prints it as JSON)."""
    distinct = distinct_keys or entries
    store = LogStore(data_dir, num_shards, fsync="never", auto_compact=False)
    store.open()
    t0 = time.perf_counter()
    pad_k = b"k" * max(key_bytes - 12, 0)
    pad_v = b"v" * max(value_bytes - 12, 0)
    futures = []
    batch = 1000
    for start in range(0, entries, batch):
        per_shard: dict[int, list] = {}
        for i in range(start, min(start + batch, entries)):
            k = i % distinct
            per_shard.setdefault(k % num_shards, []).append((b"%012d" % k + pad_k, b"%012d" % i + pad_v))
        for shard, items in per_shard.items():
            futures.append(store.append(shard, items))
    for f in futures:
        f.result()
    store.close()
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    reader = LogStore(data_dir, num_shards, fsync="never", auto_compact=False)
    shards = reader.open()
    open_s = time.perf_counter() - t0
    n = sum(len(v) for v in shards.values())
    size = sum(s.bytes for s in reader.stats())
    reader.close()
    return {"name": "log_replay", "entries": n, "num_shards": num_shards, "key_bytes": key_bytes,
            "value_bytes": value_bytes, "file_bytes": size, "crc32c": CRC32C_IMPL,
            "write_seconds": round(write_s, 3), "open_seconds": round(open_s, 3)}
