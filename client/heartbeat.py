"""Group-membership timers as plain objects that take ``now`` (seconds, monotonic); no clock reads.

``Heartbeat`` follows Kafka's client-side Heartbeat: three clocks per member.

- heartbeat timer: a heartbeat is due ``heartbeat.interval.ms`` after the last one was sent (or
  ``retry.backoff.ms`` after one failed); one heartbeat in flight at a time.
- session timer: reset by every successful heartbeat response. If it runs past
  ``session.timeout.ms`` the coordinator has surely expired us, so the client looks for the
  coordinator again (it does not give up its generation: the coordinator decides that).
- poll timer: reset by every ``poll()`` of the user. Past ``max.poll.interval.ms`` the member
  leaves the group proactively; the next poll rejoins.

``Backoff`` is the exponential retry backoff (``retry.backoff.ms`` doubling up to
``retry.backoff.max.ms``, with +-20% jitter from an injectable random source).
"""

from __future__ import annotations

import random

INF = float("inf")


class Heartbeat:
    def __init__(
        self,
        session_timeout_s: float,
        heartbeat_interval_s: float,
        max_poll_interval_s: float,
        retry_backoff_s: float,
        now: float,
    ):
        if heartbeat_interval_s >= session_timeout_s:
            raise ValueError("heartbeat.interval.ms must be lower than session.timeout.ms")
        self.session_timeout = session_timeout_s
        self.interval = heartbeat_interval_s
        self.max_poll_interval = max_poll_interval_s
        self.retry_backoff = retry_backoff_s
        self.in_flight = False
        self.last_sent = -INF
        self.last_received = -INF
        self.last_poll = now
        self._next_heartbeat = now + heartbeat_interval_s
        self._session_reset = now

    # -- poll timer ----------------------------------------------------------------------------
    def poll(self, now: float) -> None:
        self.last_poll = now

    def poll_timeout_expired(self, now: float) -> bool:
        return now - self.last_poll > self.max_poll_interval

    def poll_deadline(self) -> float:
        return self.last_poll + self.max_poll_interval

    # -- heartbeat timer ---------------------------------------------------------------------
    def sent_heartbeat(self, now: float) -> None:
        self.in_flight = True
        self.last_sent = now
        self._next_heartbeat = now + self.interval

    def received_heartbeat(self, now: float) -> None:
        """A heartbeat response arrived (any error code): the coordinator is alive."""
        self.in_flight = False
        self.last_received = now
        self._session_reset = now

    def fail_heartbeat(self, now: float) -> None:
        """No response (connection lost, timeout): retry after the backoff."""
        self.in_flight = False
        self._next_heartbeat = now + self.retry_backoff

    def should_heartbeat(self, now: float) -> bool:
        return not self.in_flight and now >= self._next_heartbeat

    def time_to_next_heartbeat(self, now: float) -> float:
        if self.in_flight:
            return INF
        return max(0.0, self._next_heartbeat - now)

    def next_heartbeat_at(self) -> float:
        return INF if self.in_flight else self._next_heartbeat

    # -- session timer -------------------------------------------------------------------------
    def session_timeout_expired(self, now: float) -> bool:
        return now - self._session_reset > self.session_timeout

    def session_deadline(self) -> float:
        return self._session_reset + self.session_timeout

    def reset_session_timeout(self, now: float) -> None:
        self._session_reset = now

    def reset_timeouts(self, now: float) -> None:
        """A new membership starts (join completed): all clocks restart."""
        self._session_reset = now
        self._next_heartbeat = now + self.interval
        self.in_flight = False


class Backoff:
    """Exponential backoff: ``base * 2**attempts`` capped at ``maximum``, with jitter."""

    def __init__(
        self, base_s: float, maximum_s: float, jitter: float = 0.2, rng: random.Random | None = None
    ):
        self.base = base_s
        self.maximum = max(maximum_s, base_s)
        self.jitter = jitter
        self.rng = rng or random.Random()
        self.attempts = 0

    def next_delay(self) -> float:
        delay = min(self.maximum, self.base * (2 ** min(self.attempts, 30)))
        self.attempts += 1
        if self.jitter:
            delay *= 1 + self.rng.uniform(-self.jitter, self.jitter)
        return max(0.0, delay)

    def reset(self) -> None:
        self.attempts = 0
