"""The ACL decision core against Kafka's StandardAuthorizer semantics: the decision table and the
cache compared with the uncached decision on seeded random ACL sets."""
from __future__ import annotations

import random

import pytest

from coordinator.core.auth import acl as A
from coordinator.core.auth.acl import Acl, AclError, AclFilter, Authorizer

H = "127.0.0.1"


def a(rtype, name, principal="User:alice", op=A.READ, perm=A.ALLOW, pattern=A.LITERAL, host="*"):
    return Acl(rtype, name, pattern, principal, host, op, perm)


def auth(*acls, supers=(), allow_if_none=False):
    z = Authorizer(frozenset(supers), allow_if_none)
    for x in acls:
        z.add(x)
    return z


CASES = [
    # (acls, principal, host, op, rtype, name, expected, why)
    ([], "User:alice", H, A.READ, A.GROUP, "g", False, "no ACL: denied by default"),
    ([a(A.GROUP, "g")], "User:alice", H, A.READ, A.GROUP, "g", True, "literal allow"),
    ([a(A.GROUP, "g")], "User:bob", H, A.READ, A.GROUP, "g", False, "another principal"),
    ([a(A.GROUP, "g")], "User:alice", H, A.READ, A.GROUP, "g2", False, "literal is exact"),
    ([a(A.GROUP, "g")], "User:alice", H, A.READ, A.TOPIC, "g", False, "another resource type"),
    ([a(A.GROUP, "team-a-", pattern=A.PREFIXED)], "User:alice", H, A.READ, A.GROUP, "team-a-orders", True,
     "prefixed"),
    ([a(A.GROUP, "team-a-", pattern=A.PREFIXED)], "User:alice", H, A.READ, A.GROUP, "team-b-orders", False,
     "prefix not matching"),
    ([a(A.GROUP, "team-a-", pattern=A.PREFIXED)], "User:alice", H, A.READ, A.GROUP, "team-a-", True,
     "prefix equal to the name"),
    ([a(A.GROUP, "*")], "User:alice", H, A.READ, A.GROUP, "anything", True, "wildcard resource"),
    ([a(A.GROUP, "*", pattern=A.PREFIXED)], "User:alice", H, A.READ, A.GROUP, "x", False,
     "a PREFIXED '*' is a literal prefix '*'"),
    ([a(A.GROUP, "g", principal="User:*")], "User:bob", H, A.READ, A.GROUP, "g", True, "wildcard principal"),
    ([a(A.GROUP, "g"), a(A.GROUP, "g", perm=A.DENY)], "User:alice", H, A.READ, A.GROUP, "g", False,
     "DENY wins"),
    ([a(A.GROUP, "*"), a(A.GROUP, "g", principal="User:*", perm=A.DENY)], "User:alice", H, A.READ, A.GROUP,
     "g", False, "DENY to everyone wins over a wildcard allow"),
    ([a(A.GROUP, "g", host="10.0.0.1")], "User:alice", H, A.READ, A.GROUP, "g", False, "host differs"),
    ([a(A.GROUP, "g", host=H)], "User:alice", H, A.READ, A.GROUP, "g", True, "host matches"),
    ([a(A.GROUP, "g"), a(A.GROUP, "g", perm=A.DENY, host="10.0.0.1")], "User:alice", H, A.READ, A.GROUP, "g",
     True, "a DENY for another host does not apply"),
    ([a(A.GROUP, "g", op=A.READ)], "User:alice", H, A.DESCRIBE, A.GROUP, "g", True, "READ implies DESCRIBE"),
    ([a(A.TOPIC, "t", op=A.WRITE)], "User:alice", H, A.DESCRIBE, A.TOPIC, "t", True, "WRITE implies DESCRIBE"),
    ([a(A.GROUP, "g", op=A.DELETE)], "User:alice", H, A.DESCRIBE, A.GROUP, "g", True,
     "DELETE implies DESCRIBE"),
    ([a(A.CLUSTER, "kafka-cluster", op=A.ALTER)], "User:alice", H, A.DESCRIBE, A.CLUSTER, "kafka-cluster",
     True, "ALTER implies DESCRIBE"),
    ([a(A.TOPIC, "t", op=A.CREATE)], "User:alice", H, A.DESCRIBE, A.TOPIC, "t", False,
     "CREATE does not imply DESCRIBE"),
    ([a(A.GROUP, "g", op=A.DESCRIBE)], "User:alice", H, A.READ, A.GROUP, "g", False,
     "DESCRIBE does not imply READ"),
    ([a(A.TOPIC, "t", op=A.ALTER_CONFIGS)], "User:alice", H, A.DESCRIBE_CONFIGS, A.TOPIC, "t", True,
     "ALTER_CONFIGS implies DESCRIBE_CONFIGS"),
    ([a(A.TOPIC, "t", op=A.ALTER_CONFIGS)], "User:alice", H, A.DESCRIBE, A.TOPIC, "t", False,
     "ALTER_CONFIGS does not imply DESCRIBE"),
    ([a(A.GROUP, "g", op=A.ALL)], "User:alice", H, A.DELETE, A.GROUP, "g", True, "ALL allows everything"),
    ([a(A.GROUP, "g", op=A.ALL), a(A.GROUP, "g", op=A.ALL, perm=A.DENY)], "User:alice", H, A.READ, A.GROUP,
     "g", False, "DENY ALL denies"),
    ([a(A.GROUP, "g"), a(A.GROUP, "g", op=A.READ, perm=A.DENY)], "User:alice", H, A.DESCRIBE, A.GROUP, "g",
     True, "a DENY READ does not deny DESCRIBE (implication is ALLOW-only)"),
    ([a(A.GROUP, "g", op=A.DESCRIBE, perm=A.DENY), a(A.GROUP, "g", op=A.READ)], "User:alice", H, A.DESCRIBE,
     A.GROUP, "g", False, "DENY DESCRIBE beats the DESCRIBE implied by READ"),
]


