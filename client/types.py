"""Small value types shared by the client modules."""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["TopicPartition", "OffsetAndMetadata", "EAGER", "COOPERATIVE"]

# Rebalance protocols (KIP-429).
EAGER = "eager"
COOPERATIVE = "cooperative"


class TopicPartition(NamedTuple):
    topic: str
    partition: int

    def __str__(self) -> str:
        return f"{self.topic}-{self.partition}"


class OffsetAndMetadata(NamedTuple):
    """A committed offset: the next offset to consume, its metadata string and leader epoch."""

    offset: int
    metadata: str = ""
    leader_epoch: int = -1
