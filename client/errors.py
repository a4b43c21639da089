"""Exceptions raised by the client, mapped from Kafka error codes.

Every exception is a :class:`KafkaError`. Those that come from a Kafka error code carry it in
``.code`` (and its name in ``.name``); ``.retriable`` says whether Kafka marks the code retriable, or,
for the client's own errors, whether Kafka's Java equivalent is a ``RetriableException``
(``KafkaTimeoutError``: ``TimeoutException``; ``KafkaConnectionError``: ``DisconnectException``;
``RetriableCommitFailedError``: ``RetriableCommitFailedException``): trying again may succeed.
:func:`error_for_code` builds the exception for a code: a named class below when the client treats
that code specially, otherwise a generic :class:`KafkaError` carrying the code.

What the consumer raises, and when:

- :class:`CommitFailedError` -- a commit cannot succeed because the member is no longer in the
  generation it committed for (``UNKNOWN_MEMBER_ID`` / ``ILLEGAL_GENERATION``, or not in a group).
  Poll, let the rebalance finish, and process again from the committed offsets.
- :class:`RebalanceInProgressError` -- a commit while the group is rebalancing
  (``REBALANCE_IN_PROGRESS``). Poll to complete the rebalance, then commit again.
- :class:`FencedInstanceIdError` -- another process joined with the same ``group.instance.id``.
  Fatal: this consumer can only be closed.
- :class:`KafkaTimeoutError` -- a blocking call did not complete within its timeout.
- :class:`NoBrokersAvailableError` (a ``KafkaTimeoutError``) -- raised by ``poll`` of a member that
  is not in a stable group when no coordinator has been reached for ``broker.unreachable.timeout.ms``
  (default 30 s) and connection attempts fail; every failed attempt is logged at WARNING first,
  naming the address and the error. Not fatal: the consumer keeps reconnecting, so a loop that
  catches it rides through a broker restart.
- :class:`IllegalStateError` -- the call does not make sense now (closed consumer, seek on a
  partition that is not assigned, ...).
- Errors of a JoinGroup or SyncGroup that the group may outgrow (``GroupMaxSizeReachedError``,
  ``InconsistentGroupProtocolError``, ``InvalidSessionTimeoutError``, ``UnreleasedInstanceIdError``,
  and codes the client does not expect): raised once by ``poll``, as Kafka's poll raises them; the
  member joins again after a backoff.
- Fatal group errors (raised by ``poll`` and every later call): ``FencedInstanceIdError``,
  ``GroupAuthorizationError``, ``InvalidGroupIdError``, ``UnsupportedVersionError``.
- :class:`AuthenticationFailedError` -- the broker refused the SASL credentials (its message says
  why), or (:class:`SslAuthenticationError`) a TLS handshake failed for good: the broker's
  certificate did not verify, or the broker refused ours. Fatal like the group errors: the consumer
  does not reconnect, ``poll`` and every later call raise it.
"""

from __future__ import annotations

from protocol import errors as codes

__all__ = [
    "KafkaError",
    "KafkaTimeoutError",
    "NoBrokersAvailableError",
    "KafkaConnectionError",
    "IllegalStateError",
    "ProtocolMismatchError",
    "CommitFailedError",
    "RetriableCommitFailedError",
    "RebalanceInProgressError",
    "FencedInstanceIdError",
    "UnknownMemberIdError",
    "IllegalGenerationError",
    "MemberIdRequiredError",
    "CoordinatorNotAvailableError",
    "NotCoordinatorError",
    "CoordinatorLoadInProgressError",
    "GroupAuthorizationError",
    "TopicAuthorizationError",
    "InconsistentGroupProtocolError",
    "InvalidSessionTimeoutError",
    "InvalidGroupIdError",
    "GroupMaxSizeReachedError",
    "UnreleasedInstanceIdError",
    "UnsupportedVersionError",
    "OffsetMetadataTooLargeError",
    "InvalidCommitOffsetSizeError",
    "UnknownTopicOrPartitionError",
    "UnstableOffsetCommitError",
    "RequestTimedOutError",
    "AuthenticationFailedError",
    "SslAuthenticationError",
    "error_for_code",
]


class KafkaError(Exception):
    """Base of every client exception. ``code`` is the Kafka error code, or None."""

    code: int | None = None
    always_retriable = False  # True: retriable whatever the code (Kafka's RetriableException)

    def __init__(self, message: str | None = None, *, code: int | None = None):
        if code is not None:
            self.code = code
        if message is None:
            message = self.default_message()
        super().__init__(message)

    @property
    def name(self) -> str | None:
        return None if self.code is None else codes.error_name(self.code)

    @property
    def retriable(self) -> bool:
        return self.always_retriable or (self.code is not None and codes.is_retriable(self.code))

    def default_message(self) -> str:
        if self.code is None:
            return type(self).__name__
        info = codes.ERRORS.get(self.code)
        text = info.message if info else ""
        return f"{codes.error_name(self.code)} ({self.code}): {text}".rstrip(": ")


class KafkaTimeoutError(KafkaError):
    """A blocking call did not complete in time."""

    always_retriable = True


