"""The ACLs as durable state, and the ACL APIs (CreateAcls, DescribeAcls, DeleteAcls). Pure.

Each ACL is one herd-specific record in the catalog shard's log (key type ``ACL_RECORD`` 0x7F01,
beside the topics' 0x7F00): the key is the whole binding, the value a version marker, a tombstone
removes it; so the log's compaction keeps exactly the ACLs that exist, and replay at start-up
(``replay``) rebuilds them. Kafka's answers:

* CreateAcls: each creation validated (INVALID_REQUEST with Kafka's reason; TRANSACTIONAL_ID is
  refused, herd serves no transactions); creating an ACL that exists is a success that writes
  nothing.
* DescribeAcls: the ACLs matching the filter, grouped by resource pattern.
* DeleteAcls: per filter, the ACLs it matched (each deleted).
* without an authorizer (``authorizer = none``): SECURITY_DISABLED, as a Kafka broker with no
  authorizer.

Which principal may call them (CLUSTER ALTER / DESCRIBE) is the gate's (coordinator.core.auth.gate).
"""
from __future__ import annotations

import struct

from coordinator.core.auth import acl as A
from coordinator.core.result import Result
from protocol import acls as W
from protocol import errors as E
from protocol.wire import ProtocolError

ACL_RECORD = 0x7F01
CATALOG_SHARD = 0
_KEY = struct.Struct(">hbbbb")
_H = struct.Struct(">H")
_PRESENT = b"\x00\x00"  # value version 0
ACL_APIS = {W.CREATE_ACLS: A.ALTER, W.DELETE_ACLS: A.ALTER, W.DESCRIBE_ACLS: A.DESCRIBE}
SECURITY_DISABLED_MESSAGE = "No Authorizer is configured on the broker"


def is_acl_record(key: bytes) -> bool:
    return len(key) >= 2 and key[0] == 0x7F and key[1] == 0x01


def acl_key(acl: A.Acl) -> bytes:
    out = bytearray(_KEY.pack(ACL_RECORD, acl.resource_type, acl.pattern_type, acl.operation, acl.permission))
    for s in (acl.name, acl.principal, acl.host):
        raw = s.encode()
        out += _H.pack(len(raw))
        out += raw
    return bytes(out)


def decode_acl_key(key: bytes) -> A.Acl:
    try:
        _, rtype, pattern, op, perm = _KEY.unpack_from(key, 0)
        pos = _KEY.size
        parts = []
        for _ in range(3):
            n = _H.unpack_from(key, pos)[0]
            pos += 2
            if pos + n > len(key):
                raise ProtocolError("bad ACL record key: truncated")
            parts.append(key[pos:pos + n].decode())
            pos += n
    except (struct.error, UnicodeDecodeError) as exc:
        raise ProtocolError(f"bad ACL record key: {exc}") from None
    return A.Acl(rtype, parts[0], pattern, parts[1], parts[2], op, perm)


def from_config(config) -> A.Authorizer:
    return A.Authorizer(A.parse_super_users(getattr(config, "super_users", "")),
                        bool(getattr(config, "allow_everyone_if_no_acl_found", False)))


