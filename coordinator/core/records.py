"""The durable records, in Kafka's ``__consumer_offsets`` format.

A record is a key and a value, each ``int16 version`` followed by the struct at that version:

====================  ==========================  ===============================================
record                key                          value
====================  ==========================  ===============================================
offset commit         type 1 + OffsetCommitKey     v3 OffsetCommitValue (v1 when the commit has an
                      (type 0 is read too)         explicit expire timestamp: OffsetCommit v2-v4
                                                   with retention_time_ms)
group metadata        type 2 + GroupMetadataKey    v3 GroupMetadataValue
====================  ==========================  ===============================================

A value of ``None`` is a tombstone (the key is deleted). Key types 3 and up (KIP-848 consumer
groups, share groups, streams groups) are reported as unknown by :func:`decode_key` so replay can
skip them. Anything that cannot be decoded raises :class:`RecordError` (one error type).

The offset-commit key and value are on the commit hot path, so they are packed with precompiled
``struct`` code; a test checks the bytes are identical to the generated codec's.

Committed offsets in memory are their value bytes (v3, or v1 with an explicit expiry), the same
bytes as in the log: a commit stores what it writes, replay keeps what it reads, and a value costs
one bytes object (no GC tracking, ~60 bytes). :func:`offset_value_fields` and
:func:`offset_value_times` read them back.
"""
from __future__ import annotations

import struct
import sys

from protocol.messages import (
    GroupMetadataKey,
    GroupMetadataValue,
    GroupMetadataValueMemberMetadata,
    OffsetCommitKey,
    OffsetCommitValue,
)
from protocol.wire import EncodeError, ProtocolError

__all__ = [
    "OFFSET_COMMIT", "GROUP_METADATA", "RecordError", "offset_commit_key", "offset_commit_value",
    "offset_key_prefix", "offset_value", "offset_value_tail", "offset_value_fields", "offset_value_times",
    "plain_offset_commit", "decode_offset_key_prefix",
    "group_metadata_key", "group_metadata_value", "decode_key", "decode_value", "encode_key", "encode_value",
    "GroupMetadataValue", "GroupMetadataValueMemberMetadata", "OffsetCommitKey", "OffsetCommitValue",
    "GroupMetadataKey",
]

OFFSET_COMMIT_V0 = 0
OFFSET_COMMIT = 1
GROUP_METADATA = 2

OFFSET_COMMIT_VALUE_VERSION = 3
OFFSET_COMMIT_VALUE_EXPIRE_VERSION = 1
GROUP_METADATA_VALUE_VERSION = 3

_I16 = struct.Struct(">h")
_KEY_PREFIX = _I16.pack(OFFSET_COMMIT)
_I32 = struct.Struct(">i")
_V3_HEAD = V3_HEAD = struct.Struct(">hqi")  # version, offset, leader_epoch (offset_value's, inlined by offsets.py)
_V1_HEAD = struct.Struct(">hq")  # version, offset
_I64 = struct.Struct(">q")
_I64_I64 = struct.Struct(">qq")
_V3_FIXED = struct.Struct(">hqih")  # version, offset, leader_epoch, metadata length
_V1_FIXED = struct.Struct(">hqh")  # version, offset, metadata length


class RecordError(ValueError):
    """A record key or value that cannot be decoded (or encoded)."""


def _str16(s: str) -> bytes:
    b = s.encode()
    if len(b) > 0x7FFF:
        raise RecordError(f"string of {len(b)} bytes does not fit a record field")
    return _I16.pack(len(b)) + b


# ---- encoding ------------------------------------------------------------------------------

def offset_commit_key(group: str, topic: str, partition: int) -> bytes:
    """Key bytes of an offset commit (type 1)."""
    return offset_key_prefix(group, topic) + _I32.pack(partition)


