"""The embedded consumer protocol: the bytes inside JoinGroup/SyncGroup for protocol type
"consumer" (Kafka's ConsumerProtocol). Each blob is an int16 version followed by the struct at
that version; never flexible. A blob from a newer version is read with our newest schema (Kafka
only ever appends fields), as Kafka's ConsumerProtocol does.
"""
from __future__ import annotations

import struct

from protocol.messages import (
    ConsumerProtocolAssignment,
    ConsumerProtocolAssignmentTopicPartition,
    ConsumerProtocolSubscription,
    ConsumerProtocolSubscriptionTopicPartition,
)
from protocol.wire import ProtocolError

_I16 = struct.Struct(">h")
PROTOCOL_TYPE = "consumer"

__all__ = [
    "PROTOCOL_TYPE", "Subscription", "Assignment", "TopicPartitions", "SubscriptionTopicPartitions",
    "encode_subscription", "decode_subscription", "encode_assignment", "decode_assignment",
]

Subscription = ConsumerProtocolSubscription
Assignment = ConsumerProtocolAssignment
TopicPartitions = ConsumerProtocolAssignmentTopicPartition
SubscriptionTopicPartitions = ConsumerProtocolSubscriptionTopicPartition


def _decode(cls, data: bytes):
    if data is None or len(data) < 2:
        raise ProtocolError(f"{cls.NAME}: missing version")
    version, = _I16.unpack_from(data, 0)
    if version < 0:
        raise ProtocolError(f"{cls.NAME}: negative version {version}")
    use = min(version, cls.MAX_VERSION)
    obj = cls.decode(data, use, 2)
    return version, obj


def encode_subscription(sub: ConsumerProtocolSubscription, version: int = 3) -> bytes:
    return _I16.pack(version) + sub.encode(version)


def decode_subscription(data: bytes) -> tuple[int, ConsumerProtocolSubscription]:
    return _decode(ConsumerProtocolSubscription, data)


def encode_assignment(asg: ConsumerProtocolAssignment, version: int = 3) -> bytes:
    return _I16.pack(version) + asg.encode(version)


def decode_assignment(data: bytes) -> tuple[int, ConsumerProtocolAssignment]:
    """An empty blob is an empty assignment (Kafka sends empty bytes to members with nothing)."""
    if data is not None and len(data) == 0:
        return 0, ConsumerProtocolAssignment()
    return _decode(ConsumerProtocolAssignment, data)
