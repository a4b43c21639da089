"""Committed offsets on one shard: OffsetCommit, OffsetFetch, OffsetDelete and retention
(KIP-211). :class:`Offsets` owns them (``committed``); the shard holds one beside its groups.
Offsets belong to a group of any type (or to none: a standalone consumer's "simple" group), so
they live apart from the group protocols and ask the groups what they need through the small
:class:`OffsetGroups` interface given at construction.

Offsets change only by replaying records: a deletion and an expiry make their records and apply
each through :meth:`Offsets.replay`, the code start-up runs for the same record; a commit applies
its records as replay does (:meth:`Offsets._place`, then the partition's entry: the group check
once per topic rather than once per partition), so memory always equals "log replayed". A
committed offset is kept as its record value bytes, as written (see :mod:`coordinator.core.records`).
"""
from __future__ import annotations

from typing import Protocol

import structlog

from coordinator.core import records
from coordinator.core.classic.group import DEAD, EMPTY
from coordinator.core.consumer.groups import OLDER_MEMBER_EPOCH
from coordinator.core.responses import commit_error
from coordinator.core.result import Result
from protocol import errors
from protocol.messages import (
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
    OffsetDeleteResponse,
    OffsetDeleteResponsePartition,
    OffsetDeleteResponseTopic,
)

__all__ = ["Offsets", "OffsetGroups"]

log = structlog.get_logger("herd.group")

_STR16_MAX = 32767  # bytes in a record string (int16 length)
_META_SAFE_CHARS = _STR16_MAX // 4  # this many characters always fit in UTF-8
_NONE = errors.NONE
# A partition's "committed" answer, shared by every OffsetCommit response (answers are only
# encoded, never changed): one object per partition index below this bound.
_COMMITTED = tuple(OffsetCommitResponsePartition(i, _NONE) for i in range(1024))


class OffsetGroups(Protocol):
    """What the offsets of a shard ask of its groups (classic and consumer alike)."""

    def known(self, group_id: str) -> bool:
        """A group of either type has this id (Dead ones included)."""

    def create_simple(self, group_id: str, state_wall_ms: int) -> None:
        """Make the "simple" group (no protocol type) that keeps offsets of an unknown group."""

    def exists(self, group_id: str) -> bool:
        """OffsetFetch answers the group's offsets (a live group of either type)."""

    def validate_commit(self, group_id: str, member_id: str, instance_id: str | None, generation: int,
                        version: int, now: int, wall: int) -> int:
        """An OffsetCommit's group check: the error code (NONE: commit)."""

    def commit_partition_check(self, group_id: str, member_id: str, member_epoch: int):
        """After validate_commit answered OLDER_MEMBER_EPOCH: ``(topic, partition) -> bool``, whether
        that partition's commit is accepted."""

    def delete_target(self, group_id: str):
        """OffsetDelete's view of the group, or None: ``state``, ``uses_consumer_protocol()``,
        ``is_subscribed_to_topic(topic)``."""


