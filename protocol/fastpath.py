"""Byte-level reading and writing for the edge's fast paths, next to the codec they shortcut.

The daemon answers its two most frequent requests without building request or response objects:

* Heartbeat: the answer's bytes after the correlation id depend only on (version, error code):
  :func:`heartbeat_tail`, cached.
* a DescribeGroups or ConsumerGroupDescribe answer of many groups can be encoded a part at a time
  (:func:`list_answer_frame` around the parts of :func:`encode_list_entries`), so that the edge
  spreads a big one over several loop turns.
* a steady-state ConsumerGroupHeartbeat (KIP-848: a member that changes nothing): the request is
  recognised from its bytes (:func:`parse_steady_consumer_heartbeat`) and the answer written from
  the request's own group-id bytes (:func:`steady_consumer_heartbeat_answer`).

and reads an OffsetCommit request of the flexible versions in one function
(:func:`decode_offset_commit_request`: the generated classes, built without a call per
partition) and encodes its answer (a partition is six bytes, seven when flexible) without the
generic per-object encoder (:func:`encode_offset_commit_response`).

Everything here is checked byte for byte against the generated classes of ``protocol.messages``
(tests/protocol/test_fastpath.py). Pure: no I/O.
"""
from __future__ import annotations

import struct

from protocol import messages as m
from protocol.headers import response_header_version
from protocol.wire import ProtocolError, read_uvarint, uvarint_bytes

__all__ = ["FRAME_HEAD", "header_tails", "heartbeat_tail", "encode_heartbeat_body",
           "parse_steady_consumer_heartbeat", "steady_consumer_heartbeat_answer", "encode_offset_commit_response",
           "decode_offset_commit_request", "list_answer_frame", "encode_list_entries"]

FRAME_HEAD = struct.Struct(">ii")  # frame size, correlation id
_II = struct.Struct(">ii")
_I32 = struct.Struct(">i")

HEARTBEAT = m.HeartbeatRequest.API_KEY
_HeartbeatResponse = m.HeartbeatResponse


def header_tails(supported: dict[int, tuple[int, int]]) -> dict[int, tuple[bytes, ...]]:
    """api key -> by version, what follows the correlation id in a response header: the empty
    tagged fields of header v1 (flexible versions), or nothing (v0; always for ApiVersions)."""
    return {key: tuple(b"\x00" if response_header_version(key, v) else b"" for v in range(hi + 1))
            for key, (_, hi) in supported.items()}


_heartbeat_bodies: dict[tuple[int, int], bytes] = {}  # (version, error code) -> encoded body
_heartbeat_tails: dict[tuple[int, int], bytes] = {}  # (version, code) -> header tail + body


def encode_heartbeat_body(version: int, code: int) -> bytes:
    """A plain HeartbeatResponse body (no throttle, no tagged fields) of this version and code."""
    body = _heartbeat_bodies.get((version, code))
    if body is None:
        body = _heartbeat_bodies[(version, code)] = _HeartbeatResponse(error_code=code).encode(version)
    return body


def heartbeat_tail(version: int, code: int) -> bytes:
    """What follows the correlation id in a plain HeartbeatResponse of this version and code."""
    tail = _heartbeat_tails.get((version, code))
    if tail is None:
        header = b"\x00" if response_header_version(HEARTBEAT, version) else b""
        tail = _heartbeat_tails[(version, code)] = header + encode_heartbeat_body(version, code)
    return tail


# A steady-state ConsumerGroupHeartbeat's bytes after its member epoch: instance id, rack id null,
# rebalance timeout -1, subscribed topic names, (v1+) regex, server assignor, topic partitions
# null, no tagged fields. By version.
_CG_STEADY_TAIL = (b"\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00", b"\x00\x00\xff\xff\xff\xff\x00\x00\x00\x00\x00")
_CG_OK_HEAD = b"\x00" + b"\x00" * 6 + b"\x00"  # header tags; throttle 0, error 0, error message null
_CG_OK_END = b"\xff\x00"  # assignment null, no tagged fields


