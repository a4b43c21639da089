"""The pure decision core of herd's ACL authorizer: Kafka's StandardAuthorizer semantics.

No I/O, no clock. An :class:`Acl` is Kafka's AclBinding (resource type, name, pattern type,
principal, host, operation, permission). :class:`Authorizer` holds the ACLs and answers
``authorize(principal, host, operation, resource_type, name)``:

* a super user (``super_users``) is allowed everything;
* the ACLs that match the resource are the LITERAL ones with its exact name, the LITERAL ``*``
  ones, and the PREFIXED ones whose name starts the resource's name;
* of those, an ACL applies when its principal is the request's or ``User:*``, its host is the
  client's address or ``*``, and its operation is the one asked, or ALL, or (ALLOW ACLs only)
  implies it: READ, WRITE, DELETE, ALTER imply DESCRIBE; ALTER_CONFIGS implies DESCRIBE_CONFIGS;
* a DENY that applies wins; else an ALLOW that applies allows; else, when no ACL at all matched
  the resource, ``allow_everyone_if_no_acl_found`` decides; else denied.

Decisions are cached per (principal, host, operation, resource type, name); any ACL change clears
the cache (``generation`` counts changes, so callers may keep their own caches too).
"""
from __future__ import annotations

from dataclasses import dataclass

# Kafka's codes (org.apache.kafka.common.resource / .acl): the wire values.
UNKNOWN, ANY = 0, 1
# resource types
TOPIC, GROUP, CLUSTER, TRANSACTIONAL_ID, DELEGATION_TOKEN, USER = 2, 3, 4, 5, 6, 7
RESOURCE_TYPES = {"UNKNOWN": UNKNOWN, "ANY": ANY, "TOPIC": TOPIC, "GROUP": GROUP, "CLUSTER": CLUSTER,
                  "TRANSACTIONAL_ID": TRANSACTIONAL_ID, "DELEGATION_TOKEN": DELEGATION_TOKEN, "USER": USER}
SERVED_RESOURCE_TYPES = frozenset({TOPIC, GROUP, CLUSTER})
# pattern types
MATCH, LITERAL, PREFIXED = 2, 3, 4
PATTERN_TYPES = {"UNKNOWN": UNKNOWN, "ANY": ANY, "MATCH": MATCH, "LITERAL": LITERAL, "PREFIXED": PREFIXED}
# operations
ALL, READ, WRITE, CREATE, DELETE, ALTER, DESCRIBE = 2, 3, 4, 5, 6, 7, 8
CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE = 9, 10, 11, 12
CREATE_TOKENS, DESCRIBE_TOKENS, TWO_PHASE_COMMIT = 13, 14, 15
OPERATIONS = {"UNKNOWN": UNKNOWN, "ANY": ANY, "ALL": ALL, "READ": READ, "WRITE": WRITE, "CREATE": CREATE,
              "DELETE": DELETE, "ALTER": ALTER, "DESCRIBE": DESCRIBE, "CLUSTER_ACTION": CLUSTER_ACTION,
              "DESCRIBE_CONFIGS": DESCRIBE_CONFIGS, "ALTER_CONFIGS": ALTER_CONFIGS,
              "IDEMPOTENT_WRITE": IDEMPOTENT_WRITE, "CREATE_TOKENS": CREATE_TOKENS,
              "DESCRIBE_TOKENS": DESCRIBE_TOKENS, "TWO_PHASE_COMMIT": TWO_PHASE_COMMIT}
# permission types
DENY, ALLOW = 2, 3
PERMISSIONS = {"UNKNOWN": UNKNOWN, "ANY": ANY, "DENY": DENY, "ALLOW": ALLOW}

RESOURCE_NAMES = {v: k for k, v in RESOURCE_TYPES.items()}
PATTERN_NAMES = {v: k for k, v in PATTERN_TYPES.items()}
OPERATION_NAMES = {v: k for k, v in OPERATIONS.items()}
PERMISSION_NAMES = {v: k for k, v in PERMISSIONS.items()}

WILDCARD = "*"
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"  # the only name of the CLUSTER resource
ANONYMOUS = "User:ANONYMOUS"

# ALLOW ACLs for these operations also allow DESCRIBE / DESCRIBE_CONFIGS (never DENY ones).
IMPLIES_DESCRIBE = frozenset({DESCRIBE, READ, WRITE, DELETE, ALTER})
IMPLIES_DESCRIBE_CONFIGS = frozenset({DESCRIBE_CONFIGS, ALTER_CONFIGS})