@pytest.mark.parametrize("acls,principal,host,op,rtype,name,expected,why", CASES,
                         ids=[c[-1] for c in CASES])
def test_decision_table(acls, principal, host, op, rtype, name, expected, why):
    z = auth(*acls)
    assert z.decide(principal, host, op, rtype, name) is expected
    assert z.authorize(principal, host, op, rtype, name) is expected


def test_super_users_bypass_every_acl():
    z = auth(a(A.GROUP, "g", principal="User:admin", perm=A.DENY, op=A.ALL),
             supers=A.parse_super_users("User:admin; User:ops"))
    assert z.super_users == {"User:admin", "User:ops"}
    assert z.authorize("User:admin", H, A.READ, A.GROUP, "g")
    assert z.authorize("User:ops", H, A.ALTER, A.CLUSTER, "kafka-cluster")
    assert not z.authorize("User:alice", H, A.READ, A.GROUP, "g")


def test_allow_everyone_if_no_acl_found_applies_only_to_resources_without_acls():
    z = auth(a(A.GROUP, "g", principal="User:bob"), allow_if_none=True)
    assert z.authorize("User:alice", H, A.READ, A.GROUP, "other")  # no ACL for it at all
    assert not z.authorize("User:alice", H, A.READ, A.GROUP, "g")  # an ACL exists (for bob)
    z2 = auth(a(A.GROUP, "te", principal="User:bob", pattern=A.PREFIXED), allow_if_none=True)
    assert not z2.authorize("User:alice", H, A.READ, A.GROUP, "team")  # a prefixed ACL matches it


def test_cache_is_invalidated_on_every_change():
    z = auth()
    assert not z.authorize("User:alice", H, A.READ, A.GROUP, "g")
    gen = z.generation
    z.add(a(A.GROUP, "g"))
    assert z.generation > gen
    assert z.authorize("User:alice", H, A.READ, A.GROUP, "g")
    z.remove(a(A.GROUP, "g"))
    assert not z.authorize("User:alice", H, A.READ, A.GROUP, "g")
    assert z.add(a(A.GROUP, "x")) is True  # a new ACL is added
    assert z.add(a(A.GROUP, "x")) is False  # adding it again changes nothing


def test_authorized_operations_bits():
    z = auth(a(A.GROUP, "g", op=A.READ))
    bits = z.authorized_operations("User:alice", H, A.GROUP, "g")
    assert bits == (1 << A.READ) | (1 << A.DESCRIBE)
    z.add(a(A.TOPIC, "t", op=A.ALL))
    tbits = z.authorized_operations("User:alice", H, A.TOPIC, "t")
    assert tbits == sum(1 << op for op in A.SUPPORTED_OPERATIONS[A.TOPIC])


