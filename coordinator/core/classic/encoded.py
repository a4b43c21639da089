"""A big classic group's two large encodings, built from parts each member keeps encoded.

The leader's JoinGroup answer lists every member's metadata and the GroupMetadata record lists
every member's subscription and assignment: for a group of thousands, encoding those member by
member is a long, single slice of the event loop on every rebalance (issue 31 item 4). A member's
part changes only when the member does (its protocols on a rejoin with new metadata, the group's
chosen protocol), so each member keeps its encoded part and the answer or record is the encoded
head plus the concatenated parts (plus, in the record, each member's current assignment).

A cached part is keyed by everything it is encoded from (a copy of the protocols and their
metadata, compared by value: a rejoin with the same subscription reuses it), so it can never be
stale; the tests compare the bytes with a fresh encode.
"""
from __future__ import annotations

import struct

from protocol import messages as M
from protocol._base import _ENCODE_FAILURES
from protocol.messages import GroupMetadataValue, JoinGroupResponse, JoinGroupResponseMember
from protocol.wire import uvarint_bytes

_I32 = struct.Struct(">i")

# the member encoder of a JoinGroupResponse version (the member struct changes at v5 and v6)
_JOIN_MEMBER_ENC = {v: (M._e_JoinGroupResponseMember_0 if v < 5 else
                        M._e_JoinGroupResponseMember_5 if v == 5 else M._e_JoinGroupResponseMember_6)
                    for v in range(JoinGroupResponse.MIN_VERSION, JoinGroupResponse.MAX_VERSION + 1)}
_FLEXIBLE = JoinGroupResponse.FLEXIBLE_VERSION


_uvarint = uvarint_bytes  # a length's unsigned varint (small ones precomputed there)


class LeaderJoinResponse(JoinGroupResponse):
    """A JoinGroupResponse whose members were encoded by :func:`join_members` (``parts``, one per
    entry of ``members``, for this ``version``): encoding copies them instead of encoding again.
    Anything that changed ``members`` after it was built is encoded the ordinary way."""

    __slots__ = ("parts", "parts_version", "parts_of")

    def encode_into(self, out: bytearray, version: int) -> None:
        members = self.members
        if (self.parts is None or version != self.parts_version or self.unknown_tagged_fields
                or members is not self.parts_of or len(members) != len(self.parts)):
            super().encode_into(out, version)
            return
        self.members = []
        try:
            super().encode_into(out, version)  # the head, an empty member array (and no tags)
        finally:
            self.members = members
        if version >= _FLEXIBLE:
            del out[len(out) - 2:]  # compact array length 0+1, empty tagged fields
            out += _uvarint(len(members) + 1)
            out += b"".join(self.parts)
            out += b"\x00"
        else:
            del out[len(out) - 4:]  # int32 array length 0
            out += _I32.pack(len(members))
            out += b"".join(self.parts)


def _join_entry(m, version: int, proto) -> tuple:
    """A member's JoinGroupResponse entry for ``version`` and the group's protocol ``proto``, cached
    as one flat tuple (few objects for the collector per member): what it encodes (version,
    protocol, member id, instance id, a copy of the protocols), the bytes, the protocols list it
    was checked against (a member's ``protocols`` is replaced on a rejoin, never changed in place,
    so the same object means the same protocols), and the entry itself (a JoinGroupResponseMember,
    shared by the leader's answers until the member changes: answers are encoded, never changed)."""
    iid = m.group_instance_id if version >= 5 else None
    plist = m.protocols
    c = m.join_enc
    if (c is not None and c[6] is plist and c[0] == version and c[1] == proto and c[2] == m.member_id
            and c[3] == iid):
        return c
    protocols = tuple(plist)
    if (c is None or c[0] != version or c[1] != proto or c[2] != m.member_id or c[3] != iid
            or c[4] != protocols):
        entry = JoinGroupResponseMember(m.member_id, iid, m.metadata(proto))
        buf = bytearray()
        _JOIN_MEMBER_ENC[version](entry, buf)
        c = m.join_enc = (version, proto, m.member_id, iid, protocols, bytes(buf), plist, entry)
    else:  # a rejoin with the same protocols: the same bytes, checked against the new list
        c = m.join_enc = c[:6] + (plist, c[7])
    return c


def _join_part(m, version: int, proto) -> bytes:
    return _join_entry(m, version, proto)[5]


def warm(m, version: int) -> None:
    """Encode a member's parts when it joins (a slice of its own JoinGroup), for its first protocol
    (the group's, unless the members vote otherwise) and its request's version (the leader's
    usually: one client library), so the join phase's end and the leader's SyncGroup reuse them."""
    if not m.protocols:
        return
    proto = m.protocols[0][0]
    try:
        _join_part(m, version, proto)
        record_member_head(m, proto)
    except _ENCODE_FAILURES:
        pass  # encoded (and refused) where it is used