def parse_steady_consumer_heartbeat(frame: bytes, pos: int, version: int):
    """A ConsumerGroupHeartbeat body at ``frame[pos:]`` that is exactly a group id and a member id
    (compact strings of 1-126 bytes), an epoch > 0 and every other field null: ``(group_id,
    member_id, epoch, member_span)``, ``member_span`` the (start, end) of the member id's encoded
    bytes (its length and characters) that the answer repeats; None for anything else (the full decoder then says
    what it is)."""
    try:
        n = frame[pos] - 1
        if not 0 < n < 127:
            return None
        g_end = pos + 1 + n
        n = frame[g_end] - 1
        if not 0 < n < 127:
            return None
        m_end = g_end + 1 + n
        epoch = _I32.unpack_from(frame, m_end)[0]
        if epoch <= 0 or frame[m_end + 4:] != _CG_STEADY_TAIL[version]:
            return None
        group_id = frame[pos + 1:g_end].decode()
        member_id = frame[g_end + 1:m_end].decode()
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return group_id, member_id, epoch, (g_end, m_end)


def steady_consumer_heartbeat_answer(frame: bytes, member_span: tuple[int, int], epoch: int,
                                     interval_ms: int) -> bytes:
    """The answer to a steady ConsumerGroupHeartbeat after the correlation id (header tagged
    fields, then the body): no error, the member id as the request encoded it, its epoch, the
    heartbeat interval, no assignment. The same bytes at v0 and v1."""
    start, end = member_span
    return b"".join((_CG_OK_HEAD, frame[start:end], _II.pack(epoch, interval_ms), _CG_OK_END))


# ---- OffsetCommit's answer ----------------------------------------------------------------------

_I16 = struct.Struct(">h")
_PART = struct.Struct(">ih").pack  # partition index, error code
_PART_FLEX = struct.Struct(">ihB").pack  # the same, then no tagged fields
_OffsetCommitResponse = m.OffsetCommitResponse
_FLEXIBLE = m.OffsetCommitResponse.FLEXIBLE_VERSION


_uvarint = uvarint_bytes  # a length's unsigned varint (small ones precomputed there)


_UV = tuple(_uvarint(n) for n in range(128))


def encode_offset_commit_response(response, version: int) -> bytes | None:
    """The body of ``response`` (an OffsetCommitResponse) at ``version``, as its generated
    ``encode`` writes it; None when it carries anything but what herd sends (unknown tagged
    fields, a null or over-long name, a field out of range): the generated encoder then writes or
    refuses it."""
    if response.unknown_tagged_fields:
        return None
    topics = response.topics
    if topics is None:
        return None
    parts_out = []
    add = parts_out.append
    try:
        if version >= 3:
            add(_I32.pack(response.throttle_time_ms))
        if version >= _FLEXIBLE:
            n = len(topics) + 1
            add(_UV[n] if n < 128 else _uvarint(n))
            for t in topics:
                name, partitions = t.name, t.partitions
                if t.unknown_tagged_fields or name is None or partitions is None:
                    return None
                b = name.encode()
                if len(b) > 0x7FFF:
                    return None
                n = len(b) + 1
                add(_UV[n] if n < 128 else _uvarint(n))
                add(b)
                n = len(partitions) + 1
                add(_UV[n] if n < 128 else _uvarint(n))
                for p in partitions:
                    if p.unknown_tagged_fields:
                        return None
                    add(_PART_FLEX(p.partition_index, p.error_code, 0))
                add(b"\x00")
            add(b"\x00")
        else:
            add(_I32.pack(len(topics)))
            for t in topics:
                name, partitions = t.name, t.partitions
                if name is None or partitions is None:
                    return None
                b = name.encode()
                add(_I16.pack(len(b)))
                add(b)
                add(_I32.pack(len(partitions)))
                for p in partitions:
                    add(_PART(p.partition_index, p.error_code))
    except (struct.error, UnicodeEncodeError, TypeError, AttributeError):
        return None
    return b"".join(parts_out)


# ---- OffsetCommit's request (flexible versions) ----------------------------------------------------

_PART_HEAD = struct.Struct(">iqi").unpack_from  # partition index, offset, leader epoch
_OffsetCommitRequest = m.OffsetCommitRequest
_OCPartition = m.OffsetCommitRequestPartition
_OCTopic = m.OffsetCommitRequestTopic
_COMMIT_VERSIONS = (8, 9)  # the flexible ones; a new version is added here once its layout is checked


