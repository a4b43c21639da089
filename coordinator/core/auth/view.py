"""What one principal may see of herd's HTTP views (the console, its JSON, ``/groups``, the flight
recorder, ``/metrics``) with ``authorizer = acl``: :func:`view_for` is the one place the HTTP side asks
the authorizer. Kafka's rules, as its requests apply them:

* a group is shown when the principal may DESCRIBE the CLUSTER (ListGroups lists every group to it)
  or DESCRIBE the GROUP (ListGroups' filter, DescribeGroups, OffsetFetch); a group it may not
  describe is refused (HTTP 403) whether or not it exists, as DescribeGroups answers
  GROUP_AUTHORIZATION_FAILED before it looks the group up: the answer never tells whether it exists;
* a topic (its partitions' offsets, lag, owners) is shown when the principal may DESCRIBE the
  TOPIC (OffsetFetch of all topics, Metadata);
* ``/metrics`` (every group's and topic's labels) needs CLUSTER DESCRIBE: an operator's view.

Super users see everything (the authorizer says yes to them). Pure: decisions are the authorizer's
(cached there) and memoised per view (one view per HTTP request).
"""
from __future__ import annotations

from coordinator.core.auth import acl as A


class View:
    """Everything is visible (``authorizer = none``); :class:`AclView` narrows it."""

    principal = None
    all_groups = True  # every group may be listed (no per-group question needed)
    all_topics = True  # every topic may be shown
    metrics = True  # /metrics may be read

    def group(self, group_id: str) -> bool:
        return True

    def topic(self, name: str) -> bool:
        return True


EVERYTHING = View()


class AclView(View):
    def __init__(self, authorizer: A.Authorizer, principal: str, host: str):
        self.authorizer, self.principal, self.host = authorizer, principal, host
        super_user = principal in authorizer.super_users
        cluster = super_user or authorizer.authorize(principal, host, A.DESCRIBE, A.CLUSTER, A.CLUSTER_NAME)
        self.all_groups = cluster
        self.metrics = cluster
        self.all_topics = super_user
        self._groups: dict[str, bool] = {}
        self._topics: dict[str, bool] = {}

    def group(self, group_id: str) -> bool:
        if self.all_groups:
            return True
        ok = self._groups.get(group_id)
        if ok is None:
            ok = self._groups[group_id] = self.authorizer.authorize(self.principal, self.host, A.DESCRIBE,
                                                                    A.GROUP, group_id)
        return ok

    def topic(self, name: str) -> bool:
        if self.all_topics:
            return True
        ok = self._topics.get(name)
        if ok is None:
            ok = self._topics[name] = self.authorizer.authorize(self.principal, self.host, A.DESCRIBE,
                                                                A.TOPIC, name)
        return ok


def view_for(authorizer: A.Authorizer | None, principal: str, host: str) -> View:
    """What ``principal`` connecting from ``host`` may see (everything without an authorizer)."""
    if authorizer is None:
        return EVERYTHING
    return AclView(authorizer, principal, host)
