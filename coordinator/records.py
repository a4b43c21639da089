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
    "group_metadata_key", "group_metadata_value", "decode_key", "decode_value", "encode_key",
    "encode_value", "GroupMetadataValue", "GroupMetadataValueMemberMetadata", "OffsetCommitKey",
    "OffsetCommitValue", "GroupMetadataKey",
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
_V3_HEAD = struct.Struct(">hqi")  # version, offset, leader_epoch
_V1_HEAD = struct.Struct(">hq")  # version, offset
_I64 = struct.Struct(">q")
_I64_I64 = struct.Struct(">qq")


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
    """Everything of an offset-commit key but the partition (for many partitions of one topic)."""
    return b"".join((_KEY_PREFIX, _str16(group), _str16(topic)))


pack_partition = _I32.pack
encode_str16 = _str16


def offset_commit_value(offset: int, leader_epoch: int, metadata: str, commit_timestamp: int,
                        expire_timestamp: int = -1, metadata_str16: bytes | None = None) -> bytes:
    """Value bytes: v3 normally, v1 when an explicit expire timestamp exists (v1 has no leader
    epoch, as in Kafka). ``metadata_str16`` is ``metadata`` already encoded (length-prefixed)."""
    meta = metadata_str16 if metadata_str16 is not None else _str16(metadata)
    if expire_timestamp == -1:
        return b"".join((_V3_HEAD.pack(OFFSET_COMMIT_VALUE_VERSION, offset, leader_epoch), meta,
                         _I64.pack(commit_timestamp)))
    return b"".join((_V1_HEAD.pack(OFFSET_COMMIT_VALUE_EXPIRE_VERSION, offset), meta,
                     _I64_I64.pack(commit_timestamp, expire_timestamp)))


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
_H = struct.Struct(">h")
_QIH = struct.Struct(">qih")
_Q = struct.Struct(">q")
_I = struct.Struct(">i")


def decode_offset_commit_fast(key: bytes, value: bytes | None):
    """``(group, topic, partition, OffsetCommitValue)`` for the record herd writes for almost
    every commit (key type 1, value v3), decoded with fixed ``struct`` code; None for anything
    else (the caller then takes the generic path, which also reports damage)."""
    if value is None or key[:2] != _FAST_KEY_PREFIX or value[:2] != _FAST_VALUE_PREFIX:
        return None
    try:
        n, = _H.unpack_from(key, 2)
        p = 4 + n
        m, = _H.unpack_from(key, p)
        q = p + 2 + m
        if n < 0 or m < 0 or q + 4 != len(key):
            return None
        partition, = _I.unpack_from(key, q)
        offset, epoch, k = _QIH.unpack_from(value, 2)
        if k < 0 or 16 + k + 8 != len(value):
            return None
        ts, = _Q.unpack_from(value, 16 + k)
        gid = sys.intern(key[4:p].decode())
        topic = sys.intern(key[p + 2:q].decode())
        meta = value[16:16 + k].decode()
    except (struct.error, UnicodeDecodeError):
        return None
    return gid, topic, partition, OffsetCommitValue(offset, epoch, meta, ts, -1)
