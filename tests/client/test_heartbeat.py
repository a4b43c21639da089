"""Heartbeat timers and backoff with a manual clock."""

from __future__ import annotations

import random

import pytest

from client.heartbeat import Backoff, Heartbeat


def hb(now=0.0):
    return Heartbeat(
        session_timeout_s=10.0,
        heartbeat_interval_s=3.0,
        max_poll_interval_s=30.0,
        retry_backoff_s=0.1,
        now=now,
    )


def test_heartbeat_due_every_interval():
    h = hb()
    assert not h.should_heartbeat(2.9) and h.should_heartbeat(3.0)
    h.sent_heartbeat(3.0)
    assert not h.should_heartbeat(100.0)  # one in flight
    h.received_heartbeat(3.2)
    assert not h.should_heartbeat(5.9) and h.should_heartbeat(6.0)
    assert h.time_to_next_heartbeat(5.0) == pytest.approx(1.0)


def test_failed_heartbeat_retries_after_backoff():
    h = hb()
    h.sent_heartbeat(3.0)
    h.fail_heartbeat(3.5)
    assert not h.should_heartbeat(3.55) and h.should_heartbeat(3.6)


def test_session_expires_without_responses():
    h = hb()
    assert not h.session_timeout_expired(10.0) and h.session_timeout_expired(10.01)
    h.received_heartbeat(8.0)
    assert not h.session_timeout_expired(18.0) and h.session_timeout_expired(18.01)
    assert h.session_deadline() == 18.0
    h.reset_session_timeout(20.0)
    assert not h.session_timeout_expired(29.0)


def test_poll_timer():
    h = hb()
    assert not h.poll_timeout_expired(30.0) and h.poll_timeout_expired(30.01)
    h.poll(25.0)
    assert not h.poll_timeout_expired(55.0) and h.poll_deadline() == 55.0


def test_reset_timeouts_restarts_session_and_heartbeat_not_poll():
    h = hb()
    h.sent_heartbeat(1.0)
    h.reset_timeouts(50.0)
    assert not h.in_flight and h.should_heartbeat(53.0) and not h.should_heartbeat(52.9)
    assert not h.session_timeout_expired(59.0)
    assert h.poll_timeout_expired(50.0)  # the user still has to poll


def test_interval_must_be_below_session():
    with pytest.raises(ValueError):
        Heartbeat(3.0, 3.0, 30.0, 0.1, 0.0)


def test_backoff_doubles_caps_and_resets():
    b = Backoff(0.1, 1.0, jitter=0)
    assert [b.next_delay() for _ in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])
    b.reset()
    assert b.next_delay() == pytest.approx(0.1)


def test_backoff_jitter_bounded():
    b = Backoff(1.0, 1.0, jitter=0.2, rng=random.Random(3))
    ds = [b.next_delay() for _ in range(200)]
    assert min(ds) >= 0.8 and max(ds) <= 1.2 and len(set(ds)) > 100