def _group_generation_member(frame: bytes, pos: int):
    """A request body's opening group id (compact string), int32 generation and member id (compact
    string), each string shorter than 127 bytes: ``(group_id, generation, member_id, next pos)``,
    or None for another shape. Raises what slicing and decoding raise for a cut frame."""
    n = frame[pos] - 1
    if not 0 <= n < 127:
        return None
    end = pos + 1 + n
    group_id = frame[pos + 1:end].decode()
    generation = _I32.unpack_from(frame, end)[0]
    pos = end + 4
    n = frame[pos] - 1
    if not 0 <= n < 127:
        return None
    end = pos + 1 + n
    return group_id, generation, frame[pos + 1:end].decode(), end


def decode_offset_commit_request(frame: bytes, pos: int, version: int):
    """The OffsetCommitRequest (v8+) whose body is ``frame[pos:]`` to its end, equal to what the
    generated ``decode_from`` builds, when it has the usual shape: every string and array shorter
    than 127 (one length byte), no tagged field anywhere; None for anything else, malformed or
    not: the generated decoder then reads it or says what is wrong."""
    if version not in _COMMIT_VERSIONS:
        return None
    try:
        found = _group_generation_member(frame, pos)
        if found is None:
            return None
        group_id, generation, member_id, pos = found
        n = frame[pos] - 1
        if n < 0:
            instance_id = None
            pos += 1
        elif n < 127:
            end = pos + 1 + n
            instance_id = frame[pos + 1:end].decode()
            pos = end
        else:
            return None
        n_topics = frame[pos] - 1
        if not 0 <= n_topics < 127:
            return None
        pos += 1
        topics = []
        for _ in range(n_topics):
            n = frame[pos] - 1
            if not 0 <= n < 127:
                return None
            end = pos + 1 + n
            name = frame[pos + 1:end].decode()
            pos = end
            n_parts = frame[pos] - 1
            if not 0 <= n_parts < 127:
                return None
            pos += 1
            partitions = []
            add = partitions.append
            for _ in range(n_parts):
                index, offset, epoch = _PART_HEAD(frame, pos)
                n = frame[pos + 16] - 1
                if n < 0:
                    metadata = None
                    pos += 17
                elif n < 127:
                    end = pos + 17 + n
                    metadata = frame[pos + 17:end].decode()
                    pos = end
                else:
                    return None
                if frame[pos]:  # tagged fields
                    return None
                pos += 1
                add(_OCPartition(index, offset, epoch, -1, metadata))
            if frame[pos]:
                return None
            pos += 1
            topics.append(_OCTopic(name, partitions))
        if frame[pos] or pos + 1 != len(frame):
            return None
    except (IndexError, struct.error, UnicodeDecodeError):
        return None
    return _OffsetCommitRequest(group_id, generation, member_id, instance_id, -1, topics)


# ---- SyncGroup's request (flexible versions): the leader's carries one assignment per member -------

_SyncGroupRequest = m.SyncGroupRequest
_SGAssignment = m.SyncGroupRequestAssignment
_SYNC_VERSIONS = (4, 5)  # the flexible ones; a new version is added here once its layout is checked
_read_uvarint = read_uvarint


