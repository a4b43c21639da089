"""Committed offsets on one shard: OffsetCommit, OffsetFetch, OffsetDelete and retention
(KIP-211). A mixin of :class:`coordinator.shard.Shard`: offsets belong to a group of any type (or
to none: a standalone consumer's "simple" group), so they live apart from the group protocols.
A committed offset is kept as its record value bytes, as written (see :mod:`coordinator.records`).
"""
from __future__ import annotations

import structlog

from coordinator.core import records
from coordinator.core.classic.group import COMPLETING_REBALANCE, DEAD, EMPTY, PREPARING_REBALANCE, STABLE, Group
from coordinator.core.consumer import validate_offset_commit
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

__all__ = ["Offsets"]

log = structlog.get_logger("herd.group")

_STR16_MAX = 32767  # bytes in a record string (int16 length)
_META_SAFE_CHARS = _STR16_MAX // 4  # this many characters always fit in UTF-8
_NONE = errors.NONE
# A partition's "committed" answer, shared by every OffsetCommit response (answers are only
# encoded, never changed): one object per partition index below this bound.
_COMMITTED = tuple(OffsetCommitResponsePartition(i, _NONE) for i in range(1024))


class _SubscribedTopics:
    """What offset_delete asks of a group, for a consumer group."""

    def __init__(self, cgroup):
        self.state = cgroup.state
        self._topics = cgroup.subscribed_topic_names() | {
            name for name, (tid, _) in cgroup.subscription_metadata.items()}

    def uses_consumer_protocol(self) -> bool:
        return True

    def is_subscribed_to_topic(self, topic: str) -> bool:
        return topic in self._topics


