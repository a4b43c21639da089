"""Kafka's consumer group protocol (KIP-848) for herd: the pure core, no I/O, no clock reads.

Module map
----------
``group``        the model: :class:`~coordinator.core.consumer.group.ConsumerGroup`, its members, the
                 group state table (Empty / Assigning / Reconciling / Stable / Dead) and the member
                 state table (STABLE / UNREVOKED_PARTITIONS / UNRELEASED_PARTITIONS / UNKNOWN),
                 checked on every transition; record application (the only way state changes).
``coordinator``  :class:`~coordinator.core.consumer.groups.ConsumerGroups`: the operations of one
                 shard's consumer groups (heartbeat, timers, replay, describe, delete, list, topic
                 changes), the reconciliation (``next_assignment``) and the OffsetCommit/OffsetFetch
                 member-epoch checks (``validate_offset_commit`` / ``validate_offset_fetch``).
``assignors``    ``uniform`` (sticky, balanced; the default) and ``range``: pure functions.
``records``      Kafka's consumer-group record types 3-8 as key/value bytes (generated codec).
``regex``        the ``SubscribedTopicRegex`` subset herd accepts (RE2-compatible, linear-time).

Calling convention (what the runtime plugs in; all times are integers in ms)
----------------------------------------------------------------------------
``groups = ConsumerGroups(config, topics, new_uuid=None, timers=None)``
    ``config``: :class:`ConsumerGroupConfig` (Kafka's ``group.consumer.*`` settings);
    ``topics``: anything with ``get(name) -> (topic_id: bytes16, partitions) | None`` and
    ``names()``; ``timers``: a :class:`coordinator.core.timers.Timers` to share with the classic
    groups (keys ``("cg-session", group, member)`` / ``("cg-rebalance", group, member)``).
``groups.replay(key, value)``
    apply one record of types 3-8 (``records.is_consumer_record(key)``); RecordError on damage.
``groups.on_loaded(now)``
    after replay: settle states, schedule session and rebalance timers.
``groups.heartbeat(request, version, now, wall, client_id, client_host) -> (records, response)``
    a ConsumerGroupHeartbeatRequest object; records are ``[(key, value | None)]`` already applied
    in memory; send the response only once the records are durable (no records: at once).
``groups.on_timers(now, wall, budget=None) -> records``, ``groups.next_deadline()``,
``groups.fire_timer(key, now, wall) -> records``
    fire due session / rebalance timeouts (fencing); when to call again; one key, for a runtime
    that shares one Timers with the classic groups (it must route keys whose key[0] is
    "cg-session" or "cg-rebalance" here: Shard.on_timers ignores kinds it does not know).
``groups.topics_changed(now, wall) -> records``
    after a topic is created, grown or deleted in the catalog (and once after start-up).
``groups.describe(group_ids, include_authorized_operations) -> [DescribedGroup]``
``groups.delete_group(group_id) -> (records, error)``, ``groups.list_groups(states) -> [(id, state)]``
``validate_offset_commit(group, member_id, member_epoch, version)`` /
``validate_offset_fetch(group, member_id, member_epoch)`` -> error code (``groups.groups.get(id)``).
"""
from coordinator.core.consumer.groups import (
    ConsumerGroupConfig,
    ConsumerGroups,
    StaticTopics,
    Topics,
    next_assignment,
    validate_offset_commit,
    validate_offset_fetch,
)

__all__ = ["ConsumerGroupConfig", "ConsumerGroups", "StaticTopics", "Topics", "next_assignment",
           "validate_offset_commit", "validate_offset_fetch"]
