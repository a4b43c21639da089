"""The edge's authorization: :func:`build` makes the daemon's gate (coordinator.core.auth.gate), and
authorization failures are counted (``herd_authorization_failures_total{resource_type,operation}``)
and logged at most once a second per principal (with how many were not logged since), naming
the principal, host, operation and resource: never a password or a token."""
from __future__ import annotations

import time

from coordinator import logging_setup
from coordinator.core.auth import acl as A
from coordinator.core.auth.acls import ACL_APIS
from coordinator.core.auth.gate import Gate

log = logging_setup.get("herd.authorizer")
LOG_INTERVAL = 1.0  # seconds between two logged denials of one principal
_MAX_PRINCIPALS = 10_000  # principals remembered before the record starts over


class DenialReporter:
    def __init__(self, counter=None, clock=time.monotonic):
        self.counter = counter  # a coordinator.ops.metrics.Counter labelled (resource_type, operation)
        self.clock = clock
        self._last: dict[str, list] = {}  # principal -> [last logged at, denials not logged since]

    def __call__(self, principal: str, host: str, resource_type: int, operation: int, name: str) -> None:
        rtype, op = A.RESOURCE_NAMES.get(resource_type, "UNKNOWN"), A.OPERATION_NAMES.get(operation, "UNKNOWN")
        if self.counter is not None:
            self.counter.inc(rtype, op)
        now = self.clock()
        seen = self._last.get(principal)
        if seen is not None and now - seen[0] < LOG_INTERVAL:
            seen[1] += 1
            return
        if len(self._last) >= _MAX_PRINCIPALS:
            self._last.clear()
        suppressed = seen[1] if seen is not None else 0
        self._last[principal] = [now, 0]
        log.info("authorization failed", principal=principal, host=host, operation=op, resource_type=rtype,
                 resource=name, not_logged_since=suppressed)


def build(config, authorizer: A.Authorizer, catalog, counter=None) -> Gate | None:
    """The daemon's gate for ``config`` (None with ``authorizer = none``): topics known from
    ``catalog``, denials counted in ``counter`` and logged (coordinator.edge.authorization)."""
    if getattr(config, "authorizer", "none") != "acl":
        return None

    def topic_name(topic_id: bytes) -> str:
        topic = catalog.by_id.get(topic_id)
        return topic.name if topic is not None else ""

    return Gate(authorizer, topic_exists=catalog.topics.__contains__, auto_create=config.auto_create_topics,
                on_denied=DenialReporter(counter), acl_apis=ACL_APIS, topic_name=topic_name)