# The operations each resource type has, for the authorized-operations bit fields (Kafka 4's
# AclEntry.supportedOperations; groups have configs since KIP-848).
SUPPORTED_OPERATIONS = {
    TOPIC: (READ, WRITE, CREATE, DESCRIBE, DELETE, ALTER, DESCRIBE_CONFIGS, ALTER_CONFIGS),
    GROUP: (READ, DESCRIBE, DELETE, DESCRIBE_CONFIGS, ALTER_CONFIGS),
    CLUSTER: (CREATE, CLUSTER_ACTION, DESCRIBE_CONFIGS, ALTER_CONFIGS, IDEMPOTENT_WRITE, ALTER, DESCRIBE),
}

CACHE_LIMIT = 100_000  # decisions kept before the cache starts over


@dataclass(frozen=True, slots=True)
class Acl:
    """One ACL binding: a resource pattern and an access control entry."""
    resource_type: int
    name: str
    pattern_type: int
    principal: str
    host: str
    operation: int
    permission: int

    def describe(self) -> str:
        return (f"(principal={self.principal}, host={self.host}, operation={OPERATION_NAMES.get(self.operation)}, "
                f"permissionType={PERMISSION_NAMES.get(self.permission)}) on "
                f"{RESOURCE_NAMES.get(self.resource_type)}:{PATTERN_NAMES.get(self.pattern_type)}:{self.name}")


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Kafka's AclBindingFilter: ANY (or None for a string) matches every value; pattern type
    MATCH matches the ACLs that would apply to the named resource (LITERAL of that name, the
    wildcard, and the PREFIXED ones that start it)."""
    resource_type: int = ANY
    name: str | None = None
    pattern_type: int = ANY
    principal: str | None = None
    host: str | None = None
    operation: int = ANY
    permission: int = ANY

    def matches(self, acl: Acl) -> bool:
        if self.resource_type != ANY and acl.resource_type != self.resource_type:
            return False
        if self.pattern_type == MATCH:
            if self.name is not None and not _pattern_applies(acl, self.name):
                return False
        else:
            if self.pattern_type != ANY and acl.pattern_type != self.pattern_type:
                return False
            if self.name is not None and acl.name != self.name:
                return False
        if self.principal is not None and acl.principal != self.principal:
            return False
        if self.host is not None and acl.host != self.host:
            return False
        if self.operation != ANY and acl.operation != self.operation:
            return False
        if self.permission != ANY and acl.permission != self.permission:
            return False
        return True


class AclError(ValueError):
    """An ACL or filter Kafka refuses: ``code`` is the wire error (INVALID_REQUEST)."""
    code = 42  # INVALID_REQUEST


def _pattern_applies(acl: Acl, name: str) -> bool:
    if acl.pattern_type == LITERAL:
        return acl.name == name or acl.name == WILDCARD
    if acl.pattern_type == PREFIXED:
        return name.startswith(acl.name)
    return False


def parse_principal(text: str) -> tuple[str, str]:
    """'User:alice' -> ('User', 'alice'); anything without a type before ':' is refused."""
    kind, sep, name = text.partition(":")
    if not sep or not kind:
        raise AclError(f"Could not parse principal from `{text}` (no colon is present separating the "
                       f"principal type from the principal name)")
    return kind, name


def validate(acl: Acl) -> None:
    """Refuse, as Kafka does, an ACL that cannot be stored (AclError, INVALID_REQUEST)."""
    if acl.resource_type == TRANSACTIONAL_ID:
        raise AclError("TRANSACTIONAL_ID ACLs are not supported: herd serves no transactions")
    if acl.resource_type not in SERVED_RESOURCE_TYPES:
        raise AclError(f"Invalid resourceType {RESOURCE_NAMES.get(acl.resource_type, acl.resource_type)}"
                       f" (herd serves TOPIC, GROUP and CLUSTER)")
    if acl.pattern_type not in (LITERAL, PREFIXED):
        raise AclError(f"Invalid patternType {PATTERN_NAMES.get(acl.pattern_type, acl.pattern_type)}")
    if acl.operation in (UNKNOWN, ANY) or acl.operation not in OPERATION_NAMES:
        raise AclError(f"Invalid operation {OPERATION_NAMES.get(acl.operation, acl.operation)}")
    if acl.permission not in (ALLOW, DENY):
        raise AclError(f"Invalid permissionType {PERMISSION_NAMES.get(acl.permission, acl.permission)}")
    if not acl.name:
        raise AclError("Resource name should not be empty")
    if acl.resource_type == CLUSTER and acl.name != CLUSTER_NAME:
        raise AclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
    if acl.pattern_type == PREFIXED and acl.name == WILDCARD:
        raise AclError("A PREFIXED ACL cannot have the wildcard name '*'")
    parse_principal(acl.principal)
    if not acl.host:
        raise AclError("Invalid host: empty")


def parse_super_users(text: str | None) -> frozenset[str]:
    """Kafka's super.users: 'User:admin;User:ops' (blanks around each ignored)."""
    if not text:
        return frozenset()
    users = set()
    for part in text.split(";"):
        part = part.strip()
        if part:
            kind, _name = parse_principal(part)
            users.add(part)
    return frozenset(users)