def offset_key_prefix(group: str, topic: str) -> bytes:
    """Everything of an offset-commit key but the partition (for many partitions of one topic).
    Remembered per (group, topic): a group commits the same topics again and again (a pure
    function's memo, bounded: emptied when it reaches ``_PREFIXES_MAX``)."""
    names = (group, topic)
    prefix = _PREFIXES.get(names)
    if prefix is None:
        prefix = b"".join((_KEY_PREFIX, _str16(group), _str16(topic)))
        if len(_PREFIXES) >= _PREFIXES_MAX:
            _PREFIXES.clear()
        _PREFIXES[names] = prefix
    return prefix


_PREFIXES: dict[tuple[str, str], bytes] = {}
_PREFIXES_MAX = 16384


pack_partition = _I32.pack


def offset_commit_value(offset: int, leader_epoch: int, metadata: str, commit_timestamp: int,
                        expire_timestamp: int = -1) -> bytes:
    """Value bytes: v3 normally, v1 when an explicit expire timestamp exists (v1 has no leader
    epoch, as in Kafka)."""
    return offset_value(offset, leader_epoch, offset_value_tail(metadata, commit_timestamp, expire_timestamp),
                        expire_timestamp)


def offset_value_tail(metadata: str, commit_timestamp: int, expire_timestamp: int = -1) -> bytes:
    """The bytes of an offset-commit value after its offset and leader epoch (metadata and
    timestamps): shared by every partition of a commit, so built once per commit."""
    if expire_timestamp == -1:
        return _str16(metadata) + _I64.pack(commit_timestamp)
    return _str16(metadata) + _I64_I64.pack(commit_timestamp, expire_timestamp)


def offset_value(offset: int, leader_epoch: int, tail: bytes, expire_timestamp: int = -1) -> bytes:
    """Value bytes from the offset, the leader epoch and an :func:`offset_value_tail` built with
    the same ``expire_timestamp``."""
    if expire_timestamp == -1:
        return _V3_HEAD.pack(OFFSET_COMMIT_VALUE_VERSION, offset, leader_epoch) + tail
    return _V1_HEAD.pack(OFFSET_COMMIT_VALUE_EXPIRE_VERSION, offset) + tail


def offset_value_fields(value: bytes) -> tuple[int, int, str, int, int]:
    """``(offset, leader_epoch, metadata, commit_timestamp, expire_timestamp)`` of a value as kept
    in memory (v3, or v1: leader epoch -1)."""
    if value[1] == OFFSET_COMMIT_VALUE_VERSION:
        _, offset, epoch, n = _V3_FIXED.unpack_from(value)
        (ts,) = _I64.unpack_from(value, 16 + n)
        return offset, epoch, value[16:16 + n].decode(), ts, -1
    _, offset, n = _V1_FIXED.unpack_from(value)
    ts, expire = _I64_I64.unpack_from(value, 12 + n)
    return offset, -1, value[12:12 + n].decode(), ts, expire


def offset_value_times(value: bytes) -> tuple[int, int]:
    """``(commit_timestamp, expire_timestamp)`` of a value as kept in memory."""
    if value[1] == OFFSET_COMMIT_VALUE_VERSION:
        return _I64.unpack_from(value, len(value) - 8)[0], -1
    return _I64_I64.unpack_from(value, len(value) - 16)


def group_metadata_key(group: str) -> bytes:
    return _I16.pack(GROUP_METADATA) + _str16(group)


def group_metadata_value(value: GroupMetadataValue) -> bytes:
    try:
        return _I16.pack(GROUP_METADATA_VALUE_VERSION) + value.encode(GROUP_METADATA_VALUE_VERSION)
    except EncodeError as exc:
        raise RecordError(str(exc)) from None


def encode_key(obj) -> bytes:
    """Key bytes for an OffsetCommitKey or GroupMetadataKey object."""
    if isinstance(obj, OffsetCommitKey):
        return offset_commit_key(obj.group, obj.topic, obj.partition)
    if isinstance(obj, GroupMetadataKey):
        return group_metadata_key(obj.group)
    raise RecordError(f"not a record key: {type(obj).__name__}")


