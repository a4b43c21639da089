"""The APIs and versions herd serves: what ApiVersions advertises and what the server accepts.

Only what is implemented is advertised. KIP-848's ConsumerGroupHeartbeat (v0-1) and
ConsumerGroupDescribe (v0: the spec herd generates from has no v1) are served, and the finalized
feature ``group.version`` 1 is advertised beside them, as a Kafka 4.x broker does (its brokers
advertise the consumer-group APIs only when ``group.version`` >= 1). Transactions
(TxnOffsetCommit) are not served. SaslHandshake/SaslAuthenticate are advertised on every listener,
as Kafka does (on one without SASL they answer ILLEGAL_SASL_STATE).
"""
from __future__ import annotations

from protocol import acls as acl_messages
from protocol import messages as m
from protocol import produce

# The API keys herd serves, by name (from the generated classes: never a bare number elsewhere).
PRODUCE = produce.API_KEY
FETCH = m.FetchRequest.API_KEY
LIST_OFFSETS = m.ListOffsetsRequest.API_KEY
METADATA = m.MetadataRequest.API_KEY
OFFSET_COMMIT = m.OffsetCommitRequest.API_KEY
OFFSET_FETCH = m.OffsetFetchRequest.API_KEY
FIND_COORDINATOR = m.FindCoordinatorRequest.API_KEY
JOIN_GROUP = m.JoinGroupRequest.API_KEY
HEARTBEAT = m.HeartbeatRequest.API_KEY
LEAVE_GROUP = m.LeaveGroupRequest.API_KEY
SYNC_GROUP = m.SyncGroupRequest.API_KEY
DESCRIBE_GROUPS = m.DescribeGroupsRequest.API_KEY
LIST_GROUPS = m.ListGroupsRequest.API_KEY
SASL_HANDSHAKE = m.SaslHandshakeRequest.API_KEY
API_VERSIONS = m.ApiVersionsRequest.API_KEY
CREATE_TOPICS = m.CreateTopicsRequest.API_KEY
DELETE_GROUPS = m.DeleteGroupsRequest.API_KEY
SASL_AUTHENTICATE = m.SaslAuthenticateRequest.API_KEY
OFFSET_DELETE = m.OffsetDeleteRequest.API_KEY
DESCRIBE_CLUSTER = m.DescribeClusterRequest.API_KEY
CONSUMER_GROUP_HEARTBEAT = m.ConsumerGroupHeartbeatRequest.API_KEY
CONSUMER_GROUP_DESCRIBE = m.ConsumerGroupDescribeRequest.API_KEY
DESCRIBE_ACLS = acl_messages.DESCRIBE_ACLS
CREATE_ACLS = acl_messages.CREATE_ACLS
DELETE_ACLS = acl_messages.DELETE_ACLS
ACL_APIS = frozenset({DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS})

# api key -> (min, max) served. Every version the codec has for these APIs is served.
SUPPORTED: dict[int, tuple[int, int]] = {
    cls.API_KEY: (cls.MIN_VERSION, cls.MAX_VERSION)
    for cls in (
        m.FetchRequest, m.ListOffsetsRequest, m.MetadataRequest, m.OffsetCommitRequest,
        m.OffsetFetchRequest, m.FindCoordinatorRequest, m.JoinGroupRequest, m.HeartbeatRequest,
        m.LeaveGroupRequest, m.SyncGroupRequest, m.DescribeGroupsRequest, m.ListGroupsRequest,
        m.ApiVersionsRequest, m.CreateTopicsRequest, m.DeleteGroupsRequest, m.OffsetDeleteRequest,
        m.DescribeClusterRequest, m.SaslHandshakeRequest, m.SaslAuthenticateRequest,
        m.ConsumerGroupHeartbeatRequest, m.ConsumerGroupDescribeRequest,
    )
}

# The ACL APIs (hand-written codec, protocol/acls.py): v1-3.
for _cls in acl_messages.REQUESTS.values():
    SUPPORTED[_cls.API_KEY] = (_cls.MIN_VERSION, _cls.MAX_VERSION)

# Produce is advertised but refused (see protocol/produce.py): librdkafka uses message format
# v2, and a consistent Fetch encoding, only with a broker that advertises Produce v3+.
SUPPORTED[produce.API_KEY] = (produce.MIN_VERSION, produce.MAX_VERSION)

# The group APIs handled by the group coordinator (coordinator/core/coordinator.py).
GROUP_APIS = frozenset({
    JOIN_GROUP, SYNC_GROUP, HEARTBEAT, LEAVE_GROUP, OFFSET_COMMIT, OFFSET_FETCH, LIST_GROUPS, DESCRIBE_GROUPS,
    DELETE_GROUPS, OFFSET_DELETE, CONSUMER_GROUP_HEARTBEAT, CONSUMER_GROUP_DESCRIBE,
})

# Kafka's feature flags in ApiVersions v3+ (KIP-584): name -> (min, max) supported, and the level
# finalized. ``group.version`` 1 is what turns KIP-848 on in Kafka 4.x (GroupVersion.GV_1).
GROUP_VERSION_FEATURE = "group.version"
SUPPORTED_FEATURES = {GROUP_VERSION_FEATURE: (0, 1)}
FINALIZED_FEATURES = {GROUP_VERSION_FEATURE: 1}
FINALIZED_FEATURES_EPOCH = 1  # Kafka's is the metadata offset; herd's features never change

API_NAMES = {key: cls.NAME[: -len("Request")] for key, cls in m.REQUESTS.items()}
API_NAMES[produce.API_KEY] = "Produce"
API_NAMES.update({key: cls.NAME[: -len("Request")] for key, cls in acl_messages.REQUESTS.items()})


def is_supported(api_key: int, version: int) -> bool:
    r = SUPPORTED.get(api_key)
    return r is not None and r[0] <= version <= r[1]


def api_versions_response(error_code: int = 0) -> m.ApiVersionsResponse:
    return m.ApiVersionsResponse(
        error_code=error_code,
        api_keys=[m.ApiVersionsResponseApiVersion(api_key=k, min_version=lo, max_version=hi)
                  for k, (lo, hi) in sorted(SUPPORTED.items())],
        supported_features=[m.ApiVersionsResponseSupportedFeatureKey(name=n, min_version=lo, max_version=hi)
                            for n, (lo, hi) in sorted(SUPPORTED_FEATURES.items())],
        finalized_features_epoch=FINALIZED_FEATURES_EPOCH,
        finalized_features=[m.ApiVersionsResponseFinalizedFeatureKey(name=n, max_version_level=v, min_version_level=v)
                            for n, v in sorted(FINALIZED_FEATURES.items())],
    )