class Offsets:
    """The offset handlers of :class:`~coordinator.shard.Shard` (a mixin)."""

    # ==== records (replay and writes apply offsets through these) ===============================

    def _apply_offset(self, gid: str, topic: str, partition: int, value: bytes | None) -> None:
        """Store (or with None delete) one offset: ``value`` is its record value bytes, v3 or v1
        (any other version is re-encoded by :meth:`_apply` first)."""
        if value is None:
            topics = self.offsets.get(gid)
            if topics is not None:
                parts = topics.get(topic)
                if parts is not None:
                    parts.pop(partition, None)
                    if not parts:
                        del topics[topic]
                if not topics:
                    del self.offsets[gid]
            return
        if gid not in self.groups and gid not in self.consumer.groups:
            # offsets committed by a standalone consumer: a "simple" group with no protocol type
            self.groups[gid] = Group(gid, state_wall_ms=records.offset_value_times(value)[0],
                                     history_size=self.config.rebalance_history_size)
        try:
            self.offsets[gid][topic][partition] = value
        except KeyError:  # the group's first offset of this topic
            self._offsets_of(gid, topic)[partition] = value

    def _delete_offset(self, out: Result, gid: str, topic: str, partition: int) -> None:
        out.writes.append((self.shard_id, records.offset_commit_key(gid, topic, partition), None))
        self._apply_offset(gid, topic, partition, None)

    # ==== offsets ================================================================================

    def offset_commit(self, req, version: int, token, now: int, wall: int, out: Result) -> None:
        gid = req.group_id
        gen = req.generation_id_or_member_epoch
        mid = req.member_id
        iid = req.group_instance_id if version >= 7 else None
        group = self.groups.get(gid)
        err = _NONE
        cgroup = self.consumer.groups.get(gid) if group is None else None
        if cgroup is not None:
            # a consumer group: member epochs (Kafka's ConsumerGroup.validateOffsetCommit)
            err = validate_offset_commit(cgroup, mid, gen, version)
            if err != _NONE:
                out.reply(token, commit_error(req, err))
                return
        elif group is None:
            if gen < 0:
                # a standalone consumer (or the admin client): a "simple" group, kept by its offsets
                group = Group(gid, state_wall_ms=wall, history_size=self.config.rebalance_history_size)
                self.groups[gid] = group
            else:
                err = errors.GROUP_ID_NOT_FOUND if version >= 9 else errors.ILLEGAL_GENERATION
        if err == _NONE and cgroup is None:
            err = self._validate_offset_commit(group, mid, iid, gen)
        if err != _NONE:
            out.reply(token, commit_error(req, err))
            return
        if cgroup is None and group.state in (STABLE, PREPARING_REBALANCE):
            member = group.members[mid]  # validated above
            self.timers.schedule(member.hb_key, now + member.session_timeout_ms)
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
        committed = _COMMITTED
        n_committed = len(committed)
        tail = last_meta = last_ts = None
        for t in req.topics:
            parts_out = []
            prefix = None
            stored = None
            for p in t.partitions:
                meta = p.committed_metadata
                if meta is None:
                    meta = ""
                # Kafka counts characters, not bytes; the record's string holds at most 32,767 bytes
                if len(meta) > max_meta or (len(meta) > _META_SAFE_CHARS and len(meta.encode()) > _STR16_MAX):
                    parts_out.append(OffsetCommitResponsePartition(p.partition_index,
                                                                   errors.OFFSET_METADATA_TOO_LARGE))
                    continue
                if prefix is None:
                    prefix = records.offset_key_prefix(gid, t.name)
                    stored = self._offsets_of(gid, t.name)
                ts = p.commit_timestamp if (version == 1 and p.commit_timestamp != -1) else wall
                if meta is not last_meta or ts != last_ts:  # usually once per commit
                    last_meta, last_ts = meta, ts
                    tail = records.offset_value_tail(meta, ts, expire)
                idx = p.partition_index
                # a v1 record (explicit expiry) has no leader epoch
                raw = value_bytes(p.committed_offset, p.committed_leader_epoch if version >= 6 else -1, tail,
                                  expire)
                writes.append((sid, prefix + pack_partition(idx), raw))
                stored[idx] = raw
                parts_out.append(committed[idx] if 0 <= idx < n_committed else
                                 OffsetCommitResponsePartition(idx, _NONE))
                written += 1
            topics_out.append(OffsetCommitResponseTopic(t.name, parts_out))
        if written:
            self._count("offset_commits", written)
        out.reply(token, OffsetCommitResponse(topics=topics_out))

    def _offsets_of(self, gid: str, topic: str) -> dict[int, bytes]:
        """The stored offsets of one topic of a group (created empty if missing)."""
        topics = self.offsets.get(gid)
        if topics is None:
            topics = self.offsets[gid] = {}
        parts = topics.get(topic)
        if parts is None:
            parts = topics[topic] = {}
        return parts

    @staticmethod
    def _validate_offset_commit(group: Group, member_id: str, instance_id: str | None,
                                generation: int) -> int:
        state = group.state
        if state == DEAD:
            return errors.COORDINATOR_NOT_AVAILABLE
        if generation < 0 and state == EMPTY:
            return _NONE  # a non-member committing into an Empty group (Spark jobs, admin tools)
        if generation >= 0 or member_id or instance_id is not None:
            err = group.validate_member(member_id, instance_id)
            if err != _NONE:
                return err
            if generation != group.generation:
                return errors.ILLEGAL_GENERATION
        elif state != EMPTY:
            return errors.UNKNOWN_MEMBER_ID
        if state == COMPLETING_REBALANCE:
            return errors.REBALANCE_IN_PROGRESS
        return _NONE

    def fetch_offsets(self, group_id: str, topics) -> list[tuple[str, list[tuple[int, int, int, str]]]]:
        """``[(topic, [(partition, offset, leader_epoch, metadata)])]``; ``topics`` is a list of
        ``(name, [partitions])`` or None for everything committed. Unknown → offset -1."""
        group = self.groups.get(group_id)
        exists = (group is not None and group.state != DEAD) or group_id in self.consumer.groups
        stored = self.offsets.get(group_id) if exists else None
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
        group = self.groups.get(gid) if gid else None
        if group is None and gid in self.consumer.groups:
            # a consumer group (Kafka's ConsumerGroup.validateOffsetDelete accepts any state; a
            # topic its members subscribe to is refused per partition)
            group = _SubscribedTopics(self.consumer.groups[gid])
        if not gid:
            error = errors.INVALID_GROUP_ID
        elif group is None or group.state == DEAD:
            error = errors.GROUP_ID_NOT_FOUND
        elif group.state != EMPTY and not group.uses_consumer_protocol():
            error = errors.NON_EMPTY_GROUP
        if error != _NONE:
            out.reply(token, OffsetDeleteResponse(error_code=error))
            return
        stored = self.offsets.get(gid)
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
                        self._delete_offset(out, gid, t.name, p.partition_index)
                        deleted += 1
                        stored = self.offsets.get(gid)
            topics_out.append(OffsetDeleteResponseTopic(t.name, parts))
        if deleted:
            self._count("offsets_deleted", deleted)
            # an operator's action (Kafka logs these too): say what went, for the audit trail
            log.info("offsets_deleted", group_id=gid, offsets=deleted,
                     topics=sorted({t.name for t in req.topics if not group.is_subscribed_to_topic(t.name)}))
        out.reply(token, OffsetDeleteResponse(error_code=_NONE, topics=topics_out))

    # ==== retention (KIP-211) ====================================================================

    def expire_offsets(self, wall: int, out: Result) -> int:
        """Tombstone expired offsets; delete Empty groups left with no offsets. Returns the number
        of offsets expired."""
        retention = self.config.offsets_retention_ms
        expired = groups_gone = 0
        for gid, group in list(self.groups.items()):
            all_gone = True
            stored = self.offsets.get(gid)
            if stored:
                base = group.offset_expiration_base()
                if base is None:
                    all_gone = False
                else:
                    state_ts = group.state_wall_ms if base == "state" else None
                    for topic, parts in list(stored.items()):
                        if group.is_subscribed_to_topic(topic):
                            all_gone = False
                            continue
                        for p, v in list(parts.items()):
                            commit_ts, expire_ts = records.offset_value_times(v)
                            if expire_ts != -1:
                                gone = wall >= expire_ts
                            else:
                                since = state_ts if state_ts is not None else commit_ts
                                gone = wall - since >= retention
                            if gone:
                                self._delete_offset(out, gid, topic, p)
                                expired += 1
                            else:
                                all_gone = False
            if all_gone and group.state == EMPTY and not group.pending_members:
                self._write_group_tombstone(out, gid)
                self._count("groups_expired")
                groups_gone += 1
        # consumer groups (Kafka's ConsumerGroup.offsetExpirationCondition): by commit time, never
        # a topic its members subscribe to; an Empty one left with no offsets is deleted
        for gid, cgroup in list(self.consumer.groups.items()):
            stored = self.offsets.get(gid)
            subscribed = _SubscribedTopics(cgroup)
            all_gone = True
            for topic, parts in list((stored or {}).items()):
                if subscribed.is_subscribed_to_topic(topic):
                    all_gone = False
                    continue
                for p, v in list(parts.items()):
                    commit_ts, expire_ts = records.offset_value_times(v)
                    if (wall >= expire_ts) if expire_ts != -1 else (wall - commit_ts >= retention):
                        self._delete_offset(out, gid, topic, p)
                        expired += 1
                    else:
                        all_gone = False
            if all_gone and not cgroup.members:
                recs, err = self.consumer.delete_group(gid)
                if err == _NONE:
                    self._consumer_writes(out, recs)
                    self.consumer_history.pop(gid, None)
                    self._count("groups_expired")
                    groups_gone += 1
        if expired:
            self._count("offsets_expired", expired)
        if expired or groups_gone:
            log.info("offsets_expired", shard=self.shard_id, offsets=expired, groups_removed=groups_gone)
        return expired