class NoBrokersAvailableError(KafkaTimeoutError):
    """``poll`` found no group coordinator reached for ``broker.unreachable.timeout.ms``: every
    connection attempt failed (nothing listening at the bootstrap address, a wrong port or host, a
    coordinator address that does not resolve or route). Not fatal: the consumer keeps trying, and
    the next ``poll`` raises it again while the outage lasts (a member that is already stable keeps
    its partitions and is not interrupted)."""


class KafkaConnectionError(KafkaError):
    """A connection broke, or could not be set up."""

    always_retriable = True


class IllegalStateError(KafkaError):
    """The call is not valid in the consumer's current state."""


class ProtocolMismatchError(KafkaError):
    """The peer answered something this client cannot use (e.g. an undecodable assignment)."""


class CommitFailedError(KafkaError):
    """The commit cannot be completed: the group rebalanced and this member's generation is gone."""

    def default_message(self) -> str:
        return (
            "Commit cannot be completed since the group has already rebalanced and assigned the "
            "partitions to another member. Poll again to rejoin, then process from the committed offsets."
        )


class RetriableCommitFailedError(KafkaError):
    """A commit failed with a retriable error and was not retried: a later commit may succeed.
    Also what a commit gets when a later commit of one of its partitions was made before it could
    be retried: do not re-send the same offsets then (they are older than that later commit)."""

    always_retriable = True


class RebalanceInProgressError(KafkaError):
    code = codes.REBALANCE_IN_PROGRESS


class FencedInstanceIdError(KafkaError):
    code = codes.FENCED_INSTANCE_ID


class UnknownMemberIdError(KafkaError):
    code = codes.UNKNOWN_MEMBER_ID


class IllegalGenerationError(KafkaError):
    code = codes.ILLEGAL_GENERATION


class MemberIdRequiredError(KafkaError):
    code = codes.MEMBER_ID_REQUIRED


class CoordinatorNotAvailableError(KafkaError):
    code = codes.COORDINATOR_NOT_AVAILABLE


class NotCoordinatorError(KafkaError):
    code = codes.NOT_COORDINATOR


class CoordinatorLoadInProgressError(KafkaError):
    code = codes.COORDINATOR_LOAD_IN_PROGRESS


class GroupAuthorizationError(KafkaError):
    code = codes.GROUP_AUTHORIZATION_FAILED


class TopicAuthorizationError(KafkaError):
    code = codes.TOPIC_AUTHORIZATION_FAILED


class InconsistentGroupProtocolError(KafkaError):
    code = codes.INCONSISTENT_GROUP_PROTOCOL


class InvalidSessionTimeoutError(KafkaError):
    code = codes.INVALID_SESSION_TIMEOUT


class InvalidGroupIdError(KafkaError):
    code = codes.INVALID_GROUP_ID


class GroupMaxSizeReachedError(KafkaError):
    code = codes.GROUP_MAX_SIZE_REACHED


class UnreleasedInstanceIdError(KafkaError):
    code = codes.UNRELEASED_INSTANCE_ID


class UnsupportedVersionError(KafkaError):
    code = codes.UNSUPPORTED_VERSION


class OffsetMetadataTooLargeError(KafkaError):
    code = codes.OFFSET_METADATA_TOO_LARGE


class InvalidCommitOffsetSizeError(KafkaError):
    code = codes.INVALID_COMMIT_OFFSET_SIZE


class UnknownTopicOrPartitionError(KafkaError):
    code = codes.UNKNOWN_TOPIC_OR_PARTITION


class UnstableOffsetCommitError(KafkaError):
    code = codes.UNSTABLE_OFFSET_COMMIT


class RequestTimedOutError(KafkaError):
    code = codes.REQUEST_TIMED_OUT


class AuthenticationFailedError(KafkaError):
    """The broker refused to authenticate this client (SASL_AUTHENTICATION_FAILED, or a SASL
    exchange that could not complete). Not retriable: fix the credentials."""

    code = codes.SASL_AUTHENTICATION_FAILED


class SslAuthenticationError(AuthenticationFailedError):
    """A TLS handshake that retrying cannot fix: the broker's certificate does not verify, or the
    broker refused the client's."""

    code = None


_BY_CODE: dict[int, type[KafkaError]] = {
    cls.code: cls
    for cls in (
        RebalanceInProgressError,
        FencedInstanceIdError,
        UnknownMemberIdError,
        IllegalGenerationError,
        MemberIdRequiredError,
        CoordinatorNotAvailableError,
        NotCoordinatorError,
        CoordinatorLoadInProgressError,
        GroupAuthorizationError,
        TopicAuthorizationError,
        InconsistentGroupProtocolError,
        InvalidSessionTimeoutError,
        InvalidGroupIdError,
        GroupMaxSizeReachedError,
        UnreleasedInstanceIdError,
        UnsupportedVersionError,
        OffsetMetadataTooLargeError,
        InvalidCommitOffsetSizeError,
        UnknownTopicOrPartitionError,
        UnstableOffsetCommitError,
        RequestTimedOutError,
        AuthenticationFailedError,
    )
}


def error_for_code(code: int, message: str | None = None) -> KafkaError:
    """The exception for a Kafka error code (``code`` must not be 0)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return KafkaError(message, code=code)
    return cls(message)