class Offsets:
    """One shard's committed offsets: ``committed`` is group id -> topic -> partition -> the
    offset's record value bytes (v3, or v1 with an explicit expiry); read with
    :func:`records.offset_value_fields` / :func:`records.offset_value_times`."""

    def __init__(self, shard_id: int, config, groups: OffsetGroups, count):
        self.shard_id = shard_id
        self.config = config
        self._groups = groups
        self._known = groups.known
        self._count = count
        self.committed: dict[str, dict[str, dict[int, bytes]]] = {}

    # ==== records: the one way offsets change ====================================================

    def replay(self, gid: str, topic: str, partition: int, value: bytes | None) -> None:
        """Store (or with None delete) one offset: ``value`` is its record value bytes, v3 or v1
        (the shard re-encodes any other version first). A commit stores its records the same way
        (:meth:`_place`, then the partition's entry)."""
        if value is None:
            topics = self.committed.get(gid)
            if topics is not None:
                parts = topics.get(topic)
                if parts is not None:
                    parts.pop(partition, None)
                    if not parts:
                        del topics[topic]
                if not topics:
                    del self.committed[gid]
            return
        self._place(gid, topic, value)[partition] = value

    def _place(self, gid: str, topic: str, value: bytes) -> dict[int, bytes]:
        """Where the offsets of ``topic`` committed by ``gid`` are kept (made empty if missing), for
        an offset record ``value`` about to go there: an offset of a group nobody knows makes its
        "simple" group (no protocol type: a standalone consumer), as Kafka's replay does. A
        commit asks once per topic; replay, once per record."""
        if not self._known(gid):
            self._groups.create_simple(gid, records.offset_value_times(value)[0])
        topics = self.committed.get(gid)
        if topics is None:
            topics = self.committed[gid] = {}
        parts = topics.get(topic)
        if parts is None:
            parts = topics[topic] = {}
        return parts

    def _delete(self, out: Result, gid: str, topic: str, partition: int) -> None:
        out.writes.append((self.shard_id, records.offset_commit_key(gid, topic, partition), None))
        self.replay(gid, topic, partition, None)

    def delete_group(self, gid: str, out: Result) -> int:
        """Tombstone every offset of ``gid`` (DeleteGroups); -> how many."""
        stored = self.committed.get(gid)
        n = 0
        if stored:
            for topic, parts in list(stored.items()):
                for p in list(parts):
                    self._delete(out, gid, topic, p)
                    n += 1
        return n

    def orphans(self) -> list[tuple[str, int]]:
        """``(group id, a commit timestamp)`` for each group with offsets whose group is gone (an
        Empty consumer group deleted by a classic JoinGroup that never completed), for start-up."""
        known = self._groups.known
        return [(gid, records.offset_value_times(next(iter(next(iter(topics.values())).values())))[0])
                for gid, topics in self.committed.items() if not known(gid)]

    # ==== offsets ================================================================================

    def offset_commit(self, req, version: int, token, now: int, wall: int, out: Result) -> None:
        gid = req.group_id
        err = self._groups.validate_commit(gid, req.member_id, req.group_instance_id if version >= 7 else None,
                                           req.generation_id_or_member_epoch, version, now, wall)
        partition_ok = None
        if err == OLDER_MEMBER_EPOCH:
            # a consumer-group member's older epoch: accepted per partition (Kafka 4.4)
            partition_ok = self._groups.commit_partition_check(gid, req.member_id, req.generation_id_or_member_epoch)
        elif err != _NONE:
            out.reply(token, commit_error(req, err))
            return
        expire = -1
        if 2 <= version <= 4 and req.retention_time_ms != -1:
            expire = wall + req.retention_time_ms
        max_meta = self.config.offset_metadata_max_bytes
        topics_out = []
        written = 0
        writes = out.writes
        sid = self.shard_id
        pack_partition = records.pack_partition
        value_bytes = records.offset_value
        v3_head = records.V3_HEAD.pack if expire == -1 else None
        v3 = records.OFFSET_COMMIT_VALUE_VERSION
        place = self._place
        committed = _COMMITTED
        n_committed = len(committed)
        tail = last_meta = last_ts = None
        for t in req.topics:
            parts_out = []
            prefix = stored = None
            name = t.name
            for p in t.partitions:
                if partition_ok is not None and not partition_ok(name, p.partition_index):
                    parts_out.append(OffsetCommitResponsePartition(p.partition_index, errors.STALE_MEMBER_EPOCH))
                    continue
                meta = p.committed_metadata
                if meta is None:
                    meta = ""
                # Kafka counts characters, not bytes; the record's string holds at most 32,767 bytes
                if len(meta) > max_meta or (len(meta) > _META_SAFE_CHARS and len(meta.encode()) > _STR16_MAX):
                    parts_out.append(OffsetCommitResponsePartition(p.partition_index,
                                                                   errors.OFFSET_METADATA_TOO_LARGE))
                    continue
                if prefix is None:
                    prefix = records.offset_key_prefix(gid, name)
                ts = p.commit_timestamp if (version == 1 and p.commit_timestamp != -1) else wall
                if meta is not last_meta or ts != last_ts:  # usually once per commit
                    last_meta, last_ts = meta, ts
                    tail = records.offset_value_tail(meta, ts, expire)
                idx = p.partition_index
                if v3_head is not None:  # records.offset_value's v3 record, inlined (the usual case)
                    raw = v3_head(v3, p.committed_offset, p.committed_leader_epoch if version >= 6 else -1) + tail
                else:  # a v1 record (explicit expiry) has no leader epoch
                    raw = value_bytes(p.committed_offset, -1, tail, expire)
                writes.append((sid, prefix + pack_partition(idx), raw))
                if stored is None:
                    stored = place(gid, name, raw)
                stored[idx] = raw  # the record applied as start-up applies it (Offsets.replay)
                parts_out.append(committed[idx] if 0 <= idx < n_committed else
                                 OffsetCommitResponsePartition(idx, _NONE))
                written += 1
            topics_out.append(OffsetCommitResponseTopic(name, parts_out))
        if written:
            self._count("offset_commits", written)
        out.reply(token, OffsetCommitResponse(topics=topics_out))

    def fetch_offsets(self, group_id: str, topics) -> list[tuple[str, list[tuple[int, int, int, str]]]]:
        """``[(topic, [(partition, offset, leader_epoch, metadata)])]``; ``topics`` is a list of
        ``(name, [partitions])`` or None for everything committed. Unknown → offset -1."""
        stored = self.committed.get(group_id) if self._groups.exists(group_id) else None
        fields = records.offset_value_fields
        if topics is None:
            if not stored:
                return []
            return [(topic, [(p, *fields(v)[:3]) for p, v in parts.items()]) for topic, parts in stored.items()]
        res = []
        for name, partitions in topics:
            parts = stored.get(name) if stored else None
            row = []
            for p in partitions:
                v = parts.get(p) if parts else None
                if v is None:
                    row.append((p, -1, -1, ""))
                else:
                    row.append((p, *fields(v)[:3]))
            res.append((name, row))
        return res

    def offset_delete(self, req, version: int, token, now: int, wall: int, out: Result) -> None:
        gid = req.group_id
        error = _NONE
        # a consumer group: Kafka's ConsumerGroup.validateOffsetDelete accepts any state; a topic
        # its members subscribe to is refused per partition
        group = self._groups.delete_target(gid) if gid else None
        if not gid:
            error = errors.INVALID_GROUP_ID
        elif group is None or group.state == DEAD:
            error = errors.GROUP_ID_NOT_FOUND
        elif group.state != EMPTY and not group.uses_consumer_protocol():
            error = errors.NON_EMPTY_GROUP
        if error != _NONE:
            out.reply(token, OffsetDeleteResponse(error_code=error))
            return
        stored = self.committed.get(gid)
        topics_out = []
        deleted = 0
        for t in req.topics:
            if group.is_subscribed_to_topic(t.name):
                parts = [OffsetDeleteResponsePartition(p.partition_index, errors.GROUP_SUBSCRIBED_TO_TOPIC)
                         for p in t.partitions]
            else:
                parts = []
                for p in t.partitions:
                    parts.append(OffsetDeleteResponsePartition(p.partition_index, _NONE))
                    tparts = stored.get(t.name) if stored else None
                    if tparts is not None and p.partition_index in tparts:
                        self._delete(out, gid, t.name, p.partition_index)
                        deleted += 1
                        stored = self.committed.get(gid)
            topics_out.append(OffsetDeleteResponseTopic(t.name, parts))
        if deleted:
            self._count("offsets_deleted", deleted)
            # an operator's action (Kafka logs these too): say what went, for the audit trail
            log.info("offsets_deleted", group_id=gid, offsets=deleted,
                     topics=sorted({t.name for t in req.topics if not group.is_subscribed_to_topic(t.name)}))
        out.reply(token, OffsetDeleteResponse(error_code=_NONE, topics=topics_out))

    # ==== retention (KIP-211) ====================================================================

    def expire(self, gid: str, is_subscribed, since_state: int | None, wall: int, out: Result) -> tuple[int, bool]:
        """Tombstone the expired offsets of group ``gid``: an offset with an explicit expiry at it,
        any other ``offsets_retention_ms`` after ``since_state`` (the group fell Empty) or, when
        that is None, after its commit; never one of a topic ``is_subscribed(topic)``. ->
        (offsets expired, whether the group has none left)."""
        stored = self.committed.get(gid)
        if not stored:
            return 0, True
        retention = self.config.offsets_retention_ms
        expired = 0
        all_gone = True
        for topic, parts in list(stored.items()):
            if is_subscribed(topic):
                all_gone = False
                continue
            for p, v in list(parts.items()):
                commit_ts, expire_ts = records.offset_value_times(v)
                if expire_ts != -1:
                    gone = wall >= expire_ts
                else:
                    since = since_state if since_state is not None else commit_ts
                    gone = wall - since >= retention
                if gone:
                    self._delete(out, gid, topic, p)
                    expired += 1
                else:
                    all_gone = False
        return expired, all_gone
