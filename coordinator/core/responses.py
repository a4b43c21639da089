"""Every response the core builds that is shaped by version or by an error, in one place.

* Version-shaped answers: :func:`join_response`, :func:`sync_response` (fields that do not exist
  at a version are left out, never sent as something a client could misread).
* Kafka's ``error_message`` for a code: :func:`kafka_error_message`.
* Whole-request errors, built from the request: :func:`error_response` (a shard that does not
  serve, a coordinator that is shutting down, a topic write that failed). For a request naming
  several groups the error goes on each group (:func:`described_group_error`,
  :func:`offset_fetch_group_error`, DeleteGroups results), as Kafka does.
* The same API's error answer built from an answer already made: :func:`as_error`, for replies
  whose writes failed (``Result.failure_replies``).

Pure: no I/O, no clock.
"""
from __future__ import annotations

from coordinator.core.versions import (
    CONSUMER_GROUP_DESCRIBE,
    CONSUMER_GROUP_HEARTBEAT,
    CREATE_TOPICS,
    DELETE_GROUPS,
    DESCRIBE_GROUPS,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    SYNC_GROUP,
)
from protocol import errors
from protocol import messages as m
from protocol.messages import (
    DeleteGroupsResponse,
    DeleteGroupsResponseDeletableGroupResult,
    DescribeGroupsResponse,
    DescribeGroupsResponseDescribedGroup,
    HeartbeatResponse,
    JoinGroupResponse,
    LeaveGroupResponse,
    ListGroupsResponse,
    OffsetCommitResponse,
    OffsetCommitResponsePartition,
    OffsetCommitResponseTopic,
    OffsetDeleteResponse,
    OffsetFetchResponse,
    OffsetFetchResponseGroup,
    OffsetFetchResponsePartition,
    OffsetFetchResponseTopic,
    SyncGroupResponse,
)

_NONE = errors.NONE

# ---- version-shaped answers ----------------------------------------------------------------------


def join_response(version: int, error: int, member_id: str, generation: int = -1,
                  protocol_type: str | None = None, protocol_name: str | None = None,
                  leader: str | None = None, members: list | None = None,
                  skip_assignment: bool = False) -> JoinGroupResponse:
    if version < 7:  # ProtocolName is non-nullable before v7; ProtocolType does not exist
        protocol_name = protocol_name or ""
        protocol_type = None
    return JoinGroupResponse(
        error_code=error, generation_id=generation, protocol_type=protocol_type,
        protocol_name=protocol_name, leader=leader or "", skip_assignment=skip_assignment and version >= 9,
        member_id=member_id, members=members if members is not None else [])


def sync_response(version: int, error: int, protocol_type: str | None = None,
                  protocol_name: str | None = None, assignment: bytes = b"") -> SyncGroupResponse:
    if version < 5 or error != _NONE:
        protocol_type = protocol_name = None
    return SyncGroupResponse(error_code=error, protocol_type=protocol_type, protocol_name=protocol_name,
                             assignment=assignment)


def kafka_error_message(code: int) -> str:
    """What Kafka's ``Errors.message()`` gives for ``code``: its exception's default message, and
    the name "NONE" for no error (the one code without an exception). Kafka puts it in the
    ``error_message`` of FindCoordinator v1-3 and of every whole-request error answer."""
    return "NONE" if code == _NONE else errors.ERRORS[code].message


# ---- whole-request errors, from the request ------------------------------------------------------


def commit_error(req, code: int) -> OffsetCommitResponse:
    """An OffsetCommit answered ``code`` on every partition (it has no top-level error)."""
    return OffsetCommitResponse(topics=[
        OffsetCommitResponseTopic(t.name, [OffsetCommitResponsePartition(p.partition_index, code)
                                           for p in t.partitions])
        for t in req.topics])


def offset_fetch_error(version: int, req, code: int) -> OffsetFetchResponse:
    """A single-group OffsetFetch (v0-7) answered ``code``. v0-1 have no top-level error field:
    every partition asked for carries it."""
    if version < 2:
        return OffsetFetchResponse(topics=[
            OffsetFetchResponseTopic(t.name, [OffsetFetchResponsePartition(p, -1, -1, "", code)
                                              for p in t.partition_indexes])
            for t in (req.topics or [])])
    return OffsetFetchResponse(topics=[], error_code=code)


def offset_fetch_group_error(group_id: str, code: int) -> OffsetFetchResponseGroup:
    """One group of a v8+ OffsetFetch answered ``code``."""
    return OffsetFetchResponseGroup(group_id, [], code)


def described_group_error(group_id: str, code: int) -> DescribeGroupsResponseDescribedGroup:
    """One group of a DescribeGroups answered ``code``."""
    return DescribeGroupsResponseDescribedGroup(error_code=code, group_id=group_id)


def consumer_described_group_error(group_id: str, code: int) -> m.ConsumerGroupDescribeResponseDescribedGroup:
    """One group of a ConsumerGroupDescribe answered ``code``."""
    return m.ConsumerGroupDescribeResponseDescribedGroup(error_code=code, group_id=group_id)