def decode_sync_group_request(frame: bytes, pos: int, version: int):
    """The SyncGroupRequest (v4, v5) whose body is ``frame[pos:]`` to its end, equal to what the
    generated ``decode_from`` builds, when it has the usual shape: strings shorter than 127 (one
    length byte), no tagged field anywhere (lengths of the assignment array and of each assignment
    may take several bytes: a big group's leader sends thousands); None for anything else,
    malformed or not: the generated decoder then reads it or says what is wrong."""
    if version not in _SYNC_VERSIONS:
        return None
    try:
        found = _group_generation_member(frame, pos)
        if found is None:
            return None
        group_id, generation, member_id, pos = found
        nullable = [None, None, None]  # group instance id, then (v5) protocol type and name
        for k in range(3 if version >= 5 else 1):
            n = frame[pos] - 1
            if n < 0:
                pos += 1
            elif n < 127:
                end = pos + 1 + n
                nullable[k] = frame[pos + 1:end].decode()
                pos = end
            else:
                return None
        count, pos = _read_uvarint(frame, pos)
        count -= 1
        if count < 0:
            return None  # null: not a valid SyncGroup (the generated decoder says so)
        assignments = []
        add = assignments.append
        size = len(frame)
        for _ in range(count):
            n = frame[pos] - 1
            if not 0 <= n < 127:
                return None
            end = pos + 1 + n
            mid = frame[pos + 1:end].decode()
            pos = end
            n = frame[pos]
            if n < 128:
                pos += 1
            else:
                n, pos = _read_uvarint(frame, pos)
            n -= 1
            end = pos + n
            if n < 0 or end > size:
                return None
            data = frame[pos:end]
            if frame[end]:  # tagged fields
                return None
            pos = end + 1
            add(_SGAssignment(mid, data))
        if frame[pos] or pos + 1 != size:
            return None
    except (IndexError, struct.error, UnicodeDecodeError, ProtocolError):
        return None
    return _SyncGroupRequest(group_id, generation, member_id, nullable[0], nullable[1], nullable[2], assignments)


# ---- ConsumerGroupHeartbeat: a member's steady heartbeat, or rebalance work? -------------------------


def consumer_heartbeat_epoch(frame: bytes) -> tuple[int, int] | None:
    """``(member epoch, end of the epoch)`` of the ConsumerGroupHeartbeat request ``frame`` (from
    its API key on: header v2, then group id, member id, member epoch), or None when it does not
    have the usual shape (strings under 127 bytes, no header tags) or is cut short: the caller then
    treats it as any other request."""
    try:
        n = _I16.unpack_from(frame, 8)[0]  # the header's client id (a legacy int16-length string)
        pos = 10 + max(n, 0)
        if frame[pos]:  # header tagged fields
            return None
        pos += 1
        for _ in range(2):  # group id, member id (compact strings)
            n = frame[pos] - 1
            if not 0 <= n < 127:
                return None
            pos += 1 + n
        return _I32.unpack_from(frame, pos)[0], pos + 4
    except (IndexError, struct.error):
        return None


def consumer_heartbeat_is_rebalance_work(frame: bytes) -> bool:
    """Is the ConsumerGroupHeartbeat request ``frame`` (from its API key on) a join or a leave
    (member epoch 0 or below), or a member reporting something (its owned partitions, a new
    subscription: any field after the epoch not null), rather than a member's steady heartbeat?
    False when it cannot tell (an unusual shape): such a request is served as any other."""
    found = consumer_heartbeat_epoch(frame)
    if found is None:
        return False
    epoch, end = found
    if epoch <= 0:
        return True
    version = (frame[2] << 8) | frame[3]
    return version >= len(_CG_STEADY_TAIL) or frame[end:] != _CG_STEADY_TAIL[version]


def list_answer_frame(cls, count: int, version: int, throttle_time_ms: int = 0) -> tuple[bytes, bytes]:
    """(head, tail) of an answer of ``cls`` whose one list, ``groups``, is its last field after
    fixed-size ones (DescribeGroupsResponse, ConsumerGroupDescribeResponse), with ``count`` entries
    and no tagged fields: the encoded answer is ``head``, then the parts of
    :func:`encode_list_entries` for its entries in order, then ``tail``."""
    empty = cls(throttle_time_ms=throttle_time_ms, groups=[]).encode(version)
    if version >= cls.FLEXIBLE_VERSION:  # ... uvarint(0 + 1), no tagged fields
        return empty[:-2] + uvarint_bytes(count + 1), empty[-1:]
    return empty[:-4] + _I32.pack(count), b""


def encode_list_entries(cls, entries: list, version: int) -> bytes:
    """The bytes ``entries`` take inside an answer of ``cls`` (see :func:`list_answer_frame`): the
    generic encoder's, without the answer's own fields around them."""
    out = cls(groups=entries).encode(version)
    flexible = version >= cls.FLEXIBLE_VERSION
    pos = len(cls(groups=[]).encode(version)) - (2 if flexible else 4)  # the fixed-size fields before the list
    if flexible:
        _, pos = read_uvarint(out, pos)
        return out[pos:-1]  # and the answer's empty tagged fields
    return out[pos + 4:]
