"""The one authorization point of the request path (``authorizer = acl``).

The edge calls :meth:`Gate.check` for every decoded request before the runtime sees it (and
:meth:`Gate.group_read` from its Heartbeat / ConsumerGroupHeartbeat fast paths). ``check`` returns
``(answer, amend)``: ``answer`` is a whole response when the request is refused outright (it never
reaches the runtime); otherwise the request may have been narrowed in place (the topics or groups
the principal may not touch removed) and ``amend(response)``, when not None, puts the refused
parts back into the runtime's answer (and filters what must not be shown), as Kafka's KafkaApis
does. Which operation each request needs is Kafka's (KafkaApis, Kafka 4):

* JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ConsumerGroupHeartbeat: GROUP READ (and, for a
  ConsumerGroupHeartbeat naming its subscription, TOPIC DESCRIBE on each topic);
* OffsetCommit: GROUP READ, then TOPIC READ per topic (TOPIC_AUTHORIZATION_FAILED per partition);
* OffsetFetch: GROUP DESCRIBE, then TOPIC DESCRIBE per topic (all topics: only those shown);
* DescribeGroups, ConsumerGroupDescribe: GROUP DESCRIBE per group; ListGroups: everything with
  CLUSTER DESCRIBE, else only the groups the principal may DESCRIBE;
* DeleteGroups: GROUP DELETE per group; OffsetDelete: GROUP DELETE, then TOPIC READ per topic;
* FindCoordinator: GROUP DESCRIBE per group key;
* Metadata: only topics the principal may DESCRIBE; auto-creation needs CLUSTER CREATE or TOPIC
  CREATE; CreateTopics: CLUSTER CREATE or TOPIC CREATE per topic;
* ListOffsets: TOPIC DESCRIBE per topic; Fetch: TOPIC READ per topic;
* CreateAcls, DeleteAcls: CLUSTER ALTER; DescribeAcls: CLUSTER DESCRIBE;
* the authorized-operations fields (DescribeGroups, ConsumerGroupDescribe, Metadata,
  DescribeCluster) answer what the principal may do.

Every refusal is reported to ``on_denied(principal, resource_type, operation)`` (metrics, log).
Pure apart from that callback.
"""
from __future__ import annotations

from coordinator.core.auth import acl as A
from coordinator.core.responses import error_response, join_response, kafka_error_message
from coordinator.core.versions import (
    CONSUMER_GROUP_DESCRIBE,
    CONSUMER_GROUP_HEARTBEAT,
    CREATE_TOPICS,
    DELETE_GROUPS,
    DESCRIBE_CLUSTER,
    DESCRIBE_GROUPS,
    FETCH,
    FIND_COORDINATOR,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    LIST_GROUPS,
    LIST_OFFSETS,
    METADATA,
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    SYNC_GROUP,
)
from protocol import errors as E
from protocol import messages as m

NO_OPERATIONS = -2147483648  # Kafka's "authorized operations not asked for"
# Kafka's message for a described consumer group naming a topic the client may not describe
UNDESCRIBABLE_TOPICS = "The group has described topic(s) that the client is not authorized to describe."
_GROUP_READ_APIS = frozenset({JOIN_GROUP, SYNC_GROUP, HEARTBEAT, LEAVE_GROUP})
_READ, _GROUP, _TOPIC = A.READ, A.GROUP, A.TOPIC
CLUSTER = A.CLUSTER_NAME