def error_response(api_key: int, version: int, request, code: int):
    """The response Kafka sends for ``request`` when the whole request fails with ``code``."""
    if api_key == JOIN_GROUP:
        return join_response(version, code, request.member_id)
    if api_key == SYNC_GROUP:
        return sync_response(version, code)
    if api_key == HEARTBEAT:
        return HeartbeatResponse(error_code=code)
    if api_key == LEAVE_GROUP:
        return LeaveGroupResponse(error_code=code)
    if api_key == OFFSET_COMMIT:
        return commit_error(request, code)
    if api_key == OFFSET_FETCH:
        if version >= 8:
            return OffsetFetchResponse(groups=[offset_fetch_group_error(g.group_id, code) for g in request.groups])
        return offset_fetch_error(version, request, code)
    if api_key == DESCRIBE_GROUPS:
        return DescribeGroupsResponse(groups=[described_group_error(g, code) for g in request.groups])
    if api_key == LIST_GROUPS:
        return ListGroupsResponse(error_code=code)
    if api_key == DELETE_GROUPS:
        return DeleteGroupsResponse(results=[DeleteGroupsResponseDeletableGroupResult(g, code)
                                             for g in request.groups_names])
    if api_key == OFFSET_DELETE:
        return OffsetDeleteResponse(error_code=code)
    if api_key == CONSUMER_GROUP_HEARTBEAT:
        return m.ConsumerGroupHeartbeatResponse(error_code=code)
    if api_key == CONSUMER_GROUP_DESCRIBE:
        return m.ConsumerGroupDescribeResponse(groups=[consumer_described_group_error(g, code)
                                                       for g in request.group_ids])
    if api_key == METADATA:  # no error code of its own: each topic named is not available
        return m.MetadataResponse(topics=[
            m.MetadataResponseTopic(error_code=errors.LEADER_NOT_AVAILABLE, name=t.name)
            for t in request.topics or []])
    if api_key == CREATE_TOPICS:
        return m.CreateTopicsResponse(topics=[
            m.CreateTopicsResponseCreatableTopicResult(name=t.name, error_code=code) for t in request.topics])
    raise ValueError(f"no error response for api key {api_key}")


# ---- errors from an answer already made ----------------------------------------------------------


def as_error(resp, code: int):
    """``resp`` replaced by the same API's answer with ``code`` (valid at every version): what is
    sent instead of an answer whose writes failed."""
    if isinstance(resp, JoinGroupResponse):
        return JoinGroupResponse(error_code=code, member_id=resp.member_id, protocol_name="")
    if isinstance(resp, SyncGroupResponse):
        return SyncGroupResponse(error_code=code)
    if isinstance(resp, HeartbeatResponse):
        return HeartbeatResponse(error_code=code)
    if isinstance(resp, LeaveGroupResponse):
        return LeaveGroupResponse(error_code=code)
    if isinstance(resp, OffsetCommitResponse):
        return OffsetCommitResponse(topics=[
            OffsetCommitResponseTopic(t.name, [OffsetCommitResponsePartition(p.partition_index, code)
                                               for p in t.partitions]) for t in resp.topics])
    if isinstance(resp, OffsetDeleteResponse):
        return OffsetDeleteResponse(error_code=code)
    if isinstance(resp, m.ConsumerGroupHeartbeatResponse):
        return m.ConsumerGroupHeartbeatResponse(error_code=code)
    if isinstance(resp, DeleteGroupsResponse):
        return DeleteGroupsResponse(results=[DeleteGroupsResponseDeletableGroupResult(r.group_id, code)
                                             for r in resp.results])
    # Read-only answers wait for the writes of their shards before them (Result.shards): they
    # describe state that never became durable, so they are refused too, never sent as they are.
    if isinstance(resp, OffsetFetchResponse):
        if resp.groups:  # v8+
            return OffsetFetchResponse(groups=[offset_fetch_group_error(g.group_id, code) for g in resp.groups])
        # v0-1 have no top-level error: the partitions carry it (as herd's own unavailable answer)
        return OffsetFetchResponse(error_code=code, topics=[
            OffsetFetchResponseTopic(t.name, [OffsetFetchResponsePartition(p.partition_index, -1, -1, "", code)
                                              for p in t.partitions]) for t in resp.topics])
    if isinstance(resp, DescribeGroupsResponse):
        return DescribeGroupsResponse(groups=[described_group_error(g.group_id, code) for g in resp.groups])
    if isinstance(resp, ListGroupsResponse):
        return ListGroupsResponse(error_code=code)
    if isinstance(resp, m.ConsumerGroupDescribeResponse):
        return m.ConsumerGroupDescribeResponse(groups=[consumer_described_group_error(g.group_id, code)
                                                       for g in resp.groups])
    as_error_of = getattr(resp, "as_error", None)  # the ACL APIs' answers (coordinator.core.auth.acls)
    if as_error_of is not None:
        return as_error_of(code)
    return resp
