"""Kafka's consumer-group (KIP-848) records, as key and value bytes of ``__consumer_offsets``.

A key is ``int16 record type`` + the key struct at the version equal to that type; a value is
``int16 version`` + the value struct (all version 0, flexible). ``None`` as a value is a tombstone.

====  ==========================================  =====================================================
type  key (group id, member id)                    value
====  ==========================================  =====================================================
3     ConsumerGroupMetadataKey (g)                  ConsumerGroupMetadataValue: the group epoch
4     ConsumerGroupPartitionMetadataKey (g)         ...PartitionMetadataValue: id, name and partition
                                                    count of every topic the group subscribes to
5     ConsumerGroupMemberMetadataKey (g, m)         ...MemberMetadataValue: subscription, instance id,
                                                    rack, client id/host, rebalance timeout, assignor
6     ConsumerGroupTargetAssignmentMetadataKey (g)  ...TargetAssignmentMetadataValue: assignment epoch
7     ConsumerGroupTargetAssignmentMemberKey (g,m)  ...TargetAssignmentMemberValue: one member's target
8     ConsumerGroupCurrentMemberAssignmentKey(g,m)  ...CurrentMemberAssignmentValue: member epoch,
                                                    previous epoch, state, assigned and pending-revocation
====  ==========================================  =====================================================

The encoders take plain Python values; :func:`decode` returns ``(type, group_id, member_id or
None, value object or None)`` and raises :class:`coordinator.core.records.RecordError` on damage, the
same error type the classic records use. Assignments are ``{topic_id (16 bytes): frozenset of
partitions}``; encoded in sorted order so the same state always gives the same bytes.
"""
from __future__ import annotations

import struct

from coordinator.core.records import RecordError
from protocol.messages import (
    ConsumerGroupCurrentMemberAssignmentKey,
    ConsumerGroupCurrentMemberAssignmentValue,
    ConsumerGroupCurrentMemberAssignmentValueTopicPartitions,
    ConsumerGroupMemberMetadataKey,
    ConsumerGroupMemberMetadataValue,
    ConsumerGroupMetadataKey,
    ConsumerGroupMetadataValue,
    ConsumerGroupPartitionMetadataKey,
    ConsumerGroupPartitionMetadataValue,
    ConsumerGroupPartitionMetadataValueTopicMetadata,
    ConsumerGroupTargetAssignmentMemberKey,
    ConsumerGroupTargetAssignmentMemberValue,
    ConsumerGroupTargetAssignmentMemberValueTopicPartition,
    ConsumerGroupTargetAssignmentMetadataKey,
    ConsumerGroupTargetAssignmentMetadataValue,
)
from protocol.wire import EncodeError, ProtocolError

__all__ = [
    "GROUP_EPOCH", "PARTITION_METADATA", "MEMBER_METADATA", "TARGET_METADATA", "TARGET_MEMBER",
    "CURRENT_ASSIGNMENT", "RECORD_TYPES", "is_consumer_record", "decode",
    "group_epoch_key", "group_epoch_value", "partition_metadata_key", "partition_metadata_value",
    "member_metadata_key", "member_metadata_value", "target_metadata_key", "target_metadata_value",
    "target_member_key", "target_member_value", "current_assignment_key", "current_assignment_value",
    "assignment_to_wire", "assignment_from_wire",
]

GROUP_EPOCH = 3
PARTITION_METADATA = 4
MEMBER_METADATA = 5
TARGET_METADATA = 6
TARGET_MEMBER = 7
CURRENT_ASSIGNMENT = 8

# record type -> (key class, value class, key has a member id)
RECORD_TYPES = {
    GROUP_EPOCH: (ConsumerGroupMetadataKey, ConsumerGroupMetadataValue, False),
    PARTITION_METADATA: (ConsumerGroupPartitionMetadataKey, ConsumerGroupPartitionMetadataValue, False),
    MEMBER_METADATA: (ConsumerGroupMemberMetadataKey, ConsumerGroupMemberMetadataValue, True),
    TARGET_METADATA: (ConsumerGroupTargetAssignmentMetadataKey, ConsumerGroupTargetAssignmentMetadataValue,
                      False),
    TARGET_MEMBER: (ConsumerGroupTargetAssignmentMemberKey, ConsumerGroupTargetAssignmentMemberValue, True),
    CURRENT_ASSIGNMENT: (ConsumerGroupCurrentMemberAssignmentKey, ConsumerGroupCurrentMemberAssignmentValue,
                         True),
}
VALUE_VERSION = 0
_I16 = struct.Struct(">h")


def is_consumer_record(key: bytes) -> bool:
    return len(key) >= 2 and _I16.unpack_from(key, 0)[0] in RECORD_TYPES


def _key(rtype: int, group_id: str, member_id: str | None = None) -> bytes:
    cls, _, has_member = RECORD_TYPES[rtype]
    obj = cls(group_id=group_id, member_id=member_id) if has_member else cls(group_id=group_id)
    try:
        return _I16.pack(rtype) + obj.encode(rtype)
    except EncodeError as exc:
        raise RecordError(str(exc)) from None