class Authorizer:
    """The ACLs and the decisions they give; ``generation`` moves on every change."""

    def __init__(self, super_users=frozenset(), allow_everyone_if_no_acl_found: bool = False):
        self.super_users = frozenset(super_users)
        self.allow_if_no_acl = allow_everyone_if_no_acl_found
        self._acls: dict[Acl, None] = {}  # insertion-ordered set
        self._by_type: dict[int, list[Acl]] = {}
        self._literal: dict[tuple[int, str], list[Acl]] = {}
        self._prefixed: dict[int, list[Acl]] = {}
        self._cache: dict[tuple, bool] = {}
        self.generation = 0

    # ---- the ACLs ----------------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self._acls)

    def __contains__(self, acl: Acl) -> bool:
        return acl in self._acls

    def acls(self, flt: AclFilter | None = None) -> list[Acl]:
        if flt is None:
            return list(self._acls)
        return [a for a in self._acls if flt.matches(a)]

    def add(self, acl: Acl) -> bool:
        """-> False when it was there already (adding an existing ACL is not an error in Kafka)."""
        if acl in self._acls:
            return False
        self._acls[acl] = None
        self._reindex()
        return True

    def remove(self, acl: Acl) -> bool:
        if acl not in self._acls:
            return False
        del self._acls[acl]
        self._reindex()
        return True

    def replace(self, acls) -> None:
        self._acls = dict.fromkeys(acls)
        self._reindex()

    def _reindex(self) -> None:
        by_type: dict[int, list[Acl]] = {}
        literal: dict[tuple[int, str], list[Acl]] = {}
        prefixed: dict[int, list[Acl]] = {}
        for a in self._acls:
            by_type.setdefault(a.resource_type, []).append(a)
            if a.pattern_type == LITERAL:
                literal.setdefault((a.resource_type, a.name), []).append(a)
            else:
                prefixed.setdefault(a.resource_type, []).append(a)
        self._by_type, self._literal, self._prefixed = by_type, literal, prefixed
        self._cache = {}
        self.generation += 1

    # ---- decisions ---------------------------------------------------------------------------

    def authorize(self, principal: str, host: str, operation: int, resource_type: int, name: str) -> bool:
        """The cached decision."""
        key = (principal, host, operation, resource_type, name)
        try:
            return self._cache[key]
        except KeyError:
            pass
        cache = self._cache
        if len(cache) >= CACHE_LIMIT:
            cache.clear()
        allowed = cache[key] = self.decide(principal, host, operation, resource_type, name)
        return allowed

    def decide(self, principal: str, host: str, operation: int, resource_type: int, name: str) -> bool:
        """The uncached decision (Kafka's StandardAuthorizerData.authorize)."""
        if principal in self.super_users:
            return True
        found = False
        allowed = False
        for acl in self._applicable(resource_type, name):
            found = True
            result = _result(acl, principal, host, operation)
            if result is None:
                continue
            if result is False:
                return False  # DENY wins
            allowed = True
        if allowed:
            return True
        return self.allow_if_no_acl and not found

    def _applicable(self, resource_type: int, name: str):
        literal = self._literal
        yield from literal.get((resource_type, name), ())
        if name != WILDCARD:
            yield from literal.get((resource_type, WILDCARD), ())
        for acl in self._prefixed.get(resource_type, ()):
            if name.startswith(acl.name):
                yield acl

    def authorized_operations(self, principal: str, host: str, resource_type: int, name: str) -> int:
        """Kafka's authorized-operations bit field: bit ``op`` set for each operation of the
        resource type the principal may perform."""
        bits = 0
        for op in SUPPORTED_OPERATIONS.get(resource_type, ()):
            if self.authorize(principal, host, op, resource_type, name):
                bits |= 1 << op
        return bits


def _result(acl: Acl, principal: str, host: str, operation: int):
    """True (ALLOW applies), False (DENY applies) or None (the ACL does not apply): Kafka's
    StandardAuthorizerData.findResult; the resource already matched."""
    if acl.principal != principal and acl.principal != WILDCARD_PRINCIPAL:
        return None
    if acl.host != WILDCARD and acl.host != host:
        return None
    op = acl.operation
    if op != ALL:
        if acl.permission == ALLOW:
            if operation == DESCRIBE:
                if op not in IMPLIES_DESCRIBE:
                    return None
            elif operation == DESCRIBE_CONFIGS:
                if op not in IMPLIES_DESCRIBE_CONFIGS:
                    return None
            elif operation != op:
                return None
        elif operation != op:
            return None
    return acl.permission == ALLOW