class Gate:
    def __init__(self, authorizer: A.Authorizer, topic_exists=lambda name: True, auto_create: bool = False,
                 on_denied=None, acl_apis: dict | None = None, topic_name=lambda topic_id: ""):
        self.authorizer = authorizer
        self.topic_exists = topic_exists  # name -> bool (the catalog's)
        self.topic_name = topic_name  # topic id -> name ("" unknown)
        self.auto_create = auto_create
        self.on_denied = on_denied
        # api key -> operation on CLUSTER it needs (the ACL APIs; see coordinator.core.auth.acls)
        self.cluster_apis = dict(acl_apis or {})
        self._checks = {
            OFFSET_COMMIT: self._offset_commit, OFFSET_FETCH: self._offset_fetch,
            DESCRIBE_GROUPS: self._describe_groups, CONSUMER_GROUP_DESCRIBE: self._consumer_group_describe,
            LIST_GROUPS: self._list_groups, DELETE_GROUPS: self._delete_groups, OFFSET_DELETE: self._offset_delete,
            FIND_COORDINATOR: self._find_coordinator, METADATA: self._metadata, CREATE_TOPICS: self._create_topics,
            CONSUMER_GROUP_HEARTBEAT: self._consumer_group_heartbeat, DESCRIBE_CLUSTER: self._describe_cluster,
            LIST_OFFSETS: self._list_offsets, FETCH: self._fetch,
        }

    # ---- decisions -----------------------------------------------------------------------------

    def allowed(self, principal: str, host: str, op: int, rtype: int, name: str, log: bool = True) -> bool:
        ok = self.authorizer.authorize(principal, host, op, rtype, name)
        if not ok and log and self.on_denied is not None:
            self.on_denied(principal, host, rtype, op, name)
        return ok

    def topic_filter(self, principal: str, host: str):
        """``topic -> bool``: may ``principal`` DESCRIBE the topic (Kafka resolves a consumer group's
        regex subscriptions with the ACLs of the member whose heartbeat refreshes them, and leaves
        out the topics it may not describe). Denials are not logged: topics are only left out."""
        authorize = self.authorizer.authorize

        def may_describe(topic: str) -> bool:
            return authorize(principal, host, A.DESCRIBE, A.TOPIC, topic)
        may_describe.generation = self.authorizer.generation  # the ACLs it answers for
        return may_describe

    def group_read(self, cache: dict, principal: str, host: str, group_id: str) -> bool:
        """GROUP READ for the edge's fast paths, cached per connection (``cache``: group id ->
        (authorizer generation, decision)): a steady heartbeat costs one dict lookup."""
        hit = cache.get(group_id)
        gen = self.authorizer.generation
        if hit is not None and hit[0] == gen:
            if not hit[1] and self.on_denied is not None:
                self.on_denied(principal, host, A.GROUP, A.READ, group_id)
            return hit[1]
        ok = self.allowed(principal, host, A.READ, A.GROUP, group_id)
        if len(cache) > 64:
            cache.clear()
        cache[group_id] = (gen, ok)
        return ok

    def check(self, principal: str, host: str, api_key: int, version: int, request, token=None):
        """-> (refusal response or None, amend function or None); see the module docstring.
        ``token`` (the request's, when given): a ConsumerGroupHeartbeat's gets ``topic_filter``, the
        client's TOPIC DESCRIBE, with which the consumer core resolves regex subscriptions."""
        check = self._checks.get(api_key)
        if check is not None:
            answer = check(principal, host, version, request)
            if api_key == CONSUMER_GROUP_HEARTBEAT and token is not None and answer[0] is None:
                token.topic_filter = self.topic_filter(principal, host)
            return answer
        if api_key in _GROUP_READ_APIS:
            if self.allowed(principal, host, A.READ, A.GROUP, request.group_id):
                return None, None
            if api_key == JOIN_GROUP:  # Kafka's JoinGroup error answer names no member
                return join_response(version, E.GROUP_AUTHORIZATION_FAILED, ""), None
            return error_response(api_key, version, request, E.GROUP_AUTHORIZATION_FAILED), None
        op = self.cluster_apis.get(api_key)
        if op is not None:
            if self.allowed(principal, host, op, A.CLUSTER, CLUSTER):
                return None, None
            return _cluster_refusal(request, version), None
        return None, None

    # ---- per request -------------------------------------------------------------------------

    def _consumer_group_heartbeat(self, principal, host, version, req):
        if not self.allowed(principal, host, A.READ, A.GROUP, req.group_id):
            return m.ConsumerGroupHeartbeatResponse(error_code=E.GROUP_AUTHORIZATION_FAILED), None
        if req.subscribed_topic_names:
            denied = [t for t in req.subscribed_topic_names
                      if not self.allowed(principal, host, A.DESCRIBE, A.TOPIC, t)]
            if denied:
                return m.ConsumerGroupHeartbeatResponse(
                    error_code=E.TOPIC_AUTHORIZATION_FAILED,
                    error_message=f"The client is not authorized to describe topics: {', '.join(sorted(denied))}"), None
        return None, None

    def _offset_commit(self, principal, host, version, req):
        authorize = self.authorizer.authorize  # the hot path: cached decisions, nothing built when allowed
        if not authorize(principal, host, _READ, _GROUP, req.group_id):
            self.allowed(principal, host, A.READ, A.GROUP, req.group_id)  # reports it
            return error_response(OFFSET_COMMIT, version, req, E.GROUP_AUTHORIZATION_FAILED), None
        for t in req.topics:
            if not authorize(principal, host, _READ, _TOPIC, t.name):
                break
        else:
            return None, None
        order = [t.name for t in req.topics]
        denied = [t for t in req.topics if not self.allowed(principal, host, A.READ, A.TOPIC, t.name)]
        refused = {t.name: m.OffsetCommitResponseTopic(t.name, [
            m.OffsetCommitResponsePartition(p.partition_index, E.TOPIC_AUTHORIZATION_FAILED) for p in t.partitions])
            for t in denied}
        req.topics = [t for t in req.topics if t.name not in refused]
        if not req.topics:
            return m.OffsetCommitResponse(topics=[refused[n] for n in order]), None

        def amend(resp):
            got = {t.name: t for t in resp.topics}
            resp.topics = [got.get(n) or refused[n] for n in order if n in got or n in refused]
            return resp
        return None, amend

    def _offset_fetch(self, principal, host, version, req):
        if version >= 8:
            return self._offset_fetch_groups(principal, host, req)
        if not self.allowed(principal, host, A.DESCRIBE, A.GROUP, req.group_id):
            return error_response(OFFSET_FETCH, version, req, E.GROUP_AUTHORIZATION_FAILED), None
        if req.topics is None:  # every topic the group has: show only those it may describe
            def amend(resp):
                resp.topics = [t for t in resp.topics
                               if self.allowed(principal, host, A.DESCRIBE, A.TOPIC, t.name, log=False)]
                return resp
            return None, amend
        order = [t.name for t in req.topics]
        refused = {t.name: m.OffsetFetchResponseTopic(t.name, [
            m.OffsetFetchResponsePartition(p, -1, -1, "", E.TOPIC_AUTHORIZATION_FAILED) for p in t.partition_indexes])
            for t in req.topics if not self.allowed(principal, host, A.DESCRIBE, A.TOPIC, t.name)}
        if not refused:
            return None, None
        req.topics = [t for t in req.topics if t.name not in refused]

        def amend(resp):
            if resp.error_code:
                return resp
            got = {t.name: t for t in resp.topics}
            resp.topics = [got.get(n) or refused[n] for n in order if n in got or n in refused]
            return resp
        return None, amend

    def _offset_fetch_groups(self, principal, host, req):
        order = [g.group_id for g in req.groups]
        refused: dict = {}
        topic_refused: dict = {}
        kept = []
        for g in req.groups:
            if not self.allowed(principal, host, A.DESCRIBE, A.GROUP, g.group_id):
                refused[g.group_id] = m.OffsetFetchResponseGroup(g.group_id, [], E.GROUP_AUTHORIZATION_FAILED)
                continue
            kept.append(g)
            if g.topics is None:
                topic_refused[g.group_id] = None  # filter the answer
                continue
            bad = {t.name: m.OffsetFetchResponseTopics(t.name, [
                m.OffsetFetchResponsePartitions(p, -1, -1, "", E.TOPIC_AUTHORIZATION_FAILED)
                for p in t.partition_indexes])
                for t in g.topics if not self.allowed(principal, host, A.DESCRIBE, A.TOPIC, t.name)}
            if bad:
                topic_refused[g.group_id] = ([t.name for t in g.topics], bad)
                g.topics = [t for t in g.topics if t.name not in bad]
        if not refused and not topic_refused:
            return None, None
        if not kept:
            return m.OffsetFetchResponse(groups=[refused[g] for g in order]), None
        req.groups = kept

        def amend(resp):
            got = {g.group_id: g for g in resp.groups}
            for gid, what in topic_refused.items():
                g = got.get(gid)
                if g is None or g.error_code:
                    continue
                if what is None:
                    g.topics = [t for t in g.topics
                                if self.allowed(principal, host, A.DESCRIBE, A.TOPIC, t.name, log=False)]
                else:
                    names, bad = what
                    have = {t.name: t for t in g.topics}
                    g.topics = [have.get(n) or bad[n] for n in names if n in have or n in bad]
            resp.groups = [got.get(gid) or refused[gid] for gid in order if gid in got or gid in refused]
            return resp
        return None, amend

    def _describe_groups(self, principal, host, version, req):
        refused = [g for g in req.groups if not self.allowed(principal, host, A.DESCRIBE, A.GROUP, g)]
        ops = req.include_authorized_operations if version >= 3 else False
        if refused:
            req.groups = [g for g in req.groups if g not in refused]
        errors = [m.DescribeGroupsResponseDescribedGroup(error_code=E.GROUP_AUTHORIZATION_FAILED, group_id=g,
                                                         group_state="", protocol_type="", protocol_data="",
                                                         members=[], authorized_operations=NO_OPERATIONS)
                  for g in refused]
        if not req.groups:
            return m.DescribeGroupsResponse(groups=errors), None
        if not refused and not ops:
            return None, None

        def amend(resp):
            if ops:
                for g in resp.groups:
                    if g.error_code == E.NONE:
                        g.authorized_operations = self.authorizer.authorized_operations(
                            principal, host, A.GROUP, g.group_id)
            resp.groups = list(resp.groups) + errors
            return resp
        return None, amend

    def _consumer_group_describe(self, principal, host, version, req):
        refused = [g for g in req.group_ids if not self.allowed(principal, host, A.DESCRIBE, A.GROUP, g)]
        ops = req.include_authorized_operations
        if refused:
            req.group_ids = [g for g in req.group_ids if g not in refused]
        errors = [m.ConsumerGroupDescribeResponseDescribedGroup(error_code=E.GROUP_AUTHORIZATION_FAILED, group_id=g)
                  for g in refused]
        if not req.group_ids:
            return m.ConsumerGroupDescribeResponse(groups=errors), None

        def amend(resp):
            groups = []
            for g in resp.groups:
                if g.error_code == E.NONE:
                    # Kafka 4 (KAFKA-18813): a group whose members' assignment or target assignment
                    # names a topic the client may not DESCRIBE is answered TOPIC_AUTHORIZATION_FAILED,
                    # without its members
                    topics = {tp.topic_name for mb in g.members for a in (mb.assignment, mb.target_assignment)
                              if a is not None for tp in a.topic_partitions}
                    if any(not self.allowed(principal, host, A.DESCRIBE, A.TOPIC, t) for t in sorted(topics)):
                        g = m.ConsumerGroupDescribeResponseDescribedGroup(
                            error_code=E.TOPIC_AUTHORIZATION_FAILED, error_message=UNDESCRIBABLE_TOPICS,
                            group_id=g.group_id)
                    elif ops:
                        g.authorized_operations = self.authorizer.authorized_operations(
                            principal, host, A.GROUP, g.group_id)
                groups.append(g)
            resp.groups = groups + errors
            return resp
        return None, amend

    def _list_groups(self, principal, host, version, req):
        if self.allowed(principal, host, A.DESCRIBE, A.CLUSTER, CLUSTER, log=False):
            return None, None

        def amend(resp):
            resp.groups = [g for g in resp.groups
                           if self.allowed(principal, host, A.DESCRIBE, A.GROUP, g.group_id, log=False)]
            return resp
        return None, amend

    def _delete_groups(self, principal, host, version, req):
        order = list(req.groups_names)
        refused = {g: m.DeleteGroupsResponseDeletableGroupResult(g, E.GROUP_AUTHORIZATION_FAILED)
                   for g in order if not self.allowed(principal, host, A.DELETE, A.GROUP, g)}
        if not refused:
            return None, None
        req.groups_names = [g for g in order if g not in refused]
        if not req.groups_names:
            return m.DeleteGroupsResponse(results=[refused[g] for g in dict.fromkeys(order)]), None

        def amend(resp):
            resp.results = list(resp.results) + list(refused.values())
            return resp
        return None, amend

    def _offset_delete(self, principal, host, version, req):
        if not self.allowed(principal, host, A.DELETE, A.GROUP, req.group_id):
            return m.OffsetDeleteResponse(error_code=E.GROUP_AUTHORIZATION_FAILED), None
        order = [t.name for t in req.topics]
        refused = {t.name: m.OffsetDeleteResponseTopic(t.name, [
            m.OffsetDeleteResponsePartition(p.partition_index, E.TOPIC_AUTHORIZATION_FAILED) for p in t.partitions])
            for t in req.topics if not self.allowed(principal, host, A.READ, A.TOPIC, t.name)}
        if not refused:
            return None, None
        req.topics = [t for t in req.topics if t.name not in refused]
        if not req.topics:
            return m.OffsetDeleteResponse(topics=[refused[n] for n in order]), None

        def amend(resp):
            if resp.error_code:
                return resp
            got = {t.name: t for t in resp.topics}
            resp.topics = [got.get(n) or refused[n] for n in order if n in got or n in refused]
            return resp
        return None, amend

    def _find_coordinator(self, principal, host, version, req):
        if version < 4:
            if req.key_type == 0 and not self.allowed(principal, host, A.DESCRIBE, A.GROUP, req.key):
                return m.FindCoordinatorResponse(
                    error_code=E.GROUP_AUTHORIZATION_FAILED,
                    error_message=kafka_error_message(E.GROUP_AUTHORIZATION_FAILED), node_id=-1, host="", port=-1), None
            return None, None
        if req.key_type != 0:
            return None, None
        order = list(req.coordinator_keys)
        refused = {k for k in order if not self.allowed(principal, host, A.DESCRIBE, A.GROUP, k)}
        if not refused:
            return None, None
        req.coordinator_keys = [k for k in order if k not in refused]
        errors = {k: m.FindCoordinatorResponseCoordinator(  # v4+: Kafka leaves the message empty here
            key=k, node_id=-1, host="", port=-1, error_code=E.GROUP_AUTHORIZATION_FAILED, error_message="")
                  for k in refused}
        if not req.coordinator_keys:
            return m.FindCoordinatorResponse(coordinators=[errors[k] for k in order]), None

        def amend(resp):
            got = {c.key: c for c in resp.coordinators}
            resp.coordinators = [got.get(k) or errors[k] for k in dict.fromkeys(order) if k in got or k in errors]
            return resp
        return None, amend

    def _may_create(self, principal, host, name) -> bool:
        return (self.allowed(principal, host, A.CREATE, A.CLUSTER, CLUSTER, log=False)
                or self.allowed(principal, host, A.CREATE, A.TOPIC, name))

    def _metadata(self, principal, host, version, req):
        topic_ops = version >= 8 and req.include_topic_authorized_operations
        cluster_ops = 8 <= version <= 10 and req.include_cluster_authorized_operations
        refused: list[str] = []
        asked = None  # the names still asked for, when the request names topics
        if req.topics is not None and not (version == 0 and not req.topics):
            may_create = self.auto_create and (version < 4 or req.allow_auto_topic_creation)
            kept, create_refused = [], []
            for t in req.topics:
                name = t.name
                if name is None:  # by topic id: resolved by the catalog, checked in amend
                    kept.append(t)
                elif not self.allowed(principal, host, A.DESCRIBE, A.TOPIC, name):
                    refused.append(name)
                elif may_create and not self.topic_exists(name) and not self._may_create(principal, host, name):
                    create_refused.append(name)
                else:
                    kept.append(t)
            refused = create_refused + refused
            req.topics = kept  # v0 with nothing kept asks for every topic: ``asked`` filters them out
            asked = {t.name for t in kept}

        by_id = {t.topic_id for t in req.topics if t.name is None} if asked is not None else set()

        def amend(resp):
            out = []
            for t in resp.topics:
                if asked is not None and t.name not in asked:
                    if t.topic_id not in by_id:
                        continue  # v0 with nothing left asked for answers every topic: not these
                    # asked by id: shown only if it may be described (the catalog names it)
                    if t.error_code == E.NONE and not self.allowed(principal, host, A.DESCRIBE, A.TOPIC,
                                                                    t.name or self.topic_name(t.topic_id)):
                        t = m.MetadataResponseTopic(error_code=E.TOPIC_AUTHORIZATION_FAILED, name=None,
                                                    topic_id=t.topic_id, is_internal=False, partitions=[])
                elif asked is None and not self.allowed(principal, host, A.DESCRIBE, A.TOPIC, t.name, log=False):
                    continue  # every topic asked for: only those it may describe are shown
                if topic_ops and t.error_code == E.NONE and t.name is not None:
                    t.topic_authorized_operations = self.authorizer.authorized_operations(
                        principal, host, A.TOPIC, t.name)
                out.append(t)
            for name in refused:
                out.append(m.MetadataResponseTopic(error_code=E.TOPIC_AUTHORIZATION_FAILED, name=name,
                                                   topic_id=bytes(16), is_internal=False, partitions=[]))
            resp.topics = out
            if cluster_ops:
                resp.cluster_authorized_operations = self._cluster_operations(principal, host)
            return resp
        return None, amend

    def _create_topics(self, principal, host, version, req):
        if self.allowed(principal, host, A.CREATE, A.CLUSTER, CLUSTER, log=False):
            return None, None
        order = [t.name for t in req.topics]
        refused = {}
        for t in req.topics:
            if not self.allowed(principal, host, A.CREATE, A.TOPIC, t.name):
                refused[t.name] = m.CreateTopicsResponseCreatableTopicResult(
                    name=t.name, error_code=E.TOPIC_AUTHORIZATION_FAILED,
                    error_message="Authorization failed.", num_partitions=-1, replication_factor=-1)
        if not refused:
            return None, None
        req.topics = [t for t in req.topics if t.name not in refused]
        if not req.topics:
            return m.CreateTopicsResponse(topics=[refused[n] for n in dict.fromkeys(order)]), None

        def amend(resp):
            got = {t.name: t for t in resp.topics}
            resp.topics = [got.get(n) or refused[n] for n in dict.fromkeys(order) if n in got or n in refused]
            return resp
        return None, amend

    def _describe_cluster(self, principal, host, version, req):
        if not req.include_cluster_authorized_operations:
            return None, None

        def amend(resp):
            if resp.error_code == E.NONE:
                resp.cluster_authorized_operations = self._cluster_operations(principal, host)
            return resp
        return None, amend

    def _cluster_operations(self, principal, host) -> int:
        """Kafka's cluster authorized operations: 0 without CLUSTER DESCRIBE, else the bits."""
        if not self.allowed(principal, host, A.DESCRIBE, A.CLUSTER, CLUSTER, log=False):
            return 0
        return self.authorizer.authorized_operations(principal, host, A.CLUSTER, CLUSTER)

    def _list_offsets(self, principal, host, version, req):
        refused = {t.name for t in req.topics if not self.allowed(principal, host, A.DESCRIBE, A.TOPIC, t.name)}
        if not refused:
            return None, None

        def amend(resp):
            for t in resp.topics:
                if t.name in refused:
                    for p in t.partitions:
                        p.error_code = E.TOPIC_AUTHORIZATION_FAILED
                        p.timestamp, p.offset = -1, -1
                        p.old_style_offsets = []
            return resp
        return None, amend

    def _fetch(self, principal, host, version, req):
        if version >= 13:
            return None, None  # by topic id: herd's Fetch answers an empty log; see docs/compatibility.md
        refused = {t.topic for t in req.topics if not self.allowed(principal, host, A.READ, A.TOPIC, t.topic)}
        if not refused:
            return None, None

        def amend(resp):
            for t in resp.responses:
                if t.topic in refused:
                    for p in t.partitions:
                        p.error_code = E.TOPIC_AUTHORIZATION_FAILED
                        p.high_watermark = p.last_stable_offset = p.log_start_offset = -1
            return resp
        return None, amend


def _cluster_refusal(req, version):
    make = getattr(req, "cluster_authorization_failed", None)
    if make is not None:
        return make(version)
    raise ValueError(f"no refusal for {type(req).__name__}")