@pytest.mark.parametrize("acl,message", [
    (a(A.TRANSACTIONAL_ID, "tx"), "TRANSACTIONAL_ID"),
    (a(A.ANY, "g"), "resourceType"),
    (a(A.GROUP, "g", pattern=A.MATCH), "patternType"),
    (a(A.GROUP, "g", op=A.ANY), "operation"),
    (a(A.GROUP, "g", perm=A.ANY), "permissionType"),
    (a(A.GROUP, ""), "empty"),
    (a(A.CLUSTER, "other"), "kafka-cluster"),
    (a(A.GROUP, "g", principal="alice"), "principal"),
])
def test_invalid_acls_are_refused(acl, message):
    with pytest.raises(AclError, match=message):
        A.validate(acl)


def test_filters_match_as_kafka():
    acls = [a(A.GROUP, "team-a-", pattern=A.PREFIXED), a(A.GROUP, "team-a-x"), a(A.GROUP, "*"),
            a(A.TOPIC, "team-a-x", principal="User:bob", op=A.WRITE)]
    z = auth(*acls)
    assert z.acls(AclFilter()) == acls
    assert z.acls(AclFilter(resource_type=A.GROUP, name="team-a-x", pattern_type=A.MATCH)) == acls[:3]
    assert z.acls(AclFilter(resource_type=A.GROUP, name="team-a-x", pattern_type=A.LITERAL)) == [acls[1]]
    assert z.acls(AclFilter(principal="User:bob")) == [acls[3]]
    assert z.acls(AclFilter(operation=A.WRITE, permission=A.ALLOW)) == [acls[3]]


def test_cached_decisions_equal_uncached_on_random_acl_sets():
    rng = random.Random(30)
    principals = ["User:alice", "User:bob", "User:*", "User:carol"]
    names = ["a", "ab", "abc", "b", "ba", "*", "team-a-x", "team-"]
    ops = [A.READ, A.WRITE, A.CREATE, A.DELETE, A.ALTER, A.DESCRIBE, A.DESCRIBE_CONFIGS, A.ALTER_CONFIGS, A.ALL]
    hosts = ["*", "*", H, "10.0.0.2"]
    for trial in range(40):
        z = Authorizer(frozenset({"User:carol"} if trial % 3 == 0 else ()),
                       allow_everyone_if_no_acl_found=trial % 2 == 0)
        for step in range(300):
            if rng.random() < 0.1:  # change the ACLs: the cache must follow
                acl = Acl(rng.choice([A.GROUP, A.TOPIC]), rng.choice(names[:-1] + ["team-"]),
                          rng.choice([A.LITERAL, A.PREFIXED]), rng.choice(principals), rng.choice(hosts),
                          rng.choice(ops), rng.choice([A.ALLOW, A.DENY]))
                if acl.pattern_type == A.PREFIXED and acl.name == "*":
                    continue
                if acl in z and rng.random() < 0.5:
                    z.remove(acl)
                else:
                    z.add(acl)
            q = (rng.choice(principals[:2] + ["User:carol"]), rng.choice([H, "10.0.0.2"]),
                 rng.choice(ops[:-1]), rng.choice([A.GROUP, A.TOPIC]), rng.choice(names))
            assert z.authorize(*q) == z.decide(*q) == _oracle(z, *q), (trial, step, q)


def _oracle(z, principal, host, op, rtype, name):
    """A direct reading of Kafka's rule, independent of the indexes."""
    if principal in z.super_users:
        return True
    matching = [x for x in z.acls() if x.resource_type == rtype and (
        (x.pattern_type == A.LITERAL and x.name in (name, "*")) or
        (x.pattern_type == A.PREFIXED and name.startswith(x.name)))]
    applies = [x for x in matching if x.principal in (principal, "User:*") and x.host in ("*", host)]

    def op_ok(x):
        if x.operation == A.ALL or x.operation == op:
            return True
        if x.permission == A.ALLOW and op == A.DESCRIBE:
            return x.operation in (A.READ, A.WRITE, A.DELETE, A.ALTER)
        if x.permission == A.ALLOW and op == A.DESCRIBE_CONFIGS:
            return x.operation == A.ALTER_CONFIGS
        return False
    if any(x.permission == A.DENY and op_ok(x) for x in applies):
        return False
    if any(x.permission == A.ALLOW and op_ok(x) for x in applies):
        return True
    return z.allow_if_no_acl and not matching
