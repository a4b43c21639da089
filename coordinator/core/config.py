"""The group core's settings: the few it reads, frozen, built by the daemon from its
:class:`coordinator.config.Config` (``Config.group_config()``), so the core imports neither the
daemon's settings nor what they import. Kafka's names in the comments."""
from __future__ import annotations

from dataclasses import dataclass, field

from coordinator.core.consumer import ConsumerGroupConfig

__all__ = ["GroupConfig"]


@dataclass(frozen=True, slots=True)
class GroupConfig:
    offsets_partitions: int = 50  # offsets.topic.num.partitions: the shards
    initial_rebalance_delay_ms: int = 3000  # group.initial.rebalance.delay.ms
    min_session_timeout_ms: int = 6000  # group.min.session.timeout.ms
    max_session_timeout_ms: int = 1800000  # group.max.session.timeout.ms
    group_max_size: int = 2147483647  # group.max.size
    offsets_retention_ms: int = 10080 * 60_000  # offsets.retention.minutes, in ms
    offsets_retention_check_interval_ms: int = 600000  # offsets.retention.check.interval.ms
    offset_metadata_max_bytes: int = 4096  # offset.metadata.max.bytes (counted in characters)
    rebalance_history_size: int = 20  # generations kept per group by the flight recorder
    # the group.consumer.* settings (session and heartbeat limits, max size, assignors)
    consumer: ConsumerGroupConfig = field(default_factory=ConsumerGroupConfig)