class AclManager:
    """The ACLs (``authorizer``) and the ACL APIs; ``enabled``: authorizer = acl."""

    def __init__(self, authorizer: A.Authorizer, enabled: bool = True):
        self.authorizer = authorizer
        self.enabled = enabled

    @classmethod
    def from_config(cls, config) -> AclManager:
        return cls(from_config(config), getattr(config, "authorizer", "none") == "acl")

    def replay(self, key: bytes, value: bytes | None) -> None:
        acl = decode_acl_key(key)
        if value is None:
            self.authorizer.remove(acl)
        else:
            self.authorizer.add(acl)

    def handle(self, api_key: int, version: int, request, token) -> Result:
        if api_key == W.CREATE_ACLS:
            writes, resp = self.create(request)
        elif api_key == W.DELETE_ACLS:
            writes, resp = self.delete(request)
        elif api_key == W.DESCRIBE_ACLS:
            writes, resp = [], self.describe(request)
        else:
            raise ValueError(f"api key {api_key} is not an ACL API")
        return Result(writes, [(token, resp)])

    # ---- the APIs -------------------------------------------------------------------------------

    def create(self, req: W.CreateAclsRequest):
        writes: list = []
        results = []
        for c in req.creations:
            if not self.enabled:
                results.append(W.CreateAclsResult(E.SECURITY_DISABLED, SECURITY_DISABLED_MESSAGE))
                continue
            acl = A.Acl(c.resource_type, c.resource_name or "", c.pattern_type, c.principal or "", c.host or "",
                        c.operation, c.permission_type)
            try:
                A.validate(acl)
            except A.AclError as exc:
                results.append(W.CreateAclsResult(E.INVALID_REQUEST, str(exc)))
                continue
            if self.authorizer.add(acl):
                writes.append((CATALOG_SHARD, acl_key(acl), _PRESENT))
            results.append(W.CreateAclsResult(E.NONE, ""))  # Kafka's success message is empty, not null
        return writes, _CreateAclsAnswer(results=results)

    def describe(self, req: W.DescribeAclsRequest) -> W.DescribeAclsResponse:
        if not self.enabled:
            return W.DescribeAclsResponse(error_code=E.SECURITY_DISABLED, error_message=SECURITY_DISABLED_MESSAGE)
        flt, problem = _filter(req.filter)
        if problem:
            return W.DescribeAclsResponse(error_code=E.INVALID_REQUEST, error_message=problem)
        resources: dict[tuple, W.DescribeAclsResource] = {}
        for acl in self.authorizer.acls(flt):
            rk = (acl.resource_type, acl.name, acl.pattern_type)
            res = resources.get(rk)
            if res is None:
                res = resources[rk] = W.DescribeAclsResource(*rk)
            res.acls.append(W.AclDescription(acl.principal, acl.host, acl.operation, acl.permission))
        return W.DescribeAclsResponse(error_message="", resources=list(resources.values()))

    def delete(self, req: W.DeleteAclsRequest):
        writes: list = []
        results = []
        for f in req.filters:
            if not self.enabled:
                results.append(W.DeleteAclsFilterResult(E.SECURITY_DISABLED, SECURITY_DISABLED_MESSAGE))
                continue
            flt, problem = _filter(f)
            if problem:
                results.append(W.DeleteAclsFilterResult(E.INVALID_REQUEST, problem))
                continue
            fr = W.DeleteAclsFilterResult()
            for acl in self.authorizer.acls(flt):
                self.authorizer.remove(acl)
                writes.append((CATALOG_SHARD, acl_key(acl), None))
                fr.matching_acls.append(W.DeleteAclsMatchingAcl(E.NONE, None, W.AclBindingData(
                    acl.resource_type, acl.name, acl.pattern_type, acl.principal, acl.host, acl.operation,
                    acl.permission)))
            results.append(fr)
        return writes, _DeleteAclsAnswer(filter_results=results)


def _filter(f: W.AclBindingData) -> tuple[A.AclFilter | None, str | None]:
    """A wire filter as an AclFilter, or Kafka's reason it is refused (unknown values)."""
    if f.resource_type not in A.RESOURCE_NAMES or f.resource_type == A.UNKNOWN:
        return None, "The filter has an unknown resource type"
    if f.pattern_type not in A.PATTERN_NAMES or f.pattern_type == A.UNKNOWN:
        return None, "The filter has an unknown pattern type"
    if f.operation not in A.OPERATION_NAMES or f.operation == A.UNKNOWN:
        return None, "The filter has an unknown operation"
    if f.permission_type not in A.PERMISSION_NAMES or f.permission_type == A.UNKNOWN:
        return None, "The filter has an unknown permission type"
    return A.AclFilter(f.resource_type, f.resource_name, f.pattern_type, f.principal, f.host, f.operation,
                       f.permission_type), None


class _CreateAclsAnswer(W.CreateAclsResponse):
    def as_error(self, code: int):
        """Its records were not stored: every creation fails with ``code``."""
        return W.CreateAclsResponse(results=[W.CreateAclsResult(code, None) for _ in self.results])


class _DeleteAclsAnswer(W.DeleteAclsResponse):
    def as_error(self, code: int):
        return W.DeleteAclsResponse(filter_results=[W.DeleteAclsFilterResult(code, None)
                                                    for _ in self.filter_results])
