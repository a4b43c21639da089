"""The file log's on-disk format: framing, CRC32C, the file header, scanning a file, damage.

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

"""
from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass

from coordinator.store import Entry, StoreError

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


class LogError(StoreError):
    """Base class of the file log's own errors."""


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