def _value(obj) -> bytes:
    try:
        return _I16.pack(VALUE_VERSION) + obj.encode(VALUE_VERSION)
    except EncodeError as exc:
        raise RecordError(str(exc)) from None


def assignment_to_wire(assignment: dict[bytes, frozenset[int]], cls) -> list:
    """``[cls(topic_id, sorted partitions)]`` sorted by topic id; empty topics are left out."""
    return [cls(topic_id=tid, partitions=sorted(parts)) for tid, parts in sorted(assignment.items()) if parts]


def assignment_from_wire(items) -> dict[bytes, frozenset[int]]:
    out: dict[bytes, frozenset[int]] = {}
    for tp in items or ():
        if tp.partitions:
            out[tp.topic_id] = out.get(tp.topic_id, frozenset()) | frozenset(tp.partitions)
    return out


# ---- keys and values --------------------------------------------------------------------------

def group_epoch_key(group_id: str) -> bytes:
    return _key(GROUP_EPOCH, group_id)


def group_epoch_value(epoch: int) -> bytes:
    return _value(ConsumerGroupMetadataValue(epoch=epoch))


def partition_metadata_key(group_id: str) -> bytes:
    return _key(PARTITION_METADATA, group_id)


def partition_metadata_value(metadata: dict[str, tuple[bytes, int]]) -> bytes:
    """``metadata``: topic name -> (topic id, partition count)."""
    return _value(ConsumerGroupPartitionMetadataValue(topics=[
        ConsumerGroupPartitionMetadataValueTopicMetadata(topic_id=tid, topic_name=name, num_partitions=n,
                                                         partition_metadata=[])
        for name, (tid, n) in sorted(metadata.items())]))


def member_metadata_key(group_id: str, member_id: str) -> bytes:
    return _key(MEMBER_METADATA, group_id, member_id)


def member_metadata_value(member) -> bytes:
    """From a :class:`coordinator.core.consumer.group.Member` (its subscription fields)."""
    return _value(ConsumerGroupMemberMetadataValue(
        instance_id=member.instance_id, rack_id=member.rack_id, client_id=member.client_id,
        client_host=member.client_host, subscribed_topic_names=list(member.subscribed_topic_names),
        subscribed_topic_regex=member.subscribed_topic_regex, rebalance_timeout_ms=member.rebalance_timeout_ms,
        server_assignor=member.server_assignor))


def target_metadata_key(group_id: str) -> bytes:
    return _key(TARGET_METADATA, group_id)


def target_metadata_value(assignment_epoch: int) -> bytes:
    return _value(ConsumerGroupTargetAssignmentMetadataValue(assignment_epoch=assignment_epoch))


def target_member_key(group_id: str, member_id: str) -> bytes:
    return _key(TARGET_MEMBER, group_id, member_id)


def target_member_value(assignment: dict[bytes, frozenset[int]]) -> bytes:
    return _value(ConsumerGroupTargetAssignmentMemberValue(topic_partitions=assignment_to_wire(
        assignment, ConsumerGroupTargetAssignmentMemberValueTopicPartition)))


def current_assignment_key(group_id: str, member_id: str) -> bytes:
    return _key(CURRENT_ASSIGNMENT, group_id, member_id)


def current_assignment_value(member_epoch: int, previous_member_epoch: int, state: int,
                             assigned: dict[bytes, frozenset[int]],
                             pending_revocation: dict[bytes, frozenset[int]]) -> bytes:
    tp = ConsumerGroupCurrentMemberAssignmentValueTopicPartitions
    return _value(ConsumerGroupCurrentMemberAssignmentValue(
        member_epoch=member_epoch, previous_member_epoch=previous_member_epoch, state=state,
        assigned_partitions=assignment_to_wire(assigned, tp),
        partitions_pending_revocation=assignment_to_wire(pending_revocation, tp)))


# ---- decoding ---------------------------------------------------------------------------------

def decode(key: bytes, value: bytes | None):
    """``(record type, group id, member id or None, value object or None)``; RecordError when the
    key is not a consumer-group record or either side is damaged. A value written by a newer
    version is read with version 0's schema (later versions only add tagged fields)."""
    if key is None or len(key) < 2:
        raise RecordError("record key: too short for a type")
    (rtype,) = _I16.unpack_from(key, 0)
    spec = RECORD_TYPES.get(rtype)
    if spec is None:
        raise RecordError(f"record type {rtype} is not a consumer-group record")
    kcls, vcls, has_member = spec
    try:
        k = kcls.decode(key, rtype, 2)
    except ProtocolError as exc:
        raise RecordError(f"{kcls.NAME}: {exc}") from None
    member_id = k.member_id if has_member else None
    if value is None:
        return rtype, k.group_id, member_id, None
    if len(value) < 2:
        raise RecordError(f"{vcls.NAME}: too short for a version")
    (version,) = _I16.unpack_from(value, 0)
    if version < 0:
        raise RecordError(f"{vcls.NAME}: negative version {version}")
    try:
        v = vcls.decode(value, min(version, vcls.MAX_VERSION), 2)
    except ProtocolError as exc:
        raise RecordError(f"{vcls.NAME} v{version}: {exc}") from None
    return rtype, k.group_id, member_id, v