def join_members(group, version: int) -> tuple[list[JoinGroupResponseMember], list[bytes] | None]:
    """The leader's member list and each entry's encoding for ``version``, from the members' caches
    (None for the encodings when one cannot be encoded: the answer is then encoded, and fails, as
    any other)."""
    proto = group.protocol_name
    v5 = version >= 5
    members, parts = [], []
    add_member, add_part = members.append, parts.append
    for m in group.members.values():
        c = m.join_enc
        if (c is None or c[6] is not m.protocols or c[0] != version or c[1] != proto or c[2] != m.member_id
                or c[3] != (m.group_instance_id if v5 else None)):
            try:
                c = _join_entry(m, version, proto)
            except _ENCODE_FAILURES:
                parts = add_part = None
                add_member(JoinGroupResponseMember(m.member_id, m.group_instance_id if v5 else None,
                                                   m.metadata(proto)))
                continue
        add_member(c[7])
        if add_part is not None:
            add_part(c[5])
    return members, parts


def leader_join_response(version: int, error: int, member_id: str, generation: int, protocol_type,
                         protocol_name, leader, group) -> JoinGroupResponse:
    """What :func:`coordinator.core.responses.join_response` builds for the leader, with the members'
    encoded parts attached."""
    members, parts = join_members(group, version)
    if version < 7:  # as join_response
        protocol_name = protocol_name or ""
        protocol_type = None
    r = LeaderJoinResponse(error_code=error, generation_id=generation, protocol_type=protocol_type,
                           protocol_name=protocol_name, leader=leader or "", skip_assignment=False,
                           member_id=member_id, members=members)
    r.parts, r.parts_version, r.parts_of = parts, version, members
    return r


_RECORD_VERSION = 3


def record_member_head(m, proto: str | None) -> bytes:
    """A member's GroupMetadataValue v3 entry up to (not including) its assignment, cached."""
    c = m.record_enc
    if (c is not None and c[0] == proto and c[1] == m.member_id and c[2] == m.group_instance_id
            and c[3] == m.client_id and c[4] == m.client_host and c[5] == m.rebalance_timeout_ms
            and c[6] == m.session_timeout_ms and (c[7] is m.protocols or c[7] == tuple(m.protocols))):
        return c[8]
    key = (proto, m.member_id, m.group_instance_id, m.client_id, m.client_host, m.rebalance_timeout_ms,
           m.session_timeout_ms, tuple(m.protocols))
    entry = M.GroupMetadataValueMemberMetadata(
        member_id=m.member_id, group_instance_id=m.group_instance_id, client_id=m.client_id,
        client_host=m.client_host, rebalance_timeout=m.rebalance_timeout_ms, session_timeout=m.session_timeout_ms,
        subscription=m.metadata(proto), assignment=b"")
    buf = bytearray()
    M._e_GroupMetadataValueMemberMetadata_3(entry, buf)
    head = bytes(buf[:-4])  # without the empty assignment's int32 length
    m.record_enc = key + (head,)  # one flat tuple: what it encodes, then the bytes
    return head


def record_member_parts(members, proto: str | None, assignment_of, parts: list) -> None:
    """Append to ``parts`` the GroupMetadataValue v3 entries of ``members`` with their assignments
    (each the cached head, the assignment's int32 length, the assignment), as one bytes: a big
    group's record, encoded in slices, is then a join of a few chunks rather than of three small
    objects per member scattered over the heap."""
    pack = _I32.pack
    chunk: list[bytes] = []
    add = chunk.append
    for m in members:
        add(record_member_head(m, proto))
        a = assignment_of(m)
        add(pack(len(a)))
        add(a)
    parts.append(b"".join(chunk))


def group_record_value(head: GroupMetadataValue, members, assignment_of, member_parts: list | None = None) -> bytes:
    """The GroupMetadata record's value (version prefix included) for ``head`` (members empty) and
    ``members`` (each with its ``assignment_of(member)`` bytes): what
    ``records.group_metadata_value`` gives for the same value with every member listed.
    ``member_parts``: the members' entries already encoded (record_member_parts, in slices)."""
    out = bytearray(struct.pack(">h", _RECORD_VERSION))
    GroupMetadataValue._ENC[_RECORD_VERSION](head, out)
    del out[len(out) - 4:]  # the empty member array's int32 length
    out += _I32.pack(len(members))
    if member_parts is None:
        member_parts = []
        record_member_parts(members, head.protocol, assignment_of, member_parts)
    return bytes(out) + b"".join(member_parts)
