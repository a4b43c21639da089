"""client.errors: what ``.retriable`` says."""

from __future__ import annotations

import pytest

from client import errors as cerr


@pytest.mark.parametrize(
    "error",
    [
        cerr.KafkaTimeoutError("commit timed out"),  # Java: TimeoutException
        cerr.KafkaConnectionError("reset by peer"),  # Java: DisconnectException
        cerr.RetriableCommitFailedError("not retried"),  # Java: RetriableCommitFailedException
        cerr.CoordinatorNotAvailableError(),
        cerr.NotCoordinatorError(),
        cerr.CoordinatorLoadInProgressError(),
        cerr.RequestTimedOutError(),
    ],
)
def test_errors_kafka_calls_retriable_are_retriable(error):
    assert error.retriable


@pytest.mark.parametrize(
    "error",
    [
        cerr.KafkaError("boom"),
        cerr.CommitFailedError(),
        cerr.RebalanceInProgressError(),
        cerr.IllegalStateError("closed"),
        cerr.FencedInstanceIdError(),
        cerr.GroupMaxSizeReachedError(),
        cerr.error_for_code(-1),  # UNKNOWN_SERVER_ERROR
    ],
)
def test_other_errors_are_not_retriable(error):
    assert not error.retriable