def encode_value(obj) -> bytes | None:
    """Value bytes for an OffsetCommitValue / GroupMetadataValue object; None stays None."""
    if obj is None:
        return None
    if isinstance(obj, OffsetCommitValue):
        return offset_commit_value(obj.offset, obj.leader_epoch, obj.metadata, obj.commit_timestamp,
                                   obj.expire_timestamp)
    if isinstance(obj, GroupMetadataValue):
        return group_metadata_value(obj)
    raise RecordError(f"not a record value: {type(obj).__name__}")


# ---- decoding ------------------------------------------------------------------------------

def _version(data, what: str) -> int:
    if data is None or len(data) < 2:
        raise RecordError(f"{what}: too short for a version")
    (v,) = _I16.unpack_from(data, 0)
    return v


def decode_key(data: bytes) -> tuple[int, object | None]:
    """``(record_type, key)``. ``key`` is an OffsetCommitKey (types 0, 1) or a GroupMetadataKey
    (type 2); for any other type it is None (a record this coordinator does not own: skip it)."""
    rtype = _version(data, "record key")
    try:
        if rtype in (OFFSET_COMMIT_V0, OFFSET_COMMIT):
            return rtype, OffsetCommitKey.decode(data, rtype, 2)
        if rtype == GROUP_METADATA:
            return rtype, GroupMetadataKey.decode(data, GROUP_METADATA, 2)
    except ProtocolError as exc:
        raise RecordError(f"record key type {rtype}: {exc}") from None
    return rtype, None


def decode_value(rtype: int, data: bytes | None):
    """The value object for a key of ``rtype``; None for a tombstone. A value written by a newer
    version is read with the newest schema we know (later versions only add tagged fields)."""
    if data is None:
        return None
    if rtype in (OFFSET_COMMIT_V0, OFFSET_COMMIT):
        cls = OffsetCommitValue
    elif rtype == GROUP_METADATA:
        cls = GroupMetadataValue
    else:
        raise RecordError(f"no value schema for record type {rtype}")
    version = _version(data, cls.NAME)
    if version < 0:
        raise RecordError(f"{cls.NAME}: negative version {version}")
    try:
        return cls.decode(data, min(version, cls.MAX_VERSION), 2)
    except ProtocolError as exc:
        raise RecordError(f"{cls.NAME} v{version}: {exc}") from None


_FAST_KEY_PREFIX = b"\x00\x01"  # OffsetCommitKey, record type 1
_FAST_VALUE_PREFIX = b"\x00\x03"  # OffsetCommitValue v3


def plain_offset_commit(key: bytes, value: bytes | None) -> tuple[bytes, int] | None:
    """``(prefix, partition)`` for the record herd writes for almost every commit: a type-1 key
    and a v3 value laid out exactly as herd writes it (kept in memory as it is). ``prefix`` is the
    key without its partition, one per group and topic: decode it with
    :func:`decode_offset_key_prefix`. None for anything else (a tombstone, another version,
    damage: the generic decoder's job)."""
    if (value is None or len(value) < 24 or len(key) < 10 or key[:2] != _FAST_KEY_PREFIX
            or value[:2] != _FAST_VALUE_PREFIX):
        return None
    (n,) = _I16.unpack_from(value, 14)  # metadata length (a negative one cannot match)
    if len(value) != 24 + n:
        return None
    if n:
        try:
            value[16:16 + n].decode()
        except UnicodeDecodeError:
            return None
    return key[:-4], _I32.unpack_from(key, len(key) - 4)[0]


def decode_offset_key_prefix(prefix: bytes) -> tuple[str, str] | None:
    """``(group, topic)`` of a prefix from :func:`plain_offset_commit`; None when it is not
    exactly two strings (the generic decoder then reports the damage)."""
    try:
        (n,) = _I16.unpack_from(prefix, 2)
        p = 4 + n
        (m,) = _I16.unpack_from(prefix, p)
        if n < 0 or m < 0 or p + 2 + m != len(prefix):
            return None
        return sys.intern(prefix[4:p].decode()), sys.intern(prefix[p + 2:].decode())
    except (struct.error, UnicodeDecodeError):
        return None
